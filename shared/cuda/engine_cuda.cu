/* engine_cuda.cu: the CUDA engine (engine.h), one GPU per process.
 *
 * Mirrors engine_cpu.c + model.c step for step: the same augmentation (bit-identical,
 * augment_cuda.cu), the same walk through the network (stem conv, stem BN without
 * ReLU, blocks with conv/BN/ReLU and projection shortcuts, mean pool, linear,
 * softmax cross-entropy), the same backward order and the same SGD rule, on the ops
 * of ops_cuda.cu.
 *
 * Device state: params, grads, momentum and BN buffers in flat device buffers at the
 * Model's offsets, except that conv weights (and their gradients and momentum) are
 * held in cuDNN's NHWC filter layout (KRSC) so no step converts anything;
 * state_to_host / state_from_host convert to and from PyTorch's KCRS. The dataset
 * splits are copied to the device once, as uint8.
 *
 * Per step: the sample indices, epoch, learning rate and first-step flag are copied
 * to device memory, then the step runs. From the second full-size batch on, the
 * whole step (augment, forward, backward, and the SGD update when there is a single
 * process) is one CUDA graph, captured once and replayed; with several processes
 * the gradient all-reduce runs between the graph and the SGD kernel (NCCL runs on
 * its own stream, see comm_nccl.h). Partial batches run eagerly. CIFAR_CUDA_GRAPH=0
 * disables the graph. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_check.h"
#include "nn/engine.h"
#include "nn/model.h"
#include "cuda/ops_cuda.h"

/* Workspace one convolution algorithm may use (cudnnFind* skips hungrier ones). */
#define CONV_WS_LIMIT ((size_t)256 << 20)

/* One conv layer of the model with its input size and cuDNN plan. */
typedef struct {
    const ConvLayer *layer;
    int h, w;
    ConvCuda *plan;
} GpuConv;

#define GPU_BLOCK_MAX_CONVS 3

/* model.c's BlockActs, on the device, plus the plan index of each conv. */
typedef struct {
    int conv[GPU_BLOCK_MAX_CONVS], proj;
    float *conv_out[GPU_BLOCK_MAX_CONVS];
    float *act[GPU_BLOCK_MAX_CONVS];
    float *mean[GPU_BLOCK_MAX_CONVS], *invstd[GPU_BLOCK_MAX_CONVS];
    float *proj_out, *proj_mean, *proj_invstd;
    float *out;
} GpuBlock;

/* Per-step scalars read by the kernels at run time (so a graph can be replayed). */
typedef struct {
    int64_t epoch;
    float lr;
    int32_t first_step;
} StepArgs;

typedef struct {
    CudaCtx *ctx;
    int tf32;
    /* model state */
    float *params, *grads, *momentum, *buffers;
    float *stage;        /* num_params floats: layout conversion at state transfers */
    uint8_t *decay_mask;
    /* dataset */
    uint8_t *train_px, *test_px;
    int32_t *train_lab, *test_lab;
    /* convolutions */
    GpuConv *convs;
    int n_convs, stem_conv;
    void *ws;
    size_t ws_bytes;
    /* activations (model.c's ModelRun) */
    char *arena;
    size_t arena_bytes, cursor;
    float *stem_out, *stem_bn_out, *stem_mean, *stem_invstd;
    GpuBlock *blocks;
    float *pooled, *dpooled, *logits, *dlogits;
    float *tmp_main, *tmp_short;
    float *grad[4];
    size_t max_act;
    /* batch */
    float *batch_x;
    int32_t *batch_y, *pred;
    int64_t *idx;
    StepArgs *args;
    float *loss;
    int *correct;
    /* pinned host mirrors */
    int64_t *h_idx;
    StepArgs *h_args;
    float *h_loss;
    int *h_correct;
    float *h_scratch; /* num_params floats, for non-NCCL communicators */
    /* CUDA graph of the full-batch step */
    int graph_enabled, graph_fused_sgd, full_steps;
    cudaGraphExec_t graph;
} GpuEngine;

/* ---------------------------------------------------------------- layout */

/* Two passes over the same walk, as model.c: with no arena it only counts.
 * Every tensor starts on a 256-byte boundary. */
static void *carve(GpuEngine *g, size_t bytes) {
    size_t at = g->cursor;
    g->cursor += (bytes + 255) & ~(size_t)255;
    return g->arena ? g->arena + at : NULL;
}

static float *carve_f(GpuEngine *g, size_t n) { return (float *)carve(g, n * sizeof(float)); }

static void note_act(GpuEngine *g, size_t n) {
    if (n > g->max_act) g->max_act = n;
}

static int block_n_convs(const Block *b) { return b->bottleneck ? 3 : 2; }

static const ConvLayer *block_conv(const Block *b, int i) {
    return i == 0 ? &b->conv1 : i == 1 ? &b->conv2 : &b->conv3;
}

static const BNLayer *block_bn(const Block *b, int i) {
    return i == 0 ? &b->bn1 : i == 1 ? &b->bn2 : &b->bn3;
}

static void block_conv_input(const Block *b, int i, int *h, int *w) {
    *h = b->in_h;
    *w = b->in_w;
    for (int j = 0; j < i; j++) {
        const ConvSpec *s = &block_conv(b, j)->spec;
        *h = conv_out_size(*h, s->k, s->stride, s->pad);
        *w = conv_out_size(*w, s->k, s->stride, s->pad);
    }
}

static size_t conv_out_rows(const ConvSpec *s, int n, int h, int w) {
    return (size_t)n * conv_out_size(h, s->k, s->stride, s->pad) * conv_out_size(w, s->k, s->stride, s->pad);
}

static void layout(GpuEngine *g, const Model *m, int max_batch) {
    size_t nb = (size_t)max_batch;
    const ModelConfig *mc = &m->cfg;
    g->cursor = 0;
    size_t stem = nb * m->stem_h * m->stem_w * m->stem_conv.spec.cout;
    note_act(g, stem);
    g->stem_out = carve_f(g, stem);
    g->stem_bn_out = carve_f(g, stem);
    g->stem_mean = carve_f(g, (size_t)m->stem_bn.c);
    g->stem_invstd = carve_f(g, (size_t)m->stem_bn.c);
    for (int i = 0; i < m->n_blocks; i++) {
        const Block *b = &m->blocks[i];
        GpuBlock *a = &g->blocks[i];
        int nc = block_n_convs(b);
        for (int j = 0; j < nc; j++) {
            const ConvSpec *s = &block_conv(b, j)->spec;
            int h, w;
            block_conv_input(b, j, &h, &w);
            size_t sz = conv_out_rows(s, max_batch, h, w) * s->cout;
            note_act(g, sz);
            a->conv_out[j] = carve_f(g, sz);
            a->act[j] = j < nc - 1 ? carve_f(g, sz) : NULL;
            a->mean[j] = carve_f(g, (size_t)s->cout);
            a->invstd[j] = carve_f(g, (size_t)s->cout);
        }
        size_t out = nb * b->out_h * b->out_w * b->cout;
        note_act(g, out);
        note_act(g, nb * b->in_h * b->in_w * b->cin);
        if (b->has_projection) {
            a->proj_out = carve_f(g, out);
            a->proj_mean = carve_f(g, (size_t)b->cout);
            a->proj_invstd = carve_f(g, (size_t)b->cout);
        }
        a->out = carve_f(g, out);
    }
    g->pooled = carve_f(g, nb * m->fc_in);
    g->dpooled = carve_f(g, nb * m->fc_in);
    g->logits = carve_f(g, nb * m->fc_out);
    g->dlogits = carve_f(g, nb * m->fc_out);
    g->tmp_main = carve_f(g, g->max_act);
    g->tmp_short = carve_f(g, g->max_act);
    for (int i = 0; i < 4; i++) g->grad[i] = carve_f(g, g->max_act);
    g->batch_x = carve_f(g, nb * mc->img_height * mc->img_width * mc->img_channels);
    g->batch_y = (int32_t *)carve(g, nb * sizeof(int32_t));
    g->pred = (int32_t *)carve(g, nb * sizeof(int32_t));
    g->idx = (int64_t *)carve(g, nb * sizeof(int64_t));
    g->args = (StepArgs *)carve(g, sizeof(StepArgs));
    g->loss = (float *)carve(g, sizeof(float));
    g->correct = (int *)carve(g, sizeof(int));
}

/* ------------------------------------------------------- convolution plans */

static int conv_add(GpuEngine *g, const ConvLayer *l, int h, int w) {
    GpuConv *c = &g->convs[g->n_convs];
    c->layer = l;
    c->h = h;
    c->w = w;
    c->plan = NULL;
    return g->n_convs++;
}

static void convs_collect(GpuEngine *g, const Model *m) {
    g->convs = (GpuConv *)xcalloc((size_t)1 + 4 * (size_t)m->n_blocks, sizeof(GpuConv));
    g->stem_conv = conv_add(g, &m->stem_conv, m->cfg.img_height, m->cfg.img_width);
    for (int i = 0; i < m->n_blocks; i++) {
        const Block *b = &m->blocks[i];
        GpuBlock *a = &g->blocks[i];
        for (int j = 0; j < block_n_convs(b); j++) {
            int h, w;
            block_conv_input(b, j, &h, &w);
            a->conv[j] = conv_add(g, block_conv(b, j), h, w);
        }
        a->proj = b->has_projection ? conv_add(g, &b->proj_conv, b->in_h, b->in_w) : -1;
    }
}

static void convs_plan(GpuEngine *g, int max_batch) {
    g->ws_bytes = 0;
    for (int i = 0; i < g->n_convs; i++) {
        GpuConv *c = &g->convs[i];
        c->plan = conv_cuda_create(g->ctx, &c->layer->spec, max_batch, c->h, c->w, CONV_WS_LIMIT);
        size_t b = conv_cuda_workspace_bytes(c->plan);
        if (b > g->ws_bytes) g->ws_bytes = b;
    }
    g->ws = cuda_alloc(g->ws_bytes);
}

/* ---------------------------------------------------------------- forward */

static void conv_fwd(GpuEngine *g, int id, int n, const float *x, float *y) {
    const ConvLayer *l = g->convs[id].layer;
    conv_cuda_forward(g->ctx, g->convs[id].plan, n, x, g->params + l->weight, g->params + l->bias, y,
                      g->ws, g->ws_bytes);
}

static void bn_fwd(GpuEngine *g, const BNLayer *l, int train, int rows, const float *x, float *y,
                   float *mean, float *invstd) {
    if (train)
        batchnorm2d_forward_train_cuda(g->ctx, rows, l->c, x, g->params + l->gamma, g->params + l->beta,
                                       y, mean, invstd, g->buffers + l->running_mean,
                                       g->buffers + l->running_var, MODEL_BN_MOMENTUM, MODEL_BN_EPS);
    else
        batchnorm2d_forward_eval_cuda(g->ctx, rows, l->c, x, g->params + l->gamma, g->params + l->beta,
                                      g->buffers + l->running_mean, g->buffers + l->running_var,
                                      MODEL_BN_EPS, y);
}

static void block_forward(GpuEngine *g, const Block *b, GpuBlock *a, int train, int n,
                          const float *x) {
    int nc = block_n_convs(b);
    const float *in = x;
    for (int j = 0; j < nc; j++) {
        int h, w;
        block_conv_input(b, j, &h, &w);
        const ConvLayer *cl = block_conv(b, j);
        int rows = (int)conv_out_rows(&cl->spec, n, h, w);
        conv_fwd(g, a->conv[j], n, in, a->conv_out[j]);
        float *y = j < nc - 1 ? a->act[j] : g->tmp_main;
        bn_fwd(g, block_bn(b, j), train, rows, a->conv_out[j], y, a->mean[j], a->invstd[j]);
        if (j < nc - 1) relu_forward_cuda(g->ctx, (size_t)rows * cl->spec.cout, y, y);
        in = y;
    }
    int rows_out = n * b->out_h * b->out_w;
    const float *shortcut = x;
    if (b->has_projection) {
        conv_fwd(g, a->proj, n, x, a->proj_out);
        bn_fwd(g, &b->proj_bn, train, rows_out, a->proj_out, g->tmp_short, a->proj_mean,
               a->proj_invstd);
        shortcut = g->tmp_short;
    }
    add_relu_forward_cuda(g->ctx, (size_t)rows_out * b->cout, g->tmp_main, shortcut, a->out);
}

/* Stem, blocks, pool and head on g->batch_x; logits land in g->logits. */
static void model_forward_gpu(GpuEngine *g, const Model *m, int train, int n) {
    int rows = n * m->stem_h * m->stem_w;
    conv_fwd(g, g->stem_conv, n, g->batch_x, g->stem_out);
    bn_fwd(g, &m->stem_bn, train, rows, g->stem_out, g->stem_bn_out, g->stem_mean,
           g->stem_invstd); /* the seed has no ReLU after the stem */
    const float *in = g->stem_bn_out;
    for (int i = 0; i < m->n_blocks; i++) {
        block_forward(g, &m->blocks[i], &g->blocks[i], train, n, in);
        in = g->blocks[i].out;
    }
    const Block *last = &m->blocks[m->n_blocks - 1];
    meanpool_forward_cuda(g->ctx, n, last->out_h * last->out_w, m->fc_in, in, g->pooled);
    linear_forward_cuda(g->ctx, n, m->fc_in, m->fc_out, g->pooled, g->params + m->fc_weight,
                        g->params + m->fc_bias, g->logits);
}

/* ---------------------------------------------------------------- backward */

static float *grad_pick(GpuEngine *g, const float *busy1, const float *busy2) {
    for (int i = 0; i < 4; i++)
        if (g->grad[i] != busy1 && g->grad[i] != busy2) return g->grad[i];
    die("cuda engine: no free gradient buffer (internal error)");
}

static void conv_bwd(GpuEngine *g, int id, int n, const float *x, const float *dy, float *dx) {
    const ConvLayer *l = g->convs[id].layer;
    conv_cuda_backward(g->ctx, g->convs[id].plan, n, x, g->params + l->weight, dy, dx,
                       g->grads + l->weight, g->grads + l->bias, g->ws, g->ws_bytes);
}

static void bn_bwd(GpuEngine *g, const BNLayer *l, int rows, const float *x, const float *mean,
                   const float *invstd, const float *dy, float *dx) {
    batchnorm2d_backward_cuda(g->ctx, rows, l->c, x, g->params + l->gamma, mean, invstd, dy, dx,
                              g->grads + l->gamma, g->grads + l->beta);
}

/* model.c's block_backward: dout (one of g->grad, overwritten) in, the buffer
 * holding the gradient of the block's input x out. */
static float *block_backward(GpuEngine *g, const Block *b, const GpuBlock *a, int n, const float *x,
                             float *dout) {
    int rows_out = n * b->out_h * b->out_w;
    size_t nout = (size_t)rows_out * b->cout;
    relu_backward_cuda(g->ctx, nout, a->out, dout, dout);
    float *dshort = dout; /* identity shortcut: the gradient passes through */
    if (b->has_projection) {
        float *dp = grad_pick(g, dout, NULL);
        bn_bwd(g, &b->proj_bn, rows_out, a->proj_out, a->proj_mean, a->proj_invstd, dout, dp);
        dshort = grad_pick(g, dout, dp);
        conv_bwd(g, a->proj, n, x, dp, dshort);
    }
    float *cur = dout;
    for (int j = block_n_convs(b) - 1; j >= 0; j--) {
        const ConvLayer *cl = block_conv(b, j);
        int h, w;
        block_conv_input(b, j, &h, &w);
        int rows = (int)conv_out_rows(&cl->spec, n, h, w);
        if (j < block_n_convs(b) - 1)
            relu_backward_cuda(g->ctx, (size_t)rows * cl->spec.cout, a->act[j], cur, cur);
        float *dc = grad_pick(g, cur, dshort);
        bn_bwd(g, block_bn(b, j), rows, a->conv_out[j], a->mean[j], a->invstd[j], cur, dc);
        float *din = grad_pick(g, dc, dshort);
        conv_bwd(g, a->conv[j], n, j == 0 ? x : a->act[j - 1], dc, din);
        cur = din;
    }
    add_forward_cuda(g->ctx, (size_t)n * b->in_h * b->in_w * b->cin, cur, dshort, cur);
    return cur;
}

/* From g->dlogits: every parameter gradient into g->grads (overwritten). */
static void model_backward_gpu(GpuEngine *g, const Model *m, int n) {
    const Block *last = &m->blocks[m->n_blocks - 1];
    linear_backward_cuda(g->ctx, n, m->fc_in, m->fc_out, g->pooled, g->params + m->fc_weight,
                         g->dlogits, g->dpooled, g->grads + m->fc_weight, g->grads + m->fc_bias);
    float *d = g->grad[0];
    meanpool_backward_cuda(g->ctx, n, last->out_h * last->out_w, m->fc_in, g->dpooled, d);
    for (int i = m->n_blocks - 1; i >= 0; i--) {
        const float *in = i > 0 ? g->blocks[i - 1].out : g->stem_bn_out;
        d = block_backward(g, &m->blocks[i], &g->blocks[i], n, in, d);
    }
    int rows = n * m->stem_h * m->stem_w;
    float *dc = grad_pick(g, d, NULL);
    bn_bwd(g, &m->stem_bn, rows, g->stem_out, g->stem_mean, g->stem_invstd, d, dc);
    conv_bwd(g, g->stem_conv, n, g->batch_x, dc, NULL);
}

/* ---------------------------------------------------------------- steps */

static int comm_world(const Engine *e) { return e->cfg.comm ? comm_world_size(e->cfg.comm) : 1; }

/* Everything of one training step that depends only on device memory: the batch
 * from g->idx, forward, loss, backward, and the SGD update when fused. */
static void train_body(Engine *e, GpuEngine *g, int n, int fuse_sgd) {
    const Model *m = e->cfg.model;
    AugmentSpec spec = engine_augment_spec(e, 0, 1);
    augment_batch_cuda(g->ctx, &spec, g->train_px, g->train_lab, g->idx, n, g->batch_x, g->batch_y,
                       &g->args->epoch);
    model_forward_gpu(g, m, 1, n);
    softmax_xent_cuda_async(g->ctx, n, m->fc_out, g->logits, g->batch_y, e->cfg.label_smoothing,
                            g->dlogits, g->loss, g->correct, NULL);
    model_backward_gpu(g, m, n);
    if (fuse_sgd)
        sgd_update_cuda_dev(g->ctx, m->num_params, g->params, g->grads, g->momentum, g->decay_mask,
                            &g->args->lr, e->cfg.momentum, e->cfg.weight_decay, e->cfg.nesterov,
                            &g->args->first_step);
}

static void graph_capture(Engine *e, GpuEngine *g, int n, int fuse_sgd) {
    cudaStream_t s = (cudaStream_t)cuda_ctx_stream(g->ctx);
    cudaGraph_t graph;
    CHECK_CUDA(cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal));
    train_body(e, g, n, fuse_sgd);
    CHECK_CUDA(cudaStreamEndCapture(s, &graph));
    CHECK_CUDA(cudaGraphInstantiate(&g->graph, graph, 0));
    CHECK_CUDA(cudaGraphDestroy(graph));
    g->graph_fused_sgd = fuse_sgd;
}

/* Mean of the gradients over the processes: NCCL works on device memory (its own
 * stream: ours must be finished first); other communicators on host memory. */
static void grads_allreduce(Engine *e, GpuEngine *g) {
    Comm *c = e->cfg.comm;
    size_t np = e->cfg.model->num_params;
    cuda_ctx_sync(g->ctx);
    if (comm_kind(c) == COMM_NCCL) {
        comm_allreduce_mean(c, g->grads, np);
    } else {
        cuda_download(g->ctx, g->h_scratch, g->grads, np * sizeof(float));
        comm_allreduce_mean(c, g->h_scratch, np);
        cuda_upload(g->ctx, g->grads, g->h_scratch, np * sizeof(float));
    }
}

static float cuda_train_step(Engine *e, const int64_t *idx, int n, int64_t epoch, int64_t step,
                             float lr, int *correct) {
    GpuEngine *g = (GpuEngine *)e->impl;
    const Model *m = e->cfg.model;
    cudaStream_t s = (cudaStream_t)cuda_ctx_stream(g->ctx);
    if (n < 1 || n > e->cfg.max_batch)
        die("cuda engine: batch of %d images, but the engine was created for at most %d", n,
            e->cfg.max_batch);
    memcpy(g->h_idx, idx, (size_t)n * sizeof(int64_t));
    g->h_args->epoch = epoch;
    g->h_args->lr = lr;
    g->h_args->first_step = step == 0;
    CHECK_CUDA(cudaMemcpyAsync(g->idx, g->h_idx, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    CHECK_CUDA(cudaMemcpyAsync(g->args, g->h_args, sizeof(StepArgs), cudaMemcpyHostToDevice, s));
    int world = comm_world(e);
    int fuse_sgd = world == 1;
    if (n == e->cfg.max_batch && g->graph_enabled) {
        /* The first full step runs eagerly (lazy kernel loading, cuDNN and cuBLAS
         * set-up happen outside the capture); the second is captured. */
        if (!g->graph && g->full_steps >= 1) graph_capture(e, g, n, fuse_sgd);
        g->full_steps++;
        if (g->graph) {
            CHECK_CUDA(cudaGraphLaunch(g->graph, s));
            fuse_sgd = g->graph_fused_sgd;
        } else {
            train_body(e, g, n, fuse_sgd);
        }
    } else {
        train_body(e, g, n, fuse_sgd);
    }
    if (!fuse_sgd) {
        if (world > 1) grads_allreduce(e, g);
        sgd_update_cuda_dev(g->ctx, m->num_params, g->params, g->grads, g->momentum, g->decay_mask,
                            &g->args->lr, e->cfg.momentum, e->cfg.weight_decay, e->cfg.nesterov,
                            &g->args->first_step);
    }
    CHECK_CUDA(cudaMemcpyAsync(g->h_loss, g->loss, sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaMemcpyAsync(g->h_correct, g->correct, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    if (correct) *correct = *g->h_correct;
    return *g->h_loss;
}

static void cuda_eval_batch(Engine *e, const int64_t *idx, int n, double *loss_sum, int64_t *correct,
                            int32_t *predictions) {
    GpuEngine *g = (GpuEngine *)e->impl;
    const Model *m = e->cfg.model;
    cudaStream_t s = (cudaStream_t)cuda_ctx_stream(g->ctx);
    if (n < 1 || n > e->cfg.max_batch)
        die("cuda engine: eval batch of %d images, but the engine was created for at most %d", n,
            e->cfg.max_batch);
    memcpy(g->h_idx, idx, (size_t)n * sizeof(int64_t));
    CHECK_CUDA(cudaMemcpyAsync(g->idx, g->h_idx, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    AugmentSpec spec = engine_augment_spec(e, 0, 0);
    augment_batch_cuda(g->ctx, &spec, g->test_px, g->test_lab, g->idx, n, g->batch_x, g->batch_y, NULL);
    model_forward_gpu(g, m, 0, n);
    softmax_xent_cuda_async(g->ctx, n, m->fc_out, g->logits, g->batch_y, 0.0f, NULL, g->loss,
                            g->correct, predictions ? g->pred : NULL);
    CHECK_CUDA(cudaMemcpyAsync(g->h_loss, g->loss, sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaMemcpyAsync(g->h_correct, g->correct, sizeof(int), cudaMemcpyDeviceToHost, s));
    if (predictions)
        CHECK_CUDA(cudaMemcpyAsync(predictions, g->pred, (size_t)n * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    *loss_sum += (double)*g->h_loss * n;
    *correct += *g->h_correct;
}

/* ---------------------------------------------------------------- state */

/* Device flat buffer (conv weights KRSC) -> host flat buffer (PyTorch layout). */
static void flat_to_host(Engine *e, GpuEngine *g, const float *dev, float *host) {
    size_t np = e->cfg.model->num_params;
    cuda_copy_d2d_async(g->ctx, g->stage, dev, np * sizeof(float));
    for (int i = 0; i < g->n_convs; i++) {
        const ConvLayer *l = g->convs[i].layer;
        conv_weight_from_krsc_cuda(g->ctx, &l->spec, dev + l->weight, g->stage + l->weight);
    }
    cuda_download(g->ctx, host, g->stage, np * sizeof(float));
}

static void flat_from_host(Engine *e, GpuEngine *g, const float *host, float *dev) {
    size_t np = e->cfg.model->num_params;
    cuda_upload(g->ctx, g->stage, host, np * sizeof(float));
    cuda_copy_d2d_async(g->ctx, dev, g->stage, np * sizeof(float));
    for (int i = 0; i < g->n_convs; i++) {
        const ConvLayer *l = g->convs[i].layer;
        conv_weight_to_krsc_cuda(g->ctx, &l->spec, g->stage + l->weight, dev + l->weight);
    }
    cuda_ctx_sync(g->ctx);
}

static void cuda_state_to_host(Engine *e, float *params, float *buffers, float *momentum) {
    GpuEngine *g = (GpuEngine *)e->impl;
    flat_to_host(e, g, g->params, params);
    cuda_download(g->ctx, buffers, g->buffers, e->cfg.model->num_buffers * sizeof(float));
    if (momentum) flat_to_host(e, g, g->momentum, momentum);
}

static void cuda_state_from_host(Engine *e, const float *params, const float *buffers,
                                 const float *momentum) {
    GpuEngine *g = (GpuEngine *)e->impl;
    size_t np = e->cfg.model->num_params;
    flat_from_host(e, g, params, g->params);
    cuda_upload(g->ctx, g->buffers, buffers, e->cfg.model->num_buffers * sizeof(float));
    if (momentum)
        flat_from_host(e, g, momentum, g->momentum);
    else
        cuda_memset_async(g->ctx, g->momentum, 0, np * sizeof(float));
    cuda_ctx_sync(g->ctx);
}

static void cuda_broadcast_buffers(Engine *e, int root) {
    GpuEngine *g = (GpuEngine *)e->impl;
    Comm *c = e->cfg.comm;
    size_t bytes = e->cfg.model->num_buffers * sizeof(float);
    if (!c || comm_world_size(c) == 1) return;
    cuda_ctx_sync(g->ctx);
    if (comm_kind(c) == COMM_NCCL) {
        comm_broadcast(c, g->buffers, bytes, root);
    } else {
        cuda_download(g->ctx, g->h_scratch, g->buffers, bytes);
        comm_broadcast(c, g->h_scratch, bytes, root);
        cuda_upload(g->ctx, g->buffers, g->h_scratch, bytes);
    }
}

static void cuda_destroy(Engine *e) {
    GpuEngine *g = (GpuEngine *)e->impl;
    cuda_ctx_sync(g->ctx);
    if (g->graph) CHECK_CUDA(cudaGraphExecDestroy(g->graph));
    for (int i = 0; i < g->n_convs; i++) conv_cuda_free(g->convs[i].plan);
    free(g->convs);
    free(g->blocks);
    cuda_free(g->ws);
    cuda_free(g->arena);
    cuda_free(g->params);
    cuda_free(g->grads);
    cuda_free(g->momentum);
    cuda_free(g->buffers);
    cuda_free(g->stage);
    cuda_free(g->decay_mask);
    cuda_free(g->train_px);
    cuda_free(g->test_px);
    cuda_free(g->train_lab);
    cuda_free(g->test_lab);
    CHECK_CUDA(cudaFreeHost(g->h_idx));
    CHECK_CUDA(cudaFreeHost(g->h_args));
    CHECK_CUDA(cudaFreeHost(g->h_loss));
    CHECK_CUDA(cudaFreeHost(g->h_correct));
    free(g->h_scratch);
    cuda_ctx_free(g->ctx);
    free(g);
    free(e);
}

static const EngineOps cuda_engine_ops = {
    "cuda",
    cuda_train_step,
    cuda_eval_batch,
    cuda_state_to_host,
    cuda_state_from_host,
    cuda_broadcast_buffers,
    cuda_destroy,
};

/* ---------------------------------------------------------------- creation */

extern "C" int engine_cuda_device_count(void) { return ops_cuda_device_count(); }

/* Labels must be in [0, K): the CPU model checks every batch, here the whole split
 * is checked once before it goes to the device. */
static void split_check_labels(const HostSplit *s, const char *name, int k) {
    for (int64_t i = 0; i < s->count; i++)
        if (s->labels[i] < 0 || s->labels[i] >= k)
            die("%s split: label %d of record %lld is outside [0, %d)", name, (int)s->labels[i],
                (long long)i, k);
}

static void split_upload(GpuEngine *g, const HostSplit *s, size_t rec_bytes, uint8_t **px,
                         int32_t **lab) {
    *px = (uint8_t *)cuda_alloc((size_t)s->count * rec_bytes);
    *lab = (int32_t *)cuda_alloc((size_t)s->count * sizeof(int32_t));
    if (s->records) { /* in place in the dataset's map: gathered in pieces */
        const int64_t piece = (int64_t)((64u << 20) / rec_bytes) + 1;
        uint8_t *stage = (uint8_t *)xmalloc((size_t)piece * rec_bytes);
        for (int64_t first = 0; first < s->count; first += piece) {
            int64_t n = s->count - first < piece ? s->count - first : piece;
            host_split_gather(s, rec_bytes, NULL, first, n, stage, NULL);
            cuda_upload(g->ctx, *px + (size_t)first * rec_bytes, stage, (size_t)n * rec_bytes);
        }
        free(stage);
    } else {
        cuda_upload(g->ctx, *px, s->pixels, (size_t)s->count * rec_bytes);
    }
    cuda_upload(g->ctx, *lab, s->labels, (size_t)s->count * sizeof(int32_t));
}

static uint8_t *decay_mask_upload(GpuEngine *g, const Model *m) {
    uint8_t *mask = (uint8_t *)xcalloc(m->num_params, 1);
    for (int t = 0; t < m->n_tensors; t++) {
        const TensorInfo *ti = &m->tensors[t];
        if (ti->kind == TENSOR_PARAM && ti->decay) memset(mask + ti->offset, 1, ti->numel);
    }
    uint8_t *dev = (uint8_t *)cuda_alloc(m->num_params);
    cuda_upload(g->ctx, dev, mask, m->num_params);
    free(mask);
    return dev;
}

static void *host_pinned(size_t bytes) {
    void *p = NULL;
    CHECK_CUDA(cudaMallocHost(&p, bytes));
    memset(p, 0, bytes);
    return p;
}

extern "C" Engine *engine_create_cuda(const EngineConfig *cfg, char *err, size_t errlen) {
    const Model *m = cfg->model;
    const ModelConfig *mc = &m->cfg;
    if (cfg->precision == PRECISION_BF16) {
        snprintf(err, errlen, "--precision bf16 is not implemented yet on the GPU: use fp32 or tf32");
        return NULL;
    }
    int count = ops_cuda_device_count();
    if (count == 0) {
        snprintf(err, errlen, "no usable CUDA device (no NVIDIA driver, or no GPU visible)");
        return NULL;
    }
    if (cfg->device < 0 || cfg->device >= count) {
        snprintf(err, errlen, "device %d does not exist (%d visible: check CUDA_VISIBLE_DEVICES)",
                 cfg->device, count);
        return NULL;
    }
    if (cfg->max_batch < 1) {
        snprintf(err, errlen, "batch size must be at least 1, got %d", cfg->max_batch);
        return NULL;
    }
    split_check_labels(&cfg->train, "train", m->fc_out);
    split_check_labels(&cfg->test, "test", m->fc_out);

    Engine *e = (Engine *)xcalloc(1, sizeof *e);
    GpuEngine *g = (GpuEngine *)xcalloc(1, sizeof *g);
    e->ops = &cuda_engine_ops;
    e->cfg = *cfg;
    e->impl = g;
    g->tf32 = cfg->precision == PRECISION_TF32;
    g->ctx = cuda_ctx_create(cfg->device, g->tf32, cfg->deterministic);
    const char *ge = getenv("CIFAR_CUDA_GRAPH");
    g->graph_enabled = !(ge && strcmp(ge, "0") == 0);

    size_t np = m->num_params, nbuf = m->num_buffers;
    g->params = (float *)cuda_alloc(np * sizeof(float));
    g->grads = (float *)cuda_alloc(np * sizeof(float));
    g->momentum = (float *)cuda_alloc(np * sizeof(float));
    g->stage = (float *)cuda_alloc(np * sizeof(float));
    g->buffers = (float *)cuda_alloc((nbuf ? nbuf : 1) * sizeof(float));
    cuda_memset_async(g->ctx, g->grads, 0, np * sizeof(float));
    cuda_memset_async(g->ctx, g->momentum, 0, np * sizeof(float));
    g->decay_mask = decay_mask_upload(g, m);

    size_t rec = (size_t)mc->img_height * mc->img_width * mc->img_channels;
    split_upload(g, &cfg->train, rec, &g->train_px, &g->train_lab);
    split_upload(g, &cfg->test, rec, &g->test_px, &g->test_lab);

    g->blocks = (GpuBlock *)xcalloc((size_t)m->n_blocks, sizeof(GpuBlock));
    layout(g, m, cfg->max_batch); /* count */
    g->arena_bytes = g->cursor;
    g->arena = (char *)cuda_alloc(g->arena_bytes);
    layout(g, m, cfg->max_batch); /* place */
    convs_collect(g, m);
    convs_plan(g, cfg->max_batch);

    g->h_idx = (int64_t *)host_pinned((size_t)cfg->max_batch * sizeof(int64_t));
    g->h_args = (StepArgs *)host_pinned(sizeof(StepArgs));
    g->h_loss = (float *)host_pinned(sizeof(float));
    g->h_correct = (int *)host_pinned(sizeof(int));
    g->h_scratch = (float *)xmalloc((np > nbuf ? np : nbuf) * sizeof(float));
    cuda_ctx_sync(g->ctx);

    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, cfg->device));
    log_info("cuda engine: device %d (%s), %s%s, activations %.1f MiB, conv workspace %.1f MiB%s",
             cfg->device, prop.name, g->tf32 ? "tf32" : "fp32",
             cfg->deterministic ? ", deterministic" : "", (double)g->arena_bytes / (1 << 20),
             (double)g->ws_bytes / (1 << 20), g->graph_enabled ? ", CUDA graph" : "");
    return e;
}
