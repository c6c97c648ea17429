/* comm_nccl_cuda.c: the NCCL transport of comm.h (CUDA builds only; see comm_nccl.h).
 *
 * Bootstrap: rank 0 calls ncclGetUniqueId and serves it over TCP on
 * MASTER_PORT (all interfaces) to the WORLD_SIZE-1 other ranks, which connect to
 * MASTER_ADDR:MASTER_PORT, retrying until the timeout. Each client sends a hello
 * {magic, rank, world size}; rank 0 checks it and answers with the 128-byte id.
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
#include "dist/comm_nccl.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "util/check.h"
#include "cuda/cuda_check.h"

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 14, 0)
#error "NCCL 2.14 or newer is needed (non-blocking communicators, ncclCommFinalize, ncclAvg)"
#endif

#define NCCL_HELLO_MAGIC 0x4346494eu /* "CFIN" */
#define NCCL_SCRATCH_BYTES ((size_t)1 << 20)

struct CommNccl {
    ncclComm_t comm;
    int rank, world_size;
    double timeout_s;
    cudaStream_t stream; /* for host-memory collectives */
    void *scratch;       /* device buffer for host-memory collectives */
};

typedef struct {
    uint32_t magic;
    int32_t rank, world_size;
} NcclHello;

static double nccl_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* ------------------------------------------------------------ TCP bootstrap */

/* Waits until fd is readable/writable or the deadline passes: 1 ready, 0 timeout. */
static int nccl_poll(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - nccl_now();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int rc = poll(&p, 1, (int)(left * 1000) + 1);
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) CHECK_STDIO(0, "poll(NCCL bootstrap socket)");
    }
}

/* Reads or writes exactly len bytes before the deadline: 0 done, -1 failed/timeout. */
static int nccl_io_all(int fd, void *buf, size_t len, int writing, double deadline) {
    unsigned char *p = buf;
    while (len > 0) {
        if (!nccl_poll(fd, writing ? POLLOUT : POLLIN, deadline)) return -1;
        ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static int nccl_listen(int port) {
    int fd = socket(AF_INET6, SOCK_STREAM, 0);
    int v6 = fd >= 0;
    if (!v6) fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_STDIO(fd >= 0, "socket(NCCL bootstrap)");
    int one = 1, zero = 0;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    int rc;
    if (v6) {
        setsockopt(fd, IPPROTO_IPV6, IPV6_V6ONLY, &zero, sizeof zero); /* IPv4 too */
        struct sockaddr_in6 a;
        memset(&a, 0, sizeof a);
        a.sin6_family = AF_INET6;
        a.sin6_addr = in6addr_any;
        a.sin6_port = htons((uint16_t)port);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    } else {
        struct sockaddr_in a;
        memset(&a, 0, sizeof a);
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_ANY);
        a.sin_port = htons((uint16_t)port);
        rc = bind(fd, (struct sockaddr *)&a, sizeof a);
    }
    if (rc != 0)
        die("rank 0: cannot listen on MASTER_PORT %d: %s\n"
            "---> HINT: another job uses this port: choose another --master-port",
            port, strerror(errno));
    CHECK_STDIO(listen(fd, 128) == 0, "listen(NCCL bootstrap)");
    return fd;
}

/* Rank 0: accept world_size-1 hellos and answer each with the unique id. */
static void nccl_serve_id(const DistEnv *env, const ncclUniqueId *id, double timeout_s) {
    int lfd = nccl_listen(env->master_port);
    double deadline = nccl_now() + timeout_s;
    unsigned char *seen = xcalloc((size_t)env->world_size, 1);
    for (int served = 0; served < env->world_size - 1;) {
        if (!nccl_poll(lfd, POLLIN, deadline)) {
            int missing = 1;
            while (missing < env->world_size && seen[missing]) missing++;
            die("rank 0: timed out after %g s waiting for rank %d to connect to port %d\n"
                "---> HINT: start every rank with the same MASTER_ADDR/MASTER_PORT and WORLD_SIZE",
                timeout_s, missing, env->master_port);
        }
        int fd = accept(lfd, NULL, NULL);
        if (fd < 0) continue;
        NcclHello h;
        if (nccl_io_all(fd, &h, sizeof h, 0, deadline) != 0 || h.magic != NCCL_HELLO_MAGIC) {
            close(fd); /* a stray connection: not one of ours */
            continue;
        }
        if (h.world_size != env->world_size || h.rank < 1 || h.rank >= env->world_size ||
            seen[h.rank])
            die("rank 0: a peer announced rank %d of world size %d (this job: world size %d%s)\n"
                "---> HINT: two jobs share MASTER_PORT %d, or two ranks got the same RANK",
                h.rank, h.world_size, env->world_size,
                h.rank > 0 && h.rank < env->world_size && seen[h.rank] ? ", rank seen twice" : "",
                env->master_port);
        if (nccl_io_all(fd, (void *)id, sizeof *id, 1, deadline) != 0)
            die("rank 0: sending the NCCL id to rank %d failed", h.rank);
        seen[h.rank] = 1;
        served++;
        close(fd);
    }
    free(seen);
    close(lfd);
}

/* One connection attempt to MASTER_ADDR:MASTER_PORT: the fd or -1. */
static int nccl_connect_once(const DistEnv *env) {
    char port[16];
    snprintf(port, sizeof port, "%d", env->master_port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    int rc = getaddrinfo(env->master_addr, port, &hints, &res);
    if (rc != 0) {
        if (rc == EAI_AGAIN) return -1;
        die("MASTER_ADDR %s: %s\n---> HINT: check the host name of rank 0's machine",
            env->master_addr, gai_strerror(rc));
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

static void nccl_fetch_id(const DistEnv *env, ncclUniqueId *id, double timeout_s) {
    double deadline = nccl_now() + timeout_s;
    for (;;) {
        int fd = nccl_connect_once(env);
        if (fd >= 0) {
            NcclHello h = {NCCL_HELLO_MAGIC, env->rank, env->world_size};
            int ok = nccl_io_all(fd, &h, sizeof h, 1, deadline) == 0 &&
                     nccl_io_all(fd, id, sizeof *id, 0, deadline) == 0;
            close(fd);
            if (ok) return;
            die("rank %d: rank 0 at %s:%d closed the connection without sending the NCCL id\n"
                "---> HINT: rank 0 refused this rank: check WORLD_SIZE and RANK of every process",
                env->rank, env->master_addr, env->master_port);
        }
        if (nccl_now() > deadline)
            die("rank %d: timed out after %g s connecting to rank 0 at %s:%d\n"
                "---> HINT: check MASTER_ADDR/MASTER_PORT and that rank 0 is running",
                env->rank, timeout_s, env->master_addr, env->master_port);
        usleep(100 * 1000);
    }
}

/* ------------------------------------------------- non-blocking NCCL calls */

static const char *const NCCL_TIMEOUT_HINT =
    "a peer is stopped, stuck or dead; raise CIFAR_COMM_TIMEOUT if it is only slow";

/* Aborts the communicator (ends its kernels, frees it) and fails with what/reason. */
static void nccl_abort_fail(CommNccl *nc, const char *file, int line, const char *what,
                            const char *reason, const char *hint) __attribute__((noreturn));
static void nccl_abort_fail(CommNccl *nc, const char *file, int line, const char *what,
                            const char *reason, const char *hint) {
    char msg[512];
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

/* The result of a call on the non-blocking communicator: ncclInProgress is polled
 * until it settles or the deadline passes; any error aborts and fails. */
static void nccl_settle(CommNccl *nc, ncclResult_t r, const char *what, double deadline,
                        const char *file, int line) {
    while (r == ncclInProgress) {
        if (nccl_now() > deadline)
            nccl_abort_fail(nc, file, line, what, "timed out", NCCL_TIMEOUT_HINT);
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
    for (;;) {
        cudaError_t e = cudaStreamQuery(stream);
        if (e == cudaSuccess) return;
        if (e != cudaErrorNotReady)
            nccl_abort_fail(nc, file, line, what, cudaGetErrorString(e), cuda_check_hint(e));
        ncclResult_t async = ncclSuccess;
        ncclResult_t q = ncclCommGetAsyncError(nc->comm, &async);
        if (q != ncclSuccess) nccl_result_fail(nc, file, line, what, q);
        if (async != ncclSuccess && async != ncclInProgress)
            nccl_result_fail(nc, file, line, what, async);
        if (nccl_now() > deadline) {
            char reason[128];
            snprintf(reason, sizeof reason, "collective timed out after %g s", nc->timeout_s);
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
    ncclUniqueId id;
    if (env->rank == 0) {
        CHECK_NCCL(ncclGetUniqueId(&id));
        nccl_serve_id(env, &id, timeout_s);
    } else {
        nccl_fetch_id(env, &id, timeout_s);
    }
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
void comm_nccl_destroy(CommNccl *nc) {
    if (nc == NULL) return;
    CHECK_CUDA(cudaStreamSynchronize(nc->stream));
    CHECK_CUDA(cudaStreamDestroy(nc->stream));
    CHECK_CUDA(cudaFree(nc->scratch));
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
