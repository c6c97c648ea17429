/* engine_cuda.cu: the CUDA engine (engine.h), one GPU per process.
 *
 * What is GPU-specific and nothing else: device memory, the stream, data staging
 * and the CUDA graph. The network itself is walked by the same executor as on the
 * CPU (net.h) with the CUDA op table (net_cuda.cu); the augmentation is
 * bit-identical to the CPU's (augment_cuda.cu); the SGD rule is ops.h's.
 *
 * Device state: params, grads, momentum and BN buffers in flat device buffers at the
 * Model's offsets, except that conv weights (and their gradients and momentum) are
 * held in the CUDA table's layout (cuDNN's KRSC) so no step converts anything;
 * state_to_host / state_from_host convert through net_params_export / _import.
 * An engine with no training split (cifar-eval) plans inference only: no backward
 * conv algorithm is searched.
 *
 * Data (docs/DESIGN.md "Memory"): after the model, its activations and the conv workspace
 * are allocated, each split (the training split first) stays resident, copied to
 * the device once as uint8, when its pixels and labels take at most half of the
 * device memory then free (cudaMemGetInfo); otherwise it streams: every batch's
 * records are gathered on the host by the loader thread (loader_cuda.h) into a
 * pinned slot and copied into a fixed device staging buffer on the engine's
 * stream, and the same augmentation kernel reads them there in batch order, keyed
 * by the same sample indices, so both paths give the same batch bit for bit. The
 * epoch loop names batch i+1 (the prefetch op) before it runs batch i: the loader
 * gathers it while the GPU runs step i, and step i+1 only copies it. A batch not
 * prefetched, or other indices than those prefetched, is gathered when it is run.
 * CIFAR_CUDA_DATA=resident|stream forces either (stream:N: the loader hands over
 * N records at a time, for tests); one line at creation says which path each split
 * took and why, and one at the end how the streamed batches were gathered.
 * The staging copies are enqueued before the step's graph is launched (or its
 * kernels run), so the CUDA graph holds no copy and no host work: it reads the
 * staging buffer, a fixed pointer, as it reads a resident split.
 *
 * Per step: the sample indices, epoch, learning rate and first-step flag are copied
 * to device memory, then the step runs. From the second full-size batch on, the
 * whole step (augment, forward, backward, and the SGD update when there is a single
 * process) is one CUDA graph, captured once and replayed; every conv plan is
 * settled for the full batch before the capture (net_prepare), so nothing inside it
 * touches a descriptor. With several processes the gradient all-reduce runs between
 * the graph and the SGD kernel. Partial batches run eagerly. If the capture fails,
 * one line says why and the engine runs eagerly from then on; CIFAR_CUDA_GRAPH=0
 * disables the graph. CIFAR_CUDA_PHASES=1 (make bench-gpu) runs every step eagerly
 * with CUDA events between augment, forward, loss+backward and the update, and logs
 * the split of the GPU time when the engine is destroyed.
 *
 * --precision bf16 (ops_cuda.h, "bf16 activations"; compute capability 8.0 or newer,
 * else the run stops with the reason, exit status 2): the context's activations are
 * bfloat16; params, grads, momentum and BN buffers stay the fp32 flat buffers above.
 * Each step refreshes the bf16 shadow of the params (one kernel, before the forward)
 * and widens the conv weight gradients cuDNN wrote in bf16 into the fp32 grads (one
 * kernel, after the backward), both inside the captured graph; the all-reduce, the
 * SGD and the snapshots are those of fp32. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-cuda/cuda_check.h"
#include "backend-cuda/loader_cuda.h"
#include "backend-cuda/ops_cuda.h"
#include "model/engine.h"
#include "model/model.h"
#include "model/net.h"

/* The phases of a training step timed with CUDA events (CIFAR_CUDA_PHASES=1). */
enum { PHASE_AUGMENT, PHASE_FORWARD, PHASE_BACKWARD, PHASE_UPDATE, PHASE_COUNT };
static const char *const phase_names[PHASE_COUNT] = {"augment", "forward", "loss+backward",
                                                     "all-reduce+sgd"};

/* Per-step scalars read by the kernels at run time (so a graph can be replayed). */
typedef struct {
    int64_t epoch;
    float lr;
    int32_t first_step;
    float ema_decay; /* this step's (ema_decay_at) */
} StepArgs;

/* Where a split's batches are read by the augmentation: the whole split resident
 * on the device (gathered there by sample index), or the staging buffer the loader
 * filled with the batch's records in batch order (staged = 1). */
typedef struct {
    const uint8_t *px;
    const int32_t *lab;
    int staged;
} BatchSource;

/* The data rule: a split stays resident when it takes at most 1/RESIDENT_SHARE of
 * the device memory free after the model; the loader hands a streamed batch over
 * STREAM_CHUNK_BYTES at a time. */
#define RESIDENT_SHARE 2
#define STREAM_CHUNK_BYTES ((size_t)1 << 20)

typedef struct {
    CudaCtx *ctx;
    int tf32, bf16;
    Net *net;
    /* model state */
    float *params, *grads, *momentum, *buffers;
    float *stage;        /* num_params floats: layout conversion at state transfers */
    float *ema_params, *ema_buffers; /* ema_decay > 0 only: the moving average (ema.h) */
    uint8_t *decay_mask;
    /* dataset: resident splits (NULL when streamed), or the staging of a batch */
    uint8_t *train_px, *test_px;
    int32_t *train_lab, *test_lab;
    int train_streamed, test_streamed, loader_needed, stream_chunk;
    BatchSource train_src, test_src;
    BatchLoader *loader;
    /* batch staging, one device allocation */
    char *staging;
    float *batch_x;
    int32_t *batch_y, *pred;
    uint8_t *stage_px; /* a streamed batch's records (max_batch), when a split streams */
    int32_t *stage_lab;
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
    /* background snapshots (state_stage): params, momentum (PyTorch layout) and
     * buffers, on the device and in pinned host memory; made at the first use */
    float *snap_dev, *snap_host;
    cudaStream_t snap_stream;
    cudaEvent_t snap_exported, snap_copied;
    /* CUDA graph of the full-batch step */
    int graph_enabled, graph_fused_sgd, full_steps;
    long graph_replays; /* steps run by cudaGraphLaunch (engine_cuda_graph_replays) */
    cudaGraphExec_t graph;
    /* CIFAR_CUDA_PHASES=1: per-phase GPU time of the eager steps (no CUDA graph) */
    int phases;
    cudaEvent_t ev[PHASE_COUNT + 1];
    double phase_ms[PHASE_COUNT];
    int64_t phase_steps;
} GpuEngine;

/* ---------------------------------------------------------------- staging */

static size_t staging_carve(char *base, size_t *cursor, size_t bytes, void **out) {
    *out = base ? base + *cursor : NULL;
    *cursor += (bytes + 255) & ~(size_t)255;
    return *cursor;
}

/* Two passes: with no base it only counts. */
static size_t staging_layout(GpuEngine *g, const ModelConfig *mc, int max_batch) {
    size_t nb = (size_t)max_batch, at = 0;
    char *base = g->staging;
    staging_carve(base, &at, nb * mc->img_height * mc->img_width * mc->img_channels * sizeof(float),
                  (void **)&g->batch_x);
    staging_carve(base, &at, nb * sizeof(int32_t), (void **)&g->batch_y);
    staging_carve(base, &at, nb * sizeof(int32_t), (void **)&g->pred);
    staging_carve(base, &at, nb * sizeof(int64_t), (void **)&g->idx);
    if (g->loader_needed) {
        staging_carve(base, &at, nb * mc->img_height * mc->img_width * mc->img_channels,
                      (void **)&g->stage_px);
        staging_carve(base, &at, nb * sizeof(int32_t), (void **)&g->stage_lab);
    }
    staging_carve(base, &at, sizeof(StepArgs), (void **)&g->args);
    staging_carve(base, &at, sizeof(float), (void **)&g->loss);
    return staging_carve(base, &at, sizeof(int), (void **)&g->correct);
}

/* ---------------------------------------------------------------- steps */

static int comm_world(const Engine *e) { return e->cfg.comm ? comm_world_size(e->cfg.comm) : 1; }

/* The SGD update, then the moving average of the new state (inside the captured
 * graph when the update is). Element-wise, so the conv weights' table layout does
 * not matter: the average is converted with the params at transfers. */
static void sgd_step(Engine *e, GpuEngine *g) {
    net_sgd(g->net, g->params, g->grads, g->momentum, g->decay_mask, &g->args->lr, e->cfg.momentum,
            e->cfg.weight_decay, e->cfg.nesterov, &g->args->first_step);
    if (g->ema_params) {
        ema_update_cuda(g->ctx, e->cfg.model->num_params, g->ema_params, g->params, &g->args->ema_decay);
        ema_update_cuda(g->ctx, e->cfg.model->num_buffers, g->ema_buffers, g->buffers, &g->args->ema_decay);
    }
}

/* Everything of one training step that depends only on device memory: the batch
 * from g->idx, forward, loss, backward, and the SGD update when fused. */
/* Phase boundary i (0 .. PHASE_COUNT) of an eager step, when phases are timed. */
static void phase_mark(GpuEngine *g, int i) {
    if (!g->phases) return;
    CHECK_CUDA(cudaEventRecord(g->ev[i], (cudaStream_t)cuda_ctx_stream(g->ctx)));
}

/* After the step's synchronisation: add the phases' times. */
static void phase_collect(GpuEngine *g) {
    if (!g->phases) return;
    for (int i = 0; i < PHASE_COUNT; i++) {
        float ms = 0.0f;
        CHECK_CUDA(cudaEventElapsedTime(&ms, g->ev[i], g->ev[i + 1]));
        g->phase_ms[i] += ms;
    }
    g->phase_steps++;
}

static void phase_report(const GpuEngine *g) {
    if (!g->phases || !g->phase_steps) return;
    double total = 0.0;
    for (int i = 0; i < PHASE_COUNT; i++) total += g->phase_ms[i];
    char line[512];
    int at = snprintf(line, sizeof line, "cuda engine: GPU time per step over %lld eager steps: %.3f ms",
                      (long long)g->phase_steps, total / g->phase_steps);
    for (int i = 0; i < PHASE_COUNT && at < (int)sizeof line; i++)
        at += snprintf(line + at, sizeof line - at, ", %s %.1f%%", phase_names[i],
                       total > 0 ? 100.0 * g->phase_ms[i] / total : 0.0);
    log_info("%s", line);
}

static void train_body(Engine *e, GpuEngine *g, int n, int fuse_sgd) {
    AugmentSpec spec = engine_augment_spec(e, 0, 1);
    const BatchSource *src = &g->train_src;
    augment_batch_cuda(g->ctx, &spec, src->px, src->lab, g->idx, n, g->batch_x, g->batch_y,
                       &g->args->epoch, src->staged);
    phase_mark(g, PHASE_FORWARD);
    if (g->bf16) cuda_bf16_weights_refresh(g->ctx); /* after the previous step's SGD */
    net_forward(g->net, g->params, g->buffers, 1, g->batch_x, n);
    phase_mark(g, PHASE_BACKWARD);
    net_backward(g->net, g->params, g->batch_y, n, e->cfg.label_smoothing, g->grads, g->loss,
                 g->correct);
    if (g->bf16) cuda_bf16_grads_collect(g->ctx); /* before the all-reduce and the SGD */
    phase_mark(g, PHASE_UPDATE);
    if (fuse_sgd) sgd_step(e, g);
}

typedef struct {
    Engine *e;
    GpuEngine *g;
    int n, fuse_sgd;
} CaptureArgs;

static void capture_body(void *p) {
    CaptureArgs *a = (CaptureArgs *)p;
    train_body(a->e, a->g, a->n, a->fuse_sgd);
}

/* Kernel nodes of a graph, those of its child graphs included (cuDNN or cuBLAS may
 * capture their work as child graphs). */
static size_t graph_count_kernels(cudaGraph_t graph, size_t *nodes_out) {
    size_t count = 0, kernels = 0;
    CHECK_CUDA(cudaGraphGetNodes(graph, NULL, &count));
    cudaGraphNode_t *nodes = (cudaGraphNode_t *)xcalloc(count ? count : 1, sizeof *nodes);
    CHECK_CUDA(cudaGraphGetNodes(graph, nodes, &count));
    *nodes_out += count;
    for (size_t i = 0; i < count; i++) {
        cudaGraphNodeType type;
        CHECK_CUDA(cudaGraphNodeGetType(nodes[i], &type));
        if (type == cudaGraphNodeTypeKernel) {
            kernels++;
        } else if (type == cudaGraphNodeTypeGraph) {
            cudaGraph_t child = NULL;
            CHECK_CUDA(cudaGraphChildGraphNodeGetGraph(nodes[i], &child));
            kernels += graph_count_kernels(child, nodes_out);
        }
    }
    free(nodes);
    return kernels;
}

/* One line with the kernels of the captured step (make bench-gpu reads it). */
static void graph_report(cudaGraph_t graph) {
    size_t nodes = 0, kernels = graph_count_kernels(graph, &nodes);
    log_info("cuda engine: CUDA graph of one step: %zu kernels per step (%zu graph nodes)", kernels,
             nodes);
}

extern "C" long engine_cuda_graph_replays(const Engine *e) {
    return ((const GpuEngine *)e->impl)->graph_replays;
}

/* Capture the full-batch step into g->graph. On any failure (a CUDA, cuDNN or
 * cuBLAS call refused inside the capture, end or instantiation failing) the
 * capture is ended, one line says why, and the engine runs eagerly from then on.
 * Returns 1 when a graph is ready. */
static int graph_capture(Engine *e, GpuEngine *g, int n, int fuse_sgd) {
    cudaStream_t s = (cudaStream_t)cuda_ctx_stream(g->ctx);
    cudaGraph_t graph = NULL;
    char why[512] = "";
    CaptureArgs args = {e, g, n, fuse_sgd};
    net_prepare(g->net, n); /* no descriptor reset or workspace query inside the capture */
    cuda_ctx_sync(g->ctx);
    cudaError_t rc = cudaStreamBeginCapture(s, cudaStreamCaptureModeThreadLocal);
    if (rc != cudaSuccess) {
        snprintf(why, sizeof why, "cudaStreamBeginCapture: %s", cudaGetErrorString(rc));
    } else {
        int failed = cuda_guard_run(capture_body, &args, why, sizeof why);
        rc = cudaStreamEndCapture(s, &graph); /* always: it ends a broken capture too */
        if (!failed && rc != cudaSuccess)
            snprintf(why, sizeof why, "cudaStreamEndCapture: %s", cudaGetErrorString(rc));
        if (!why[0]) graph_report(graph);
        if (!why[0]) {
            rc = cudaGraphInstantiate(&g->graph, graph, 0);
            if (rc != cudaSuccess) {
                g->graph = NULL;
                snprintf(why, sizeof why, "cudaGraphInstantiate: %s", cudaGetErrorString(rc));
            }
        }
        if (graph) CHECK_CUDA(cudaGraphDestroy(graph));
    }
    if (why[0]) {
        (void)cudaGetLastError(); /* capture errors are not sticky: clear them */
        log_warn("cuda engine: CUDA graph capture failed (%s); running every step eagerly", why);
        g->graph_enabled = 0;
        return 0;
    }
    g->graph_fused_sgd = fuse_sgd;
    return 1;
}

/* Mean of the gradients over the processes. NCCL: on device memory, enqueued on
 * the engine's own stream after the backward (comm_allreduce_mean_on_stream returns
 * once it is done, under the collective timeout). The stream is drained first: the
 * communicator times its collectives on the host and counts them as entered
 * (comm.h, the stragglers and the progress board), so this rank's own forward and
 * backward must be over when it enters, else its GPU time would count as time in
 * the all-reduce on every rank alike and a slow GPU would never be named. The cost
 * is the NCCL launch after the drain, a few microseconds per step; the host already
 * waits for the all-reduce before it enqueues the SGD. Other communicators work on
 * host memory (the download waits for the backward too). */
static void grads_allreduce(Engine *e, GpuEngine *g) {
    Comm *c = e->cfg.comm;
    size_t np = e->cfg.model->num_params;
    if (comm_kind(c) == COMM_NCCL) {
        cuda_ctx_sync(g->ctx);
        comm_allreduce_mean_on_stream(c, g->grads, np, cuda_ctx_stream(g->ctx));
    } else {
        cuda_download(g->ctx, g->h_scratch, g->grads, np * sizeof(float));
        comm_allreduce_mean(c, g->h_scratch, np);
        cuda_upload(g->ctx, g->grads, g->h_scratch, np * sizeof(float));
    }
}

/* The kernels read the split at these indices unchecked: check them here (n <= the
 * batch size, a negligible cost) so a bad sampler is an error, not a wild read. */
static void idx_check(const int64_t *idx, int n, int64_t count, const char *split) {
    for (int i = 0; i < n; i++)
        if (idx[i] < 0 || idx[i] >= count)
            die("cuda engine: sample index %lld is outside the %s split of %lld records (internal error)",
                (long long)idx[i], split, (long long)count);
}

/* A streamed split: the batch's records into the staging buffer, enqueued on the
 * stream before anything that reads them (never inside a graph capture). */
static void batch_stage(GpuEngine *g, const BatchSource *src, const HostSplit *split,
                        const int64_t *idx, int n) {
    if (!src->staged) return;
    batch_loader_stage(g->loader, split, idx, n, g->stage_px, g->stage_lab,
                       (cudaStream_t)cuda_ctx_stream(g->ctx));
}

/* engine.h's prefetch: a streamed split's next batch, gathered by the loader while
 * the GPU runs the current step; nothing for a resident split. */
static void cuda_prefetch(Engine *e, const int64_t *idx, int n, int train) {
    GpuEngine *g = (GpuEngine *)e->impl;
    const HostSplit *split = train ? &e->cfg.train : &e->cfg.test;
    if (!(train ? g->train_streamed : g->test_streamed)) return;
    if (n < 1 || n > e->cfg.max_batch)
        die("cuda engine: prefetch of %d images, but the engine was created for at most %d", n,
            e->cfg.max_batch);
    idx_check(idx, n, split->count, train ? "training" : "test");
    batch_loader_prefetch(g->loader, split, idx, n);
}

static float cuda_train_step(Engine *e, const int64_t *idx, int n, int64_t epoch, int64_t step,
                             float lr, int *correct) {
    GpuEngine *g = (GpuEngine *)e->impl;
    cudaStream_t s = (cudaStream_t)cuda_ctx_stream(g->ctx);
    if (n < 1 || n > e->cfg.max_batch)
        die("cuda engine: batch of %d images, but the engine was created for at most %d", n,
            e->cfg.max_batch);
    if (e->cfg.train.count == 0) die("cuda engine: a training step on an engine without a training split");
    idx_check(idx, n, e->cfg.train.count, "training");
    memcpy(g->h_idx, idx, (size_t)n * sizeof(int64_t));
    g->h_args->epoch = epoch;
    g->h_args->lr = lr;
    g->h_args->first_step = step == 0;
    g->h_args->ema_decay = engine_ema_decay(e, step);
    CHECK_CUDA(cudaMemcpyAsync(g->idx, g->h_idx, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    CHECK_CUDA(cudaMemcpyAsync(g->args, g->h_args, sizeof(StepArgs), cudaMemcpyHostToDevice, s));
    batch_stage(g, &g->train_src, &e->cfg.train, idx, n);
    int world = comm_world(e);
    int fuse_sgd = world == 1;
    const int full = n == e->cfg.max_batch;
    if (full && g->graph_enabled) {
        /* The first full step runs eagerly (lazy kernel loading, cuDNN and cuBLAS
         * set-up happen outside the capture); the second is captured. */
        if (!g->graph && g->full_steps >= 1) graph_capture(e, g, n, fuse_sgd);
        g->full_steps++;
    }
    /* The graph holds a full batch: a partial one (the epoch's last) runs eagerly
     * (replaying it would train on max_batch samples, the tail of idx stale). */
    const int replay = g->graph && full;
    if (replay) {
        CHECK_CUDA(cudaGraphLaunch(g->graph, s));
        g->graph_replays++;
        fuse_sgd = g->graph_fused_sgd;
    } else {
        phase_mark(g, PHASE_AUGMENT);
        train_body(e, g, n, fuse_sgd);
    }
    if (!fuse_sgd) {
        if (world > 1) grads_allreduce(e, g);
        sgd_step(e, g);
    }
    if (!replay) phase_mark(g, PHASE_COUNT);
    CHECK_CUDA(cudaMemcpyAsync(g->h_loss, g->loss, sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaMemcpyAsync(g->h_correct, g->correct, sizeof(int), cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    if (!replay) phase_collect(g);
    if (correct) *correct = *g->h_correct;
    return *g->h_loss;
}

static void cuda_eval_batch(Engine *e, const int64_t *idx, int n, double *loss_sum, int64_t *correct,
                            int32_t *predictions, float *logits) {
    GpuEngine *g = (GpuEngine *)e->impl;
    const Model *m = e->cfg.model;
    cudaStream_t s = (cudaStream_t)cuda_ctx_stream(g->ctx);
    if (n < 1 || n > e->cfg.max_batch)
        die("cuda engine: eval batch of %d images, but the engine was created for at most %d", n,
            e->cfg.max_batch);
    idx_check(idx, n, e->cfg.test.count, "test");
    memcpy(g->h_idx, idx, (size_t)n * sizeof(int64_t));
    CHECK_CUDA(cudaMemcpyAsync(g->idx, g->h_idx, (size_t)n * sizeof(int64_t), cudaMemcpyHostToDevice, s));
    batch_stage(g, &g->test_src, &e->cfg.test, idx, n);
    AugmentSpec spec = engine_augment_spec(e, 0, 0);
    augment_batch_cuda(g->ctx, &spec, g->test_src.px, g->test_src.lab, g->idx, n, g->batch_x,
                       g->batch_y, NULL, g->test_src.staged);
    if (g->bf16) cuda_bf16_weights_refresh(g->ctx);
    net_forward(g->net, g->params, g->buffers, 0, g->batch_x, n);
    softmax_xent_cuda_async(g->ctx, n, m->fc_out, net_logits(g->net), g->batch_y, 0.0f, NULL, g->loss,
                            g->correct, predictions ? g->pred : NULL);
    CHECK_CUDA(cudaMemcpyAsync(g->h_loss, g->loss, sizeof(float), cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaMemcpyAsync(g->h_correct, g->correct, sizeof(int), cudaMemcpyDeviceToHost, s));
    if (predictions)
        CHECK_CUDA(cudaMemcpyAsync(predictions, g->pred, (size_t)n * sizeof(int32_t),
                                   cudaMemcpyDeviceToHost, s));
    if (logits)
        CHECK_CUDA(cudaMemcpyAsync(logits, net_logits(g->net), (size_t)n * m->fc_out * sizeof(float),
                                   cudaMemcpyDeviceToHost, s));
    CHECK_CUDA(cudaStreamSynchronize(s));
    *loss_sum += (double)*g->h_loss * n;
    *correct += *g->h_correct;
}

/* ---------------------------------------------------------------- state */

/* Device flat buffer (table layout) -> host flat buffer (PyTorch layout). */
static void flat_to_host(Engine *e, GpuEngine *g, const float *dev, float *host) {
    net_params_export(g->net, dev, g->stage);
    cuda_download(g->ctx, host, g->stage, e->cfg.model->num_params * sizeof(float));
}

static void flat_from_host(Engine *e, GpuEngine *g, const float *host, float *dev) {
    cuda_upload(g->ctx, g->stage, host, e->cfg.model->num_params * sizeof(float));
    net_params_import(g->net, g->stage, dev);
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

static void *host_pinned(size_t bytes);

/* The snapshot staging: params, momentum and buffers, one after the other. */
static size_t snap_floats(const Model *m) { return 2 * m->num_params + m->num_buffers; }

static void snap_stage_create(const Engine *e, GpuEngine *g) {
    size_t bytes = snap_floats(e->cfg.model) * sizeof(float);
    g->snap_dev = (float *)cuda_alloc(bytes);
    g->snap_host = (float *)host_pinned(bytes);
    CHECK_CUDA(cudaStreamCreateWithFlags(&g->snap_stream, cudaStreamNonBlocking));
    CHECK_CUDA(cudaEventCreateWithFlags(&g->snap_exported, cudaEventDisableTiming));
    /* the writer thread sleeps in cudaEventSynchronize instead of busy-waiting on a
     * core the training and loader threads need (cudaEventBlockingSync) */
    CHECK_CUDA(cudaEventCreateWithFlags(&g->snap_copied, cudaEventBlockingSync | cudaEventDisableTiming));
}

/* On the engine's stream, after the step: the state into the snapshot's own device
 * buffer (the next steps may change params while it is copied out); on the side
 * stream, once that is done: the device-to-host copy, overlapping the next steps. */
static void cuda_state_stage(Engine *e) {
    GpuEngine *g = (GpuEngine *)e->impl;
    const Model *m = e->cfg.model;
    if (!g->snap_dev) snap_stage_create(e, g);
    cudaStream_t s = (cudaStream_t)cuda_ctx_stream(g->ctx);
    net_params_export(g->net, g->params, g->snap_dev);
    net_params_export(g->net, g->momentum, g->snap_dev + m->num_params);
    cuda_copy_d2d_async(g->ctx, g->snap_dev + 2 * m->num_params, g->buffers,
                        m->num_buffers * sizeof(float));
    CHECK_CUDA(cudaEventRecord(g->snap_exported, s));
    CHECK_CUDA(cudaStreamWaitEvent(g->snap_stream, g->snap_exported, 0));
    CHECK_CUDA(cudaMemcpyAsync(g->snap_host, g->snap_dev, snap_floats(m) * sizeof(float),
                               cudaMemcpyDeviceToHost, g->snap_stream));
    CHECK_CUDA(cudaEventRecord(g->snap_copied, g->snap_stream));
}

/* Called by the snapshot writer's thread: the device is per thread. */
static void cuda_state_staged(Engine *e, const float **params, const float **buffers,
                              const float **momentum) {
    GpuEngine *g = (GpuEngine *)e->impl;
    size_t np = e->cfg.model->num_params;
    if (!g->snap_dev) die("cuda engine: state_staged before any state_stage (internal error)");
    CHECK_CUDA(cudaSetDevice(e->cfg.device));
    CHECK_CUDA(cudaEventSynchronize(g->snap_copied));
    *params = g->snap_host;
    *momentum = g->snap_host + np;
    *buffers = g->snap_host + 2 * np;
}

static void snap_stage_free(GpuEngine *g) {
    if (!g->snap_dev) return;
    CHECK_CUDA(cudaStreamSynchronize(g->snap_stream));
    CHECK_CUDA(cudaEventDestroy(g->snap_exported));
    CHECK_CUDA(cudaEventDestroy(g->snap_copied));
    CHECK_CUDA(cudaStreamDestroy(g->snap_stream));
    cuda_free(g->snap_dev);
    CHECK_CUDA(cudaFreeHost(g->snap_host));
}

static void cuda_ema_to_host(Engine *e, float *params, float *buffers) {
    GpuEngine *g = (GpuEngine *)e->impl;
    if (!g->ema_params) die("cuda engine: no moving average (ema_decay is 0)");
    flat_to_host(e, g, g->ema_params, params);
    cuda_download(g->ctx, buffers, g->ema_buffers, e->cfg.model->num_buffers * sizeof(float));
}

static void cuda_ema_from_host(Engine *e, const float *params, const float *buffers) {
    GpuEngine *g = (GpuEngine *)e->impl;
    if (!g->ema_params) die("cuda engine: no moving average (ema_decay is 0)");
    flat_from_host(e, g, params, g->ema_params);
    cuda_upload(g->ctx, g->ema_buffers, buffers, e->cfg.model->num_buffers * sizeof(float));
    cuda_ctx_sync(g->ctx);
}

static void cuda_broadcast_buffers(Engine *e, int root) {
    GpuEngine *g = (GpuEngine *)e->impl;
    Comm *c = e->cfg.comm;
    size_t bytes = e->cfg.model->num_buffers * sizeof(float);
    if (!c || comm_world_size(c) == 1) return;
    if (comm_kind(c) == COMM_NCCL) { /* on the engine's stream, after the steps queued there */
        comm_broadcast_on_stream(c, g->buffers, bytes, root, cuda_ctx_stream(g->ctx));
    } else {
        cuda_download(g->ctx, g->h_scratch, g->buffers, bytes);
        comm_broadcast(c, g->h_scratch, bytes, root);
        cuda_upload(g->ctx, g->buffers, g->h_scratch, bytes);
    }
}

/* One line: how the streamed batches were gathered (the GPU script reads it). */
static void loader_report(const GpuEngine *g) {
    if (!g->loader) return;
    BatchLoaderStats st = batch_loader_stats(g->loader);
    log_info("cuda engine: streamed batches: %lld gathered ahead, %lld still being gathered when run, "
             "%lld gathered on demand",
             (long long)st.ready, (long long)st.late, (long long)st.demand);
}

static void cuda_destroy(Engine *e) {
    GpuEngine *g = (GpuEngine *)e->impl;
    cuda_ctx_sync(g->ctx);
    loader_report(g);
    batch_loader_destroy(g->loader); /* joins the loader thread, frees the pinned buffers */
    phase_report(g);
    if (g->phases)
        for (int i = 0; i <= PHASE_COUNT; i++) CHECK_CUDA(cudaEventDestroy(g->ev[i]));
    if (g->graph) CHECK_CUDA(cudaGraphExecDestroy(g->graph));
    net_free(g->net);
    cuda_free(g->staging);
    cuda_free(g->params);
    cuda_free(g->grads);
    cuda_free(g->momentum);
    cuda_free(g->buffers);
    cuda_free(g->stage);
    cuda_free(g->ema_params);
    cuda_free(g->ema_buffers);
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
    snap_stage_free(g);
    cuda_ctx_free(g->ctx);
    free(g);
    free(e);
}

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

/* Device bytes of a resident split: its uint8 pixels and int32 labels. */
static size_t split_device_bytes(const HostSplit *s, size_t rec_bytes) {
    return (size_t)s->count * (rec_bytes + sizeof(int32_t));
}

static double mib(size_t bytes) { return (double)bytes / (1 << 20); }

/* sep + "train 703.1 MiB resident" (or "streamed"); nothing for an empty split. */
static int split_plan_text(char *out, size_t len, const char *sep, const char *name, const HostSplit *s,
                           size_t bytes, int streamed) {
    if (s->count == 0) return 0;
    return snprintf(out, len, "%s%s %.1f MiB %s", sep, name, mib(bytes), streamed ? "streamed" : "resident");
}

/* The data rule (see the top of this file), decided once the model, its arena and
 * workspace are allocated; says in one line which path each split took and why. */
static void data_plan(GpuEngine *g, const EngineConfig *cfg, size_t rec_bytes) {
    const Settings *st = &cfg->settings;
    SettingsDataMode mode = st->cuda_data;
    int chunk = st->cuda_data_chunk;
    size_t free_b = 0, total_b = 0;
    CHECK_CUDA(cudaMemGetInfo(&free_b, &total_b));
    size_t train_b = split_device_bytes(&cfg->train, rec_bytes);
    size_t test_b = split_device_bytes(&cfg->test, rec_bytes);
    size_t left = free_b;
    if (mode == SETTINGS_DATA_AUTO) {
        g->train_streamed = cfg->train.count > 0 && train_b > left / RESIDENT_SHARE;
        if (!g->train_streamed) left -= train_b < left ? train_b : left;
        g->test_streamed = cfg->test.count > 0 && test_b > left / RESIDENT_SHARE;
    } else {
        g->train_streamed = mode == SETTINGS_DATA_STREAM && cfg->train.count > 0;
        g->test_streamed = mode == SETTINGS_DATA_STREAM && cfg->test.count > 0;
    }
    g->loader_needed = g->train_streamed || g->test_streamed;
    g->stream_chunk = chunk ? (chunk < cfg->max_batch ? chunk : cfg->max_batch)
                            : batch_loader_chunk_records(rec_bytes, STREAM_CHUNK_BYTES, cfg->max_batch);
    char splits[160] = "";
    int at = split_plan_text(splits, sizeof splits, "", "train", &cfg->train, train_b, g->train_streamed);
    split_plan_text(splits + at, sizeof splits - at, at ? ", " : "", "test", &cfg->test, test_b,
                    g->test_streamed);
    char why[200];
    if (mode == SETTINGS_DATA_AUTO)
        snprintf(why, sizeof why, "a split stays on the device when it takes at most 1/%d of the free "
                 "memory: %.1f of %.1f MiB free after the model", RESIDENT_SHARE, mib(free_b), mib(total_b));
    else
        snprintf(why, sizeof why, "forced by CIFAR_CUDA_DATA=%s", st->cuda_data_text);
    char pinned[96] = "";
    if (g->loader_needed)
        snprintf(pinned, sizeof pinned, "; streamed batches through 2 pinned batch slots, %d records at a time",
                 g->stream_chunk);
    log_info("cuda engine: data: %s (%s)%s", splits[0] ? splits : "no split", why, pinned);
}

/* Where the augmentation reads each split's batches, once the plan is carried out. */
static void data_sources(GpuEngine *g) {
    g->train_src = g->train_streamed ? BatchSource{g->stage_px, g->stage_lab, 1}
                                     : BatchSource{g->train_px, g->train_lab, 0};
    g->test_src = g->test_streamed ? BatchSource{g->stage_px, g->stage_lab, 1}
                                   : BatchSource{g->test_px, g->test_lab, 0};
}

/* Which params a mask selects. */
static int param_decays(const TensorInfo *ti) { return ti->decay; }
/* A device byte per param: 1 where pick(its tensor). */
static uint8_t *param_mask_upload(GpuEngine *g, const Model *m, int (*pick)(const TensorInfo *)) {
    uint8_t *mask = (uint8_t *)xcalloc(m->num_params, 1);
    for (int t = 0; t < m->n_tensors; t++) {
        const TensorInfo *ti = &m->tensors[t];
        if (ti->kind == TENSOR_PARAM && pick(ti)) memset(mask + ti->offset, 1, ti->numel);
    }
    uint8_t *dev = (uint8_t *)cuda_alloc(m->num_params);
    cuda_upload(g->ctx, dev, mask, m->num_params);
    free(mask);
    return dev;
}

/* bf16: the conv weights' shadows, laid out by bf16_layout.h. */
static void bf16_shadows_init(GpuEngine *g, const Model *m) {
    int n = bf16_layout_segments(m, NULL);
    Bf16Segment *seg = (Bf16Segment *)xcalloc(n ? (size_t)n : 1, sizeof *seg);
    bf16_layout_segments(m, seg);
    cuda_bf16_shadow_init(g->ctx, g->params, g->grads, m->num_params, seg, n);
    free(seg);
}

static void *host_pinned(size_t bytes) {
    void *p = NULL;
    CHECK_CUDA(cudaMallocHost(&p, bytes));
    memset(p, 0, bytes);
    return p;
}

/* NCCL refuses two ranks on one GPU ("Duplicate GPU detected", ncclInvalidUsage)
 * after every rank has started: with more processes on this node than GPUs, say so
 * before anything is allocated. Returns 1 with the reason in err. */
static int gpus_too_few(int count, char *err, size_t errlen) {
    DistEnv env;
    char why[256] = "";
    if (dist_env_read(&env, why, sizeof why) != 0 || env.world_size <= 1) return 0;
    if (env.local_world_size <= count) return 0;
    snprintf(err, errlen,
             "%d processes on this node but only %d GPU%s visible: NCCL cannot put two ranks on one "
             "GPU (it stops with \"Duplicate GPU detected\"); use --nproc-per-node %d or fewer, or "
             "make more GPUs visible (CUDA_VISIBLE_DEVICES)",
             env.local_world_size, count, count == 1 ? "" : "s", count);
    return 1;
}

/* bfloat16 convolutions (cuDNN's PSEUDO_BFLOAT16 configuration on bf16 tensor
 * cores) need compute capability 8.0 (Ampere) or newer. Below it the run stops here
 * with the reason and exit status 2, as for a bad option: no device of this machine
 * would do better, and the CPU computes fp32 only (device.c refuses bf16 there too). */
static void bf16_check_device(int device) {
    int cc = ops_cuda_compute_capability(device);
    if (cc < 80)
        die_usage("--precision bf16 needs a GPU of compute capability 8.0 or newer (bfloat16 tensor "
                  "cores); device %d is %d.%d ---> HINT: use --precision fp32 or tf32",
                  device, cc / 10, cc % 10);
}

static const EngineOps cuda_engine_ops = {
    "cuda",
    cuda_train_step,
    cuda_eval_batch,
    cuda_prefetch,
    cuda_state_to_host,
    cuda_state_from_host,
    cuda_ema_to_host,
    cuda_ema_from_host,
    cuda_broadcast_buffers,
    cuda_destroy,
    cuda_state_stage,
    cuda_state_staged,
};

extern "C" Engine *engine_create_cuda(const EngineConfig *cfg, char *err, size_t errlen) {
    const Model *m = cfg->model;
    const ModelConfig *mc = &m->cfg;
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
    if (gpus_too_few(count, err, errlen)) return NULL;
    if (cfg->precision == PRECISION_BF16) bf16_check_device(cfg->device);
    split_check_labels(&cfg->train, "train", m->fc_out);
    split_check_labels(&cfg->test, "test", m->fc_out);

    Engine *e = (Engine *)xcalloc(1, sizeof *e);
    GpuEngine *g = (GpuEngine *)xcalloc(1, sizeof *g);
    e->ops = &cuda_engine_ops;
    e->cfg = *cfg;
    e->impl = g;
    g->tf32 = cfg->precision == PRECISION_TF32;
    g->bf16 = cfg->precision == PRECISION_BF16;
    g->ctx = cuda_ctx_create(cfg->device, g->tf32, cfg->deterministic, cfg->settings.cuda_bn_coop);
    if (g->bf16) cuda_ctx_use_bf16(g->ctx); /* before the conv plans */
    g->graph_enabled = cfg->settings.cuda_graph;
    g->phases = cfg->settings.cuda_phases;
    if (g->phases) { /* a replayed graph cannot be split into phases: eager steps only */
        g->graph_enabled = 0;
        for (int i = 0; i <= PHASE_COUNT; i++) CHECK_CUDA(cudaEventCreate(&g->ev[i]));
    }

    size_t np = m->num_params, nbuf = m->num_buffers;
    g->params = (float *)cuda_alloc(np * sizeof(float));
    g->grads = (float *)cuda_alloc(np * sizeof(float));
    g->momentum = (float *)cuda_alloc(np * sizeof(float));
    g->stage = (float *)cuda_alloc(np * sizeof(float));
    g->buffers = (float *)cuda_alloc((nbuf ? nbuf : 1) * sizeof(float));
    cuda_memset_async(g->ctx, g->grads, 0, np * sizeof(float));
    cuda_memset_async(g->ctx, g->momentum, 0, np * sizeof(float));
    if (cfg->ema_decay > 0) {
        g->ema_params = (float *)cuda_alloc(np * sizeof(float));
        g->ema_buffers = (float *)cuda_alloc((nbuf ? nbuf : 1) * sizeof(float));
    }
    g->decay_mask = param_mask_upload(g, m, param_decays);
    if (g->bf16) bf16_shadows_init(g, m);

    /* cifar-eval (no training split) plans inference only. */
    g->net = net_create(m, net_cuda_ops(), g->ctx, cfg->max_batch, cfg->train.count > 0);
    size_t rec = (size_t)mc->img_height * mc->img_width * mc->img_channels;
    data_plan(g, cfg, rec); /* after the model's memory: the rule weighs what is left */

    g->staging = NULL;
    g->staging = (char *)cuda_alloc(staging_layout(g, mc, cfg->max_batch)); /* count */
    staging_layout(g, mc, cfg->max_batch);                                  /* place */
    if (!g->train_streamed) split_upload(g, &cfg->train, rec, &g->train_px, &g->train_lab);
    if (!g->test_streamed) split_upload(g, &cfg->test, rec, &g->test_px, &g->test_lab);
    if (g->loader_needed) g->loader = batch_loader_create(rec, cfg->max_batch, g->stream_chunk);
    data_sources(g);

    g->h_idx = (int64_t *)host_pinned((size_t)cfg->max_batch * sizeof(int64_t));
    g->h_args = (StepArgs *)host_pinned(sizeof(StepArgs));
    g->h_loss = (float *)host_pinned(sizeof(float));
    g->h_correct = (int *)host_pinned(sizeof(int));
    g->h_scratch = (float *)xmalloc((np > nbuf ? np : nbuf) * sizeof(float));
    cuda_ctx_sync(g->ctx);

    struct cudaDeviceProp prop;
    CHECK_CUDA(cudaGetDeviceProperties(&prop, cfg->device));
    log_info("cuda engine: device %d (%s), %s%s, activations %.1f MiB, conv workspace %.1f MiB%s",
             cfg->device, prop.name, g->bf16 ? "bf16 activations, fp32 weights" : g->tf32 ? "tf32" : "fp32",
             cfg->deterministic ? ", deterministic" : "", (double)net_arena_bytes(g->net) / (1 << 20),
             (double)net_workspace_bytes(g->net) / (1 << 20), g->graph_enabled ? ", CUDA graph" : "");
    return e;
}
