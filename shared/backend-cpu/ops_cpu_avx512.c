/* ops_cpu_avx512.c: the CPU ops (ops_cpu_impl.h) compiled for x86-64-v4, chosen at run
 * time by ops_cpu.c when the CPU supports it. */
#include "backend-cpu/ops_cpu_variants.h"

#if OPS_HAVE_VARIANTS
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC target("arch=x86-64-v4")
#pragma GCC optimize("O3")
#define OPS_REAL float
#define OPS_FN(name) ops_avx512_##name
#define OPS_GEMM cblas_sgemm
#include "backend-cpu/ops_cpu_impl.h"
#else
/* ISO C forbids an empty translation unit. */
typedef int ops_cpu_avx512_unused;
#endif
