/* ops_cpu.h: the CPU backend: its op tables (net_ops.h's NetOps, one per instruction
 * set, all from ops_cpu_impl.h), the pick of one at start, and the threads and teams
 * its ops run on (ops_cpu.c). */
#ifndef CIFAR_OPS_CPU_H
#define CIFAR_OPS_CPU_H

#include <stddef.h>

#include "model/net.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Variants exist for x86-64 with GCC (clang builds, e.g. the fuzzers, use the
 * baseline code only). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OPS_HAVE_VARIANTS 1
#else
#define OPS_HAVE_VARIANTS 0
#endif

/* Instruction-set variants of the CPU table. */
typedef enum {
    CPU_ISA_BASELINE = 0, /* x86-64 (or any other CPU) */
    CPU_ISA_AVX2 = 1,     /* x86-64-v3: AVX2, FMA, BMI2 */
    CPU_ISA_AVX512 = 2,   /* x86-64-v4: AVX-512 F/BW/VL/DQ */
} CpuIsa;
#define CPU_ISA_COUNT 3

/* The best variant this CPU runs (cpuid, asked once). */
CpuIsa cpu_isa_best(void);
/* The table of one variant; NULL when this CPU (or this build) lacks it. For tests
 * and benchmarks; net_cpu_ops() (net.h: the best variant, picked once) is the one
 * the commands use. */
const NetOps *net_cpu_ops_isa(int isa);
/* Picks the table net_cpu_ops() returns from now on: variant isa, or with -1 the best
 * this CPU runs; a variant the CPU lacks stops the process with exit status 2 (a
 * forced variant never falls back). The CPU engine picks Settings.cpu_isa
 * (CIFAR_CPU_ISA) when it starts; without a pick, net_cpu_ops()'s first call picks
 * CIFAR_CPU_ISA's (core/settings.h), else the best. */
const NetOps *net_cpu_ops_pick(int isa);
/* The same with the convolutions' choice given (Settings.cpu_conv_own): for the AVX-512
 * variant, oneDNN's fp32 convs (cpu_bf16.h's net_cpu_ops_dnnl) unless conv_own or
 * oneDNN does not load. net_cpu_ops_pick reads CIFAR_CPU_CONV for it. */
const NetOps *net_cpu_ops_pick_conv(int isa, int conv_own);
/* Makes t the table net_cpu_ops() returns (cpu_bf16.h's pick of the bf16 table). */
void net_cpu_ops_use(const NetOps *t);

/* Number of threads the CPU ops use (OpenMP and BLAS). */
void ops_set_threads(int threads);
int ops_threads(void);

/* Teams: ops_team_run(body, arg) runs body(arg) once on every thread of one OpenMP
 * parallel region (ops_threads() threads); every thread makes the same sequence of
 * op calls with the same arguments and each op shares out its own work among them
 * (orphaned worksharing, fixed partitions), so a whole network walk costs one
 * region instead of one per op, with bit-identical results. Outside a team each op
 * opens a region of its own. Inside one already, ops_team_run just calls body. */
void ops_team_run(void (*body)(void *arg), void *arg);
/* For the op bodies (ops_cpu_impl.h): */
int ops_in_team(void);
/* The calling thread's scratch, to hand to the threads of a region it opens. */
void *ops_team_lead(void);
/* Every thread of a region the leader opened: join (its ops_team_lead()) or leave (NULL). */
void ops_team_join(void *lead);
/* A scratch buffer of at least `bytes` (64-byte aligned) shared by the team, the
 * same pointer in every thread; called by all of them together, one op at a time
 * (its contents are the op's until its last barrier). Grows, never shrinks. */
void *ops_team_scratch(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
