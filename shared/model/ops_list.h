/* ops_list.h: the one list of the layer ops (X-macros), from which every backend's
 * prototypes are generated: ops.h (the CPU ops in float), ops_cpu_variants.h (the
 * per-ISA copies and their dispatch), ops_cuda.h (the CUDA twins, CudaCtx first and
 * a _cuda suffix). Contracts are ops.h's.
 *
 *   VOID(name, (params), (args))        RET(type, name, (params), (args))
 * with R the scalar type of the params (float everywhere but in the double tests).
 *
 * OPS_LIST_SHARED: ops with the same contract on every device (the CUDA twin only
 * adds its CudaCtx). OPS_LIST_CPU: the CPU forms of the ops whose GPU form differs
 * (convolution through a cuDNN plan with the device's weight layout, batch norm over
 * the real (n, hw, c) shape, the loss written to device memory): ops_cuda.h
 * declares those by hand, and the executor's op table (net_ops.h) is where the two
 * forms meet. */
#ifndef CIFAR_OPS_LIST_H
#define CIFAR_OPS_LIST_H

#define OPS_LIST_SHARED(VOID, RET, R)                                                              \
    VOID(relu_forward, (size_t n, const R *x, R *y), (n, x, y))                                    \
    VOID(relu_backward, (size_t n, const R *y, const R *dy, R *dx), (n, y, dy, dx))                \
    VOID(add_forward, (size_t n, const R *a, const R *b, R *y), (n, a, b, y))                      \
    VOID(add_relu_forward, (size_t n, const R *a, const R *b, R *y), (n, a, b, y))                 \
    VOID(meanpool_forward, (int n, int hw, int c, const R *x, R *y), (n, hw, c, x, y))             \
    VOID(meanpool_backward, (int n, int hw, int c, const R *dy, R *dx), (n, hw, c, dy, dx))        \
    VOID(linear_forward,                                                                           \
         (int n, int in, int out, const R *x, const R *weight, const R *bias, R *y),               \
         (n, in, out, x, weight, bias, y))                                                         \
    VOID(linear_backward,                                                                          \
         (int n, int in, int out, const R *x, const R *weight, const R *dy, R *dx, R *dweight,     \
          R *dbias),                                                                               \
         (n, in, out, x, weight, dy, dx, dweight, dbias))                                          \
    VOID(sgd_update,                                                                               \
         (size_t n, R *param, const R *grad, R *momentum_buf, const uint8_t *decay_mask, R lr,     \
          R momentum, R weight_decay, int nesterov, int first_step),                               \
         (n, param, grad, momentum_buf, decay_mask, lr, momentum, weight_decay, nesterov,          \
          first_step))

#define OPS_LIST_CPU(VOID, RET, R)                                                                 \
    RET(size_t, conv2d_workspace_floats, (const ConvSpec *cs, int n, int h, int w),               \
        (cs, n, h, w))                                                                             \
    VOID(conv2d_forward,                                                                           \
         (const ConvSpec *cs, int n, int h, int w, const R *x, const R *weight, const R *bias,     \
          R *y, R *workspace),                                                                     \
         (cs, n, h, w, x, weight, bias, y, workspace))                                             \
    VOID(conv2d_backward,                                                                          \
         (const ConvSpec *cs, int n, int h, int w, const R *x, const R *weight, const R *dy,       \
          R *dx, R *dweight, R *dbias, R *workspace),                                              \
         (cs, n, h, w, x, weight, dy, dx, dweight, dbias, workspace))                              \
    VOID(batchnorm2d_forward_train,                                                                \
         (int rows, int c, const R *x, const R *gamma, const R *beta, R *y, R *save_mean,          \
          R *save_invstd, R *running_mean, R *running_var, R momentum, R eps),                     \
         (rows, c, x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var,           \
          momentum, eps))                                                                          \
    VOID(batchnorm2d_forward_eval,                                                                 \
         (int rows, int c, const R *x, const R *gamma, const R *beta, const R *running_mean,       \
          const R *running_var, R eps, R *y),                                                      \
         (rows, c, x, gamma, beta, running_mean, running_var, eps, y))                             \
    VOID(batchnorm2d_backward,                                                                     \
         (int rows, int c, const R *x, const R *gamma, const R *save_mean, const R *save_invstd,   \
          const R *dy, R *dx, R *dgamma, R *dbeta),                                                \
         (rows, c, x, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta))                       \
    VOID(batchnorm2d_relu_forward_train,                                                           \
         (int rows, int c, const R *x, const R *gamma, const R *beta, R *y, R *save_mean,          \
          R *save_invstd, R *running_mean, R *running_var, R momentum, R eps),                     \
         (rows, c, x, gamma, beta, y, save_mean, save_invstd, running_mean, running_var,           \
          momentum, eps))                                                                          \
    VOID(batchnorm2d_add_relu_forward_train,                                                       \
         (int rows, int c, const R *x, const R *gamma, const R *beta, const R *z, R *y,            \
          R *save_mean, R *save_invstd, R *running_mean, R *running_var, R momentum, R eps),       \
         (rows, c, x, gamma, beta, z, y, save_mean, save_invstd, running_mean, running_var,        \
          momentum, eps))                                                                          \
    VOID(batchnorm2d_relu_backward,                                                                \
         (int rows, int c, const R *x, const R *y, const R *gamma, const R *save_mean,             \
          const R *save_invstd, const R *dy, R *dx, R *dgamma, R *dbeta),                          \
         (rows, c, x, y, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta))                    \
    RET(R, softmax_xent_forward_backward,                                                          \
        (int n, int k, const R *logits, const int32_t *labels, R smoothing, R *dlogits,            \
         int *correct),                                                                            \
        (n, k, logits, labels, smoothing, dlogits, correct))

/* Both lists, for what every CPU op gets (the ISA variants and their dispatch). */
#define OPS_LIST_ALL(VOID, RET, R) OPS_LIST_CPU(VOID, RET, R) OPS_LIST_SHARED(VOID, RET, R)

/* Declarations with a name prefix (ops_avx2_, ...) or none. */
#define OPS_DECLARE_VOID(name, params, args) void name params;
#define OPS_DECLARE_RET(type, name, params, args) type name params;

#endif
