/* ema.h: the exponential moving average of the weights (cifar-train --ema DECAY),
 * timm's ModelEmaV2 rule applied after every optimizer step to every float of the
 * state dict, the parameters and the BN running statistics alike:
 *     avg = decay * avg + (1 - decay) * value
 * starting from the model's initial state (num_batches_tracked is the model's own:
 * a counter is not averaged). ema_blend is the one expression both devices use:
 * on the GPU with explicit round-to-nearest operations so that nvcc cannot fuse it
 * into an FMA (the CPU build does not fuse either), so the two are bit-identical
 * (test_ops_cuda). ema_update is the CPU loop; ema_update_cuda (ops_cuda.h) the
 * kernel. */
#ifndef CIFAR_EMA_H
#define CIFAR_EMA_H

#include <stddef.h>

#ifdef __CUDACC__
#define EMA_FN static inline __host__ __device__
#else
#define EMA_FN static inline
#endif

EMA_FN float ema_blend(float avg, float value, float decay) {
#ifdef __CUDA_ARCH__
    return __fadd_rn(__fmul_rn(decay, avg), __fmul_rn(1.0f - decay, value));
#else
    return decay * avg + (1.0f - decay) * value;
#endif
}

/* avg[i] = ema_blend(avg[i], value[i], decay) for i < n. */
static inline void ema_update(size_t n, float *avg, const float *value, float decay) {
    for (size_t i = 0; i < n; i++) avg[i] = ema_blend(avg[i], value[i], decay);
}

#endif
