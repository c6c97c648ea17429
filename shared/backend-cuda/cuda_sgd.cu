/* cuda_sgd.cu: the SGD update and the moving average of --ema (ops_cuda.h; shared
 * parts in cuda_internal.h). */
#include "backend-cuda/cuda_internal.h"
#include "model/ema.h"

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

extern "C" void sgd_update_cuda_dev(void *vctx, size_t n, float *param, const float *grad,
                                    float *momentum_buf, const uint8_t *decay_mask,
                                    const float *lr_dev, float momentum, float weight_decay,
                                    int nesterov, const int32_t *first_step_dev) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    if (!n) return;
    sgd_kernel<<<grid_for(n), OPS_CUDA_BLOCK, 0, ctx->stream>>>(
        n, param, grad, momentum_buf, decay_mask, 0.0f, lr_dev, momentum, weight_decay, nesterov, 0,
        first_step_dev);
    CHECK_CUDA_LAST();
}

/* ema.h's moving average, one element per thread (ema_blend: bit-identical to the
 * CPU); the decay read from device memory when the kernel runs (graph replays). */
__global__ void ema_kernel(size_t n, float *avg, const float *value, const float *decay_dev) {
    const float decay = *decay_dev;
    GRID_STRIDE(i, n) avg[i] = ema_blend(avg[i], value[i], decay);
}

extern "C" void ema_update_cuda(CudaCtx *ctx, size_t n, float *avg, const float *value,
                                const float *decay_dev) {
    if (!n) return;
    ema_kernel<<<grid_for(n), OPS_CUDA_BLOCK, 0, ctx->stream>>>(n, avg, value, decay_dev);
    CHECK_CUDA_LAST();
}
