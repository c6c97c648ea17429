/* comm_mpi.c: the MPI transport of comm.h (libcifar-mpi.so; see comm_mpi.h).
 *
 * All-reduce, per chunk of at most MPI_CHUNK elements, as a reduce-scatter then an
 * all-gather, both in rank order:
 *   1. MPI_Ialltoallv: rank r receives slice r of the chunk from every rank, into
 *      scratch, ordered by source rank;
 *   2. rank r sums its slice over the sources in order 0..W-1 (copy source 0, add
 *      sources 1.., then divide by W for the mean): exactly the per-element
 *      operations of the shared-memory communicator (comm.c), so a 2-rank MPI job
 *      and a 2-process shared-memory job produce the same bits;
 *   3. MPI_Iallgatherv in place: every rank gets every slice.
 * The traffic is that of a ring all-reduce (2 (W-1)/W of the buffer per rank) and
 * the scratch is one chunk. MPI_Allreduce is not used: its summation order
 * depends on the algorithm Open MPI picks for the message size.
 *
 * Every collective is non-blocking and waited for by polling MPI_Test (the TCP
 * transport progresses inside MPI_Test), with the clock checked every 1024 polls:
 * past CIFAR_COMM_TIMEOUT the rank dies naming the collective (mpirun then ends
 * the job). Errors are returned (MPI_ERRORS_RETURN), not fatal inside MPI, so the
 * message names what failed. */
#include "comm/comm_mpi.h"
#include "comm/slice_sum.h"

#include <limits.h>
#include <stdarg.h>
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>


#define MPI_CHUNK ((size_t)1 << 22) /* elements per round: int counts, bounded scratch */

/* The library imports nothing from the executable (no -rdynamic): errors go
 * through the host's die, handed over by mpi_loader.c right after dlopen. */
static CommMpiDieFn g_host_die;

void comm_mpi_set_die(CommMpiDieFn fn) { g_host_die = fn; }

static CommMpiBlameFn g_host_blame;

void comm_mpi_set_blame(CommMpiBlameFn fn) { g_host_blame = fn; }

__attribute__((noreturn, format(printf, 2, 3))) static void mpi_die_status(int status,
                                                                           const char *fmt, ...) {
    char message[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    if (g_host_die) g_host_die(status, message);
    fprintf(stderr, "%s\n", message);
    exit(status);
}
#define mpi_die(...) mpi_die_status(1, __VA_ARGS__)

static void *mpi_calloc(size_t count, size_t size) {
    void *p = calloc(count, size);
    if (!p) mpi_die("out of memory: %zu bytes for the MPI communicator", count * size);
    return p;
}

struct CommMpi {
    MPI_Comm comm;
    int rank, world_size;
    double timeout_s;
    const volatile int *stop_signal; /* DistEnv's: a stop signal ends a wait */
    int *send_counts, *send_displs, *recv_counts, *recv_displs; /* world_size each */
    void *scratch; /* MPI_CHUNK doubles */
};

static double mpi_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void mpi_check(int rc, int rank, const char *what) {
    if (rc == MPI_SUCCESS) return;
    char reason[MPI_MAX_ERROR_STRING];
    int len = 0;
    if (MPI_Error_string(rc, reason, &len) != MPI_SUCCESS) snprintf(reason, sizeof reason, "error %d", rc);
    mpi_die("rank %d: MPI %s failed: %s\n---> HINT: a peer died or the network failed; "
        "rerun the same command to resume from the latest snapshot", rank, what, reason);
}

/* Polls the request until done; dies after the timeout. */
static void mpi_wait(CommMpi *m, MPI_Request *req, const char *what) {
    double start = mpi_now(), stop_since = 0;
    for (unsigned long polls = 1;; polls++) {
        int done = 0;
        mpi_check(MPI_Test(req, &done, MPI_STATUS_IGNORE), m->rank, what);
        if (done) return;
        if ((polls & 1023) != 0) continue;
        int sig = comm_stop_due(m->stop_signal, mpi_now(), &stop_since);
        if (sig)
            mpi_die_status(128 + sig, "rank %d: stopped by signal %d while waiting for its peers "
                           "(MPI %s): exiting without a new snapshot (the last one is kept; rerun "
                           "to resume)", m->rank, sig, what);
        double waited = mpi_now() - start;
        if (waited > m->timeout_s) {
            char who[512] = "";
            if (g_host_blame) g_host_blame(who, sizeof who);
            mpi_die("rank %d: collective timed out after %g s (MPI %s)%s\n"
                "---> HINT: a peer is stopped, stuck or dead; raise CIFAR_COMM_TIMEOUT if it is only slow",
                m->rank, m->timeout_s, what, who);
        }
        if (waited > 0.05) usleep(50); /* a slow peer: stop burning its core */
    }
}

CommMpi *comm_mpi_create(const DistEnv *env, double timeout_s) {
    int inited = 0, provided = 0;
    MPI_Initialized(&inited);
    if (!inited) mpi_check(MPI_Init_thread(NULL, NULL, MPI_THREAD_FUNNELED, &provided), env->rank, "init");
    CommMpi *m = mpi_calloc(1, sizeof *m);
    m->timeout_s = timeout_s;
    m->stop_signal = env->stop_signal;
    mpi_check(MPI_Comm_dup(MPI_COMM_WORLD, &m->comm), env->rank, "communicator duplication");
    MPI_Comm_set_errhandler(m->comm, MPI_ERRORS_RETURN);
    MPI_Comm_rank(m->comm, &m->rank);
    MPI_Comm_size(m->comm, &m->world_size);
    if (m->rank != env->rank || m->world_size != env->world_size)
        mpi_die("rank %d of %d: MPI says rank %d of %d\n"
            "---> HINT: start the ranks with mpirun -np N or srun --mpi=pmix (not plain srun, "
            "not the built-in launcher: its workers use --comm shm)",
            env->rank, env->world_size, m->rank, m->world_size);
    size_t w = (size_t)m->world_size;
    m->send_counts = mpi_calloc(4 * w, sizeof(int));
    m->send_displs = m->send_counts + w;
    m->recv_counts = m->send_counts + 2 * w;
    m->recv_displs = m->send_counts + 3 * w;
    m->scratch = mpi_calloc(MPI_CHUNK, sizeof(double));
    return m;
}

void comm_mpi_destroy(CommMpi *m) {
    if (m == NULL) return;
    MPI_Comm_free(&m->comm);
    free(m->send_counts);
    free(m->scratch);
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Finalize();
    free(m);
}

/* Counts and displacements of the chunk's reduce-scatter (step 1) for this rank:
 * send slice r to rank r; receive my slice from every rank, one after the other. */
static size_t mpi_plan_chunk(CommMpi *m, size_t n) {
    const int w = m->world_size;
    size_t mine = slice_lo(n, m->rank + 1, w) - slice_lo(n, m->rank, w);
    for (int r = 0; r < w; r++) {
        m->send_displs[r] = (int)slice_lo(n, r, w);
        m->send_counts[r] = (int)(slice_lo(n, r + 1, w) - slice_lo(n, r, w));
        m->recv_counts[r] = (int)mine;
        m->recv_displs[r] = (int)(mine * (size_t)r);
    }
    return mine;
}

/* Step 3: every rank gets every reduced slice, in place in buf (the chunk). */
static void mpi_gather_slices(CommMpi *m, void *buf, MPI_Datatype type, const char *what) {
    MPI_Request req;
    mpi_check(MPI_Iallgatherv(MPI_IN_PLACE, 0, type, buf, m->send_counts, m->send_displs, type,
                              m->comm, &req),
              m->rank, what);
    mpi_wait(m, &req, what);
}

static void mpi_scatter_slices(CommMpi *m, const void *buf, MPI_Datatype type, const char *what) {
    MPI_Request req;
    mpi_check(MPI_Ialltoallv(buf, m->send_counts, m->send_displs, type, m->scratch,
                             m->recv_counts, m->recv_displs, type, m->comm, &req),
              m->rank, what);
    mpi_wait(m, &req, what);
}

/* Step 2: sum_slices_mean_f32 or sum_slices_f64 (slice_sum.h). */
typedef void (*SliceReduce)(void *out, const void *in, size_t mine, int world);

/* Steps 1-3 per chunk of n elements of `elem` bytes. */
static void mpi_allreduce(CommMpi *m, void *buf, size_t n, size_t elem, MPI_Datatype type,
                          SliceReduce reduce, const char *what) {
    unsigned char *p = buf;
    for (size_t off = 0; off < n; off += MPI_CHUNK) {
        size_t len = n - off < MPI_CHUNK ? n - off : MPI_CHUNK;
        size_t mine = mpi_plan_chunk(m, len);
        unsigned char *chunk = p + off * elem;
        mpi_scatter_slices(m, chunk, type, what);
        reduce(chunk + slice_lo(len, m->rank, m->world_size) * elem, m->scratch, mine, m->world_size);
        mpi_gather_slices(m, chunk, type, what);
    }
}

void comm_mpi_allreduce_mean(CommMpi *m, float *buf, size_t n) {
    mpi_allreduce(m, buf, n, sizeof(float), MPI_FLOAT, sum_slices_mean_f32, "all-reduce");
}

void comm_mpi_allreduce_sum_f64(CommMpi *m, double *buf, size_t n) {
    mpi_allreduce(m, buf, n, sizeof(double), MPI_DOUBLE, sum_slices_f64, "all-reduce (f64)");
}

void comm_mpi_broadcast(CommMpi *m, void *buf, size_t bytes, int root) {
    unsigned char *p = buf;
    const size_t chunk = (size_t)INT_MAX / 2 + 1;
    for (size_t off = 0; off < bytes; off += chunk) {
        size_t len = bytes - off < chunk ? bytes - off : chunk;
        MPI_Request req;
        mpi_check(MPI_Ibcast(p + off, (int)len, MPI_BYTE, root, m->comm, &req), m->rank, "broadcast");
        mpi_wait(m, &req, "broadcast");
    }
}

void comm_mpi_barrier(CommMpi *m) {
    MPI_Request req;
    mpi_check(MPI_Ibarrier(m->comm, &req), m->rank, "barrier");
    mpi_wait(m, &req, "barrier");
}
