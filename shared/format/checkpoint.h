/* checkpoint.h: the training state <-> a snapshot file (safetensors.h).
 *
 * The tensors are the model's state_dict (model->tensors: params, BN buffers,
 * num_batches_tracked) plus "optimizer.momentum" (the flat momentum buffer, one
 * F32 vector) and, for a run with --ema, the moving average (ema.h) as a second
 * state dict under "ema." + each tensor's name ("ema.0.conv1.weight"; the step
 * counters are the model's): it loads into the same PyTorch model, strictly, once
 * the prefix is stripped. __metadata__ holds the model config ("model"), the dataset it was
 * trained on ("dataset", "dataset_shape"), the normalisation ("normalize_mean",
 * "normalize_std"), the progress ("epochs", "step", "step_in_epoch", partial-epoch
 * sums, "world_size", "best_val": [accuracy, epoch] with a validation split, and for
 * an epoch resharded across world sizes "epoch_position":
 * {"version":1,"consumed":C,"world_sizes":[4,2]}), the training options ("options") and, when the dataset names its
 * classes, their names ("classes", a JSON array: data/classes.h). cifar-train,
 * cifar-eval and cifar-predict use it. */
#ifndef CIFAR_CHECKPOINT_H
#define CIFAR_CHECKPOINT_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "data/classes.h"
#include "model/model.h"
#include "format/safetensors.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The most world sizes one epoch's "epoch_position" lists (more changes within an
 * epoch overwrite the last entry). */
#define CHECKPOINT_MAX_EPOCH_WORLDS 16
/* The version of the "epoch_position" metadata this program writes and reads. */
#define CHECKPOINT_EPOCH_POSITION_VERSION 1

typedef struct {
    int64_t epochs;         /* epochs completed */
    int64_t step;           /* optimizer steps taken (= num_batches_tracked) */
    int64_t step_in_epoch;  /* steps of the epoch in progress (0 at an epoch boundary) */
    /* The epoch in progress: in a snapshot, rank 0's own sums, or the whole job's when
     * the epoch ran with several world sizes (n_epoch_worlds > 1) */
    double partial_loss_sum, partial_correct, partial_seen;
    double partial_seconds;
    int world_size;
    /* Where the epoch in progress stands (data/sampler.h): epoch_position is the
     * count of its permutation's entries consumed, all ranks together; -1 when the
     * snapshot does not record it (an epoch at one world size: it is step_in_epoch
     * x batch x world_size). epoch_worlds: the world sizes the epoch has run with,
     * in order (n_epoch_worlds 0 at an epoch boundary). A snapshot records both, as
     * "epoch_position", only for an epoch that ran with more than one world size (a
     * resharded resume), so a run at one world size writes what it always wrote. */
    int64_t epoch_position;
    int epoch_worlds[CHECKPOINT_MAX_EPOCH_WORLDS];
    int n_epoch_worlds;
    /* --val-fraction: the best validation accuracy so far and its epoch (1-based;
     * 0 = none yet), for best.safetensors and --early-stop */
    double best_val_acc;
    int64_t best_epoch;
} TrainProgress;

typedef struct {
    float *params, *buffers, *momentum; /* num_params, num_buffers, num_params floats */
    float *ema_params, *ema_buffers;    /* the moving average, or NULL (no --ema) */
} TrainState;

void train_state_alloc(TrainState *s, const Model *m);
/* Also the moving average's buffers (a run with --ema). */
void train_state_alloc_ema(TrainState *s, const Model *m);
void train_state_free(TrainState *s);

/* The metadata a snapshot carries besides the tensors. Strings are owned. */
typedef struct {
    char *model_json;
    char *dataset_path;
    char *dataset_shape;  /* "HxWxC/K" */
    char *dataset_identity; /* dataset_identity() of the data trained on; "" when not recorded */
    float mean[4], std[4];
    int channels;
    char *options_json;
    TrainProgress progress;
    ClassNames classes;   /* count 0: the dataset named none */
} CheckpointInfo;

void checkpoint_info_free(CheckpointInfo *info);

/* "HxWxC/K" for a model config. */
void checkpoint_dataset_shape(const ModelConfig *cfg, char *buf, size_t buflen);

/* Write the state atomically. 0, or -1 with a reason in err. */
int checkpoint_write(const char *path, const Model *m, const TrainState *st,
                     const CheckpointInfo *info, char *err, size_t errlen);

/* Read a snapshot's metadata only enough to rebuild the model: fills *info and
 * the model config's network fields (image shape and classes included).
 * The returned Snapshot must be freed. NULL with a reason in err. */
Snapshot *checkpoint_open(const char *path, ModelConfig *cfg, CheckpointInfo *info, char *err,
                          size_t errlen);

/* Copy the tensors of an opened snapshot into st, checking every name, dtype and
 * shape against the model. momentum may be absent (zeroed). When st has the
 * moving average's buffers, the snapshot's "ema." tensors go there, or, in a
 * snapshot without them, a copy of its weights (the average starts there). 0, or
 * -1 + reason. */
int checkpoint_load_state(const Snapshot *snap, const Model *m, TrainState *st, char *err,
                          size_t errlen);
/* The index of the first NaN or infinite value of v, n when none. checkpoint_load_state
 * refuses a snapshot holding one ("tensor X holds NaN values"). */
size_t checkpoint_first_non_finite(const float *v, size_t n);

/* A snapshot ready to run: its model, metadata and weights. */
typedef struct {
    ModelConfig cfg;
    CheckpointInfo info;
    Model model;
    TrainState state;
    int ema; /* 1: state holds the moving average (cifar-train --ema), 0: the trained weights */
} CheckpointModel;

/* For the commands that run a snapshot (cifar-eval, cifar-predict): open it,
 * build its model and load its weights: with prefer_ema, the moving average when
 * the snapshot has one (checkpoint_load_weights; --weights raw: 0). Any failure
 * ends the process (a permanent one) naming path. checkpoint_model_free after. */
void checkpoint_load_model(const char *path, int prefer_ema, CheckpointModel *out);
void checkpoint_model_free(CheckpointModel *m);

/* The name of a run folder's best snapshot (by validation accuracy: cifar-train
 * --val-fraction), beside the snapshots: "RUN_DIR/best.safetensors". */
#define CHECKPOINT_BEST_NAME "best.safetensors"
void checkpoint_best_path(const char *run_dir, char *buf, size_t buflen);

/* The snapshot cifar-eval and cifar-predict run for a path they are given: a
 * file is itself; a run folder gives its best.safetensors when it has one, else
 * its newest snapshot that opens (a corrupt one is skipped with a warning). The
 * path into buf; a folder with neither ends the process naming it. */
void checkpoint_for_inference(const char *path, char *buf, size_t buflen);
/* The snapshot's moving average into params/buffers (num_params, num_buffers
 * floats): 1 when it has one, 0 when it has none (nothing written), -1 with a
 * reason in err when it has a malformed one. */
int checkpoint_load_ema(const Snapshot *snap, const Model *m, float *params, float *buffers,
                        char *err, size_t errlen);

/* The weights to evaluate or predict with: checkpoint_load_state, then, when
 * prefer_ema and the snapshot has a moving average, the average in st->params and
 * st->buffers instead. 1 when those are the average, 0 the trained weights, -1 +
 * reason (cifar-eval --weights). */
int checkpoint_load_weights(const Snapshot *snap, const Model *m, TrainState *st, int prefer_ema,
                            char *err, size_t errlen);

/* The resume choice of a run folder, the same on every rank: rank 0 takes the
 * snapshot with the most progress recorded inside it (never by its file name)
 * that loads (a corrupt one, or one holding NaN or infinite values, is reported
 * and the previous one used; temporaries of a killed writer are removed first)
 * and broadcasts its path over comm (into `chosen` on every rank); the other
 * ranks load that one. A snapshot of another model or
 * dataset (its shape "HxWxC/K" against data->shape; its recorded identity against
 * data->identity unless data->other_data_ok), or of a newer program, is
 * a permanent failure: training would write over it. On resume *st and
 * *progress hold the snapshot's state and 1 is returned; 0 when there is none
 * (nothing is touched). `info` (may be NULL) gets the snapshot's metadata on
 * resume (free it with checkpoint_info_free; zeroed otherwise). */
/* What a resume compares a snapshot with: this run's data. */
typedef struct {
    const char *shape;    /* checkpoint_dataset_shape */
    const char *identity; /* dataset_identity */
    int other_data_ok;    /* --fine-tune: another dataset of the same shape is resumed from */
} CheckpointData;
int checkpoint_resume(const char *run_dir, const Model *m, const CheckpointData *data, Comm *comm,
                      TrainState *st, TrainProgress *progress, char *chosen, size_t chosen_len,
                      CheckpointInfo *info);

/* The exclusive lock of a run folder: one writer (cifar-train job) at a time.
 * An flock on RUN_DIR/lock held while the returned descriptor is open (the
 * kernel drops it when the holder dies, SIGKILL included: no stale lock); the
 * file records the holder (pid, host, start time) for the message a second
 * writer gets. The descriptor is close-on-exec. Creates the folder. A busy
 * folder ends the process with exit 1 naming the folder and the holder. */
int run_dir_lock(const char *run_dir);

#ifdef __cplusplus
}
#endif
#endif
