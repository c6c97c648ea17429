/* resume_options.h: what a resume compares between the snapshot's training options
 * (its "options" JSON) and this run's. */
#ifndef CIFAR_TRAIN_RESUME_OPTIONS_H
#define CIFAR_TRAIN_RESUME_OPTIONS_H

#include <cjson/cJSON.h>

/* Rank 0, on resume: one line naming every training option (and the dataset's
 * path: the snapshot's snap_dataset, this run's data_path) that differs from the
 * snapshot's, "--lr 0.1 -> 0.05". --epochs is left out: a larger one is how a
 * finished run continues. The model and the dataset's shape cannot change:
 * checkpoint_resume refused those already. Written into the next snapshot, so a
 * later resume with the same options says nothing. */
void resume_report_changed_options(const char *snap_dataset, const char *data_path, const cJSON *was,
                                   const cJSON *now);

/* Whether the options that define a partial epoch's order of samples changed: the
 * seed (the permutation), the batch size (the step boundaries) and --val-fraction
 * (which images train). The world size is not one of them: the rest of an epoch
 * is dealt to any world size (epoch_position.h). */
int resume_order_changed(const cJSON *was, const cJSON *now);

#endif
