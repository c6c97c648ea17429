/* metrics.h: RUN_DIR/metrics.jsonl, one JSON line per epoch (rank 0). */
#ifndef CIFAR_TRAIN_METRICS_H
#define CIFAR_TRAIN_METRICS_H

#include <stdint.h>

/* One epoch's line. */
typedef struct {
    int64_t epoch; /* epochs completed, 1-based */
    double train_loss, train_acc, test_loss, test_acc, lr, images_per_s, seconds;
    int has_val;   /* val_loss, val_acc: with --val-fraction */
    double val_loss, val_acc;
    const double *rank_seconds; /* world_size: each rank's step compute time */
    int slowest_rank;
    int world_size, restarts;
    /* the world sizes the epoch ran with, in order (one, unless a resume with another
     * world size continued it: epoch_position.h), and the images it trained, all ranks
     * together (the split's, plus the padding to a multiple of the world size) */
    const int *world_sizes;
    int n_world_sizes;
    double images;
    const char *device, *comm;
} EpochMetrics;

/* Adds m's line at the end of RUN_DIR/metrics.jsonl (the file is rewritten whole,
 * through fs_write_atomic: a symlink planted under its name is refused). */
void metrics_append(const char *run_dir, const EpochMetrics *m);

/* Drops the lines of epochs after `epochs` (they are redone after a resume); the
 * file is rewritten only when there is such a line. */
void metrics_truncate(const char *run_dir, int64_t epochs);

#endif
