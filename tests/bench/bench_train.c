/* bench_train: CPU training throughput of the seed model, with a per-op breakdown.
 *
 *   bench_train [--batch 256] [--threads 2] [--steps 20] [--precision fp32|bf16]
 *
 * Times whole steps (augmented batch -> forward -> backward -> SGD) on random
 * uint8 data already in memory, as tests/bench/torch_anchor.py does for
 * PyTorch, then times every op of the network alone at its real shape so the
 * output says where a step's time goes. Prints one JSON line for the step rate
 * ("impl":"cifar-train-cpu") and a table of ops on stderr. On a machine shared with
 * other work the mean step ("images_per_s") swings with their load; the median and
 * the fastest step ("images_per_s_median", "images_per_s_peak") show what the step
 * costs when this program has the cores. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/augment.h"
#include "core/check.h"
#include "model/model.h"
#include "core/omp_env.h"
#include "backend-cpu/ops_cpu.h"
#include "backend-cpu/cpu_bf16.h"
#include "core/progress.h"
#include "core/rng.h"

typedef struct {
    const char *name;
    double ms;
    int calls;
} OpTime;

enum { OP_CONV_F, OP_CONV_B, OP_BN_F, OP_BN_B, OP_RELU, OP_POOL_LINEAR_XENT, OP_SGD, OP_AUGMENT, OP_COUNT };
static OpTime g_ops[OP_COUNT] = {
    {"conv2d_forward", 0, 0},    {"conv2d_backward", 0, 0}, {"batchnorm2d_forward", 0, 0},
    {"batchnorm2d_backward", 0, 0}, {"relu/add (fwd+bwd)", 0, 0}, {"pool+linear+xent", 0, 0},
    {"sgd_update", 0, 0},        {"augment_batch", 0, 0},
};

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static int g_bf16; /* --precision bf16 */

/* n floats in [-1, 1); with --precision bf16, 2n bf16 values in [-1, 1) in their
 * place, so that an activation buffer holds valid bf16 wherever an op reads it (read
 * as floats, every value is near the bf16 of its upper half: valid parameters too;
 * the bytes are written through cpu_bf16_pack's uint16_t stores and read as floats
 * by the ops in other translation units, a benchmark's input only). */
static float *random_floats(size_t n, uint64_t seed) {
    size_t count = g_bf16 ? 2 * n : n;
    float *v = xmalloc_aligned(count * sizeof(float));
    for (size_t i = 0; i < count; i++) v[i] = rng_uniform(seed, 9, i) * 2.0f - 1.0f;
    if (!g_bf16) return v;
    float *p = xmalloc_aligned(n * sizeof(float));
    cpu_bf16_pack(count, v, p);
    free(v);
    return p;
}

/* The fastest of TIME_REPS runs (after one warm-up): other work on the machine only
 * ever slows a run down. */
#define TIME_REPS 5
#define TIMED(slot, stmt)                                              \
    do {                                                               \
        stmt;                                                          \
        double best_ = 1e30;                                           \
        for (int r_ = 0; r_ < TIME_REPS; r_++) {                       \
            double t0_ = now_seconds();                                \
            stmt;                                                      \
            double dt_ = now_seconds() - t0_;                          \
            if (dt_ < best_) best_ = dt_;                              \
        }                                                              \
        g_ops[slot].ms += best_ * 1e3;                                 \
        g_ops[slot].calls++;                                           \
    } while (0)

static void time_conv(const ConvLayer *l, int n, int h, int w) {
    const ConvSpec *cs = &l->spec;
    int oh = conv_out_size(h, cs->k, cs->stride, cs->pad), ow = conv_out_size(w, cs->k, cs->stride, cs->pad);
    size_t xin = (size_t)n * h * w * cs->cin, yout = (size_t)n * oh * ow * cs->cout;
    size_t wn = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    float *x = random_floats(xin, 1), *y = random_floats(yout, 2), *wt = random_floats(wn, 3);
    float *b = random_floats(cs->cout, 4), *dx = random_floats(xin, 5), *dw = random_floats(wn, 6);
    float *db = random_floats(cs->cout, 7);
    const NetOps *t = net_cpu_ops();
    void *plan = t->conv_plan(NULL, cs, n, h, w, 1, 1);
    size_t ws_bytes = t->conv_workspace_bytes(NULL, plan);
    float *ws = xmalloc_aligned(ws_bytes + 64);
    TIMED(OP_CONV_F, t->conv_forward(NULL, plan, n, x, wt, b, y, ws, ws_bytes));
    TIMED(OP_CONV_B, t->conv_backward(NULL, plan, n, x, wt, y, dx, dw, db, ws, ws_bytes));
    t->conv_plan_free(NULL, plan);
    free(x); free(y); free(wt); free(b); free(dx); free(dw); free(db); free(ws);
}

static void time_bn(int rows, int c, int relu) {
    size_t n = (size_t)rows * c;
    float *x = random_floats(n, 1), *y = random_floats(n, 2), *g = random_floats(c, 3);
    float *be = random_floats(c, 4), *sm = random_floats(c, 5), *si = random_floats(c, 6);
    float *rm = random_floats(c, 7), *rv = random_floats(c, 8), *dx = random_floats(n, 9);
    for (int i = 0; i < c; i++) rv[i] = 1.0f;
    const NetOps *t = net_cpu_ops();
    TIMED(OP_BN_F, t->bn_train(NULL, rows, 1, c, x, g, be, y, sm, si, rm, rv, 0.1f, 1e-5f));
    TIMED(OP_BN_B, t->bn_backward(NULL, rows, 1, c, x, g, sm, si, y, dx, g, be));
    if (relu) TIMED(OP_RELU, (t->relu_forward(NULL, n, x, y), t->relu_backward(NULL, n, y, x, dx)));
    free(x); free(y); free(g); free(be); free(sm); free(si); free(rm); free(rv); free(dx);
}

static void time_block(const Block *b, int n) {
    time_conv(&b->conv1, n, b->in_h, b->in_w);
    int h2 = b->bottleneck ? b->in_h : b->out_h, w2 = b->bottleneck ? b->in_w : b->out_w;
    if (b->bottleneck) {
        time_bn(n * b->in_h * b->in_w, b->cmid, 1);
        time_conv(&b->conv2, n, h2, w2);
        time_bn(n * b->out_h * b->out_w, b->cmid, 1);
        time_conv(&b->conv3, n, b->out_h, b->out_w);
    } else {
        time_bn(n * b->out_h * b->out_w, b->cmid, 1);
        time_conv(&b->conv2, n, b->out_h, b->out_w);
    }
    time_bn(n * b->out_h * b->out_w, b->cout, 1);
    if (b->has_projection) {
        time_conv(&b->proj_conv, n, b->in_h, b->in_w);
        time_bn(n * b->out_h * b->out_w, b->cout, 0);
    }
}

static void time_head(const Model *m, int n) {
    int hw = m->blocks[m->n_blocks - 1].out_h * m->blocks[m->n_blocks - 1].out_w, c = m->fc_in, k = m->fc_out;
    float *x = random_floats((size_t)n * hw * c, 1), *p = random_floats((size_t)n * c, 2);
    float *w = random_floats((size_t)k * c, 3), *b = random_floats(k, 4), *lg = random_floats((size_t)n * k, 5);
    float *dl = random_floats((size_t)n * k, 6), *dp = random_floats((size_t)n * c, 7);
    int32_t *lab = xmalloc((size_t)n * sizeof(int32_t));
    for (int i = 0; i < n; i++) lab[i] = i % k;
    const NetOps *t = net_cpu_ops();
    float loss;
    TIMED(OP_POOL_LINEAR_XENT, (t->meanpool_forward(NULL, n, hw, c, x, p),
                                t->linear_forward(NULL, n, c, k, p, w, b, lg),
                                t->xent(NULL, n, k, lg, lab, 0.0f, dl, &loss, NULL),
                                t->linear_backward(NULL, n, c, k, p, w, dl, dp, w, b),
                                t->meanpool_backward(NULL, n, hw, c, dp, x)));
    free(x); free(p); free(w); free(b); free(lg); free(dl); free(dp); free(lab);
}

int main(int argc, char **argv) {
    log_set_program("bench_train");
    omp_env_prefer_passive(argc, argv); /* as cifar-train does */
    int batch = 256, threads = 2, steps = 20, bf16 = 0;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--batch")) batch = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--threads")) threads = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps")) steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--precision")) {
            if (strcmp(argv[i + 1], "fp32") && strcmp(argv[i + 1], "bf16"))
                die_usage("--precision %s: fp32 or bf16", argv[i + 1]);
            bf16 = !strcmp(argv[i + 1], "bf16");
        }
        else die_usage("unknown option %s", argv[i]);
    }
    if (steps < 1 || batch < 1) die_usage("--steps and --batch must be at least 1");
    ops_set_threads(threads);
    if (bf16) net_cpu_ops_pick_bf16(-1); /* exits 2 with the reason where it cannot run */
    g_bf16 = bf16;
    ModelConfig cfg;
    model_config_seed(&cfg);
    cfg.img_channels = 3; cfg.img_height = 32; cfg.img_width = 32; cfg.num_classes = 10;
    Model m;
    char err[256];
    if (model_build(&m, &cfg, err, sizeof err)) die("%s", err);
    float *params = xmalloc_aligned(m.num_params * 4), *grads = xmalloc_aligned(m.num_params * 4);
    float *mom = xmalloc_aligned(m.num_params * 4), *bufs = xmalloc_aligned(m.num_buffers * 4 + 4);
    model_init(&m, params, bufs, 0);
    const int N = 50000, img = 32 * 32 * 3;
    uint8_t *data = xmalloc((size_t)N * img);
    int32_t *labels = xmalloc((size_t)N * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)N * img; i++) data[i] = (uint8_t)(rng_u64(1, 8, i) & 255);
    for (int i = 0; i < N; i++) labels[i] = i % 10;
    float *x = xmalloc_aligned((size_t)batch * img * 4), *x16 = xmalloc_aligned((size_t)batch * img * 4);
    int32_t *y = xmalloc((size_t)batch * 4);
    int64_t *idx = xmalloc((size_t)batch * 8);
    ModelRun *run = model_run_create(&m, batch);
    AugmentSpec as = {.h = 32, .w = 32, .c = 3, .pad = 4, .flip = 1,
                      .mean = {0.485f, 0.456f, 0.406f, 0}, .std = {0.229f, 0.224f, 0.225f, 1}};
    double t0 = 0, *step_s = xcalloc((size_t)steps + 1, sizeof(double));
    for (int s = -3; s < steps; s++) { /* 3 warm-up steps */
        if (s == 0) t0 = now_seconds();
        double ts = now_seconds();
        for (int i = 0; i < batch; i++) idx[i] = rng_below(2, 2, (uint64_t)(s + 3) * batch + i, N);
        augment_batch(&as, data, labels, idx, batch, x, y);
        if (bf16) cpu_bf16_pack((size_t)batch * img, x, x16); /* as the CPU engine does */
        model_forward_backward(&m, run, params, bufs, bf16 ? x16 : x, y, batch, 0.0f, grads, NULL);
        const float lr = 0.01f;
        const int32_t first = s == -3;
        net_cpu_ops()->sgd(NULL, m.num_params, params, grads, mom, NULL, &lr, 0.9f, 5e-4f, 0, &first);
        if (s >= 0) step_s[s] = now_seconds() - ts;
    }
    double dt = now_seconds() - t0;
    double step_ms = dt * 1e3 / steps;
    qsort(step_s, (size_t)steps, sizeof(double), compare_doubles);
    /* Per-op breakdown at the model's shapes. */
    TIMED(OP_AUGMENT, augment_batch(&as, data, labels, idx, batch, x, y));
    time_conv(&m.stem_conv, batch, 32, 32);
    time_bn(batch * m.stem_h * m.stem_w, m.stem_bn.c, 0);
    for (int b = 0; b < m.n_blocks; b++) time_block(&m.blocks[b], batch);
    time_head(&m, batch);
    const float lr0 = 0.0f;
    const int32_t later = 0;
    TIMED(OP_SGD, net_cpu_ops()->sgd(NULL, m.num_params, params, grads, mom, NULL, &lr0, 0.9f, 5e-4f,
                                     0, &later));
    double sum = 0;
    fprintf(stderr, "per-op time of one step (batch %d, %d threads), each op timed alone (fastest of %d):\n", batch, threads, TIME_REPS);
    for (int i = 0; i < OP_COUNT; i++) sum += g_ops[i].ms;
    for (int i = 0; i < OP_COUNT; i++)
        fprintf(stderr, "  %-24s %8.2f ms  %5.1f%%  (%d calls)\n", g_ops[i].name, g_ops[i].ms,
                100 * g_ops[i].ms / sum, g_ops[i].calls);
    fprintf(stderr, "  %-24s %8.2f ms  (measured whole step: %.2f ms)\n", "sum of ops", sum, step_ms);
    double macs = model_forward_macs(&m);
    printf("{\"impl\":\"cifar-train-cpu\",\"device\":\"cpu\",\"batch\":%d,\"threads\":%d,\"steps\":%d,"
           "\"images_per_s\":%.1f,\"step_ms\":%.2f,\"gflops\":%.2f,\"images_per_s_median\":%.1f,"
           "\"images_per_s_peak\":%.1f}\n",
           batch, threads, steps, batch * steps / dt, step_ms, 3.0 * 2.0 * macs * batch * steps / dt / 1e9,
           batch / step_s[steps / 2], batch / step_s[0]);
    free(step_s);
    model_run_free(run);
    model_free(&m);
    return 0;
}
