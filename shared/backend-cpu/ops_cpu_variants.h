/* ops_cpu_variants.h: the CPU ops compiled per instruction set (see ops_cpu.c):
 * ops_list.h's list in float, and the declarations of the per-ISA variants. */
#ifndef CIFAR_OPS_CPU_VARIANTS_H
#define CIFAR_OPS_CPU_VARIANTS_H

#include <stddef.h>
#include <stdint.h>

#include "model/ops.h"
#include "model/ops_list.h"

/* Variants exist for x86-64 with GCC (clang builds, e.g. the fuzzers, use the
 * baseline code only). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OPS_HAVE_VARIANTS 1
#else
#define OPS_HAVE_VARIANTS 0
#endif

/* Every op of ops_list.h, in float: VOID(name, (params), (args)) and
 * RET(type, name, (params), (args)). */
#define OPS_VARIANT_LIST(VOID, RET) OPS_LIST_ALL(VOID, RET, float)

#define OPS_DECLARE_VOID_GENERIC(name, params, args) void ops_generic_##name params;
#define OPS_DECLARE_RET_GENERIC(type, name, params, args) type ops_generic_##name params;
#define OPS_DECLARE_VOID_AVX2(name, params, args) void ops_avx2_##name params;
#define OPS_DECLARE_RET_AVX2(type, name, params, args) type ops_avx2_##name params;
#define OPS_DECLARE_VOID_AVX512(name, params, args) void ops_avx512_##name params;
#define OPS_DECLARE_RET_AVX512(type, name, params, args) type ops_avx512_##name params;
OPS_VARIANT_LIST(OPS_DECLARE_VOID_GENERIC, OPS_DECLARE_RET_GENERIC)
OPS_VARIANT_LIST(OPS_DECLARE_VOID_AVX2, OPS_DECLARE_RET_AVX2)
OPS_VARIANT_LIST(OPS_DECLARE_VOID_AVX512, OPS_DECLARE_RET_AVX512)

#endif
