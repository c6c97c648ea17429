/* net_cuda.cu: the CUDA op table of the network executor (net.h, net_ops.h): each
 * entry is the ops_cuda.h op of the same name, with the CudaCtx as the table's ctx.
 * Conv plans are ConvCuda (cuDNN descriptors and algorithms); conv weights live on
 * the device in cuDNN's NHWC filter layout (KRSC), converted only by
 * conv_weight_export / conv_weight_import.
 *
 * The table sets net_ops.h's optional fusions: conv_bn_forward leaves the conv bias
 * to the batch norm that reads the conv's output (no bias pass), and
 * bn_conv_backward has the BN backward write the conv's bias gradient (the column
 * sum of its dx) directly (no column-sum pass, no copy). Every entry runs its
 * kernels when called: no state is kept between calls.
 *
 * bf16 (ops_cuda.h, "bf16 activations"): the same table; the activations are
 * bfloat16 in the executor's float-typed buffers, and the convs read and write the
 * bf16 shadows of their weight and weight gradient (cuda_bf16_weight / _grad).
 *
 * The table sets net_ops.h's optional folded block backward (bn_relu_backward_keep,
 * conv_backward_acc): the block's output ReLU mask is read by the BN backward (which
 * leaves the masked gradient in dy for the identity shortcut) and the residual add is
 * cuDNN's backward data with beta = 1, so a block has no ReLU or add pass of its own. */
#include <string.h>

#include "backend-cuda/cuda_check.h"
#include "backend-cuda/ops_cuda.h"
#include "model/net.h"

/* Workspace one convolution algorithm may use (cudnnFind* skips hungrier ones). */
#define NET_CUDA_CONV_WS_LIMIT ((size_t)256 << 20)
/* Every buffer on a 256-byte boundary (cuDNN's and the coalescing sweet spot). */
#define NET_CUDA_ALIGN 256

#define CTX(c) ((CudaCtx *)(c))
#define PLAN(p) ((ConvCuda *)(p))

static void *nc_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return cuda_alloc(bytes);
}

static void nc_release(void *ctx, void *ptr) {
    (void)ctx;
    cuda_free(ptr);
}

static void nc_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    if (dst != src) cuda_copy_d2d_async(CTX(ctx), dst, src, bytes);
}

static void *nc_conv_plan(void *ctx, const ConvSpec *cs, int max_n, int h, int w, int backward,
                          int need_dx) {
    return conv_cuda_create(CTX(ctx), cs, max_n, h, w, NET_CUDA_CONV_WS_LIMIT, backward, need_dx);
}

static size_t nc_conv_workspace_bytes(void *ctx, void *plan) {
    (void)ctx;
    return conv_cuda_workspace_bytes(PLAN(plan));
}

static void nc_conv_plan_free(void *ctx, void *plan) {
    (void)ctx;
    conv_cuda_free(PLAN(plan));
}

static void nc_conv_prepare(void *ctx, void *plan, int n, size_t ws_bytes) {
    conv_cuda_prepare(CTX(ctx), PLAN(plan), n, ws_bytes);
}

static void nc_conv_forward(void *ctx, void *plan, int n, const float *x, const float *weight,
                            const float *bias, float *y, void *ws, size_t ws_bytes) {
    conv_cuda_forward(CTX(ctx), PLAN(plan), n, x, cuda_bf16_weight(CTX(ctx), weight), bias, y, ws,
                      ws_bytes);
}

/* acc: dx += the gradient of x (conv_backward_acc), else dx = it; dbias NULL: no
 * bias gradient (the fused BN backward wrote it). */
static void nc_conv_backward_into(void *ctx, void *plan, int n, const float *x, const float *weight,
                                  const float *dy, float *dx, float *dweight, float *dbias, void *ws,
                                  size_t ws_bytes, int acc) {
    const float *w = cuda_bf16_weight(CTX(ctx), weight);
    float *dw = cuda_bf16_grad(CTX(ctx), dweight);
    if (acc)
        conv_cuda_backward_acc(CTX(ctx), PLAN(plan), n, x, w, dy, dx, dw, dbias, ws, ws_bytes);
    else
        conv_cuda_backward(CTX(ctx), PLAN(plan), n, x, w, dy, dx, dw, dbias, ws, ws_bytes);
}

static void nc_conv_backward(void *ctx, void *plan, int n, const float *x, const float *weight,
                             const float *dy, float *dx, float *dweight, float *dbias, void *ws,
                             size_t ws_bytes) {
    nc_conv_backward_into(ctx, plan, n, x, weight, dy, dx, dweight, dbias, ws, ws_bytes, 0);
}

static void nc_conv_backward_acc(void *ctx, void *plan, int n, const float *x, const float *weight,
                                 const float *dy, float *dx, float *dweight, float *dbias, void *ws,
                                 size_t ws_bytes) {
    nc_conv_backward_into(ctx, plan, n, x, weight, dy, dx, dweight, dbias, ws, ws_bytes, 1);
}

static void nc_conv_weight_export(void *ctx, void *plan, const float *dev, float *kcrs) {
    conv_weight_from_krsc_cuda(CTX(ctx), conv_cuda_spec(PLAN(plan)), dev, kcrs);
}

static void nc_conv_weight_import(void *ctx, void *plan, const float *kcrs, float *dev) {
    conv_weight_to_krsc_cuda(CTX(ctx), conv_cuda_spec(PLAN(plan)), kcrs, dev);
}

static void nc_bn_train(void *ctx, int n, int hw, int c, const float *x, const float *gamma,
                        const float *beta, float *y, float *save_mean, float *save_invstd,
                        float *running_mean, float *running_var, float momentum, float eps) {
    batchnorm2d_forward_train_cuda(CTX(ctx), n, hw, c, x, NULL, gamma, beta, y,
                                   save_mean, save_invstd, running_mean, running_var, momentum, eps);
}

static void nc_bn_relu_train(void *ctx, int n, int hw, int c, const float *x, const float *gamma,
                             const float *beta, float *y, float *save_mean, float *save_invstd,
                             float *running_mean, float *running_var, float momentum, float eps) {
    batchnorm2d_relu_forward_train_cuda(CTX(ctx), n, hw, c, x, NULL, gamma,
                                        beta, y, save_mean, save_invstd, running_mean, running_var,
                                        momentum, eps);
}

static void nc_bn_add_relu_train(void *ctx, int n, int hw, int c, const float *x,
                                 const float *gamma, const float *beta, const float *z, float *tmp,
                                 float *y, float *save_mean, float *save_invstd,
                                 float *running_mean, float *running_var, float momentum,
                                 float eps) {
    (void)tmp; /* one pass: the BN output is never stored */
    batchnorm2d_add_relu_forward_train_cuda(CTX(ctx), n, hw, c, x, NULL, gamma,
                                            beta, z, y, save_mean, save_invstd, running_mean,
                                            running_var, momentum, eps);
}

static void nc_bn_eval(void *ctx, int n, int hw, int c, const float *x, const float *gamma,
                       const float *beta, const float *running_mean, const float *running_var,
                       float eps, float *y) {
    batchnorm2d_forward_eval_cuda(CTX(ctx), n, hw, c, x, NULL, gamma, beta,
                                  running_mean, running_var, eps, y);
}

static void nc_bn_backward(void *ctx, int n, int hw, int c, const float *x, const float *gamma,
                           const float *save_mean, const float *save_invstd, const float *dy,
                           float *dx, float *dgamma, float *dbeta) {
    batchnorm2d_backward_cuda(CTX(ctx), n, hw, c, x, gamma, save_mean, save_invstd, dy, dx, dgamma,
                              dbeta);
}

static void nc_bn_relu_backward(void *ctx, int n, int hw, int c, const float *x, const float *y,
                                const float *gamma, const float *save_mean,
                                const float *save_invstd, float *dy, float *dx, float *dgamma,
                                float *dbeta) {
    batchnorm2d_relu_backward_cuda(CTX(ctx), n, hw, c, x, y, gamma, save_mean, save_invstd, dy, dx,
                                   dgamma, dbeta);
}

static void nc_bn_relu_backward_keep(void *ctx, int n, int hw, int c, const float *x,
                                     const float *y, const float *gamma, const float *save_mean,
                                     const float *save_invstd, float *dy, float *dx, float *dgamma,
                                     float *dbeta) {
    batchnorm2d_relu_backward_keep_cuda(CTX(ctx), n, hw, c, x, y, gamma, save_mean, save_invstd, dy,
                                        dx, dgamma, dbeta);
}

/* The conv without its bias, then the batch norm bn adding the bias as it reads the
 * conv's output (x_bias: written back, so conv_out holds conv + bias after it). */
static void nc_conv_bn_forward(void *ctx, void *plan, int n, const float *x, const float *weight,
                               const float *bias, float *conv_out, void *ws, size_t ws_bytes,
                               const NetBnForward *bn) {
    CudaCtx *cc = CTX(ctx);
    conv_cuda_forward(cc, PLAN(plan), n, x, cuda_bf16_weight(cc, weight), NULL, conv_out, ws,
                      ws_bytes);
    switch (bn->kind) {
    case NET_BN_EVAL:
        batchnorm2d_forward_eval_cuda(cc, n, bn->hw, bn->c, conv_out, bias, bn->gamma, bn->beta,
                                      bn->running_mean, bn->running_var, bn->eps, bn->y);
        break;
    case NET_BN_TRAIN:
        batchnorm2d_forward_train_cuda(cc, n, bn->hw, bn->c, conv_out, bias, bn->gamma, bn->beta,
                                       bn->y, bn->save_mean, bn->save_invstd, bn->running_mean,
                                       bn->running_var, bn->momentum, bn->eps);
        break;
    case NET_BN_TRAIN_RELU:
        batchnorm2d_relu_forward_train_cuda(cc, n, bn->hw, bn->c, conv_out, bias, bn->gamma,
                                            bn->beta, bn->y, bn->save_mean, bn->save_invstd,
                                            bn->running_mean, bn->running_var, bn->momentum,
                                            bn->eps);
        break;
    case NET_BN_TRAIN_ADD_RELU: /* one pass: bn->tmp is never needed */
        batchnorm2d_add_relu_forward_train_cuda(cc, n, bn->hw, bn->c, conv_out, bias, bn->gamma,
                                                bn->beta, bn->z, bn->y, bn->save_mean,
                                                bn->save_invstd, bn->running_mean,
                                                bn->running_var, bn->momentum, bn->eps);
        break;
    }
}

/* The batch-norm backward bn writing the conv's bias gradient (the column sum of its
 * dx) itself, then the conv backward from that dx without a bias gradient. */
static void nc_bn_conv_backward(void *ctx, const NetBnBackward *bn, void *plan, int n,
                                const float *x, const float *weight, float *dx, float *dweight,
                                float *dbias, void *ws, size_t ws_bytes, int acc) {
    const float *y = bn->kind == NET_BN_BACKWARD ? NULL : bn->y;
    batchnorm2d_backward_bias_cuda(CTX(ctx), n, bn->hw, bn->c, bn->x, y, bn->gamma, bn->save_mean,
                                   bn->save_invstd, bn->dy, bn->dx, bn->dgamma, bn->dbeta, dbias,
                                   bn->kind == NET_BN_RELU_BACKWARD_KEEP);
    nc_conv_backward_into(ctx, plan, n, x, weight, bn->dx, dx, dweight, NULL, ws, ws_bytes, acc);
}

static void nc_relu_forward(void *ctx, size_t count, const float *x, float *y) {
    relu_forward_cuda(CTX(ctx), count, x, y);
}

static void nc_relu_backward(void *ctx, size_t count, const float *y, const float *dy, float *dx) {
    relu_backward_cuda(CTX(ctx), count, y, dy, dx);
}

static void nc_add(void *ctx, size_t count, const float *a, const float *b, float *y) {
    add_forward_cuda(CTX(ctx), count, a, b, y);
}

static void nc_add_relu(void *ctx, size_t count, const float *a, const float *b, float *y) {
    add_relu_forward_cuda(CTX(ctx), count, a, b, y);
}

static void nc_meanpool_forward(void *ctx, int n, int hw, int c, const float *x, float *y) {
    meanpool_forward_cuda(CTX(ctx), n, hw, c, x, y);
}

static void nc_meanpool_backward(void *ctx, int n, int hw, int c, const float *dy, float *dx) {
    meanpool_backward_cuda(CTX(ctx), n, hw, c, dy, dx);
}

static void nc_linear_forward(void *ctx, int n, int in, int out, const float *x,
                              const float *weight, const float *bias, float *y) {
    linear_forward_cuda(CTX(ctx), n, in, out, x, weight, bias, y);
}

static void nc_linear_backward(void *ctx, int n, int in, int out, const float *x,
                               const float *weight, const float *dy, float *dx, float *dweight,
                               float *dbias) {
    linear_backward_cuda(CTX(ctx), n, in, out, x, weight, dy, dx, dweight, dbias);
}

static void nc_xent(void *ctx, int n, int k, const float *logits, const int32_t *labels,
                    float smoothing, float *dlogits, float *loss, int *correct) {
    softmax_xent_cuda_async(CTX(ctx), n, k, logits, labels, smoothing, dlogits, loss, correct, NULL);
}

static void nc_sgd(void *ctx, size_t count, float *param, const float *grad, float *momentum_buf,
                   const uint8_t *decay_mask, const float *lr, float momentum, float weight_decay,
                   int nesterov, const int32_t *first_step) {
    sgd_update_cuda_dev(CTX(ctx), count, param, grad, momentum_buf, decay_mask, lr, momentum,
                        weight_decay, nesterov, first_step);
}

static NetOps nc_table(void) {
    NetOps t;
    memset(&t, 0, sizeof t);
    t.name = "cuda";
    t.align = NET_CUDA_ALIGN;
    t.alloc = nc_alloc;
    t.release = nc_release;
    t.copy = nc_copy;
    t.conv_plan = nc_conv_plan;
    t.conv_workspace_bytes = nc_conv_workspace_bytes;
    t.conv_plan_free = nc_conv_plan_free;
    t.conv_prepare = nc_conv_prepare;
    t.conv_forward = nc_conv_forward;
    t.conv_backward = nc_conv_backward;
    t.conv_weight_export = nc_conv_weight_export;
    t.conv_weight_import = nc_conv_weight_import;
    t.bn_train = nc_bn_train;
    t.bn_relu_train = nc_bn_relu_train;
    t.bn_add_relu_train = nc_bn_add_relu_train;
    t.bn_eval = nc_bn_eval;
    t.bn_backward = nc_bn_backward;
    t.bn_relu_backward = nc_bn_relu_backward;
    t.bn_relu_backward_keep = nc_bn_relu_backward_keep; /* the block's ReLU and add folded */
    t.conv_backward_acc = nc_conv_backward_acc;
    t.conv_bn_forward = nc_conv_bn_forward; /* the conv bias inside the BN's read */
    t.bn_conv_backward = nc_bn_conv_backward; /* the conv bias gradient from the BN's kernels */
    t.relu_forward = nc_relu_forward;
    t.relu_backward = nc_relu_backward;
    t.add = nc_add;
    t.add_relu = nc_add_relu;
    t.meanpool_forward = nc_meanpool_forward;
    t.meanpool_backward = nc_meanpool_backward;
    t.linear_forward = nc_linear_forward;
    t.linear_backward = nc_linear_backward;
    t.xent = nc_xent;
    t.sgd = nc_sgd;
    return t;
}

extern "C" const NetOps *net_cuda_ops(void) {
    static const NetOps table = nc_table();
    return &table;
}
