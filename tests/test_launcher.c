/* test_launcher.c: the launcher (train/launcher.c) with real worker processes.
 *
 * train/launcher.c belongs to cifar-train, not to libcifar, so this test compiles
 * it in directly (#include below). The workers are this binary again: with
 * CIFAR_TEST_WORKER_MODE set it runs as a worker that records its environment in
 * <CIFAR_TEST_DIR>/a<restart>-r<rank> and then behaves as the mode says:
 *   ok           exit 0
 *   crash-once   rank 1 exits 7 on the first attempt
 *   always-crash rank 1 exits 4, the others wait to be stopped
 *   permanent    rank 1 exits with $CIFAR_PERMANENT_EXIT_STATUS (a failure no
 *                restart can fix), the others wait
 *   usage        rank 1 exits 2 (bad usage), the others wait
 *   permanent-all  every rank dies with the same permanent failure (die_permanent)
 *   sigkill      rank 1 kills itself with SIGKILL, the others wait
 *   hang         rank 0 ignores SIGTERM (notes it got it), rank 1 exits 5 after 0.2 s
 *   wait         everyone waits; SIGTERM is noted and then kills
 * Checked: the variables of every rank, restarts and their count, the failure
 * message, no restart after a permanent failure, SIGTERM then SIGKILL after the grace period, SIGTERM to the launcher,
 * SIGKILL to the launcher (PR_SET_PDEATHSIG), no worker left alive, argument
 * stripping. */
#define _GNU_SOURCE /* accept4 in train/agent_store.c, included below */
#include "../train/launcher.c"
#include "../train/signals.c"
#include "../train/worker_logs.c"
#include "../train/agent_store.c"
#include "../train/agent_client.c"
#include "../train/agent_round.c"

#include <sys/stat.h>

#include "unit.h"

static char g_dir[256];


static double now_s(void) { return launcher_now(); }

/* ------------------------------------------------------------------ worker */

static const char *g_worker_dir;
static int g_worker_rank;

static void note(const char *what) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s-r%d", g_worker_dir, what, g_worker_rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) close(fd);
}

static void on_term_note_and_die(int sig) {
    note("term");
    signal(sig, SIG_DFL);
    raise(sig);
}

static void on_term_note_and_ignore(int sig) {
    (void)sig;
    note("term");
}

static int env_num(const char *name) {
    const char *v = getenv(name);
    return v ? atoi(v) : -1;
}

static void wait_forever(void) {
    for (int i = 0; i < 600; i++) usleep(100 * 1000); /* 60 s at most: never an orphan for long */
}

/* Until every rank of this attempt has started (its record written, so its SIGTERM
 * handler is in place): a failing rank that goes first must not race a slow start
 * (ASan, a loaded machine) of the ranks whose SIGTERM the test checks. 10 s at most. */
static void wait_for_peers(int restart) {
    int world = env_num("WORLD_SIZE");
    for (int tries = 0; tries < 1000; tries++) {
        int started = 0;
        for (int r = 0; r < world; r++) {
            char path[512];
            snprintf(path, sizeof path, "%s/a%d-r%d", g_worker_dir, restart, r);
            started += access(path, F_OK) == 0;
        }
        if (started == world) return;
        usleep(10 * 1000);
    }
}

static int worker_main(int argc, char **argv) {
    const char *mode = getenv("CIFAR_TEST_WORKER_MODE");
    g_worker_dir = getenv("CIFAR_TEST_DIR");
    int rank = env_num("RANK"), restart = env_num("CIFAR_RESTART_COUNT");
    g_worker_rank = rank;
    /* permanent-all: every rank gets to its failure, so SIGTERM is ignored from the
     * start (before this rank's record says it has started, see wait_for_peers). */
    signal(SIGTERM, strcmp(mode, "permanent-all") == 0 ? SIG_IGN : on_term_note_and_die);
    char path[512];
    snprintf(path, sizeof path, "%s/a%d-r%d", g_worker_dir, restart, rank);
    FILE *f = fopen(path, "w");
    if (f == NULL) return 90;
    fprintf(f, "%d %d %d %d %d %d %s %d %s %d %d %s\n", rank, env_num("LOCAL_RANK"),
            env_num("WORLD_SIZE"), env_num("LOCAL_WORLD_SIZE"), restart,
            env_num("TORCHELASTIC_RESTART_COUNT"), getenv("MASTER_ADDR"), env_num("MASTER_PORT"),
            getenv("CIFAR_RUN_ID"), (int)getpid(), argc, argc > 1 ? argv[1] : "-");
    fclose(f);
    if (strcmp(mode, "ok") == 0) return 0;
    if (strcmp(mode, "crash-once") == 0) {
        /* every record of the attempt written before the failure stops the others (a
         * loaded machine used to SIGTERM rank 0 before it wrote its own) */
        if (rank == 1 && restart == 0) wait_for_peers(restart);
        return rank == 1 && restart == 0 ? 7 : 0;
    }
    if (strcmp(mode, "permanent-all") == 0) {
        wait_for_peers(restart); /* no rank is SIGTERMed before it ignores SIGTERM */
        usleep(rank * 50 * 1000);
        note("perm");
        die_permanent("bad data: the same on every rank");
    }
    if (strcmp(mode, "always-crash") == 0 || strcmp(mode, "sigkill") == 0 ||
        strcmp(mode, "permanent") == 0 || strcmp(mode, "usage") == 0) {
        if (rank == 1) {
            wait_for_peers(restart);
            usleep(100 * 1000);
            if (strcmp(mode, "sigkill") == 0) raise(SIGKILL);
            if (strcmp(mode, "permanent") == 0) return env_num(PERMANENT_STATUS_VAR);
            if (strcmp(mode, "usage") == 0) return EXIT_STATUS_USAGE;
            return 4;
        }
        wait_forever();
        return 0;
    }
    if (strcmp(mode, "hang") == 0) {
        if (rank == 1) {
            wait_for_peers(restart);
            usleep(200 * 1000);
            return 5;
        }
        signal(SIGTERM, on_term_note_and_ignore);
        wait_forever();
        return 0;
    }
    if (strcmp(mode, "wait") == 0) {
        wait_forever();
        return 0;
    }
    return 91;
}

/* ------------------------------------------------------------------ driver */

typedef struct {
    int rank, local_rank, world, local_world, restart, te_restart, port, pid, argc;
    char addr[64], run_id[64], arg1[64];
} Record;

static int record_read(int attempt, int rank, Record *r) {
    char path[512];
    snprintf(path, sizeof path, "%s/a%d-r%d", g_dir, attempt, rank);
    FILE *f = fopen(path, "r");
    if (f == NULL) return -1;
    int n = fscanf(f, "%d %d %d %d %d %d %63s %d %63s %d %d %63s", &r->rank, &r->local_rank,
                   &r->world, &r->local_world, &r->restart, &r->te_restart, r->addr, &r->port,
                   r->run_id, &r->pid, &r->argc, r->arg1);
    fclose(f);
    return n == 12 ? 0 : -1;
}

static int file_exists_fmt(const char *what, int rank) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s-r%d", g_dir, what, rank);
    return access(path, F_OK) == 0;
}

/* Dead means gone or a zombie nobody reaped yet. */
static int process_alive(int pid) {
    if (kill(pid, 0) != 0) return 0;
    char path[64], buf[256] = "";
    snprintf(path, sizeof path, "/proc/%d/stat", pid);
    FILE *f = fopen(path, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = '\0';
    const char *p = strrchr(buf, ')');
    return !(p && p[1] && p[2] == 'Z');
}

static void clear_dir(void) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -f '%s'/*", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not clear %s\n", g_dir);
}

/* Runs launcher_run with stderr captured into `log`. */
static int run_captured(LaunchOptions *o, const char *mode, char *log, size_t loglen,
                        double *elapsed) {
    clear_dir();
    setenv("CIFAR_TEST_WORKER_MODE", mode, 1);
    setenv("CIFAR_TEST_DIR", g_dir, 1);
    char logpath[512];
    snprintf(logpath, sizeof logpath, "%s.log", g_dir);
    fflush(stderr);
    int saved = dup(2);
    int fd = open(logpath, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    char *argv[] = {"cifar-train-test", "payload-arg", NULL};
    double t0 = now_s();
    int rc = launcher_run(o, 2, argv);
    *elapsed = now_s() - t0;
    fflush(stderr);
    dup2(saved, 2);
    close(saved);
    FILE *f = fopen(logpath, "r");
    log[0] = '\0';
    if (f) {
        size_t n = fread(log, 1, loglen - 1, f);
        log[n] = '\0';
        fclose(f);
    }
    unlink(logpath);
    unsetenv("CIFAR_TEST_WORKER_MODE");
    return rc;
}

static void options_for_test(LaunchOptions *o, int nproc) {
    launch_options_init(o);
    o->nproc_per_node = nproc;
    o->max_restarts = 0;
    o->grace_seconds = 0.5;
}

static void check_no_survivors(int attempts, int nproc, const char *what) {
    for (int a = 0; a < attempts; a++)
        for (int r = 0; r < nproc; r++) {
            Record rec;
            if (record_read(a, r, &rec) == 0)
                CHECK(!process_alive(rec.pid), "%s: attempt %d rank %d (pid %d) still alive",
                      what, a, r, rec.pid);
        }
}

static void test_env(void) {
    LaunchOptions o;
    options_for_test(&o, 3);
    char log[4096];
    double t;
    int rc = run_captured(&o, "ok", log, sizeof log, &t);
    CHECK(rc == 0, "ok: rc %d, log: %s", rc, log);
    Record r0;
    CHECK(record_read(0, 0, &r0) == 0, "ok: rank 0 record");
    for (int r = 0; r < 3; r++) {
        Record rec;
        CHECK(record_read(0, r, &rec) == 0, "ok: rank %d record", r);
        CHECK(rec.rank == r && rec.local_rank == r && rec.world == 3 && rec.local_world == 3 &&
                  rec.restart == 0 && rec.te_restart == 0 && strcmp(rec.addr, "127.0.0.1") == 0 &&
                  rec.port > 0 && rec.port == r0.port && strcmp(rec.run_id, r0.run_id) == 0 &&
                  rec.argc == 2 && strcmp(rec.arg1, "payload-arg") == 0,
              "ok: rank %d env: %d %d %d %d %d %s %d %s argc %d %s", r, rec.rank, rec.local_rank,
              rec.world, rec.local_world, rec.restart, rec.addr, rec.port, rec.run_id, rec.argc,
              rec.arg1);
    }
    CHECK(!file_exists_fmt("a0", 3), "ok: a 4th worker ran");

    /* node 1 of 2, two per node: ranks 2 and 3 of 4 */
    options_for_test(&o, 2);
    o.nnodes = 2;
    o.node_rank = 1;
    o.master_port = 12345;
    snprintf(o.master_addr, sizeof o.master_addr, "10.1.2.3");
    rc = run_captured(&o, "ok", log, sizeof log, &t);
    CHECK(rc == 0, "two nodes: rc %d: %s", rc, log);
    for (int lr = 0; lr < 2; lr++) {
        Record rec;
        CHECK(record_read(0, 2 + lr, &rec) == 0 && rec.local_rank == lr && rec.world == 4 &&
                  rec.local_world == 2 && rec.port == 12345 && strcmp(rec.addr, "10.1.2.3") == 0,
              "two nodes: rank %d", 2 + lr);
    }
}

static int fake_two_gpus(void) { return 2; }
static int fake_no_gpu(void) { return 0; }

static void test_gpu_count(void) {
    LaunchOptions o;
    char log[4096];
    double t;
    options_for_test(&o, LAUNCH_NPROC_GPU);
    o.count_gpus = fake_two_gpus;
    CHECK(run_captured(&o, "ok", log, sizeof log, &t) == 0, "gpu: %s", log);
    CHECK(file_exists_fmt("a0", 1) && !file_exists_fmt("a0", 2), "gpu: two workers for two GPUs");
    o.count_gpus = fake_no_gpu;
    CHECK(run_captured(&o, "ok", log, sizeof log, &t) == 0, "no gpu: %s", log);
    CHECK(file_exists_fmt("a0", 0) && !file_exists_fmt("a0", 1), "no gpu: one worker");
#ifndef CIFAR_CUDA
    CHECK(launcher_count_gpus() == 0, "a CPU build sees no GPU");
#endif
}

static void test_crash_once(void) {
    LaunchOptions o;
    options_for_test(&o, 2);
    o.max_restarts = 3;
    char log[4096];
    double t;
    int rc = run_captured(&o, "crash-once", log, sizeof log, &t);
    CHECK(rc == 0, "crash-once: rc %d: %s", rc, log);
    Record a0, a1;
    CHECK(record_read(0, 0, &a0) == 0 && record_read(1, 0, &a1) == 0, "crash-once: 2 attempts");
    CHECK(a1.restart == 1 && a1.te_restart == 1 && strcmp(a0.run_id, a1.run_id) != 0,
          "crash-once: restart count %d, run ids %s %s", a1.restart, a0.run_id, a1.run_id);
    CHECK(!file_exists_fmt("a2", 0), "crash-once: a third attempt");
    CHECK(strstr(log, "rank 1 (pid") && strstr(log, "exited with code 7") &&
              strstr(log, "restarting the group (1/3)"),
          "crash-once log: %s", log);
    check_no_survivors(2, 2, "crash-once");
}

static void test_always_crash(void) {
    LaunchOptions o;
    options_for_test(&o, 3);
    o.max_restarts = 2;
    char log[8192];
    double t;
    int rc = run_captured(&o, "always-crash", log, sizeof log, &t);
    CHECK(rc == 1, "always-crash: rc %d", rc);
    CHECK(file_exists_fmt("a2", 0) && !file_exists_fmt("a3", 0), "always-crash: 3 attempts");
    CHECK(strstr(log, "restarting the group (2/2)") != NULL &&
              strstr(log, "giving up after 3 attempts: rank 1 exited with code 4") != NULL,
          "always-crash log: %s", log);
    /* the waiting ranks were stopped by SIGTERM, well before their 60 s */
    CHECK(file_exists_fmt("term", 0) && file_exists_fmt("term", 2), "always-crash: no SIGTERM");
    CHECK(t < 10.0, "always-crash took %.1f s", t);
    check_no_survivors(3, 3, "always-crash");

    rc = run_captured(&o, "sigkill", log, sizeof log, &t);
    CHECK(rc == 1 && strstr(log, "giving up after 3 attempts: rank 1 killed by SIGKILL"),
          "sigkill: rc %d log: %s", rc, log);
    check_no_survivors(3, 3, "sigkill");
}

/* Bad usage or a permanent failure: one attempt, the reason once, exit 1. */
static void test_permanent(void) {
    const char *modes[] = {"permanent", "usage"};
    const int codes[] = {EXIT_STATUS_PERMANENT, EXIT_STATUS_USAGE};
    for (int m = 0; m < 2; m++) {
        LaunchOptions o;
        options_for_test(&o, 3);
        o.max_restarts = 5;
        char log[8192], want[128];
        double t;
        int rc = run_captured(&o, modes[m], log, sizeof log, &t);
        CHECK(rc == 1, "%s: rc %d", modes[m], rc);
        CHECK(file_exists_fmt("a0", 1) && !file_exists_fmt("a1", 0), "%s: one attempt", modes[m]);
        snprintf(want, sizeof want, "giving up at once: rank 1 exited with code %d", codes[m]);
        CHECK(strstr(log, want) && !strstr(log, "restarting") && !strstr(log, "attempts"),
              "%s log: %s", modes[m], log);
        CHECK(file_exists_fmt("term", 0) && file_exists_fmt("term", 2), "%s: no SIGTERM", modes[m]);
        check_no_survivors(3, 3, modes[m]);
    }
}

/* A permanent failure met by every rank is printed once. */
static void test_permanent_printed_once(void) {
    LaunchOptions o;
    options_for_test(&o, 3);
    o.max_restarts = 5;
    /* The workers ignore SIGTERM and reach their failure within 0.1 s of starting;
     * a long grace keeps a slow start (ASan, a loaded machine) from being SIGKILLed
     * first. It costs nothing when they exit on their own. */
    o.grace_seconds = 20;
    char log[8192];
    double t;
    int rc = run_captured(&o, "permanent-all", log, sizeof log, &t);
    const char *first = strstr(log, "bad data: the same on every rank");
    CHECK(rc == 1 && first && !strstr(first + 1, "bad data: the same on every rank") &&
              strstr(log, "giving up at once") && !file_exists_fmt("a1", 0) &&
              file_exists_fmt("perm", 0) && file_exists_fmt("perm", 1) && file_exists_fmt("perm", 2),
          "permanent-all: rc %d log: %s", rc, log);
    check_no_survivors(1, 3, "permanent-all");
}

static void test_hang(void) {
    LaunchOptions o;
    options_for_test(&o, 2);
    char log[4096];
    double t;
    int rc = run_captured(&o, "hang", log, sizeof log, &t);
    CHECK(rc == 1 && strstr(log, "rank 1 exited with code 5"), "hang: rc %d log %s", rc, log);
    CHECK(file_exists_fmt("term", 0), "hang: rank 0 never got SIGTERM");
    CHECK(strstr(log, "rank 0 (pid") && strstr(log, "did not stop within 0.5 s: SIGKILL"),
          "hang: no SIGKILL message: %s", log);
    CHECK(t >= 0.6 && t < 5.0, "hang: took %.2f s (grace 0.5 s)", t);
    check_no_survivors(1, 2, "hang");
}

/* A forked killer sends SIGTERM to the launcher once every worker has started. */
static void test_sigterm_launcher(void) {
    LaunchOptions o;
    options_for_test(&o, 2);
    o.max_restarts = 3;
    clear_dir();
    pid_t launcher = getpid();
    pid_t killer = fork();
    if (killer == 0) {
        for (int i = 0; i < 1000 && !(file_exists_fmt("a0", 0) && file_exists_fmt("a0", 1)); i++)
            usleep(10 * 1000);
        kill(launcher, SIGTERM);
        _exit(0);
    }
    char log[4096];
    double t;
    /* run_captured clears the folder: the killer polls for files written after */
    int rc = run_captured(&o, "wait", log, sizeof log, &t);
    waitpid(killer, NULL, 0);
    CHECK(rc == 128 + SIGTERM, "SIGTERM: rc %d log %s", rc, log);
    CHECK(strstr(log, "got SIGTERM: stopping the workers") != NULL, "SIGTERM log: %s", log);
    CHECK(file_exists_fmt("term", 0) && file_exists_fmt("term", 1), "SIGTERM not forwarded");
    CHECK(!file_exists_fmt("a1", 0), "SIGTERM: the group was restarted");
    CHECK(t < 5.0, "SIGTERM: took %.2f s", t);
    check_no_survivors(1, 2, "SIGTERM");
}

/* SIGKILL to the launcher: the workers get SIGTERM through PR_SET_PDEATHSIG.
 * This process becomes a subreaper so that the orphans come back to it. */
static void test_sigkill_launcher(void) {
    prctl(PR_SET_CHILD_SUBREAPER, 1);
    clear_dir();
    setenv("CIFAR_TEST_WORKER_MODE", "wait", 1);
    setenv("CIFAR_TEST_DIR", g_dir, 1);
    pid_t child = fork();
    if (child == 0) {
        LaunchOptions o;
        options_for_test(&o, 2);
        char *argv[] = {"cifar-train-test", NULL};
        _exit(launcher_run(&o, 1, argv));
    }
    for (int i = 0; i < 1000 && !(file_exists_fmt("a0", 0) && file_exists_fmt("a0", 1)); i++)
        usleep(10 * 1000);
    kill(child, SIGKILL);
    waitpid(child, NULL, 0);
    Record r[2];
    int ok = record_read(0, 0, &r[0]) == 0 && record_read(0, 1, &r[1]) == 0;
    CHECK(ok, "SIGKILL: the workers never started");
    double t0 = now_s();
    int left = ok ? 2 : 0;
    while (left > 0 && now_s() - t0 < 5.0) {
        left = 0;
        for (int k = 0; k < 2; k++) {
            waitpid(r[k].pid, NULL, WNOHANG); /* reap the orphan we inherited */
            left += process_alive(r[k].pid);
        }
        usleep(10 * 1000);
    }
    CHECK(left == 0, "SIGKILL: %d worker(s) outlived the launcher", left);
    CHECK(file_exists_fmt("term", 0) && file_exists_fmt("term", 1),
          "SIGKILL: workers got no SIGTERM");
    unsetenv("CIFAR_TEST_WORKER_MODE");
    prctl(PR_SET_CHILD_SUBREAPER, 0);
}

static int parse(const char *line, LaunchOptions *o, char *out, size_t outlen, char *err) {
    char buf[512], *argv[32];
    snprintf(buf, sizeof buf, "%s", line);
    int argc = 0;
    for (char *tok = strtok(buf, " "); tok && argc < 31; tok = strtok(NULL, " ")) argv[argc++] = tok;
    argv[argc] = NULL;
    launch_options_init(o);
    int rc = launcher_parse_args(o, &argc, argv, err, 256);
    out[0] = '\0';
    for (int i = 0; i < argc; i++) {
        strncat(out, argv[i], outlen - strlen(out) - 2);
        if (i + 1 < argc) strcat(out, " ");
    }
    CHECK(argv[argc] == NULL, "argv not NULL-terminated after parse");
    return rc;
}

static void test_parse_args(void) {
    LaunchOptions o;
    char out[512], err[256];
    CHECK(parse("cifar-train --data x --nproc-per-node 4 --epochs 3 --nnodes=1 --master-port=0 "
                "--max-restarts 5 --out y", &o, out, sizeof out, err) == 0, "parse: %s", err);
    CHECK(strcmp(out, "cifar-train --data x --epochs 3 --out y") == 0, "stripped: '%s'", out);
    CHECK(o.nproc_per_node == 4 && o.nnodes == 1 && o.max_restarts == 5 && o.given, "values");

    CHECK(parse("t --nproc_per_node=gpu --master-addr h1 --master_port 999 --nnodes 2 "
                "--node-rank=1 -- --nnodes 7", &o, out, sizeof out, err) == 0, "parse2: %s", err);
    CHECK(strcmp(out, "t -- --nnodes 7") == 0, "after --: '%s'", out);
    CHECK(o.nproc_per_node == LAUNCH_NPROC_GPU && o.nnodes == 2 && o.node_rank == 1 &&
              o.master_port == 999 && strcmp(o.master_addr, "h1") == 0,
          "values2");

    CHECK(parse("t --data x", &o, out, sizeof out, err) == 0 && !o.given &&
              o.nproc_per_node == 1 && o.max_restarts == 3 && strcmp(out, "t --data x") == 0,
          "no launcher options");
    CHECK(parse("t --nproc-per-node", &o, out, sizeof out, err) == -1 &&
              strstr(err, "needs a value"), "missing value: %s", err);
    CHECK(parse("t --nproc-per-node 0", &o, out, sizeof out, err) == -1 &&
              strstr(err, "--nproc-per-node: expected an integer in [1, 4096], got '0'"),
          "nproc 0: %s", err);
    CHECK(parse("t --nnodes 2 --node-rank 2 --master-addr a --master-port 5", &o, out,
                sizeof out, err) == -1 && strstr(err, "--node-rank 2"), "node rank: %s", err);
    CHECK(parse("t --nnodes 2 --master-addr a", &o, out, sizeof out, err) == -1 &&
              strstr(err, "--master-port"), "multi-node without port: %s", err);
    CHECK(parse("t --max-restarts=-1", &o, out, sizeof out, err) == -1, "negative restarts");
    CHECK(parse("t --nproc-per-nodes 2", &o, out, sizeof out, err) == 0 &&
              strcmp(out, "t --nproc-per-nodes 2") == 0 && !o.given,
          "a longer option name is not ours: '%s'", out);

    /* rendezvous jobs (torchrun's spelling) */
    CHECK(parse("t --nnodes 2:3 --rdzv-endpoint 10.0.0.1:29555 --rdzv_id job7 --rdzv-backend=c10d "
                "--rdzv-timeout 2.5 --nproc-per-node 2 --data x", &o, out, sizeof out, err) == 0,
          "rdzv: %s", err);
    CHECK(strcmp(out, "t --data x") == 0 && o.nnodes_min == 2 && o.nnodes == 3 &&
              strcmp(o.rdzv_host, "10.0.0.1") == 0 && o.rdzv_port == 29555 &&
              strcmp(o.rdzv_id, "job7") == 0 && o.rdzv_timeout == 2.5 && launcher_is_rendezvous(&o),
          "rdzv values: '%s' %d:%d %s:%d", out, o.nnodes_min, o.nnodes, o.rdzv_host, o.rdzv_port);
    CHECK(parse("t --nnodes 4 --rdzv-endpoint [fd00::1]:7 --data x", &o, out, sizeof out, err) == 0 &&
              strcmp(o.rdzv_host, "fd00::1") == 0 && o.rdzv_port == 7 && o.nnodes_min == 4,
          "rdzv v6: %s %s:%d", err, o.rdzv_host, o.rdzv_port);
    CHECK(parse("t --rdzv-endpoint node0", &o, out, sizeof out, err) == 0 && o.rdzv_port == 29400,
          "rdzv default port: %d", o.rdzv_port);
    CHECK(parse("t --standalone --nproc-per-node 2", &o, out, sizeof out, err) == 0 && o.standalone &&
              o.given && !launcher_is_rendezvous(&o) && strcmp(out, "t") == 0,
          "standalone: %s '%s'", err, out);
    static const struct {
        const char *line, *want;
    } bad[] = {
        {"t --nnodes 3:2 --rdzv-endpoint h:1", "MIN above MAX"},
        {"t --nnodes 2:2000 --rdzv-endpoint h:1", "serves at most 1024 nodes"},
        {"t --nnodes 1:2", "needs --rdzv-endpoint"},
        {"t --rdzv-backend etcd --rdzv-endpoint h:1", "only c10d"},
        {"t --rdzv-endpoint h:1 --node-rank 1", "--node-rank"},
        {"t --rdzv-endpoint h:1 --master-port 5", "--master-addr/--master-port"},
        {"t --rdzv-endpoint h:0", "--rdzv-endpoint"},
        {"t --rdzv-endpoint :5", "expected HOST:PORT"},
        {"t --rdzv-timeout 0 --rdzv-endpoint h:1", "--rdzv-timeout"},
        {"t --standalone --nnodes 2 --master-addr a --master-port 3", "--standalone"},
        {"t --standalone=1", "takes no value"},
        {"t --rdzv-conf timeout=5", "--rdzv-conf: a torchrun option cifar-train does not take"},
        {"t --monitor_interval=1", "--monitor-interval: a torchrun option"},
        {"t --role trainer", "--role: a torchrun option"},
        {"t --local-addr 1.2.3.4", "--local-addr: a torchrun option"},
        {"t --no-python", "--no-python: a torchrun option"},
    };
    for (size_t k = 0; k < sizeof bad / sizeof bad[0]; k++)
        CHECK(parse(bad[k].line, &o, out, sizeof out, err) == -1 && strstr(err, bad[k].want),
              "'%s': err '%s' (want '%s')", bad[k].line, err, bad[k].want);

    DistEnv worker = {.rank = 1, .world_size = 2, .from_env = 1};
    DistEnv alone = {.rank = 0, .world_size = 1, .from_env = 0};
    parse("t --nproc-per-node 2", &o, out, sizeof out, err);
    /* the second call warns on stderr that the options are ignored: expected */
    CHECK(launcher_wanted(&o, &alone) == 1 && launcher_wanted(&o, &worker) == 0, "wanted");
    parse("t", &o, out, sizeof out, err);
    CHECK(launcher_wanted(&o, &alone) == 0, "no options: not a launcher");
}

int main(int argc, char **argv) {
    if (getenv("CIFAR_TEST_WORKER_MODE") && getenv("RANK")) return worker_main(argc, argv);
    log_set_program("test_launcher");
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_launcher.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    unsetenv("RANK");
    test_parse_args();
    test_env();
    test_gpu_count();
    test_crash_once();
    test_always_crash();
    test_permanent();
    test_permanent_printed_once();
    test_hang();
    test_sigterm_launcher();
    test_sigkill_launcher();
    clear_dir();
    rmdir(g_dir);
    return unit_report("test_launcher");
}
