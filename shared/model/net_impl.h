/* net_impl.h: the network executor of net.h, written once over a scalar type.
 *
 * net.c includes it for float (the executor of the CPU and CUDA engines);
 * tests/test_reference.c and tests/test_model.c include it for double with the CPU
 * ops in double, so the very walk the engines run is checked against a float64
 * PyTorch reference and by finite differences. Define before including, once per
 * translation unit: NET_REAL and NET_T(name) as for net_ops.h (which is included
 * here unless NET_OPS_DECLARED is defined).
 *
 * Planning: one arena of the device's memory, carved by two passes of the same walk
 * (the first only counts), holds every tensor backward needs (conv outputs = BN
 * inputs, ReLU outputs = next conv inputs, block outputs, BN saved mean/invstd), two
 * forward temporaries, four gradient scratch buffers (each as large as the largest
 * activation) that backward rotates through, and the largest conv workspace. */
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/model.h"

#ifndef NET_OPS_DECLARED
#include "model/net_ops.h"
#endif

typedef NET_REAL real_t;
/* This instance's executor and op table (Net and NetOps in float, NetD and NetOpsD in
 * the double tests): only the exported names go through NET_T, so the walk's own
 * functions and types keep their names for grep, ctags and debuggers. */
typedef struct NET_T(Net) NetR;
typedef struct NET_T(NetOps) NetOpsR;
typedef struct NET_T(NetBnForward) NetBnForwardR;
typedef struct NET_T(NetBnBackward) NetBnBackwardR;

#define NET_BLOCK_MAX_CONVS 3
#define NET_GRAD_BUFFERS 4

typedef struct {
    const ConvLayer *layer;
    int h, w; /* input size */
    void *plan;
} NetConv;

typedef struct {
    /* Main path, one entry per conv: its output (the BN input), the BN's saved
     * statistics, and for all but the last the ReLU output (the next conv's input). */
    int conv[NET_BLOCK_MAX_CONVS], proj; /* indices into the conv list */
    real_t *conv_out[NET_BLOCK_MAX_CONVS];
    real_t *act[NET_BLOCK_MAX_CONVS];
    real_t *mean[NET_BLOCK_MAX_CONVS], *invstd[NET_BLOCK_MAX_CONVS];
    real_t *proj_out, *proj_mean, *proj_invstd; /* projection shortcut */
    real_t *out;                                /* relu(main + shortcut) */
} NetBlock;

struct NET_T(Net) {
    const Model *m;
    const NetOpsR *ops;
    void *ctx;
    int max_batch, backward;
    char *arena;
    size_t arena_bytes, cursor;
    const real_t *x; /* the latest forward's input (the stem conv backward needs it) */
    NetConv *convs;
    int n_convs, stem_conv;
    real_t *stem_out, *stem_bn_out, *stem_mean, *stem_invstd;
    NetBlock *blocks;
    real_t *pooled, *logits, *dlogits, *dpooled;
    real_t *tmp_main, *tmp_short; /* forward only: BN outputs before the residual add */
    real_t *grad[NET_GRAD_BUFFERS]; /* backward scratch, each max_act elements */
    void *workspace;
    size_t max_act, ws_bytes;
};

/* ------------------------------------------------------------------ planning */

/* need_dx: the backward computes this conv's input gradient (all but the stem). */
static int net_conv_add(NetR *net, const ConvLayer *l, int h, int w, int need_dx) {
    NetConv *c = &net->convs[net->n_convs];
    c->layer = l;
    c->h = h;
    c->w = w;
    c->plan = net->ops->conv_plan(net->ctx, &l->spec, net->max_batch, h, w, net->backward,
                                  net->backward && need_dx);
    size_t ws = net->ops->conv_workspace_bytes(net->ctx, c->plan);
    if (ws > net->ws_bytes) net->ws_bytes = ws;
    return net->n_convs++;
}

/* Every conv layer in walk order, each with its plan. */
static void net_plan_convs(NetR *net) {
    const Model *m = net->m;
    net->convs = xcalloc((size_t)1 + 4 * (size_t)m->n_blocks, sizeof *net->convs);
    /* The stem's backward stops at the weights: its input is the image (dx NULL). */
    net->stem_conv = net_conv_add(net, &m->stem_conv, m->cfg.img_height, m->cfg.img_width, 0);
    for (int i = 0; i < m->n_blocks; i++) {
        const Block *b = &m->blocks[i];
        NetBlock *a = &net->blocks[i];
        for (int j = 0; j < model_block_n_convs(b); j++) {
            int h, w;
            model_block_conv_input(b, j, &h, &w);
            a->conv[j] = net_conv_add(net, model_block_conv(b, j), h, w, 1);
        }
        a->proj = b->has_projection ? net_conv_add(net, &b->proj_conv, b->in_h, b->in_w, 1) : -1;
    }
}

/* With no arena it only counts. Every buffer starts on the table's alignment. */
static void *net_carve_bytes(NetR *net, size_t bytes) {
    size_t at = net->cursor, align = net->ops->align;
    net->cursor += (bytes + align - 1) / align * align;
    return net->arena ? net->arena + at : NULL;
}

static real_t *net_carve(NetR *net, size_t n) {
    return net_carve_bytes(net, n * sizeof(real_t));
}

static void net_note_act(NetR *net, size_t n) {
    if (n > net->max_act) net->max_act = n;
}

static size_t net_conv_out_elems(const ConvSpec *s, size_t nb, int h, int w) {
    return nb * conv_out_size(h, s->k, s->stride, s->pad) * conv_out_size(w, s->k, s->stride, s->pad) *
           s->cout;
}

/* An inference-only executor keeps no activation for backward: the tensors of
 * every block share a few buffers of max_act elements (the pool, carved once the
 * walk has sized max_act), so its memory is a small multiple of the largest layer,
 * not the whole network. Liveness in the forward walk (net_block_forward): a
 * block's input stays live to its residual add, so block outputs alternate between
 * out[0] and out[1] (the stem's output is out[1]); conv outputs (main path and
 * projection, the stem's too) are read once by the BN that follows, so one buffer
 * serves them all; each ReLU output is dead once the next conv has read it. */
typedef struct {
    real_t *conv_out, *act, *out[2];
} NetInferencePool;

/* An activation tensor of n elements: its own in a training executor, else the
 * pool's buffer (NULL while counting: the pool is carved after the walk). */
static real_t *net_act_tensor(NetR *net, size_t n, real_t *pooled) {
    net_note_act(net, n);
    return net->backward ? net_carve(net, n) : pooled;
}

static void net_layout_block(NetR *net, const Block *b, NetBlock *a,
                                    const NetInferencePool *pool, int index) {
    size_t nb = (size_t)net->max_batch;
    int nc = model_block_n_convs(b);
    for (int j = 0; j < nc; j++) {
        const ConvSpec *s = &model_block_conv(b, j)->spec;
        int h, w;
        model_block_conv_input(b, j, &h, &w);
        size_t sz = net_conv_out_elems(s, nb, h, w);
        a->conv_out[j] = net_act_tensor(net, sz, pool->conv_out);
        a->act[j] = j < nc - 1 ? net_act_tensor(net, sz, pool->act) : NULL;
        a->mean[j] = net_carve(net, (size_t)s->cout);
        a->invstd[j] = net_carve(net, (size_t)s->cout);
    }
    size_t out = nb * b->out_h * b->out_w * b->cout;
    net_note_act(net, nb * b->in_h * b->in_w * b->cin);
    if (b->has_projection) {
        a->proj_out = net_act_tensor(net, out, pool->conv_out);
        a->proj_mean = net_carve(net, (size_t)b->cout);
        a->proj_invstd = net_carve(net, (size_t)b->cout);
    }
    a->out = net_act_tensor(net, out, pool->out[index % 2]);
}

static void net_layout(NetR *net) {
    const Model *m = net->m;
    size_t nb = (size_t)net->max_batch;
    net->cursor = 0;
    /* Inference: the pool comes first, sized by the previous (counting) walk. */
    NetInferencePool pool = {NULL, NULL, {NULL, NULL}};
    if (!net->backward && net->max_act) {
        pool.conv_out = net_carve(net, net->max_act);
        pool.act = net_carve(net, net->max_act);
        pool.out[0] = net_carve(net, net->max_act);
        pool.out[1] = net_carve(net, net->max_act);
    }
    size_t stem = nb * m->stem_h * m->stem_w * m->stem_conv.spec.cout;
    net->stem_out = net_act_tensor(net, stem, pool.conv_out);
    net->stem_bn_out = net_act_tensor(net, stem, pool.out[1]);
    net->stem_mean = net_carve(net, (size_t)m->stem_bn.c);
    net->stem_invstd = net_carve(net, (size_t)m->stem_bn.c);
    for (int i = 0; i < m->n_blocks; i++)
        net_layout_block(net, &m->blocks[i], &net->blocks[i], &pool, i);
    net->pooled = net_carve(net, nb * m->fc_in);
    net->dpooled = net->backward ? net_carve(net, nb * m->fc_in) : NULL;
    net->logits = net_carve(net, nb * m->fc_out);
    net->dlogits = net->backward ? net_carve(net, nb * m->fc_out) : NULL;
    net->tmp_main = net_carve(net, net->max_act);
    net->tmp_short = net_carve(net, net->max_act);
    for (int i = 0; i < NET_GRAD_BUFFERS; i++)
        net->grad[i] = net->backward ? net_carve(net, net->max_act) : NULL;
    net->workspace = net_carve_bytes(net, net->ws_bytes ? net->ws_bytes : 1);
}

NetR *NET_T(net_create)(const Model *m, const NetOpsR *ops, void *ctx,
                                     int max_batch, int backward) {
    if (max_batch < 1) die("model: batch size must be at least 1, got %d", max_batch);
    if (!ops->bn_relu_backward_keep != !ops->conv_backward_acc)
        die("model: op table '%s' sets only one of bn_relu_backward_keep and conv_backward_acc "
            "(internal error: both or neither)", ops->name);
    NetR *net = xcalloc(1, sizeof *net);
    net->m = m;
    net->ops = ops;
    net->ctx = ctx;
    net->max_batch = max_batch;
    net->backward = backward;
    net->blocks = xcalloc((size_t)m->n_blocks, sizeof *net->blocks);
    net_plan_convs(net);
    net_layout(net); /* count (sizes max_act) */
    net_layout(net); /* count again: an inference pool is max_act-sized */
    net->arena_bytes = net->cursor;
    net->arena = ops->alloc(ctx, net->arena_bytes);
    net_layout(net); /* place */
    return net;
}

void NET_T(net_free)(NetR *net) {
    if (!net) return;
    for (int i = 0; i < net->n_convs; i++) net->ops->conv_plan_free(net->ctx, net->convs[i].plan);
    net->ops->release(net->ctx, net->arena);
    free(net->convs);
    free(net->blocks);
    free(net);
}

size_t NET_T(net_arena_bytes)(const NetR *net) { return net->arena_bytes; }
size_t NET_T(net_workspace_bytes)(const NetR *net) { return net->ws_bytes; }
const real_t *NET_T(net_logits)(const NetR *net) { return net->logits; }

void NET_T(net_prepare)(NetR *net, int n) {
    for (int i = 0; i < net->n_convs; i++)
        net->ops->conv_prepare(net->ctx, net->convs[i].plan, n, net->ws_bytes);
}

/* ---------------------------------------------------------------- forward */

/* Conv id on x into conv_out, then its batch norm l into y (one call: the table's
 * conv_bn_forward, or its composition), as kind says in training; in inference the
 * BN uses the running statistics and the ReLU (and the residual z) of the training
 * kind follows as an op of its own. */
static void net_conv_bn_fwd(NetR *net, int id, const BNLayer *l, const real_t *params,
                            real_t *buffers, int train, NetBnForwardKind kind, const real_t *z,
                            int n, int hw, const real_t *x, real_t *conv_out, real_t *y,
                            real_t *mean, real_t *invstd) {
    const ConvLayer *cl = net->convs[id].layer;
    int eval_add = !train && kind == NET_BN_TRAIN_ADD_RELU; /* the BN output before the add */
    NetBnForwardR bn = {train ? kind : NET_BN_EVAL, hw, l->c, params + l->gamma, params + l->beta,
                        z, net->tmp_main, eval_add ? net->tmp_main : y, mean, invstd,
                        buffers + l->running_mean, buffers + l->running_var, MODEL_BN_MOMENTUM,
                        MODEL_BN_EPS};
    NET_T(net_ops_conv_bn_forward)(net->ops, net->ctx, net->convs[id].plan, n, x,
                                   params + cl->weight, params + cl->bias, conv_out, net->workspace,
                                   net->ws_bytes, &bn);
    size_t count = (size_t)n * hw * l->c;
    if (!train && kind == NET_BN_TRAIN_RELU) net->ops->relu_forward(net->ctx, count, y, y);
    if (eval_add) net->ops->add_relu(net->ctx, count, net->tmp_main, z, y);
}

static void net_block_forward(NetR *net, const Block *b, NetBlock *a,
                                     const real_t *params, real_t *buffers, int train, int n,
                                     const real_t *x) {
    int nc = model_block_n_convs(b);
    const real_t *shortcut = x;
    if (b->has_projection) {
        net_conv_bn_fwd(net, a->proj, &b->proj_bn, params, buffers, train, NET_BN_TRAIN, NULL, n,
                        b->out_h * b->out_w, x, a->proj_out, net->tmp_short, a->proj_mean,
                        a->proj_invstd);
        shortcut = net->tmp_short;
    }
    const real_t *in = x;
    for (int j = 0; j < nc; j++) {
        int h, w;
        model_block_conv_input(b, j, &h, &w);
        const ConvSpec *s = &model_block_conv(b, j)->spec;
        int hw = conv_out_size(h, s->k, s->stride, s->pad) * conv_out_size(w, s->k, s->stride, s->pad);
        const BNLayer *bl = model_block_bn(b, j);
        if (j < nc - 1)
            net_conv_bn_fwd(net, a->conv[j], bl, params, buffers, train, NET_BN_TRAIN_RELU, NULL, n,
                            hw, in, a->conv_out[j], a->act[j], a->mean[j], a->invstd[j]);
        else /* the last BN goes into the residual add */
            net_conv_bn_fwd(net, a->conv[j], bl, params, buffers, train, NET_BN_TRAIN_ADD_RELU,
                            shortcut, n, hw, in, a->conv_out[j], a->out, a->mean[j], a->invstd[j]);
        in = a->act[j];
    }
}

/* Runs body(arg) on the table's team (every worker walks), or once when it has none. */
static void net_on_team(NetR *net, void (*body)(void *arg), void *arg) {
    if (net->ops->team)
        net->ops->team(net->ctx, body, arg);
    else
        body(arg);
}

typedef struct {
    NetR *net;
    const real_t *params;
    real_t *buffers;
    int train, n;
} NetForwardArgs;

static void net_forward_walk(void *arg) {
    const NetForwardArgs *f = arg;
    NetR *net = f->net;
    const real_t *params = f->params;
    real_t *buffers = f->buffers;
    int train = f->train, n = f->n;
    const Model *m = net->m;
    const real_t *x = net->x;
    net_conv_bn_fwd(net, net->stem_conv, &m->stem_bn, params, buffers, train, NET_BN_TRAIN, NULL, n,
                    m->stem_h * m->stem_w, x, net->stem_out, net->stem_bn_out, net->stem_mean,
                    net->stem_invstd); /* the seed has no ReLU after the stem */
    const real_t *in = net->stem_bn_out;
    for (int i = 0; i < m->n_blocks; i++) {
        net_block_forward(net, &m->blocks[i], &net->blocks[i], params, buffers, train, n, in);
        in = net->blocks[i].out;
    }
    const Block *last = &m->blocks[m->n_blocks - 1];
    net->ops->meanpool_forward(net->ctx, n, last->out_h * last->out_w, m->fc_in, in, net->pooled);
    net->ops->linear_forward(net->ctx, n, m->fc_in, m->fc_out, net->pooled, params + m->fc_weight,
                             params + m->fc_bias, net->logits);
}

void NET_T(net_forward)(NetR *net, const real_t *params, real_t *buffers, int train,
                        const real_t *x, int n) {
    if (n < 1 || n > net->max_batch)
        die("model: batch of %d images, but the run was created for at most %d", n, net->max_batch);
    net->x = x;
    NetForwardArgs f = {net, params, buffers, train, n};
    net_on_team(net, net_forward_walk, &f);
}

/* ---------------------------------------------------------------- backward */

/* A scratch gradient buffer other than the (up to two) busy ones. */
static real_t *net_grad_pick(NetR *net, const real_t *busy1, const real_t *busy2) {
    for (int i = 0; i < NET_GRAD_BUFFERS; i++)
        if (net->grad[i] != busy1 && net->grad[i] != busy2) return net->grad[i];
    die("model: no free gradient buffer (internal error)");
}

/* The gradient bn (the batch-norm backward of kind through layer l, dx its result)
 * of the BN that read x (y: the ReLU output of the ReLU kinds). */
static NetBnBackwardR net_bn_grad(NetBnBackwardKind kind, const BNLayer *l, const real_t *params,
                                  real_t *grads, int hw, const real_t *x, const real_t *y,
                                  const real_t *mean, const real_t *invstd, real_t *dy,
                                  real_t *dx) {
    NetBnBackwardR bn = {kind, hw,  l->c, x,  y, params + l->gamma, mean, invstd,
                         dy,   dx, grads + l->gamma, grads + l->beta};
    return bn;
}

/* The batch-norm backward bn, then the backward of conv id (input x) from bn->dx (one
 * call: the table's bn_conv_backward, or its composition); acc: dx += the gradient of
 * x (conv_backward_acc), else dx = it. */
static void net_bn_conv_bwd(NetR *net, const NetBnBackwardR *bn, int id, const real_t *params,
                            real_t *grads, int n, const real_t *x, real_t *dx, int acc) {
    const ConvLayer *l = net->convs[id].layer;
    NET_T(net_ops_bn_conv_backward)(net->ops, net->ctx, bn, net->convs[id].plan, n, x,
                                    params + l->weight, dx, grads + l->weight, grads + l->bias,
                                    net->workspace, net->ws_bytes, acc);
}

/* Output pixels of a block's main conv j. */
static int net_block_conv_out_hw(const Block *b, int j) {
    const ConvSpec *s = &model_block_conv(b, j)->spec;
    int h, w;
    model_block_conv_input(b, j, &h, &w);
    return conv_out_size(h, s->k, s->stride, s->pad) * conv_out_size(w, s->k, s->stride, s->pad);
}

/* dout: gradient of the block's output (one of net->grad, overwritten). Returns the
 * scratch buffer holding the gradient of the block's input x.
 *
 * Plain tables: a ReLU backward pass masks dout, and a residual add ends the block.
 * Tables with the folded ops (net_ops.h: bn_relu_backward_keep, conv_backward_acc)
 * have neither: each BN backward that reads dout reads the mask itself and leaves the
 * masked dout in dout (the identity shortcut's gradient), and the first main conv
 * ADDS its dx into dshort (beta 1), which then holds the gradient of x. The
 * arithmetic is the plain path's when the table's accumulation is one addition per
 * element of the same two terms (a + b == b + a in IEEE; test_model checks it so).
 * cuDNN's beta = 1 adds the shortcut to its float result before the one rounding to
 * the activation type, so in bf16 the GPU sum is rounded once where the plain path
 * rounds the conv's dx first (not bit for bit there: the folded sum is the correctly
 * rounded one). */
static real_t *net_block_backward(NetR *net, const Block *b, const NetBlock *a,
                                  const real_t *params, real_t *grads, int n, const real_t *x,
                                  real_t *dout) {
    int folded = net->ops->conv_backward_acc != NULL; /* net_create: both folded ops or neither */
    /* a BN whose output reaches the block's output ReLU (the last main conv's, the
     * projection's): folded, it reads that ReLU's mask (a->out > 0) itself and writes
     * the masked dout back into dout; else dout is masked already (a ReLU pass) */
    NetBnBackwardKind out_kind = folded ? NET_BN_RELU_BACKWARD_KEEP : NET_BN_BACKWARD;
    int hw_out = b->out_h * b->out_w, nc = model_block_n_convs(b);
    if (!folded) net->ops->relu_backward(net->ctx, (size_t)n * hw_out * b->cout, a->out, dout, dout);
    real_t *dshort = dout; /* identity shortcut: the (masked) gradient passes through */
    if (b->has_projection) {
        real_t *dp = net_grad_pick(net, dout, NULL);
        dshort = net_grad_pick(net, dout, dp);
        NetBnBackwardR bn = net_bn_grad(out_kind, &b->proj_bn, params, grads, hw_out, a->proj_out,
                                        a->out, a->proj_mean, a->proj_invstd, dout, dp);
        net_bn_conv_bwd(net, &bn, a->proj, params, grads, n, x, dshort, 0);
    }
    real_t *cur = dout;
    for (int j = nc - 1; j >= 0; j--) {
        int last = j == nc - 1; /* its output goes through the residual add and the output ReLU */
        real_t *dc = net_grad_pick(net, cur, dshort);
        NetBnBackwardR bn = net_bn_grad(last ? out_kind : NET_BN_RELU_BACKWARD, model_block_bn(b, j),
                                        params, grads, net_block_conv_out_hw(b, j), a->conv_out[j],
                                        last ? a->out : a->act[j], a->mean[j], a->invstd[j], cur, dc);
        const real_t *xin = j == 0 ? x : a->act[j - 1];
        if (j == 0 && folded) { /* the residual add: dx accumulates into dshort */
            net_bn_conv_bwd(net, &bn, a->conv[j], params, grads, n, xin, dshort, 1);
            return dshort;
        }
        real_t *din = net_grad_pick(net, dc, dshort);
        net_bn_conv_bwd(net, &bn, a->conv[j], params, grads, n, xin, din, 0);
        cur = din;
    }
    net->ops->add(net->ctx, (size_t)n * b->in_h * b->in_w * b->cin, cur, dshort, cur);
    return cur;
}

typedef struct {
    NetR *net;
    const real_t *params;
    const int32_t *labels;
    int n;
    real_t smoothing;
    real_t *grads, *loss;
    int *correct;
} NetBackwardArgs;

static void net_backward_walk(void *arg) {
    const NetBackwardArgs *b = arg;
    NetR *net = b->net;
    const real_t *params = b->params;
    const int32_t *labels = b->labels;
    int n = b->n;
    real_t smoothing = b->smoothing, *grads = b->grads, *loss = b->loss;
    int *correct = b->correct;
    const Model *m = net->m;
    net->ops->xent(net->ctx, n, m->fc_out, net->logits, labels, smoothing, net->dlogits, loss,
                   correct);
    const Block *last = &m->blocks[m->n_blocks - 1];
    net->ops->linear_backward(net->ctx, n, m->fc_in, m->fc_out, net->pooled, params + m->fc_weight,
                              net->dlogits, net->dpooled, grads + m->fc_weight, grads + m->fc_bias);
    real_t *g = net->grad[0];
    net->ops->meanpool_backward(net->ctx, n, last->out_h * last->out_w, m->fc_in, net->dpooled, g);
    for (int i = m->n_blocks - 1; i >= 0; i--) {
        const real_t *in = i > 0 ? net->blocks[i - 1].out : net->stem_bn_out;
        g = net_block_backward(net, &m->blocks[i], &net->blocks[i], params, grads, n, in, g);
    }
    real_t *dc = net_grad_pick(net, g, NULL);
    NetBnBackwardR bn = net_bn_grad(NET_BN_BACKWARD, &m->stem_bn, params, grads,
                                    m->stem_h * m->stem_w, net->stem_out, NULL, net->stem_mean,
                                    net->stem_invstd, g, dc);
    net_bn_conv_bwd(net, &bn, net->stem_conv, params, grads, n, net->x, NULL, 0);
}

void NET_T(net_backward)(NetR *net, const real_t *params, const int32_t *labels, int n,
                         real_t smoothing, real_t *grads, real_t *loss, int *correct) {
    if (!net->backward) die("model: backward on an inference-only executor (internal error)");
    NetBackwardArgs b = {net, params, labels, n, smoothing, grads, loss, correct};
    net_on_team(net, net_backward_walk, &b);
}

void NET_T(net_sgd)(NetR *net, real_t *params, const real_t *grads, real_t *momentum,
                    const uint8_t *decay_mask, const float *lr, float momentum_coef,
                    float weight_decay, int nesterov, const int32_t *first_step) {
    net->ops->sgd(net->ctx, net->m->num_params, params, grads, momentum, decay_mask, lr,
                  momentum_coef, weight_decay, nesterov, first_step);
}

/* ------------------------------------------------------- parameter layout */

void NET_T(net_params_export)(NetR *net, const real_t *dev, real_t *torch_layout) {
    net->ops->copy(net->ctx, torch_layout, dev, net->m->num_params * sizeof(real_t));
    for (int i = 0; i < net->n_convs; i++) {
        size_t off = net->convs[i].layer->weight;
        net->ops->conv_weight_export(net->ctx, net->convs[i].plan, dev + off, torch_layout + off);
    }
}

void NET_T(net_params_import)(NetR *net, const real_t *torch_layout, real_t *dev) {
    net->ops->copy(net->ctx, dev, torch_layout, net->m->num_params * sizeof(real_t));
    for (int i = 0; i < net->n_convs; i++) {
        size_t off = net->convs[i].layer->weight;
        net->ops->conv_weight_import(net->ctx, net->convs[i].plan, torch_layout + off, dev + off);
    }
}

