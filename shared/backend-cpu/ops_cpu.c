/* ops_cpu.c: the CPU backend's baseline table (ops_cpu_impl.h for any x86-64, or
 * any other CPU), the pick of a table at start, threads and teams (ops_cpu.h).
 *
 * ops_cpu_impl.h is compiled three times: here for baseline x86-64, and in
 * ops_cpu_avx2.c / ops_cpu_avx512.c for x86-64-v3 / -v4; net_cpu_ops() returns the
 * best table the running CPU supports (cpuid, asked once), so the ops themselves
 * never dispatch. The build flags stay portable (-O2, no -march) and the binary runs
 * on any x86-64. The hot loops are short, variable-trip, per-channel loops, which
 * GCC only vectorises well at -O3, hence the optimize pragma. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "backend-cpu/ops_cpu.h"
#include "backend-cpu/cpu_bf16.h"
#include "core/check.h"
#include "core/settings.h"

#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC optimize("O3")
#endif
#define NET_REAL float
#define NET_T(name) name
#define OPS_GEMM cblas_sgemm
#define OPS_CPU_TABLE net_cpu_ops_generic
#define OPS_CPU_NAME "cpu"
#include "backend-cpu/ops_cpu_impl.h"

void openblas_set_num_threads(int num_threads);

/* ------------------------------------------------------ the table's pick */

extern const NetOps net_cpu_ops_avx2, net_cpu_ops_avx512;

CpuIsa cpu_isa_best(void) {
#if OPS_HAVE_VARIANTS
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
        __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2"))
        return CPU_ISA_AVX512;
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
        __builtin_cpu_supports("bmi2"))
        return CPU_ISA_AVX2;
#endif
    return CPU_ISA_BASELINE;
}

const NetOps *net_cpu_ops_isa(int isa) {
    if (isa < 0 || isa > (int)cpu_isa_best()) return NULL;
#if OPS_HAVE_VARIANTS
    if (isa == CPU_ISA_AVX512) return &net_cpu_ops_avx512;
    if (isa == CPU_ISA_AVX2) return &net_cpu_ops_avx2;
#endif
    return &net_cpu_ops_generic;
}

/* The table net_cpu_ops() returns from now on (NULL until one is picked). */
static const NetOps *cpu_picked;

const NetOps *net_cpu_ops_pick(int isa) { return net_cpu_ops_pick_conv(isa, settings_cpu_conv_own()); }

const NetOps *net_cpu_ops_pick_conv(int isa, int conv_own) {
    int best = (int)cpu_isa_best();
    if (isa < 0) isa = best;
    /* a forced variant never falls back to another */
    if (isa >= CPU_ISA_COUNT || isa > best)
        die_usage("CIFAR_CPU_ISA=%s: this CPU (or build) runs at most the %s variant of the CPU "
                  "ops: unset it or pick one up to %s",
                  isa < CPU_ISA_COUNT ? settings_cpu_isa_names[isa] : "?", settings_cpu_isa_names[best],
                  settings_cpu_isa_names[best]);
    const NetOps *t = net_cpu_ops_isa(isa);
    if (isa == CPU_ISA_AVX512 && !conv_own && net_cpu_ops_dnnl())
        t = net_cpu_ops_dnnl(); /* oneDNN's fp32 convs, every layer (cpu_bf16.h) */
    net_cpu_ops_use(t);
    return t;
}

void net_cpu_ops_use(const NetOps *t) { __atomic_store_n(&cpu_picked, t, __ATOMIC_RELEASE); }

const NetOps *net_cpu_ops(void) {
    const NetOps *t = __atomic_load_n(&cpu_picked, __ATOMIC_ACQUIRE);
    if (t) return t;
    Settings settings; /* no pick at start (tests, benchmarks): CIFAR_CPU_ISA's, else the best */
    settings_from_env(&settings);
    return net_cpu_ops_pick(settings.cpu_isa);
}

/* ------------------------------------------------------------- threads */

/* All parallelism is OpenMP at the op level (tiles of the batch, blocks of rows);
 * BLAS runs single-threaded inside those regions. Two thread pools spinning
 * against each other (OpenMP's and OpenBLAS's) cost more than the GEMMs on a
 * machine with few cores. */
static int ops_thread_count; /* 0 until ops_set_threads: OpenMP's default applies */

void ops_set_threads(int threads) {
    if (threads < 1) threads = 1;
    ops_thread_count = threads;
    (void)net_cpu_ops(); /* picked here at the latest, on one thread, not inside an op's team */
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
