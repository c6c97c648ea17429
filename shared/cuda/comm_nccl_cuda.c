/* comm_nccl_cuda.c: the NCCL transport of comm.h (CUDA builds only; see comm_nccl.h).
 *
 * Bootstrap: rank 0 calls ncclGetUniqueId and hands it to the other ranks of its
 * job over TCP (rendezvous.h: MASTER_ADDR:MASTER_PORT, hellos carrying the job's
 * identity and token; strangers are dropped). Then every rank calls
 * ncclCommInitRank.
 *
 * Collectives run on the legacy default stream (so they follow the kernels that
 * produced the gradients) and this file waits for them by polling, checking
 * ncclCommGetAsyncError and the timeout: a dead or stopped peer makes the call
 * abort the communicator and fail after the timeout instead of hanging forever
 * (PyTorch's NCCL watchdog does the same). */
#include "dist/comm_nccl.h"
#include "dist/rendezvous.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "util/check.h"
#include "cuda/cuda_check.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
#error "NCCL 2.10 or newer is needed (ncclAvg)"
#endif

#define NCCL_SCRATCH_BYTES ((size_t)1 << 20)

struct CommNccl {
    ncclComm_t comm;
    int rank, world_size;
    double timeout_s;
    void *scratch; /* device buffer for host-memory collectives */
};

static double nccl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* -------------------------------------------------------------- collectives */

/* Waits for the default stream, failing on an NCCL error or after the timeout. */
static void nccl_wait(CommNccl *nc, const char *what) {
    double start = nccl_now();
    for (;;) {
        cudaError_t e = cudaStreamQuery(0);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady) CHECK_CUDA(e);
        ncclResult_t async = ncclSuccess;
        CHECK_NCCL(ncclCommGetAsyncError(nc->comm, &async));
        if (async != ncclSuccess) {
            ncclCommAbort(nc->comm);
            die("rank %d: NCCL %s failed: %s\n---> HINT: %s", nc->rank, what,
                ncclGetErrorString(async), nccl_check_hint(async));
        }
        if (nccl_now() - start > nc->timeout_s) {
            ncclCommAbort(nc->comm);
            die("rank %d: collective timed out after %g s (NCCL %s)\n"
                "---> HINT: a peer is stopped, stuck or dead; raise CIFAR_COMM_TIMEOUT if it is only slow",
                nc->rank, nc->timeout_s, what);
        }
        usleep(50);
    }
}

CommNccl *comm_nccl_create(const DistEnv *env, double timeout_s) {
    CommNccl *nc = xcalloc(1, sizeof *nc);
    nc->rank = env->rank;
    nc->world_size = env->world_size;
    nc->timeout_s = timeout_s;
    ncclUniqueId id;
    if (env->rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    rendezvous_share(env, &id, sizeof id, timeout_s);
    CHECK_NCCL(ncclCommInitRank(&nc->comm, env->world_size, id, env->rank));
    CHECK_CUDA(cudaMalloc(&nc->scratch, NCCL_SCRATCH_BYTES));
    return nc;
}

void comm_nccl_destroy(CommNccl *nc) {
    if (nc == NULL) return;
    CHECK_CUDA(cudaFree(nc->scratch));
    CHECK_NCCL(ncclCommDestroy(nc->comm));
    free(nc);
}

void comm_nccl_allreduce_mean(CommNccl *nc, float *dev_buf, size_t n) {
    CHECK_NCCL(ncclAllReduce(dev_buf, dev_buf, n, ncclFloat, ncclAvg, nc->comm, 0));
    nccl_wait(nc, "all-reduce");
}

void comm_nccl_allreduce_sum_f64(CommNccl *nc, double *host_buf, size_t n) {
    size_t per = NCCL_SCRATCH_BYTES / sizeof(double);
    for (size_t off = 0; off < n; off += per) {
        size_t m = n - off < per ? n - off : per;
        CHECK_CUDA(cudaMemcpy(nc->scratch, host_buf + off, m * sizeof(double),
                              cudaMemcpyHostToDevice));
        CHECK_NCCL(ncclAllReduce(nc->scratch, nc->scratch, m, ncclDouble, ncclSum, nc->comm, 0));
        nccl_wait(nc, "all-reduce (f64)");
        CHECK_CUDA(cudaMemcpy(host_buf + off, nc->scratch, m * sizeof(double),
                              cudaMemcpyDeviceToHost));
    }
}

void comm_nccl_broadcast(CommNccl *nc, void *dev_buf, size_t bytes, int root) {
    CHECK_NCCL(ncclBroadcast(dev_buf, dev_buf, bytes, ncclUint8, root, nc->comm, 0));
    nccl_wait(nc, "broadcast");
}

void comm_nccl_broadcast_host(CommNccl *nc, void *host_buf, size_t bytes, int root) {
    unsigned char *p = host_buf;
    for (size_t off = 0; off < bytes; off += NCCL_SCRATCH_BYTES) {
        size_t m = bytes - off < NCCL_SCRATCH_BYTES ? bytes - off : NCCL_SCRATCH_BYTES;
        if (nc->rank == root)
            CHECK_CUDA(cudaMemcpy(nc->scratch, p + off, m, cudaMemcpyHostToDevice));
        CHECK_NCCL(ncclBroadcast(nc->scratch, nc->scratch, m, ncclUint8, root, nc->comm, 0));
        nccl_wait(nc, "broadcast");
        if (nc->rank != root)
            CHECK_CUDA(cudaMemcpy(p + off, nc->scratch, m, cudaMemcpyDeviceToHost));
    }
}

void comm_nccl_barrier(CommNccl *nc) {
    CHECK_NCCL(ncclAllReduce(nc->scratch, nc->scratch, 1, ncclFloat, ncclSum, nc->comm, 0));
    nccl_wait(nc, "barrier");
}
