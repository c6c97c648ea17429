/* cuda_internal.h: what the CUDA op files (cuda_*.cu) share and nothing else
 * includes: the CudaCtx they all read, launch helpers, and the few functions one
 * family lends another (column sums, the bias pass, the batch norm's cooperative
 * plan). The public interface is ops_cuda.h; the ops that are entries of the
 * executor's table (net_cuda.cu) take net_ops.h's signature, their CudaCtx as a
 * void *vctx cast back on their first line.
 *
 * Determinism: no floating-point atomics; every reduction (batch-norm statistics,
 * bias gradients, the loss) runs in a fixed order, so results repeat exactly for a
 * given batch size and set of cuDNN algorithms (the batch-norm order does not even
 * depend on the GPU: bn_nhwc.h). The only atomic is the batch norm's integer count
 * of finished blocks, which picks the block that finalises, not the order of a sum.
 *
 * Streams: every kernel, copy and library call is queued on ctx->stream (cuDNN and
 * cuBLAS are bound to it at creation; cublasSetStream before cublasSetWorkspace,
 * because setting the stream resets the workspace). Nothing here allocates, frees
 * or synchronises between cuda_ctx_create and cuda_ctx_free except the functions
 * documented as synchronous and the conv plans' creation, so a training step can be
 * captured into a CUDA graph.
 *
 * bf16 (cuda_ctx_use_bf16, ops_cuda.h "bf16 activations"): the kernels that touch
 * activations are templates on BF16 (0: float, 1: bfloat16 in the same float-typed
 * buffers), reading and writing through bn_nhwc.h's act_load / act_store; ACT_LAUNCH
 * picks the instance by ctx->bf16. BF16 = 0 is the fp32 code, operation for
 * operation. */
#ifndef CIFAR_CUDA_INTERNAL_H
#define CIFAR_CUDA_INTERNAL_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <vector>
#include <cooperative_groups.h>

#include "backend-cuda/bf16_layout.h"
#include "backend-cuda/bn_nhwc.h"
#include "backend-cuda/conv_pick.h"
#include "backend-cuda/cuda_check.h"
#include "backend-cuda/ops_cuda.h"
#include "model/xent_row.h"

#define OPS_CUDA_BLOCK 256
/* Column-sum partials: up to COLSUM_MAX_CHUNKS row chunks of one column each. */
#define COLSUM_MAX_CHUNKS 256
#define COLSUM_SCRATCH_FLOATS ((size_t)COLSUM_MAX_CHUNKS * 4096)
/* cuBLAS needs a fixed workspace to be captured into a CUDA graph. */
#define CUBLAS_WORKSPACE_BYTES ((size_t)32 << 20)

struct CudaCtx {
    int device, tf32, deterministic;
    int bf16; /* activations (and the convs' data) in bfloat16 */
    /* bf16 shadows of the conv weights in the flat fp32 params and grads
     * (cuda_bf16_shadow_init): the weights cuDNN reads, the gradients it writes,
     * laid out by bf16_layout.h (every tensor on a 128-byte boundary) */
    const float *params32;
    float *grads32;
    size_t nparams;
    Bf16Segment *seg;           /* host: n_seg conv weights, sorted by src */
    Bf16Segment *seg_dev;       /* the same table on the device, for the kernels */
    int n_seg;
    size_t seg_max;             /* the largest segment's count */
    bf16_t *w16, *g16;
    cudaStream_t stream;
    cudnnHandle_t cudnn;
    cublasHandle_t cublas;
    void *cublas_ws;
    /* batch norm scratch (bn_nhwc.h), used by one BN at a time in stream order */
    double *bn_partial;      /* BN_SUMS x BN_PARTIALS (chunks x sums x c, bn_chunks) */
    unsigned *bn_counters;   /* one per channel tile, 0 between kernels */
    float *bn_aff;           /* 3 x BN_MAX_C: affine or backward coefficients */
    float *bn_dsum;          /* BN_MAX_C: column sum of a BN backward's dx, when no conv wants it */
    float *colsum_scratch;   /* COLSUM_SCRATCH_FLOATS */
    /* One cooperative kernel per training batch norm (bn_coop_run): the largest
     * co-resident grid of each kernel, 0 where the device cannot (the two-kernel
     * path then); decided once at creation, before any graph capture. */
    int bn_coop_fwd_blocks, bn_coop_bwd_blocks, bn_coop_on;
    float *loss_dev;                    /* one float, for the synchronous loss */
    int *correct_dev;                   /* one int */
};

/* Blocks for a grid-stride loop over n items. */
static inline unsigned grid_for(size_t n) {
    size_t g = (n + OPS_CUDA_BLOCK - 1) / OPS_CUDA_BLOCK;
    if (g > (size_t)1 << 20) g = (size_t)1 << 20;
    return (unsigned)(g ? g : 1);
}

#define GRID_STRIDE(i, n)                                                                       \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                    \
         i += (size_t)gridDim.x * blockDim.x)

/* kernel<BF16> on ctx's stream, BF16 = bf16 (0 or 1), then the launch checked. */
#define ACT_LAUNCH(ctx, bf16, kernel, grid, block, ...)                                         \
    do {                                                                                        \
        if (bf16)                                                                               \
            kernel<1><<<(grid), (block), 0, (ctx)->stream>>>(__VA_ARGS__);                     \
        else                                                                                    \
            kernel<0><<<(grid), (block), 0, (ctx)->stream>>>(__VA_ARGS__);                     \
        CHECK_CUDA_LAST();                                                                      \
    } while (0)

/* Lent by one family to the others, inside libcifar-cuda.so only: hidden, so that the
 * library exports no C++ symbol of its own (ops_cuda.h's extern "C" functions are
 * its interface) and the calls between the files bind within it, as the static
 * functions of the one file did. */
#define CUDA_INTERNAL __attribute__((visibility("hidden")))
/* cuda_context.cu: out[c] = column sums of x[rows][c] (bf16: x is bfloat16), in a fixed order. */
CUDA_INTERNAL void colsum(CudaCtx *ctx, int64_t rows, int c, const float *x, float *out, int bf16);
/* cuda_elementwise.cu: y[r][c] += bias[c] (add) or y = bias. */
CUDA_INTERNAL void bias_apply(CudaCtx *ctx, size_t rows, int c, const float *bias, float *y, int add, int bf16);
/* cuda_bn.cu: the cooperative batch norm's grids for ctx (bn_coop 0: two kernels). */
CUDA_INTERNAL void bn_coop_plan(CudaCtx *ctx, int bn_coop);
/* cuda_bf16.cu: frees the bf16 shadows of ctx (cuda_ctx_free). */
CUDA_INTERNAL void bf16_shadow_release(CudaCtx *ctx);

#endif
