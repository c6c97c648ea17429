/* ops_cpu_variants.h: the list of CPU ops compiled per instruction set (see
 * ops_cpu.c), as an X-macro: VOID(name, (params), (args)) and
 * RET(type, name, (params), (args)). Also declares the per-ISA variants. */
#ifndef CIFAR_OPS_CPU_VARIANTS_H
#define CIFAR_OPS_CPU_VARIANTS_H

#include <stddef.h>
#include <stdint.h>

#include "nn/ops.h"

/* Variants exist for x86-64 with GCC (clang builds, e.g. the fuzzers, use the
 * baseline code only). */
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define OPS_HAVE_VARIANTS 1
#else
#define OPS_HAVE_VARIANTS 0
#endif

#define OPS_VARIANT_LIST(VOID, RET)                                                           \
    RET(size_t, conv2d_workspace_floats, (const ConvSpec *cs, int n, int h, int w),           \
        (cs, n, h, w))                                                                         \
    VOID(conv2d_forward,                                                                       \
         (const ConvSpec *cs, int n, int h, int w, const float *x, const float *weight,        \
          const float *bias, float *y, float *workspace),                                      \
         (cs, n, h, w, x, weight, bias, y, workspace))                                         \
    VOID(conv2d_backward,                                                                      \
         (const ConvSpec *cs, int n, int h, int w, const float *x, const float *weight,        \
          const float *dy, float *dx, float *dweight, float *dbias, float *workspace),         \
         (cs, n, h, w, x, weight, dy, dx, dweight, dbias, workspace))                          \
    VOID(batchnorm2d_forward_train,                                                            \
         (int rows, int c, const float *x, const float *gamma, const float *beta, float *y,    \
          float *save_mean, float *save_invstd, float *running_mean, float *running_var,       \
          float momentum, float eps),                                                          \
         (rows, c, x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var,       \
          momentum, eps))                                                                      \
    VOID(batchnorm2d_forward_eval,                                                             \
         (int rows, int c, const float *x, const float *gamma, const float *beta,              \
          const float *running_mean, const float *running_var, float eps, float *y),           \
         (rows, c, x, gamma, beta, running_mean, running_var, eps, y))                         \
    VOID(batchnorm2d_backward,                                                                 \
         (int rows, int c, const float *x, const float *gamma, const float *save_mean,         \
          const float *save_invstd, const float *dy, float *dx, float *dgamma, float *dbeta),  \
         (rows, c, x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta))                   \
    VOID(batchnorm2d_relu_forward_train,                                                       \
         (int rows, int c, const float *x, const float *gamma, const float *beta, float *y,    \
          float *save_mean, float *save_invstd, float *running_mean, float *running_var,       \
          float momentum, float eps),                                                          \
         (rows, c, x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var,       \
          momentum, eps))                                                                      \
    VOID(batchnorm2d_relu_backward,                                                            \
         (int rows, int c, const float *x, const float *y, const float *gamma,                 \
          const float *save_mean, const float *save_invstd, const float *dy, float *dx,        \
          float *dgamma, float *dbeta),                                                        \
         (rows, c, x, y, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta))                \
    VOID(relu_forward, (size_t n, const float *x, float *y), (n, x, y))                        \
    VOID(relu_backward, (size_t n, const float *y, const float *dy, float *dx),                \
         (n, y, dy, dx))                                                                       \
    VOID(add_forward, (size_t n, const float *a, const float *b, float *y), (n, a, b, y))      \
    VOID(add_relu_forward, (size_t n, const float *a, const float *b, float *y),               \
         (n, a, b, y))                                                                         \
    VOID(meanpool_forward, (int n, int hw, int c, const float *x, float *y),                   \
         (n, hw, c, x, y))                                                                     \
    VOID(meanpool_backward, (int n, int hw, int c, const float *dy, float *dx),                \
         (n, hw, c, dy, dx))                                                                   \
    VOID(linear_forward,                                                                       \
         (int n, int in, int out, const float *x, const float *weight, const float *bias,      \
          float *y),                                                                           \
         (n, in, out, x, weight, bias, y))                                                     \
    VOID(linear_backward,                                                                      \
         (int n, int in, int out, const float *x, const float *weight, const float *dy,        \
          float *dx, float *dweight, float *dbias),                                            \
         (n, in, out, x, weight, dy, dx, dweight, dbias))                                      \
    RET(float, softmax_xent_forward_backward,                                                  \
        (int n, int k, const float *logits, const int32_t *labels, float smoothing,            \
         float *dlogits, int *correct),                                                        \
        (n, k, logits, labels, smoothing, dlogits, correct))                                   \
    VOID(sgd_update,                                                                           \
         (size_t n, float *param, const float *grad, float *momentum_buf,                      \
          const uint8_t *decay_mask, float lr, float momentum, float weight_decay,             \
          int nesterov, int first_step),                                                       \
         (n, param, grad, momentum_buf, decay_mask, lr, momentum, weight_decay, nesterov,      \
          first_step))

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
