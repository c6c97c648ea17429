/* train.h: cifar-train's options and its epoch loop. */
#ifndef CIFAR_TRAIN_H
#define CIFAR_TRAIN_H

#include <stdint.h>

#include "comm/comm.h"
#include "model/device.h"
#include "model/engine.h"
#include "schedule.h"
#include "signals.h"

typedef enum { NORMALIZE_DATASET, NORMALIZE_IMAGENET } NormalizeChoice;

typedef struct {
    const char *data_path;
    int epochs;
    int save_every;
    double save_interval;  /* seconds, 0 = off */
    int64_t save_every_steps; /* 0 = off */
    SignalSet signals;     /* --signals-to-handle */
    int batch_size;        /* per process */
    double lr;
    double momentum;
    int nesterov;
    double weight_decay;
    Schedule schedule;
    double warmup_epochs;
    double label_smoothing;
    uint64_t seed;
    int threads;           /* 0 = cores / local world size */
    const char *run_dir;
    DeviceChoice device;
    NormalizeChoice normalize;
    int keep;
    int fine_tune;         /* --fine-tune: resume from a snapshot of other data */
    const char *model_file;
    Precision precision;
    int deterministic;
    int quiet;
    int comm;              /* --comm: a CommKind, -1 = by device and launcher */
    double val_fraction;   /* 0: no validation hold-out */
    int early_stop;        /* 0: never; else stop after N epochs without a better val_acc */
    int crop, flip;        /* --augment: which random augmentations (both by default) */
    int crop_padding;      /* --crop-padding (4) */
    int cutout;            /* --cutout: square side, 0 = none */
    double ema_decay;      /* --ema: 0 = no moving average */
    int ema_warmup;        /* --ema-warmup */
    int log_every;         /* --log-every: steps between TensorBoard train scalars */
} TrainOptions;

/* Parse argv (launcher options already removed). Exits 2 on bad usage, 0 on --help. */
void train_options_parse(TrainOptions *o, int argc, char **argv);
/* The options as JSON (stored in snapshots). malloc'd. */
char *train_options_to_json(const TrainOptions *o);
/* The learning-rate schedule of the options (schedule.h). */
LrSchedule train_lr_schedule(const TrainOptions *o);

/* The worker: one rank of the job (or the whole job when alone). Returns the exit status.
 * Rank 0 takes the run folder's lock (run_dir_lock) unless `locked`: the
 * launcher that started it holds it for the whole job. */
int train_worker(const TrainOptions *o, const DistEnv *env, int locked);

/* Set by a signal of the set (--signals-to-handle): finish the step, snapshot,
 * exit 128 + the signal. */
extern volatile int g_train_stop_signal;
/* What the communicators' waits watch (DistEnv.stop_signal): set with
 * g_train_stop_signal, cleared once every rank has agreed to stop. */
extern volatile int g_train_wait_stop;
void train_install_signal_handlers(SignalSet set);

#endif
