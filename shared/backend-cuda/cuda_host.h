/* cuda_host.h: what the commands hand libcifar-cuda.so when they load it
 * (cuda_loader.c), so that the library imports nothing from the executable: its
 * errors, logging, allocation, the communicator and the augmentation spec all come
 * through this table. The library's copy of check.h's functions (and of the
 * comm.h / engine.h functions it calls) forwards to it (shared/backend-cuda/host_api.c).
 *
 * The library exports one entry point besides engine.h's and comm_nccl.h's:
 *   int cifar_cuda_init(const CudaHostApi *api);
 * which returns CUDA_HOST_API_VERSION (a mismatch: another build). */
#ifndef CIFAR_CUDA_HOST_H
#define CIFAR_CUDA_HOST_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"
#include "model/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Also guards engine.h's EngineOps, which the library hands back, and the
 * EngineConfig and AugmentSpec it is given: 4 since the prefetch entry was inserted
 * after eval_batch (a library of an older build would have its state_to_host called
 * as prefetch); 5 since eval_batch returns logits; 6 since state_stage and
 * state_staged were added at its end (an older library's table is shorter) and
 * comm_blame_laggard was inserted in this table before engine_augment_spec; 7 since
 * the moving average (ema_to_host, ema_from_host, ema_decay, ema_warmup, this
 * table's engine_ema_decay: the warm-up's pow stays in the command, the library
 * imports no libm) and the augmentation's flip and cutout fields; 8 since DistEnv
 * carries the communicators' settings (CommSettings comm). Both sides require the same version
 * (cifar_cuda_init, cuda_loader.c), so an entry may go anywhere as long as the
 * version moves. */
#define CUDA_HOST_API_VERSION 8

typedef enum { CUDA_HOST_LOG_INFO, CUDA_HOST_LOG_WARN, CUDA_HOST_LOG_ERROR } CudaHostLogLevel;

typedef struct {
    int version; /* CUDA_HOST_API_VERSION */
    /* check.h: report and exit (never return). */
    void (*check_fail)(const char *file, int line, const char *what, const char *reason,
                       const char *hint);
    void (*die_message)(int status, const char *message);
    const char *(*hint_for_errno)(int err);
    /* One formatted line (no newline) at a level; info lines obey --quiet. */
    void (*log_line)(CudaHostLogLevel level, const char *message);
    /* Checked allocation (dies when out of memory). */
    void *(*xmalloc)(size_t bytes);
    void *(*xcalloc)(size_t count, size_t size);
    /* comm.h */
    CommKind (*comm_kind)(const Comm *c);
    int (*comm_world_size)(const Comm *c);
    void (*comm_allreduce_mean)(Comm *c, float *buf, size_t n);
    void (*comm_broadcast)(Comm *c, void *buf, size_t bytes, int root);
    /* rendezvous.h: rank 0 hands the NCCL unique id to the job's other ranks. */
    void (*rendezvous_share)(const DistEnv *env, void *blob, size_t len, double timeout_s);
    void (*comm_allreduce_mean_on_stream)(Comm *c, float *dev_buf, size_t n, void *cuda_stream);
    void (*comm_broadcast_on_stream)(Comm *c, void *dev_buf, size_t bytes, int root,
                                     void *cuda_stream);
    int (*dist_env_read)(DistEnv *env, char *err, size_t errlen);
    void (*comm_blame_laggard)(char *buf, size_t len); /* version 6 */
    /* engine.h */
    AugmentSpec (*engine_augment_spec)(const Engine *e, int64_t epoch, int train);
    float (*engine_ema_decay)(const Engine *e, int64_t step);
} CudaHostApi;

/* The table of this executable (cuda_loader.c). */
const CudaHostApi *cuda_host_api(void);

typedef int (*CudaInitFn)(const CudaHostApi *api);

#ifdef __cplusplus
}
#endif
#endif
