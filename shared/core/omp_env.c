/* omp_env.c: see omp_env.h. */
#include "core/omp_env.h"

#include <cblas.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "core/check.h"

/* Threads of this process in the running state (OpenBLAS starts its own at load). */
static int own_running(void) {
    DIR *d = opendir("/proc/self/task");
    if (!d) return 1;
    int n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.') continue;
        char path[300], buf[512];
        snprintf(path, sizeof path, "/proc/self/task/%s/stat", e->d_name);
        FILE *f = fopen(path, "r");
        if (!f) continue;
        size_t len = fread(buf, 1, sizeof buf - 1, f);
        fclose(f);
        buf[len] = '\0';
        const char *close_paren = strrchr(buf, ')'); /* the state follows "(comm) " */
        if (close_paren && close_paren[1] == ' ' && close_paren[2] == 'R') n++;
    }
    closedir(d);
    return n > 0 ? n : 1;
}

/* Threads of other processes running right now (/proc/stat procs_running), or -1. */
static int other_running(void) {
    FILE *f = fopen("/proc/stat", "r");
    if (!f) return -1;
    char line[256];
    int running = -1;
    while (fgets(line, sizeof line, f))
        if (sscanf(line, "procs_running %d", &running) == 1) break;
    fclose(f);
    if (running < 0) return -1;
    int others = running - own_running();
    return others > 0 ? others : 0;
}

/* 1 when other work keeps at least half of the cores busy: the median of a few
 * instantaneous samples over about 50 ms (the load average lags by a minute). */
static int machine_is_busy(void) {
    enum { SAMPLES = 5 };
    int v[SAMPLES];
    for (int i = 0; i < SAMPLES; i++) {
        v[i] = other_running();
        if (v[i] < 0) return 0;
        usleep(10000);
    }
    for (int i = 1; i < SAMPLES; i++) /* insertion sort, for the median */
        for (int j = i; j > 0 && v[j - 1] > v[j]; j--) {
            int t = v[j];
            v[j] = v[j - 1];
            v[j - 1] = t;
        }
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    return cores > 0 && 2 * v[SAMPLES / 2] >= cores;
}

/* Spins before a waiting OpenMP thread sleeps on an idle machine: libgomp counts
 * about 100,000 a millisecond, so about 20 us, where its default is 3 ms. */
#define OMP_ENV_SPINCOUNT "2000"

void omp_env_prefer_passive(int argc, char **argv) {
    (void)argc;
    int changed = 0;
    if (!getenv("OMP_WAIT_POLICY") && !getenv("GOMP_SPINCOUNT")) {
        if (machine_is_busy())
            changed = setenv("OMP_WAIT_POLICY", "passive", 1) == 0;
        else
            changed = setenv("GOMP_SPINCOUNT", OMP_ENV_SPINCOUNT, 1) == 0;
    }
    if (!getenv("OPENBLAS_NUM_THREADS") && setenv("OPENBLAS_NUM_THREADS", "1", 1) == 0) changed = 1;
    if (changed) execv("/proc/self/exe", argv);
    /* Nothing to change, or exec failed (no /proc): carry on as we are. */
}

void memory_limit_check(size_t min_bytes) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_AS, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return;
    if ((size_t)rl.rlim_cur < min_bytes)
        die("the address-space limit (ulimit -v) is %zu MiB; at least %zu MiB are needed (BLAS "
            "reserves buffers of 128 MiB) ---> HINT: raise `ulimit -v`",
            (size_t)rl.rlim_cur >> 20, min_bytes >> 20);
    /* A first tiny GEMM makes OpenBLAS map its buffers now, while the address
     * space is still free: when memory runs out later, it is one of our own
     * checked allocations that fails, with a clear message. */
    float a = 1.0f, b = 1.0f, c = 0.0f;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, 1, 1, 1, 1.0f, &a, 1, &b, 1, 0.0f, &c, 1);
}

void threads_warn_oversubscribed(int processes, int threads) {
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    if (cores < 1 || (long)processes * threads <= cores) return;
    log_warn("%d process%s x %d threads = %ld threads on %ld cores: more threads than cores "
             "slow every step (each waits for descheduled threads) ---> HINT: lower --threads "
             "(its default is cores / processes)",
             processes, processes == 1 ? "" : "es", threads, (long)processes * threads, cores);
}
