/* ops_cpu_bf16.c: the op table (ops_cpu_impl.h) of --precision bf16 on the CPU,
 * compiled for x86-64-v4 with OPS_ACT_BF16: every activation in bfloat16 (the first
 * half of its fp32-sized buffer, as the CUDA engine's bf16), every parameter,
 * statistic and the head in fp32. It has no conv entries: net_cpu_ops_bf16()
 * (cpu_bf16.c) copies it and fills them with conv_dnnl.c's oneDNN convolutions, which
 * read and write bf16 activations too. */
#include "backend-cpu/ops_cpu.h"

#if OPS_HAVE_VARIANTS
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#pragma GCC target("arch=x86-64-v4")
#pragma GCC optimize("O3")
#define NET_REAL float
#define NET_T(name) name
#define OPS_GEMM cblas_sgemm
#define OPS_ACT_BF16 1
#define OPS_CPU_TABLE net_cpu_ops_avx512_bf16act
#define OPS_CPU_NAME "cpu-bf16"
#include "backend-cpu/ops_cpu_impl.h"
#else
/* ISO C forbids an empty translation unit. */
typedef int ops_cpu_bf16_unused;
#endif
