/* ema.h: the exponential moving average of the weights (cifar-train --ema DECAY),
 * timm's ModelEmaV2 rule applied after every optimizer step to every float of the
 * state dict, the parameters and the BN running statistics alike:
 *     avg = decay * avg + (1 - decay) * value
 * starting from the model's initial state (num_batches_tracked is the model's own:
 * a counter is not averaged). With warm-up (--ema-warmup, timm's ModelEmaV3
 * use_warmup with its defaults, gamma 1 and power 2/3) the decay of the update
 * after `updates` earlier ones is min(decay, 1 - (1 + updates)^(-2/3)): the first
 * update copies the weights, and the average forgets the early weights quickly
 * (ema_decay_at: host code of the command, in double, rounded once to the float
 * both devices use; the GPU library asks the command for it, engine_ema_decay, and
 * links no libm). ema_blend is the one expression both devices use: on the GPU
 * with explicit round-to-nearest operations so that nvcc cannot fuse it
 * into an FMA, on the CPU compiled with -ffp-contract=off (Makefile, FP_EXACT_OBJS:
 * GCC's GNU C default would fuse it wherever -march has an FMA), so the two are
 * bit-identical (test_ops_cuda). ema_update is the CPU loop; ema_update_cuda (ops_cuda.h) the
 * kernel. */
#ifndef CIFAR_EMA_H
#define CIFAR_EMA_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

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

/* The decay of one update: `decay`, or with warm-up as above. */
static inline float ema_decay_at(float decay, int64_t updates, int warmup) {
    if (!warmup) return decay;
    double d = 1.0 - pow(1.0 + (double)updates, -2.0 / 3.0);
    return (float)(d < (double)decay ? d : (double)decay);
}

/* avg[i] = ema_blend(avg[i], value[i], decay) for i < n. */
static inline void ema_update(size_t n, float *avg, const float *value, float decay) {
    for (size_t i = 0; i < n; i++) avg[i] = ema_blend(avg[i], value[i], decay);
}

#endif
