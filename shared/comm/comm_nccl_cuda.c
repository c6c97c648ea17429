/* comm_nccl_cuda.c: the NCCL transport of comm.h (CUDA builds only; see comm_nccl.h).
 *
 * Bootstrap: rank 0 calls ncclGetUniqueId and hands it to the other ranks of its
 * job over TCP (rendezvous.h: MASTER_ADDR:MASTER_PORT, hellos carrying the job's
 * identity and token; strangers are dropped). Then every rank calls
 * ncclCommInitRank.
 *
 * The communicator is non-blocking (ncclConfig_t.blocking = 0, NCCL 2.14+): no NCCL
 * call waits for the peers. A call that returns ncclInProgress is polled with
 * ncclCommGetAsyncError until it leaves that state (ncclCommInitRankConfig: the
 * connection to the peers; a collective: its enqueueing on the stream), then a
 * collective's stream is polled with cudaStreamQuery, ncclCommGetAsyncError
 * watching for peer or network errors. Everything gives up after the collective
 * timeout (CIFAR_COMM_TIMEOUT): the communicator is aborted (ncclCommAbort, which
 * also ends kernels stuck waiting for a dead peer) and the process fails with a
 * clear message instead of hanging forever, so a peer dying after the id exchange
 * stops the job (PyTorch's NCCL watchdog does the same). No group calls
 * (ncclGroupStart/End) are used: every collective is issued alone.
 *
 * Device-memory collectives run on the caller's stream (the CUDA engine's, after
 * the kernels that produced the buffer); host-memory ones on this communicator's
 * own stream through a device scratch buffer. Every call returns once done. */
#include "comm/comm_nccl.h"
#include "comm/rendezvous.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "backend-cuda/cuda_check.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "NCCL 2.14 or newer is needed (non-blocking communicators, ncclCommFinalize, ncclAvg)"
#endif

#define NCCL_SCRATCH_BYTES ((size_t)1 << 20)

struct CommNccl {
    ncclComm_t comm;
    int rank, world_size;
    double timeout_s;
    const volatile int *stop_signal; /* DistEnv's: a stop signal ends a wait */
    double stop_since;               /* when the current wait first saw it */
    cudaStream_t stream; /* for host-memory collectives */
    void *scratch;       /* device buffer for host-memory collectives */
};

static double nccl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* -------------------------------------------------------------- collectives */

static const char *const NCCL_TIMEOUT_HINT =
    "a peer is stopped, stuck or dead; raise CIFAR_COMM_TIMEOUT if it is only slow";

/* Aborts the communicator (ends its kernels, frees it) and fails with what/reason. */
static void nccl_abort_fail(CommNccl *nc, const char *file, int line, const char *what,
                            const char *reason, const char *hint) __attribute__((noreturn));
static void nccl_abort_fail(CommNccl *nc, const char *file, int line, const char *what,
                            const char *reason, const char *hint) {
    char msg[1024]; /* a timeout's reason holds comm_blame_laggard's text (up to 512) */
    snprintf(msg, sizeof msg, "rank %d: %s", nc->rank, reason);
    if (nc->comm != NULL) ncclCommAbort(nc->comm);
    nc->comm = NULL;
    check_fail(file, line, what, msg, hint);
}

static void nccl_result_fail(CommNccl *nc, const char *file, int line, const char *what,
                             ncclResult_t r) __attribute__((noreturn));
static void nccl_result_fail(CommNccl *nc, const char *file, int line, const char *what,
                             ncclResult_t r) {
    char reason[400];
    const char *last = ncclGetLastError(nc->comm);
    snprintf(reason, sizeof reason, "%s%s%s", ncclGetErrorString(r), last && *last ? ": " : "",
             last ? last : "");
    nccl_abort_fail(nc, file, line, what, reason, nccl_check_hint(r));
}

/* A stop signal pending past the grace (comm_stop_due): the communicator is aborted
 * (which ends its kernels waiting for a lost peer) and the process exits 128 + it. */
static void nccl_stop_check(CommNccl *nc, const char *what) {
    int sig = comm_stop_due(nc->stop_signal, nccl_now(), &nc->stop_since);
    if (!sig) return;
    if (nc->comm != NULL) ncclCommAbort(nc->comm);
    nc->comm = NULL;
    die_status(128 + sig, "rank %d: stopped by signal %d while waiting for its peers (%s): "
               "exiting without a new snapshot (the last one is kept; rerun to resume)",
               nc->rank, sig, what);
}

/* The result of a call on the non-blocking communicator: ncclInProgress is polled
 * until it settles or the deadline passes; any error aborts and fails. */
static void nccl_settle(CommNccl *nc, ncclResult_t r, const char *what, double deadline,
                        const char *file, int line) {
    nc->stop_since = 0;
    while (r == ncclInProgress) {
        if (nccl_now() > deadline) {
            char reason[600], who[512];
            comm_blame_laggard(who, sizeof who);
            snprintf(reason, sizeof reason, "timed out%s", who);
            nccl_abort_fail(nc, file, line, what, reason, NCCL_TIMEOUT_HINT);
        }
        nccl_stop_check(nc, what);
        usleep(100);
        ncclResult_t async = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(nc->comm, &async);
        r = q != ncclSuccess ? q : async;
    }
    if (r != ncclSuccess) nccl_result_fail(nc, file, line, what, r);
}
#define NCCL_SETTLE(nc, call, deadline) nccl_settle((nc), (call), #call, (deadline), __FILE__, __LINE__)

/* Waits for `stream` (the collective just enqueued on it), failing on an NCCL error
 * or after the deadline. */
static void nccl_wait_stream(CommNccl *nc, cudaStream_t stream, const char *what, double deadline,
                             const char *file, int line) {
    nc->stop_since = 0;
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return;
        nccl_stop_check(nc, what);
        if (e != cudaErrorNotReady)
            nccl_abort_fail(nc, file, line, what, cudaGetErrorString(e), cuda_check_hint(e));
        ncclResult_t async = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(nc->comm, &async);
        if (q != ncclSuccess) nccl_result_fail(nc, file, line, what, q);
        if (async != ncclSuccess && async != ncclInProgress)
            nccl_result_fail(nc, file, line, what, async);
        if (nccl_now() > deadline) {
            char reason[640], who[512];
            comm_blame_laggard(who, sizeof who);
            snprintf(reason, sizeof reason, "collective timed out after %g s%s", nc->timeout_s, who);
            nccl_abort_fail(nc, file, line, what, reason, NCCL_TIMEOUT_HINT);
        }
        usleep(50);
    }
}

/* Enqueues a collective on `stream` and waits for it: one call, one deadline. */
#define NCCL_COLLECTIVE(nc, call, stream)                                                  \
    do {                                                                                  \
        double nccl_deadline_ = nccl_now() + (nc)->timeout_s;                             \
        nccl_settle((nc), (call), #call, nccl_deadline_, __FILE__, __LINE__);            \
        nccl_wait_stream((nc), (stream), #call, nccl_deadline_, __FILE__, __LINE__);     \
    } while (0)

/* -------------------------------------------------------------- lifecycle */

CommNccl *comm_nccl_create(const DistEnv *env, double timeout_s) {
    CommNccl *nc = xcalloc(1, sizeof *nc);
    nc->rank = env->rank;
    nc->world_size = env->world_size;
    nc->timeout_s = timeout_s;
    nc->stop_signal = env->stop_signal;
    ncclUniqueId id;
    if (env->rank == 0) CHECK_NCCL(ncclGetUniqueId(&id));
    rendezvous_share(env, &id, sizeof id, timeout_s);
    /* Restored after the 'dist' merge (2ffa55f) had put back the blocking
     * ncclCommInitRank and dropped the stream: a non-blocking communicator whose
     * initialisation is polled against the timeout (a peer dying after the id
     * exchange cannot hang it), and the stream of the host-memory collectives
     * (comm_nccl_destroy destroys it; it was left NULL, the legacy stream). */
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    NCCL_SETTLE(nc, ncclCommInitRankConfig(&nc->comm, env->world_size, id, env->rank, &config),
                nccl_now() + timeout_s);
    CHECK_CUDA(cudaStreamCreateWithFlags(&nc->stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaMalloc(&nc->scratch, NCCL_SCRATCH_BYTES));
    return nc;
}

/* ncclCommFinalize (flushes the communicator's work, may talk to the peers: polled
 * with the timeout), then ncclCommDestroy. A peer gone at this point only costs a
 * warning and an abort: the work is done. */
static void nccl_comm_close(CommNccl *nc) {
    double deadline = nccl_now() + nc->timeout_s;
    ncclResult_t r = ncclCommFinalize(nc->comm);
    while (r == ncclInProgress && nccl_now() < deadline) {
        usleep(1000);
        ncclResult_t async = ncclSuccess;
        r = ncclCommGetAsyncError(nc->comm, &async);
        if (r == ncclSuccess) r = async;
    }
    if (r == ncclSuccess) {
        CHECK_NCCL(ncclCommDestroy(nc->comm));
    } else {
        log_warn("rank %d: closing the NCCL communicator: %s; aborted instead", nc->rank,
                 r == ncclInProgress ? "timed out" : ncclGetErrorString(r));
        ncclCommAbort(nc->comm);
    }
}

/* The communicator first, then the stream and the scratch buffer its collectives
 * used: ncclCommFinalize flushes the operations still issued on the communicator
 * (NCCL user guide, "Finalizing a communicator" and api/comms ncclCommFinalize),
 * and those may name the scratch buffer and the stream, so neither is released
 * before the communicator is finalized and destroyed (or aborted). */
void comm_nccl_destroy(CommNccl *nc) {
    if (nc == NULL) return;
    CHECK_CUDA(cudaStreamSynchronize(nc->stream));
    nccl_comm_close(nc);
    CHECK_CUDA(cudaStreamDestroy(nc->stream));
    CHECK_CUDA(cudaFree(nc->scratch));
    free(nc);
}

/* -------------------------------------------------------------- collectives */

void comm_nccl_allreduce_mean(CommNccl *nc, float *dev_buf, size_t n, void *stream) {
    NCCL_COLLECTIVE(nc, ncclAllReduce(dev_buf, dev_buf, n, ncclFloat, ncclAvg, nc->comm,
                                      (cudaStream_t)stream),
                    (cudaStream_t)stream);
}

void comm_nccl_allreduce_sum_f64(CommNccl *nc, double *host_buf, size_t n) {
    size_t per = NCCL_SCRATCH_BYTES / sizeof(double);
    for (size_t off = 0; off < n; off += per) {
        size_t m = n - off < per ? n - off : per;
        CHECK_CUDA(cudaMemcpyAsync(nc->scratch, host_buf + off, m * sizeof(double),
                                   cudaMemcpyHostToDevice, nc->stream));
        NCCL_COLLECTIVE(nc, ncclAllReduce(nc->scratch, nc->scratch, m, ncclDouble, ncclSum,
                                          nc->comm, nc->stream),
                        nc->stream);
        CHECK_CUDA(cudaMemcpyAsync(host_buf + off, nc->scratch, m * sizeof(double),
                                   cudaMemcpyDeviceToHost, nc->stream));
        CHECK_CUDA(cudaStreamSynchronize(nc->stream));
    }
}

void comm_nccl_broadcast(CommNccl *nc, void *dev_buf, size_t bytes, int root, void *stream) {
    NCCL_COLLECTIVE(nc, ncclBroadcast(dev_buf, dev_buf, bytes, ncclUint8, root, nc->comm,
                                      (cudaStream_t)stream),
                    (cudaStream_t)stream);
}

void comm_nccl_broadcast_host(CommNccl *nc, void *host_buf, size_t bytes, int root) {
    unsigned char *p = host_buf;
    for (size_t off = 0; off < bytes; off += NCCL_SCRATCH_BYTES) {
        size_t m = bytes - off < NCCL_SCRATCH_BYTES ? bytes - off : NCCL_SCRATCH_BYTES;
        if (nc->rank == root)
            CHECK_CUDA(cudaMemcpyAsync(nc->scratch, p + off, m, cudaMemcpyHostToDevice, nc->stream));
        NCCL_COLLECTIVE(nc, ncclBroadcast(nc->scratch, nc->scratch, m, ncclUint8, root, nc->comm,
                                          nc->stream),
                        nc->stream);
        if (nc->rank != root) {
            CHECK_CUDA(cudaMemcpyAsync(p + off, nc->scratch, m, cudaMemcpyDeviceToHost, nc->stream));
            CHECK_CUDA(cudaStreamSynchronize(nc->stream));
        }
    }
}

void comm_nccl_barrier(CommNccl *nc) {
    NCCL_COLLECTIVE(nc, ncclAllReduce(nc->scratch, nc->scratch, 1, ncclFloat, ncclSum, nc->comm,
                                      nc->stream),
                    nc->stream);
}
