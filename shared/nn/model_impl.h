/* model_impl.h: the model's activations, forward and backward, written once over a
 * scalar type (the layout, config and init in model.c are type-free).
 *
 * shared/nn/model.c includes it with float and the library ops (model.h's functions);
 * tests/test_reference.c includes it with double and the double instance of the ops
 * (ops_cpu_impl.h), so the very same model code is checked against a float64
 * PyTorch reference with tight tolerances. Define before including, once per
 * translation unit:
 *   MODEL_REAL      float or double
 *   MODEL_FN(name)  the external name of model function `name`
 *   MODEL_OP(name)  the op `name` to call (ops.h's, or e.g. ops_d_##name)
 *   MODEL_RUN       the tag of the run struct (ModelRun for model.h)
 *
 * Activations: a ModelRun carves one arena, sized for max_batch, into every tensor
 * backward needs (conv outputs = BN inputs, ReLU outputs = next conv inputs, block
 * outputs, BN saved mean/invstd), two forward temporaries and four gradient
 * scratch buffers (each as large as the largest activation) that backward
 * rotates through. */
#include <stdlib.h>
#include <string.h>

#include "util/check.h"
#include "nn/model.h"
#include "nn/ops.h"

typedef MODEL_REAL real_t;

#define BLOCK_MAX_CONVS 3

typedef struct {
    /* Main path, one entry per conv: its output (the BN input), the BN's saved
     * statistics, and for all but the last the ReLU output (the next conv's input). */
    real_t *conv_out[BLOCK_MAX_CONVS];
    real_t *act[BLOCK_MAX_CONVS];
    real_t *mean[BLOCK_MAX_CONVS], *invstd[BLOCK_MAX_CONVS];
    real_t *proj_out, *proj_mean, *proj_invstd; /* projection shortcut */
    real_t *out;                                /* relu(main + shortcut) */
} BlockActs;

struct MODEL_RUN {
    int max_batch;
    real_t *arena;
    size_t arena_floats, cursor;
    const real_t *x; /* the caller's input during one call (stem conv backward needs it) */
    real_t *stem_out, *stem_bn_out, *stem_mean, *stem_invstd;
    BlockActs *acts;
    real_t *pooled, *logits, *dlogits, *dpooled;
    real_t *tmp_main, *tmp_short; /* forward only: BN outputs before the residual add */
    real_t *grad[4];              /* backward scratch, each max_act floats */
    real_t *workspace;
    size_t max_act, workspace_floats;
};

static int block_n_convs(const Block *b) { return b->bottleneck ? 3 : 2; }

static const ConvLayer *block_conv(const Block *b, int i) {
    return i == 0 ? &b->conv1 : i == 1 ? &b->conv2 : &b->conv3;
}

static const BNLayer *block_bn(const Block *b, int i) {
    return i == 0 ? &b->bn1 : i == 1 ? &b->bn2 : &b->bn3;
}

/* Input spatial size of conv i of the main path. */
static void block_conv_input(const Block *b, int i, int *h, int *w) {
    *h = b->in_h;
    *w = b->in_w;
    for (int j = 0; j < i; j++) {
        const ConvSpec *s = &block_conv(b, j)->spec;
        *h = conv_out_size(*h, s->k, s->stride, s->pad);
        *w = conv_out_size(*w, s->k, s->stride, s->pad);
    }
}

/* Two passes over the same walk: with no arena it only counts. 16-float (64-byte)
 * alignment for every tensor. */
static real_t *run_carve(struct MODEL_RUN *r, size_t n) {
    size_t at = r->cursor;
    r->cursor += (n + 15) & ~(size_t)15;
    return r->arena ? r->arena + at : NULL;
}

static void run_note_conv(struct MODEL_RUN *r, const ConvSpec *s, int h, int w) {
    size_t ws = MODEL_OP(conv2d_workspace_floats)(s, r->max_batch, h, w);
    if (ws > r->workspace_floats) r->workspace_floats = ws;
}

static void run_note_act(struct MODEL_RUN *r, size_t n) {
    if (n > r->max_act) r->max_act = n;
}

static void run_layout(struct MODEL_RUN *r, const Model *m) {
    size_t nb = (size_t)r->max_batch;
    r->cursor = 0;
    size_t stem = nb * m->stem_h * m->stem_w * m->stem_conv.spec.cout;
    run_note_act(r, stem);
    run_note_conv(r, &m->stem_conv.spec, m->cfg.img_height, m->cfg.img_width);
    r->stem_out = run_carve(r, stem);
    r->stem_bn_out = run_carve(r, stem);
    r->stem_mean = run_carve(r, (size_t)m->stem_bn.c);
    r->stem_invstd = run_carve(r, (size_t)m->stem_bn.c);
    for (int i = 0; i < m->n_blocks; i++) {
        const Block *b = &m->blocks[i];
        BlockActs *a = &r->acts[i];
        int nc = block_n_convs(b);
        for (int j = 0; j < nc; j++) {
            const ConvSpec *s = &block_conv(b, j)->spec;
            int h, w;
            block_conv_input(b, j, &h, &w);
            run_note_conv(r, s, h, w);
            size_t sz = nb * conv_out_size(h, s->k, s->stride, s->pad) *
                        conv_out_size(w, s->k, s->stride, s->pad) * s->cout;
            run_note_act(r, sz);
            a->conv_out[j] = run_carve(r, sz);
            a->act[j] = j < nc - 1 ? run_carve(r, sz) : NULL;
            a->mean[j] = run_carve(r, (size_t)s->cout);
            a->invstd[j] = run_carve(r, (size_t)s->cout);
        }
        size_t out = nb * b->out_h * b->out_w * b->cout;
        run_note_act(r, out);
        run_note_act(r, nb * b->in_h * b->in_w * b->cin);
        if (b->has_projection) {
            run_note_conv(r, &b->proj_conv.spec, b->in_h, b->in_w);
            a->proj_out = run_carve(r, out);
            a->proj_mean = run_carve(r, (size_t)b->cout);
            a->proj_invstd = run_carve(r, (size_t)b->cout);
        }
        a->out = run_carve(r, out);
    }
    r->pooled = run_carve(r, nb * m->fc_in);
    r->dpooled = run_carve(r, nb * m->fc_in);
    r->logits = run_carve(r, nb * m->fc_out);
    r->dlogits = run_carve(r, nb * m->fc_out);
    r->tmp_main = run_carve(r, r->max_act);
    r->tmp_short = run_carve(r, r->max_act);
    for (int i = 0; i < 4; i++) r->grad[i] = run_carve(r, r->max_act);
    r->workspace = run_carve(r, r->workspace_floats ? r->workspace_floats : 1);
}

struct MODEL_RUN *MODEL_FN(model_run_create)(const Model *m, int max_batch) {
    if (max_batch < 1) die("model: batch size must be at least 1, got %d", max_batch);
    struct MODEL_RUN *r = xcalloc(1, sizeof *r);
    r->max_batch = max_batch;
    r->acts = xcalloc((size_t)m->n_blocks, sizeof *r->acts);
    run_layout(r, m); /* count (sizes the scratch and workspace too) */
    r->arena_floats = r->cursor;
    r->arena = xmalloc_aligned(r->arena_floats * sizeof(real_t));
    run_layout(r, m); /* place */
    return r;
}

void MODEL_FN(model_run_free)(struct MODEL_RUN *run) {
    if (!run) return;
    free(run->arena);
    free(run->acts);
    free(run);
}

const real_t *MODEL_FN(model_run_logits)(const struct MODEL_RUN *run) { return run->logits; }

/* ---------------------------------------------------------------- forward */

static void conv_fwd(struct MODEL_RUN *r, const ConvLayer *l, const real_t *params, int n, int h,
                     int w, const real_t *x, real_t *y) {
    MODEL_OP(conv2d_forward)(&l->spec, n, h, w, x, params + l->weight, params + l->bias, y,
                             r->workspace);
}

/* BN in training mode (saving statistics, updating running ones) or eval mode. */
static void bn_fwd(const BNLayer *l, const real_t *params, real_t *buffers, const real_t *cbuffers,
                   int train, int rows, const real_t *x, real_t *y, real_t *mean, real_t *invstd) {
    if (train)
        MODEL_OP(batchnorm2d_forward_train)(rows, l->c, x, params + l->gamma, params + l->beta, y,
                                            mean, invstd, buffers + l->running_mean,
                                            buffers + l->running_var, MODEL_BN_MOMENTUM,
                                            MODEL_BN_EPS);
    else
        MODEL_OP(batchnorm2d_forward_eval)(rows, l->c, x, params + l->gamma, params + l->beta,
                                           cbuffers + l->running_mean, cbuffers + l->running_var,
                                           MODEL_BN_EPS, y);
}

/* BN then ReLU; fused in training mode, where the cost is. */
static void bn_relu_fwd(const BNLayer *l, const real_t *params, real_t *buffers,
                        const real_t *cbuffers, int train, int rows, const real_t *x, real_t *y,
                        real_t *mean, real_t *invstd) {
    if (train) {
        MODEL_OP(batchnorm2d_relu_forward_train)(rows, l->c, x, params + l->gamma,
                                                 params + l->beta, y, mean, invstd,
                                                 buffers + l->running_mean,
                                                 buffers + l->running_var, MODEL_BN_MOMENTUM,
                                                 MODEL_BN_EPS);
    } else {
        bn_fwd(l, params, buffers, cbuffers, train, rows, x, y, mean, invstd);
        MODEL_OP(relu_forward)((size_t)rows * l->c, y, y);
    }
}

static void block_forward(struct MODEL_RUN *r, const Block *b, BlockActs *a, const real_t *params,
                          real_t *buffers, const real_t *cbuffers, int train, int n,
                          const real_t *x) {
    int nc = block_n_convs(b);
    const real_t *in = x;
    for (int j = 0; j < nc; j++) {
        int h, w;
        block_conv_input(b, j, &h, &w);
        const ConvLayer *cl = block_conv(b, j);
        int rows = n * conv_out_size(h, cl->spec.k, cl->spec.stride, cl->spec.pad) *
                   conv_out_size(w, cl->spec.k, cl->spec.stride, cl->spec.pad);
        conv_fwd(r, cl, params, n, h, w, in, a->conv_out[j]);
        real_t *y = j < nc - 1 ? a->act[j] : r->tmp_main;
        if (j < nc - 1)
            bn_relu_fwd(block_bn(b, j), params, buffers, cbuffers, train, rows, a->conv_out[j],
                        y, a->mean[j], a->invstd[j]);
        else /* bn3: its output goes into the residual add */
            bn_fwd(block_bn(b, j), params, buffers, cbuffers, train, rows, a->conv_out[j], y,
                   a->mean[j], a->invstd[j]);
        in = y;
    }
    int rows_out = n * b->out_h * b->out_w;
    const real_t *shortcut = x;
    if (b->has_projection) {
        conv_fwd(r, &b->proj_conv, params, n, b->in_h, b->in_w, x, a->proj_out);
        bn_fwd(&b->proj_bn, params, buffers, cbuffers, train, rows_out, a->proj_out, r->tmp_short,
               a->proj_mean, a->proj_invstd);
        shortcut = r->tmp_short;
    }
    MODEL_OP(add_relu_forward)((size_t)rows_out * b->cout, r->tmp_main, shortcut, a->out);
}

/* Stem, blocks, pool and head; logits land in run->logits. */
static void model_forward(const Model *m, struct MODEL_RUN *r, const real_t *params,
                          real_t *buffers, const real_t *cbuffers, int train, const real_t *x,
                          int n) {
    if (n < 1 || n > r->max_batch)
        die("model: batch of %d images, but the run was created for at most %d", n, r->max_batch);
    r->x = x;
    int rows = n * m->stem_h * m->stem_w;
    conv_fwd(r, &m->stem_conv, params, n, m->cfg.img_height, m->cfg.img_width, x, r->stem_out);
    bn_fwd(&m->stem_bn, params, buffers, cbuffers, train, rows, r->stem_out, r->stem_bn_out,
           r->stem_mean, r->stem_invstd); /* the seed has no ReLU after the stem */
    const real_t *in = r->stem_bn_out;
    for (int i = 0; i < m->n_blocks; i++) {
        block_forward(r, &m->blocks[i], &r->acts[i], params, buffers, cbuffers, train, n, in);
        in = r->acts[i].out;
    }
    const Block *last = &m->blocks[m->n_blocks - 1];
    MODEL_OP(meanpool_forward)(n, last->out_h * last->out_w, m->fc_in, in, r->pooled);
    MODEL_OP(linear_forward)(n, m->fc_in, m->fc_out, r->pooled, params + m->fc_weight,
                             params + m->fc_bias, r->logits);
}

void MODEL_FN(model_forward_eval)(const Model *m, struct MODEL_RUN *run, const real_t *params,
                                  const real_t *buffers, const real_t *x, int n, real_t *logits) {
    model_forward(m, run, params, NULL, buffers, 0, x, n);
    memcpy(logits, run->logits, (size_t)n * m->fc_out * sizeof(real_t));
}

/* ---------------------------------------------------------------- backward */

/* A scratch gradient buffer other than the (up to two) busy ones. */
static real_t *grad_pick(struct MODEL_RUN *r, const real_t *busy1, const real_t *busy2) {
    for (int i = 0; i < 4; i++)
        if (r->grad[i] != busy1 && r->grad[i] != busy2) return r->grad[i];
    die("model: no free gradient buffer (internal error)");
}

static void conv_bwd(struct MODEL_RUN *r, const ConvLayer *l, const real_t *params, real_t *grads,
                     int n, int h, int w, const real_t *x, const real_t *dy, real_t *dx) {
    MODEL_OP(conv2d_backward)(&l->spec, n, h, w, x, params + l->weight, dy, dx, grads + l->weight,
                              grads + l->bias, r->workspace);
}

static void bn_bwd(const BNLayer *l, const real_t *params, real_t *grads, int rows, const real_t *x,
                   const real_t *mean, const real_t *invstd, const real_t *dy, real_t *dx) {
    MODEL_OP(batchnorm2d_backward)(rows, l->c, x, params + l->gamma, mean, invstd, dy, dx,
                                   grads + l->gamma, grads + l->beta);
}

/* dout: gradient of the block's output (one of run->grad, overwritten). Returns the
 * scratch buffer holding the gradient of the block's input x. */
static real_t *block_backward(struct MODEL_RUN *r, const Block *b, const BlockActs *a,
                              const real_t *params, real_t *grads, int n, const real_t *x,
                              real_t *dout) {
    int rows_out = n * b->out_h * b->out_w;
    size_t nout = (size_t)rows_out * b->cout;
    MODEL_OP(relu_backward)(nout, a->out, dout, dout);
    real_t *dshort = dout; /* identity shortcut: the gradient passes through */
    if (b->has_projection) {
        real_t *dp = grad_pick(r, dout, NULL);
        bn_bwd(&b->proj_bn, params, grads, rows_out, a->proj_out, a->proj_mean, a->proj_invstd,
               dout, dp);
        dshort = grad_pick(r, dout, dp);
        conv_bwd(r, &b->proj_conv, params, grads, n, b->in_h, b->in_w, x, dp, dshort);
    }
    real_t *cur = dout;
    for (int j = block_n_convs(b) - 1; j >= 0; j--) {
        const ConvLayer *cl = block_conv(b, j);
        int h, w;
        block_conv_input(b, j, &h, &w);
        int rows = n * conv_out_size(h, cl->spec.k, cl->spec.stride, cl->spec.pad) *
                   conv_out_size(w, cl->spec.k, cl->spec.stride, cl->spec.pad);
        real_t *dc = grad_pick(r, cur, dshort);
        const BNLayer *bl = block_bn(b, j);
        if (j < block_n_convs(b) - 1) /* bn -> relu: mask and BN backward fused */
            MODEL_OP(batchnorm2d_relu_backward)(rows, bl->c, a->conv_out[j], a->act[j],
                                                params + bl->gamma, a->mean[j], a->invstd[j], cur,
                                                dc, grads + bl->gamma, grads + bl->beta);
        else
            bn_bwd(bl, params, grads, rows, a->conv_out[j], a->mean[j], a->invstd[j], cur, dc);
        real_t *din = grad_pick(r, dc, dshort);
        conv_bwd(r, cl, params, grads, n, h, w, j == 0 ? x : a->act[j - 1], dc, din);
        cur = din;
    }
    MODEL_OP(add_forward)((size_t)n * b->in_h * b->in_w * b->cin, cur, dshort, cur);
    return cur;
}

real_t MODEL_FN(model_forward_backward)(const Model *m, struct MODEL_RUN *run, const real_t *params,
                                        real_t *buffers, const real_t *x, const int32_t *labels,
                                        int n, real_t label_smoothing, real_t *grads,
                                        int *correct) {
    for (int i = 0; i < n && i < run->max_batch; i++)
        if (labels[i] < 0 || labels[i] >= m->fc_out)
            die("model: label %d of image %d is outside [0, %d)", (int)labels[i], i, m->fc_out);
    model_forward(m, run, params, buffers, buffers, 1, x, n);
    if (correct) *correct = 0;
    real_t loss = MODEL_OP(softmax_xent_forward_backward)(n, m->fc_out, run->logits, labels,
                                                          label_smoothing, run->dlogits, correct);
    const Block *last = &m->blocks[m->n_blocks - 1];
    MODEL_OP(linear_backward)(n, m->fc_in, m->fc_out, run->pooled, params + m->fc_weight,
                              run->dlogits, run->dpooled, grads + m->fc_weight, grads + m->fc_bias);
    real_t *g = run->grad[0];
    MODEL_OP(meanpool_backward)(n, last->out_h * last->out_w, m->fc_in, run->dpooled, g);
    for (int i = m->n_blocks - 1; i >= 0; i--) {
        const real_t *in = i > 0 ? run->acts[i - 1].out : run->stem_bn_out;
        g = block_backward(run, &m->blocks[i], &run->acts[i], params, grads, n, in, g);
    }
    int rows = n * m->stem_h * m->stem_w;
    real_t *dc = grad_pick(run, g, NULL);
    bn_bwd(&m->stem_bn, params, grads, rows, run->stem_out, run->stem_mean, run->stem_invstd, g,
           dc);
    conv_bwd(run, &m->stem_conv, params, grads, n, m->cfg.img_height, m->cfg.img_width, run->x, dc,
             NULL);
    return loss;
}
