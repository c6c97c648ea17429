/* comm_nccl_cuda.c: the NCCL transport of comm.h (CUDA builds only; see comm_nccl.h).
 *
 * Bootstrap: rank 0 calls ncclGetUniqueId and serves it over TCP on
 * MASTER_PORT (all interfaces) to the WORLD_SIZE-1 other ranks, which connect to
 * MASTER_ADDR:MASTER_PORT, retrying until the timeout. Each client sends a hello
 * {magic, rank, world size}; rank 0 checks it and answers with the 128-byte id.
 * Then every rank calls ncclCommInitRank.
 *
 * Collectives run on the legacy default stream (so they follow the kernels that
 * produced the gradients) and this file waits for them by polling, checking
 * ncclCommGetAsyncError and the timeout: a dead or stopped peer makes the call
 * abort the communicator and fail after the timeout instead of hanging forever
 * (PyTorch's NCCL watchdog does the same). */
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

#if NCCL_VERSION_CODE < NCCL_VERSION(2, 10, 0)
#error "NCCL 2.10 or newer is needed (ncclAvg)"
#endif

#define NCCL_HELLO_MAGIC 0x4346494eu /* "CFIN" */
#define NCCL_SCRATCH_BYTES ((size_t)1 << 20)

struct CommNccl {
    ncclComm_t comm;
    int rank, world_size;
    double timeout_s;
    void *scratch; /* device buffer for host-memory collectives */
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
    if (env->rank == 0) {
        CHECK_NCCL(ncclGetUniqueId(&id));
        nccl_serve_id(env, &id, timeout_s);
    } else {
        nccl_fetch_id(env, &id, timeout_s);
    }
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
