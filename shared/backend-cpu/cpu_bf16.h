/* cpu_bf16.h: --precision bf16 on the CPU: whether this CPU, OS and build can run it
 * (cpuid, xgetbv, arch_prctl), and its op table: every activation in bf16 (the first
 * half of its fp32-sized buffer: ops_cpu_bf16.c), the convolutions through oneDNN in
 * bf16 with fp32 accumulation (conv_dnnl.c); parameters, gradients, statistics and
 * the head in fp32. */
#ifndef CIFAR_CPU_BF16_H
#define CIFAR_CPU_BF16_H

#include <stddef.h>
#include <stdint.h>

#include "model/net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* The bf16 instructions this CPU has and the OS has enabled: a mask of these. */
enum { CPU_BF16_AVX512 = 1, /* AVX512-BF16 (vdpbf16ps), with AVX-512 state enabled (xgetbv) */
       CPU_BF16_AMX = 2 };  /* AMX-BF16 tiles, enabled (xgetbv) and granted (arch_prctl) */
int cpu_bf16_features(void);

/* NULL when --precision bf16 can run on this CPU with CPU variant isa (CIFAR_CPU_ISA's,
 * -1 = the best), else why not, in one phrase naming what is missing (the CPU's
 * instructions, the OS's support, the AVX-512 variant, or oneDNN in the build). */
const char *cpu_bf16_why_not(int isa);

/* Picks the bf16 table as the one net_cpu_ops() returns (after net_cpu_ops_pick of
 * the AVX-512 variant); dies with exit status 2 and cpu_bf16_why_not's phrase when it
 * cannot run here. */
const NetOps *net_cpu_ops_pick_bf16(int isa);

/* The fp32 AVX-512 table with oneDNN's fp32 convolutions (conv_dnnl.c; the same tiles
 * as bf16, so as deterministic): 2-2.6x faster than its own im2col + sgemm on the seed
 * model (PERFORMANCE.md). NULL where this build has no oneDNN, libdnnl.so.2 does not
 * load or the CPU lacks AVX-512. net_cpu_ops_pick picks it for the AVX-512 variant
 * unless CIFAR_CPU_CONV=own. */
const NetOps *net_cpu_ops_dnnl(void);

/* The bf16 table (NULL when cpu_bf16_why_not(isa) is not): for tests and benchmarks. */
const NetOps *net_cpu_ops_bf16(void);

/* The bf16 table's input: count floats of src (the augmented batch) rounded to bf16
 * (nearest even, bf16.h's bits) into the first half of dst (count floats' room, not
 * src: the two must not overlap), as every activation of that table is kept. */
void cpu_bf16_pack(size_t count, const float *src, float *dst);

/* What the bf16 convolutions run on, for the start line: "oneDNN 2.6.3 (avx512_core_bf16)". */
const char *cpu_bf16_backend(void);

#ifdef CIFAR_DNNL
/* conv_dnnl.c's vectorised fp32 -> bf16 packing (for tests: the bits of bf16.h's
 * bf16_from_float). */
void cpu_dnnl_pack_bf16(size_t count, const float *src, uint16_t *dst);
#endif

#ifdef __cplusplus
}
#endif
#endif
