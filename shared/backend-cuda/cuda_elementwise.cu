/* cuda_elementwise.cu: the element-wise ops (ReLU, add, the bias pass) and the mean pool (ops_cuda.h; shared parts in cuda_internal.h). */
#include "backend-cuda/cuda_internal.h"

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

extern "C" void relu_forward_cuda(void *vctx, size_t n, const float *x, float *y) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    if (!n) return;
    ACT_LAUNCH(ctx, ctx->bf16, relu_forward_kernel, grid_for(n), OPS_CUDA_BLOCK, n, x, y);
}

extern "C" void relu_backward_cuda(void *vctx, size_t n, const float *y, const float *dy,
                                   float *dx) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    if (!n) return;
    ACT_LAUNCH(ctx, ctx->bf16, relu_backward_kernel, grid_for(n), OPS_CUDA_BLOCK, n, y, dy, dx);
}

extern "C" void add_forward_cuda(void *vctx, size_t n, const float *a, const float *b, float *y) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    if (!n) return;
    ACT_LAUNCH(ctx, ctx->bf16, add_kernel, grid_for(n), OPS_CUDA_BLOCK, n, a, b, y);
}

extern "C" void add_relu_forward_cuda(void *vctx, size_t n, const float *a, const float *b,
                                      float *y) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    if (!n) return;
    ACT_LAUNCH(ctx, ctx->bf16, add_relu_kernel, grid_for(n), OPS_CUDA_BLOCK, n, a, b, y);
}

/* y: an activation (bfloat16 when bf16) or, bf16 = 0, floats (the logits). */
void bias_apply(CudaCtx *ctx, size_t rows, int c, const float *bias, float *y, int add, int bf16) {
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

extern "C" void meanpool_forward_cuda(void *vctx, int n, int hw, int c, const float *x, float *y) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    size_t total = (size_t)n * c;
    if (!total) return;
    ACT_LAUNCH(ctx, ctx->bf16, meanpool_forward_kernel, grid_for(total), OPS_CUDA_BLOCK, n, hw, c, x, y);
}

extern "C" void meanpool_backward_cuda(void *vctx, int n, int hw, int c, const float *dy,
                                       float *dx) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    size_t total = (size_t)n * hw * c;
    if (!total) return;
    ACT_LAUNCH(ctx, ctx->bf16, meanpool_backward_kernel, grid_for(total), OPS_CUDA_BLOCK, n, hw, c, dy, dx);
}
