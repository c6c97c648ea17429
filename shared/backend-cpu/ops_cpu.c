/* ops_cpu.c: the CPU ops of ops.h in float32, on OpenBLAS and OpenMP.
 *
 * The op bodies live in ops_cpu_impl.h, written over a scalar type so that
 * tests/test_ops.c can run the same code in double for gradient checks. They are
 * compiled three times: here for baseline x86-64 (or any other CPU), and in
 * ops_cpu_avx2.c / ops_cpu_avx512.c for x86-64-v3 / -v4; each public op
 * dispatches on what the running CPU supports (cpuid, checked once). The build
 * flags stay portable (-O2, no -march) and the binary runs on any x86-64.
 * The hot loops are short, variable-trip, per-channel loops, which GCC only
 * vectorises well at -O3, hence the optimize pragma. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/ops.h"
#include "backend-cpu/ops_cpu_variants.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#define OPS_REAL float
#define OPS_FN(name) ops_generic_##name
#define OPS_GEMM cblas_sgemm
#include "backend-cpu/ops_cpu_impl.h"

void openblas_set_num_threads(int num_threads);

/* ------------------------------------------------------------ dispatch */

static int ops_isa_cpu(void) {
#if OPS_HAVE_VARIANTS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2"))
        return 2;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2"))
        return 1;
#endif
    return 0;
}

static const char *const ops_isa_names[] = {"generic", "avx2", "avx512"};

/* The level CIFAR_CPU_ISA=generic|avx2|avx512 forces (tests and CI run every
 * variant on one machine this way); unset or empty: the best the CPU has. An
 * unknown name, or a variant this CPU (or a build without variants) cannot run,
 * stops the process with exit status 2: a forced variant never falls back. */
static int ops_isa_from_env(void) {
    int cpu = ops_isa_cpu();
    const char *want = getenv("CIFAR_CPU_ISA");
    if (!want || !want[0]) return cpu;
    for (int level = 0; level < 3; level++) {
        if (strcmp(want, ops_isa_names[level]) != 0) continue;
        if (level > cpu)
            die_usage("CIFAR_CPU_ISA=%s: this CPU (or build) runs at most the %s variant of the "
                      "CPU ops: unset it or pick one up to %s", want, ops_isa_names[cpu],
                      ops_isa_names[cpu]);
        return level;
    }
    die_usage("CIFAR_CPU_ISA=%s: unknown variant (generic, avx2, avx512)", want);
}

/* -1 until first used; then the level in use (set once, read by every op). */
static int ops_isa_current = -1;

static int ops_isa(void) {
    int level = __atomic_load_n(&ops_isa_current, __ATOMIC_RELAXED);
    if (level < 0) {
        level = ops_isa_from_env();
        __atomic_store_n(&ops_isa_current, level, __ATOMIC_RELAXED);
    }
    return level;
}

const char *ops_isa_name(void) { return ops_isa_names[ops_isa()]; }

int ops_set_isa(int level) {
    int cpu = ops_isa_cpu();
    if (level < 0) level = ops_isa_from_env();
    if (level > cpu) level = cpu;
    __atomic_store_n(&ops_isa_current, level, __ATOMIC_RELAXED);
    return level;
}

#if OPS_HAVE_VARIANTS
#define OPS_DISPATCH_VOID(name, params, args)                 \
    void name params {                                         \
        switch (ops_isa()) {                                   \
        case 2: ops_avx512_##name args; break;                 \
        case 1: ops_avx2_##name args; break;                   \
        default: ops_generic_##name args; break;               \
        }                                                      \
    }
#define OPS_DISPATCH_RET(type, name, params, args)             \
    type name params {                                         \
        switch (ops_isa()) {                                   \
        case 2: return ops_avx512_##name args;                 \
        case 1: return ops_avx2_##name args;                   \
        default: return ops_generic_##name args;               \
        }                                                      \
    }
#else
#define OPS_DISPATCH_VOID(name, params, args) \
    void name params { (void)ops_isa(); ops_generic_##name args; }
#define OPS_DISPATCH_RET(type, name, params, args) \
    type name params { (void)ops_isa(); return ops_generic_##name args; }
#endif

OPS_VARIANT_LIST(OPS_DISPATCH_VOID, OPS_DISPATCH_RET)

/* ------------------------------------------------------------- threads */

/* All parallelism is OpenMP at the op level (tiles of the batch, blocks of rows);
 * BLAS runs single-threaded inside those regions. Two thread pools spinning
 * against each other (OpenMP's and OpenBLAS's) cost more than the GEMMs on a
 * machine with few cores. */
static int ops_thread_count; /* 0 until ops_set_threads: OpenMP's default applies */

void ops_set_threads(int threads) {
    if (threads < 1) threads = 1;
    ops_thread_count = threads;
    (void)ops_isa(); /* CIFAR_CPU_ISA is read here, on one thread, not inside an op's team */
    omp_set_num_threads(threads);
    openblas_set_num_threads(1);
}

int ops_threads(void) {
    return ops_thread_count > 0 ? ops_thread_count : omp_get_max_threads();
}

/* --------------------------------------------------------------- teams */

typedef struct {
    void *buf;
    size_t cap;
} OpsScratch;

static __thread OpsScratch ops_own_scratch; /* of the thread that leads a team */
static __thread OpsScratch *ops_cur_team;   /* the team's scratch; NULL outside teams */

int ops_in_team(void) { return ops_cur_team != NULL; }

void *ops_team_lead(void) { return &ops_own_scratch; }

void ops_team_join(void *lead) { ops_cur_team = lead; }

void *ops_team_scratch(size_t bytes) {
    OpsScratch *s = ops_cur_team ? ops_cur_team : &ops_own_scratch;
    /* every thread reads the same cap: it only changes below, between two barriers */
    if (s->cap < bytes) {
#pragma omp barrier
#pragma omp single
        {
            free(s->buf);
            s->buf = xmalloc_aligned(bytes);
            s->cap = bytes;
        }
    }
    return s->buf;
}

void ops_team_run(void (*body)(void *arg), void *arg) {
    if (ops_in_team()) {
        body(arg);
        return;
    }
    void *lead = ops_team_lead();
#pragma omp parallel num_threads(ops_threads())
    {
        ops_team_join(lead);
        body(arg);
        ops_team_join(NULL);
    }
}
