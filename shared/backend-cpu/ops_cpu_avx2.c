/* ops_cpu_avx2.c: the CPU's op table (ops_cpu_impl.h) compiled for x86-64-v3:
 * net_cpu_ops_avx2, picked at start by net_cpu_ops() (ops_cpu.c) when the CPU
 * supports it. */
#include "backend-cpu/ops_cpu.h"

#if OPS_HAVE_VARIANTS
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC target("arch=x86-64-v3")
#pragma GCC optimize("O3")
#define NET_REAL float
#define NET_T(name) name
#define OPS_GEMM cblas_sgemm
#define OPS_CPU_TABLE net_cpu_ops_avx2
#define OPS_CPU_NAME "cpu-avx2"
#include "backend-cpu/ops_cpu_impl.h"
#else
/* ISO C forbids an empty translation unit. */
typedef int ops_cpu_avx2_unused;
#endif
