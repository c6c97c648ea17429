/* test_agent.c: the node agents of a rendezvous job (--rdzv-endpoint; train/agent_store.c,
 * agent_client.c, agent_round.c and the rounds loop of launcher.c) with real
 * processes on 127.0.0.1: several agents (forks of this test, each running
 * launcher_run with its own log), their stand-in workers (this binary again),
 * and strangers on the store's port.
 *
 * The workers are driven through files in the test folder. In round R a worker
 * records its environment in r<R>-k<rank>, waits for go-r<R> (60 s at most),
 * then exits with the number in fail-r<R>-k<rank> if that file exists, else 0;
 * SIGTERM leaves term-r<R>-k<rank> and kills it.
 * Checked: the environment of every round (ranks, world size, round, restart
 * count, rank 0's address and port, run id, job id), node 0 = the store's agent,
 * a failure anywhere restarts every node in a new round, a permanent failure
 * ends every agent with its status and the reason, a node killed (the others go
 * on with fewer), a node that joins later (a new round, not a failure), a node
 * silent past the heartbeat deadline (dropped, then back in a later round),
 * --max-restarts counted for the whole job, the store's host lost (the others
 * end with one line naming HOST:PORT), strangers (garbage, a slowloris, 200
 * connections, another job, a wrong token) that change nothing. */
#define _GNU_SOURCE /* accept4 in train/agent_store.c, included below */
#include "../train/launcher.c"
#include "../train/signals.c"
#include "../train/worker_logs.c"
#include "../train/agent_store.c"
#include "../train/agent_client.c"
#include "../train/agent_round.c"

#include <sys/stat.h>

#include "unit.h"

#define RDZV_TIMEOUT 1.0

static char g_dir[256];
static int g_port;

/* ------------------------------------------------------------------ worker */

static const char *g_wdir;
static int g_wround, g_wrank;

static int file_there(const char *fmt, int a, int b) {
    char name[128], path[512];
    snprintf(name, sizeof name, fmt, a, b);
    snprintf(path, sizeof path, "%s/%s", g_dir[0] ? g_dir : g_wdir, name);
    return access(path, F_OK) == 0;
}

static void worker_note(const char *what) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s-r%d-k%d", g_wdir, what, g_wround, g_wrank);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) close(fd);
}

static void worker_on_term(int sig) {
    worker_note("term");
    signal(sig, SIG_DFL);
    raise(sig);
}

static const char *env_or(const char *name) {
    const char *v = getenv(name);
    return v && *v ? v : "-";
}

static int worker_main(void) {
    g_wdir = getenv("CIFAR_TEST_DIR");
    g_wround = atoi(env_or("CIFAR_RDZV_ROUND"));
    g_wrank = atoi(env_or("RANK"));
    signal(SIGTERM, worker_on_term);
    /* written under another name, then renamed: the test reads the record as soon as
     * its name exists, so it must never see it half written */
    char path[512], tmp[520];
    snprintf(path, sizeof path, "%s/r%d-k%d", g_wdir, g_wround, g_wrank);
    snprintf(tmp, sizeof tmp, "%s/.r%d-k%d.tmp", g_wdir, g_wround, g_wrank);
    FILE *f = fopen(tmp, "w");
    if (!f) return 90;
    fprintf(f, "%s %s %s %s %s %s %s %s %s %s %s %s %d %d\n", env_or("RANK"), env_or("WORLD_SIZE"),
            env_or("LOCAL_RANK"), env_or("LOCAL_WORLD_SIZE"), env_or("GROUP_RANK"),
            env_or("GROUP_WORLD_SIZE"), env_or("CIFAR_RDZV_ROUND"),
            env_or("TORCHELASTIC_RESTART_COUNT"), env_or("MASTER_ADDR"), env_or("MASTER_PORT"),
            env_or("CIFAR_RUN_ID"), env_or("CIFAR_JOB_ID"), (int)getpid(), (int)getppid());
    if (fclose(f) != 0 || rename(tmp, path) != 0) return 90;
    for (int i = 0; i < 600 && !file_there("go-r%d", g_wround, 0); i++) usleep(100 * 1000);
    snprintf(path, sizeof path, "%s/fail-r%d-k%d", g_wdir, g_wround, g_wrank);
    FILE *fail = fopen(path, "r");
    int code = 0;
    if (fail) {
        if (fscanf(fail, "%d", &code) != 1) code = 99;
        fclose(fail);
    }
    return code;
}

/* ------------------------------------------------------------------ driver */

typedef struct {
    int rank, world, local_rank, local_world, group_rank, group_world, round, te_restart, port;
    int pid, agent;
    char addr[64], run_id[64], job_id[64];
} Rec;

static int rec_read(int round, int rank, Rec *r) {
    char path[512];
    snprintf(path, sizeof path, "%s/r%d-k%d", g_dir, round, rank);
    FILE *f = fopen(path, "r");
    if (!f) return -1;
    int n = fscanf(f, "%d %d %d %d %d %d %d %d %63s %d %63s %63s %d %d", &r->rank, &r->world,
                   &r->local_rank, &r->local_world, &r->group_rank, &r->group_world, &r->round,
                   &r->te_restart, r->addr, &r->port, r->run_id, r->job_id, &r->pid, &r->agent);
    fclose(f);
    return n == 14 ? 0 : -1;
}

static void touch(const char *fmt, int a, int b, const char *content) {
    char name[128], path[512];
    snprintf(name, sizeof name, fmt, a, b);
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "w");
    if (f) {
        if (content) fputs(content, f);
        fclose(f);
    }
}

static int wait_for(const char *fmt, int a, int b, double seconds) {
    double end = agent_now() + seconds;
    while (agent_now() < end) {
        if (file_there(fmt, a, b)) return 1;
        usleep(20 * 1000);
    }
    return 0;
}

/* Every rank 0..world-1 of a round has started. */
static int wait_round(int round, int world, double seconds) {
    for (int k = 0; k < world; k++)
        if (!wait_for("r%d-k%d", round, k, seconds)) return 0;
    return 1;
}

static void clear_dir(void) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'/*", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not clear %s\n", g_dir);
}

static int free_port(void) { return launcher_free_port(); }

typedef struct {
    pid_t pid;
    char log[512];
} Agent;

/* An agent of the job at 127.0.0.1:g_port with its log in <dir>/<name>.log. */
static void agent_start(Agent *a, const char *name, int nmin, int nmax, int max_restarts,
                        const char *job, const char *token) {
    snprintf(a->log, sizeof a->log, "%s/%s.log", g_dir, name);
    fflush(NULL);
    a->pid = fork();
    if (a->pid != 0) return;
    int fd = open(a->log, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    dup2(fd, 2);
    close(fd);
    if (token) setenv("CIFAR_JOB_TOKEN", token, 1);
    LaunchOptions o;
    launch_options_init(&o);
    o.nproc_per_node = 2;
    o.nnodes_min = nmin;
    o.nnodes = nmax;
    o.max_restarts = max_restarts;
    o.grace_seconds = 2;
    o.rdzv_timeout = RDZV_TIMEOUT;
    o.rdzv_port = g_port;
    snprintf(o.rdzv_host, sizeof o.rdzv_host, "127.0.0.1");
    snprintf(o.rdzv_id, sizeof o.rdzv_id, "%s", job);
    o.given = 1;
    char *argv[] = {"cifar-train-agent-test", NULL};
    _exit(launcher_run(&o, 1, argv));
}

static int log_has(const Agent *a, const char *what) {
    char buf[32768] = "";
    FILE *f = fopen(a->log, "r");
    if (!f) return 0;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    buf[n] = '\0';
    fclose(f);
    return strstr(buf, what) != NULL;
}

static void log_dump(const Agent *a) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "sed 's/^/    | /' '%s' >&2", a->log);
    if (system(cmd) != 0) fprintf(stderr, "(no log %s)\n", a->log);
}

/* The first agent serves the store: started alone until it says so. */
static void agent_start_store(Agent *a, int nmin, int nmax, int max_restarts) {
    agent_start(a, "a", nmin, nmax, max_restarts, "job-1", NULL);
    double end = agent_now() + 10;
    while (agent_now() < end && !log_has(a, "serving the rendezvous store")) usleep(20 * 1000);
}

/* Exit status of the agent, or -1 (then killed) when it is still running after `seconds`. */
static int agent_wait(Agent *a, double seconds) {
    double end = agent_now() + seconds;
    int st = 0;
    for (;;) {
        pid_t got = waitpid(a->pid, &st, WNOHANG);
        if (got == a->pid) return WIFEXITED(st) ? WEXITSTATUS(st) : 128 + WTERMSIG(st);
        if (agent_now() > end) break;
        usleep(20 * 1000);
    }
    kill(a->pid, SIGKILL);
    waitpid(a->pid, &st, 0);
    return -1;
}

static void setup(void) {
    clear_dir();
    g_port = free_port();
    setenv("CIFAR_TEST_DIR", g_dir, 1);
    setenv("CIFAR_TEST_WORKER_MODE", "rounds", 1);
}

/* Three nodes of 2 workers, --nnodes 2:3: one round, every rank's environment. */
static void test_round_env(void) {
    setup();
    Agent a[3];
    agent_start_store(&a[0], 2, 3, 0);
    agent_start(&a[1], "b", 2, 3, 0, "job-1", NULL);
    agent_start(&a[2], "c", 2, 3, 0, "job-1", NULL);
    CHECK(wait_round(0, 6, 20), "env: round 0 never started its 6 ranks");
    touch("go-r%d", 0, 0, NULL);
    for (int i = 0; i < 3; i++) {
        int rc = agent_wait(&a[i], 20);
        CHECK(rc == 0, "env: agent %d exited %d", i, rc);
        if (rc != 0) log_dump(&a[i]);
    }
    Rec r0;
    CHECK(rec_read(0, 0, &r0) == 0, "env: no record of rank 0");
    int agent_of_node[3] = {0, 0, 0};
    for (int k = 0; k < 6; k++) {
        Rec r;
        if (rec_read(0, k, &r) != 0) {
            CHECK(0, "env: no record of rank %d", k);
            continue;
        }
        CHECK(r.rank == k && r.world == 6 && r.local_world == 2 && r.local_rank == k % 2 &&
                  r.group_rank == k / 2 && r.group_world == 3 && r.round == 0 && r.te_restart == 0 &&
                  strcmp(r.addr, "127.0.0.1") == 0 && r.port == r0.port && r.port != g_port &&
                  strcmp(r.run_id, r0.run_id) == 0 && strstr(r.run_id, "-r0") &&
                  strcmp(r.job_id, "job-1-r0") == 0,
              "env: rank %d: %d %d %d %d %d %d %d %d %s %d %s %s", k, r.rank, r.world, r.local_rank,
              r.local_world, r.group_rank, r.group_world, r.round, r.te_restart, r.addr, r.port,
              r.run_id, r.job_id);
        agent_of_node[k / 2] = r.agent;
    }
    CHECK(agent_of_node[0] == a[0].pid, "env: node 0 is not the store's agent");
    CHECK(agent_of_node[1] != agent_of_node[2] && agent_of_node[1] != agent_of_node[0],
          "env: two nodes share an agent");
    CHECK(!file_there("r%d-k%d", 1, 0), "env: a second round");
}

/* A stranger's connection: raw bytes, optionally left open. */
static int stranger(const void *bytes, size_t n) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (fd < 0 || connect(fd, (struct sockaddr *)&sa, sizeof sa) != 0) {
        if (fd >= 0) close(fd);
        return -1;
    }
    if (n && send(fd, bytes, n, MSG_NOSIGNAL) != (ssize_t)n) {
        close(fd);
        return -1;
    }
    return fd;
}

/* An agent of another job or with another token: refused, with the reason. */
static void check_refused(const char *job, const char *token, const char *want) {
    AgentIdentity id;
    agent_identity(&id, job, token);
    AgentClient c;
    agent_client_init(&c, "127.0.0.1", g_port, &id, 2);
    char why[256] = "";
    int rc = agent_client_connect(&c, agent_now() + 5, why, sizeof why);
    CHECK(rc == -2 && strstr(why, want), "%s/%s: rc %d why '%s'", job, token ? token : "-", rc, why);
    agent_client_close(&c);
}

/* A worker failure on node 1 in round 0, with strangers at the store first:
 * every node's workers are stopped, round 1 has the same three nodes. */
static void test_failure_restarts_every_node(void) {
    setup();
    Agent a[3];
    agent_start_store(&a[0], 2, 3, 1);
    agent_start(&a[1], "b", 2, 3, 1, "job-1", NULL);
    agent_start(&a[2], "c", 2, 3, 1, "job-1", NULL);
    CHECK(wait_round(0, 6, 20), "failure: round 0 never started");
    /* strangers: garbage, a slowloris (half a header, held), 200 silent
     * connections, another job, a wrong token */
    int fds[202], nfd = 0;
    fds[nfd++] = stranger("GET / HTTP/1.0\r\n\r\n", 18);
    fds[nfd++] = stranger("CFAG", 4);
    for (int i = 0; i < 200; i++) fds[nfd++] = stranger(NULL, 0);
    check_refused("job-2", NULL, "another job");
    check_refused("job-1", "not-the-token", "wrong token");
    touch("fail-r%d-k%d", 0, 3, "7\n");
    touch("go-r%d", 0, 0, NULL);
    CHECK(wait_round(1, 6, 20), "failure: round 1 never started its 6 ranks");
    for (int i = 0; i < nfd; i++)
        if (fds[i] >= 0) close(fds[i]);
    touch("go-r%d", 1, 0, NULL);
    for (int i = 0; i < 3; i++) {
        int rc = agent_wait(&a[i], 20);
        CHECK(rc == 0, "failure: agent %d exited %d", i, rc);
        if (rc != 0) log_dump(&a[i]);
    }
    Rec r0, r1;
    CHECK(rec_read(0, 0, &r0) == 0 && rec_read(1, 0, &r1) == 0 && r1.round == 1 &&
              r1.te_restart == 1 && r1.world == 6 && strcmp(r0.run_id, r1.run_id) != 0,
          "failure: round 1 env: round %d restart %d world %d run ids %s %s", r1.round,
          r1.te_restart, r1.world, r0.run_id, r1.run_id);
    /* rank 3 failed before the others were told: they were stopped by SIGTERM,
     * except those that had already seen go-r0 and exited 0 */
    CHECK(log_has(&a[0], "round 0 stops: rank 3 (pid") && log_has(&a[2], "exited with code 7"),
          "failure: the stop's reason is not in every log");
    CHECK(log_has(&a[0], "rendezvous store: dropped a connection") &&
              log_has(&a[0], "too many connections without a hello at once") &&
              log_has(&a[0], "further dropped connections are not logged"),
          "failure: the strangers were not dropped, or not logged once");
    CHECK(!file_there("r%d-k%d", 2, 0), "failure: a third round");
}

/* A permanent failure (exit 3) of rank 4: every agent ends with 3 and the reason. */
static void test_permanent_ends_every_node(void) {
    setup();
    Agent a[3];
    agent_start_store(&a[0], 3, 3, 5);
    agent_start(&a[1], "b", 3, 3, 5, "job-1", NULL);
    agent_start(&a[2], "c", 3, 3, 5, "job-1", NULL);
    CHECK(wait_round(0, 6, 20), "permanent: round 0 never started");
    touch("fail-r%d-k%d", 0, 4, "3\n");
    touch("go-r%d", 0, 0, NULL);
    for (int i = 0; i < 3; i++) {
        int rc = agent_wait(&a[i], 20);
        CHECK(rc == 3, "permanent: agent %d exited %d", i, rc);
        CHECK(log_has(&a[i], "giving up at once: rank 4 on node 2"), "permanent: agent %d's log", i);
        if (rc != 3) log_dump(&a[i]);
    }
    CHECK(!file_there("r%d-k%d", 1, 0), "permanent: a second round");
}

/* A whole node killed (its agent by SIGKILL, its workers by PDEATHSIG): the two
 * others go on in round 1 with world size 4. */
static void test_node_killed(void) {
    setup();
    Agent a[3];
    agent_start_store(&a[0], 2, 3, 3);
    agent_start(&a[1], "b", 2, 3, 3, "job-1", NULL);
    agent_start(&a[2], "c", 2, 3, 3, "job-1", NULL);
    CHECK(wait_round(0, 6, 20), "killed: round 0 never started");
    kill(a[2].pid, SIGKILL);
    agent_wait(&a[2], 5);
    CHECK(wait_round(1, 4, 20), "killed: round 1 never started its 4 ranks");
    touch("go-r%d", 1, 0, NULL);
    for (int i = 0; i < 2; i++) {
        int rc = agent_wait(&a[i], 20);
        CHECK(rc == 0, "killed: agent %d exited %d", i, rc);
        if (rc != 0) log_dump(&a[i]);
    }
    Rec r;
    CHECK(rec_read(1, 3, &r) == 0 && r.world == 4 && r.group_world == 2 && !file_there("r%d-k%d", 1, 4),
          "killed: round 1 is not 2 nodes x 2");
    CHECK(log_has(&a[1], "lost: it closed its connection") || log_has(&a[1], "lost: closed its connection"),
          "killed: the reason does not say the node was lost");
}

/* Two nodes of 2:3 run round 0; a third joins: round 1 with three, not a failure
 * (--max-restarts 0). Then node 2 goes silent (SIGSTOP) past the heartbeat
 * deadline: dropped, round 2 with two; back (SIGCONT), it joins round 3. */
static void test_join_later_and_silent_node(void) {
    setup();
    Agent a[3];
    agent_start_store(&a[0], 2, 3, 1);
    int slowloris = stranger("CFAG\0\0", 6); /* held through the test: dropped after 5 s */
    agent_start(&a[1], "b", 2, 3, 1, "job-1", NULL);
    CHECK(wait_round(0, 4, 20), "join: round 0 never started with 2 nodes");
    agent_start(&a[2], "c", 2, 3, 1, "job-1", NULL);
    CHECK(wait_round(1, 6, 20), "join: round 1 never started with 3 nodes");
    Rec r;
    CHECK(rec_read(1, 5, &r) == 0 && r.world == 6 && r.te_restart == 1, "join: round 1 env");
    kill(a[2].pid, SIGSTOP); /* its workers go on: only the agent is silent */
    CHECK(wait_round(2, 4, 20), "silent: round 2 never started with 2 nodes");
    CHECK(rec_read(2, 3, &r) == 0 && r.world == 4, "silent: round 2 env");
    kill(a[2].pid, SIGCONT);
    CHECK(wait_round(3, 6, 30), "silent: the node never came back in round 3");
    touch("go-r%d", 3, 0, NULL);
    for (int i = 0; i < 3; i++) {
        int rc = agent_wait(&a[i], 20);
        CHECK(rc == 0, "join: agent %d exited %d", i, rc);
        if (rc != 0) log_dump(&a[i]);
    }
    CHECK(log_has(&a[0], "asking to join: a new round") && log_has(&a[0], "no heartbeat for"),
          "join: the reasons are not in the store's log");
    CHECK(log_has(&a[0], "no complete hello within 5 s"), "join: the slowloris was not dropped");
    if (slowloris >= 0) close(slowloris);
}

/* --max-restarts counts failed rounds for the whole job. */
static void test_max_restarts(void) {
    setup();
    Agent a[2];
    agent_start_store(&a[0], 2, 2, 1);
    agent_start(&a[1], "b", 2, 2, 1, "job-1", NULL);
    for (int round = 0; round < 2; round++) {
        touch("fail-r%d-k%d", round, round == 0 ? 1 : 2, "5\n");
        touch("go-r%d", round, 0, NULL);
    }
    for (int i = 0; i < 2; i++) {
        int rc = agent_wait(&a[i], 20);
        CHECK(rc == 1 && log_has(&a[i], "giving up after 2 failed rounds (--max-restarts 1)"),
              "max restarts: agent %d exited %d", i, rc);
        if (rc != 1) log_dump(&a[i]);
    }
    CHECK(!file_there("r%d-k%d", 2, 0), "max restarts: a third round");
}

/* The store's host lost: the other agent ends within --rdzv-timeout of noticing,
 * with one line naming the store, and its workers are stopped. */
static void test_store_lost(void) {
    setup();
    Agent a[2];
    agent_start_store(&a[0], 2, 2, 3);
    agent_start(&a[1], "b", 2, 2, 3, "job-1", NULL);
    CHECK(wait_round(0, 4, 20), "store lost: round 0 never started");
    kill(a[0].pid, SIGKILL);
    agent_wait(&a[0], 5);
    double t0 = agent_now();
    int rc = agent_wait(&a[1], 15);
    double took = agent_now() - t0;
    char want[128];
    snprintf(want, sizeof want, "the rendezvous store at 127.0.0.1:%d is gone", g_port);
    CHECK(rc == 1 && log_has(&a[1], want), "store lost: rc %d", rc);
    /* noticed at once (the connection closed), then RDZV_TIMEOUT of retries and the
     * workers' stop (a grace of 2 s at most): well under the bound */
    CHECK(took < RDZV_TIMEOUT + 2 + AGENT_DEAD_SECONDS, "store lost: took %.1f s", took);
    CHECK(file_there("term-r%d-k%d", 0, 2) && file_there("term-r%d-k%d", 0, 3),
          "store lost: the workers were not stopped");
    if (rc != 1) log_dump(&a[1]);
}

/* SIGTERM to an agent that waits: for a second node (it serves the store), or for
 * a store that never answers its hello (a mute listener holds the port): 143 at once. */
static void test_signal_while_waiting(void) {
    setup();
    Agent a;
    agent_start_store(&a, 2, 2, 0);
    usleep(300 * 1000);
    kill(a.pid, SIGTERM);
    int rc = agent_wait(&a, 5);
    CHECK(rc == 128 + SIGTERM, "waiting for a node: rc %d", rc);
    if (rc != 128 + SIGTERM) log_dump(&a);

    setup();
    int mute = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)g_port)};
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    CHECK(mute >= 0 && bind(mute, (struct sockaddr *)&sa, sizeof sa) == 0 && listen(mute, 8) == 0,
          "mute listener");
    agent_start(&a, "b", 2, 2, 0, "job-1", NULL);
    double end = agent_now() + 10;
    while (agent_now() < end && !log_has(&a, "joining the rendezvous store")) usleep(20 * 1000);
    usleep(300 * 1000);
    kill(a.pid, SIGTERM);
    rc = agent_wait(&a, 4); /* not after the hello attempt's 5 s */
    CHECK(rc == 128 + SIGTERM, "waiting for a mute store: rc %d", rc);
    if (rc != 128 + SIGTERM) log_dump(&a);
    close(mute);
}

/* SIGTERM to one agent of a running round: its workers get it, and every agent ends
 * with 143, the others saying which node was stopped. */
static void test_signal_to_one_node(void) {
    setup();
    Agent a[2];
    agent_start_store(&a[0], 2, 2, 3);
    agent_start(&a[1], "b", 2, 2, 3, "job-1", NULL);
    CHECK(wait_round(0, 4, 20), "signal: round 0 never started");
    kill(a[1].pid, SIGTERM);
    for (int i = 1; i >= 0; i--) {
        int rc = agent_wait(&a[i], 20);
        CHECK(rc == 128 + SIGTERM, "signal: agent %d exited %d", i, rc);
        if (rc != 128 + SIGTERM) log_dump(&a[i]);
    }
    CHECK(log_has(&a[0], "node 1 (") && log_has(&a[0], "was stopped by SIGTERM: every node stops"),
          "signal: the store's agent does not say which node was stopped");
    CHECK(file_there("term-r%d-k%d", 0, 0) && file_there("term-r%d-k%d", 0, 3),
          "signal: the workers were not stopped");
    CHECK(!file_there("r%d-k%d", 1, 0), "signal: a second round");
}

/* The wire helpers refuse what is not a message of this protocol. */
static void test_header_check(void) {
    unsigned char h[AGENT_HEADER_BYTES + 8];
    uint32_t type, len;
    char why[160];
    agent_frame(h, AGENT_BEAT, "\0\0\0\1", 4);
    CHECK(agent_header_check(h, &type, &len, why, sizeof why) == 0 && type == AGENT_BEAT && len == 4,
          "a beat");
    agent_put_u32(h + 12, AGENT_MAX_PAYLOAD + 1);
    CHECK(agent_header_check(h, &type, &len, why, sizeof why) == -1 && strstr(why, "bytes"), "size: %s", why);
    agent_frame(h, 77, NULL, 0);
    CHECK(agent_header_check(h, &type, &len, why, sizeof why) == -1 && strstr(why, "type"), "type: %s", why);
    agent_put_u32(h + 4, 2);
    CHECK(agent_header_check(h, &type, &len, why, sizeof why) == -1 && strstr(why, "version"), "version");
    memcpy(h, "GET ", 4);
    CHECK(agent_header_check(h, &type, &len, why, sizeof why) == -1 && strstr(why, "magic"), "magic");
}

int main(int argc, char **argv) {
    if (getenv("CIFAR_TEST_WORKER_MODE") && getenv("RANK")) return worker_main();
    log_set_program("test_agent");
    signal(SIGPIPE, SIG_IGN);
    const char *tmp = getenv("TMPDIR");
    snprintf(g_dir, sizeof g_dir, "%s/test_agent.XXXXXX", tmp && *tmp ? tmp : "/tmp");
    if (mkdtemp(g_dir) == NULL) {
        perror("mkdtemp");
        return 1;
    }
    unsetenv("RANK");
    unsetenv("CIFAR_JOB_TOKEN");
    static const struct {
        const char *name;
        void (*run)(void);
    } tests[] = {
        {"header", test_header_check},         {"env", test_round_env},
        {"failure", test_failure_restarts_every_node}, {"permanent", test_permanent_ends_every_node},
        {"killed", test_node_killed},          {"max-restarts", test_max_restarts},
        {"store-lost", test_store_lost},       {"join", test_join_later_and_silent_node},
        {"signal", test_signal_while_waiting}, {"signal-node", test_signal_to_one_node},
    };
    /* test_agent [NAME...]: only those */
    for (size_t t = 0; t < sizeof tests / sizeof tests[0]; t++) {
        int wanted = argc < 2;
        for (int i = 1; i < argc; i++) wanted |= strcmp(argv[i], tests[t].name) == 0;
        if (wanted) tests[t].run();
    }
    clear_dir();
    rmdir(g_dir);
    return unit_report("test_agent");
}
