/* net_ops.h: the op contract: the table of ops a device hands to the network
 * executor (net.h), the one definition every backend implements (CPU:
 * backend-cpu/ops_cpu_impl.h, cpu_<entry>; CUDA: backend-cuda/net_cuda.cu) and that
 * tests/op_cases.h checks on each. Written once over a scalar type. No include
 * guard: a translation unit includes it once per instance, after defining
 *   NET_REAL      float or double
 *   NET_T(name)   the instance's name of type or function `name` (name, or name##D)
 * net.h instantiates it for float (NetOps: the CPU and CUDA tables); the gradient
 * tests instantiate it for double (NetOpsD: the CPU ops in double).
 *
 * Layout: activations are NHWC (rows = N*H*W, channels innermost), so a 1x1
 * convolution is one GEMM over the whole batch and batch norm reduces over rows.
 * Every op gets the table's ctx first (NULL for the CPU, the CudaCtx for CUDA); all
 * pointers are in the device's memory.
 *
 * Conventions for every backward:
 *   - parameter gradients (dweight, dbias, dgamma, dbeta) are OVERWRITTEN, not
 *     accumulated: every parameter is used once per step;
 *   - dx is overwritten; a NULL dx skips the input gradient (the stem conv);
 *   - results are bit-identical for any thread count (reductions over partitions
 *     fixed by the shapes, combined in a fixed order).
 *
 * The ops:
 *   conv_forward: y[n,oh,ow,cout] = conv(x[n,h,w,cin], weight) + bias, through the
 *     plan its table made for the layer (cuDNN descriptors and algorithms, or the
 *     CPU's spec and sizes); the weight is in the layout the table keeps on the
 *     device (conv_weight_export converts to PyTorch's [Cout][Cin][K][K]).
 *   conv_backward: from dy[n,oh,ow,cout]: dweight, dbias (overwritten), dx
 *     (overwritten unless NULL).
 *   bn_train: batch norm over the real shape (n images of hw pixels, c channels:
 *     rows = n*hw), training mode: normalises with the batch mean and biased
 *     variance, saves mean and 1/sqrt(var+eps) per channel for backward, and updates
 *     the running statistics as PyTorch does:
 *       running_mean = (1-momentum)*running_mean + momentum*mean
 *       running_var  = (1-momentum)*running_var  + momentum*var*rows/(rows-1)  (unbiased)
 *   bn_eval: inference mode: uses the running statistics.
 *   bn_backward: dx, dgamma, dbeta from dy and the saved statistics.
 *   bn_relu_train: bn_train then relu_forward in one pass over y (bit-identical
 *     results; NaN passes), for the bn -> relu pairs.
 *   bn_add_relu_train: y = max(bn_train(x) + z, 0) in one pass over y (bit-identical
 *     to the BN then add_relu; NaN passes), for the residual add that ends a block.
 *   bn_relu_backward: relu_backward (y: the ReLU's output, dy: its output gradient)
 *     then bn_backward (x: the BN's input), without materialising the masked
 *     gradient; bit-identical to the two ops. dx may equal dy; NULL dx skips it; dy
 *     may be overwritten (the executor never reads it again).
 *   xent: mean softmax cross-entropy over n rows of k logits with label smoothing
 *     (PyTorch's CrossEntropyLoss(label_smoothing=eps)). Writes dlogits (the gradient
 *     of the MEAN loss, i.e. already divided by n) when non-NULL, the rows whose
 *     arg-max equals the label into *correct when non-NULL, the mean loss into *loss;
 *     both in device memory, so a GPU step needs no synchronisation. Labels must be
 *     in [0, k).
 *   relu_forward: y = max(x, 0), NaN passes; in place allowed (y == x).
 *   relu_backward: dx = dy where y > 0 else 0; in place allowed (dx == dy).
 *   add: y = a + b; in place allowed. (Backward of an add is the identity.)
 *   add_relu: y = max(a + b, 0): the residual add fused with the block's ReLU.
 *   meanpool_forward / meanpool_backward: global mean pool x[n, hw, c] -> y[n, c].
 *   linear_forward: y[n, out] = x[n, in] * weight[out, in]^T + bias.
 *   linear_backward: dx (unless NULL), dweight, dbias from dy.
 *   sgd: SGD with momentum and weight decay over a flat buffer, PyTorch's rule:
 *       g = grad + weight_decay * param      (decay_mask[i] == 0 -> no decay)
 *       buf = momentum * buf + g             (the first step: buf = g)
 *       param -= lr * (nesterov ? g + momentum * buf : buf)
 *     decay_mask may be NULL (decay everything); lr and first_step are read from
 *     device memory when it runs (graph replays). */
#include <stddef.h>
#include <stdint.h>

#include "model/ops.h"

/* The batch norm of a fused conv + BN forward (conv_bn_forward), on n images (the
 * conv's) of hw pixels and c channels; the fields its kind's entry takes. */
struct NET_T(NetBnForward) {
    NetBnForwardKind kind;
    int hw, c;
    const NET_REAL *gamma, *beta;
    const NET_REAL *z; /* NET_BN_TRAIN_ADD_RELU: the residual */
    NET_REAL *tmp;     /* NET_BN_TRAIN_ADD_RELU: may hold the BN output */
    NET_REAL *y, *save_mean, *save_invstd, *running_mean, *running_var;
    float momentum, eps;
};

/* The batch norm of a fused BN + conv backward (bn_conv_backward): its input x, the
 * ReLU output y (the ReLU kinds), the gradients; dx is the conv's dy. */
struct NET_T(NetBnBackward) {
    NetBnBackwardKind kind;
    int hw, c;
    const NET_REAL *x, *y, *gamma, *save_mean, *save_invstd;
    NET_REAL *dy, *dx, *dgamma, *dbeta;
};

struct NET_T(NetOps) {
    const char *name;
    size_t align; /* bytes every planned buffer is aligned to */
    void *(*alloc)(void *ctx, size_t bytes);
    void (*release)(void *ctx, void *ptr);
    void (*copy)(void *ctx, void *dst, const void *src, size_t bytes); /* device to device */
    /* Optional (NULL: body(arg) runs once, on the calling thread): runs body(arg) on
     * every worker of the device's team, each walking the network and the ops sharing
     * out each op's work among them (the CPU: one OpenMP parallel region per forward
     * or backward, not one per op). Ops that write host memory once (xent's loss) do
     * it on one worker. */
    void (*team)(void *ctx, void (*body)(void *arg), void *arg);

    /* A plan for conv cs on inputs of up to max_n x h x w; backward == 0 for
     * inference-only executors (no backward algorithm is searched); need_dx == 0 for a
     * conv whose backward never computes the input's gradient (the stem: its input is
     * the image), so no backward-data algorithm is searched or sized for it (need_dx
     * is 0 whenever backward is). conv_backward on such a plan gets dx == NULL. */
    void *(*conv_plan)(void *ctx, const ConvSpec *cs, int max_n, int h, int w, int backward,
                       int need_dx);
    size_t (*conv_workspace_bytes)(void *ctx, void *plan);
    void (*conv_plan_free)(void *ctx, void *plan);
    /* Settle the plan for batch n (host work only, before a graph capture). */
    void (*conv_prepare)(void *ctx, void *plan, int n, size_t ws_bytes);
    void (*conv_forward)(void *ctx, void *plan, int n, const NET_REAL *x, const NET_REAL *weight,
                         const NET_REAL *bias, NET_REAL *y, void *ws, size_t ws_bytes);
    void (*conv_backward)(void *ctx, void *plan, int n, const NET_REAL *x, const NET_REAL *weight,
                          const NET_REAL *dy, NET_REAL *dx, NET_REAL *dweight, NET_REAL *dbias,
                          void *ws, size_t ws_bytes);
    /* Device layout of one conv weight <-> PyTorch's [Cout][Cin][K][K], out of place. */
    void (*conv_weight_export)(void *ctx, void *plan, const NET_REAL *dev, NET_REAL *kcrs);
    void (*conv_weight_import)(void *ctx, void *plan, const NET_REAL *kcrs, NET_REAL *dev);

    void (*bn_train)(void *ctx, int n, int hw, int c, const NET_REAL *x, const NET_REAL *gamma,
                     const NET_REAL *beta, NET_REAL *y, NET_REAL *save_mean,
                     NET_REAL *save_invstd, NET_REAL *running_mean, NET_REAL *running_var,
                     float momentum, float eps);
    /* bn_train then ReLU in one op. */
    void (*bn_relu_train)(void *ctx, int n, int hw, int c, const NET_REAL *x,
                          const NET_REAL *gamma, const NET_REAL *beta, NET_REAL *y,
                          NET_REAL *save_mean, NET_REAL *save_invstd, NET_REAL *running_mean,
                          NET_REAL *running_var, float momentum, float eps);
    /* y = relu(bn_train(x) + z); tmp (n*hw*c) may hold the BN output. */
    void (*bn_add_relu_train)(void *ctx, int n, int hw, int c, const NET_REAL *x,
                              const NET_REAL *gamma, const NET_REAL *beta, const NET_REAL *z,
                              NET_REAL *tmp, NET_REAL *y, NET_REAL *save_mean,
                              NET_REAL *save_invstd, NET_REAL *running_mean,
                              NET_REAL *running_var, float momentum, float eps);
    void (*bn_eval)(void *ctx, int n, int hw, int c, const NET_REAL *x, const NET_REAL *gamma,
                    const NET_REAL *beta, const NET_REAL *running_mean,
                    const NET_REAL *running_var, float eps, NET_REAL *y);
    void (*bn_backward)(void *ctx, int n, int hw, int c, const NET_REAL *x, const NET_REAL *gamma,
                        const NET_REAL *save_mean, const NET_REAL *save_invstd,
                        const NET_REAL *dy, NET_REAL *dx, NET_REAL *dgamma, NET_REAL *dbeta);
    /* ReLU backward (y: the ReLU output) then BN backward (x: the BN input). */
    void (*bn_relu_backward)(void *ctx, int n, int hw, int c, const NET_REAL *x,
                             const NET_REAL *y, const NET_REAL *gamma, const NET_REAL *save_mean,
                             const NET_REAL *save_invstd, NET_REAL *dy, NET_REAL *dx,
                             NET_REAL *dgamma, NET_REAL *dbeta);
    /* Optional, both or neither (NULL: net_impl.h's plain block backward, with a ReLU
     * backward pass and a residual add per block; the CPU's fp32 tables leave them NULL): the
     * block's output ReLU and its residual add folded into backward.
     *   bn_relu_backward_keep: bn_relu_backward (y: here the block output, the ReLU
     *     after the residual add) that also writes the masked dy back into dy (dx !=
     *     dy): the gradient an identity shortcut carries;
     *   conv_backward_acc: conv_backward that ACCUMULATES into dx (dx += the gradient
     *     of x; cuDNN's beta = 1); dx non-NULL. */
    void (*bn_relu_backward_keep)(void *ctx, int n, int hw, int c, const NET_REAL *x,
                                  const NET_REAL *y, const NET_REAL *gamma,
                                  const NET_REAL *save_mean, const NET_REAL *save_invstd,
                                  NET_REAL *dy, NET_REAL *dx, NET_REAL *dgamma, NET_REAL *dbeta);
    void (*conv_backward_acc)(void *ctx, void *plan, int n, const NET_REAL *x,
                              const NET_REAL *weight, const NET_REAL *dy, NET_REAL *dx,
                              NET_REAL *dweight, NET_REAL *dbias, void *ws, size_t ws_bytes);

    /* Optional fusions (NULL: composed from the plain entries, by
     * net_ops_conv_bn_forward and net_ops_bn_conv_backward below, which the walk
     * calls): a table's fused entry gives the composition's results (op_cases.h's
     * conv -> BN cases check it against the CPU's composition).
     *   conv_bn_forward: conv_forward of x into conv_out, then the batch norm bn of
     *     conv_out. The CUDA table leaves the conv bias to the BN's read of conv_out
     *     (no bias pass; conv_out holds conv + bias after it).
     *   bn_conv_backward: the batch-norm backward bn (bn->dx: the conv's dy), then the
     *     conv_backward (acc: conv_backward_acc) of the conv whose output the BN read.
     *     The CUDA table's BN kernels write the conv's bias gradient (the column sum of
     *     bn->dx) themselves (no column sum in the conv backward). */
    void (*conv_bn_forward)(void *ctx, void *plan, int n, const NET_REAL *x,
                            const NET_REAL *weight, const NET_REAL *bias, NET_REAL *conv_out,
                            void *ws, size_t ws_bytes, const struct NET_T(NetBnForward) *bn);
    void (*bn_conv_backward)(void *ctx, const struct NET_T(NetBnBackward) *bn, void *plan, int n,
                             const NET_REAL *x, const NET_REAL *weight, NET_REAL *dx,
                             NET_REAL *dweight, NET_REAL *dbias, void *ws, size_t ws_bytes,
                             int acc);

    void (*relu_forward)(void *ctx, size_t count, const NET_REAL *x, NET_REAL *y);
    void (*relu_backward)(void *ctx, size_t count, const NET_REAL *y, const NET_REAL *dy,
                          NET_REAL *dx);
    void (*add)(void *ctx, size_t count, const NET_REAL *a, const NET_REAL *b, NET_REAL *y);
    void (*add_relu)(void *ctx, size_t count, const NET_REAL *a, const NET_REAL *b, NET_REAL *y);
    void (*meanpool_forward)(void *ctx, int n, int hw, int c, const NET_REAL *x, NET_REAL *y);
    void (*meanpool_backward)(void *ctx, int n, int hw, int c, const NET_REAL *dy, NET_REAL *dx);
    void (*linear_forward)(void *ctx, int n, int in, int out, const NET_REAL *x,
                           const NET_REAL *weight, const NET_REAL *bias, NET_REAL *y);
    void (*linear_backward)(void *ctx, int n, int in, int out, const NET_REAL *x,
                            const NET_REAL *weight, const NET_REAL *dy, NET_REAL *dx,
                            NET_REAL *dweight, NET_REAL *dbias);
    void (*xent)(void *ctx, int n, int k, const NET_REAL *logits, const int32_t *labels,
                 NET_REAL smoothing, NET_REAL *dlogits, NET_REAL *loss, int *correct);
    void (*sgd)(void *ctx, size_t count, NET_REAL *param, const NET_REAL *grad,
                NET_REAL *momentum_buf, const uint8_t *decay_mask, const float *lr,
                float momentum, float weight_decay, int nesterov, const int32_t *first_step);
};

/* The batch norm bn of x through the plain entry of its kind. */
static inline void NET_T(net_ops_bn_forward)(const struct NET_T(NetOps) *o, void *ctx, int n,
                                             const NET_REAL *x,
                                             const struct NET_T(NetBnForward) *bn) {
    switch (bn->kind) {
    case NET_BN_EVAL:
        o->bn_eval(ctx, n, bn->hw, bn->c, x, bn->gamma, bn->beta, bn->running_mean,
                   bn->running_var, bn->eps, bn->y);
        break;
    case NET_BN_TRAIN:
        o->bn_train(ctx, n, bn->hw, bn->c, x, bn->gamma, bn->beta, bn->y, bn->save_mean,
                    bn->save_invstd, bn->running_mean, bn->running_var, bn->momentum, bn->eps);
        break;
    case NET_BN_TRAIN_RELU:
        o->bn_relu_train(ctx, n, bn->hw, bn->c, x, bn->gamma, bn->beta, bn->y, bn->save_mean,
                         bn->save_invstd, bn->running_mean, bn->running_var, bn->momentum,
                         bn->eps);
        break;
    case NET_BN_TRAIN_ADD_RELU:
        o->bn_add_relu_train(ctx, n, bn->hw, bn->c, x, bn->gamma, bn->beta, bn->z, bn->tmp, bn->y,
                             bn->save_mean, bn->save_invstd, bn->running_mean, bn->running_var,
                             bn->momentum, bn->eps);
        break;
    }
}

/* conv_bn_forward, or its composition. */
static inline void NET_T(net_ops_conv_bn_forward)(const struct NET_T(NetOps) *o, void *ctx,
                                                  void *plan, int n, const NET_REAL *x,
                                                  const NET_REAL *weight, const NET_REAL *bias,
                                                  NET_REAL *conv_out, void *ws, size_t ws_bytes,
                                                  const struct NET_T(NetBnForward) *bn) {
    if (o->conv_bn_forward) {
        o->conv_bn_forward(ctx, plan, n, x, weight, bias, conv_out, ws, ws_bytes, bn);
        return;
    }
    o->conv_forward(ctx, plan, n, x, weight, bias, conv_out, ws, ws_bytes);
    NET_T(net_ops_bn_forward)(o, ctx, n, conv_out, bn);
}

/* The batch-norm backward bn through the plain entry of its kind. */
static inline void NET_T(net_ops_bn_backward)(const struct NET_T(NetOps) *o, void *ctx, int n,
                                              const struct NET_T(NetBnBackward) *bn) {
    switch (bn->kind) {
    case NET_BN_BACKWARD:
        o->bn_backward(ctx, n, bn->hw, bn->c, bn->x, bn->gamma, bn->save_mean, bn->save_invstd,
                       bn->dy, bn->dx, bn->dgamma, bn->dbeta);
        break;
    case NET_BN_RELU_BACKWARD:
        o->bn_relu_backward(ctx, n, bn->hw, bn->c, bn->x, bn->y, bn->gamma, bn->save_mean,
                            bn->save_invstd, bn->dy, bn->dx, bn->dgamma, bn->dbeta);
        break;
    case NET_BN_RELU_BACKWARD_KEEP:
        o->bn_relu_backward_keep(ctx, n, bn->hw, bn->c, bn->x, bn->y, bn->gamma, bn->save_mean,
                                 bn->save_invstd, bn->dy, bn->dx, bn->dgamma, bn->dbeta);
        break;
    }
}

/* bn_conv_backward, or its composition. */
static inline void NET_T(net_ops_bn_conv_backward)(const struct NET_T(NetOps) *o, void *ctx,
                                                   const struct NET_T(NetBnBackward) *bn,
                                                   void *plan, int n, const NET_REAL *x,
                                                   const NET_REAL *weight, NET_REAL *dx,
                                                   NET_REAL *dweight, NET_REAL *dbias, void *ws,
                                                   size_t ws_bytes, int acc) {
    if (o->bn_conv_backward) {
        o->bn_conv_backward(ctx, bn, plan, n, x, weight, dx, dweight, dbias, ws, ws_bytes, acc);
        return;
    }
    NET_T(net_ops_bn_backward)(o, ctx, n, bn);
    (acc ? o->conv_backward_acc : o->conv_backward)(ctx, plan, n, x, weight, bn->dx, dx, dweight,
                                                    dbias, ws, ws_bytes);
}
