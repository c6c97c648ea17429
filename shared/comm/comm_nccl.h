/* comm_nccl.h: the NCCL transport behind comm.h (shared/comm/comm_nccl_cuda.c, in
 * libcifar-cuda.so; shared/backend-cuda/cuda_loader.c forwards these calls to it). comm.c
 * dispatches to these functions when the Comm is COMM_NCCL; no other file calls
 * them. The communicator is non-blocking: every call, the creation included, gives
 * up after `timeout_s` (ncclCommAbort) and dies with a clear message, so that a
 * dead peer cannot hang the job and the launcher can restart the group. Device-
 * memory collectives are enqueued on the caller's CUDA stream (`stream`, a
 * cudaStream_t: after the kernels already in it; NULL is the legacy default
 * stream); host-memory ones on the communicator's own stream. Every collective
 * returns once done. */
#ifndef CIFAR_COMM_NCCL_H
#define CIFAR_COMM_NCCL_H

#include <stddef.h>

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CommNccl CommNccl;

/* Rank 0 serves the NCCL unique id on MASTER_ADDR:MASTER_PORT (TCP); the other
 * ranks connect (retrying until the timeout), then everyone calls
 * ncclCommInitRankConfig (non-blocking). The CUDA device must be selected first. */
CommNccl *comm_nccl_create(const DistEnv *env, double timeout_s);
void comm_nccl_destroy(CommNccl *nc);
/* Device memory, in place, on `stream`: ncclAllReduce with ncclAvg. */
void comm_nccl_allreduce_mean(CommNccl *nc, float *dev_buf, size_t n, void *stream);
/* Host doubles, in place (through a device scratch buffer). */
void comm_nccl_allreduce_sum_f64(CommNccl *nc, double *host_buf, size_t n);
/* Device memory, on `stream`. */
void comm_nccl_broadcast(CommNccl *nc, void *dev_buf, size_t bytes, int root, void *stream);
/* Host memory (through the device scratch buffer). */
void comm_nccl_broadcast_host(CommNccl *nc, void *host_buf, size_t bytes, int root);
/* A one-element all-reduce. */
void comm_nccl_barrier(CommNccl *nc);

#ifdef __cplusplus
}
#endif
#endif
