/* launcher.c: start, watch, stop and restart this node's workers (launcher.h).
 *
 * The launcher polls its workers every 10 ms (waitpid WNOHANG) rather than
 * waiting on SIGCHLD: it owns no other children it must ignore, and the first
 * failure is seen within 10 ms, before the peers' collectives notice the death
 * (>= 50 ms), so the rank reported as failing first is the one that caused it. */
#include "launcher.h"

#include <arpa/inet.h>
#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "core/options.h"
#include "agent_round.h"

extern char **environ;

void launch_options_init(LaunchOptions *o) {
    memset(o, 0, sizeof *o);
    o->nproc_per_node = 1;
    o->nnodes = 1;
    snprintf(o->master_addr, sizeof o->master_addr, "127.0.0.1");
    o->max_restarts = 3;
    o->grace_seconds = 10.0;
    o->nnodes_min = 1;
    o->rdzv_port = 29400;
    o->rdzv_timeout = 30.0;
}

int launcher_is_rendezvous(const LaunchOptions *o) { return o->rdzv_host[0] != '\0'; }

/* ------------------------------------------------------------ arguments */

static int parse_int_arg(const char *name, const char *v, int lo, int hi, int *out, char *err,
                         size_t errlen) {
    long long x = 0;
    if (option_parse_int(name + 2, v, lo, hi, &x, err, errlen) != 0) return -1;
    *out = (int)x;
    return 0;
}

/* "--nproc_per_node" and "--nproc-per-node" are the same option (torchrun takes both). */
static int option_is(const char *arg, size_t len, const char *name) {
    if (strlen(name) != len) return 0;
    for (size_t i = 0; i < len; i++) {
        char a = arg[i] == '_' ? '-' : arg[i];
        if (a != name[i]) return 0;
    }
    return 1;
}

/* --nnodes N or MIN:MAX (torchrun's). */
static int parse_nnodes(LaunchOptions *o, const char *v, char *err, size_t errlen) {
    const char *colon = strchr(v, ':');
    if (colon == NULL) {
        if (parse_int_arg("--nnodes", v, 1, 65536, &o->nnodes, err, errlen) != 0) return -1;
        o->nnodes_min = o->nnodes;
        return 0;
    }
    char min[32];
    snprintf(min, sizeof min, "%.*s", (int)(colon - v < 31 ? colon - v : 31), v);
    if (parse_int_arg("--nnodes", min, 1, 65536, &o->nnodes_min, err, errlen) != 0 ||
        parse_int_arg("--nnodes", colon + 1, 1, 65536, &o->nnodes, err, errlen) != 0)
        return -1;
    if (o->nnodes_min > o->nnodes) {
        snprintf(err, errlen, "--nnodes %s: MIN above MAX", v);
        return -1;
    }
    return 0;
}

/* --rdzv-endpoint HOST[:PORT] ([v6]:PORT too), --rdzv-id, --rdzv-backend c10d,
 * --rdzv-timeout SECONDS. */
static int parse_rdzv(LaunchOptions *o, const char *name, const char *v, char *err, size_t errlen) {
    if (strcmp(name, "--rdzv-backend") == 0) {
        if (strcmp(v, "c10d") == 0) return 0;
        snprintf(err, errlen, "--rdzv-backend %s: only c10d is supported (the store served by the "
                 "agent at --rdzv-endpoint)", v);
        return -1;
    }
    if (strcmp(name, "--rdzv-id") == 0) {
        if (*v == '\0' || strlen(v) > 100) {
            snprintf(err, errlen, "--rdzv-id '%s': expected 1 to 100 characters", v);
            return -1;
        }
        snprintf(o->rdzv_id, sizeof o->rdzv_id, "%s", v);
        return 0;
    }
    if (strcmp(name, "--rdzv-timeout") == 0) {
        char *end = NULL;
        double t = strtod(v, &end);
        if (end == v || *end != '\0' || !(t > 0 && t <= 86400)) {
            snprintf(err, errlen, "--rdzv-timeout: expected seconds in (0, 86400], got '%s'", v);
            return -1;
        }
        o->rdzv_timeout = t;
        return 0;
    }
    /* --rdzv-endpoint: HOST, HOST:PORT, [IPv6] or [IPv6]:PORT (a bare IPv6 address has no port) */
    const char *host = v, *port = NULL;
    size_t hl = strlen(v);
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        host = v + 1;
        hl = close ? (size_t)(close - host) : 0;
        if (close && close[1] == ':') port = close + 2;
        else if (close && close[1] != '\0') hl = 0;
    } else if (strchr(v, ':') && strchr(v, ':') == strrchr(v, ':')) {
        port = strchr(v, ':') + 1;
        hl = (size_t)(port - 1 - v);
    }
    if (hl == 0 || hl >= sizeof o->rdzv_host) {
        snprintf(err, errlen, "--rdzv-endpoint '%s': expected HOST:PORT", v);
        return -1;
    }
    snprintf(o->rdzv_host, sizeof o->rdzv_host, "%.*s", (int)hl, host);
    if (port) return parse_int_arg("--rdzv-endpoint", port, 1, 65535, &o->rdzv_port, err, errlen);
    return 0;
}

/* torchrun's options that cifar-train does not take: refused by name, so that a
 * command line copied from torchrun says what it lost. */
static const char *const torchrun_refused[] = {
    "--rdzv-conf", "--monitor-interval", "--role", "--local-addr", "--logs-specs",
    "--start-method", "--run-path", "--module", "--no-python", "--use-env", "--max-nnodes",
    "--numa-binding", "--event-log-handler", "--virtual-local-rank", "--duplicate-stdout-filters",
    "--duplicate-stderr-filters", "--omp", NULL};

static int launcher_set_option(LaunchOptions *o, const char *name, const char *v, char *err,
                               size_t errlen) {
    if (strcmp(name, "--nproc-per-node") == 0) {
        if (strcmp(v, "gpu") == 0 || strcmp(v, "auto") == 0) {
            o->nproc_per_node = LAUNCH_NPROC_GPU;
            return 0;
        }
        return parse_int_arg(name, v, 1, 4096, &o->nproc_per_node, err, errlen);
    }
    if (strcmp(name, "--nnodes") == 0) return parse_nnodes(o, v, err, errlen);
    if (strcmp(name, "--node-rank") == 0) {
        o->node_rank_given = 1;
        return parse_int_arg(name, v, 0, 65535, &o->node_rank, err, errlen);
    }
    if (strcmp(name, "--master-port") == 0) {
        o->master_given = 1;
        return parse_int_arg(name, v, 0, 65535, &o->master_port, err, errlen);
    }
    if (strncmp(name, "--rdzv-", 7) == 0) return parse_rdzv(o, name, v, err, errlen);
    if (strcmp(name, "--max-restarts") == 0)
        return parse_int_arg(name, v, 0, 1000000, &o->max_restarts, err, errlen);
    const char **log_option = strcmp(name, "--log-dir") == 0       ? &o->logs.log_dir
                              : strcmp(name, "--redirects") == 0   ? &o->logs.redirects
                              : strcmp(name, "--tee") == 0         ? &o->logs.tee
                              : strcmp(name, "--local-ranks-filter") == 0 ? &o->logs.ranks_filter
                                                                   : NULL;
    if (log_option) {
        if (*v == '\0') {
            snprintf(err, errlen, "%s: expected a value", name);
            return -1;
        }
        *log_option = v; /* checked by launcher_run, which knows the worker count */
        return 0;
    }
    /* --master-addr */
    o->master_given = 1;
    if (*v == '\0' || strlen(v) >= sizeof o->master_addr) {
        snprintf(err, errlen, "--master-addr '%s': expected a host name or address", v);
        return -1;
    }
    snprintf(o->master_addr, sizeof o->master_addr, "%s", v);
    return 0;
}

/* The checks between options, once all are read. */
static int launcher_check_args(LaunchOptions *o, int addr_given, char *err, size_t errlen) {
    if (o->standalone && (o->nnodes > 1 || launcher_is_rendezvous(o))) {
        snprintf(err, errlen, "--standalone is a job of one node: without --nnodes above 1 or "
                 "--rdzv-endpoint");
        return -1;
    }
    if (launcher_is_rendezvous(o)) {
        if (o->nnodes > AGENT_MAX_AGENTS) {
            snprintf(err, errlen, "--nnodes %d: the rendezvous store serves at most %d nodes",
                     o->nnodes, AGENT_MAX_AGENTS);
            return -1;
        }
        if (o->node_rank_given || o->master_given) {
            snprintf(err, errlen, "--rdzv-endpoint with %s: the rounds give the node ranks and rank "
                     "0's address (--node-rank, --master-addr and --master-port are for static jobs)",
                     o->node_rank_given ? "--node-rank" : "--master-addr/--master-port");
            return -1;
        }
        return 0;
    }
    if (o->nnodes_min != o->nnodes) {
        snprintf(err, errlen, "--nnodes %d:%d needs --rdzv-endpoint HOST:PORT (the store where the "
                 "nodes meet)", o->nnodes_min, o->nnodes);
        return -1;
    }
    if (o->node_rank >= o->nnodes) {
        snprintf(err, errlen, "--node-rank %d: expected 0..%d (--nnodes %d)", o->node_rank,
                 o->nnodes - 1, o->nnodes);
        return -1;
    }
    if (o->nnodes > 1 && (o->master_port == 0 || !addr_given)) {
        snprintf(err, errlen, "--nnodes %d needs --master-addr and --master-port "
                 "(rank 0's host and a free port there, the same on every node), or "
                 "--rdzv-endpoint HOST:PORT", o->nnodes);
        return -1;
    }
    return 0;
}

static const char *option_named(const char *a, size_t len, const char *const *names) {
    for (int k = 0; names[k]; k++)
        if (option_is(a, len, names[k])) return names[k];
    return NULL;
}

int launcher_parse_args(LaunchOptions *o, int *argc, char **argv, char *err, size_t errlen) {
    static const char *const names[] = {
        "--nproc-per-node", "--nnodes", "--node-rank", "--master-addr", "--master-port",
        "--max-restarts", "--log-dir", "--redirects", "--tee", "--local-ranks-filter",
        "--rdzv-endpoint", "--rdzv-id", "--rdzv-backend", "--rdzv-timeout", NULL};
    int out = 1, i = 1, addr_given = 0;
    for (; i < *argc; i++) {
        const char *a = argv[i];
        if (strcmp(a, "--") == 0) break;
        const char *eq = strchr(a, '=');
        size_t len = eq ? (size_t)(eq - a) : strlen(a);
        const char *refused = option_named(a, len, torchrun_refused);
        if (refused) {
            snprintf(err, errlen, "%s: a torchrun option cifar-train does not take (its launcher "
                     "takes --nproc-per-node, --nnodes, --rdzv-endpoint, --rdzv-id, --rdzv-backend "
                     "c10d, --rdzv-timeout, --standalone, --node-rank, --max-restarts, "
                     "--master-addr, --master-port, --log-dir, --redirects, --tee, "
                     "--local-ranks-filter)", refused);
            return -1;
        }
        if (option_is(a, len, "--standalone")) {
            if (eq) {
                snprintf(err, errlen, "--standalone takes no value");
                return -1;
            }
            o->standalone = o->given = 1;
            continue;
        }
        const char *name = option_named(a, len, names);
        if (name == NULL) {
            argv[out++] = argv[i];
            continue;
        }
        const char *v = eq ? eq + 1 : NULL;
        if (v == NULL) {
            if (i + 1 >= *argc) {
                snprintf(err, errlen, "%s needs a value", name);
                return -1;
            }
            v = argv[++i];
        }
        if (launcher_set_option(o, name, v, err, errlen) != 0) return -1;
        addr_given |= strcmp(name, "--master-addr") == 0;
        o->given = 1;
    }
    for (; i < *argc; i++) argv[out++] = argv[i];
    *argc = out;
    argv[out] = NULL;
    return launcher_check_args(o, addr_given, err, errlen);
}

int launcher_wanted(const LaunchOptions *o, const DistEnv *env) {
    if (!o->given) return 0;
    if (env->from_env) {
        if (env->rank == 0) /* the same on every rank: once for the job */
            log_warn("launcher options ignored: these processes are already the %d rank%s of a "
                     "job (RANK/WORLD_SIZE are set, e.g. by torchrun or srun)",
                     env->world_size, env->world_size == 1 ? "" : "s");
        return 0;
    }
    return 1;
}

/* ------------------------------------------------------------ resources */

int launcher_count_gpus(void) {
#ifndef CIFAR_CUDA
    return 0;
#else
    const char *vis = getenv("CUDA_VISIBLE_DEVICES");
    if (vis != NULL) {
        /* CUDA stops at the first invalid entry ("0,1,-1,2" is two devices) */
        int n = 0;
        for (const char *p = vis; *p;) {
            const char *end = strchr(p, ',');
            size_t len = end ? (size_t)(end - p) : strlen(p);
            if (len == 0 || *p == '-') break;
            n++;
            if (!end) break;
            p = end + 1;
        }
        return n;
    }
    int n = 0;
    DIR *d = opendir("/proc/driver/nvidia/gpus");
    if (d == NULL) return 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        if (e->d_name[0] != '.') n++;
    closedir(d);
    return n;
#endif
}

/* A port free right now on 127.0.0.1 (rank 0 binds it moments later, as torchrun does). */
static int launcher_free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    CHECK_STDIO(fd >= 0, "socket (looking for a free port)");
    struct sockaddr_in a;
    memset(&a, 0, sizeof a);
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    CHECK_STDIO(bind(fd, (struct sockaddr *)&a, sizeof a) == 0, "bind 127.0.0.1:0");
    CHECK_STDIO(getsockname(fd, (struct sockaddr *)&a, &len) == 0, "getsockname");
    close(fd);
    return ntohs(a.sin_port);
}

static void launcher_run_id(char *buf, size_t len, int attempt) {
    unsigned int r = 0;
    if (getrandom(&r, sizeof r, GRND_NONBLOCK) != (ssize_t)sizeof r) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        r = (unsigned int)ts.tv_nsec ^ (unsigned int)getpid() << 16;
    }
    snprintf(buf, len, "%d-%08x-a%d", (int)getpid(), r, attempt);
}

/* "exited with code 3" / "killed by SIGSEGV". */
static void describe_status(int status, char *buf, size_t len) {
    if (WIFEXITED(status))
        snprintf(buf, len, "exited with code %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(buf, len, "killed by %s%s", signal_name(WTERMSIG(status)),
                 WCOREDUMP(status) ? " (core dumped)" : "");
    else
        snprintf(buf, len, "ended with status %d", status);
}

/* ------------------------------------------------------------ signals */

static volatile sig_atomic_t g_launcher_signal;
static volatile sig_atomic_t g_launcher_signal_count;

static void launcher_on_signal(int sig) {
    g_launcher_signal = sig;
    g_launcher_signal_count++;
}

typedef struct {
    SignalSet set;
    struct sigaction old[64];
} SavedSignals;

/* The workers' set (--signals-to-handle; SIGINT and SIGTERM when none was given). */
static void launcher_signals_install(SavedSignals *s, SignalSet set) {
    s->set = set ? set : ((SignalSet)1 << SIGINT) | ((SignalSet)1 << SIGTERM);
    for (int sig = 1; sig < 64; sig++)
        if (s->set & ((SignalSet)1 << sig)) sigaction(sig, NULL, &s->old[sig]);
    g_launcher_signal = 0;
    g_launcher_signal_count = 0;
    signal_set_install(s->set, launcher_on_signal);
}

static void launcher_signals_restore(const SavedSignals *s) {
    for (int sig = 1; sig < 64; sig++)
        if (s->set & ((SignalSet)1 << sig)) sigaction(sig, &s->old[sig], NULL);
}

/* ------------------------------------------------------------ one group */

typedef struct {
    int n;              /* workers on this node */
    pid_t *pid;
    int *reaped, *status;
    int first_failed;   /* local rank of the first failure, -1 none */
    int first_status;
    int permanent;      /* local rank of the first permanent failure, -1 none */
    int interrupted;    /* the launcher's signal, 0 none */
    WorkerLogs *logs;   /* the per-rank log copies, NULL none */
} Group;

static const char *const worker_vars[] = {
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "CIFAR_RUN_ID", "CIFAR_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "GROUP_RANK",
    "TORCHELASTIC_MAX_RESTARTS", "CIFAR_RDZV_ROUND", "GROUP_WORLD_SIZE", PERMANENT_STATUS_VAR, RUN_DIR_LOCKED_VAR, FAILURE_NOTES_VAR,
    LOG_EVERY_RANK_VAR, NULL};

static int is_var(const char *entry, const char *name) {
    size_t len = strlen(name);
    return strncmp(entry, name, len) == 0 && entry[len] == '=';
}

/* job_id: a rendezvous job's, which replaces an inherited CIFAR_JOB_ID. */
static int is_worker_var(const char *entry, const char *job_id) {
    for (int k = 0; worker_vars[k]; k++)
        if (is_var(entry, worker_vars[k])) return 1;
    return job_id && is_var(entry, "CIFAR_JOB_ID");
}

/* The environment of one worker, built before fork (allocation after fork is
 * unsafe if the caller has threads). Free with env_free. */
static char **worker_env(const LaunchOptions *o, int nproc, int port, int local_rank,
                         int attempt, const char *run_id, const char *job_id) {
    size_t n = 0;
    while (environ[n]) n++;
    char **env = xcalloc(n + 24, sizeof *env); /* room for every WORKER_VAR below */
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (!is_worker_var(environ[i], job_id)) env[k++] = xstrdup(environ[i]);
    char v[512];
#define WORKER_VAR(...) (snprintf(v, sizeof v, __VA_ARGS__), env[k++] = xstrdup(v))
    WORKER_VAR("RANK=%d", o->node_rank * nproc + local_rank);
    WORKER_VAR("LOCAL_RANK=%d", local_rank);
    WORKER_VAR("WORLD_SIZE=%d", o->nnodes * nproc);
    WORKER_VAR("LOCAL_WORLD_SIZE=%d", nproc);
    WORKER_VAR("GROUP_RANK=%d", o->node_rank);
    WORKER_VAR("GROUP_WORLD_SIZE=%d", o->nnodes);
    WORKER_VAR("CIFAR_RDZV_ROUND=%d", attempt);
    /* the round in the workers' job identity: a worker left over from an earlier round
     * is refused as another job by this round's rank 0, whatever port it tries */
    if (job_id) WORKER_VAR("CIFAR_JOB_ID=%s-r%d", job_id, attempt);
    WORKER_VAR("MASTER_ADDR=%s", o->master_addr);
    WORKER_VAR("MASTER_PORT=%d", port);
    WORKER_VAR("CIFAR_RUN_ID=%s", run_id);
    WORKER_VAR("CIFAR_RESTART_COUNT=%d", attempt);
    WORKER_VAR("TORCHELASTIC_RESTART_COUNT=%d", attempt);
    WORKER_VAR("TORCHELASTIC_MAX_RESTARTS=%d", o->max_restarts);
    WORKER_VAR("%s=%d", PERMANENT_STATUS_VAR, EXIT_STATUS_PERMANENT);
    if (o->run_dir_locked) WORKER_VAR("%s=%d", RUN_DIR_LOCKED_VAR, (int)getpid());
    if (o->failure_notes[0]) WORKER_VAR("%s=%s", FAILURE_NOTES_VAR, o->failure_notes);
    if (worker_logs_wanted(&o->logs)) WORKER_VAR("%s=1", LOG_EVERY_RANK_VAR);
#undef WORKER_VAR
    env[k] = NULL;
    return env;
}

static void env_free(char **env) {
    for (size_t i = 0; env[i]; i++) free(env[i]);
    free(env);
}

/* In the child, between fork and exec: async-signal-safe calls only. out_fd and
 * err_fd (-1: the launcher's) become its stdout and stderr. */
static void worker_exec(const char *exe, char **argv, char **env, pid_t launcher, int out_fd,
                        int err_fd) {
    if (out_fd >= 0 && dup2(out_fd, STDOUT_FILENO) < 0) _exit(127);
    if (err_fd >= 0 && dup2(err_fd, STDERR_FILENO) < 0) _exit(127);
    setpgid(0, 0); /* own group: the launcher stops it and its children at once */
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (getppid() != launcher) _exit(1); /* the launcher died before prctl */
    signal(SIGINT, SIG_DFL);
    signal(SIGTERM, SIG_DFL);
    signal(SIGPIPE, SIG_DFL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(exe, argv, env);
    static const char msg[] = ": cannot execute the worker program\n";
    ssize_t w = write(2, exe, strlen(exe));
    w = write(2, msg, sizeof msg - 1);
    (void)w;
    _exit(127);
}

static void group_signal(Group *g, int sig) {
    for (int r = 0; r < g->n; r++)
        if (!g->reaped[r]) kill(-g->pid[r], sig);
}

static int group_spawn(Group *g, const LaunchOptions *o, int port, int attempt,
                       const char *run_id, const char *job_id, char **argv) {
    const char *exe = o->exe ? o->exe : "/proc/self/exe";
    pid_t self = getpid();
    for (int r = 0; r < g->n; r++) g->reaped[r] = 1; /* nothing to wait for until started */
    for (int r = 0; r < g->n; r++) {
        char **env = worker_env(o, g->n, port, r, attempt, run_id, job_id);
        int out_fd = -1, err_fd = -1;
        if (g->logs) worker_logs_child_fds(g->logs, r, &out_fd, &err_fd);
        fflush(NULL);
        pid_t pid = fork();
        if (pid == 0) worker_exec(exe, argv, env, self, out_fd, err_fd);
        env_free(env);
        if (pid < 0) {
            log_error("cannot start rank %d: fork: %s", o->node_rank * g->n + r, strerror(errno));
            return -1;
        }
        setpgid(pid, pid); /* also here, so kill(-pid) works before the child runs */
        g->pid[r] = pid;
        g->reaped[r] = 0;
    }
    if (g->logs) worker_logs_forked(g->logs);
    return 0;
}

static double launcher_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* A worker's own verdict that no restart can help (check.h): bad usage, or
 * EXIT_STATUS_PERMANENT (bad configuration, refused snapshot, bad data). */
static int status_is_permanent(int status) {
    return WIFEXITED(status) &&
           (WEXITSTATUS(status) == EXIT_STATUS_USAGE || WEXITSTATUS(status) == EXIT_STATUS_PERMANENT);
}

/* Reap whatever ended; records and logs the first failure. Returns workers left. */
static int group_poll(Group *g, const LaunchOptions *o, int stopping) {
    int left = 0;
    for (int r = 0; r < g->n; r++) {
        if (g->reaped[r]) continue;
        int st = 0;
        pid_t got = waitpid(g->pid[r], &st, WNOHANG);
        if (got == 0 || (got < 0 && errno == EINTR)) {
            left++;
            continue;
        }
        g->reaped[r] = 1;
        g->status[r] = got < 0 ? (1 << 8) : st; /* ECHILD: someone else reaped it */
        int ok = WIFEXITED(g->status[r]) && WEXITSTATUS(g->status[r]) == 0;
        if (status_is_permanent(g->status[r]) && g->permanent < 0) g->permanent = r;
        if (!ok && !stopping && g->first_failed < 0) {
            char how[96];
            describe_status(g->status[r], how, sizeof how);
            log_error("rank %d (pid %d) %s", o->node_rank * g->n + r, (int)g->pid[r], how);
            g->first_failed = r;
            g->first_status = g->status[r];
        }
    }
    return left;
}

/* Called every ~10 ms while a group runs (a rendezvous job's agent talks to its
 * store there): nonzero stops the group as a failure would. */
typedef int (*GroupHook)(void *ctx, Group *g);

/* Watch the group until every worker is reaped. */
static void group_watch(Group *g, const LaunchOptions *o, GroupHook hook, void *ctx) {
    int stopping = 0, killed = 0;
    double deadline = 0;
    for (;;) {
        int left = group_poll(g, o, stopping);
        if (left == 0) break;
        int asked = hook && hook(ctx, g);
        if (!stopping && (g->first_failed >= 0 || g_launcher_signal || asked)) {
            /* the launcher's signal is passed on as it is: the workers handle the same
             * set, and their exit status then says which (128 + N) */
            int sig = SIGTERM;
            if (g_launcher_signal) {
                g->interrupted = sig = g_launcher_signal;
                log_error("got %s: stopping the workers (each writes a snapshot)",
                          signal_name(g_launcher_signal));
            }
            stopping = 1;
            group_signal(g, sig);
            deadline = launcher_now() + o->grace_seconds;
        }
        if (stopping && !g->interrupted && g_launcher_signal) g->interrupted = g_launcher_signal;
        /* a second Ctrl-C, or the grace period is over: no more waiting */
        if (stopping && !killed && (launcher_now() > deadline || g_launcher_signal_count > 1)) {
            for (int r = 0; r < g->n; r++)
                if (!g->reaped[r])
                    log_warn("rank %d (pid %d) did not stop within %g s: SIGKILL",
                             o->node_rank * g->n + r, (int)g->pid[r], o->grace_seconds);
            group_signal(g, SIGKILL);
            killed = 1;
        }
        if (g->logs) {
            worker_logs_pump(g->logs, 10); /* waits up to 10 ms for lines */
        } else {
            struct timespec ts = {0, 10 * 1000 * 1000};
            nanosleep(&ts, NULL);
        }
    }
    /* whatever the workers started in their groups goes with them */
    if (stopping)
        for (int r = 0; r < g->n; r++) kill(-g->pid[r], SIGKILL);
}

/* ------------------------------------------------------------ launcher_run */

/* The workers' notes of permanent failures (check.h): an unlinked file in
 * $TMPDIR, so that nothing is left behind even if the launcher is SIGKILLed. The
 * workers inherit the descriptor and open it anew by its /proc/self/fd name
 * (their own open file, for flock). -1 and none (every rank then prints its
 * own) if it cannot be made. */
static int failure_notes_create(char *name, size_t len) {
    const char *tmp = getenv("TMPDIR");
    char path[4096];
    snprintf(path, sizeof path, "%s/cifar-failures-XXXXXX", tmp && *tmp ? tmp : "/tmp");
    int fd = mkstemp(path);
    name[0] = '\0';
    if (fd < 0) return -1;
    unlink(path);
    snprintf(name, len, "/proc/self/fd/%d", fd);
    return fd;
}

/* One round of this node's workers, from start to the last one reaped. */
static void group_run_once(Group *g, const LaunchOptions *o, int port, int attempt,
                           const char *run_id, const char *job_id, char **argv, GroupHook hook,
                           void *ctx) {
    g->first_failed = -1;
    g->permanent = -1;
    g->interrupted = 0;
    g->logs = worker_logs_wanted(&o->logs) ? worker_logs_start(&o->logs, g->n, o->node_rank, attempt)
                                           : NULL;
    if (group_spawn(g, o, port, attempt, run_id, job_id, argv) != 0) {
        g->first_failed = -2; /* stop those already started */
        group_signal(g, SIGTERM);
    }
    group_watch(g, o, hook, ctx);
    worker_logs_finish(g->logs);
    g->logs = NULL;
    comm_shm_cleanup(run_id);
}

/* A static job: this node restarts its own group on its own count. */
static int launcher_run_static(LaunchOptions *o, Group *g, int port, char **argv) {
    int nproc = g->n;
    for (int attempt = 0; attempt <= o->max_restarts; attempt++) {
        char run_id[64];
        launcher_run_id(run_id, sizeof run_id, attempt);
        group_run_once(g, o, port, attempt, run_id, NULL, argv, NULL, NULL);
        if (g->interrupted) return 128 + g->interrupted;
        if (g->first_failed == -1) return 0;
        if (g->first_failed == -2) return 1;
        if (g->permanent >= 0) {
            log_error("giving up at once: rank %d exited with code %d, a failure no restart can "
                      "fix (its message is above)", o->node_rank * nproc + g->permanent,
                      WEXITSTATUS(g->status[g->permanent]));
            return 1;
        }
        if (attempt < o->max_restarts) {
            log_error("restarting the group (%d/%d)", attempt + 1, o->max_restarts);
            continue;
        }
        char how[96];
        describe_status(g->first_status, how, sizeof how);
        log_error("giving up after %d attempt%s: rank %d %s (the first failure of the last "
                  "attempt)", attempt + 1, attempt ? "s" : "", o->node_rank * nproc + g->first_failed,
                  how);
    }
    return 1;
}

typedef struct {
    AgentRound *a;
    const LaunchOptions *o;
    int notes_fd;
} RoundWatch;

/* The first line of the workers' notes of permanent failures (check.h), or "". */
static void first_note(int notes_fd, char *buf, size_t len) {
    buf[0] = '\0';
    if (notes_fd < 0) return;
    ssize_t n = pread(notes_fd, buf, len - 1, 0);
    buf[n > 0 ? n : 0] = '\0';
    char *nl = strchr(buf, '\n');
    if (nl) *nl = '\0';
}

/* While a round's workers run: the first failure goes to the store at once (so
 * that every node stops within moments), the store's word is read. */
static void round_report_failure(RoundWatch *w, Group *g) {
    AgentRound *a = w->a;
    if (a->reported || g->first_failed < 0) return;
    int st = g->first_status, rank = w->o->node_rank * g->n + g->first_failed;
    char how[96], note[600], reason[AGENT_MAX_PAYLOAD], host[64] = "?";
    describe_status(st, how, sizeof how);
    gethostname(host, sizeof host);
    host[sizeof host - 1] = '\0';
    if (status_is_permanent(st)) {
        first_note(w->notes_fd, note, sizeof note);
        snprintf(reason, sizeof reason, "giving up at once: rank %d on node %d (%s) %s, a failure "
                 "no restart can fix: %s", rank, a->node_rank, host, how,
                 note[0] ? note : "its message is in that node's log");
    } else {
        snprintf(reason, sizeof reason, "rank %d (pid %d) on node %d (%s) %s", rank,
                 (int)g->pid[g->first_failed], a->node_rank, host, how);
    }
    agent_round_report(a, status_is_permanent(st), WEXITSTATUS(st), reason);
}

static int round_hook(void *ctx, Group *g) {
    RoundWatch *w = ctx;
    round_report_failure(w, g);
    agent_round_poll(w->a);
    return w->a->stop || w->a->ended || w->a->lost;
}

/* A rendezvous job: the rounds of the store (agent_round.h). */
static int launcher_run_rounds(LaunchOptions *o, Group *g, char **argv, int notes_fd) {
    AgentRound a;
    if (agent_round_begin(&a, o, &g_launcher_signal) != 0)
        return g_launcher_signal ? 128 + g_launcher_signal : 1;
    RoundWatch w = {&a, o, notes_fd};
    while (agent_round_next(&a)) {
        o->node_rank = a.node_rank;
        o->nnodes = a.nnodes;
        snprintf(o->master_addr, sizeof o->master_addr, "%s", o->rdzv_host);
        log_info("round %d: node %d of %d, world size %d, rank 0 at %s:%d", a.round, a.node_rank,
                 a.nnodes, a.world_size, o->master_addr, a.master_port);
        group_run_once(g, o, a.master_port, a.round, a.run_id, a.job_id, argv, round_hook, &w);
        int all_ok = g->first_failed == -1 && !g->interrupted && !a.stop && !a.ended && !a.lost;
        round_report_failure(&w, g); /* the last worker's failure: the hook ran before it */
        if (g->first_failed == -2) agent_round_report(&a, 0, 0, "a worker could not be started");
        if (!agent_round_settle(&a, g->interrupted, all_ok)) break;
    }
    return agent_round_end(&a);
}

int launcher_run(const LaunchOptions *opt, int argc, char **argv) {
    if (argc < 1 || argv[0] == NULL) {
        log_error("launcher: no worker command");
        return 2;
    }
    LaunchOptions o = *opt;
    int nproc = o.nproc_per_node;
    if (nproc == LAUNCH_NPROC_GPU) {
        int gpus = o.count_gpus ? o.count_gpus() : launcher_count_gpus();
        nproc = gpus > 0 ? gpus : 1;
        log_info("--nproc-per-node gpu: %d GPU%s visible, %d worker%s", gpus, gpus == 1 ? "" : "s",
                 nproc, nproc == 1 ? "" : "s");
    }
    if (nproc < 1) {
        log_error("--nproc-per-node %d: expected at least 1", nproc);
        return 2;
    }
    char why[256];
    if (worker_logs_check(&o.logs, nproc, why, sizeof why) != 0) {
        log_error("%s", why);
        return 2;
    }
    int port = o.master_port;
    if (port == 0 && !launcher_is_rendezvous(&o)) {
        if (o.nnodes > 1) {
            log_error("--nnodes %d needs --master-port", o.nnodes);
            return 2;
        }
        port = launcher_free_port();
    }
    Group g;
    memset(&g, 0, sizeof g);
    g.n = nproc;
    g.pid = xcalloc((size_t)nproc, sizeof *g.pid);
    g.reaped = xcalloc((size_t)nproc, sizeof *g.reaped);
    g.status = xcalloc((size_t)nproc, sizeof *g.status);
    SavedSignals saved;
    launcher_signals_install(&saved, o.signals);
    int notes_fd = failure_notes_create(o.failure_notes, sizeof o.failure_notes);
    o.nproc_per_node = nproc; /* the store checks every node has the same */
    int result = launcher_is_rendezvous(&o) ? launcher_run_rounds(&o, &g, argv, notes_fd)
                                            : launcher_run_static(&o, &g, port, argv);
    launcher_signals_restore(&saved);
    if (notes_fd >= 0) close(notes_fd);
    free(g.pid);
    free(g.reaped);
    free(g.status);
    return result;
}
