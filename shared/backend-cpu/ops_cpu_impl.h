/* ops_cpu_impl.h: the CPU's op table (net_ops.h's NetOps), written once over a scalar
 * type: every entry is a function of this file with the table's signature, named
 * cpu_<entry> (cpu_conv_forward, cpu_bn_train, ...); op bodies are opsi_*.
 *
 * Compiled once per instruction set (ops_cpu.c baseline x86-64, ops_cpu_avx2.c,
 * ops_cpu_avx512.c: the tables net_cpu_ops_generic / _avx2 / _avx512, one picked at
 * start by net_cpu_ops()), and in double by tests/cpu_double.h (net_cpu_opsD), so
 * the finite-difference gradient checks run in double precision over the very same
 * code. Define before including (once per translation unit), after the NetOps type
 * of the instance is declared (model/net.h for float, model/net_ops.h for double):
 *   NET_REAL       float or double
 *   NET_T(name)    the instance's name of a type (name, or name##D), as for net_ops.h
 *   OPS_GEMM       cblas_sgemm or cblas_dgemm
 *   OPS_CPU_TABLE  the name of the table this file defines, OPS_CPU_NAME its .name
 * and, for the bf16 table's instance only (ops_cpu_bf16.c), OPS_ACT_BF16: the
 * activations in bfloat16 (cpu_common.h's opsi_ld/opsi_st), no conv entries (the
 * table's user fills them: conv_dnnl.c).
 *
 * Determinism: every reduction runs over blocks of rows whose boundaries depend on
 * the problem size only; per-block partial sums (in double) are combined in block
 * order, so results do not depend on the thread count. Elementwise loops use static
 * schedules. The only reductions left to BLAS are GEMM inner products, which OpenBLAS
 * does not split across threads.
 *
 * Threads: every entry runs its body on a team (OPSI_TEAM): the team of the network
 * walk when the caller runs one (the table's team entry, ops_team_run: one parallel
 * region per walk), else a parallel region of its own. Bodies share work with
 * orphaned `omp for` loops and do serial parts in `omp single`; their scratch comes
 * from ops_team_scratch, and every body ends on a barrier (the scratch is the next
 * op's after it).
 *
 * Convolution: NHWC activations; im2col columns are ordered (kh, kw, ci) so each
 * (kh, kw) tap copies `cin` contiguous floats, and the PyTorch weight
 * [cout][cin][kh][kw] is permuted to [cout][kh][kw][cin] (tiny), a copy per thread.
 * The batch is processed in chunks of whole images so the column buffer stays in
 * cache; 1x1 stride-1 pad-0 convolutions use x directly as the GEMM operand. */
#include <cblas.h>
#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/ops.h"
#include "backend-cpu/ops_cpu.h"
#include "model/xent_row.h"

typedef NET_REAL real_t;

/* The families, each in its own file (llm.c's llmc/ style): what an entry does is in
 * net_ops.h, how the CPU does it in the file of its family. */
#include "backend-cpu/cpu_common.h"
#ifndef OPS_ACT_BF16 /* the bf16 table's convolutions are conv_dnnl.c's */
#include "backend-cpu/cpu_conv.h"
#endif
#include "backend-cpu/cpu_bn.h"
#include "backend-cpu/cpu_elementwise.h"
#include "backend-cpu/cpu_head.h"
#include "backend-cpu/cpu_sgd.h"

/* --------------------------------------------------------------- the table */

/* 16-element alignment: 64 bytes for float, as every CPU buffer. */
#define OPSI_ALIGN (16 * sizeof(real_t))

static void *cpu_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return xmalloc_aligned(bytes);
}

static void cpu_release(void *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

static void cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (dst != src) memmove(dst, src, bytes);
}

static void cpu_team(void *ctx, void (*body)(void *arg), void *arg) {
    (void)ctx;
    ops_team_run(body, arg);
}

/* The optional folded block backward (bn_relu_backward_keep, conv_backward_acc) is
 * left NULL, so the walk runs the plain block backward, but in the bf16 table, whose
 * user (conv_dnnl.c) gives the conv_backward_acc that goes with its keep entry. */
const struct NET_T(NetOps) OPS_CPU_TABLE = {
    .name = OPS_CPU_NAME,
    .align = OPSI_ALIGN,
    .alloc = cpu_alloc,
    .release = cpu_release,
    .copy = cpu_copy,
    .team = cpu_team,
#ifndef OPS_ACT_BF16
    .conv_plan = cpu_conv_plan,
    .conv_workspace_bytes = cpu_conv_workspace_bytes,
    .conv_plan_free = cpu_conv_plan_free,
    .conv_prepare = cpu_conv_prepare,
    .conv_forward = cpu_conv_forward,
    .conv_backward = cpu_conv_backward,
    .conv_weight_export = cpu_conv_weight_copy,
    .conv_weight_import = cpu_conv_weight_copy,
#endif
    .bn_train = cpu_bn_train,
    .bn_relu_train = cpu_bn_relu_train,
    .bn_add_relu_train = cpu_bn_add_relu_train,
    .bn_eval = cpu_bn_eval,
    .bn_backward = cpu_bn_backward,
    .bn_relu_backward = cpu_bn_relu_backward,
#ifdef OPS_ACT_BF16
    .bn_relu_backward_keep = cpu_bn_relu_backward_keep,
#endif
    .relu_forward = cpu_relu_forward,
    .relu_backward = cpu_relu_backward,
    .add = cpu_add,
    .add_relu = cpu_add_relu,
    .meanpool_forward = cpu_meanpool_forward,
    .meanpool_backward = cpu_meanpool_backward,
    .linear_forward = cpu_linear_forward,
    .linear_backward = cpu_linear_backward,
    .xent = cpu_xent,
    .sgd = cpu_sgd,
};

#undef OPSI_ALIGN
