/* ops_cuda.cu: see ops_cuda.h. The CPU reference is ops_cpu.c; tests/test_ops_cuda.c
 * compares every op here with it.
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

/* ---------------------------------------------------------------- context */

extern "C" int ops_cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}

extern "C" int ops_cuda_compute_capability(int device) {
    int major = 0, minor = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major * 10 + minor;
}

static void bn_coop_plan(CudaCtx *ctx, int bn_coop);
static void bf16_shadow_release(CudaCtx *ctx);

extern "C" CudaCtx *cuda_ctx_create(int device, int tf32, int deterministic, int bn_coop) {
    CudaCtx *ctx = (CudaCtx *)xcalloc(1, sizeof *ctx);
    ctx->device = device;
    ctx->tf32 = tf32;
    ctx->deterministic = deterministic;
    CHECK_CUDA(cudaSetDevice(device));
    CHECK_CUDA(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    CHECK_CUDNN(cudnnCreate(&ctx->cudnn));
    CHECK_CUDNN(cudnnSetStream(ctx->cudnn, ctx->stream));
    CHECK_CUBLAS(cublasCreate(&ctx->cublas));
    CHECK_CUBLAS(cublasSetStream(ctx->cublas, ctx->stream));
    CHECK_CUBLAS(cublasSetMathMode(ctx->cublas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    ctx->cublas_ws = cuda_alloc(CUBLAS_WORKSPACE_BYTES);
    CHECK_CUBLAS(cublasSetWorkspace(ctx->cublas, ctx->cublas_ws, CUBLAS_WORKSPACE_BYTES));
    ctx->bn_partial = (double *)cuda_alloc((size_t)BN_PARTIALS * BN_SUMS * sizeof(double));
    ctx->bn_counters = (unsigned *)cuda_alloc(BN_MAX_C / BN_TILE * sizeof(unsigned));
    ctx->bn_aff = (float *)cuda_alloc((size_t)3 * BN_MAX_C * sizeof(float));
    ctx->bn_dsum = (float *)cuda_alloc((size_t)BN_MAX_C * sizeof(float));
    cuda_memset_async(ctx, ctx->bn_counters, 0, BN_MAX_C / BN_TILE * sizeof(unsigned));
    ctx->colsum_scratch = (float *)cuda_alloc(COLSUM_SCRATCH_FLOATS * sizeof(float));
    bn_coop_plan(ctx, bn_coop);
    ctx->loss_dev = (float *)cuda_alloc(sizeof(float));
    ctx->correct_dev = (int *)cuda_alloc(sizeof(int));
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
    return ctx;
}

extern "C" void cuda_ctx_free(CudaCtx *ctx) {
    if (!ctx) return;
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
    cuda_free(ctx->colsum_scratch);
    cuda_free(ctx->loss_dev);
    cuda_free(ctx->correct_dev);
    cuda_free(ctx->bn_partial);
    cuda_free(ctx->bn_counters);
    cuda_free(ctx->bn_aff);
    cuda_free(ctx->bn_dsum);
    bf16_shadow_release(ctx);
    CHECK_CUBLAS(cublasDestroy(ctx->cublas));
    cuda_free(ctx->cublas_ws);
    CHECK_CUDNN(cudnnDestroy(ctx->cudnn));
    CHECK_CUDA(cudaStreamDestroy(ctx->stream));
    free(ctx);
}

extern "C" void cuda_ctx_use_bf16(CudaCtx *ctx) { ctx->bf16 = 1; }
extern "C" int cuda_ctx_bf16(const CudaCtx *ctx) { return ctx->bf16; }
extern "C" int cuda_ctx_device(const CudaCtx *ctx) { return ctx->device; }
extern "C" int cuda_ctx_deterministic(const CudaCtx *ctx) { return ctx->deterministic; }
extern "C" void *cuda_ctx_stream(const CudaCtx *ctx) { return (void *)ctx->stream; }
extern "C" void cuda_ctx_sync(CudaCtx *ctx) {
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
}

extern "C" void *cuda_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    return p;
}

extern "C" void cuda_free(void *ptr) {
    if (ptr) CHECK_CUDA(cudaFree(ptr));
}

extern "C" void cuda_upload(CudaCtx *ctx, void *dst_dev, const void *src_host, size_t bytes) {
    if (bytes == 0) return;
    CHECK_CUDA(cudaMemcpyAsync(dst_dev, src_host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
}

extern "C" void cuda_download(CudaCtx *ctx, void *dst_host, const void *src_dev, size_t bytes) {
    if (bytes == 0) return;
    CHECK_CUDA(cudaMemcpyAsync(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
}

extern "C" void cuda_memset_async(CudaCtx *ctx, void *dst_dev, int value, size_t bytes) {
    if (bytes) CHECK_CUDA(cudaMemsetAsync(dst_dev, value, bytes, ctx->stream));
}

extern "C" void cuda_copy_d2d_async(CudaCtx *ctx, void *dst_dev, const void *src_dev, size_t bytes) {
    if (bytes)
        CHECK_CUDA(cudaMemcpyAsync(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
}

/* Blocks for a grid-stride loop over n items. */
static unsigned grid_for(size_t n) {
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

/* ------------------------------------------------- deterministic column sums */

/* partial[chunk][col] = sum of x[r][col] over the rows of that chunk, in a fixed
 * order: each of the 8 row lanes strides through the chunk, then lanes add up. */
template <int BF16>
__global__ void colsum_partial_kernel(const float *x, int64_t rows, int c, int64_t rows_per_chunk,
                                      float *partial) {
    __shared__ float sh[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    float s = 0.0f;
    if (col < c)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += act_load(x, r * c + col, BF16);
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        float t = 0.0f;
        for (int i = 0; i < 8; i++) t += sh[i][threadIdx.x];
        partial[(size_t)blockIdx.y * c + col] = t;
    }
}

__global__ void colsum_final_kernel(const float *partial, int chunks, int c, float *out) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= c) return;
    float t = 0.0f;
    for (int i = 0; i < chunks; i++) t += partial[(size_t)i * c + col];
    out[col] = t;
}

/* out[c] = sum over rows of x[rows][c] (overwritten); x bfloat16 when bf16. */
static void colsum(CudaCtx *ctx, int64_t rows, int c, const float *x, float *out, int bf16) {
    if ((size_t)c > COLSUM_SCRATCH_FLOATS)
        die("column sum over %d channels exceeds the %zu-float scratch", c, COLSUM_SCRATCH_FLOATS);
    int64_t chunks = (rows + 255) / 256;
    int64_t max_chunks = (int64_t)(COLSUM_SCRATCH_FLOATS / (size_t)c);
    if (max_chunks > COLSUM_MAX_CHUNKS) max_chunks = COLSUM_MAX_CHUNKS;
    if (chunks > max_chunks) chunks = max_chunks;
    if (chunks < 1) chunks = 1;
    int64_t per = (rows + chunks - 1) / chunks;
    if (per < 1) per = 1;
    dim3 block(32, 8), grid((unsigned)((c + 31) / 32), (unsigned)chunks);
    ACT_LAUNCH(ctx, bf16, colsum_partial_kernel, grid, block, x, rows, c, per, ctx->colsum_scratch);
    colsum_final_kernel<<<(unsigned)((c + 127) / 128), 128, 0, ctx->stream>>>(
        ctx->colsum_scratch, (int)chunks, c, out);
    CHECK_CUDA_LAST();
}

/* ------------------------------------------------------------- element-wise */

/* x <= 0 ? 0 : x, as the CPU ops: NaN passes through (PyTorch's rule; the trainer's
 * NaN stop relies on it). */
__device__ __forceinline__ float relu_nan(float x) { return x <= 0.0f ? 0.0f : x; }

template <int BF16>
__global__ void relu_forward_kernel(size_t n, const float *x, float *y) {
    GRID_STRIDE(i, n) act_store(y, (int64_t)i, relu_nan(act_load(x, (int64_t)i, BF16)), BF16);
}

template <int BF16>
__global__ void relu_backward_kernel(size_t n, const float *y, const float *dy, float *dx) {
    GRID_STRIDE(i, n) {
        float g = act_load(y, (int64_t)i, BF16) > 0.0f ? act_load(dy, (int64_t)i, BF16) : 0.0f;
        act_store(dx, (int64_t)i, g, BF16);
    }
}

template <int BF16>
__global__ void add_kernel(size_t n, const float *a, const float *b, float *y) {
    GRID_STRIDE(i, n) act_store(y, (int64_t)i, act_load(a, (int64_t)i, BF16) + act_load(b, (int64_t)i, BF16), BF16);
}

template <int BF16>
__global__ void add_relu_kernel(size_t n, const float *a, const float *b, float *y) {
    GRID_STRIDE(i, n) {
        float v = relu_nan(__fadd_rn(act_load(a, (int64_t)i, BF16), act_load(b, (int64_t)i, BF16)));
        act_store(y, (int64_t)i, v, BF16);
    }
}

/* y[r][j] += bias[j] (add) or y[r][j] = bias[j] (!add) over rows x c. */
template <int BF16>
__global__ void bias_kernel(size_t total, int c, const float *bias, float *y, int add) {
    GRID_STRIDE(i, total) {
        float b = bias[i % (size_t)c];
        act_store(y, (int64_t)i, add ? act_load(y, (int64_t)i, BF16) + b : b, BF16);
    }
}

extern "C" void relu_forward_cuda(CudaCtx *ctx, size_t n, const float *x, float *y) {
    if (!n) return;
    ACT_LAUNCH(ctx, ctx->bf16, relu_forward_kernel, grid_for(n), OPS_CUDA_BLOCK, n, x, y);
}

extern "C" void relu_backward_cuda(CudaCtx *ctx, size_t n, const float *y, const float *dy,
                                   float *dx) {
    if (!n) return;
    ACT_LAUNCH(ctx, ctx->bf16, relu_backward_kernel, grid_for(n), OPS_CUDA_BLOCK, n, y, dy, dx);
}

extern "C" void add_forward_cuda(CudaCtx *ctx, size_t n, const float *a, const float *b, float *y) {
    if (!n) return;
    ACT_LAUNCH(ctx, ctx->bf16, add_kernel, grid_for(n), OPS_CUDA_BLOCK, n, a, b, y);
}

extern "C" void add_relu_forward_cuda(CudaCtx *ctx, size_t n, const float *a, const float *b,
                                      float *y) {
    if (!n) return;
    ACT_LAUNCH(ctx, ctx->bf16, add_relu_kernel, grid_for(n), OPS_CUDA_BLOCK, n, a, b, y);
}

/* y: an activation (bfloat16 when bf16) or, bf16 = 0, floats (the logits). */
static void bias_apply(CudaCtx *ctx, size_t rows, int c, const float *bias, float *y, int add, int bf16) {
    size_t total = rows * (size_t)c;
    if (!total) return;
    ACT_LAUNCH(ctx, bf16, bias_kernel, grid_for(total), OPS_CUDA_BLOCK, total, c, bias, y, add);
}

/* ----------------------------------------------------------------- mean pool */

/* x: an activation (bfloat16 when BF16); y (the pooled features) always floats, so
 * the linear layer and the loss stay fp32. */
template <int BF16>
__global__ void meanpool_forward_kernel(int n, int hw, int c, const float *x, float *y) {
    GRID_STRIDE(i, (size_t)n * c) {
        size_t b = i / (size_t)c, ch = i % (size_t)c;
        const int64_t p = (int64_t)(b * (size_t)hw * c + ch);
        float s = 0.0f;
        for (int k = 0; k < hw; k++) s += act_load(x, p + (int64_t)k * c, BF16);
        y[i] = s / (float)hw;
    }
}

/* dy floats (the linear layer's), dx an activation gradient (bfloat16 when BF16). */
template <int BF16>
__global__ void meanpool_backward_kernel(int n, int hw, int c, const float *dy, float *dx) {
    const float inv = 1.0f / (float)hw;
    GRID_STRIDE(i, (size_t)n * hw * c) {
        size_t b = i / ((size_t)hw * c), ch = i % (size_t)c;
        act_store(dx, (int64_t)i, dy[b * c + ch] * inv, BF16);
    }
}

extern "C" void meanpool_forward_cuda(CudaCtx *ctx, int n, int hw, int c, const float *x, float *y) {
    size_t total = (size_t)n * c;
    if (!total) return;
    ACT_LAUNCH(ctx, ctx->bf16, meanpool_forward_kernel, grid_for(total), OPS_CUDA_BLOCK, n, hw, c, x, y);
}

extern "C" void meanpool_backward_cuda(CudaCtx *ctx, int n, int hw, int c, const float *dy,
                                       float *dx) {
    size_t total = (size_t)n * hw * c;
    if (!total) return;
    ACT_LAUNCH(ctx, ctx->bf16, meanpool_backward_kernel, grid_for(total), OPS_CUDA_BLOCK, n, hw, c, dy, dx);
}

/* -------------------------------------------------------------------- linear */

/* Row-major y[n][out] = x[n][in] * W[out][in]^T is, in cuBLAS's column-major terms,
 * y^T (out x n) = W^T' (out x in) * x^T (in x n) with W read transposed. */
extern "C" void linear_forward_cuda(CudaCtx *ctx, int n, int in, int out, const float *x,
                                    const float *weight, const float *bias, float *y) {
    const float one = 1.0f, zero = 0.0f;
    if (n <= 0) return;
    /* y = bias, then y += x W^T; no bias (NULL, as ops.h allows): y = x W^T */
    if (bias) bias_apply(ctx, (size_t)n, out, bias, y, 0, 0);
    CHECK_CUBLAS(cublasSgemm(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, weight, in, x,
                             in, bias ? &one : &zero, y, out));
}

extern "C" void linear_backward_cuda(CudaCtx *ctx, int n, int in, int out, const float *x,
                                     const float *weight, const float *dy, float *dx,
                                     float *dweight, float *dbias) {
    const float one = 1.0f, zero = 0.0f;
    if (n <= 0) {
        cuda_memset_async(ctx, dweight, 0, (size_t)in * out * sizeof(float));
        if (dbias) cuda_memset_async(ctx, dbias, 0, (size_t)out * sizeof(float));
        return;
    }
    /* dx[n][in] = dy[n][out] * W[out][in]: column-major dx^T (in x n) = W^T (in x out) * dy^T. */
    if (dx)
        CHECK_CUBLAS(cublasSgemm(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_N, in, n, out, &one, weight, in,
                                 dy, out, &zero, dx, in));
    /* dW[out][in] = dy^T x: column-major dW^T (in x out) = x^T (in x n) * dy (n x out). */
    CHECK_CUBLAS(cublasSgemm(ctx->cublas, CUBLAS_OP_N, CUBLAS_OP_T, in, out, n, &one, x, in, dy, out,
                             &zero, dweight, in));
    if (dbias) colsum(ctx, n, out, dy, dbias, 0); /* NULL: no bias gradient, as ops.h allows */
}

/* ---------------------------------------------------------------------- loss */

XENT_ROW_DEFINE(xent_row_f, float, static __device__)

/* One block: each thread handles rows t, t+blockDim, ...; the per-thread sums are
 * then added in a fixed tree order, so the loss is deterministic. Per row, in
 * double as ops_cpu does, with target = off + (1-smoothing)*onehot:
 *   loss = -sum_j target_j * log softmax_j,   dl[j] = (softmax_j - target_j) / n   */
__global__ void softmax_xent_kernel(int n, int k, const float *logits, const int32_t *labels,
                                    float smoothing, float *dlogits, float *loss_out,
                                    int *correct_out, int32_t *pred) {
    __shared__ double sh_loss[OPS_CUDA_BLOCK];
    __shared__ int sh_hits[OPS_CUDA_BLOCK];
    double loss = 0.0;
    int hits = 0;
    const double off = (double)smoothing / k, on = 1.0 - (double)smoothing + off;
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
        int y = labels[i], arg;
        loss += xent_row_f(logits + (size_t)i * k, k, y, on, off, n,
                           dlogits ? dlogits + (size_t)i * k : NULL, &arg);
        hits += arg == y;
        if (pred) pred[i] = arg;
    }
    sh_loss[threadIdx.x] = loss;
    sh_hits[threadIdx.x] = hits;
    __syncthreads();
    for (int half = blockDim.x / 2; half > 0; half /= 2) {
        if ((int)threadIdx.x < half) {
            sh_loss[threadIdx.x] += sh_loss[threadIdx.x + half];
            sh_hits[threadIdx.x] += sh_hits[threadIdx.x + half];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        *loss_out = n > 0 ? (float)(sh_loss[0] / n) : 0.0f;
        if (correct_out) *correct_out = sh_hits[0];
    }
}

extern "C" void softmax_xent_cuda_async(CudaCtx *ctx, int n, int k, const float *logits,
                                        const int32_t *labels, float smoothing, float *dlogits,
                                        float *loss_dev, int *correct_dev, int32_t *pred_dev) {
    softmax_xent_kernel<<<1, OPS_CUDA_BLOCK, 0, ctx->stream>>>(n, k, logits, labels, smoothing,
                                                               dlogits, loss_dev, correct_dev,
                                                               pred_dev);
    CHECK_CUDA_LAST();
}

extern "C" float softmax_xent_forward_backward_cuda(CudaCtx *ctx, int n, int k, const float *logits,
                                                    const int32_t *labels, float smoothing,
                                                    float *dlogits, int *correct) {
    float loss = 0.0f;
    int hits = 0;
    softmax_xent_cuda_async(ctx, n, k, logits, labels, smoothing, dlogits, ctx->loss_dev,
                            ctx->correct_dev, NULL);
    cuda_download(ctx, &loss, ctx->loss_dev, sizeof loss);
    cuda_download(ctx, &hits, ctx->correct_dev, sizeof hits);
    if (correct) *correct = hits;
    return loss;
}

/* ----------------------------------------------------------------- optimizer */

/* PyTorch's SGD rule (ops.h). The explicit _rn operations keep nvcc from fusing
 * multiply-adds, so the arithmetic is the CPU's, operation for operation. */
__global__ void sgd_kernel(size_t n, float *param, const float *grad, float *buf,
                           const uint8_t *mask, float lr_val, const float *lr_dev, float momentum,
                           float wd, int nesterov, int first_val, const int *first_dev) {
    const float lr = lr_dev ? *lr_dev : lr_val;
    const int first = first_dev ? *first_dev : first_val;
    GRID_STRIDE(i, n) {
        float p = param[i];
        float g = grad[i];
        if (!mask || mask[i]) g = __fadd_rn(g, __fmul_rn(wd, p));
        float b = first ? g : __fadd_rn(__fmul_rn(momentum, buf[i]), g);
        buf[i] = b;
        float step = nesterov ? __fadd_rn(g, __fmul_rn(momentum, b)) : b;
        param[i] = __fsub_rn(p, __fmul_rn(lr, step));
    }
}

extern "C" void sgd_update_cuda(CudaCtx *ctx, size_t n, float *param, const float *grad,
                                float *momentum_buf, const uint8_t *decay_mask, float lr,
                                float momentum, float weight_decay, int nesterov, int first_step) {
    if (!n) return;
    sgd_kernel<<<grid_for(n), OPS_CUDA_BLOCK, 0, ctx->stream>>>(
        n, param, grad, momentum_buf, decay_mask, lr, NULL, momentum, weight_decay, nesterov,
        first_step, NULL);
    CHECK_CUDA_LAST();
}

extern "C" void sgd_update_cuda_dev(CudaCtx *ctx, size_t n, float *param, const float *grad,
                                    float *momentum_buf, const uint8_t *decay_mask,
                                    const float *lr_dev, float momentum, float weight_decay,
                                    int nesterov, const int *first_step_dev) {
    if (!n) return;
    sgd_kernel<<<grid_for(n), OPS_CUDA_BLOCK, 0, ctx->stream>>>(
        n, param, grad, momentum_buf, decay_mask, 0.0f, lr_dev, momentum, weight_decay, nesterov, 0,
        first_step_dev);
    CHECK_CUDA_LAST();
}

/* ---------------------------------------------------------------- batch norm */

/* Our own NHWC kernels (bn_nhwc.h has the arithmetic and the reduction order): two
 * launches per batch norm, forward or backward, any number of rows, deterministic,
 * ReLU / residual add / the conv bias of a fused conv + BN (net_cuda.cu) fused in. The reduction's last block per
 * channel tile finalises the statistics: the blocks of a tile count themselves in
 * ctx->bn_counters (one unsigned per tile, atomicInc back to 0 by the tile's last
 * block, so graph replays start clean) after a __threadfence() that makes their
 * partials visible (the CUDA Programming Guide's "last block" reduction pattern,
 * its threadFenceReduction sample). */

struct BnFwdArgs {
    const float *x, *bias, *gamma, *beta;
    float *save_mean, *save_invstd, *running_mean, *running_var, *aff;
    float momentum, eps;
};

struct BnBwdArgs {
    const float *x, *y, *dy, *gamma, *save_mean, *save_invstd;
    float *dgamma, *dbeta, *k, *dsum;
};

/* Shared-memory staging of one block's lane sums: [K][lane][channel of the tile]. */
template <int K>
using BnShared = double[K][BN_LANES][BN_TILE + 1];

/* Block (tile, chunk p) of the reduction: the per-lane sums of chunk p for the
 * tile's channels, the lanes added in order into partial[p][k][ch]. Lane work is
 * bn_nhwc.h's. Ends with sh still read by row 0: the caller syncs before reusing it. */
template <int K, class Lane>
__device__ void bn_tile_partial(int tile, int p, int c, double *partial, Lane lane_sums,
                                BnShared<K> &sh) {
    const int tx = threadIdx.x, ty = threadIdx.y, ch = tile * BN_TILE + tx;
    double s[K];
    for (int k = 0; k < K; k++) s[k] = 0.0;
    if (ch < c) lane_sums(ch, p, ty, s);
    for (int k = 0; k < K; k++) sh[k][ty][tx] = s[k];
    __syncthreads();
    if (ty == 0 && ch < c) {
        for (int k = 0; k < K; k++) {
            double t = 0.0;
            for (int l = 0; l < BN_LANES; l++) t += sh[k][l][tx];
            partial[((size_t)p * K + k) * c + ch] = t;
        }
    }
}

/* Tile `tile` once every chunk's partial is in: lane l adds chunks l, l + BN_LANES,
 * ..., the lanes are added in order, and fin(ch, totals) is called per channel. */
template <int K, class Final>
__device__ void bn_tile_final(int tile, int c, int chunks, const double *partial, Final fin,
                              BnShared<K> &sh) {
    const int tx = threadIdx.x, ty = threadIdx.y, ch = tile * BN_TILE + tx;
    double s[K];
    for (int k = 0; k < K; k++) s[k] = 0.0;
    if (ch < c)
#pragma unroll 8
        for (int q = ty; q < chunks; q += BN_LANES)
            for (int k = 0; k < K; k++) s[k] += __ldcg(&partial[((size_t)q * K + k) * c + ch]);
    for (int k = 0; k < K; k++) sh[k][ty][tx] = s[k];
    __syncthreads();
    if (ty == 0 && ch < c) {
        double t[K];
        for (int k = 0; k < K; k++) {
            t[k] = 0.0;
            for (int l = 0; l < BN_LANES; l++) t[k] += sh[k][l][tx];
        }
        fin(ch, t);
    }
}

/* The two-kernel reduction's block (tile blockIdx.x, chunk blockIdx.y): its
 * partial, then, in the tile's last block to finish, the tile's final. */
template <int K, class Lane, class Final>
__device__ void bn_reduce_tile(int64_t rows, int c, int chunks, double *partial,
                               unsigned *counters, Lane lane_sums, Final fin) {
    __shared__ BnShared<K> sh;
    __shared__ int is_last;
    (void)rows;
    bn_tile_partial<K>((int)blockIdx.x, (int)blockIdx.y, c, partial, lane_sums, sh);
    if (threadIdx.y == 0) __threadfence(); /* the partials reach device memory before the count */
    __syncthreads();
    /* atomicInc wraps to 0 on the tile's last block: the counter is ready for the
     * next launch (or graph replay) without a store of its own */
    if (threadIdx.x == 0 && threadIdx.y == 0)
        is_last = atomicInc(&counters[blockIdx.x], gridDim.y - 1) == gridDim.y - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    bn_tile_final<K>((int)blockIdx.x, c, chunks, partial, fin, sh);
}

/* The one-kernel (cooperative) batch norm, bn_nhwc.h "cooperative order": the
 * partials of every (tile, chunk) item, grid barrier, the finals of every tile, grid
 * barrier, the element-wise pass. Every sum is the two-kernel path's in its order. */
template <int K, class Lane, class Final, class Apply>
__device__ void bn_coop_run(int64_t rows, int c, int chunks, double *partial, Lane lane_sums,
                            Final fin, Apply apply) {
    __shared__ BnShared<K> sh;
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    const int tiles = bn_tiles(c);
    for (int64_t w = blockIdx.x; w < (int64_t)tiles * chunks; w += gridDim.x) {
        int tile, p;
        bn_coop_item(w, tiles, &tile, &p);
        bn_tile_partial<K>(tile, p, c, partial, lane_sums, sh);
        __syncthreads(); /* sh is rewritten by the next item */
    }
    grid.sync(); /* every partial written (grid.sync orders global memory) */
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        bn_tile_final<K>(t, c, chunks, partial, fin, sh);
        __syncthreads();
    }
    grid.sync(); /* every channel's affine or coefficients written */
    const int64_t step = bn_coop_elem_step((int)gridDim.x); /* blocks of BN_TILE x BN_LANES */
    for (int64_t i = bn_coop_elem0((int)blockIdx.x, (int)threadIdx.y, (int)threadIdx.x); i < rows * c;
         i += step)
        apply(i);
}

template <int BF16>
__global__ void bn_fwd_reduce_kernel(int64_t rows, int c, int chunks, BnFwdArgs a, double *partial,
                                     unsigned *counters) {
    bn_reduce_tile<2>(
        rows, c, chunks, partial, counters,
        [&](int ch, int p, int lane, double *s) { bn_fwd_lane(a.x, a.bias, rows, c, chunks, ch, p, lane, s, BF16); },
        [&](int ch, const double *t) {
            bn_fwd_final(rows, c, ch, a.x, a.bias, t, a.gamma, a.beta, a.momentum, a.eps, a.save_mean,
                         a.save_invstd, a.running_mean, a.running_var, a.aff, BF16);
        });
}

template <int BF16>
__global__ void bn_bwd_reduce_kernel(int64_t rows, int c, int chunks, BnBwdArgs a, double *partial,
                                     unsigned *counters) {
    bn_reduce_tile<3>(
        rows, c, chunks, partial, counters,
        [&](int ch, int p, int lane, double *s) {
            bn_bwd_lane(a.x, a.y, a.dy, a.save_mean, rows, c, chunks, ch, p, lane, s, BF16);
        },
        [&](int ch, const double *t) {
            bn_bwd_final(rows, c, ch, t, a.gamma, a.save_mean, a.save_invstd, a.dgamma, a.dbeta, a.k,
                         a.dsum);
        });
}

template <int BF16>
__global__ void bn_fwd_coop_kernel(int64_t rows, int c, int chunks, BnFwdArgs a, const float *z,
                                   int mode, float *y, double *partial) {
    bn_coop_run<2>(
        rows, c, chunks, partial,
        [&](int ch, int p, int lane, double *s) { bn_fwd_lane(a.x, a.bias, rows, c, chunks, ch, p, lane, s, BF16); },
        [&](int ch, const double *t) {
            bn_fwd_final(rows, c, ch, a.x, a.bias, t, a.gamma, a.beta, a.momentum, a.eps, a.save_mean,
                         a.save_invstd, a.running_mean, a.running_var, a.aff, BF16);
        },
        [&](int64_t i) { bn_fwd_apply(i, c, (float *)a.x, a.bias, a.aff, z, mode, y, BF16); });
}

/* keep: the masked dy written back into dy (bn_bwd_apply_keep); dx NULL: no pass. */
template <int BF16>
__global__ void bn_bwd_coop_kernel(int64_t rows, int c, int chunks, BnBwdArgs a, float *dx, int keep,
                                   double *partial) {
    bn_coop_run<3>(
        rows, c, chunks, partial,
        [&](int ch, int p, int lane, double *s) {
            bn_bwd_lane(a.x, a.y, a.dy, a.save_mean, rows, c, chunks, ch, p, lane, s, BF16);
        },
        [&](int ch, const double *t) {
            bn_bwd_final(rows, c, ch, t, a.gamma, a.save_mean, a.save_invstd, a.dgamma, a.dbeta, a.k,
                         a.dsum);
        },
        [&](int64_t i) {
            if (!dx) return;
            if (keep)
                bn_bwd_apply_keep(i, c, a.x, a.y, (float *)a.dy, a.k, dx, BF16);
            else
                bn_bwd_apply(i, c, a.x, a.y, a.dy, a.k, dx, BF16);
        });
}

__global__ void bn_eval_final_kernel(int c, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var, float eps,
                                     float *aff) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch < c) bn_eval_final(c, ch, gamma, beta, running_mean, running_var, eps, aff);
}

template <int BF16>
__global__ void bn_fwd_apply_kernel(size_t total, int c, float *x, const float *bias,
                                    const float *aff, const float *z, int mode, float *y) {
    GRID_STRIDE(i, total) bn_fwd_apply((int64_t)i, c, x, bias, aff, z, mode, y, BF16);
}

template <int BF16>
__global__ void bn_bwd_apply_kernel(size_t total, int c, const float *x, const float *y,
                                    const float *dy, const float *k, float *dx) {
    GRID_STRIDE(i, total) bn_bwd_apply((int64_t)i, c, x, y, dy, k, dx, BF16);
}

template <int BF16>
__global__ void bn_bwd_apply_keep_kernel(size_t total, int c, const float *x, const float *y,
                                         float *dy, const float *k, float *dx) {
    GRID_STRIDE(i, total) bn_bwd_apply_keep((int64_t)i, c, x, y, dy, k, dx, BF16);
}

/* rows = n*hw, checked against the scratch the context holds. */
static int64_t bn_rows(int n, int hw, int c) {
    if (n < 1 || hw < 1 || c < 1) die("batch norm over %d x %d rows of %d channels: empty", n, hw, c);
    if (c > BN_MAX_C) die("batch norm over %d channels: the CUDA kernels take at most %d", c, BN_MAX_C);
    return (int64_t)n * hw;
}

static dim3 bn_grid(int64_t rows, int c) {
    return dim3((unsigned)((c + BN_TILE - 1) / BN_TILE), (unsigned)bn_chunks(rows, c));
}

/* ---- one cooperative kernel per training batch norm ----
 * Cooperative launches may be captured into a CUDA graph (CUDA 12+: a kernel node's
 * cudaLaunchAttributeCooperative, "valid for graph nodes, launches", driver_types.h).
 * cudaGraphExecUpdate cannot turn a cooperative node into a plain one or back
 * (cuda_runtime_api.h): after cuda_ctx_bn_coop switches, recapture (the engine never
 * updates a graph). The grid is at most what the
 * occupancy calculator says fits at once (blocks per SM x SMs), as a grid barrier
 * needs; the launch fails rather than deadlocks when it would not fit
 * (cudaErrorCooperativeLaunchTooLarge). CIFAR_CUDA_BN_COOP=0 turns it off. */

static int imin(int a, int b) { return a < b ? a : b; }

/* Blocks of kernel that fit on the device at once, 0 when none. */
template <class Kernel>
static int bn_coop_max_blocks(Kernel kernel, int sms) {
    int per_sm = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, BN_TILE * BN_LANES, 0));
    return per_sm * sms;
}

/* bn_coop 0: two kernels (CIFAR_CUDA_BN_COOP=0, Settings.cuda_bn_coop). */
static void bn_coop_plan(CudaCtx *ctx, int bn_coop) {
    static int logged;
    int coop = 0, sms = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, ctx->device));
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device));
    int off = !bn_coop;
    if (coop) {
        /* one grid size for both activation types: the smaller fit */
        ctx->bn_coop_fwd_blocks = imin(bn_coop_max_blocks(bn_fwd_coop_kernel<0>, sms),
                                       bn_coop_max_blocks(bn_fwd_coop_kernel<1>, sms));
        ctx->bn_coop_bwd_blocks = imin(bn_coop_max_blocks(bn_bwd_coop_kernel<0>, sms),
                                       bn_coop_max_blocks(bn_bwd_coop_kernel<1>, sms));
    }
    int fits = ctx->bn_coop_fwd_blocks > 0 && ctx->bn_coop_bwd_blocks > 0;
    ctx->bn_coop_on = coop && fits && !off;
    if (logged++) return;
    if (ctx->bn_coop_on)
        log_info("batch norm: one cooperative kernel per training batch norm (grids of up to %d "
                 "and %d blocks)", ctx->bn_coop_fwd_blocks, ctx->bn_coop_bwd_blocks);
    else
        log_info("batch norm: two kernels per training batch norm (%s)",
                 off ? "CIFAR_CUDA_BN_COOP=0" : !coop ? "the device has no cooperative launch"
                                                      : "a cooperative grid does not fit");
}

extern "C" int cuda_ctx_bn_coop(CudaCtx *ctx, int enable) {
    if (enable >= 0)
        ctx->bn_coop_on = enable && ctx->bn_coop_fwd_blocks > 0 && ctx->bn_coop_bwd_blocks > 0;
    return ctx->bn_coop_on;
}

extern "C" void cuda_ctx_bn_coop_caps(CudaCtx *ctx, int *fwd, int *bwd) {
    int f = ctx->bn_coop_fwd_blocks, b = ctx->bn_coop_bwd_blocks;
    ctx->bn_coop_fwd_blocks = *fwd;
    ctx->bn_coop_bwd_blocks = *bwd;
    *fwd = f;
    *bwd = b;
}

/* The grid of a cooperative batch norm: enough blocks for every (tile, chunk) item
 * and every element once, capped by what fits at once. */
static unsigned bn_coop_grid(int64_t rows, int c, int max_blocks) {
    int64_t items = (int64_t)bn_tiles(c) * bn_chunks(rows, c);
    int64_t elems = (rows * c + BN_TILE * BN_LANES - 1) / (BN_TILE * BN_LANES);
    int64_t want = items > elems ? items : elems;
    return (unsigned)(want < max_blocks ? want : max_blocks);
}

/* A cooperative launch the runtime refused outside a capture (the grid no longer fits
 * because the GPU is shared or limited now, MPS, or cooperative launches are not
 * supported there): the context turns to two kernels per batch norm for good, said
 * once, and 0 is returned so that the caller launches them. The refusal happens at
 * launch, before anything runs, and is not sticky (cleared here). Inside a capture
 * the error is fatal to the capture, whose guard ends it and runs the step (and every
 * later one: no capture again) eagerly, where this fallback then applies; the first
 * full step is eager anyway, so a
 * refusal is normally met before any capture. */
static int bn_coop_refused(CudaCtx *ctx, cudaError_t rc) {
    int refusal = rc == cudaErrorCooperativeLaunchTooLarge || rc == cudaErrorNotSupported;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    /* only for a refusal: any other error (a sticky one of an earlier kernel too, which
     * cudaStreamIsCapturing would return as its own) is reported as the launch's */
    if (refusal) CHECK_CUDA(cudaStreamIsCapturing(ctx->stream, &capturing));
    if (!refusal || capturing != cudaStreamCaptureStatusNone)
        check_fail(__FILE__, __LINE__, "cudaLaunchKernelEx (a cooperative batch norm)",
                   cudaGetErrorString(rc), cuda_check_hint(rc));
    (void)cudaGetLastError(); /* the refusal is the thread's last error: the next check reads it */
    ctx->bn_coop_on = 0;
    log_warn("batch norm: the GPU refused a cooperative launch (%s); two kernels per batch norm "
             "from now on", cudaGetErrorString(rc));
    return 0;
}

/* Launches kernel cooperatively on the context's stream: 1, or 0 when the launch was
 * refused and the context turned to two kernels (bn_coop_refused). */
template <class... Params, class... Args>
static int bn_coop_launch(CudaCtx *ctx, unsigned blocks, void (*kernel)(Params...), Args... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(BN_TILE, BN_LANES);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = ctx->stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaError_t rc = cudaLaunchKernelEx(&cfg, kernel, args...);
    return rc == cudaSuccess ? 1 : bn_coop_refused(ctx, rc);
}

/* bn_coop_launch of kernel<1> (bf16 activations) or kernel<0>, as ACT_LAUNCH: 1 when
 * launched, 0 when refused (then launch the two kernels). */
#define BN_COOP_LAUNCH(ctx, blocks, kernel, ...)                                               \
    ((ctx)->bf16 ? bn_coop_launch(ctx, blocks, kernel<1>, __VA_ARGS__)                         \
                 : bn_coop_launch(ctx, blocks, kernel<0>, __VA_ARGS__))

/* Training forward: the reduction, then y by mode (x_bias: the bias of the conv whose
 * output x is, not yet added (net_cuda.cu's conv_bn_forward): added to x as it is read
 * and written back into x). */
static void bn_train_run(CudaCtx *ctx, int n, int hw, int c, const float *x, const float *x_bias,
                         const float *gamma, const float *beta, const float *z, int mode, float *y,
                         float *save_mean, float *save_invstd, float *running_mean,
                         float *running_var, float momentum, float eps) {
    int64_t rows = bn_rows(n, hw, c);
    BnFwdArgs a = {x, x_bias, gamma, beta, save_mean, save_invstd, running_mean, running_var,
                   ctx->bn_aff, momentum, eps};
    /* one kernel, the same sums in the same order; two where it is off or refused */
    if (ctx->bn_coop_on &&
        BN_COOP_LAUNCH(ctx, bn_coop_grid(rows, c, ctx->bn_coop_fwd_blocks), bn_fwd_coop_kernel, rows,
                       c, bn_chunks(rows, c), a, z, mode, y, ctx->bn_partial))
        return;
    ACT_LAUNCH(ctx, ctx->bf16, bn_fwd_reduce_kernel, bn_grid(rows, c), dim3(BN_TILE, BN_LANES),
               rows, c, bn_chunks(rows, c), a, ctx->bn_partial, ctx->bn_counters);
    size_t total = (size_t)rows * c;
    ACT_LAUNCH(ctx, ctx->bf16, bn_fwd_apply_kernel, grid_for(total), OPS_CUDA_BLOCK,
               total, c, (float *)x, x_bias, ctx->bn_aff, z, mode, y);
}

extern "C" void batchnorm2d_forward_train_cuda(CudaCtx *ctx, int n, int hw, int c, const float *x,
                                               const float *x_bias, const float *gamma,
                                               const float *beta, float *y, float *save_mean,
                                               float *save_invstd, float *running_mean,
                                               float *running_var, float momentum, float eps) {
    bn_train_run(ctx, n, hw, c, x, x_bias, gamma, beta, NULL, BN_PLAIN, y, save_mean, save_invstd,
                 running_mean, running_var, momentum, eps);
}

extern "C" void batchnorm2d_relu_forward_train_cuda(CudaCtx *ctx, int n, int hw, int c,
                                                    const float *x, const float *x_bias,
                                                    const float *gamma, const float *beta, float *y,
                                                    float *save_mean, float *save_invstd,
                                                    float *running_mean, float *running_var,
                                                    float momentum, float eps) {
    bn_train_run(ctx, n, hw, c, x, x_bias, gamma, beta, NULL, BN_RELU, y, save_mean, save_invstd,
                 running_mean, running_var, momentum, eps);
}

extern "C" void batchnorm2d_add_relu_forward_train_cuda(CudaCtx *ctx, int n, int hw, int c,
                                                        const float *x, const float *x_bias,
                                                        const float *gamma, const float *beta,
                                                        const float *z, float *y, float *save_mean,
                                                        float *save_invstd, float *running_mean,
                                                        float *running_var, float momentum,
                                                        float eps) {
    bn_train_run(ctx, n, hw, c, x, x_bias, gamma, beta, z, BN_ADD_RELU, y, save_mean, save_invstd,
                 running_mean, running_var, momentum, eps);
}

extern "C" void batchnorm2d_forward_eval_cuda(CudaCtx *ctx, int n, int hw, int c, const float *x,
                                              const float *x_bias, const float *gamma,
                                              const float *beta, const float *running_mean,
                                              const float *running_var, float eps, float *y) {
    int64_t rows = bn_rows(n, hw, c);
    bn_eval_final_kernel<<<(unsigned)((c + 127) / 128), 128, 0, ctx->stream>>>(
        c, gamma, beta, running_mean, running_var, eps, ctx->bn_aff);
    CHECK_CUDA_LAST();
    size_t total = (size_t)rows * c;
    ACT_LAUNCH(ctx, ctx->bf16, bn_fwd_apply_kernel, grid_for(total), OPS_CUDA_BLOCK,
               total, c, (float *)x, x_bias, ctx->bn_aff, (const float *)NULL, (int)BN_PLAIN, y);
}

/* The backward reduction of rows x c (with the finalisation: dgamma, dbeta, the
 * coefficients into ctx->bn_aff, dsum). */
static void bn_bwd_reduce_launch(CudaCtx *ctx, int64_t rows, int c, const BnBwdArgs &a) {
    ACT_LAUNCH(ctx, ctx->bf16, bn_bwd_reduce_kernel, bn_grid(rows, c), dim3(BN_TILE, BN_LANES),
               rows, c, bn_chunks(rows, c), a, ctx->bn_partial, ctx->bn_counters);
}

/* The backward as one cooperative kernel (dx non-NULL; keep: bn_bwd_apply_keep);
 * 0 when the context has it off or the launch was refused (the caller launches the
 * two kernels). */
static int bn_bwd_coop_launch(CudaCtx *ctx, int64_t rows, int c, const BnBwdArgs &a, float *dx,
                              int keep) {
    if (!ctx->bn_coop_on) return 0;
    return BN_COOP_LAUNCH(ctx, bn_coop_grid(rows, c, ctx->bn_coop_bwd_blocks), bn_bwd_coop_kernel,
                          rows, c, bn_chunks(rows, c), a, dx, keep, ctx->bn_partial);
}

/* Backward (y: the ReLU output after the BN, or NULL): the reduction, then dx. The
 * column sum of dx (the gradient of a conv bias in front) goes to dsum. keep (y and dx
 * non-NULL, dy writable): the masked dy is also written back into dy
 * (bn_bwd_apply_keep). */
static void bn_backward_run(CudaCtx *ctx, int n, int hw, int c, const float *x, const float *y,
                            const float *gamma, const float *save_mean, const float *save_invstd,
                            const float *dy, float *dx, float *dgamma, float *dbeta, float *dsum,
                            int keep) {
    int64_t rows = bn_rows(n, hw, c);
    BnBwdArgs a = {x, y, dy, gamma, save_mean, save_invstd, dgamma, dbeta, ctx->bn_aff, dsum};
    if (dx && bn_bwd_coop_launch(ctx, rows, c, a, dx, keep)) return;
    bn_bwd_reduce_launch(ctx, rows, c, a);
    if (!dx) return;
    size_t total = (size_t)rows * c;
    if (keep)
        ACT_LAUNCH(ctx, ctx->bf16, bn_bwd_apply_keep_kernel, grid_for(total), OPS_CUDA_BLOCK,
                   total, c, x, y, (float *)dy, (const float *)ctx->bn_aff, dx);
    else
        ACT_LAUNCH(ctx, ctx->bf16, bn_bwd_apply_kernel, grid_for(total), OPS_CUDA_BLOCK,
                   total, c, x, y, dy, (const float *)ctx->bn_aff, dx);
}

/* The keep form's contract: the ReLU output y, and a dx that is not dy. */
static void bn_keep_check(const float *y, const float *dy, const float *dx) {
    if (!y || !dx || dx == dy)
        die("batch norm backward keeping the masked dy: needs y and a dx other than dy "
            "(internal error)");
}

extern "C" void batchnorm2d_relu_backward_keep_cuda(CudaCtx *ctx, int n, int hw, int c,
                                                    const float *x, const float *y,
                                                    const float *gamma, const float *save_mean,
                                                    const float *save_invstd, float *dy, float *dx,
                                                    float *dgamma, float *dbeta) {
    bn_keep_check(y, dy, dx);
    bn_backward_run(ctx, n, hw, c, x, y, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta,
                    ctx->bn_dsum, 1);
}

extern "C" void batchnorm2d_backward_cuda(CudaCtx *ctx, int n, int hw, int c, const float *x,
                                          const float *gamma, const float *save_mean,
                                          const float *save_invstd, const float *dy, float *dx,
                                          float *dgamma, float *dbeta) {
    bn_backward_run(ctx, n, hw, c, x, NULL, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta,
                    ctx->bn_dsum, 0);
}

extern "C" void batchnorm2d_relu_backward_cuda(CudaCtx *ctx, int n, int hw, int c, const float *x,
                                               const float *y, const float *gamma,
                                               const float *save_mean, const float *save_invstd,
                                               const float *dy, float *dx, float *dgamma,
                                               float *dbeta) {
    bn_backward_run(ctx, n, hw, c, x, y, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta,
                    ctx->bn_dsum, 0);
}

extern "C" void batchnorm2d_backward_bias_cuda(CudaCtx *ctx, int n, int hw, int c, const float *x,
                                               const float *y, const float *gamma,
                                               const float *save_mean, const float *save_invstd,
                                               float *dy, float *dx, float *dgamma, float *dbeta,
                                               float *dbias, int keep) {
    if (keep) bn_keep_check(y, dy, dx);
    bn_backward_run(ctx, n, hw, c, x, y, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta,
                    dbias ? dbias : ctx->bn_dsum, keep);
}

/* --------------------------------------------------------------- convolution */

__global__ void weight_to_krsc_kernel(int cout, int cin, int k, const float *kcrs, float *krsc) {
    size_t total = (size_t)cout * cin * k * k;
    GRID_STRIDE(i, total) {
        /* i indexes kcrs: ((o*cin + c)*k + r)*k + s */
        size_t s = i % k, r = (i / k) % k, c = (i / ((size_t)k * k)) % cin, o = i / ((size_t)k * k * cin);
        krsc[((o * k + r) * k + s) * cin + c] = kcrs[i];
    }
}

__global__ void weight_from_krsc_kernel(int cout, int cin, int k, const float *krsc, float *kcrs) {
    size_t total = (size_t)cout * cin * k * k;
    GRID_STRIDE(i, total) {
        size_t s = i % k, r = (i / k) % k, c = (i / ((size_t)k * k)) % cin, o = i / ((size_t)k * k * cin);
        kcrs[i] = krsc[((o * k + r) * k + s) * cin + c];
    }
}

extern "C" void conv_weight_to_krsc_cuda(CudaCtx *ctx, const ConvSpec *cs, const float *kcrs,
                                         float *krsc) {
    size_t total = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    weight_to_krsc_kernel<<<grid_for(total), OPS_CUDA_BLOCK, 0, ctx->stream>>>(cs->cout, cs->cin, cs->k,
                                                                               kcrs, krsc);
    CHECK_CUDA_LAST();
}

extern "C" void conv_weight_from_krsc_cuda(CudaCtx *ctx, const ConvSpec *cs, const float *krsc,
                                           float *kcrs) {
    size_t total = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    weight_from_krsc_kernel<<<grid_for(total), OPS_CUDA_BLOCK, 0, ctx->stream>>>(cs->cout, cs->cin,
                                                                                 cs->k, krsc, kcrs);
    CHECK_CUDA_LAST();
}

struct ConvCuda {
    ConvSpec cs;
    int max_n, h, w, oh, ow;
    size_t ws_limit, ws_bytes;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    /* Chosen at max_n, and in use for cur_n (fallbacks when they need more workspace). */
    cudnnConvolutionFwdAlgo_t fwd, cur_fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data, cur_bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter, cur_bwd_filter;
    cudnnMathType_t math_fwd, math_bwd_data, math_bwd_filter;
    int cur_n;
    int backward; /* 0: inference only (forward algorithm only) */
    unsigned passes; /* conv_plan_passes: the stem's has no CONV_PASS_BWD_DATA */
    cudnnDataType_t dtype; /* of x, w and y: float, or bfloat16 (bf16 context) */
    char desc[192];
};

/* fp32: plain FMA math only (cuDNN's default would allow TF32 for float data);
 * tf32: tensor-op math, never the fp16 down-conversion. */
static int conv_math_ok(const CudaCtx *ctx, cudnnMathType_t m) {
    if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return 0;
    return ctx->tf32 || ctx->bf16 || m != CUDNN_TENSOR_OP_MATH;
}

/* bf16: cuDNN's PSEUDO_BFLOAT16 configuration (x, w, y in bfloat16, the convolution
 * computed in float: CUDNN_DATA_FLOAT in the convolution descriptor), tensor-op math
 * (bfloat16 tensor cores: compute capability 8.0 and newer, checked by the engine). */
static cudnnMathType_t conv_base_math(const CudaCtx *ctx) {
    return ctx->tf32 || ctx->bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

static cudnnMathType_t conv_chosen_math(const CudaCtx *ctx, cudnnMathType_t m) {
    return ctx->tf32 || ctx->bf16 ? m : CUDNN_FMA_MATH;
}

static cudnnDataType_t conv_data_type(const CudaCtx *ctx) {
    return ctx->bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static const char *conv_math_name(const CudaCtx *ctx) {
    return ctx->bf16 ? "bf16" : ctx->tf32 ? "tf32" : "fp32";
}

/* cuDNN's tensor descriptors take int dimensions and at most 2^31-1 elements
 * (the cuDNN API reference on cudnnSetTensor4dDescriptor): refuse larger batches
 * with the reason rather than a bad-parameter status. */
static void conv_check_elements(const ConvCuda *cv, int n) {
    int64_t in = (int64_t)n * cv->h * cv->w * cv->cs.cin, out = (int64_t)n * cv->oh * cv->ow * cv->cs.cout;
    if (in > INT32_MAX || out > INT32_MAX)
        die("convolution on %d images of %dx%dx%d: %lld elements, more than cuDNN's 2^31-1 per tensor: "
            "lower --batch-size", n, cv->h, cv->w, cv->cs.cin, (long long)(in > out ? in : out));
}

static void conv_set_batch_desc(ConvCuda *cv, int n) {
    conv_check_elements(cv, n);
    CHECK_CUDNN(cudnnSetTensor4dDescriptor(cv->xd, CUDNN_TENSOR_NHWC, cv->dtype, n, cv->cs.cin,
                                           cv->h, cv->w));
    CHECK_CUDNN(cudnnSetTensor4dDescriptor(cv->yd, CUDNN_TENSOR_NHWC, cv->dtype, n, cv->cs.cout,
                                           cv->oh, cv->ow));
}

/* Workspace of algorithm a run with math m, for the batch size now in the
 * descriptors; (size_t)-1 when cuDNN rejects the pair for this shape: the
 * cudnnGetConvolution*WorkspaceSize functions return CUDNN_STATUS_NOT_SUPPORTED for
 * a descriptor combination the algorithm does not support (cuDNN 9 API reference,
 * cudnn_cnn library), and an algorithm cudnnFind* listed can still be refused there
 * (NVIDIA developer forum, "Algorithm recommended by
 * cudnnFindConvolutionForwardAlgorithm fails to run when output channels are not a
 * multiple of 8": NOT_SUPPORTED from the workspace query). The math is set first:
 * the size, and whether the algorithm runs at all, depend on it. */
static size_t conv_ws_fwd(CudaCtx *ctx, ConvCuda *cv, cudnnConvolutionFwdAlgo_t a, cudnnMathType_t m) {
    size_t b = 0;
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, m));
    if (cudnnGetConvolutionForwardWorkspaceSize(ctx->cudnn, cv->xd, cv->wd, cv->cd, cv->yd, a, &b) !=
        CUDNN_STATUS_SUCCESS)
        return (size_t)-1;
    return b;
}

static size_t conv_ws_bwd_data(CudaCtx *ctx, ConvCuda *cv, cudnnConvolutionBwdDataAlgo_t a,
                               cudnnMathType_t m) {
    size_t b = 0;
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, m));
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(ctx->cudnn, cv->wd, cv->yd, cv->cd, cv->xd, a, &b) !=
        CUDNN_STATUS_SUCCESS)
        return (size_t)-1;
    return b;
}

static size_t conv_ws_bwd_filter(CudaCtx *ctx, ConvCuda *cv, cudnnConvolutionBwdFilterAlgo_t a,
                                 cudnnMathType_t m) {
    size_t b = 0;
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, m));
    if (cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx->cudnn, cv->xd, cv->yd, cv->cd, cv->wd, a,
                                                       &b) != CUDNN_STATUS_SUCCESS)
        return (size_t)-1;
    return b;
}

/* conv_pick's workspace queries (conv_pick.h's ConvWsQuery), one per pass. */
typedef struct {
    CudaCtx *ctx;
    ConvCuda *cv;
} ConvQuery;

static int conv_query_fwd(void *u, int algo, int math, size_t *bytes) {
    ConvQuery *q = (ConvQuery *)u;
    *bytes = conv_ws_fwd(q->ctx, q->cv, (cudnnConvolutionFwdAlgo_t)algo, (cudnnMathType_t)math);
    return *bytes == (size_t)-1;
}

static int conv_query_bwd_data(void *u, int algo, int math, size_t *bytes) {
    ConvQuery *q = (ConvQuery *)u;
    *bytes = conv_ws_bwd_data(q->ctx, q->cv, (cudnnConvolutionBwdDataAlgo_t)algo, (cudnnMathType_t)math);
    return *bytes == (size_t)-1;
}

static int conv_query_bwd_filter(void *u, int algo, int math, size_t *bytes) {
    ConvQuery *q = (ConvQuery *)u;
    *bytes = conv_ws_bwd_filter(q->ctx, q->cv, (cudnnConvolutionBwdFilterAlgo_t)algo, (cudnnMathType_t)math);
    return *bytes == (size_t)-1;
}

/* cuDNN's list as candidates (cudnnConvolution*AlgoPerf_t: algo, status, memory,
 * determinism, mathType), then, unless determinism is asked, the pass's
 * workspace-free default with the base math (the default is not known to be
 * deterministic for every shape). Returns the count (at most got + 1). */
template <typename Perf>
static int conv_candidates(const CudaCtx *ctx, const Perf *perf, int got, int dflt, ConvCandidate *out) {
    int n = 0;
    for (int i = 0; i < got; i++, n++) {
        out[n].algo = (int)perf[i].algo;
        out[n].math = (int)conv_chosen_math(ctx, perf[i].mathType);
        out[n].status = (int)perf[i].status;
        out[n].succeeded = perf[i].status == CUDNN_STATUS_SUCCESS;
        out[n].math_allowed = conv_math_ok(ctx, perf[i].mathType);
        out[n].deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
    }
    if (!ctx->deterministic) {
        out[n].algo = dflt;
        out[n].math = (int)conv_base_math(ctx);
        out[n].status = (int)CUDNN_STATUS_SUCCESS;
        out[n].succeeded = out[n].math_allowed = 1;
        out[n].deterministic = 0;
        n++;
    }
    return n;
}

/* No candidate fits: every candidate with what became of it (so the user sees why),
 * cuDNN's last error message, then exit. */
__attribute__((noreturn)) static void conv_none_fits(const CudaCtx *ctx, const ConvCuda *cv,
                                                     const char *pass, const ConvCandidate *c,
                                                     const ConvTried *tried, int n) {
    char last[256] = "";
    cudnnGetLastErrorString(last, sizeof last);
    log_error("cuDNN %s of conv %dx%d stride %d, %d -> %d channels on %dx%dx%d: no candidate fits "
              "(%s, workspace limit %zu bytes, math %s); tried:",
              pass, cv->cs.k, cv->cs.k, cv->cs.stride, cv->cs.cin, cv->cs.cout, cv->max_n, cv->h, cv->w,
              ctx->deterministic ? "deterministic only" : "any determinism", cv->ws_limit,
              conv_math_name(ctx));
    log_error("  algo  status                          deterministic  math  verdict                     workspace");
    for (int i = 0; i < n; i++)
        log_error("  %4d  %-30s  %-13s  %4d  %-26s  %zu", c[i].algo,
                  cudnnGetErrorString((cudnnStatus_t)c[i].status), c[i].deterministic ? "yes" : "no",
                  c[i].math, conv_try_name(tried[i].verdict), tried[i].ws);
    check_fail(__FILE__, __LINE__, "cuDNN convolution algorithm", last[0] ? last : pass,
               ctx->deterministic ? "run without --deterministic, or try --precision fp32 or another cuDNN version"
                                  : "try --precision fp32 or another cuDNN version");
}

/* The candidate conv_pick takes (the picked index), or the table and exit. */
static int conv_pick_or_die(CudaCtx *ctx, ConvCuda *cv, const char *pass, const ConvCandidate *c, int n,
                            ConvWsQuery query, size_t *ws) {
    std::vector<ConvTried> tried((size_t)n + 1);
    ConvQuery q = {ctx, cv};
    int at = conv_pick(c, n, ctx->deterministic, cv->ws_limit, query, &q, tried.data());
    if (at < 0) conv_none_fits(ctx, cv, pass, c, tried.data(), n);
    *ws = tried[at].ws;
    return at;
}

/* One pass (forward, backward data, backward filter): its candidates measured by
 * cudnnFind* (sorted by time), or ranked by heuristics (cudnnGet*_v7) when
 * deterministic; the first whose workspace, sized with the math it will run with,
 * fits (conv_pick.h). Find and Get see the base math (the previous pass's workspace
 * queries changed it). The list asked for is as long as
 * cudnnGetConvolution*AlgorithmMaxCount says these calls can return (the cuDNN API
 * reference on cudnnGetConvolutionForwardAlgorithmMaxCount: "the sum of all
 * algorithms plus the sum of all algorithms with Tensor Core operations supported for
 * the current device"), not the enum's *_ALGO_COUNT: with an entry per algorithm and
 * math type both calls can list more than that, and a list cut at *_ALGO_COUNT can
 * lose the only deterministic or fitting candidate (under --deterministic, Get_v7's
 * ranking, cut, is the whole choice). Paddle's and MegEngine's cuDNN pickers size
 * their lists the same way. */
#define CONV_PASS(perf_t, max_count_fn, enum_count, get_call, find_call, ctx, cv, dflt, query, out_algo, \
                  out_math, out_ws, pass)                                                                 \
    do {                                                                                                  \
        int max_ = 0;                                                                                     \
        CHECK_CUDNN(max_count_fn((ctx)->cudnn, &max_));                                                   \
        const int want_ = conv_list_capacity(max_, (int)(enum_count));                                    \
        std::vector<perf_t> perf_((size_t)want_);                                                         \
        std::vector<ConvCandidate> cand_((size_t)want_ + 1);                                              \
        int got_ = 0;                                                                                     \
        CHECK_CUDNN(cudnnSetConvolutionMathType((cv)->cd, conv_base_math(ctx)));                          \
        if ((ctx)->deterministic)                                                                         \
            CHECK_CUDNN(get_call);                                                                        \
        else                                                                                              \
            CHECK_CUDNN(find_call);                                                                       \
        got_ = conv_list_got(got_, want_);                                                                \
        int n_ = conv_candidates(ctx, perf_.data(), got_, (int)(dflt), cand_.data());                     \
        int at_ = conv_pick_or_die(ctx, cv, pass, cand_.data(), n_, query, &(out_ws));                    \
        (out_algo) = (decltype(out_algo))cand_[at_].algo;                                                 \
        (out_math) = (cudnnMathType_t)cand_[at_].math;                                                    \
    } while (0)

/* Each planned pass's algorithm, math and workspace at max_n (conv_plan_passes). */
static void conv_pick_algorithms(CudaCtx *ctx, ConvCuda *cv, size_t ws[3]) {
    ws[0] = ws[1] = ws[2] = 0;
    cv->fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    cv->bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    cv->bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    cv->math_fwd = cv->math_bwd_data = cv->math_bwd_filter = conv_base_math(ctx);
    CONV_PASS(cudnnConvolutionFwdAlgoPerf_t, cudnnGetConvolutionForwardAlgorithmMaxCount,
              CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
              cudnnGetConvolutionForwardAlgorithm_v7(ctx->cudnn, cv->xd, cv->wd, cv->cd, cv->yd, want_, &got_,
                                                     perf_.data()),
              cudnnFindConvolutionForwardAlgorithm(ctx->cudnn, cv->xd, cv->wd, cv->cd, cv->yd, want_, &got_,
                                                   perf_.data()),
              ctx, cv, cv->fwd, conv_query_fwd, cv->fwd, cv->math_fwd, ws[0], "forward");
    /* inference only: no backward search (seconds per run); the stem: no backward data */
    if (cv->passes & CONV_PASS_BWD_DATA)
        CONV_PASS(cudnnConvolutionBwdDataAlgoPerf_t, cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                  cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx->cudnn, cv->wd, cv->yd, cv->cd, cv->xd, want_,
                                                              &got_, perf_.data()),
                  cudnnFindConvolutionBackwardDataAlgorithm(ctx->cudnn, cv->wd, cv->yd, cv->cd, cv->xd, want_,
                                                            &got_, perf_.data()),
                  ctx, cv, cv->bwd_data, conv_query_bwd_data, cv->bwd_data, cv->math_bwd_data, ws[1],
                  "backward data");
    if (cv->passes & CONV_PASS_BWD_FILTER)
        CONV_PASS(cudnnConvolutionBwdFilterAlgoPerf_t, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                  cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx->cudnn, cv->xd, cv->yd, cv->cd, cv->wd, want_,
                                                                &got_, perf_.data()),
                  cudnnFindConvolutionBackwardFilterAlgorithm(ctx->cudnn, cv->xd, cv->yd, cv->cd, cv->wd, want_,
                                                              &got_, perf_.data()),
                  ctx, cv, cv->bwd_filter, conv_query_bwd_filter, cv->bwd_filter, cv->math_bwd_filter,
                  ws[2], "backward filter");
}

static size_t size_max3(size_t a, size_t b, size_t c) {
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

extern "C" ConvCuda *conv_cuda_create(CudaCtx *ctx, const ConvSpec *cs, int max_n, int h, int w,
                                      size_t ws_limit, int backward, int need_dx) {
    ConvCuda *cv = (ConvCuda *)xcalloc(1, sizeof *cv);
    cv->cs = *cs;
    cv->passes = conv_plan_passes(backward, need_dx);
    cv->backward = backward;
    cv->max_n = max_n;
    cv->h = h;
    cv->w = w;
    cv->oh = conv_out_size(h, cs->k, cs->stride, cs->pad);
    cv->ow = conv_out_size(w, cs->k, cs->stride, cs->pad);
    cv->ws_limit = ws_limit;
    cv->dtype = conv_data_type(ctx);
    if (max_n < 1 || cv->oh < 1 || cv->ow < 1)
        die("convolution %dx%d stride %d on %dx%d: empty output", cs->k, cs->k, cs->stride, h, w);
    CHECK_CUDNN(cudnnCreateTensorDescriptor(&cv->xd));
    CHECK_CUDNN(cudnnCreateTensorDescriptor(&cv->yd));
    CHECK_CUDNN(cudnnCreateFilterDescriptor(&cv->wd));
    CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&cv->cd));
    CHECK_CUDNN(cudnnSetFilter4dDescriptor(cv->wd, cv->dtype, CUDNN_TENSOR_NHWC, cs->cout, cs->cin,
                                           cs->k, cs->k));
    CHECK_CUDNN(cudnnSetConvolution2dDescriptor(cv->cd, cs->pad, cs->pad, cs->stride, cs->stride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    conv_set_batch_desc(cv, max_n);
    int on, oc, oh, ow;
    CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(cv->cd, cv->xd, cv->wd, &on, &oc, &oh, &ow));
    if (on != max_n || oc != cs->cout || oh != cv->oh || ow != cv->ow)
        die("cuDNN computes a %dx%dx%dx%d convolution output where %dx%dx%dx%d was expected", on, oh, ow,
            oc, max_n, cv->oh, cv->ow, cs->cout);
    size_t ws[3];
    conv_pick_algorithms(ctx, cv, ws);
    cv->ws_bytes = size_max3(ws[0], ws[1], ws[2]);
    cv->cur_n = max_n;
    cv->cur_fwd = cv->fwd;
    cv->cur_bwd_data = cv->bwd_data;
    cv->cur_bwd_filter = cv->bwd_filter;
    snprintf(cv->desc, sizeof cv->desc, "fwd=%d bwd_data=%d bwd_filter=%d math=%d/%d/%d ws=%zu",
             (int)cv->fwd, (int)cv->bwd_data, (int)cv->bwd_filter, (int)cv->math_fwd,
             (int)cv->math_bwd_data, (int)cv->math_bwd_filter, cv->ws_bytes);
    return cv;
}

extern "C" void conv_cuda_free(ConvCuda *cv) {
    if (!cv) return;
    CHECK_CUDNN(cudnnDestroyTensorDescriptor(cv->xd));
    CHECK_CUDNN(cudnnDestroyTensorDescriptor(cv->yd));
    CHECK_CUDNN(cudnnDestroyFilterDescriptor(cv->wd));
    CHECK_CUDNN(cudnnDestroyConvolutionDescriptor(cv->cd));
    free(cv);
}

extern "C" size_t conv_cuda_workspace_bytes(const ConvCuda *cv) { return cv->ws_bytes; }
extern "C" const char *conv_cuda_describe(const ConvCuda *cv) { return cv->desc; }

/* A pass whose chosen algorithm does not fit at this batch size falls back to its
 * workspace-free, deterministic default; that one must be supported and fit too. */
static void conv_check_fallback(const ConvCuda *cv, int n, const char *pass, size_t need, size_t ws_bytes) {
    if (need <= ws_bytes) return;
    char last[256] = "", reason[512];
    cudnnGetLastErrorString(last, sizeof last);
    snprintf(reason, sizeof reason,
             "conv %dx%d stride %d on %dx%dx%dx%d: neither the chosen %s algorithm nor its "
             "fallback fits the %zu-byte workspace%s%s",
             cv->cs.k, cv->cs.k, cv->cs.stride, n, cv->h, cv->w, cv->cs.cin, pass, ws_bytes,
             last[0] ? ": " : "", last);
    check_fail(__FILE__, __LINE__, "cuDNN convolution", reason,
               "use the full batch size (a multiple of --batch-size), or another cuDNN version");
}

/* Point the descriptors at batch n; keep the chosen algorithms when their
 * workspace still fits, else use the workspace-free ones (checked). Host calls only:
 * conv_cuda_prepare runs it before a CUDA graph capture. */
static void conv_use_batch(CudaCtx *ctx, ConvCuda *cv, int n, size_t ws_bytes) {
    if (n == cv->cur_n) return;
    if (n < 1 || n > cv->max_n)
        die("convolution called with batch %d (planned for at most %d)", n, cv->max_n);
    conv_set_batch_desc(cv, n);
    cv->cur_n = n;
    cv->cur_fwd = cv->fwd;
    cv->cur_bwd_data = cv->bwd_data;
    cv->cur_bwd_filter = cv->bwd_filter;
    if (conv_ws_fwd(ctx, cv, cv->fwd, cv->math_fwd) > ws_bytes) {
        cv->cur_fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
        conv_check_fallback(cv, n, "forward", conv_ws_fwd(ctx, cv, cv->cur_fwd, cv->math_fwd), ws_bytes);
    }
    if (!cv->backward) return;
    if ((cv->passes & CONV_PASS_BWD_DATA) &&
        conv_ws_bwd_data(ctx, cv, cv->bwd_data, cv->math_bwd_data) > ws_bytes) {
        cv->cur_bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
        conv_check_fallback(cv, n, "backward-data",
                            conv_ws_bwd_data(ctx, cv, cv->cur_bwd_data, cv->math_bwd_data), ws_bytes);
    }
    if (conv_ws_bwd_filter(ctx, cv, cv->bwd_filter, cv->math_bwd_filter) > ws_bytes) {
        cv->cur_bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
        conv_check_fallback(cv, n, "backward-filter",
                            conv_ws_bwd_filter(ctx, cv, cv->cur_bwd_filter, cv->math_bwd_filter), ws_bytes);
    }
}

extern "C" void conv_cuda_prepare(CudaCtx *ctx, ConvCuda *cv, int n, size_t ws_bytes) {
    conv_use_batch(ctx, cv, n, ws_bytes);
}

extern "C" const ConvSpec *conv_cuda_spec(const ConvCuda *cv) { return &cv->cs; }
extern "C" size_t conv_cuda_out_pixels(const ConvCuda *cv) { return (size_t)cv->oh * cv->ow; }

extern "C" void conv_cuda_forward(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                                  const float *weight_krsc, const float *bias, float *y, void *ws,
                                  size_t ws_bytes) {
    const float one = 1.0f, zero = 0.0f;
    conv_use_batch(ctx, cv, n, ws_bytes);
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, cv->math_fwd));
    CHECK_CUDNN(cudnnConvolutionForward(ctx->cudnn, &one, cv->xd, x, cv->wd, weight_krsc, cv->cd,
                                        cv->cur_fwd, ws, ws_bytes, &zero, cv->yd, y));
    if (bias) bias_apply(ctx, (size_t)n * cv->oh * cv->ow, cv->cs.cout, bias, y, 1, ctx->bf16);
}

/* conv_cuda_backward with dx = dx_beta * dx + the gradient of x: cuDNN's blending
 * ("output = alpha * Op(inputs) + beta * output", cudnn_cnn.h, for every convolution
 * function and algorithm); dx_beta 0 or 1. */
static void conv_cuda_backward_beta(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                                    const float *weight_krsc, const float *dy, float *dx,
                                    float *dweight_krsc, float *dbias, void *ws, size_t ws_bytes,
                                    float dx_beta) {
    const float one = 1.0f, zero = 0.0f;
    if (!cv->backward) die("convolution backward on an inference-only plan (internal error)");
    if (dx && !(cv->passes & CONV_PASS_BWD_DATA))
        die("convolution backward with a dx on a plan made without need_dx (internal error)");
    conv_use_batch(ctx, cv, n, ws_bytes);
    if (dbias) colsum(ctx, (int64_t)n * cv->oh * cv->ow, cv->cs.cout, dy, dbias, ctx->bf16);
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, cv->math_bwd_filter));
    CHECK_CUDNN(cudnnConvolutionBackwardFilter(ctx->cudnn, &one, cv->xd, x, cv->yd, dy, cv->cd,
                                               cv->cur_bwd_filter, ws, ws_bytes, &zero, cv->wd,
                                               dweight_krsc));
    if (dx) {
        CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, cv->math_bwd_data));
        CHECK_CUDNN(cudnnConvolutionBackwardData(ctx->cudnn, &one, cv->wd, weight_krsc, cv->yd, dy,
                                                 cv->cd, cv->cur_bwd_data, ws, ws_bytes, &dx_beta,
                                                 cv->xd, dx));
    }
}

extern "C" void conv_cuda_backward(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                                   const float *weight_krsc, const float *dy, float *dx,
                                   float *dweight_krsc, float *dbias, void *ws, size_t ws_bytes) {
    conv_cuda_backward_beta(ctx, cv, n, x, weight_krsc, dy, dx, dweight_krsc, dbias, ws, ws_bytes, 0.0f);
}

extern "C" void conv_cuda_backward_acc(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                                       const float *weight_krsc, const float *dy, float *dx,
                                       float *dweight_krsc, float *dbias, void *ws, size_t ws_bytes) {
    if (!dx) die("convolution backward accumulating into no dx (internal error)");
    conv_cuda_backward_beta(ctx, cv, n, x, weight_krsc, dy, dx, dweight_krsc, dbias, ws, ws_bytes, 1.0f);
}

/* Scratch for the contract versions: the KRSC weight copy, the KRSC gradient and
 * the cuDNN workspace, allocated per call. */
#define CONV_ONEOFF_WS_LIMIT ((size_t)256 << 20)

/* The KRSC weight cuDNN reads: wk itself, or in a bf16 context its bfloat16 copy
 * (in *scratch, freed by the caller). */
static const float *conv_oneoff_weight(CudaCtx *ctx, size_t wn, const float *wk, void **scratch) {
    *scratch = NULL;
    if (!ctx->bf16) return wk;
    *scratch = cuda_alloc(wn * sizeof(bf16_t));
    cuda_f32_to_bf16(ctx, wn, wk, (float *)*scratch);
    return (const float *)*scratch;
}

extern "C" void conv2d_forward_cuda(CudaCtx *ctx, const ConvSpec *cs, int n, int h, int w,
                                    const float *x, const float *weight, const float *bias, float *y) {
    size_t wn = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    ConvCuda *cv = conv_cuda_create(ctx, cs, n, h, w, CONV_ONEOFF_WS_LIMIT, 0, 0);
    float *wk = (float *)cuda_alloc(wn * sizeof(float));
    void *ws = cuda_alloc(cv->ws_bytes);
    void *w16 = NULL;
    conv_weight_to_krsc_cuda(ctx, cs, weight, wk);
    conv_cuda_forward(ctx, cv, n, x, conv_oneoff_weight(ctx, wn, wk, &w16), bias, y, ws, cv->ws_bytes);
    cuda_ctx_sync(ctx);
    cuda_free(w16);
    cuda_free(ws);
    cuda_free(wk);
    conv_cuda_free(cv);
}

extern "C" void conv2d_backward_cuda(CudaCtx *ctx, const ConvSpec *cs, int n, int h, int w,
                                     const float *x, const float *weight, const float *dy, float *dx,
                                     float *dweight, float *dbias) {
    size_t wn = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    ConvCuda *cv = conv_cuda_create(ctx, cs, n, h, w, CONV_ONEOFF_WS_LIMIT, 1, dx != NULL);
    float *wk = (float *)cuda_alloc(wn * sizeof(float));
    float *dwk = (float *)cuda_alloc(wn * sizeof(float));
    void *ws = cuda_alloc(cv->ws_bytes);
    void *w16 = NULL, *dw16 = ctx->bf16 ? cuda_alloc(wn * sizeof(bf16_t)) : NULL;
    conv_weight_to_krsc_cuda(ctx, cs, weight, wk);
    conv_cuda_backward(ctx, cv, n, x, conv_oneoff_weight(ctx, wn, wk, &w16), dy, dx,
                       dw16 ? (float *)dw16 : dwk, dbias, ws, cv->ws_bytes);
    if (dw16) cuda_bf16_to_f32(ctx, wn, (const float *)dw16, dwk);
    conv_weight_from_krsc_cuda(ctx, cs, dwk, dweight);
    cuda_ctx_sync(ctx);
    cuda_free(w16);
    cuda_free(dw16);
    cuda_free(ws);
    cuda_free(dwk);
    cuda_free(wk);
    conv_cuda_free(cv);
}

/* ------------------------------------------------------------ bf16 shadows */

__global__ void f32_to_bf16_kernel(size_t n, const float *src, bf16_t *dst) {
    GRID_STRIDE(i, n) dst[i] = bf16_from_float(src[i]);
}

__global__ void bf16_to_f32_kernel(size_t n, const bf16_t *src, float *dst) {
    GRID_STRIDE(i, n) dst[i] = bf16_to_float(src[i]);
}

extern "C" void cuda_f32_to_bf16(CudaCtx *ctx, size_t n, const float *src, float *dst_bf16) {
    if (!n) return;
    f32_to_bf16_kernel<<<grid_for(n), OPS_CUDA_BLOCK, 0, ctx->stream>>>(n, src, (bf16_t *)dst_bf16);
    CHECK_CUDA_LAST();
}

extern "C" void cuda_bf16_to_f32(CudaCtx *ctx, size_t n, const float *src_bf16, float *dst) {
    if (!n) return;
    bf16_to_f32_kernel<<<grid_for(n), OPS_CUDA_BLOCK, 0, ctx->stream>>>(n, (const bf16_t *)src_bf16, dst);
    CHECK_CUDA_LAST();
}

/* One block row per segment (blockIdx.y), grid-striding over its elements. */
__global__ void bf16_segments_narrow_kernel(const Bf16Segment *seg, const float *src32, bf16_t *dst16) {
    const Bf16Segment s = seg[blockIdx.y];
    GRID_STRIDE(i, s.count) dst16[s.dst + i] = bf16_from_float(src32[s.src + i]);
}

__global__ void bf16_segments_widen_kernel(const Bf16Segment *seg, const bf16_t *src16, float *dst32) {
    const Bf16Segment s = seg[blockIdx.y];
    GRID_STRIDE(i, s.count) dst32[s.src + i] = bf16_to_float(src16[s.dst + i]);
}

/* Blocks for the segment kernels: x covers the largest segment, y one per segment. */
static dim3 bf16_segments_grid(const CudaCtx *ctx) { return dim3(grid_for(ctx->seg_max), (unsigned)ctx->n_seg); }

static void bf16_shadow_release(CudaCtx *ctx) {
    cuda_free(ctx->w16);
    cuda_free(ctx->g16);
    cuda_free(ctx->seg_dev);
    free(ctx->seg);
    ctx->w16 = ctx->g16 = NULL;
    ctx->seg_dev = ctx->seg = NULL;
    ctx->n_seg = 0;
}

extern "C" void cuda_bf16_shadow_init(CudaCtx *ctx, const float *params, float *grads, size_t count,
                                      const Bf16Segment *seg, int n_seg) {
    if (!ctx->bf16) die("bf16 shadows on a context without bf16 activations (internal error)");
    /* gridDim.y of the segment kernels (the CUDA programming guide's limit: 65535) */
    if (n_seg < 1 || n_seg > 65535) die("bf16: %d conv weights to shadow (1 to 65535 supported)", n_seg);
    bf16_shadow_release(ctx);
    ctx->params32 = params;
    ctx->grads32 = grads;
    ctx->nparams = count;
    ctx->n_seg = n_seg;
    ctx->seg = (Bf16Segment *)xmalloc((size_t)n_seg * sizeof *seg);
    memcpy(ctx->seg, seg, (size_t)n_seg * sizeof *seg);
    size_t total = bf16_layout_place(ctx->seg, n_seg);
    ctx->seg_max = 0;
    for (int i = 0; i < n_seg; i++) {
        if (i && ctx->seg[i].src < ctx->seg[i - 1].src + ctx->seg[i - 1].count)
            die("bf16: conv weights out of order or overlapping in the flat params (internal error)");
        if (ctx->seg[i].src + ctx->seg[i].count > count)
            die("bf16: a conv weight beyond the flat params (internal error)");
        if (ctx->seg[i].count > ctx->seg_max) ctx->seg_max = ctx->seg[i].count;
    }
    ctx->seg_dev = (Bf16Segment *)cuda_alloc((size_t)n_seg * sizeof *seg);
    cuda_upload(ctx, ctx->seg_dev, ctx->seg, (size_t)n_seg * sizeof *seg);
    ctx->w16 = (bf16_t *)cuda_alloc(total * sizeof(bf16_t));
    ctx->g16 = (bf16_t *)cuda_alloc(total * sizeof(bf16_t));
    cuda_memset_async(ctx, ctx->w16, 0, total * sizeof(bf16_t));
    cuda_memset_async(ctx, ctx->g16, 0, total * sizeof(bf16_t));
}

extern "C" void cuda_bf16_weights_refresh(CudaCtx *ctx) {
    if (!ctx->w16) return;
    bf16_segments_narrow_kernel<<<bf16_segments_grid(ctx), OPS_CUDA_BLOCK, 0, ctx->stream>>>(
        ctx->seg_dev, ctx->params32, ctx->w16);
    CHECK_CUDA_LAST();
}

extern "C" void cuda_bf16_grads_collect(CudaCtx *ctx) {
    if (!ctx->g16) return;
    bf16_segments_widen_kernel<<<bf16_segments_grid(ctx), OPS_CUDA_BLOCK, 0, ctx->stream>>>(
        ctx->seg_dev, ctx->g16, ctx->grads32);
    CHECK_CUDA_LAST();
}

/* Where the shadow holds p, a pointer into the flat buffer base[0 .. count) within a
 * conv weight, or die (the executor hands the table pointers into the engine's
 * flat buffers, conv weights only). */
static size_t shadow_index(const CudaCtx *ctx, const float *base, const float *p, const char *what) {
    const Bf16Segment *s = NULL;
    if (base && p >= base && p < base + ctx->nparams) s = bf16_layout_find(ctx->seg, ctx->n_seg, (size_t)(p - base));
    if (!s) die("bf16: a conv %s outside the shadowed conv weights (internal error)", what);
    return s->dst + ((size_t)(p - base) - s->src);
}

extern "C" const float *cuda_bf16_weight(CudaCtx *ctx, const float *param) {
    if (!ctx->bf16 || !param) return param; /* NULL stays NULL, as cuda_bf16_grad */
    return (const float *)(ctx->w16 + shadow_index(ctx, ctx->params32, param, "weight"));
}

extern "C" float *cuda_bf16_grad(CudaCtx *ctx, float *grad) {
    if (!ctx->bf16 || !grad) return grad;
    return (float *)(ctx->g16 + shadow_index(ctx, ctx->grads32, grad, "weight gradient"));
}
