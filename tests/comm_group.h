/* comm_group.h: the process-group harness of test_comm.c: worker helpers (a
 * failed expectation, clocks, the test vectors, result files) and the driver's
 * groups of real processes (test_comm re-executed as "worker <scenario> <dir>" with
 * RANK/WORLD_SIZE/... set, stderr per rank, exit statuses), a free local port. */
#ifndef CIFAR_TESTS_COMM_GROUP_H
#define CIFAR_TESTS_COMM_GROUP_H

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* In a worker: a failed expectation ends the process with status 3. */
#define WORKER_EXPECT(cond, ...)                                                          \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "worker check failed at line %d: %s: ", __LINE__, #cond); \
            fprintf(stderr, __VA_ARGS__);                                          \
            fputc('\n', stderr);                                                   \
            exit(3);                                                               \
        }                                                                          \
    } while (0)

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static double cpu_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static float value_of(int rank, size_t i) {
    return (float)((i * 7919u + (size_t)rank * 104729u) % 1009u) * 0.0371f - 17.0f +
           (float)rank * 1.3e-3f;
}

static uint64_t fnv1a(const void *p, size_t n) {
    const unsigned char *b = p;
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ b[i]) * 1099511628211ull;
    return h;
}

static void write_text(const char *dir, const char *name, int rank, const char *text) {
    char path[512];
    snprintf(path, sizeof path, "%s/%s-%d", dir, name, rank);
    FILE *f = fopen(path, "w");
    if (f == NULL || fputs(text, f) < 0 || fclose(f) != 0) {
        perror(path);
        exit(4);
    }
}

static int free_local_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        perror("free port");
        exit(1);
    }
    close(fd);
    return ntohs(a.sin_port);
}

/* ------------------------------------------------------------------ driver */

typedef struct {
    pid_t pid[8];
    int status[8];
    double elapsed;
} Group;

static char g_dir[256];
static int g_gloo_port; /* MASTER_PORT of the next Gloo group */

static void set_rank_env(int rank, int w, const char *run_id, int world_override) {
    char v[32];
    snprintf(v, sizeof v, "%d", rank);
    setenv("RANK", v, 1);
    setenv("LOCAL_RANK", v, 1);
    snprintf(v, sizeof v, "%d", world_override > 0 ? world_override : w);
    setenv("WORLD_SIZE", v, 1);
    setenv("LOCAL_WORLD_SIZE", v, 1);
    setenv("MASTER_ADDR", "127.0.0.1", 1);
    setenv("MASTER_PORT", "29999", 1);
    setenv("CIFAR_RUN_ID", run_id, 1);
}

/* Gloo's rank 0 serves the exchange on MASTER_PORT: a free one, and the job's identity. */
static void set_gloo_env(const char *run_id) {
    char v[32];
    snprintf(v, sizeof v, "%d", g_gloo_port);
    setenv("MASTER_PORT", v, 1);
    setenv("CIFAR_JOB_ID", run_id, 1);
}

/* Starts ranks [first, first+count) of a world of w; stderr of rank r goes to
 * <dir>/<scenario>-stderr-r. `bad_world_rank` gets WORLD_SIZE w+1 (mismatch). */
static void group_spawn(Group *g, const char *scenario, int w, int first, int count,
                        const char *run_id, const char *timeout, int bad_world_rank) {
    for (int r = first; r < first + count; r++) {
        pid_t pid = fork();
        if (pid < 0) {
            perror("fork");
            exit(1);
        }
        if (pid == 0) {
            set_rank_env(r, w, run_id, r == bad_world_rank ? w + 1 : 0);
            if (strncmp(scenario, "gloo-", 5) == 0) set_gloo_env(run_id);
            setenv("CIFAR_COMM_TIMEOUT", timeout, 1);
            setenv("CIFAR_COMM_SLOT_BYTES", "4096", 1);
            char path[512];
            snprintf(path, sizeof path, "%s/%s-stderr-%d", g_dir, scenario, r);
            int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
            if (fd >= 0) dup2(fd, 2);
            char *args[] = {"test_comm", "worker", (char *)scenario, g_dir, NULL};
            execv("/proc/self/exe", args);
            _exit(127);
        }
        g->pid[r] = pid;
    }
}

static void group_wait(Group *g, int first, int count, double start) {
    for (int r = first; r < first + count; r++) {
        while (waitpid(g->pid[r], &g->status[r], 0) < 0 && errno == EINTR) {}
    }
    g->elapsed = now_s() - start;
}

/* The text of g_dir/name ("" when absent), in a buffer the next call reuses. */
static char *rv_text(const char *name) {
    static char buf[8192];
    char path[512];
    snprintf(path, sizeof path, "%s/%s", g_dir, name);
    FILE *f = fopen(path, "r");
    buf[0] = '\0';
    if (f) {
        size_t n = fread(buf, 1, sizeof buf - 1, f);
        buf[n] = '\0';
        fclose(f);
    }
    return buf;
}

/* The stderr of `scenario`'s rank (rv_text's buffer). */
static char *stderr_of(const char *scenario, int rank) {
    char name[300];
    snprintf(name, sizeof name, "%s-stderr-%d", scenario, rank);
    return rv_text(name);
}

static int exited_with(int status, int code) {
    return WIFEXITED(status) && WEXITSTATUS(status) == code;
}

static int shm_exists(const char *run_id) {
    char path[256];
    snprintf(path, sizeof path, "/dev/shm/cifar-%s", run_id);
    return access(path, F_OK) == 0;
}

#endif
