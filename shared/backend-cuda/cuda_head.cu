/* cuda_head.cu: the head: the linear layer (cuBLAS) and the softmax cross-entropy (ops_cuda.h; shared parts in cuda_internal.h). */
#include "backend-cuda/cuda_internal.h"

/* -------------------------------------------------------------------- linear */

/* Row-major y[n][out] = x[n][in] * W[out][in]^T is, in cuBLAS's column-major terms,
 * y^T (out x n) = W^T' (out x in) * x^T (in x n) with W read transposed. */
extern "C" void linear_forward_cuda(void *vctx, int n, int in, int out, const float *x,
                                    const float *weight, const float *bias, float *y) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    const float one = 1.0f, zero = 0.0f;
    if (n <= 0) return;
    /* y = bias, then y += x W^T; no bias (NULL, as ops.h allows): y = x W^T */
    if (bias) bias_apply(ctx, (size_t)n, out, bias, y, 0, 0);
    CHECK_CUBLAS(cublasSgemm(ctx->cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &one, weight, in, x,
                             in, bias ? &one : &zero, y, out));
}

extern "C" void linear_backward_cuda(void *vctx, int n, int in, int out, const float *x,
                                     const float *weight, const float *dy, float *dx,
                                     float *dweight, float *dbias) {
    CudaCtx *ctx = (CudaCtx *)vctx;
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
