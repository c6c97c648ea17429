/* engine.h: where a training step runs (CPU or CUDA), behind one small table of
 * functions, so the epoch loop (train/) and cifar-eval never know which it has.
 *
 * An engine owns the model state on its device (params, BN buffers, momentum),
 * the dataset splits it was given (the GPU engine copies them to the device once,
 * as uint8, or streams their batches), and does per step: gather +
 * crop/flip/normalise/cutout the batch (augment.h, counter-based randomness keyed by
 * (seed, epoch, sample index)), forward, backward, gradient all-reduce over the
 * communicator, SGD update, and the moving average of the weights when asked
 * (ema.h). */
#ifndef CIFAR_ENGINE_H
#define CIFAR_ENGINE_H

#include <stddef.h>
#include <stdint.h>

#include "core/settings.h"
#include "data/augment.h"
#include "comm/comm.h"
#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { PRECISION_FP32, PRECISION_TF32, PRECISION_BF16 } Precision;

/* HostSplit (one split's records: contiguous, or in place in the dataset's map)
 * is defined in data/dataset.h. */

typedef struct {
    const Model *model;
    HostSplit train, test;     /* either may have count 0 (cifar-eval has no train) */
    float mean[4], std[4];     /* normalisation per channel (of pixel/255) */
    int pad;                   /* random-crop padding (4; 0 = no crop) */
    int flip;                  /* 1 = random horizontal flip */
    int cutout;                /* cutout square side (0 = none) */
    int max_batch;             /* per process */
    uint64_t seed;
    float label_smoothing;
    float momentum, weight_decay;
    int nesterov;
    float ema_decay;           /* > 0: keep ema.h's moving average of params and buffers */
    int ema_warmup;            /* 1: its decay warms up (ema_decay_at, by the step index) */
    int threads;               /* CPU engine */
    int device;                /* CUDA engine: device index (LOCAL_RANK) */
    Precision precision;
    int deterministic;
    Comm *comm;                /* gradient all-reduce; may be a COMM_SINGLE */
    Settings settings;         /* the CIFAR_* tuning variables (core/settings.h) */
} EngineConfig;

typedef struct Engine Engine;

typedef struct {
    const char *name; /* "cpu", "cuda" */
    /* One SGD step on train samples idx[0..n): returns the local mean loss,
     * *correct = local arg-max hits. `step` is the global step index (0 first). */
    float (*train_step)(Engine *e, const int64_t *idx, int n, int64_t epoch, int64_t step,
                        float lr, int *correct);
    /* Inference (BN running stats) on test samples idx[0..n): adds the summed loss
     * and hits, writes arg-max predictions and the n x K logits (row i: sample
     * idx[i]) each when non-NULL. */
    void (*eval_batch)(Engine *e, const int64_t *idx, int n, double *loss_sum, int64_t *correct,
                       int32_t *predictions, float *logits);
    /* Optional (NULL: nothing to do): a hint that a coming train_step (train = 1)
     * or eval_batch (train = 0), the next one or the one after, takes samples
     * idx[0..n) (n <= max_batch; idx is copied, the caller may reuse it at once).
     * An engine that stages data may start gathering them; a call with other
     * indices is still correct (the engine gathers what it is given). The epoch
     * loops call it for batch i+1 before they run batch i (engine_prefetch). */
    void (*prefetch)(Engine *e, const int64_t *idx, int n, int train);
    /* Model state <-> host flat buffers (num_params, num_buffers, num_params floats;
     * momentum may be NULL). */
    void (*state_to_host)(Engine *e, float *params, float *buffers, float *momentum);
    void (*state_from_host)(Engine *e, const float *params, const float *buffers,
                            const float *momentum);
    /* The moving average (ema_decay > 0 only; host flat buffers as state_to_host,
     * without momentum). Every train_step updates it after the SGD step; set it
     * (the initial weights or a snapshot's average) before the first step. */
    void (*ema_to_host)(Engine *e, float *params, float *buffers);
    void (*ema_from_host)(Engine *e, const float *params, const float *buffers);
    /* BN running statistics from rank `root` to every rank (DDP's broadcast_buffers). */
    void (*broadcast_buffers)(Engine *e, int root);
    void (*destroy)(Engine *e);
    /* Optional (both NULL: the caller copies with state_to_host): a snapshot of the
     * state without stopping the device. state_stage enqueues a copy of the state
     * as it is after the work queued so far into host staging memory the engine
     * owns, and returns at once; training may go on. state_staged waits for that
     * copy (from any thread) and gives the host buffers (PyTorch layout, as
     * state_to_host), valid until the next state_stage or destroy. */
    void (*state_stage)(Engine *e);
    void (*state_staged)(Engine *e, const float **params, const float **buffers,
                         const float **momentum);
} EngineOps;

struct Engine {
    const EngineOps *ops;
    EngineConfig cfg;
    void *impl;
};

/* The batch augmentation of an engine's data: training (crop, flip and cutout as
 * configured, keyed by epoch) or evaluation (normalise only). */
AugmentSpec engine_augment_spec(const Engine *e, int64_t epoch, int train);

/* The moving average's decay for the update of global step `step` (ema.h's
 * ema_decay_at of the engine's ema_decay and ema_warmup). */
float engine_ema_decay(const Engine *e, int64_t step);

/* ops->prefetch when the engine has one, else nothing. */
void engine_prefetch(Engine *e, const int64_t *idx, int n, int train);

/* Indices first, first+1, ... into idx: b = min(batch, n - first) of them, returned.
 * The batches of a command that runs images 0..n-1 in order (cifar-eval, cifar-predict). */
int engine_batch_in_order(int64_t *idx, int64_t first, int batch, int64_t n);

Engine *engine_create_cpu(const EngineConfig *cfg);
/* NULL with a reason in err when no usable GPU (or a CPU-only build). */
Engine *engine_create_cuda(const EngineConfig *cfg, char *err, size_t errlen);
/* Number of usable CUDA devices (0 in CPU-only builds or without a driver/GPU). */
int engine_cuda_device_count(void);
/* Why the GPU code could not be loaded (cuda_loader.c), or NULL when it was. */
const char *cuda_library_error(void);

#ifdef __cplusplus
}
#endif
#endif
