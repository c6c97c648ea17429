/* op_cases.h: one table of op cases (op, shapes, tolerance) run on any pair of
 * backends through the executor's op table (net_ops.h), so that "this op on that
 * device agrees with the reference" is written once:
 *   - test_ops.c: every CPU instruction-set variant against the baseline;
 *   - test_ops_cuda.c: the CUDA table against the CPU table (the conv -> BN pairs
 *     exercise the CUDA table's deferred conv bias and its folded gradient).
 * (The CPU ops in double against finite differences stay in test_ops.c.)
 * Each case builds its inputs once on the host (fixed pseudo-random values), runs
 * on the reference and on the backend under test, and compares every output with
 * |got - want| <= atol + rtol*|want|. Checks are counted by tests/unit.h.
 * Include after unit.h and nn/net.h. */
#ifndef CIFAR_TESTS_OP_CASES_H
#define CIFAR_TESTS_OP_CASES_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nn/net.h"
#include "util/check.h"

/* A device: its op table and context, host <-> device copies, and a hook run
 * before its ops (e.g. select an instruction set). */
typedef struct {
    const char *name;
    const NetOps *ops;
    void *ctx;
    void (*upload)(void *ctx, void *dev, const void *host, size_t bytes);
    void (*download)(void *ctx, void *host, const void *dev, size_t bytes);
    void (*select)(const void *arg);
    const void *select_arg;
} OpBackend;

typedef enum {
    OPC_CONV,          /* conv forward + backward (dx, dweight, dbias) */
    OPC_BN_TRAIN,      /* y, save_mean, save_invstd, running stats */
    OPC_BN_RELU_TRAIN,
    OPC_BN_ADD_RELU_TRAIN,
    OPC_BN_EVAL,
    OPC_BN_BACKWARD,   /* dx, dgamma, dbeta */
    OPC_BN_RELU_BACKWARD,
    OPC_RELU,          /* forward and backward */
    OPC_ADD_RELU,      /* add, add_relu */
    OPC_MEANPOOL,      /* forward and backward */
    OPC_LINEAR,        /* forward and backward */
    OPC_XENT,          /* loss, hits, dlogits */
    OPC_SGD,           /* param, momentum */
    OPC_CONV_BN,       /* conv -> bn+relu train -> bn+relu backward -> conv backward (the
                        * executor's pairing: the CUDA table's deferred conv bias) */
    OPC_CONV_BN_EVAL,  /* conv -> bn eval */
} OpKind;

typedef struct {
    OpKind op;
    int n, hw, c, k; /* images, pixels per image, channels; k: classes / outputs */
    ConvSpec cs;     /* OPC_CONV: the conv on an h x w = hw x k input */
    float atol, rtol;
    const char *label;
} OpCase;

#define OPC_MAX_TENSORS 16

/* The host side of one run: inputs shared by both backends, outputs per backend. */
typedef struct {
    float *in[OPC_MAX_TENSORS];
    size_t in_n[OPC_MAX_TENSORS];
    int n_in;
    float *out[OPC_MAX_TENSORS];
    size_t out_n[OPC_MAX_TENSORS];
    const char *out_name[OPC_MAX_TENSORS];
    int n_out;
} OpcRun;

static uint64_t opc_seed = 0x2545F4914F6CDD1Dull;

static float opc_rand(float lo, float hi) {
    opc_seed ^= opc_seed << 13;
    opc_seed ^= opc_seed >> 7;
    opc_seed ^= opc_seed << 17;
    return lo + (hi - lo) * (float)((opc_seed >> 11) * (1.0 / 9007199254740992.0));
}

static float *opc_host_rand(OpcRun *r, size_t n, float lo, float hi) {
    float *v = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = opc_rand(lo, hi);
    r->in[r->n_in] = v;
    r->in_n[r->n_in++] = n;
    return v;
}

/* Device copy of host input i (the backend's memory). */
static float *opc_dev_in(const OpBackend *b, const OpcRun *r, int i) {
    float *d = b->ops->alloc(b->ctx, (r->in_n[i] ? r->in_n[i] : 1) * sizeof(float));
    b->upload(b->ctx, d, r->in[i], r->in_n[i] * sizeof(float));
    return d;
}

static float *opc_dev_zero(const OpBackend *b, size_t n) {
    float *h = xcalloc(n ? n : 1, sizeof(float));
    float *d = b->ops->alloc(b->ctx, (n ? n : 1) * sizeof(float));
    b->upload(b->ctx, d, h, n * sizeof(float));
    free(h);
    return d;
}

/* Download device tensor d (n floats) as output `name`, then free it. */
static void opc_take(const OpBackend *b, OpcRun *r, const char *name, float *d, size_t n) {
    float *h = xmalloc((n ? n : 1) * sizeof(float));
    b->download(b->ctx, h, d, n * sizeof(float));
    b->ops->release(b->ctx, d);
    r->out[r->n_out] = h;
    r->out_n[r->n_out] = n;
    r->out_name[r->n_out++] = name;
}

/* Inputs of a case, drawn once (their order is each op's argument order). */
static void opc_make_inputs(const OpCase *c, OpcRun *r) {
    size_t rows = (size_t)c->n * c->hw, nx = rows * c->c;
    switch (c->op) {
    case OPC_CONV: {
        const ConvSpec *s = &c->cs;
        int oh = conv_out_size(c->hw, s->k, s->stride, s->pad), ow = conv_out_size(c->k, s->k, s->stride, s->pad);
        opc_host_rand(r, (size_t)c->n * c->hw * c->k * s->cin, -1, 1);         /* x */
        opc_host_rand(r, (size_t)s->cout * s->cin * s->k * s->k, -0.5f, 0.5f);  /* weight (KCRS) */
        opc_host_rand(r, (size_t)s->cout, -0.5f, 0.5f);                        /* bias */
        opc_host_rand(r, (size_t)c->n * oh * ow * s->cout, -1, 1);             /* dy */
        break;
    }
    case OPC_CONV_BN:
    case OPC_CONV_BN_EVAL: {
        const ConvSpec *s = &c->cs;
        int oh = conv_out_size(c->hw, s->k, s->stride, s->pad), ow = conv_out_size(c->k, s->k, s->stride, s->pad);
        opc_host_rand(r, (size_t)c->n * c->hw * c->k * s->cin, -1, 1);         /* x */
        opc_host_rand(r, (size_t)s->cout * s->cin * s->k * s->k, -0.5f, 0.5f);  /* weight (KCRS) */
        opc_host_rand(r, (size_t)s->cout, -0.5f, 0.5f);                        /* conv bias */
        opc_host_rand(r, (size_t)c->n * oh * ow * s->cout, -1, 1);             /* dy of the BN+ReLU */
        opc_host_rand(r, (size_t)s->cout, 0.5f, 1.5f);                         /* gamma */
        opc_host_rand(r, (size_t)s->cout, -0.5f, 0.5f);                        /* beta */
        opc_host_rand(r, (size_t)s->cout, -0.2f, 0.2f);                        /* running mean */
        opc_host_rand(r, (size_t)s->cout, 0.5f, 1.5f);                         /* running var */
        break;
    }
    case OPC_BN_TRAIN:
    case OPC_BN_RELU_TRAIN:
    case OPC_BN_ADD_RELU_TRAIN:
    case OPC_BN_EVAL:
        opc_host_rand(r, nx, -2, 3);                  /* x */
        opc_host_rand(r, (size_t)c->c, 0.5f, 1.5f);   /* gamma */
        opc_host_rand(r, (size_t)c->c, -0.5f, 0.5f);  /* beta */
        opc_host_rand(r, (size_t)c->c, -0.2f, 0.2f);  /* running mean */
        opc_host_rand(r, (size_t)c->c, 0.5f, 1.5f);   /* running var */
        opc_host_rand(r, nx, -1, 1);                  /* z (the residual) */
        break;
    case OPC_BN_BACKWARD:
    case OPC_BN_RELU_BACKWARD:
        opc_host_rand(r, nx, -2, 3);                  /* x */
        opc_host_rand(r, nx, -1, 1);                  /* y: the ReLU output (sign matters) */
        opc_host_rand(r, (size_t)c->c, 0.5f, 1.5f);   /* gamma */
        opc_host_rand(r, (size_t)c->c, -0.3f, 0.3f);  /* save_mean */
        opc_host_rand(r, (size_t)c->c, 0.5f, 1.5f);   /* save_invstd */
        opc_host_rand(r, nx, -1, 1);                  /* dy */
        for (size_t i = 0; i < nx; i++) r->in[1][i] = r->in[1][i] < 0 ? 0 : r->in[1][i];
        break;
    case OPC_RELU:
    case OPC_ADD_RELU:
        opc_host_rand(r, nx, -1, 1);
        opc_host_rand(r, nx, -1, 1);
        break;
    case OPC_MEANPOOL:
        opc_host_rand(r, nx, -1, 1);                  /* x */
        opc_host_rand(r, (size_t)c->n * c->c, -1, 1); /* dy */
        break;
    case OPC_LINEAR:
        opc_host_rand(r, (size_t)c->n * c->c, -1, 1);       /* x [n][in] */
        opc_host_rand(r, (size_t)c->k * c->c, -0.5f, 0.5f); /* weight [out][in] */
        opc_host_rand(r, (size_t)c->k, -0.5f, 0.5f);        /* bias */
        opc_host_rand(r, (size_t)c->n * c->k, -1, 1);       /* dy */
        break;
    case OPC_XENT:
        opc_host_rand(r, (size_t)c->n * c->k, -4, 4);  /* logits */
        opc_host_rand(r, (size_t)c->n, 0, (float)c->k); /* labels (as floats) */
        break;
    case OPC_SGD:
        opc_host_rand(r, nx, -1, 1);     /* param */
        opc_host_rand(r, nx, -0.1f, 0.1f); /* grad */
        opc_host_rand(r, nx, -0.1f, 0.1f); /* momentum buffer */
        break;
    }
}

static void opc_run_conv(const OpCase *c, const OpBackend *b, OpcRun *r) {
    const ConvSpec *s = &c->cs;
    void *plan = b->ops->conv_plan(b->ctx, s, c->n, c->hw, c->k, 1);
    size_t wn = r->in_n[1], ws_bytes = b->ops->conv_workspace_bytes(b->ctx, plan);
    void *ws = b->ops->alloc(b->ctx, ws_bytes ? ws_bytes : 1);
    float *x = opc_dev_in(b, r, 0), *wk = opc_dev_in(b, r, 1), *bias = opc_dev_in(b, r, 2);
    float *dy = opc_dev_in(b, r, 3), *w = opc_dev_zero(b, wn), *dwd = opc_dev_zero(b, wn);
    float *y = opc_dev_zero(b, r->in_n[3]), *dx = opc_dev_zero(b, r->in_n[0]);
    float *dw = opc_dev_zero(b, wn), *db = opc_dev_zero(b, (size_t)s->cout);
    b->ops->conv_weight_import(b->ctx, plan, wk, w);
    b->ops->conv_forward(b->ctx, plan, c->n, x, w, bias, y, ws, ws_bytes);
    b->ops->conv_backward(b->ctx, plan, c->n, x, w, dy, dx, dwd, db, ws, ws_bytes);
    b->ops->conv_weight_export(b->ctx, plan, dwd, dw);
    opc_take(b, r, "y", y, r->in_n[3]);
    opc_take(b, r, "dx", dx, r->in_n[0]);
    opc_take(b, r, "dweight", dw, wn);
    opc_take(b, r, "dbias", db, (size_t)s->cout);
    float *dev[] = {x, wk, bias, dy, w, dwd};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) b->ops->release(b->ctx, dev[i]);
    b->ops->release(b->ctx, ws);
    b->ops->conv_plan_free(b->ctx, plan);
}

/* A conv and the BN that reads its output, forward (training: and backward), as the
 * executor pairs them. */
static void opc_run_conv_bn(const OpCase *c, const OpBackend *b, OpcRun *r) {
    const ConvSpec *s = &c->cs;
    const NetOps *o = b->ops;
    int oh = conv_out_size(c->hw, s->k, s->stride, s->pad), ow = conv_out_size(c->k, s->k, s->stride, s->pad);
    size_t wn = r->in_n[1], ny = r->in_n[3], nc = (size_t)s->cout;
    void *plan = o->conv_plan(b->ctx, s, c->n, c->hw, c->k, c->op == OPC_CONV_BN);
    size_t ws_bytes = o->conv_workspace_bytes(b->ctx, plan);
    void *ws = o->alloc(b->ctx, ws_bytes ? ws_bytes : 1);
    float *x = opc_dev_in(b, r, 0), *wk = opc_dev_in(b, r, 1), *bias = opc_dev_in(b, r, 2);
    float *dy = opc_dev_in(b, r, 3), *g = opc_dev_in(b, r, 4), *be = opc_dev_in(b, r, 5);
    float *rm = opc_dev_in(b, r, 6), *rv = opc_dev_in(b, r, 7), *w = opc_dev_zero(b, wn);
    float *conv_out = opc_dev_zero(b, ny), *y = opc_dev_zero(b, ny);
    o->conv_weight_import(b->ctx, plan, wk, w);
    o->conv_forward(b->ctx, plan, c->n, x, w, bias, conv_out, ws, ws_bytes);
    if (c->op == OPC_CONV_BN_EVAL) {
        o->bn_eval(b->ctx, c->n, oh * ow, s->cout, conv_out, g, be, rm, rv, 1e-5f, y);
        opc_take(b, r, "y", y, ny);
        opc_take(b, r, "conv out", conv_out, ny);
    } else {
        float *mean = opc_dev_zero(b, nc), *inv = opc_dev_zero(b, nc), *dc = opc_dev_zero(b, ny);
        float *dg = opc_dev_zero(b, nc), *db = opc_dev_zero(b, nc), *dx = opc_dev_zero(b, r->in_n[0]);
        float *dwd = opc_dev_zero(b, wn), *dw = opc_dev_zero(b, wn), *dbias = opc_dev_zero(b, nc);
        o->bn_relu_train(b->ctx, c->n, oh * ow, s->cout, conv_out, g, be, y, mean, inv, rm, rv, 0.1f,
                         1e-5f);
        o->bn_relu_backward(b->ctx, c->n, oh * ow, s->cout, conv_out, y, g, mean, inv, dy, dc, dg, db);
        o->conv_backward(b->ctx, plan, c->n, x, w, dc, dx, dwd, dbias, ws, ws_bytes);
        o->conv_weight_export(b->ctx, plan, dwd, dw);
        opc_take(b, r, "y", y, ny);
        opc_take(b, r, "conv out", conv_out, ny);
        opc_take(b, r, "save_mean", mean, nc);
        opc_take(b, r, "save_invstd", inv, nc);
        opc_take(b, r, "running_mean", rm, nc);
        opc_take(b, r, "running_var", rv, nc);
        opc_take(b, r, "bn dx", dc, ny);
        opc_take(b, r, "dgamma", dg, nc);
        opc_take(b, r, "dbeta", db, nc);
        opc_take(b, r, "conv dx", dx, r->in_n[0]);
        opc_take(b, r, "conv dweight", dw, wn);
        opc_take(b, r, "conv dbias", dbias, nc);
        o->release(b->ctx, dwd);
        rm = rv = NULL;
    }
    float *dev[] = {x, wk, bias, dy, g, be, w, rm, rv};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++)
        if (dev[i]) o->release(b->ctx, dev[i]);
    o->release(b->ctx, ws);
    o->conv_plan_free(b->ctx, plan);
}

static void opc_run_bn_forward(const OpCase *c, const OpBackend *b, OpcRun *r) {
    size_t nx = r->in_n[0], nc = (size_t)c->c;
    float *x = opc_dev_in(b, r, 0), *g = opc_dev_in(b, r, 1), *be = opc_dev_in(b, r, 2);
    float *rm = opc_dev_in(b, r, 3), *rv = opc_dev_in(b, r, 4), *z = opc_dev_in(b, r, 5);
    float *y = opc_dev_zero(b, nx), *tmp = opc_dev_zero(b, nx);
    float *mean = opc_dev_zero(b, nc), *inv = opc_dev_zero(b, nc);
    const NetOps *o = b->ops;
    if (c->op == OPC_BN_TRAIN)
        o->bn_train(b->ctx, c->n, c->hw, c->c, x, g, be, y, mean, inv, rm, rv, 0.1f, 1e-5f);
    else if (c->op == OPC_BN_RELU_TRAIN)
        o->bn_relu_train(b->ctx, c->n, c->hw, c->c, x, g, be, y, mean, inv, rm, rv, 0.1f, 1e-5f);
    else if (c->op == OPC_BN_ADD_RELU_TRAIN)
        o->bn_add_relu_train(b->ctx, c->n, c->hw, c->c, x, g, be, z, tmp, y, mean, inv, rm, rv, 0.1f,
                             1e-5f);
    else
        o->bn_eval(b->ctx, c->n, c->hw, c->c, x, g, be, rm, rv, 1e-5f, y);
    opc_take(b, r, "y", y, nx);
    if (c->op != OPC_BN_EVAL) {
        opc_take(b, r, "save_mean", mean, nc);
        opc_take(b, r, "save_invstd", inv, nc);
        opc_take(b, r, "running_mean", rm, nc);
        opc_take(b, r, "running_var", rv, nc);
    } else {
        float *dev[] = {mean, inv, rm, rv};
        for (int i = 0; i < 4; i++) o->release(b->ctx, dev[i]);
    }
    float *dev[] = {x, g, be, z, tmp};
    for (int i = 0; i < 5; i++) o->release(b->ctx, dev[i]);
}

static void opc_run_bn_backward(const OpCase *c, const OpBackend *b, OpcRun *r) {
    size_t nx = r->in_n[0], nc = (size_t)c->c;
    float *x = opc_dev_in(b, r, 0), *y = opc_dev_in(b, r, 1), *g = opc_dev_in(b, r, 2);
    float *mean = opc_dev_in(b, r, 3), *inv = opc_dev_in(b, r, 4), *dy = opc_dev_in(b, r, 5);
    float *dx = opc_dev_zero(b, nx), *dg = opc_dev_zero(b, nc), *db = opc_dev_zero(b, nc);
    if (c->op == OPC_BN_BACKWARD)
        b->ops->bn_backward(b->ctx, c->n, c->hw, c->c, x, g, mean, inv, dy, dx, dg, db);
    else
        b->ops->bn_relu_backward(b->ctx, c->n, c->hw, c->c, x, y, g, mean, inv, dy, dx, dg, db);
    opc_take(b, r, "dx", dx, nx);
    opc_take(b, r, "dgamma", dg, nc);
    opc_take(b, r, "dbeta", db, nc);
    float *dev[] = {x, y, g, mean, inv, dy};
    for (int i = 0; i < 6; i++) b->ops->release(b->ctx, dev[i]);
}

static void opc_run_elementwise(const OpCase *c, const OpBackend *b, OpcRun *r) {
    size_t n = r->in_n[0];
    float *a = opc_dev_in(b, r, 0), *a2 = opc_dev_in(b, r, 1);
    float *y = opc_dev_zero(b, n), *y2 = opc_dev_zero(b, n);
    if (c->op == OPC_RELU) {
        b->ops->relu_forward(b->ctx, n, a, y);
        b->ops->relu_backward(b->ctx, n, y, a2, y2);
        opc_take(b, r, "relu", y, n);
        opc_take(b, r, "relu_backward", y2, n);
    } else {
        b->ops->add(b->ctx, n, a, a2, y);
        b->ops->add_relu(b->ctx, n, a, a2, y2);
        opc_take(b, r, "add", y, n);
        opc_take(b, r, "add_relu", y2, n);
    }
    b->ops->release(b->ctx, a);
    b->ops->release(b->ctx, a2);
}

static void opc_run_pool_linear(const OpCase *c, const OpBackend *b, OpcRun *r) {
    const NetOps *o = b->ops;
    if (c->op == OPC_MEANPOOL) {
        float *x = opc_dev_in(b, r, 0), *dy = opc_dev_in(b, r, 1);
        float *y = opc_dev_zero(b, r->in_n[1]), *dx = opc_dev_zero(b, r->in_n[0]);
        o->meanpool_forward(b->ctx, c->n, c->hw, c->c, x, y);
        o->meanpool_backward(b->ctx, c->n, c->hw, c->c, dy, dx);
        opc_take(b, r, "pool", y, r->in_n[1]);
        opc_take(b, r, "pool_backward", dx, r->in_n[0]);
        o->release(b->ctx, x);
        o->release(b->ctx, dy);
        return;
    }
    float *x = opc_dev_in(b, r, 0), *w = opc_dev_in(b, r, 1), *bias = opc_dev_in(b, r, 2);
    float *dy = opc_dev_in(b, r, 3), *y = opc_dev_zero(b, r->in_n[3]);
    float *dx = opc_dev_zero(b, r->in_n[0]), *dw = opc_dev_zero(b, r->in_n[1]);
    float *db = opc_dev_zero(b, r->in_n[2]);
    o->linear_forward(b->ctx, c->n, c->c, c->k, x, w, bias, y);
    o->linear_backward(b->ctx, c->n, c->c, c->k, x, w, dy, dx, dw, db);
    opc_take(b, r, "linear", y, r->in_n[3]);
    opc_take(b, r, "dx", dx, r->in_n[0]);
    opc_take(b, r, "dweight", dw, r->in_n[1]);
    opc_take(b, r, "dbias", db, r->in_n[2]);
    float *dev[] = {x, w, bias, dy};
    for (int i = 0; i < 4; i++) o->release(b->ctx, dev[i]);
}

static void opc_run_xent_sgd(const OpCase *c, const OpBackend *b, OpcRun *r) {
    const NetOps *o = b->ops;
    if (c->op == OPC_XENT) {
        int32_t *lab_h = xmalloc((size_t)c->n * sizeof(int32_t));
        for (int i = 0; i < c->n; i++) lab_h[i] = (int32_t)r->in[1][i] % c->k;
        int32_t *lab = o->alloc(b->ctx, (size_t)c->n * sizeof(int32_t));
        b->upload(b->ctx, lab, lab_h, (size_t)c->n * sizeof(int32_t));
        float *logits = opc_dev_in(b, r, 0), *dl = opc_dev_zero(b, r->in_n[0]);
        float *loss = opc_dev_zero(b, 1);
        int *hits_d = o->alloc(b->ctx, sizeof(int));
        o->xent(b->ctx, c->n, c->k, logits, lab, 0.1f, dl, loss, hits_d);
        int hits = -1;
        b->download(b->ctx, &hits, hits_d, sizeof hits);
        o->release(b->ctx, hits_d);
        opc_take(b, r, "loss", loss, 1);
        float *hits_f = opc_dev_zero(b, 1);
        float hf = (float)hits;
        b->upload(b->ctx, hits_f, &hf, sizeof hf);
        opc_take(b, r, "hits", hits_f, 1);
        opc_take(b, r, "dlogits", dl, r->in_n[0]);
        o->release(b->ctx, logits);
        o->release(b->ctx, lab);
        free(lab_h);
        return;
    }
    size_t n = r->in_n[0];
    float *p = opc_dev_in(b, r, 0), *g = opc_dev_in(b, r, 1), *m = opc_dev_in(b, r, 2);
    const float lr = 0.05f;
    const int32_t first = 0;
    float *lr_d = o->alloc(b->ctx, sizeof lr);
    int32_t *first_d = o->alloc(b->ctx, sizeof first);
    b->upload(b->ctx, lr_d, &lr, sizeof lr);
    b->upload(b->ctx, first_d, &first, sizeof first);
    o->sgd(b->ctx, n, p, g, m, NULL, lr_d, 0.9f, 5e-4f, c->k, first_d);
    o->release(b->ctx, lr_d);
    o->release(b->ctx, first_d);
    opc_take(b, r, "param", p, n);
    opc_take(b, r, "momentum", m, n);
    o->release(b->ctx, g);
}

static void opc_run(const OpCase *c, const OpBackend *b, OpcRun *r) {
    if (b->select) b->select(b->select_arg);
    switch (c->op) {
    case OPC_CONV: opc_run_conv(c, b, r); break;
    case OPC_CONV_BN:
    case OPC_CONV_BN_EVAL: opc_run_conv_bn(c, b, r); break;
    case OPC_BN_TRAIN:
    case OPC_BN_RELU_TRAIN:
    case OPC_BN_ADD_RELU_TRAIN:
    case OPC_BN_EVAL: opc_run_bn_forward(c, b, r); break;
    case OPC_BN_BACKWARD:
    case OPC_BN_RELU_BACKWARD: opc_run_bn_backward(c, b, r); break;
    case OPC_RELU:
    case OPC_ADD_RELU: opc_run_elementwise(c, b, r); break;
    case OPC_MEANPOOL:
    case OPC_LINEAR: opc_run_pool_linear(c, b, r); break;
    case OPC_XENT:
    case OPC_SGD: opc_run_xent_sgd(c, b, r); break;
    }
}

/* Worst |got - want| - (atol + rtol*|want|) over n; > 0 is a failure. */
static double opc_excess(const float *got, const float *want, size_t n, float atol, float rtol,
                         size_t *at) {
    double worst = -INFINITY;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]) - (atol + rtol * fabs((double)want[i]));
        if (isnan(e)) e = INFINITY;
        if (e > worst) {
            worst = e;
            *at = i;
        }
    }
    return worst;
}

/* One case on the reference and on the backend under test; every output compared. */
static void opc_check(const OpCase *c, const OpBackend *ref, const OpBackend *dut, int verbose) {
    OpcRun in = {0}, a = {0}, b = {0};
    opc_make_inputs(c, &in);
    a = in;
    b = in;
    a.n_out = b.n_out = 0;
    opc_run(c, ref, &a);
    opc_run(c, dut, &b);
    for (int i = 0; i < a.n_out && i < b.n_out; i++) {
        size_t at;
        double ex = opc_excess(b.out[i], a.out[i], a.out_n[i], c->atol, c->rtol, &at);
        EXPECT(ex <= 0, "%s %s vs %s: %s [%zu] got %.8g want %.8g", c->label, dut->name, ref->name,
               a.out_name[i], at, b.out[i][at], a.out[i][at]);
        if (verbose) printf("ok   %s %s vs %s: %s\n", c->label, dut->name, ref->name, a.out_name[i]);
    }
    EXPECT(a.n_out == b.n_out, "%s: %d outputs vs %d", c->label, a.n_out, b.n_out);
    for (int i = 0; i < a.n_out; i++) free(a.out[i]);
    for (int i = 0; i < b.n_out; i++) free(b.out[i]);
    for (int i = 0; i < in.n_in; i++) free(in.in[i]);
}

/* The case table: every op of the executor's table, at shapes that cover the edge
 * paths (1x1 convs, strides, odd sizes, rows past cuDNN's N limit). */
static const OpCase opc_cases[] = {
    {OPC_CONV, 2, 9, 0, 9, {3, 8, 3, 2, 1}, 1e-4f, 1e-3f, "conv stem 3x3/2"},
    {OPC_CONV, 3, 7, 0, 7, {8, 16, 1, 1, 0}, 1e-4f, 1e-3f, "conv 1x1"},
    {OPC_CONV, 3, 8, 0, 6, {8, 8, 3, 1, 1}, 1e-4f, 1e-3f, "conv 3x3"},
    {OPC_CONV, 4, 8, 0, 8, {16, 32, 3, 2, 1}, 1e-4f, 1e-3f, "conv 3x3/2"},
    {OPC_CONV, 4, 8, 0, 8, {16, 32, 1, 2, 0}, 1e-4f, 1e-3f, "conv projection 1x1/2"},
    {OPC_BN_TRAIN, 3, 49, 16, 0, {0}, 1e-4f, 1e-4f, "bn train"},
    {OPC_BN_TRAIN, 100000, 10, 4, 0, {0}, 1e-4f, 1e-3f, "bn train N>65535"},
    {OPC_BN_RELU_TRAIN, 2, 256, 8, 0, {0}, 1e-4f, 1e-4f, "bn+relu train"},
    {OPC_BN_ADD_RELU_TRAIN, 2, 64, 8, 0, {0}, 1e-4f, 1e-4f, "bn+add+relu train"},
    {OPC_BN_EVAL, 500, 256, 16, 0, {0}, 1e-5f, 1e-5f, "bn eval 128000 rows"},
    {OPC_BN_EVAL, 100000, 10, 4, 0, {0}, 1e-5f, 1e-5f, "bn eval N>65535"},
    {OPC_BN_BACKWARD, 3, 49, 16, 0, {0}, 1e-4f, 1e-3f, "bn backward"},
    {OPC_BN_RELU_BACKWARD, 2, 64, 8, 0, {0}, 1e-4f, 1e-3f, "bn+relu backward"},
    {OPC_RELU, 1, 100003, 1, 0, {0}, 0, 0, "relu"},
    {OPC_ADD_RELU, 1, 100003, 1, 0, {0}, 0, 0, "add, add+relu"},
    {OPC_MEANPOOL, 5, 16, 24, 0, {0}, 1e-6f, 1e-5f, "meanpool"},
    {OPC_LINEAR, 7, 0, 64, 10, {0}, 1e-5f, 1e-4f, "linear"},
    {OPC_XENT, 300, 0, 0, 10, {0}, 1e-6f, 1e-5f, "softmax xent"},
    {OPC_SGD, 1, 1000, 3, 0, {0}, 1e-7f, 1e-6f, "sgd"},
    {OPC_SGD, 1, 1000, 3, 1, {0}, 1e-7f, 1e-6f, "sgd nesterov"},
    /* conv bias gradient in front of a training BN: rounding noise around 0 on both */
    {OPC_CONV_BN, 3, 8, 0, 8, {8, 40, 3, 1, 1}, 1e-4f, 1e-3f, "conv 3x3 -> bn+relu (bias deferred)"},
    {OPC_CONV_BN, 2, 9, 0, 9, {3, 8, 3, 2, 1}, 1e-4f, 1e-3f, "conv stem -> bn+relu (bias deferred)"},
    {OPC_CONV_BN_EVAL, 3, 8, 0, 8, {8, 40, 3, 1, 1}, 1e-4f, 1e-3f, "conv 3x3 -> bn eval (bias deferred)"},
};

static void opc_check_all(const OpBackend *ref, const OpBackend *dut, int verbose) {
    for (size_t i = 0; i < sizeof opc_cases / sizeof *opc_cases; i++)
        opc_check(&opc_cases[i], ref, dut, verbose);
}

/* The CPU backend's copies (host memory both sides). */
static void opc_host_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
}

#endif
