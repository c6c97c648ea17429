/* net_cuda.cu: the CUDA op table of the network executor (net.h, net_ops.h), with
 * the CudaCtx as the table's ctx. Most entries are the ops_cuda.h ops themselves
 * (they take net_ops.h's signatures: relu_forward_cuda, batchnorm2d_*_cuda,
 * linear_*_cuda, ...); what is here is the few entries that are more than one op:
 *   - memory: cuda_alloc / cuda_free, which need no context;
 *   - the convolutions: plans are ConvCuda (cuDNN descriptors and algorithms, made
 *     with this table's workspace limit); conv weights live on the device in cuDNN's
 *     NHWC filter layout (KRSC), converted only by conv_weight_export /
 *     conv_weight_import; in a bf16 context the convs read and write the bf16
 *     shadows of their weight and weight gradient (cuda_bf16_weight / _grad), which
 *     the one-off conv forms (conv2d_*_cuda) do not have;
 *   - the loss, without the per-row predictions the engine's evaluation asks for;
 *   - net_ops.h's optional fusions: conv_bn_forward leaves the conv bias to the
 *     batch norm that reads the conv's output (no bias pass), and bn_conv_backward
 *     has the BN backward write the conv's bias gradient (the column sum of its dx)
 *     directly (no column-sum pass, no copy). Every entry runs its kernels when
 *     called: no state is kept between calls.
 *
 * bf16 (ops_cuda.h, "bf16 activations"): the same table; the activations are
 * bfloat16 in the executor's float-typed buffers.
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

static void *nc_conv_plan(void *ctx, const ConvSpec *cs, int max_n, int h, int w, int backward,
                          int need_dx) {
    return conv_cuda_create(CTX(ctx), cs, max_n, h, w, NET_CUDA_CONV_WS_LIMIT, backward, need_dx);
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

/* The conv without its bias, then the batch norm bn adding the bias as it reads the
 * conv's output (x_bias: written back, so conv_out holds conv + bias after it). */
static void nc_conv_bn_forward(void *ctx, void *plan, int n, const float *x, const float *weight,
                               const float *bias, float *conv_out, void *ws, size_t ws_bytes,
                               const NetBnForward *bn) {
    conv_cuda_forward(CTX(ctx), PLAN(plan), n, x, cuda_bf16_weight(CTX(ctx), weight), NULL,
                      conv_out, ws, ws_bytes);
    batchnorm2d_forward_bias_cuda(ctx, n, conv_out, bias, bn);
}

/* The batch-norm backward bn writing the conv's bias gradient (the column sum of its
 * dx) itself, then the conv backward from that dx without a bias gradient. */
static void nc_bn_conv_backward(void *ctx, const NetBnBackward *bn, void *plan, int n,
                                const float *x, const float *weight, float *dx, float *dweight,
                                float *dbias, void *ws, size_t ws_bytes, int acc) {
    batchnorm2d_backward_bias_cuda(ctx, n, bn, dbias);
    nc_conv_backward_into(ctx, plan, n, x, weight, bn->dx, dx, dweight, NULL, ws, ws_bytes, acc);
}

static void nc_xent(void *ctx, int n, int k, const float *logits, const int32_t *labels,
                    float smoothing, float *dlogits, float *loss, int *correct) {
    softmax_xent_cuda_async(CTX(ctx), n, k, logits, labels, smoothing, dlogits, loss, correct, NULL);
}

static NetOps nc_table(void) {
    NetOps t;
    memset(&t, 0, sizeof t);
    t.name = "cuda";
    t.align = NET_CUDA_ALIGN;
    t.alloc = nc_alloc;
    t.release = nc_release;
    t.copy = cuda_copy_d2d_async;
    t.conv_plan = nc_conv_plan;
    t.conv_workspace_bytes = conv_cuda_workspace_bytes;
    t.conv_plan_free = conv_cuda_free;
    t.conv_prepare = conv_cuda_prepare;
    t.conv_forward = nc_conv_forward;
    t.conv_backward = nc_conv_backward;
    t.conv_weight_export = nc_conv_weight_export;
    t.conv_weight_import = nc_conv_weight_import;
    t.bn_train = batchnorm2d_forward_train_cuda;
    t.bn_relu_train = batchnorm2d_relu_forward_train_cuda;
    t.bn_add_relu_train = batchnorm2d_add_relu_forward_train_cuda;
    t.bn_eval = batchnorm2d_forward_eval_cuda;
    t.bn_backward = batchnorm2d_backward_cuda;
    t.bn_relu_backward = batchnorm2d_relu_backward_cuda;
    t.bn_relu_backward_keep = batchnorm2d_relu_backward_keep_cuda; /* the block's ReLU and add folded */
    t.conv_backward_acc = nc_conv_backward_acc;
    t.conv_bn_forward = nc_conv_bn_forward; /* the conv bias inside the BN's read */
    t.bn_conv_backward = nc_bn_conv_backward; /* the conv bias gradient from the BN's kernels */
    t.relu_forward = relu_forward_cuda;
    t.relu_backward = relu_backward_cuda;
    t.add = add_forward_cuda;
    t.add_relu = add_relu_forward_cuda;
    t.meanpool_forward = meanpool_forward_cuda;
    t.meanpool_backward = meanpool_backward_cuda;
    t.linear_forward = linear_forward_cuda;
    t.linear_backward = linear_backward_cuda;
    t.xent = nc_xent;
    t.sgd = sgd_update_cuda_dev;
    return t;
}

extern "C" const NetOps *net_cuda_ops(void) {
    static const NetOps table = nc_table();
    return &table;
}
