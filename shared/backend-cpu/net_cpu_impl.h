/* net_cpu_impl.h: the CPU's op table for the executor (net_ops.h), written once over
 * the scalar type: each entry is the ops.h op of the same name (a conv plan is just
 * the layer's spec and input size; weights stay in PyTorch's layout). Define before
 * including, once per translation unit: NET_REAL and NET_T(name) as for net_ops.h,
 * and NET_CPU_OP(name), the op `name` to call (ops.h's, or e.g. ops_d_##name).
 * Defines `const struct NET_T(NetOps) NET_T(net_cpu_ops)`. */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/ops.h"

typedef NET_REAL real_t;

/* 16-element alignment: 64 bytes for float, as every CPU buffer. */
#define NET_CPU_ALIGN (16 * sizeof(real_t))

typedef struct {
    ConvSpec cs;
    int max_n, h, w;
    int need_dx; /* net_ops.h: 0 when the backward gets no dx */
} NetCpuConv;

static void *net_cpu_alloc(void *ctx, size_t bytes) {
    (void)ctx;
    return xmalloc_aligned(bytes);
}

static void net_cpu_release(void *ctx, void *ptr) {
    (void)ctx;
    free(ptr);
}

static void net_cpu_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    if (dst != src) memmove(dst, src, bytes);
}

static void net_cpu_team(void *ctx, void (*body)(void *arg), void *arg) {
    (void)ctx;
    ops_team_run(body, arg);
}

static void *net_cpu_conv_plan(void *ctx, const ConvSpec *cs, int max_n, int h, int w, int backward,
                               int need_dx) {
    (void)ctx;
    (void)backward;
    NetCpuConv *p = xcalloc(1, sizeof *p);
    p->cs = *cs;
    p->need_dx = need_dx;
    p->max_n = max_n;
    p->h = h;
    p->w = w;
    return p;
}

static size_t net_cpu_conv_workspace_bytes(void *ctx, void *plan) {
    (void)ctx;
    const NetCpuConv *p = plan;
    return NET_CPU_OP(conv2d_workspace_floats)(&p->cs, p->max_n, p->h, p->w) * sizeof(real_t);
}

static void net_cpu_conv_plan_free(void *ctx, void *plan) {
    (void)ctx;
    free(plan);
}

static void net_cpu_conv_prepare(void *ctx, void *plan, int n, size_t ws_bytes) {
    (void)ctx;
    (void)plan;
    (void)n;
    (void)ws_bytes;
}

static void net_cpu_conv_forward(void *ctx, void *plan, int n, const real_t *x, const real_t *weight,
                                 const real_t *bias, real_t *y, void *ws, size_t ws_bytes) {
    (void)ctx;
    (void)ws_bytes;
    const NetCpuConv *p = plan;
    NET_CPU_OP(conv2d_forward)(&p->cs, n, p->h, p->w, x, weight, bias, y, ws);
}

static void net_cpu_conv_backward(void *ctx, void *plan, int n, const real_t *x, const real_t *weight,
                                  const real_t *dy, real_t *dx, real_t *dweight, real_t *dbias,
                                  void *ws, size_t ws_bytes) {
    (void)ctx;
    (void)ws_bytes;
    const NetCpuConv *p = plan;
    /* the contract the GPU's plans rely on (no backward-data algorithm planned) */
    if (dx && !p->need_dx) die("model: conv backward with a dx on a plan made without need_dx (internal error)");
    NET_CPU_OP(conv2d_backward)(&p->cs, n, p->h, p->w, x, weight, dy, dx, dweight, dbias, ws);
}

static void net_cpu_conv_weight_copy(void *ctx, void *plan, const real_t *src, real_t *dst) {
    const NetCpuConv *p = plan;
    size_t n = (size_t)p->cs.cout * p->cs.cin * p->cs.k * p->cs.k;
    net_cpu_copy(ctx, dst, src, n * sizeof(real_t));
}

static void net_cpu_bn_train(void *ctx, int n, int hw, int c, const real_t *x, const real_t *gamma,
                             const real_t *beta, real_t *y, real_t *save_mean, real_t *save_invstd,
                             real_t *running_mean, real_t *running_var, float momentum, float eps) {
    (void)ctx;
    NET_CPU_OP(batchnorm2d_forward_train)(n * hw, c, x, gamma, beta, y, save_mean, save_invstd,
                                          running_mean, running_var, momentum, eps);
}

static void net_cpu_bn_relu_train(void *ctx, int n, int hw, int c, const real_t *x,
                                  const real_t *gamma, const real_t *beta, real_t *y,
                                  real_t *save_mean, real_t *save_invstd, real_t *running_mean,
                                  real_t *running_var, float momentum, float eps) {
    (void)ctx;
    NET_CPU_OP(batchnorm2d_relu_forward_train)(n * hw, c, x, gamma, beta, y, save_mean, save_invstd,
                                               running_mean, running_var, momentum, eps);
}

static void net_cpu_bn_add_relu_train(void *ctx, int n, int hw, int c, const real_t *x,
                                      const real_t *gamma, const real_t *beta, const real_t *z,
                                      real_t *tmp, real_t *y, real_t *save_mean,
                                      real_t *save_invstd, real_t *running_mean,
                                      real_t *running_var, float momentum, float eps) {
    (void)ctx;
    (void)tmp; /* one pass: no BN output in between */
    NET_CPU_OP(batchnorm2d_add_relu_forward_train)(n * hw, c, x, gamma, beta, z, y, save_mean,
                                                   save_invstd, running_mean, running_var,
                                                   momentum, eps);
}

static void net_cpu_bn_eval(void *ctx, int n, int hw, int c, const real_t *x, const real_t *gamma,
                            const real_t *beta, const real_t *running_mean,
                            const real_t *running_var, float eps, real_t *y) {
    (void)ctx;
    NET_CPU_OP(batchnorm2d_forward_eval)(n * hw, c, x, gamma, beta, running_mean, running_var, eps, y);
}

static void net_cpu_bn_backward(void *ctx, int n, int hw, int c, const real_t *x, const real_t *gamma,
                                const real_t *save_mean, const real_t *save_invstd,
                                const real_t *dy, real_t *dx, real_t *dgamma, real_t *dbeta) {
    (void)ctx;
    NET_CPU_OP(batchnorm2d_backward)(n * hw, c, x, gamma, save_mean, save_invstd, dy, dx, dgamma,
                                     dbeta);
}

static void net_cpu_bn_relu_backward(void *ctx, int n, int hw, int c, const real_t *x,
                                     const real_t *y, const real_t *gamma,
                                     const real_t *save_mean, const real_t *save_invstd,
                                     real_t *dy, real_t *dx, real_t *dgamma, real_t *dbeta) {
    (void)ctx;
    NET_CPU_OP(batchnorm2d_relu_backward)(n * hw, c, x, y, gamma, save_mean, save_invstd, dy, dx,
                                          dgamma, dbeta);
}

static void net_cpu_relu_forward(void *ctx, size_t count, const real_t *x, real_t *y) {
    (void)ctx;
    NET_CPU_OP(relu_forward)(count, x, y);
}

static void net_cpu_relu_backward(void *ctx, size_t count, const real_t *y, const real_t *dy,
                                  real_t *dx) {
    (void)ctx;
    NET_CPU_OP(relu_backward)(count, y, dy, dx);
}

static void net_cpu_add(void *ctx, size_t count, const real_t *a, const real_t *b, real_t *y) {
    (void)ctx;
    NET_CPU_OP(add_forward)(count, a, b, y);
}

static void net_cpu_add_relu(void *ctx, size_t count, const real_t *a, const real_t *b, real_t *y) {
    (void)ctx;
    NET_CPU_OP(add_relu_forward)(count, a, b, y);
}

static void net_cpu_meanpool_forward(void *ctx, int n, int hw, int c, const real_t *x, real_t *y) {
    (void)ctx;
    NET_CPU_OP(meanpool_forward)(n, hw, c, x, y);
}

static void net_cpu_meanpool_backward(void *ctx, int n, int hw, int c, const real_t *dy, real_t *dx) {
    (void)ctx;
    NET_CPU_OP(meanpool_backward)(n, hw, c, dy, dx);
}

static void net_cpu_linear_forward(void *ctx, int n, int in, int out, const real_t *x,
                                   const real_t *weight, const real_t *bias, real_t *y) {
    (void)ctx;
    NET_CPU_OP(linear_forward)(n, in, out, x, weight, bias, y);
}

static void net_cpu_linear_backward(void *ctx, int n, int in, int out, const real_t *x,
                                    const real_t *weight, const real_t *dy, real_t *dx,
                                    real_t *dweight, real_t *dbias) {
    (void)ctx;
    NET_CPU_OP(linear_backward)(n, in, out, x, weight, dy, dx, dweight, dbias);
}

static void net_cpu_xent(void *ctx, int n, int k, const real_t *logits, const int32_t *labels,
                         real_t smoothing, real_t *dlogits, real_t *loss, int *correct) {
    (void)ctx;
    /* serial: on one worker of the team (barrier after) */
#pragma omp single
    *loss = NET_CPU_OP(softmax_xent_forward_backward)(n, k, logits, labels, smoothing, dlogits,
                                                      correct);
}

static void net_cpu_sgd(void *ctx, size_t count, real_t *param, const real_t *grad,
                        real_t *momentum_buf, const uint8_t *decay_mask, const float *lr,
                        float momentum, float weight_decay, int nesterov, const int32_t *first_step) {
    (void)ctx;
    NET_CPU_OP(sgd_update)(count, param, grad, momentum_buf, decay_mask, *lr, momentum, weight_decay,
                           nesterov, *first_step);
}

const struct NET_T(NetOps) NET_T(net_cpu_ops) = {
    .name = "cpu",
    .align = NET_CPU_ALIGN,
    .alloc = net_cpu_alloc,
    .release = net_cpu_release,
    .copy = net_cpu_copy,
    .team = net_cpu_team,
    .conv_plan = net_cpu_conv_plan,
    .conv_workspace_bytes = net_cpu_conv_workspace_bytes,
    .conv_plan_free = net_cpu_conv_plan_free,
    .conv_prepare = net_cpu_conv_prepare,
    .conv_forward = net_cpu_conv_forward,
    .conv_backward = net_cpu_conv_backward,
    .conv_weight_export = net_cpu_conv_weight_copy,
    .conv_weight_import = net_cpu_conv_weight_copy,
    .bn_train = net_cpu_bn_train,
    .bn_relu_train = net_cpu_bn_relu_train,
    .bn_add_relu_train = net_cpu_bn_add_relu_train,
    .bn_eval = net_cpu_bn_eval,
    .bn_backward = net_cpu_bn_backward,
    .bn_relu_backward = net_cpu_bn_relu_backward,
    .relu_forward = net_cpu_relu_forward,
    .relu_backward = net_cpu_relu_backward,
    .add = net_cpu_add,
    .add_relu = net_cpu_add_relu,
    .meanpool_forward = net_cpu_meanpool_forward,
    .meanpool_backward = net_cpu_meanpool_backward,
    .linear_forward = net_cpu_linear_forward,
    .linear_backward = net_cpu_linear_backward,
    .xent = net_cpu_xent,
    .sgd = net_cpu_sgd,
};

#undef NET_CPU_ALIGN
