/* comm.c: the communicator of comm.h: COMM_SINGLE, COMM_SHM, the progress
 * board, and the dispatch to COMM_NCCL (libcifar-cuda.so), COMM_MPI (libcifar-mpi.so)
 * and COMM_GLOO (libcifar-gloo.so).
 *
 * COMM_SHM segment "/cifar-<run_id>" (POSIX shm, one machine):
 *     [ShmHeader, padded to 4 KiB][slot 0]...[slot W-1][area 0][area 1]
 * every slot and area holds slot_bytes (default 4 MiB, CIFAR_COMM_SLOT_BYTES for
 * tests; rank 0 chooses it and writes it in the header, the others read it).
 * Rank 0 removes any stale segment of that name, creates the new one and sets
 * `ready` last; the others open it (retrying until the timeout), check magic,
 * version, world size, run id and that rank 0's pid is alive, then write their pid.
 * After the first barrier rank 0 unlinks the name, so nothing is left in /dev/shm
 * even if a process dies later (the launcher also removes it after each group).
 *
 * All-reduce, per chunk of at most slot_bytes: each rank copies its chunk into its
 * slot; barrier; each rank sums a disjoint slice of the chunk over the slots in
 * rank order 0..W-1 and then divides by W, into a result area; barrier; each rank
 * copies the result back. Every element is summed in the same order whichever
 * rank computes it, so all ranks get identical bits, run after run.
 * (PyTorch DDP divides each gradient by W and then sums in NCCL's ring order; its
 * bits cannot be reproduced anyway. "Sum then divide" rounds once less.)
 * Result areas alternate (area_seq): an area is written, a barrier passes, it is
 * read; its next writer has passed a later barrier that every reader reached
 * only after reading, so no barrier is needed after the copy-back.
 *
 * Barrier: a generation counter (sense reversal with a counter instead of a bit).
 * The last arrival resets the count, bumps the generation and wakes the futex;
 * the others spin briefly, then sleep on the futex in 50 ms slices, checking the
 * timeout and whether each peer's pid is still alive. */
#include "comm/comm.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <signal.h>
#include <stdalign.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "comm/comm_gloo.h"
#include "comm/comm_mpi.h"
#include "comm/rendezvous.h"
#include "core/check.h"
#include "core/fsutil.h"
#ifdef CIFAR_CUDA
#include "comm/comm_nccl.h"
#endif

/* ------------------------------------------------------------- shm segment */

#define SHM_MAGIC 0x4d534643u /* "CFSM" */
#define SHM_VERSION 1u
#define SHM_MAX_RANKS 256
#define SHM_HEADER_BYTES 16384
#define SHM_BLOCK ((size_t)2048) /* elements reduced at a time (8 KiB of floats) */

typedef struct {
    uint32_t magic, version;
    int32_t world_size, pad_;
    uint64_t slot_bytes, total_bytes;
    char run_id[64];
    _Atomic int32_t ready;                      /* set by rank 0 when initialized */
    alignas(64) _Atomic uint32_t bar_count;     /* arrivals in the current barrier */
    alignas(64) _Atomic uint32_t bar_gen;       /* futex word: barriers completed */
    alignas(64) _Atomic uint64_t arrived[SHM_MAX_RANKS]; /* barriers entered, per rank */
    _Atomic int32_t pid[SHM_MAX_RANKS];
} ShmHeader;

_Static_assert(sizeof(ShmHeader) <= SHM_HEADER_BYTES, "ShmHeader outgrew its page");

struct Comm {
    CommKind kind;
    int rank, world_size;
    double timeout_s;
    const volatile int *stop_signal; /* DistEnv's */
    /* COMM_SHM */
    ShmHeader *hdr;
    unsigned char *base;
    size_t map_bytes, slot_bytes;
    uint64_t epoch;    /* barriers this rank has entered */
    uint64_t area_seq; /* which result area the next phase uses */
    int name_linked;   /* rank 0: the name is still in /dev/shm */
    char name[96];
    CommMpi *mpi;   /* COMM_MPI */
    CommGloo *gloo; /* COMM_GLOO */
#ifdef CIFAR_CUDA
    CommNccl *nccl;
#endif
    /* every transport: time inside collectives, and the progress board */
    double seconds_in_collectives;
    uint64_t entered;  /* collectives entered */
    int64_t step;      /* the last step reported (comm_board_step) */
    int board_fd;      /* RUN_DIR/ranks/rank-R, -1 none */
    char board_dir[4096], host[64], run_id[64];
    int pid;
};

static const char *const comm_kind_names[] = {"single", "shm", "nccl", "mpi", "gloo"};
#define COMM_KINDS ((int)(sizeof comm_kind_names / sizeof *comm_kind_names))

const char *comm_kind_name(CommKind kind) {
    return (unsigned)kind < COMM_KINDS ? comm_kind_names[kind] : "unknown";
}

int comm_kind_parse(const char *name, CommKind *kind) {
    for (int k = 0; k < COMM_KINDS; k++)
        if (strcmp(name, comm_kind_names[k]) == 0) {
            *kind = (CommKind)k;
            return 0;
        }
    return -1;
}

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_seconds(double s) {
    struct timespec ts = {(time_t)s, (long)((s - (double)(time_t)s) * 1e9)};
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR) {}
}

/* ------------------------------------------------------------ progress board
 *
 * RUN_DIR/ranks/rank-R: one line per rank, rewritten in place at every collective
 * it enters (BOARD_BYTES, space-padded):
 *     cifar-rank v1 run=<run id> rank=R pid=P host=H step=S entered=N
 * A rank whose collective times out reads the others' lines and names the one that
 * entered the fewest (it has not reached the collective the others wait in): rank,
 * host, pid and the last step it reported. The run folder is shared by every node
 * (the other ranks read rank 0's snapshots there), so this works on shm, MPI and
 * NCCL alike. Diagnostics only: a board that cannot be written is given up with one
 * warning. */

#define BOARD_BYTES 256

static Comm *g_board_comm; /* the process's communicator with a board, for comm_blame_laggard */

static void board_record(const Comm *c, char *line) {
    int n = snprintf(line, BOARD_BYTES, "cifar-rank v1 run=%s rank=%d pid=%d host=%s step=%lld entered=%llu",
                     c->run_id, c->rank, c->pid, c->host, (long long)c->step,
                     (unsigned long long)c->entered);
    if (n < 0) n = 0;
    if (n > BOARD_BYTES - 1) n = BOARD_BYTES - 1;
    memset(line + n, ' ', (size_t)(BOARD_BYTES - 1 - n));
    line[BOARD_BYTES - 1] = '\n';
}

static void board_write(Comm *c) {
    if (c->board_fd < 0) return;
    char line[BOARD_BYTES];
    board_record(c, line);
    if (pwrite(c->board_fd, line, BOARD_BYTES, 0) != BOARD_BYTES) {
        log_warn("%s/rank-%d: cannot record this rank's progress (%s): a timeout will not name "
                 "the rank it waited for", c->board_dir, c->rank, strerror(errno));
        close(c->board_fd);
        c->board_fd = -1;
    }
}

void comm_board_open(Comm *c, const char *run_dir, const char *run_id) {
    c->board_fd = -1;
    if (c->world_size == 1) return;
    snprintf(c->board_dir, sizeof c->board_dir, "%s/ranks", run_dir);
    snprintf(c->run_id, sizeof c->run_id, "%s", run_id);
    c->pid = (int)getpid();
    if (gethostname(c->host, sizeof c->host - 1) != 0) snprintf(c->host, sizeof c->host, "?");
    c->host[sizeof c->host - 1] = '\0';
    for (char *p = c->host; *p; p++)
        if (*p == ' ') *p = '_';
    char path[4200];
    snprintf(path, sizeof path, "%s/rank-%d", c->board_dir, c->rank);
    if (fs_mkdirs(c->board_dir, 0755) != 0) { /* the run folder too: rank 0 may not be there yet */
        log_warn("%s: cannot create the progress board (%s): a timeout will not name the rank it "
                 "waited for", c->board_dir, strerror(errno));
        return;
    }
    c->board_fd = open(path, O_RDWR | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0644);
    if (c->board_fd < 0)
        log_warn("%s: cannot record this rank's progress (%s)", path, strerror(errno));
    board_write(c);
    g_board_comm = c;
}

void comm_board_step(Comm *c, int64_t step) {
    c->step = step;
    board_write(c);
}

/* Rank r's line: 1 and its fields, 0 when it has none for this run. */
static int board_read(const Comm *c, int r, int *pid, char *host, long long *step,
                      unsigned long long *entered) {
    char path[4200], line[BOARD_BYTES + 1], run[64];
    snprintf(path, sizeof path, "%s/rank-%d", c->board_dir, r);
    int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return 0;
    ssize_t n = pread(fd, line, BOARD_BYTES, 0);
    close(fd);
    if (n != BOARD_BYTES) return 0;
    line[BOARD_BYTES] = '\0';
    int rank;
    if (sscanf(line, "cifar-rank v1 run=%63s rank=%d pid=%d host=%63s step=%lld entered=%llu", run,
               &rank, pid, host, step, entered) != 6)
        return 0;
    return rank == r && strcmp(run, c->run_id) == 0;
}

/* "rank R (pid P on host H, last step S)" into buf, 0; -1 when R has not reported. */
static int board_rank_text(const Comm *c, int r, char *buf, size_t len, unsigned long long *entered) {
    int pid;
    char host[64];
    long long step;
    if (!board_read(c, r, &pid, host, &step, entered)) return -1;
    snprintf(buf, len, "rank %d (pid %d on host %s, last step %lld)", r, pid, host, step);
    return 0;
}

/* " on host H, last step S" for rank r, or "" without a board. */
static void board_describe(const Comm *c, int r, char *buf, size_t len) {
    int pid;
    char host[64];
    long long step;
    unsigned long long entered;
    buf[0] = '\0';
    if (c->board_fd < 0) return;
    if (!board_read(c, r, &pid, host, &step, &entered))
        snprintf(buf, len, ", which has not reported in %.300s yet", c->board_dir);
    else
        snprintf(buf, len, " on host %s, last step %lld", host, step);
}

void comm_blame_laggard(char *buf, size_t len) {
    Comm *c = g_board_comm;
    buf[0] = '\0';
    if (!c || c->board_fd < 0) return;
    /* The rank that entered the fewest collectives has not reached this one. */
    int laggard = -1;
    unsigned long long fewest = c->entered, entered;
    char text[160], lag_text[160] = "";
    for (int r = 0; r < c->world_size; r++) {
        if (r == c->rank) continue;
        if (board_rank_text(c, r, text, sizeof text, &entered) != 0) {
            snprintf(buf, len, "\nrank %d has not reported in %.300s (not started, or another run)", r,
                     c->board_dir);
            return;
        }
        if (entered < fewest) {
            laggard = r, fewest = entered;
            snprintf(lag_text, sizeof lag_text, "%s", text);
        }
    }
    if (laggard >= 0) {
        snprintf(buf, len, "\nwaiting for %s: it has not entered this collective (%llu entered, this "
                 "rank %llu)", lag_text, fewest, (unsigned long long)c->entered);
        return;
    }
    /* Every rank entered it (the transport may start a collective before all arrive):
     * one is stopped or stuck inside; the board says where each one was. */
    size_t off = (size_t)snprintf(buf, len, "\nevery rank entered this collective; one is stopped or "
                                  "stuck inside it:");
    for (int r = 0; r < c->world_size && r < 16 && off < len; r++) {
        if (r == c->rank || board_rank_text(c, r, text, sizeof text, &entered) != 0) continue;
        off += (size_t)snprintf(buf + off, len - off, " %s", text);
    }
}

/* Every collective, on entry: counted and recorded (the board), timed. */
static double collective_begin(Comm *c) {
    c->entered++;
    board_write(c);
    return now_seconds();
}

static void collective_end(Comm *c, double t0) { c->seconds_in_collectives += now_seconds() - t0; }

double comm_seconds_in_collectives(const Comm *c) { return c->seconds_in_collectives; }

static void shm_name_for(const char *run_id, char *buf, size_t len) {
    snprintf(buf, len, "/cifar-%s", run_id);
}

void comm_shm_cleanup(const char *run_id) {
    char name[96];
    shm_name_for(run_id, name, sizeof name);
    shm_unlink(name); /* ENOENT is the normal case */
}

/* Alive unless kill() says it is gone or /proc shows a zombie (a dead child its
 * parent has not reaped yet still answers kill(pid, 0)). */
static int pid_alive(pid_t pid) {
    if (pid <= 0) return 1;
    if (kill(pid, 0) != 0 && errno == ESRCH) return 0;
    char path[64], buf[512];
    snprintf(path, sizeof path, "/proc/%d/stat", (int)pid);
    FILE *f = fopen(path, "r");
    if (f == NULL) return errno == ENOENT ? 0 : 1;
    size_t got = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[got] = '\0';
    const char *paren = strrchr(buf, ')'); /* the command name may hold spaces */
    if (paren == NULL || paren[1] == '\0') return 1;
    char state = paren[2];
    return !(state == 'Z' || state == 'X' || state == 'x');
}

static void futex_wait_slice(_Atomic uint32_t *word, uint32_t expected, double seconds) {
    struct timespec ts = {(time_t)seconds, (long)((seconds - (double)(time_t)seconds) * 1e9)};
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAIT, expected, &ts, NULL, 0);
}

static void futex_wake_all(_Atomic uint32_t *word) {
    syscall(SYS_futex, (uint32_t *)word, FUTEX_WAKE, INT_MAX, NULL, NULL, 0);
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Before dying: rank 0 takes the name away if the first barrier never passed. */
static void shm_unlink_if_linked(Comm *c) {
    if (c->name_linked) shm_unlink(c->name);
    c->name_linked = 0;
}

/* Dies if a peer that registered its pid is gone (unless the barrier completed
 * meanwhile: a peer may pass the last barrier and exit normally). */
static void shm_check_peers(Comm *c, uint32_t gen) {
    ShmHeader *h = c->hdr;
    for (int r = 0; r < c->world_size; r++) {
        if (r == c->rank) continue;
        pid_t pid = atomic_load(&h->pid[r]);
        if (pid_alive(pid)) continue;
        if (atomic_load(&h->bar_gen) != gen) return;
        shm_unlink_if_linked(c);
        die("rank %d (pid %d) died; rank %d stops (shared-memory run %s)", r, (int)pid,
            c->rank, c->name + 1);
    }
}

static void shm_die_timeout(Comm *c) {
    ShmHeader *h = c->hdr;
    int laggard = -1;
    for (int r = 0; r < c->world_size && laggard < 0; r++)
        if (r != c->rank && atomic_load(&h->arrived[r]) < c->epoch) laggard = r;
    if (laggard < 0) laggard = c->rank == 0 ? 1 : 0;
    pid_t pid = atomic_load(&h->pid[laggard]);
    shm_unlink_if_linked(c);
    char who[512];
    board_describe(c, laggard, who, sizeof who);
    die("rank %d: collective timed out after %g s waiting for rank %d (pid %d%s)\n"
        "---> HINT: rank %d is stopped or stuck; raise CIFAR_COMM_TIMEOUT if it is only slow",
        c->rank, c->timeout_s, laggard, (int)pid, who, laggard);
}

/* A stop signal during a wait for a peer: the wait ends, and the process with it. */
static void shm_stop_check(Comm *c, double *since, const char *what) {
    int sig = comm_stop_due(c->stop_signal, now_seconds(), since);
    if (!sig) return;
    shm_unlink_if_linked(c);
    die_status(128 + sig, "rank %d: stopped by signal %d while %s: exiting without a new snapshot "
               "(the last one is kept; rerun to resume)", c->rank, sig, what);
}

static void shm_barrier(Comm *c) {
    ShmHeader *h = c->hdr;
    uint32_t gen = atomic_load(&h->bar_gen);
    c->epoch++;
    atomic_store(&h->arrived[c->rank], c->epoch);
    if (atomic_fetch_add(&h->bar_count, 1) == (uint32_t)c->world_size - 1) {
        atomic_store(&h->bar_count, 0);
        atomic_fetch_add(&h->bar_gen, 1);
        futex_wake_all(&h->bar_gen);
        return;
    }
    for (int i = 0; i < 4000; i++) {
        if (atomic_load_explicit(&h->bar_gen, memory_order_acquire) != gen) return;
        cpu_relax();
    }
    double start = now_seconds(), stop_since = 0;
    while (atomic_load(&h->bar_gen) == gen) {
        futex_wait_slice(&h->bar_gen, gen, 0.05);
        if (atomic_load(&h->bar_gen) != gen) return;
        shm_check_peers(c, gen);
        shm_stop_check(c, &stop_since, "waiting for its peers (a collective)");
        if (now_seconds() - start > c->timeout_s) {
            if (atomic_load(&h->bar_gen) != gen) return;
            shm_die_timeout(c);
        }
    }
}

static size_t shm_total_bytes(int world, size_t slot_bytes) {
    return SHM_HEADER_BYTES + ((size_t)world + 2) * slot_bytes;
}

static void shm_create_rank0(Comm *c, const DistEnv *env) {
    size_t slot = env->comm.shm_slot_bytes;
    size_t total = shm_total_bytes(c->world_size, slot);
    shm_unlink(c->name); /* a segment left by a killed run of the same id */
    int fd = shm_open(c->name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        char what[160];
        snprintf(what, sizeof what, "shm_open(%s)", c->name);
        CHECK_STDIO(0, what);
    }
    c->name_linked = 1;
    CHECK_STDIO(ftruncate(fd, (off_t)total) == 0, "ftruncate(shared-memory segment)");
    /* reserve the pages now: a full /dev/shm would otherwise be a SIGBUS later */
    int rc = posix_fallocate(fd, 0, (off_t)total);
    if (rc != 0) {
        shm_unlink(c->name);
        check_fail(__FILE__, __LINE__, "reserving the shared-memory segment", strerror(rc),
                   "/dev/shm is too small: free it or enlarge it (docker: --shm-size=1g)");
    }
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK_STDIO(p != MAP_FAILED, "mmap(shared-memory segment)");
    close(fd);
    ShmHeader *h = p;
    h->magic = SHM_MAGIC;
    h->version = SHM_VERSION;
    h->world_size = c->world_size;
    h->slot_bytes = slot;
    h->total_bytes = total;
    snprintf(h->run_id, sizeof h->run_id, "%s", env->run_id);
    atomic_store(&h->pid[0], (int32_t)getpid());
    atomic_store(&h->ready, 1); /* last: the others trust nothing before this */
    c->hdr = h;
    c->base = p;
    c->map_bytes = total;
    c->slot_bytes = slot;
}

/* One attempt to attach: 1 attached, 0 not yet (retry), dies on a mismatch. */
static int shm_try_attach(Comm *c, const DistEnv *env) {
    int fd = shm_open(c->name, O_RDWR, 0600);
    if (fd < 0) {
        if (errno == ENOENT) return 0;
        char what[160];
        snprintf(what, sizeof what, "shm_open(%s)", c->name);
        CHECK_STDIO(0, what);
    }
    struct stat st;
    CHECK_STDIO(fstat(fd, &st) == 0, "fstat(shared-memory segment)");
    if ((size_t)st.st_size < SHM_HEADER_BYTES) { /* rank 0 is between open and ftruncate */
        close(fd);
        return 0;
    }
    size_t total = (size_t)st.st_size;
    void *p = mmap(NULL, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    CHECK_STDIO(p != MAP_FAILED, "mmap(shared-memory segment)");
    close(fd);
    ShmHeader *h = p;
    if (!atomic_load(&h->ready) || !pid_alive(atomic_load(&h->pid[0]))) {
        munmap(p, total); /* not initialized yet, or left by a dead run */
        return 0;
    }
    if (h->magic != SHM_MAGIC || h->version != SHM_VERSION)
        die("rank %d: %s is not a cifar segment of version %u: another program uses this name",
            c->rank, c->name, SHM_VERSION);
    if (h->world_size != c->world_size || strcmp(h->run_id, env->run_id) != 0 ||
        h->total_bytes != total || total != shm_total_bytes(h->world_size, h->slot_bytes))
        die("rank %d: %s belongs to a job of world size %d (this one: %d): two jobs share run "
            "id '%s'; give each its own CIFAR_RUN_ID or MASTER_PORT",
            c->rank, c->name, h->world_size, c->world_size, env->run_id);
    int32_t expected = 0;
    if (!atomic_compare_exchange_strong(&h->pid[c->rank], &expected, (int32_t)getpid()))
        die("rank %d of run %s is already taken by pid %d: two processes got the same RANK",
            c->rank, env->run_id, (int)expected);
    c->hdr = h;
    c->base = p;
    c->map_bytes = total;
    c->slot_bytes = h->slot_bytes;
    return 1;
}

static void shm_attach(Comm *c, const DistEnv *env) {
    double start = now_seconds(), stop_since = 0;
    while (!shm_try_attach(c, env)) {
        shm_stop_check(c, &stop_since, "waiting for rank 0 to create the shared memory");
        if (now_seconds() - start > c->timeout_s)
            die("rank %d: timed out after %g s waiting for rank 0 to create %s\n"
                "---> HINT: start every rank with the same CIFAR_RUN_ID/MASTER_PORT, on one machine",
                c->rank, c->timeout_s, c->name);
        sleep_seconds(0.005);
    }
}

static void shm_open_comm(Comm *c, const DistEnv *env) {
    /* permanent: no restart brings the other nodes' workers onto this machine */
    if (env->local_world_size != env->world_size)
        die_permanent("CPU workers on several nodes: the shared-memory communicator needs every "
                      "rank on one machine (world size %d, %d on this node)\n---> HINT: for CPUs "
                      "on several machines use --comm gloo (their default), or start the ranks with "
                      "mpirun or srun --mpi=pmix (MPI communicator); GPUs use NCCL",
                      env->world_size, env->local_world_size);
    if (env->world_size > SHM_MAX_RANKS)
        die("the shared-memory communicator supports at most %d ranks (asked: %d)",
            SHM_MAX_RANKS, env->world_size);
    shm_name_for(env->run_id, c->name, sizeof c->name);
    if (c->rank == 0)
        shm_create_rank0(c, env);
    else
        shm_attach(c, env);
    shm_barrier(c); /* everyone attached ... */
    shm_unlink_if_linked(c); /* ... so the name can go (rank 0) */
}

static unsigned char *shm_slot(Comm *c, int r) {
    return c->base + SHM_HEADER_BYTES + (size_t)r * c->slot_bytes;
}

static unsigned char *shm_next_area(Comm *c) {
    size_t which = (size_t)(c->area_seq++ & 1);
    return c->base + SHM_HEADER_BYTES + ((size_t)c->world_size + which) * c->slot_bytes;
}

/* This rank's slice [lo, hi) of m elements. */
static void shm_slice(const Comm *c, size_t m, size_t *lo, size_t *hi) {
    *lo = m * (size_t)c->rank / (size_t)c->world_size;
    *hi = m * ((size_t)c->rank + 1) / (size_t)c->world_size;
}

static void shm_allreduce_mean(Comm *c, float *buf, size_t n) {
    size_t per = c->slot_bytes / sizeof(float);
    const float w = (float)c->world_size;
    for (size_t off = 0; off < n; off += per) {
        size_t m = n - off < per ? n - off : per;
        memcpy(shm_slot(c, c->rank), buf + off, m * sizeof(float));
        shm_barrier(c);
        float *out = (float *)shm_next_area(c);
        size_t lo, hi;
        shm_slice(c, m, &lo, &hi);
        /* in blocks that stay in L1: copy slot 0, add slots 1.., divide */
        for (size_t b = lo; b < hi; b += SHM_BLOCK) {
            size_t e = hi - b < SHM_BLOCK ? hi : b + SHM_BLOCK;
            memcpy(out + b, shm_slot(c, 0) + b * sizeof(float), (e - b) * sizeof(float));
            for (int r = 1; r < c->world_size; r++) {
                const float *s = (const float *)shm_slot(c, r);
                for (size_t i = b; i < e; i++) out[i] += s[i];
            }
            for (size_t i = b; i < e; i++) out[i] /= w;
        }
        shm_barrier(c);
        memcpy(buf + off, out, m * sizeof(float));
    }
}

static void shm_allreduce_sum_f64(Comm *c, double *buf, size_t n) {
    size_t per = c->slot_bytes / sizeof(double);
    for (size_t off = 0; off < n; off += per) {
        size_t m = n - off < per ? n - off : per;
        memcpy(shm_slot(c, c->rank), buf + off, m * sizeof(double));
        shm_barrier(c);
        double *out = (double *)shm_next_area(c);
        size_t lo, hi;
        shm_slice(c, m, &lo, &hi);
        memcpy(out + lo, shm_slot(c, 0) + lo * sizeof(double), (hi - lo) * sizeof(double));
        for (int r = 1; r < c->world_size; r++) {
            const double *s = (const double *)shm_slot(c, r);
            for (size_t i = lo; i < hi; i++) out[i] += s[i];
        }
        shm_barrier(c);
        memcpy(buf + off, out, m * sizeof(double));
    }
}

static void shm_broadcast(Comm *c, void *buf, size_t bytes, int root) {
    unsigned char *p = buf;
    for (size_t off = 0; off < bytes; off += c->slot_bytes) {
        size_t m = bytes - off < c->slot_bytes ? bytes - off : c->slot_bytes;
        unsigned char *area = shm_next_area(c);
        if (c->rank == root) memcpy(area, p + off, m);
        shm_barrier(c);
        if (c->rank != root) memcpy(p + off, area, m);
    }
}

/* ------------------------------------------------------------------- gloo */

/* Where Gloo listens: GLOO_SOCKET_IFNAME (PyTorch's variable) names an interface,
 * else the address this machine reaches MASTER_ADDR from. */
static CommGloo *gloo_open_comm(const DistEnv *env, double timeout_s) {
    const char *why = comm_gloo_library_error();
    if (why)
        die_permanent("--comm gloo: the Gloo communicator is not available: %s\n---> HINT: install "
                      "libgloo-dev (make deps) and rebuild, or start the ranks with mpirun (--comm mpi)", why);
    const char *iface = getenv("GLOO_SOCKET_IFNAME");
    char address[256] = "";
    if ((!iface || !*iface) && rendezvous_route_address(env, address, sizeof address) != 0)
        die("rank %d: where should Gloo listen? %s\n---> HINT: set MASTER_ADDR to rank 0's host, or "
            "GLOO_SOCKET_IFNAME to this machine's network interface", env->rank, address);
    return comm_gloo_create(env, timeout_s, iface, address);
}

/* ---------------------------------------------------------------- dispatch */

Comm *comm_create(CommKind kind, const DistEnv *env) {
#ifndef CIFAR_CUDA
    if (kind == COMM_NCCL)
        die("the NCCL communicator is not available: this program was built without CUDA\n"
            "---> HINT: rebuild with CUDA (make CUDA=1) or train on the CPU");
#endif
    if (kind == COMM_SINGLE && env->world_size != 1)
        die("a single-process communicator cannot serve world size %d", env->world_size);
    /* a DistEnv not filled by dist_env_read (memset) would wait 0 s and slice by 0 bytes */
    if (env->world_size > 1 && !(env->comm.timeout_s > 0 && env->comm.shm_slot_bytes >= 64))
        die("internal error: a communicator for world size %d without its settings (timeout %g s, "
            "slot %zu bytes): the DistEnv was not read by dist_env_read", env->world_size,
            env->comm.timeout_s, env->comm.shm_slot_bytes);
    Comm *c = xcalloc(1, sizeof *c);
    c->board_fd = -1;
    c->rank = env->rank;
    c->world_size = env->world_size;
    c->timeout_s = env->comm.timeout_s;
    c->stop_signal = env->stop_signal;
    c->kind = env->world_size == 1 ? COMM_SINGLE : kind;
    if (c->kind == COMM_SHM) shm_open_comm(c, env);
    if (c->kind == COMM_MPI) c->mpi = comm_mpi_create(env, c->timeout_s);
    if (c->kind == COMM_GLOO) c->gloo = gloo_open_comm(env, c->timeout_s);
#ifdef CIFAR_CUDA
    if (c->kind == COMM_NCCL) c->nccl = comm_nccl_create(env, c->timeout_s);
#endif
    return c;
}

void comm_destroy(Comm *c) {
    if (c == NULL) return;
    if (c->board_fd >= 0) close(c->board_fd);
    if (g_board_comm == c) g_board_comm = NULL;
    if (c->kind == COMM_SHM && c->base) munmap(c->base, c->map_bytes);
    if (c->kind == COMM_MPI) comm_mpi_destroy(c->mpi);
    if (c->kind == COMM_GLOO) comm_gloo_destroy(c->gloo);
#ifdef CIFAR_CUDA
    if (c->kind == COMM_NCCL) comm_nccl_destroy(c->nccl);
#endif
    free(c);
}

CommKind comm_kind(const Comm *c) { return c->kind; }
int comm_rank(const Comm *c) { return c->rank; }
int comm_world_size(const Comm *c) { return c->world_size; }

void comm_allreduce_mean(Comm *c, float *buf, size_t n) {
    if (c->kind == COMM_NCCL) {
        comm_allreduce_mean_on_stream(c, buf, n, NULL); /* timed there */
        return;
    }
    double t0 = collective_begin(c);
    if (c->kind == COMM_SHM) shm_allreduce_mean(c, buf, n);
    if (c->kind == COMM_MPI) comm_mpi_allreduce_mean(c->mpi, buf, n);
    if (c->kind == COMM_GLOO) comm_gloo_allreduce_mean(c->gloo, buf, n);
    collective_end(c, t0);
}

static void comm_check_device_memory(const Comm *c, const char *what) {
    if (c->kind == COMM_SHM || c->kind == COMM_MPI || c->kind == COMM_GLOO)
        die("%s on a CUDA stream: the %s communicator works on host memory only", what,
            c->kind == COMM_SHM ? "shared-memory" : c->kind == COMM_MPI ? "MPI" : "Gloo");
}

void comm_allreduce_mean_on_stream(Comm *c, float *dev_buf, size_t n, void *cuda_stream) {
    comm_check_device_memory(c, "all-reduce");
#ifdef CIFAR_CUDA
    double t0 = collective_begin(c);
    if (c->kind == COMM_NCCL) comm_nccl_allreduce_mean(c->nccl, dev_buf, n, cuda_stream);
    collective_end(c, t0);
#else
    (void)dev_buf, (void)n, (void)cuda_stream;
#endif
}

void comm_allreduce_sum_f64(Comm *c, double *buf, size_t n) {
    double t0 = collective_begin(c);
    if (c->kind == COMM_SHM) shm_allreduce_sum_f64(c, buf, n);
    if (c->kind == COMM_MPI) comm_mpi_allreduce_sum_f64(c->mpi, buf, n);
    if (c->kind == COMM_GLOO) comm_gloo_allreduce_sum_f64(c->gloo, buf, n);
#ifdef CIFAR_CUDA
    if (c->kind == COMM_NCCL) comm_nccl_allreduce_sum_f64(c->nccl, buf, n);
#endif
    collective_end(c, t0);
}

static void comm_check_root(const Comm *c, int root) {
    if (root < 0 || root >= c->world_size)
        die("broadcast from rank %d: the world has ranks 0..%d", root, c->world_size - 1);
}

void comm_broadcast(Comm *c, void *buf, size_t bytes, int root) {
    comm_check_root(c, root);
    if (c->kind == COMM_NCCL) {
        comm_broadcast_on_stream(c, buf, bytes, root, NULL); /* timed there */
        return;
    }
    double t0 = collective_begin(c);
    if (c->kind == COMM_SHM) shm_broadcast(c, buf, bytes, root);
    if (c->kind == COMM_MPI) comm_mpi_broadcast(c->mpi, buf, bytes, root);
    if (c->kind == COMM_GLOO) comm_gloo_broadcast(c->gloo, buf, bytes, root);
    collective_end(c, t0);
}

void comm_broadcast_on_stream(Comm *c, void *dev_buf, size_t bytes, int root, void *cuda_stream) {
    comm_check_root(c, root);
    comm_check_device_memory(c, "broadcast");
#ifdef CIFAR_CUDA
    double t0 = collective_begin(c);
    if (c->kind == COMM_NCCL) comm_nccl_broadcast(c->nccl, dev_buf, bytes, root, cuda_stream);
    collective_end(c, t0);
#else
    (void)dev_buf, (void)bytes, (void)cuda_stream;
#endif
}

void comm_broadcast_host(Comm *c, void *buf, size_t bytes, int root) {
    comm_check_root(c, root);
    double t0 = collective_begin(c);
    if (c->kind == COMM_SHM) shm_broadcast(c, buf, bytes, root);
    if (c->kind == COMM_MPI) comm_mpi_broadcast(c->mpi, buf, bytes, root);
    if (c->kind == COMM_GLOO) comm_gloo_broadcast(c->gloo, buf, bytes, root);
#ifdef CIFAR_CUDA
    if (c->kind == COMM_NCCL) comm_nccl_broadcast_host(c->nccl, buf, bytes, root);
#endif
    collective_end(c, t0);
}

void comm_barrier(Comm *c) {
    double t0 = collective_begin(c);
    if (c->kind == COMM_SHM) shm_barrier(c);
    if (c->kind == COMM_MPI) comm_mpi_barrier(c->mpi);
    if (c->kind == COMM_GLOO) comm_gloo_barrier(c->gloo);
#ifdef CIFAR_CUDA
    if (c->kind == COMM_NCCL) comm_nccl_barrier(c->nccl);
#endif
    collective_end(c, t0);
}
