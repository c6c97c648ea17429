/* omp_env.c: see omp_env.h. */
#include "omp_env.h"

#include <cblas.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <unistd.h>

#include "check.h"

void omp_env_prefer_passive(int argc, char **argv) {
    (void)argc;
    int changed = 0;
    if (!getenv("OMP_WAIT_POLICY") && setenv("OMP_WAIT_POLICY", "passive", 1) == 0) changed = 1;
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
