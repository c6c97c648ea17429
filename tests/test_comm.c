/* test_comm.c: dist_env_read, and the shared-memory communicator between real
 * processes. The binary re-executes itself ("/proc/self/exe worker <scenario> <dir>")
 * as W workers with RANK/WORLD_SIZE/... set, like the launcher does, and checks:
 *   - all-reduce mean of known vectors, with buffers larger than a slot (chunking,
 *     CIFAR_COMM_SLOT_BYTES=4096), bit-exact against "sum in rank order, divide by
 *     W", identical on every rank; broadcast / broadcast_host from every root;
 *     sum_f64; barrier ordering; mixed sequences of collectives;
 *   - a peer that exits before a collective: the others fail with "rank R (pid N)
 *     died" in well under the timeout;
 *   - a SIGSTOPped peer: "collective timed out after T s waiting for rank R";
 *   - a world-size mismatch; a rank 1 whose rank 0 never comes;
 *   - nothing left in /dev/shm.
 *   - the rendezvous of rendezvous.h between real processes (rank 0 and two ranks
 *     of a 3-rank job) while strangers connect: silent, wrong magic, cut short,
 *     another job, a wrong token, another world size, a duplicate rank, and a
 *     rank of another job that keeps knocking: rank 0 drops them (one log line
 *     each) and serves its own ranks; a MASTER_ADDR that is not local.
 * (dist_env_read and the job identity: test_dist_env.c.)
 * `test_comm bench [gloo]` prints all-reduce times for 200k and 1M floats on 2 ranks
 * (shared memory, or Gloo).
 * `test_comm rendezvous-rank DIR` is one rank of a rendezvous (its environment
 * says which): rank 0 serves 128 random bytes, every rank writes what it holds to
 * DIR/rendezvous-<rank> in hex (tests/rendezvous.bats). */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "comm/comm.h"
#include "comm/comm_gloo.h"
#include "comm/rendezvous.h"

#include "comm_env_vars.h"
#include "comm_group.h"
#include "unit.h"

static void worker_allreduce(Comm *c, int rank, int w, size_t n, uint64_t *hash) {
    float *buf = xmalloc(n * sizeof(float) + 4);
    for (size_t i = 0; i < n; i++) buf[i] = value_of(rank, i);
    comm_allreduce_mean(c, buf, n);
    for (size_t i = 0; i < n; i++) {
        float s = value_of(0, i);
        for (int r = 1; r < w; r++) s += value_of(r, i);
        s /= (float)w;
        WORKER_EXPECT(memcmp(&s, &buf[i], sizeof s) == 0, "n=%zu i=%zu got %.9g expected %.9g", n, i,
               (double)buf[i], (double)s);
    }
    *hash ^= fnv1a(buf, n * sizeof(float)) + n;
    free(buf);
}

static void worker_broadcast(Comm *c, int rank, int w, size_t bytes, int host) {
    for (int root = 0; root < w; root++) {
        unsigned char *b = xmalloc(bytes + 1);
        for (size_t i = 0; i < bytes; i++)
            b[i] = (unsigned char)(rank == root ? (i * 31u + (size_t)root * 7u) : 0xEEu);
        if (host)
            comm_broadcast_host(c, b, bytes, root);
        else
            comm_broadcast(c, b, bytes, root);
        for (size_t i = 0; i < bytes; i++)
            WORKER_EXPECT(b[i] == (unsigned char)(i * 31u + (size_t)root * 7u), "root %d byte %zu",
                   root, i);
        free(b);
    }
}

static void worker_sum_f64(Comm *c, int rank, int w, size_t n) {
    double *d = xmalloc(n * sizeof(double) + 8);
    for (size_t i = 0; i < n; i++) d[i] = (double)rank * 1000.0 + (double)i + 0.5;
    comm_allreduce_sum_f64(c, d, n);
    for (size_t i = 0; i < n; i++) {
        double e = 1000.0 * (double)w * (double)(w - 1) / 2.0 + (double)w * ((double)i + 0.5);
        WORKER_EXPECT(d[i] == e, "sum_f64 i=%zu got %.17g expected %.17g", i, d[i], e);
    }
    free(d);
}

/* Ranks reach the barrier at staggered times; nobody may leave before the last
 * one arrived. Enter times are exchanged afterwards with sum_f64 (one-hot). */
static void worker_barrier(Comm *c, int rank, int w) {
    usleep((useconds_t)(rank * 60000));
    double enter = now_s();
    comm_barrier(c);
    double leave = now_s();
    double *t = xcalloc((size_t)w, sizeof(double));
    t[rank] = enter;
    comm_allreduce_sum_f64(c, t, (size_t)w);
    for (int r = 0; r < w; r++) WORKER_EXPECT(leave >= t[r], "left at %f before rank %d entered at %f",
                                       leave, r, t[r]);
    free(t);
    for (int i = 0; i < 300; i++) comm_barrier(c);
}

/* Interleaved collectives of varied sizes exercise the alternating result areas. */
static void worker_mixed(Comm *c, int rank, int w, uint64_t *hash) {
    for (int it = 0; it < 40; it++) {
        size_t n = (size_t)(it * 97 % 3001) + 1;
        worker_allreduce(c, rank, w, n, hash);
        if (it % 3 == 0) worker_broadcast(c, rank, w, (size_t)(it * 13 + 5), it % 2);
        if (it % 4 == 1) worker_sum_f64(c, rank, w, (size_t)it + 1);
    }
}

static volatile int g_worker_stop;
static void worker_on_stop(int sig) { g_worker_stop = sig; }

static int worker_main(const char *scenario, const char *dir) {
    log_set_program("test_comm");
    char err[256];
    DistEnv env;
    if (dist_env_read(&env, err, sizeof err) != 0) {
        fprintf(stderr, "dist_env_read: %s\n", err);
        return 5;
    }
    int rank = env.rank, w = env.world_size;
    /* "mpi-<scenario>": the same over the MPI communicator (started by mpirun);
     * "gloo-<scenario>": over Gloo */
    CommKind kind = COMM_SHM;
    if (strncmp(scenario, "mpi-", 4) == 0) kind = COMM_MPI, scenario += 4;
    if (strncmp(scenario, "gloo-", 5) == 0) kind = COMM_GLOO, scenario += 5;
    signal(SIGTERM, worker_on_stop);
    env.stop_signal = &g_worker_stop; /* as cifar-train's workers */
    Comm *c = comm_create(kind, &env);
    WORKER_EXPECT(comm_kind(c) == kind && comm_rank(c) == rank && comm_world_size(c) == w,
           "comm identity");
    if (strcmp(scenario, "collectives") == 0) {
        uint64_t hash = 0;
        size_t sizes[] = {1, 2, 3, 1023, 1024, 1025, 4096, 10007};
        for (size_t k = 0; k < sizeof sizes / sizeof *sizes; k++)
            worker_allreduce(c, rank, w, sizes[k], &hash);
        worker_broadcast(c, rank, w, 10001, 0);
        worker_broadcast(c, rank, w, 3, 1);
        worker_sum_f64(c, rank, w, 1500);
        worker_barrier(c, rank, w);
        worker_mixed(c, rank, w, &hash);
        char text[64];
        snprintf(text, sizeof text, "%016llx\n", (unsigned long long)hash);
        write_text(dir, kind == COMM_MPI ? "mpi-hash" : kind == COMM_GLOO ? "gloo-hash" : "hash", rank, text);
        uint64_t big = 0; /* MPI, Gloo: more than one chunk of comm_mpi.c, comm_gloo.cc (4 Mi elements) */
        if (kind != COMM_SHM) worker_allreduce(c, rank, w, ((size_t)1 << 22) + 5, &big);
    } else if (strcmp(scenario, "die-early") == 0) {
        if (rank == w - 1) _exit(0); /* gone before the collective, no goodbye */
        float x[8] = {0};
        comm_allreduce_mean(c, x, 8);
        return 0; /* must not get here */
    } else if (strcmp(scenario, "stop") == 0) {
        if (rank == 1) raise(SIGSTOP);
        float x[8] = {0};
        comm_allreduce_mean(c, x, 8);
        return 0;
    } else if (strcmp(scenario, "stop-signal") == 0) { /* the driver sends SIGTERM to rank 0 */
        if (rank == 1) raise(SIGSTOP);
        write_text(dir, "stop-signal-waiting", rank, "\n");
        float x[8] = {0};
        comm_allreduce_mean(c, x, 8);
        return 0;
    } else if (strcmp(scenario, "bench") == 0) {
        size_t sizes[2] = {200000, 1000000};
        for (int k = 0; k < 2; k++) {
            size_t n = sizes[k];
            float *buf = xmalloc(n * sizeof(float));
            for (size_t i = 0; i < n; i++) buf[i] = value_of(rank, i);
            for (int i = 0; i < 20; i++) comm_allreduce_mean(c, buf, n);
            comm_barrier(c);
            int iters = 200;
            double t0 = now_s(), c0 = cpu_s();
            for (int i = 0; i < iters; i++) comm_allreduce_mean(c, buf, n);
            double t = (now_s() - t0) / iters, cpu = (cpu_s() - c0) / iters;
            /* CPU time per call tells the cost on an idle machine when others load it */
            if (rank == 0)
                printf("allreduce_mean %zu floats (%.1f MB), %d ranks: %.1f us/call wall, "
                       "%.1f us CPU (rank 0)\n",
                       n, (double)n * 4 / 1e6, w, t * 1e6, cpu * 1e6);
            free(buf);
        }
    } else {
        fprintf(stderr, "unknown scenario %s\n", scenario);
        return 6;
    }
    comm_destroy(c);
    return 0;
}

static char g_shm_hash[4][64]; /* the result hash of the shared-memory run, per world size */

static void test_collectives(int w) {
    char run_id[64];
    snprintf(run_id, sizeof run_id, "test-%d-coll%d", (int)getpid(), w);
    Group g;
    double t0 = now_s();
    group_spawn(&g, "collectives", w, 0, w, run_id, "30", -1);
    group_wait(&g, 0, w, t0);
    char first_hash[64] = "";
    for (int r = 0; r < w; r++) {
        CHECK(exited_with(g.status[r], 0), "W=%d rank %d status %d: %s", w, r, g.status[r],
              stderr_of("collectives", r));
        char path[512], hash[64] = "";
        snprintf(path, sizeof path, "%s/hash-%d", g_dir, r);
        FILE *f = fopen(path, "r");
        if (f) {
            if (!fgets(hash, sizeof hash, f)) hash[0] = '\0';
            fclose(f);
        }
        CHECK(hash[0] != '\0', "W=%d rank %d wrote no result hash", w, r);
        if (r == 0) snprintf(first_hash, sizeof first_hash, "%s", hash);
        if (r == 0) snprintf(g_shm_hash[w], sizeof g_shm_hash[w], "%s", hash);
        CHECK(strcmp(hash, first_hash) == 0, "W=%d rank %d result bits differ from rank 0", w, r);
        unlink(path);
    }
    CHECK(!shm_exists(run_id), "W=%d: /dev/shm/cifar-%s left behind", w, run_id);
    printf("collectives W=%d: %.2f s\n", w, g.elapsed);
}

static void test_die_early(int w) {
    char run_id[64], want[96];
    snprintf(run_id, sizeof run_id, "test-%d-die%d", (int)getpid(), w);
    Group g;
    double t0 = now_s();
    group_spawn(&g, "die-early", w, 0, w, run_id, "60", -1);
    group_wait(&g, 0, w, t0);
    CHECK(exited_with(g.status[w - 1], 0), "the leaving rank exits 0 (%d)", g.status[w - 1]);
    snprintf(want, sizeof want, "rank %d (pid %d) died", w - 1, (int)g.pid[w - 1]);
    /* Each survivor names the dead rank, or (if slower) a survivor that already
     * failed; at least one names the rank that left. */
    int named = 0;
    for (int r = 0; r < w - 1; r++) {
        const char *e = stderr_of("die-early", r);
        named += strstr(e, want) != NULL;
        CHECK(exited_with(g.status[r], 1), "W=%d rank %d status %d: %s", w, r, g.status[r], e);
        CHECK(strstr(e, ") died; rank") != NULL, "W=%d rank %d stderr: %s", w, r, e);
    }
    CHECK(named >= 1, "W=%d: no rank reported '%s'", w, want);
    CHECK(g.elapsed < 5.0, "W=%d: a dead peer took %.2f s to notice (timeout 60)", w, g.elapsed);
    CHECK(!shm_exists(run_id), "/dev/shm/cifar-%s left behind", run_id);
    printf("die-early W=%d: noticed in %.2f s\n", w, g.elapsed);
}

/* The ranks of a "stop" group but rank 1 (SIGSTOPped) end by themselves; then rank 1
 * is killed. The seconds until the others ended. */
static double stopped_peer_reap(Group *g, int w, double t0) {
    for (int r = 0; r < w; r++)
        if (r != 1) group_wait(g, r, 1, t0);
    double elapsed = now_s() - t0;
    kill(g->pid[1], SIGKILL);
    group_wait(g, 1, 1, t0);
    return elapsed;
}

static void test_stopped_peer(int w) {
    char run_id[64];
    snprintf(run_id, sizeof run_id, "test-%d-stop%d", (int)getpid(), w);
    Group g;
    double t0 = now_s();
    group_spawn(&g, "stop", w, 0, w, run_id, "1", -1);
    double elapsed = stopped_peer_reap(&g, w, t0);
    /* Every other rank fails: by the timeout waiting for rank 1, or (the slower
     * ones) because a rank that timed out first is gone. At least one timed out. */
    int timed_out = 0;
    for (int r = 0; r < w; r++) {
        if (r == 1) continue;
        const char *e = stderr_of("stop", r);
        char want[128];
        snprintf(want, sizeof want, "rank %d: collective timed out after 1 s waiting for rank 1",
                 r);
        int timeout_msg = strstr(e, want) != NULL;
        timed_out += timeout_msg;
        CHECK(exited_with(g.status[r], 1), "W=%d rank %d status %d: %s", w, r, g.status[r], e);
        CHECK(timeout_msg || strstr(e, ") died; rank") != NULL, "W=%d rank %d stderr: %s", w, r,
              e);
    }
    CHECK(timed_out >= 1, "W=%d: no rank reported the timeout waiting for rank 1", w);
    CHECK(elapsed >= 1.0 && elapsed < 5.0, "W=%d: stopped peer timeout took %.2f s", w, elapsed);
    CHECK(!shm_exists(run_id), "/dev/shm/cifar-%s left behind", run_id);
    printf("stopped peer W=%d: timed out in %.2f s\n", w, elapsed);
}

/* Rank 1 believes in a world of 3 while rank 0 created one of 2. */
static void test_world_mismatch(void) {
    char run_id[64];
    snprintf(run_id, sizeof run_id, "test-%d-mismatch", (int)getpid());
    Group g;
    double t0 = now_s();
    group_spawn(&g, "collectives", 2, 0, 2, run_id, "1", 1);
    group_wait(&g, 0, 2, t0);
    const char *e1 = stderr_of("collectives", 1);
    CHECK(exited_with(g.status[1], 1) && strstr(e1, "two jobs share run id") != NULL,
          "mismatch: rank 1 status %d: %s", g.status[1], e1);
    const char *e0 = stderr_of("collectives", 0);
    CHECK(exited_with(g.status[0], 1) && strstr(e0, "timed out") != NULL,
          "mismatch: rank 0 status %d: %s", g.status[0], e0);
    CHECK(!shm_exists(run_id), "/dev/shm/cifar-%s left behind", run_id);
}

/* Only rank 1 starts: it gives up waiting for rank 0's segment. */
static void test_no_rank0(void) {
    char run_id[64];
    snprintf(run_id, sizeof run_id, "test-%d-norank0", (int)getpid());
    Group g;
    double t0 = now_s();
    group_spawn(&g, "collectives", 2, 1, 1, run_id, "0.5", -1);
    group_wait(&g, 1, 1, t0);
    const char *e = stderr_of("collectives", 1);
    CHECK(exited_with(g.status[1], 1) && strstr(e, "waiting for rank 0 to create") != NULL,
          "no rank 0: status %d: %s", g.status[1], e);
    CHECK(g.elapsed < 4.0, "no rank 0: took %.2f s", g.elapsed);
}

/* ------------------------------------------------------------ rendezvous */

#define RV_BLOB 128

static volatile int g_rv_stop;
static void rv_on_stop(int sig) { g_rv_stop = sig; }

#define XCH_ENTRY 4

/* One rank of a rendezvous_exchange: its entry for rank j is "E", rank, j, '.'; it
 * writes what it got, as text: "E<i><me>." for every rank i. */
static int exchange_rank_main(const DistEnv *env, const char *dir) {
    const int w = env->world_size;
    char mine[16 * XCH_ENTRY], theirs[16 * XCH_ENTRY + 1];
    for (int j = 0; j < w; j++)
        memcpy(mine + j * XCH_ENTRY, (char[]){'E', (char)('0' + env->rank), (char)('0' + j), '.'}, XCH_ENTRY);
    rendezvous_exchange(env, mine, theirs, XCH_ENTRY, env->comm.timeout_s);
    theirs[w * XCH_ENTRY] = '\0';
    write_text(dir, "exchange", env->rank, theirs);
    return 0;
}

/* One rank of a rendezvous, from its environment (test_comm rendezvous-rank DIR);
 * SIGTERM asks it to stop, as cifar-train's handler does. */
static int rendezvous_rank_main(const char *dir) {
    log_set_program("test_comm");
    char err[256];
    DistEnv env;
    if (dist_env_read(&env, err, sizeof err) != 0) {
        fprintf(stderr, "dist_env_read: %s\n", err);
        return 5;
    }
    signal(SIGTERM, rv_on_stop);
    env.stop_signal = &g_rv_stop;
    const char *big = getenv("TEST_COMM_EXCHANGE_ENTRY");
    if (big) { /* a rank of a large world with entries of that size: rendezvous_exchange's bound */
        size_t entry = (size_t)atol(big), len = (size_t)env.world_size * entry;
        char *mine = xcalloc(len, 1), *theirs = xcalloc(len, 1);
        rendezvous_exchange(&env, mine, theirs, entry, env.comm.timeout_s);
        free(mine), free(theirs);
        return 0;
    }
    if (getenv("TEST_COMM_EXCHANGE")) return exchange_rank_main(&env, dir);
    unsigned char blob[RV_BLOB] = {0};
    if (env.rank == 0 && getrandom(blob, sizeof blob, 0) != (ssize_t)sizeof blob) {
        perror("getrandom");
        return 4;
    }
    rendezvous_share(&env, blob, sizeof blob, env.comm.timeout_s);
    char hex[2 * RV_BLOB + 2];
    for (int i = 0; i < RV_BLOB; i++) snprintf(hex + 2 * i, 3, "%02x", blob[i]);
    strcat(hex, "\n");
    write_text(dir, "rendezvous", env.rank, hex);
    return 0;
}

/* A connection to 127.0.0.1:port, retried for up to 10 s (rank 0 is starting). */
static int connect_local(int port) {
    for (int i = 0; i < 200; i++) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                                .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
        if (fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0) return fd;
        if (fd >= 0) close(fd);
        usleep(50000);
    }
    return -1;
}

/* Reads up to n bytes within `seconds`: the count, 0 when closed, -1 on timeout. */
static ssize_t read_within(int fd, unsigned char *buf, size_t n, double seconds) {
    size_t got = 0;
    double end = now_s() + seconds;
    while (got < n) {
        struct pollfd p = {fd, POLLIN, 0};
        int left_ms = (int)((end - now_s()) * 1000);
        if (left_ms <= 0 || poll(&p, 1, left_ms) <= 0) return -1;
        ssize_t k = recv(fd, buf + got, n - got, 0);
        if (k <= 0) return (ssize_t)got;
        got += (size_t)k;
    }
    return (ssize_t)got;
}

/* Sends `bytes` on a new connection and returns the status rank 0 answers, or
 * -1 when it closes the connection without an answer. */
static int stray_exchange(int port, const unsigned char *bytes, size_t n) {
    int fd = connect_local(port);
    if (fd < 0) return -2;
    ssize_t sent = send(fd, bytes, n, MSG_NOSIGNAL);
    shutdown(fd, SHUT_WR); /* nothing more comes: a short hello is cut short */
    unsigned char reply[RENDEZVOUS_REPLY_BYTES];
    ssize_t got = sent == (ssize_t)n ? read_within(fd, reply, sizeof reply, 8.0) : -3;
    close(fd);
    if (got != (ssize_t)sizeof reply) return got == -1 ? -4 : -1;
    return (int)((uint32_t)reply[4] << 24 | (uint32_t)reply[5] << 16 | (uint32_t)reply[6] << 8 | reply[7]);
}

/* A clean environment naming rank `rank` of `world` on `port` for job `job`. */
static void set_job_env(int rank, int world, int port, const char *job) {
    char v[32];
    env_clear();
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    snprintf(v, sizeof v, "%d", world);
    setenv("WORLD_SIZE", v, 1);
    snprintf(v, sizeof v, "%d", port);
    setenv("MASTER_PORT", v, 1);
    setenv("CIFAR_JOB_ID", job, 1);
}

/* The hello of rank `rank` of a world of `world` whose job id and token are given. */
static void stray_hello(int port, int rank, int world, const char *job, const char *token,
                        unsigned char out[RENDEZVOUS_HELLO_BYTES]) {
    set_job_env(rank, world, port, job);
    if (token) setenv("CIFAR_JOB_TOKEN", token, 1);
    DistEnv e;
    char err[256];
    if (dist_env_read(&e, err, sizeof err) != 0) {
        fprintf(stderr, "stray_hello: %s\n", err);
        exit(1);
    }
    rendezvous_hello_encode(&e, RV_BLOB, out);
    env_clear();
}

/* Starts `test_comm rendezvous-rank` as rank r of a world of w on `port` for `job`;
 * stderr goes to <dir>/rv-<tag>-stderr. */
static pid_t rendezvous_spawn(const char *tag, int r, int w, int port, const char *job,
                              const char *master_addr, const char *timeout) {
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid > 0) return pid;
    char path[512];
    set_job_env(r, w, port, job);
    setenv("MASTER_ADDR", master_addr, 1);
    setenv("CIFAR_COMM_TIMEOUT", timeout, 1);
    snprintf(path, sizeof path, "%s/rv-%s-stderr", g_dir, tag);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) dup2(fd, 2);
    char *args[] = {"test_comm", "rendezvous-rank", g_dir, NULL};
    execv("/proc/self/exe", args);
    _exit(127);
}

static int wait_status(pid_t pid) {
    int st = 0;
    while (waitpid(pid, &st, 0) < 0 && errno == EINTR) {}
    return st;
}

static int count_lines_with(const char *text, const char *needle) {
    int n = 0;
    for (const char *p = text; (p = strstr(p, needle)) != NULL; p++) n++;
    return n;
}

/* Strangers knock while ranks 0, 1, 2 of a job rendezvous; rank 0 survives them all. */
static void test_rendezvous_strays(void) {
    int port = free_local_port();
    char job[64], other[64];
    snprintf(job, sizeof job, "rv-%d", (int)getpid());
    snprintf(other, sizeof other, "rv-%d-stale", (int)getpid());
    double t0 = now_s();
    pid_t r0 = rendezvous_spawn("r0", 0, 3, port, job, "127.0.0.1", "30");

    int silent = connect_local(port); /* says nothing, stays open until the end */
    CHECK(silent >= 0, "rank 0 never listened on port %d", port);
    unsigned char junk[RENDEZVOUS_HELLO_BYTES];
    memset(junk, 'G', sizeof junk);
    CHECK(stray_exchange(port, junk, sizeof junk) == -1, "wrong magic: closed without an answer");
    unsigned char hello[RENDEZVOUS_HELLO_BYTES];
    stray_hello(port, 1, 3, job, NULL, hello);
    CHECK(stray_exchange(port, hello, 10) == -1, "a hello cut short: closed without an answer");
    stray_hello(port, 1, 3, other, NULL, hello);
    CHECK(stray_exchange(port, hello, sizeof hello) == RV_WRONG_JOB, "another job: RV_WRONG_JOB");
    stray_hello(port, 1, 3, job, "guessed", hello);
    CHECK(stray_exchange(port, hello, sizeof hello) == RV_WRONG_TOKEN, "wrong token: RV_WRONG_TOKEN");
    stray_hello(port, 1, 5, job, NULL, hello);
    CHECK(stray_exchange(port, hello, sizeof hello) == RV_BAD_RANK, "world size 5: RV_BAD_RANK");
    stray_hello(port, 1, 3, job, NULL, hello);
    hello[0] ^= 0x20; /* "cFRV": right length, wrong magic */
    CHECK(stray_exchange(port, hello, sizeof hello) == -1, "a flipped magic byte: closed");

    /* a rank 1 of another job (a stale one) keeps knocking, then gives up naming why */
    pid_t stale = rendezvous_spawn("stale", 1, 3, port, other, "127.0.0.1", "1.5");
    int st = wait_status(stale);
    const char *e = rv_text("rv-stale-stderr");
    CHECK(exited_with(st, 1) && strstr(e, "serves another job") != NULL, "stale rank: %d %s", st, e);

    pid_t r1 = rendezvous_spawn("r1", 1, 3, port, job, "127.0.0.1", "30");
    CHECK(exited_with(wait_status(r1), 0), "rank 1 served: %s", rv_text("rv-r1-stderr"));
    stray_hello(port, 1, 3, job, NULL, hello);
    CHECK(stray_exchange(port, hello, sizeof hello) == RV_DUPLICATE, "rank 1 again: RV_DUPLICATE");
    pid_t r2 = rendezvous_spawn("r2", 2, 3, port, job, "127.0.0.1", "30");
    CHECK(exited_with(wait_status(r2), 0), "rank 2 served: %s", rv_text("rv-r2-stderr"));
    CHECK(exited_with(wait_status(r0), 0), "rank 0 survived: %s", rv_text("rv-r0-stderr"));
    close(silent);

    char b0[300], b1[300], b2[300];
    snprintf(b0, sizeof b0, "%s", rv_text("rendezvous-0"));
    snprintf(b1, sizeof b1, "%s", rv_text("rendezvous-1"));
    snprintf(b2, sizeof b2, "%s", rv_text("rendezvous-2"));
    CHECK(strlen(b0) == 2 * RV_BLOB + 1 && strcmp(b0, b1) == 0 && strcmp(b0, b2) == 0,
          "every rank holds rank 0's blob: %s / %s / %s", b0, b1, b2);
    const char *log0 = rv_text("rv-r0-stderr");
    int drops = count_lines_with(log0, "dropped a connection");
    /* junk, cut short, other job, token, world 5, flipped magic, duplicate, and the
     * stale rank's retries: one line for the first, one summing up the others */
    CHECK(drops >= 8 && strstr(log0, "more connections like the last one") != NULL,
          "one line per dropped connection (%d): %s", drops, log0);
    CHECK(strstr(log0, "wrong magic") && strstr(log0, "another job") && strstr(log0, "wrong token") &&
              strstr(log0, "world size 5") && strstr(log0, "already served") &&
              strstr(log0, "in the middle of a hello"),
          "each reason named: %s", log0);
    printf("rendezvous with strangers: %.2f s, %d connections dropped\n", now_s() - t0, drops);
}

/* The exchange (Gloo's pair addresses) between ranks 0, 1, 2 while strangers knock
 * (a silent connection held open, garbage, 100 connections that close at once, a
 * share hello, another job), and a rank 1 that registers and then vanishes (it is
 * forgotten and served again). */
static void test_exchange_strays(void) {
    int port = free_local_port();
    char job[64], other[64], want[64];
    snprintf(job, sizeof job, "xch-%d", (int)getpid());
    snprintf(other, sizeof other, "xch-%d-other", (int)getpid());
    setenv("TEST_COMM_EXCHANGE", "1", 1);
    pid_t r0 = rendezvous_spawn("x0", 0, 3, port, job, "127.0.0.1", "30");
    int silent = connect_local(port);
    CHECK(silent >= 0, "rank 0 never listened on port %d", port);
    unsigned char hello[RENDEZVOUS_HELLO_BYTES + 3 * XCH_ENTRY];
    memset(hello, 'G', sizeof hello);
    CHECK(stray_exchange(port, hello, RENDEZVOUS_HELLO_BYTES) == -1, "garbage: closed without an answer");
    for (int i = 0; i < 100; i++) { /* a burst of connections that say nothing and go */
        int c = connect_local(port);
        if (c >= 0) close(c);
    }
    stray_hello(port, 1, 3, job, NULL, hello); /* a rendezvous_share hello: another communicator */
    CHECK(stray_exchange(port, hello, RENDEZVOUS_HELLO_BYTES) == -1, "a share hello: closed");
    stray_hello(port, 1, 3, other, NULL, hello);
    memcpy(hello, "CFRX", 4);
    CHECK(stray_exchange(port, hello, RENDEZVOUS_HELLO_BYTES) == RV_WRONG_JOB, "another job: RV_WRONG_JOB");
    /* rank 1's hello and entries, then gone before the others come */
    stray_hello(port, 1, 3, job, NULL, hello);
    memcpy(hello, "CFRX", 4);
    hello[16 + 3] = 3 * XCH_ENTRY; /* blob length: W entries (the hello's byte order: big-endian) */
    memset(hello + RENDEZVOUS_HELLO_BYTES, 'v', 3 * XCH_ENTRY);
    int fd = connect_local(port);
    unsigned char reply[RENDEZVOUS_REPLY_BYTES];
    CHECK(fd >= 0 && send(fd, hello, RENDEZVOUS_HELLO_BYTES, MSG_NOSIGNAL) == RENDEZVOUS_HELLO_BYTES &&
              read_within(fd, reply, sizeof reply, 8.0) == (ssize_t)sizeof reply && reply[7] == RV_OK &&
              send(fd, hello + RENDEZVOUS_HELLO_BYTES, 3 * XCH_ENTRY, MSG_NOSIGNAL) == 3 * XCH_ENTRY,
          "a vanishing rank 1 registers");
    if (fd >= 0) close(fd);
    for (int i = 0; i < 200 && !strstr(rv_text("rv-x0-stderr"), "rank 1 left"); i++) usleep(50000);
    pid_t r1 = rendezvous_spawn("x1", 1, 3, port, job, "127.0.0.1", "30");
    pid_t r2 = rendezvous_spawn("x2", 2, 3, port, job, "127.0.0.1", "30");
    CHECK(exited_with(wait_status(r1), 0), "rank 1 served: %s", rv_text("rv-x1-stderr"));
    CHECK(exited_with(wait_status(r2), 0), "rank 2 served: %s", rv_text("rv-x2-stderr"));
    CHECK(exited_with(wait_status(r0), 0), "rank 0 survived: %s", rv_text("rv-x0-stderr"));
    close(silent);
    unsetenv("TEST_COMM_EXCHANGE");
    for (int me = 0; me < 3; me++) {
        char name[32];
        snprintf(want, sizeof want, "E0%d.E1%d.E2%d.", me, me, me);
        snprintf(name, sizeof name, "exchange-%d", me);
        CHECK(strcmp(rv_text(name), want) == 0, "rank %d got %s, wants %s", me, rv_text(name), want);
    }
    const char *log0 = rv_text("rv-x0-stderr");
    CHECK(strstr(log0, "wrong magic") && strstr(log0, "another kind of rendezvous") && strstr(log0, "another job") &&
              strstr(log0, "rank 1 left before every rank had come"),
          "each reason named: %s", log0);
}

/* rendezvous_exchange's bound is rank 0's table, W * W * entry bytes: 200 ranks of
 * Gloo-sized (136-byte) entries, 5.4 MB, are not refused (they were: the bound divided
 * by the entry twice, W * entry <= 16 KiB). Rank 1 alone: it waits for rank 0, times out. */
static void test_exchange_large_world(void) {
    int port = free_local_port();
    setenv("TEST_COMM_EXCHANGE_ENTRY", "136", 1);
    pid_t r1 = rendezvous_spawn("big", 1, 200, port, "xch-big", "127.0.0.1", "1");
    unsetenv("TEST_COMM_EXCHANGE_ENTRY");
    int st = wait_status(r1);
    const char *e = rv_text("rv-big-stderr");
    CHECK(exited_with(st, 1) && strstr(e, "an exchange of") == NULL && strstr(e, "rank 0") != NULL,
          "200 ranks of 136-byte entries: waits for rank 0 (%d): %s", st, e);
}

static void test_rendezvous_not_local(void) {
    int port = free_local_port();
    pid_t r0 = rendezvous_spawn("remote", 0, 2, port, "rv-remote", "192.0.2.7", "5");
    int st = wait_status(r0);
    const char *e = rv_text("rv-remote-stderr");
    CHECK(exited_with(st, 1) && strstr(e, "not an address of this machine") != NULL &&
              strstr(e, "CIFAR_RENDEZVOUS_BIND=all") != NULL,
          "MASTER_ADDR not local: %d %s", st, e);
}

/* The collectives again over MPI (mpirun, TCP only): every rank's result bits equal
 * the shared-memory run's. Needs mpirun and CIFAR_MPI_LIB (make test-unit sets it). */
static void test_mpi_collectives(int w) {
    const char *lib = getenv("CIFAR_MPI_LIB");
    if (lib == NULL || access(lib, R_OK) != 0 || system("command -v mpirun >/dev/null 2>&1") != 0) {
        printf("SKIP mpi collectives W=%d: no mpirun or no CIFAR_MPI_LIB (MPI not built)\n", w);
        return;
    }
    char exe[4096], cmd[8192];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    CHECK(n > 0, "readlink /proc/self/exe");
    if (n <= 0) return;
    exe[n] = '\0';
    /* make test-asan: the slow unwinder lets tests/lsan.supp recognise Open MPI's allocations */
    const char *asan = getenv("CIFAR_ASAN") ? "ASAN_OPTIONS=\"$ASAN_OPTIONS:fast_unwind_on_malloc=0\" " : "";
    snprintf(cmd, sizeof cmd,
             "env -u RANK -u WORLD_SIZE -u LOCAL_RANK -u LOCAL_WORLD_SIZE -u CIFAR_RUN_ID %s"
             "CIFAR_COMM_TIMEOUT=60 mpirun --allow-run-as-root --oversubscribe -np %d --mca btl tcp,self "
             "'%s' worker mpi-collectives '%s' 2> '%s/mpi-stderr'",
             asan, w, exe, g_dir, g_dir);
    double t0 = now_s();
    int st = system(cmd);
    CHECK(st == 0, "mpirun W=%d: status %d: %s", w, st, rv_text("mpi-stderr"));
    for (int r = 0; r < w; r++) {
        char name[64], hash[64];
        snprintf(name, sizeof name, "mpi-hash-%d", r);
        snprintf(hash, sizeof hash, "%s", rv_text(name));
        CHECK(hash[0] != '\0' && strcmp(hash, g_shm_hash[w]) == 0,
              "W=%d MPI rank %d result %s, shared memory %s", w, r, hash, g_shm_hash[w]);
    }
    printf("mpi collectives W=%d: %.2f s\n", w, now_s() - t0);
}

/* ------------------------------------------------------------------ Gloo */

/* A Gloo build must load its library (CIFAR_GLOO_LIB: make test-unit sets it). */
static int gloo_ready(void) {
#ifndef CIFAR_GLOO
    printf("SKIP gloo: this build has no Gloo (libgloo-dev missing at build time)\n");
    return 0;
#else
    const char *why = comm_gloo_library_error();
    CHECK(why == NULL, "libcifar-gloo.so: %s (set CIFAR_GLOO_LIB)", why ? why : "");
    return why == NULL;
#endif
}

/* Starts a Gloo group of w ranks running `scenario` on a free port: the start time. */
static double gloo_group_start(Group *g, const char *scenario, int w, const char *timeout) {
    char run_id[64];
    snprintf(run_id, sizeof run_id, "test-%d-%s%d", (int)getpid(), scenario, w);
    g_gloo_port = free_local_port();
    double t0 = now_s();
    group_spawn(g, scenario, w, 0, w, run_id, timeout, -1);
    return t0;
}

/* The collectives over Gloo: every rank's result bits equal the shared-memory run's. */
static void test_gloo_collectives(int w) {
    Group g;
    double t0 = gloo_group_start(&g, "gloo-collectives", w, "60");
    group_wait(&g, 0, w, t0);
    for (int r = 0; r < w; r++) {
        char name[64], hash[64];
        CHECK(exited_with(g.status[r], 0), "Gloo W=%d rank %d status %d: %s", w, r, g.status[r],
              stderr_of("gloo-collectives", r));
        snprintf(name, sizeof name, "gloo-hash-%d", r);
        snprintf(hash, sizeof hash, "%s", rv_text(name));
        CHECK(hash[0] != '\0' && strcmp(hash, g_shm_hash[w]) == 0,
              "W=%d Gloo rank %d result %s, shared memory %s", w, r, hash, g_shm_hash[w]);
    }
    printf("gloo collectives W=%d: %.2f s\n", w, g.elapsed);
}

/* A peer that exits after the connection: the others fail at once (its connections
 * close), not at the timeout. */
static void test_gloo_die_early(int w) {
    Group g;
    double t0 = gloo_group_start(&g, "gloo-die-early", w, "60");
    group_wait(&g, 0, w, t0);
    CHECK(exited_with(g.status[w - 1], 0), "the leaving rank exits 0 (%d)", g.status[w - 1]);
    for (int r = 0; r < w - 1; r++) {
        const char *e = stderr_of("gloo-die-early", r);
        CHECK(exited_with(g.status[r], 1) && strstr(e, "Gloo all-reduce failed") != NULL,
              "Gloo W=%d rank %d status %d: %s", w, r, g.status[r], e);
    }
    /* far below the 60 s timeout: the closed connections, not the clock */
    CHECK(g.elapsed < 30.0, "Gloo W=%d: a dead peer took %.2f s to notice (timeout 60)", w, g.elapsed);
    printf("gloo die-early W=%d: noticed in %.2f s\n", w, g.elapsed);
}

/* A SIGSTOPped peer: Gloo's own timeout ends the wait. CIFAR_COMM_TIMEOUT=5, not 1:
 * it bounds the exchange too, and a sanitized build on a loaded machine can take more
 * than a second to start a rank. */
static void test_gloo_stopped_peer(int w) {
    Group g;
    double t0 = gloo_group_start(&g, "gloo-stop", w, "5");
    double elapsed = stopped_peer_reap(&g, w, t0);
    int timed_out = 0;
    for (int r = 0; r < w; r++) {
        if (r == 1) continue;
        const char *e = stderr_of("gloo-stop", r);
        int timeout_msg = strstr(e, "collective timed out after 5 s (Gloo all-reduce)") != NULL;
        timed_out += timeout_msg;
        CHECK(exited_with(g.status[r], 1) && (timeout_msg || strstr(e, "Gloo all-reduce failed")),
              "Gloo W=%d rank %d status %d: %s", w, r, g.status[r], e);
    }
    CHECK(timed_out >= 1, "Gloo W=%d: no rank reported the timeout", w);
    CHECK(elapsed >= 5.0, "Gloo W=%d: timed out after %.2f s, before CIFAR_COMM_TIMEOUT=5", w, elapsed);
    printf("gloo stopped peer W=%d: timed out in %.2f s\n", w, elapsed);
}

/* A stop signal while rank 0 waits for a stopped rank 1: rank 0 leaves after the
 * grace (COMM_STOP_GRACE_SECONDS) with 128 + 15, long before the 60 s timeout. */
static void test_gloo_stop_signal(void) {
    char ready[512];
    snprintf(ready, sizeof ready, "%s/stop-signal-waiting-0", g_dir);
    Group g;
    gloo_group_start(&g, "gloo-stop-signal", 2, "60");
    for (int i = 0; i < 600 && access(ready, F_OK) != 0; i++) usleep(50000);
    CHECK(access(ready, F_OK) == 0, "rank 0 never reached its all-reduce: %s", stderr_of("gloo-stop-signal", 0));
    double t0 = now_s();
    kill(g.pid[0], SIGTERM);
    group_wait(&g, 0, 1, t0);
    double elapsed = now_s() - t0;
    kill(g.pid[1], SIGKILL);
    group_wait(&g, 1, 1, t0);
    const char *e = stderr_of("gloo-stop-signal", 0);
    CHECK(exited_with(g.status[0], 128 + SIGTERM) &&
              strstr(e, "stopped by signal 15 while waiting for its peers (Gloo all-reduce)") != NULL,
          "Gloo stop signal: rank 0 status %d: %s", g.status[0], e);
    /* the grace is 0.5 s; 30 s is half the timeout: only the stop flag ends it sooner */
    CHECK(elapsed < 30.0, "Gloo stop signal: rank 0 left after %.2f s", elapsed);
    printf("gloo stop signal: rank 0 left %.2f s after SIGTERM\n", elapsed);
}

static void make_temp_dir(void) {
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_comm.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        exit(1);
    }
}

static void remove_temp_dir(void) {
    if (getenv("TEST_COMM_KEEP")) return;
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
}

/* test_comm bench [gloo]: the all-reduce's cost on 2 ranks, shm or Gloo. */
static int run_bench(const char *kind) {
    int gloo = kind && strcmp(kind, "gloo") == 0;
    if (gloo) g_gloo_port = free_local_port();
    make_temp_dir();
    char run_id[64];
    snprintf(run_id, sizeof run_id, "bench-%d", (int)getpid());
    Group g;
    unsetenv("CIFAR_COMM_SLOT_BYTES");
    for (int r = 0; r < 2; r++) {
        pid_t pid = fork();
        if (pid == 0) {
            set_rank_env(r, 2, run_id, 0);
            if (gloo) set_gloo_env(run_id);
            char *args[] = {"test_comm", "worker", gloo ? "gloo-bench" : "bench", g_dir, NULL};
            execv("/proc/self/exe", args);
            _exit(127);
        }
        g.pid[r] = pid;
    }
    group_wait(&g, 0, 2, now_s());
    remove_temp_dir();
    return exited_with(g.status[0], 0) && exited_with(g.status[1], 0) ? 0 : 1;
}

int main(int argc, char **argv) {
    if (argc == 4 && strcmp(argv[1], "worker") == 0) return worker_main(argv[2], argv[3]);
    if ((argc == 2 || argc == 3) && strcmp(argv[1], "bench") == 0) return run_bench(argc == 3 ? argv[2] : NULL);
    if (argc == 3 && strcmp(argv[1], "rendezvous-rank") == 0) return rendezvous_rank_main(argv[2]);
    log_set_program("test_comm");
    make_temp_dir();
    test_rendezvous_strays();
    test_rendezvous_not_local();
    test_exchange_strays();
    test_exchange_large_world();
    int gloo = gloo_ready();
    for (int w = 2; w <= 3; w++) {
        test_collectives(w);
        test_mpi_collectives(w);
        if (gloo) test_gloo_collectives(w);
        test_die_early(w);
        if (gloo) test_gloo_die_early(w);
        test_stopped_peer(w);
        if (gloo) test_gloo_stopped_peer(w);
    }
    if (gloo) test_gloo_stop_signal();
    test_world_mismatch();
    test_no_rank0();
    remove_temp_dir();
    return unit_report("test_comm");
}
