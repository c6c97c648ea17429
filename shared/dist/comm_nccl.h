/* comm_nccl.h: the NCCL transport behind comm.h (comm_nccl_cuda.c, CUDA builds
 * only). comm.c dispatches to these functions when the Comm is COMM_NCCL; no
 * other file calls them. Every call dies with a clear message on failure, and
 * every collective gives up after `timeout_s` (ncclCommAbort) so that the
 * launcher can restart the group. Collectives run on the legacy default stream
 * (ordered after the kernels that produced the buffer) and return once done. */
#ifndef CIFAR_COMM_NCCL_H
#define CIFAR_COMM_NCCL_H

#include <stddef.h>

#include "dist/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CommNccl CommNccl;

/* Rank 0 serves the NCCL unique id on MASTER_ADDR:MASTER_PORT (TCP); the other
 * ranks connect (retrying until the timeout), then everyone calls ncclCommInitRank. */
CommNccl *comm_nccl_create(const DistEnv *env, double timeout_s);
void comm_nccl_destroy(CommNccl *nc);
/* Device memory, in place: ncclAllReduce with ncclAvg. */
void comm_nccl_allreduce_mean(CommNccl *nc, float *dev_buf, size_t n);
/* Host doubles, in place (through a device scratch buffer). */
void comm_nccl_allreduce_sum_f64(CommNccl *nc, double *host_buf, size_t n);
/* Device memory. */
void comm_nccl_broadcast(CommNccl *nc, void *dev_buf, size_t bytes, int root);
/* Host memory (through the device scratch buffer). */
void comm_nccl_broadcast_host(CommNccl *nc, void *host_buf, size_t bytes, int root);
/* A one-element all-reduce. */
void comm_nccl_barrier(CommNccl *nc);

#ifdef __cplusplus
}
#endif
#endif
