/* engine_cpu.c: the CPU engine (engine.h): the reference every other engine is
 * compared with. Everything runs on the host with the CPU's op table (ops_cpu.h); the
 * gradient all-reduce goes through the communicator (shared memory between
 * worker processes). Deterministic for a fixed thread count. */
#include <stdlib.h>
#include <string.h>

#include "data/augment.h"
#include "core/check.h"
#include "model/ema.h"
#include "model/engine.h"
#include "model/model.h"
#include "backend-cpu/cpu_bf16.h"
#include "backend-cpu/ops_cpu.h"

typedef struct {
    float *params, *grads, *momentum, *buffers;
    float *batch_x;    /* max_batch * H*W*C */
    float *batch_x16;  /* --precision bf16: the batch as the bf16 table reads it (else NULL) */
    int32_t *batch_y;
    float *logits;     /* max_batch * K */
    ModelRun *run;
    uint8_t *decay_mask;
    float *ema_params, *ema_buffers; /* ema_decay > 0 only */
} CpuEngine;

/* The augmented batch of n images as the table reads it: bf16 for the bf16 table. */
static const float *batch_input(Engine *e, int n) {
    CpuEngine *c = e->impl;
    if (!c->batch_x16) return c->batch_x;
    const ModelConfig *mc = &e->cfg.model->cfg;
    cpu_bf16_pack((size_t)n * mc->img_height * mc->img_width * mc->img_channels, c->batch_x,
                  c->batch_x16);
    return c->batch_x16;
}

static float cpu_train_step(Engine *e, const int64_t *idx, int n, int64_t epoch, int64_t step,
                            float lr, int *correct) {
    CpuEngine *c = e->impl;
    const Model *m = e->cfg.model;
    AugmentSpec spec = engine_augment_spec(e, epoch, 1);
    augment_split(&spec, &e->cfg.train, idx, n, c->batch_x, c->batch_y);
    float loss = model_forward_backward(m, c->run, c->params, c->buffers, batch_input(e, n), c->batch_y,
                                        n, e->cfg.label_smoothing, c->grads, correct);
    comm_allreduce_mean(e->cfg.comm, c->grads, m->num_params);
    int32_t first_step = step == 0;
    net_cpu_ops()->sgd(NULL, m->num_params, c->params, c->grads, c->momentum, c->decay_mask, &lr,
                       e->cfg.momentum, e->cfg.weight_decay, e->cfg.nesterov, &first_step);
    if (c->ema_params) {
        float decay = engine_ema_decay(e, step);
        ema_update(m->num_params, c->ema_params, c->params, decay);
        ema_update(m->num_buffers, c->ema_buffers, c->buffers, decay);
    }
    return loss;
}

static void cpu_eval_batch(Engine *e, const int64_t *idx, int n, double *loss_sum, int64_t *correct,
                           int32_t *predictions, float *logits) {
    CpuEngine *c = e->impl;
    const Model *m = e->cfg.model;
    const int k = m->fc_out;
    AugmentSpec spec = engine_augment_spec(e, 0, 0);
    augment_split(&spec, &e->cfg.test, idx, n, c->batch_x, c->batch_y);
    model_forward_eval(m, c->run, c->params, c->buffers, batch_input(e, n), n, c->logits);
    if (logits) memcpy(logits, c->logits, (size_t)n * k * sizeof(float));
    int hits = 0;
    float loss = 0;
    net_cpu_ops()->xent(NULL, n, k, c->logits, c->batch_y, 0.0f, NULL, &loss, &hits);
    *loss_sum += (double)loss * n;
    *correct += hits;
    if (predictions) {
        for (int i = 0; i < n; i++) {
            const float *row = c->logits + (size_t)i * k;
            int best = 0;
            for (int j = 1; j < k; j++)
                if (row[j] > row[best]) best = j;
            predictions[i] = best;
        }
    }
}

static void cpu_state_to_host(Engine *e, float *params, float *buffers, float *momentum) {
    CpuEngine *c = e->impl;
    const Model *m = e->cfg.model;
    memcpy(params, c->params, m->num_params * sizeof(float));
    memcpy(buffers, c->buffers, m->num_buffers * sizeof(float));
    if (momentum) memcpy(momentum, c->momentum, m->num_params * sizeof(float));
}

static void cpu_state_from_host(Engine *e, const float *params, const float *buffers,
                                const float *momentum) {
    CpuEngine *c = e->impl;
    const Model *m = e->cfg.model;
    memcpy(c->params, params, m->num_params * sizeof(float));
    memcpy(c->buffers, buffers, m->num_buffers * sizeof(float));
    if (momentum)
        memcpy(c->momentum, momentum, m->num_params * sizeof(float));
    else
        memset(c->momentum, 0, m->num_params * sizeof(float));
}

static void cpu_ema_to_host(Engine *e, float *params, float *buffers) {
    CpuEngine *c = e->impl;
    const Model *m = e->cfg.model;
    if (!c->ema_params) die("cpu engine: no moving average (ema_decay is 0)");
    memcpy(params, c->ema_params, m->num_params * sizeof(float));
    memcpy(buffers, c->ema_buffers, m->num_buffers * sizeof(float));
}

static void cpu_ema_from_host(Engine *e, const float *params, const float *buffers) {
    CpuEngine *c = e->impl;
    const Model *m = e->cfg.model;
    if (!c->ema_params) die("cpu engine: no moving average (ema_decay is 0)");
    memcpy(c->ema_params, params, m->num_params * sizeof(float));
    memcpy(c->ema_buffers, buffers, m->num_buffers * sizeof(float));
}

static void cpu_broadcast_buffers(Engine *e, int root) {
    CpuEngine *c = e->impl;
    comm_broadcast(e->cfg.comm, c->buffers, e->cfg.model->num_buffers * sizeof(float), root);
}

static void cpu_destroy(Engine *e) {
    CpuEngine *c = e->impl;
    model_run_free(c->run);
    free(c->params);
    free(c->grads);
    free(c->momentum);
    free(c->buffers);
    free(c->batch_x);
    free(c->batch_x16);
    free(c->batch_y);
    free(c->logits);
    free(c->decay_mask);
    free(c->ema_params);
    free(c->ema_buffers);
    free(c);
    free(e);
}

static const EngineOps cpu_engine_ops = {
    "cpu",
    cpu_train_step,
    cpu_eval_batch,
    NULL, /* prefetch: the CPU engine reads the batch where it lies */
    cpu_state_to_host,
    cpu_state_from_host,
    cpu_ema_to_host,
    cpu_ema_from_host,
    cpu_broadcast_buffers,
    cpu_destroy,
    NULL, /* state_stage: state_to_host is a memcpy already */
    NULL,
};

/* 1 for every parameter weight decay applies to (the tensor table says which). */
static uint8_t *decay_mask_create(const Model *m) {
    uint8_t *mask = xcalloc(m->num_params, 1);
    for (int t = 0; t < m->n_tensors; t++) {
        const TensorInfo *ti = &m->tensors[t];
        if (ti->kind == TENSOR_PARAM && ti->decay) memset(mask + ti->offset, 1, ti->numel);
    }
    return mask;
}

Engine *engine_create_cpu(const EngineConfig *cfg) {
    const Model *m = cfg->model;
    const ModelConfig *mc = &m->cfg;
    Engine *e = xcalloc(1, sizeof *e);
    CpuEngine *c = xcalloc(1, sizeof *c);
    e->ops = &cpu_engine_ops;
    e->cfg = *cfg;
    e->impl = c;
    if (cfg->precision == PRECISION_BF16) /* device.c refused it where it cannot run */
        net_cpu_ops_pick_bf16(cfg->settings.cpu_isa);
    else
        net_cpu_ops_pick_conv(cfg->settings.cpu_isa, /* CIFAR_CPU_ISA's variant, else the best */
                              cfg->settings.cpu_conv_own);
    ops_set_threads(cfg->threads);
    size_t img = (size_t)mc->img_height * mc->img_width * mc->img_channels;
    c->params = xmalloc_aligned(m->num_params * sizeof(float));
    c->grads = xmalloc_aligned(m->num_params * sizeof(float));
    c->momentum = xmalloc_aligned(m->num_params * sizeof(float));
    c->buffers = xmalloc_aligned(m->num_buffers * sizeof(float));
    c->batch_x = xmalloc_aligned((size_t)cfg->max_batch * img * sizeof(float));
    if (cfg->precision == PRECISION_BF16)
        c->batch_x16 = xmalloc_aligned((size_t)cfg->max_batch * img * sizeof(float));
    c->batch_y = xmalloc_aligned((size_t)cfg->max_batch * sizeof(int32_t));
    c->logits = xmalloc_aligned((size_t)cfg->max_batch * m->fc_out * sizeof(float));
    /* No training split (cifar-eval): forward-only memory. */
    c->run = cfg->train.count > 0 ? model_run_create(m, cfg->max_batch)
                                  : model_run_create_inference(m, cfg->max_batch);
    c->decay_mask = decay_mask_create(m);
    if (cfg->precision == PRECISION_BF16)
        log_info_once("--precision bf16 on the CPU: activations and convolutions in bf16, fp32 accumulation (%s)",
                      cpu_bf16_backend());
    if (cfg->ema_decay > 0) {
        c->ema_params = xmalloc_aligned(m->num_params * sizeof(float));
        c->ema_buffers = xmalloc_aligned((m->num_buffers ? m->num_buffers : 1) * sizeof(float));
    }
    return e;
}
