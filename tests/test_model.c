/* test_model: model config JSON, layout (names, shapes, counts against PyTorch),
 * initialisation, and a basic-block network training on the CPU ops.
 * (tests/test_reference.c compares the numbers with PyTorch.) */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "model/model.h"
#include "model/net.h"
#include "backend-cpu/cpu_bf16.h"
#include "backend-cpu/ops_cpu.h"
#include "core/rng.h"

#include "unit.h"

static void set_image(ModelConfig *cfg, int c, int h, int w, int k) {
    cfg->img_channels = c;
    cfg->img_height = h;
    cfg->img_width = w;
    cfg->num_classes = k;
}

/* ---------------------------------------------------------------- config */

static void test_config_seed_json(void) {
    /* The seed's Config class as JSON, with its training fields. */
    const char *json = "{\"n_channels\": [16, 32, 64], \"bottlenecks\": [8, 16, 16],"
                       " \"n_blocks\": [6, 6, 6], \"first_kernel_size\": 3,"
                       " \"total_epoches\": 500, \"batch_size\": 256, \"Lr\": 0.1}";
    ModelConfig a, b;
    memset(&a, 0, sizeof a);
    model_config_seed(&b);
    char err[256] = "";
    a.stem_stride = 2;
    a.first_block_stride = 2;
    EXPECT(model_config_parse_json(json, &a, err, sizeof err) == 0, "%s", err);
    EXPECT(model_config_equal(&a, &b), "parsed seed config differs from model_config_seed");
    EXPECT(a.n_stages == 3 && a.use_bottleneck == 1 && a.bottlenecks[2] == 16 &&
               a.n_blocks[1] == 6 && a.first_kernel_size == 3,
           "fields");
}

static void test_config_basic_and_partial(void) {
    ModelConfig c;
    model_config_seed(&c);
    char err[256] = "";
    EXPECT(model_config_parse_json(
               "{\"n_channels\":[16,32],\"bottlenecks\":null,\"n_blocks\":[2,2],"
               "\"first_kernel_size\":5,\"stem_stride\":1,\"first_block_stride\":1}",
               &c, err, sizeof err) == 0,
           "%s", err);
    EXPECT(c.n_stages == 2 && c.use_bottleneck == 0 && c.bottlenecks[0] == 0 &&
               c.first_kernel_size == 5 && c.stem_stride == 1 && c.first_block_stride == 1,
           "null bottlenecks / strides: stages %d bneck %d k %d", c.n_stages, c.use_bottleneck,
           c.first_kernel_size);
    /* A field left out keeps its value. */
    model_config_seed(&c);
    EXPECT(model_config_parse_json("{\"first_kernel_size\": 7}", &c, err, sizeof err) == 0, "%s",
           err);
    EXPECT(c.first_kernel_size == 7 && c.n_stages == 3 && c.use_bottleneck, "partial update");
}

static void expect_parse_error(const char *json, const char *want) {
    ModelConfig c, before;
    model_config_seed(&c);
    before = c;
    char err[256] = "";
    int rc = model_config_parse_json(json, &c, err, sizeof err);
    EXPECT(rc == -1, "accepted %s", json);
    EXPECT(strstr(err, want) != NULL, "error for %s is \"%s\", wanted \"%s\"", json, err, want);
    EXPECT(memcmp(&c, &before, sizeof c) == 0, "config changed by a failed parse of %s", json);
}

static void test_config_errors(void) {
    expect_parse_error("{\"n_channels\": [16, 32", "not valid JSON");
    expect_parse_error("[1, 2]", "JSON object");
    expect_parse_error("{\"n_channels\":[16,32],\"n_blocks\":[6,6,6],\"bottlenecks\":null}",
                       "\"n_blocks\" has 3 entries but \"n_channels\" has 2");
    expect_parse_error("{\"n_channels\":[16,32],\"n_blocks\":[6,6]}",
                       "\"bottlenecks\" has 3 entries but \"n_channels\" has 2");
    expect_parse_error("{\"n_channels\":[16,0,64]}", "n_channels[1]");
    expect_parse_error("{\"n_blocks\":[6,-1,6]}", "n_blocks[1]");
    expect_parse_error("{\"n_channels\":[16,32.5,64]}", "n_channels[1]");
    expect_parse_error("{\"n_channels\":\"16\"}", "array");
    expect_parse_error("{\"n_channels\":[]}", "1 to 8 stages");
    expect_parse_error("{\"n_channels\":[1,1,1,1,1,1,1,1,1]}", "1 to 8 stages");
    expect_parse_error("{\"first_kernel_size\":0}", "first_kernel_size");
    expect_parse_error("{\"stem_stride\":\"2\"}", "stem_stride");
    /* A misspelt key is named, with the keys there are; it never trains the default. */
    expect_parse_error("{\"n_channel\":[8,16],\"n_blocks\":[1,1],\"bottlenecks\":null}",
                       "unknown key \"n_channel\" (the keys are n_channels, bottlenecks, n_blocks,");
    expect_parse_error("{\"first_kernel_size\":3,\"Bottlenecks\":null}", "unknown key \"Bottlenecks\"");
}

static void test_config_json_roundtrip(void) {
    ModelConfig a, b;
    model_config_seed(&a);
    set_image(&a, 3, 32, 32, 10);
    char *json = model_config_to_json(&a);
    memset(&b, 0, sizeof b);
    char err[256] = "";
    EXPECT(model_config_parse_json(json, &b, err, sizeof err) == 0, "%s: %s", json, err);
    EXPECT(model_config_equal(&a, &b), "round trip of %s", json);
    free(json);
    a.use_bottleneck = 0;
    memset(a.bottlenecks, 0, sizeof a.bottlenecks);
    json = model_config_to_json(&a);
    EXPECT(strstr(json, "\"bottlenecks\":null") != NULL, "basic blocks as null: %s", json);
    EXPECT(model_config_parse_json(json, &b, err, sizeof err) == 0, "%s", err);
    EXPECT(model_config_equal(&a, &b), "round trip of %s", json);
    free(json);
    b.num_classes = 100;
    EXPECT(!model_config_equal(&a, &b), "different class counts compare equal");
    b = a;
    b.n_blocks[2] = 5;
    EXPECT(!model_config_equal(&a, &b), "different block counts compare equal");
}

/* ---------------------------------------------------------------- layout */

static const TensorInfo *find_tensor(const Model *m, const char *name) {
    for (int i = 0; i < m->n_tensors; i++)
        if (strcmp(m->tensors[i].name, name) == 0) return &m->tensors[i];
    return NULL;
}

static void expect_shape(const Model *m, const char *name, int ndim, int64_t d0, int64_t d1,
                         int64_t d2, int64_t d3) {
    const TensorInfo *t = find_tensor(m, name);
    EXPECT(t != NULL, "no tensor %s", name);
    if (!t) return;
    int64_t want[4] = {d0, d1, d2, d3};
    int ok = t->ndim == ndim;
    for (int i = 0; ok && i < ndim; i++) ok = t->shape[i] == want[i];
    EXPECT(ok, "%s: ndim %d shape [%lld %lld %lld %lld]", name, t->ndim, (long long)t->shape[0],
           (long long)t->shape[1], (long long)t->shape[2], (long long)t->shape[3]);
}

/* The seed model for 32x32 RGB images and 10 classes (CIFAR-10). */
static void build_seed_cifar(Model *m) {
    ModelConfig cfg;
    model_config_seed(&cfg);
    set_image(&cfg, 3, 32, 32, 10);
    char err[256] = "";
    EXPECT(model_build(m, &cfg, err, sizeof err) == 0, "%s", err);
}

static void test_seed_layout(void) {
    Model m;
    build_seed_cifar(&m);
    /* sum(p.numel() for p in model.parameters()) and len(state_dict()) of
     * nn.Sequential(ResNetBase([6,6,6],[16,32,64],[8,16,16],3,3), nn.Linear(64,10))
     * under torch 1.13. */
    EXPECT(m.num_params == 58042, "params %zu, PyTorch has 58042", m.num_params);
    EXPECT(m.n_tensors == 408, "state_dict entries %d, PyTorch has 408", m.n_tensors);
    EXPECT(m.num_buffers == 2560, "buffer floats %zu", m.num_buffers);
    EXPECT(m.n_blocks == 18, "blocks %d", m.n_blocks);
    EXPECT(strcmp(m.tensors[0].name, "0.conv.weight") == 0, "first %s", m.tensors[0].name);
    EXPECT(strcmp(m.tensors[6].name, "0.bn.num_batches_tracked") == 0 &&
               m.tensors[6].kind == TENSOR_COUNTER && m.tensors[6].ndim == 0,
           "seventh %s", m.tensors[6].name);
    EXPECT(strcmp(m.tensors[7].name, "0.blocks.0.conv1.weight") == 0, "eighth %s",
           m.tensors[7].name);
    EXPECT(strcmp(m.tensors[m.n_tensors - 1].name, "1.bias") == 0, "last %s",
           m.tensors[m.n_tensors - 1].name);
    expect_shape(&m, "0.conv.weight", 4, 16, 3, 3, 3);
    expect_shape(&m, "0.blocks.0.conv2.weight", 4, 8, 8, 3, 3);
    expect_shape(&m, "0.blocks.0.shortcut.conv.weight", 4, 16, 16, 1, 1);
    expect_shape(&m, "0.blocks.6.shortcut.bn.running_var", 1, 32, 0, 0, 0);
    expect_shape(&m, "0.blocks.17.conv3.weight", 4, 64, 16, 1, 1);
    expect_shape(&m, "1.weight", 2, 10, 64, 0, 0);
    EXPECT(find_tensor(&m, "0.blocks.1.shortcut.conv.weight") == NULL, "block 1 has no projection");
    EXPECT(find_tensor(&m, "0.blocks.12.shortcut.conv.weight") != NULL, "block 12 projects 32->64");
    /* Strides: stem 32 -> 16, only block 0 halves again. */
    EXPECT(m.stem_h == 16 && m.stem_w == 16, "stem %dx%d", m.stem_h, m.stem_w);
    EXPECT(m.blocks[0].out_h == 8 && m.blocks[0].out_w == 8, "block 0 out %dx%d", m.blocks[0].out_h,
           m.blocks[0].out_w);
    EXPECT(m.blocks[0].conv2.spec.stride == 2 && m.blocks[0].proj_conv.spec.stride == 2 &&
               m.blocks[6].conv2.spec.stride == 1 && m.blocks[6].has_projection &&
               !m.blocks[7].has_projection,
           "strides / projections");
    EXPECT(m.blocks[17].out_h == 8 && m.fc_in == 64 && m.fc_out == 10, "head");
    /* Parameters, then buffers, fill their flat buffers densely in table order. */
    size_t next_p = 0, next_b = 0;
    int dense = 1;
    for (int i = 0; i < m.n_tensors; i++) {
        const TensorInfo *t = &m.tensors[i];
        if (t->kind == TENSOR_PARAM) {
            dense &= t->offset == next_p && t->decay == 1;
            next_p += t->numel;
        } else if (t->kind == TENSOR_BUFFER) {
            dense &= t->offset == next_b;
            next_b += t->numel;
        }
    }
    EXPECT(dense && next_p == m.num_params && next_b == m.num_buffers, "offsets not dense");
    /* torch forward hooks on every Conv2d/Linear of the same model: 3535488. */
    EXPECT(model_forward_macs(&m) == 3535488.0, "MACs %.0f", model_forward_macs(&m));
    model_free(&m);
}

static void test_build_errors(void) {
    ModelConfig cfg;
    Model m;
    char err[256] = "";
    model_config_seed(&cfg);
    EXPECT(model_build(&m, &cfg, err, sizeof err) == -1 && strstr(err, "image shape"),
           "no image shape accepted: %s", err);
    set_image(&cfg, 3, 32, 32, 10);
    cfg.n_stages = 0;
    EXPECT(model_build(&m, &cfg, err, sizeof err) == -1 && strstr(err, "stages"), "0 stages: %s",
           err);
    model_config_seed(&cfg);
    set_image(&cfg, 3, 32, 32, 10);
    cfg.bottlenecks[1] = 0;
    EXPECT(model_build(&m, &cfg, err, sizeof err) == -1 && strstr(err, "stage 1"), "bneck 0: %s",
           err);
}

/* ---------------------------------------------------------------- init */

static void test_init(void) {
    ModelConfig cfg;
    model_config_seed(&cfg);
    set_image(&cfg, 3, 32, 32, 10);
    Model m;
    char err[256];
    if (model_build(&m, &cfg, err, sizeof err)) die("build: %s", err);
    float *p1 = xmalloc(m.num_params * sizeof(float)), *p2 = xmalloc(m.num_params * sizeof(float));
    float *p3 = xmalloc(m.num_params * sizeof(float)), *b1 = xmalloc(m.num_buffers * sizeof(float));
    float *b2 = xmalloc(m.num_buffers * sizeof(float));
    model_init(&m, p1, b1, 42);
    model_init(&m, p2, b2, 42);
    model_init(&m, p3, b2, 43);
    EXPECT(memcmp(p1, p2, m.num_params * sizeof(float)) == 0, "same seed, different params");
    EXPECT(memcmp(b1, b2, m.num_buffers * sizeof(float)) == 0, "same seed, different buffers");
    size_t same = 0;
    for (size_t i = 0; i < m.num_params; i++) same += p1[i] == p3[i];
    /* Only BN gamma (1) and beta (0) coincide: 2 * sum of BN channels. */
    size_t bn_params = m.num_buffers; /* mean + var per channel = gamma + beta per channel */
    EXPECT(same == bn_params, "seeds 42/43 share %zu values (BN affine: %zu)", same, bn_params);
    /* Every conv/linear tensor within +-1/sqrt(fan_in), spread over the range. */
    const TensorInfo *w = find_tensor(&m, "0.blocks.5.conv2.weight"); /* fan_in 8*9 */
    const TensorInfo *fc = find_tensor(&m, "1.bias");                 /* fan_in 64 */
    double bound = 1.0 / sqrt(72.0), lo = 1, hi = -1, mean = 0;
    for (size_t i = 0; i < w->numel; i++) {
        double v = p1[w->offset + i];
        lo = v < lo ? v : lo;
        hi = v > hi ? v : hi;
        mean += v / (double)w->numel;
    }
    EXPECT(lo >= -bound && hi <= bound && lo < -0.9 * bound && hi > 0.9 * bound &&
               fabs(mean) < 0.02,
           "conv2 weight range [%g, %g] mean %g, bound %g", lo, hi, mean, bound);
    int in_range = 1;
    for (size_t i = 0; i < fc->numel; i++) in_range &= fabsf(p1[fc->offset + i]) <= 0.125f;
    EXPECT(in_range, "fc bias outside +-1/8");
    const TensorInfo *g = find_tensor(&m, "0.blocks.3.bn2.weight");
    const TensorInfo *v = find_tensor(&m, "0.blocks.3.bn2.running_var");
    const TensorInfo *mu = find_tensor(&m, "0.blocks.3.bn2.running_mean");
    EXPECT(p1[g->offset] == 1.0f && p1[g->offset + 1] == 1.0f && b1[v->offset] == 1.0f &&
               b1[mu->offset] == 0.0f,
           "BN init");
    /* Counter-based: the value is rng_uniform of (seed, INIT, tensor index << 32 | element). */
    const TensorInfo *c0 = &m.tensors[0];
    float u = rng_uniform(42, RNG_STREAM_INIT, (0ull << 32) | 5);
    EXPECT(p1[c0->offset + 5] == (2.0f * u - 1.0f) * (float)(1.0 / sqrt(27.0)), "0.conv.weight[5]");
    free(p1);
    free(p2);
    free(p3);
    free(b1);
    free(b2);
    model_free(&m);
}

/* ---------------------------------------------------------------- basic blocks */

/* A grayscale 20x24 image, 7 classes, basic blocks, stem kernel 5: every code
 * path the seed preset does not take. */
static void test_basic_blocks_train(void) {
    ModelConfig cfg;
    model_config_seed(&cfg);
    char err[256] = "";
    if (model_config_parse_json("{\"n_channels\":[16,32],\"bottlenecks\":null,\"n_blocks\":[2,2],"
                                "\"first_kernel_size\":5}",
                                &cfg, err, sizeof err))
        die("parse: %s", err);
    set_image(&cfg, 1, 20, 24, 7);
    Model m;
    EXPECT(model_build(&m, &cfg, err, sizeof err) == 0, "%s", err);
    /* nn.Sequential(ResNetBase([2,2],[16,32],None,1,5), nn.Linear(32,7)) in torch 1.13:
     * 43639 parameters, 79 state_dict entries, 1315424 MACs for a 1x20x24 image. */
    EXPECT(m.num_params == 43639, "params %zu, PyTorch has 43639", m.num_params);
    EXPECT(m.n_tensors == 79, "entries %d, PyTorch has 79", m.n_tensors);
    EXPECT(model_forward_macs(&m) == 1315424.0, "MACs %.0f", model_forward_macs(&m));
    expect_shape(&m, "0.conv.weight", 4, 16, 1, 5, 5);
    expect_shape(&m, "0.blocks.0.conv1.weight", 4, 16, 16, 3, 3);
    expect_shape(&m, "0.blocks.2.shortcut.conv.weight", 4, 32, 16, 1, 1);
    expect_shape(&m, "0.blocks.3.bn2.running_mean", 1, 32, 0, 0, 0);
    expect_shape(&m, "1.weight", 2, 7, 32, 0, 0);
    EXPECT(find_tensor(&m, "0.blocks.0.conv3.weight") == NULL, "basic block has a conv3");
    EXPECT(m.stem_h == 10 && m.stem_w == 12 && m.blocks[3].out_h == 5 && m.blocks[3].out_w == 6,
           "spatial sizes");

    const int n = 6, max_batch = 8;
    size_t px = (size_t)20 * 24;
    float *params = xmalloc(m.num_params * sizeof(float)),
          *buffers = xmalloc(m.num_buffers * sizeof(float));
    float *grads = xmalloc(m.num_params * sizeof(float)),
          *grads2 = xmalloc(m.num_params * sizeof(float));
    float *mom = xcalloc(m.num_params, sizeof(float)), *x = xmalloc(n * px * sizeof(float));
    float *logits = xmalloc((size_t)n * 7 * sizeof(float));
    int32_t labels[6];
    model_init(&m, params, buffers, 7);
    for (size_t i = 0; i < n * px; i++) x[i] = 2.0f * rng_uniform(9, RNG_STREAM_SYNTH, i) - 1.0f;
    for (int i = 0; i < n; i++) labels[i] = i % 7;
    ModelRun *run = model_run_create(&m, max_batch);
    float *buf_copy = xmalloc(m.num_buffers * sizeof(float));
    memcpy(buf_copy, buffers, m.num_buffers * sizeof(float));
    int correct = -1;
    float loss0 =
        model_forward_backward(&m, run, params, buffers, x, labels, n, 0.0f, grads, &correct);
    EXPECT(isfinite(loss0) && loss0 > 0.5f && loss0 < 5.0f && correct >= 0 && correct <= n,
           "first loss %g correct %d", loss0, correct);
    int finite = 1, nonzero = 0;
    for (size_t i = 0; i < m.num_params; i++) {
        finite &= isfinite(grads[i]);
        nonzero += grads[i] != 0.0f;
    }
    EXPECT(finite && nonzero > (int)(m.num_params / 2), "grads finite %d, nonzero %d", finite,
           nonzero);
    EXPECT(memcmp(buf_copy, buffers, m.num_buffers * sizeof(float)) != 0,
           "running stats not updated");
    /* Same inputs, same state: bit-identical gradients. */
    memcpy(buffers, buf_copy, m.num_buffers * sizeof(float));
    float loss0b =
        model_forward_backward(&m, run, params, buffers, x, labels, n, 0.0f, grads2, NULL);
    EXPECT(loss0b == loss0 && memcmp(grads, grads2, m.num_params * sizeof(float)) == 0,
           "forward/backward not deterministic");
    /* Label smoothing changes the loss, and a smaller batch fits the run. */
    float ls = model_forward_backward(&m, run, params, buffers, x, labels, n, 0.1f, grads2, NULL);
    EXPECT(isfinite(ls) && ls != loss0, "label smoothing loss %g vs %g", ls, loss0);
    /* Ten SGD steps on the one batch: the loss must fall. */
    float loss = loss0;
    for (int s = 0; s < 10; s++) {
        loss = model_forward_backward(&m, run, params, buffers, x, labels, n, 0.0f, grads, NULL);
        const float lr = 0.05f;
        const int32_t first = s == 0;
        net_cpu_ops()->sgd(NULL, m.num_params, params, grads, mom, NULL, &lr, 0.9f, 5e-4f, 0, &first);
    }
    loss = model_forward_backward(&m, run, params, buffers, x, labels, n, 0.0f, grads, &correct);
    EXPECT(loss < 0.5f * loss0, "loss %g after 10 steps (start %g)", loss, loss0);
    model_forward_eval(&m, run, params, buffers, x, 3, logits);
    finite = 1;
    for (int i = 0; i < 3 * 7; i++) finite &= isfinite(logits[i]);
    EXPECT(finite, "eval logits not finite");
    EXPECT(memcmp(model_run_logits(run), logits, 3 * 7 * sizeof(float)) == 0, "model_run_logits");
    printf("basic blocks: loss %.4f -> %.4f after 10 steps, %d/%d correct\n", loss0, loss, correct,
           n);
    model_run_free(run);
    free(params);
    free(buffers);
    free(grads);
    free(grads2);
    free(mom);
    free(x);
    free(logits);
    free(buf_copy);
    model_free(&m);
}

/* The executor (net.h) on the CPU table: an inference-only executor (no gradient
 * buffers, no backward plans) gives bit-identical logits to a training one, and
 * the CPU's parameter export / import is the identity. */
static void test_net_inference_only(void) {
    ModelConfig cfg;
    model_config_seed(&cfg);
    set_image(&cfg, 3, 12, 12, 5);
    Model m;
    char err[256] = "";
    EXPECT(model_build(&m, &cfg, err, sizeof err) == 0, "%s", err);
    const int n = 3;
    float *params = xmalloc(m.num_params * sizeof(float)),
          *buffers = xmalloc(m.num_buffers * sizeof(float)),
          *copy = xmalloc(m.num_params * sizeof(float)),
          *x = xmalloc((size_t)n * 12 * 12 * 3 * sizeof(float));
    model_init(&m, params, buffers, 5);
    for (size_t i = 0; i < (size_t)n * 12 * 12 * 3; i++) x[i] = rng_uniform(9, 1, i) - 0.5f;
    Net *full = net_create(&m, net_cpu_ops(), NULL, 4, 1);
    Net *infer = net_create(&m, net_cpu_ops(), NULL, 4, 0);
    /* Forward-only memory: a few buffers of the largest layer (net_impl.h's pool),
     * not every activation of 18 blocks (measured here: 5.4x less). */
    EXPECT(net_arena_bytes(infer) * 4 < net_arena_bytes(full),
           "inference arena %zu is not under a quarter of training's %zu", net_arena_bytes(infer),
           net_arena_bytes(full));
    printf("test_model: inference arena %zu bytes, training %zu (batch 4, 12x12)\n",
           net_arena_bytes(infer), net_arena_bytes(full));
    net_forward(full, params, buffers, 0, x, n);
    net_forward(infer, params, buffers, 0, x, n);
    EXPECT(memcmp(net_logits(full), net_logits(infer), (size_t)n * 5 * sizeof(float)) == 0,
           "inference-only logits differ");
    /* A second batch through the same pool: nothing of the first one leaks in. */
    for (size_t i = 0; i < (size_t)n * 12 * 12 * 3; i++) x[i] = rng_uniform(10, 1, i) - 0.5f;
    net_forward(full, params, buffers, 0, x, n);
    net_forward(infer, params, buffers, 0, x, n);
    EXPECT(memcmp(net_logits(full), net_logits(infer), (size_t)n * 5 * sizeof(float)) == 0,
           "inference-only logits differ on the second batch");
    net_params_export(full, params, copy);
    EXPECT(memcmp(params, copy, m.num_params * sizeof(float)) == 0, "CPU export is not the identity");
    net_free(full);
    net_free(infer);
    free(params);
    free(buffers);
    free(copy);
    free(x);
    model_free(&m);
}

/* One training step of m on the CPU table `ops` (the team walk, or ops that each open
 * their own region when team is NULL) with `threads` threads: a forward/backward and
 * an SGD step from the same start, writing loss, gradients, parameters and buffers. */
typedef struct {
    float loss;
    float *grads, *params, *buffers;
} StepOut;

static void train_steps(const Model *m, const NetOps *ops, int threads, const float *params0,
                        const float *buffers0, const float *x, const int32_t *labels, int n,
                        int steps, StepOut *out) {
    int saved = ops_threads();
    ops_set_threads(threads);
    Net *net = net_create(m, ops, NULL, n + 3, 1);
    float *mom = xcalloc(m->num_params, sizeof(float));
    memcpy(out->params, params0, m->num_params * sizeof(float));
    memcpy(out->buffers, buffers0, m->num_buffers * sizeof(float));
    float lr = 0.05f;
    int32_t first = 1;
    for (int s = 0; s < steps; s++) {
        net_forward(net, out->params, out->buffers, 1, x, n);
        net_backward(net, out->params, labels, n, 0.1f, out->grads, &out->loss, NULL);
        net_sgd(net, out->params, out->grads, mom, NULL, &lr, 0.9f, 5e-4f, 1, &first);
        first = 0;
    }
    free(mom);
    net_free(net);
    ops_set_threads(saved);
}

/* A training batch: m's initial parameters and buffers (model_init with init_seed),
 * n synthetic images (rng data_seed) and labels (i * label_mul) % 10. */
typedef struct {
    float *params, *buffers, *x;
    int32_t *labels;
} StepIn;

static StepIn step_inputs(const Model *m, int n, uint64_t init_seed, uint64_t data_seed, int label_mul) {
    size_t px = (size_t)32 * 32 * 3;
    StepIn in = {xmalloc(m->num_params * sizeof(float)), xmalloc(m->num_buffers * sizeof(float)),
                 xmalloc(n * px * sizeof(float)), xmalloc(n * sizeof(int32_t))};
    model_init(m, in.params, in.buffers, init_seed);
    for (size_t i = 0; i < n * px; i++) in.x[i] = 2.0f * rng_uniform(data_seed, RNG_STREAM_SYNTH, i) - 1.0f;
    for (int i = 0; i < n; i++) in.labels[i] = (i * label_mul) % 10;
    return in;
}

static void step_inputs_free(StepIn *in) {
    free(in->params);
    free(in->buffers);
    free(in->x);
    free(in->labels);
}

static void step_out_alloc(const Model *m, StepOut *o) {
    o->grads = xmalloc(m->num_params * sizeof(float));
    o->params = xmalloc(m->num_params * sizeof(float));
    o->buffers = xmalloc(m->num_buffers * sizeof(float));
}

/* got trained bit for bit as want: loss (finite), gradients, weights, BN statistics. */
static void expect_same_training(const Model *m, const StepOut *got, const StepOut *want,
                                 const char *name, const char *against) {
    EXPECT(isfinite(want->loss) && got->loss == want->loss, "%s: loss %.9g, %s %.9g", name,
           got->loss, against, want->loss);
    EXPECT(memcmp(got->grads, want->grads, m->num_params * sizeof(float)) == 0,
           "%s: gradients differ from %s", name, against);
    EXPECT(memcmp(got->params, want->params, m->num_params * sizeof(float)) == 0,
           "%s: weights differ from %s", name, against);
    EXPECT(memcmp(got->buffers, want->buffers, m->num_buffers * sizeof(float)) == 0,
           "%s: BN statistics differ from %s", name, against);
}

static void step_out_free(StepOut *o) {
    free(o->grads);
    free(o->params);
    free(o->buffers);
}

/* The seed model trains to bit-identical weights, statistics and loss with 1, 2 and
 * 3 threads, and the team walk (one parallel region per forward or backward) equals
 * ops that each open their own region: every reduction has a fixed order. An odd
 * batch (37) leaves partial tiles and blocks. */
static void test_threads_bit_identical(void) {
    Model m;
    build_seed_cifar(&m);
    const int n = 37, steps = 2;
    StepIn in = step_inputs(&m, n, 11, 5, 7);
    NetOps per_op = *net_cpu_ops();
    per_op.team = NULL;
    struct {
        const char *name;
        const NetOps *ops;
        int threads;
    } runs[] = {{"team, 1 thread", net_cpu_ops(), 1},
                {"team, 2 threads", net_cpu_ops(), 2},
                {"team, 3 threads", net_cpu_ops(), 3},
                {"per-op regions, 2 threads", &per_op, 2}};
    enum { RUNS = sizeof runs / sizeof runs[0] };
    StepOut out[RUNS];
    for (int r = 0; r < RUNS; r++) {
        step_out_alloc(&m, &out[r]);
        train_steps(&m, runs[r].ops, runs[r].threads, in.params, in.buffers, in.x, in.labels, n, steps,
                    &out[r]);
    }
    EXPECT(isfinite(out[0].loss) && memcmp(out[0].params, in.params, m.num_params * sizeof(float)) != 0,
           "training did not move the weights (loss %g)", out[0].loss);
    for (int r = 1; r < RUNS; r++) expect_same_training(&m, &out[r], &out[0], runs[r].name, "1 thread");
    for (int r = 0; r < RUNS; r++) step_out_free(&out[r]);
    step_inputs_free(&in);
    model_free(&m);
}

/* ---- the executor's folded block backward (net_ops.h: bn_relu_backward_keep and
 * conv_backward_acc), checked on the CPU: a table whose folded ops are the plain ops
 * composed (ReLU mask in place then BN backward; conv backward into a scratch then an
 * add into dx) must train bit for bit as the plain path, which runs the same
 * arithmetic in another order of calls (a + b == b + a). So the executor's buffer
 * rotation, masks and accumulation targets are checked here, without a GPU. */

enum { FOLDED_MAX_PLANS = 64 };
static struct {
    void *plan;
    size_t x_per_image; /* elements of one image of the conv's input (= its dx) */
} g_folded_plans[FOLDED_MAX_PLANS];
static int g_folded_n, g_folded_keep_calls, g_folded_acc_calls;

static void *folded_conv_plan(void *ctx, const ConvSpec *cs, int max_n, int h, int w, int backward,
                              int need_dx) {
    void *p = net_cpu_ops()->conv_plan(ctx, cs, max_n, h, w, backward, need_dx);
    if (g_folded_n >= FOLDED_MAX_PLANS) die("test_model: more than %d conv plans", FOLDED_MAX_PLANS);
    g_folded_plans[g_folded_n].plan = p;
    g_folded_plans[g_folded_n++].x_per_image = (size_t)h * w * cs->cin;
    return p;
}

static size_t folded_x_per_image(const void *plan) {
    for (int i = g_folded_n - 1; i >= 0; i--)
        if (g_folded_plans[i].plan == plan) return g_folded_plans[i].x_per_image;
    die("test_model: conv plan %p was not made by folded_conv_plan", plan);
}

static void folded_bn_relu_backward_keep(void *ctx, int n, int hw, int c, const float *x,
                                         const float *y, const float *gamma, const float *mean,
                                         const float *invstd, float *dy, float *dx, float *dgamma,
                                         float *dbeta) {
    g_folded_keep_calls++;
    net_cpu_ops()->relu_backward(ctx, (size_t)n * hw * c, y, dy, dy);
    net_cpu_ops()->bn_backward(ctx, n, hw, c, x, gamma, mean, invstd, dy, dx, dgamma, dbeta);
}

static void folded_conv_backward_acc(void *ctx, void *plan, int n, const float *x,
                                     const float *weight, const float *dy, float *dx,
                                     float *dweight, float *dbias, void *ws, size_t ws_bytes) {
    g_folded_acc_calls++;
    size_t count = (size_t)n * folded_x_per_image(plan);
    float *tmp = xmalloc(count * sizeof(float));
    net_cpu_ops()->conv_backward(ctx, plan, n, x, weight, dy, tmp, dweight, dbias, ws, ws_bytes);
    net_cpu_ops()->add(ctx, count, dx, tmp, dx);
    free(tmp);
}

/* The fused entries (net_ops.h: conv_bn_forward, bn_conv_backward) as a table might
 * give them: here the composition of the CPU's plain entries, counted; the walk must
 * call them (one per conv and pass) and get the plain walk's results bit for bit. */
static const NetOps *g_fused_base; /* the table under test, for the plain entries */
static int g_fused_fwd_calls, g_fused_bwd_calls;

static void fused_conv_bn_forward(void *ctx, void *plan, int n, const float *x, const float *weight,
                                  const float *bias, float *conv_out, void *ws, size_t ws_bytes,
                                  const NetBnForward *bn) {
    g_fused_fwd_calls++;
    g_fused_base->conv_forward(ctx, plan, n, x, weight, bias, conv_out, ws, ws_bytes);
    net_ops_bn_forward(g_fused_base, ctx, n, conv_out, bn);
}

static void fused_bn_conv_backward(void *ctx, const NetBnBackward *bn, void *plan, int n,
                                   const float *x, const float *weight, float *dx, float *dweight,
                                   float *dbias, void *ws, size_t ws_bytes, int acc) {
    g_fused_bwd_calls++;
    net_ops_bn_backward(g_fused_base, ctx, n, bn);
    (acc ? g_fused_base->conv_backward_acc : g_fused_base->conv_backward)(
        ctx, plan, n, x, weight, bn->dx, dx, dweight, dbias, ws, ws_bytes);
}

/* The plain CPU table against the same table with the folded block backward, with the
 * fused entries, and with both: the same loss, gradients, weights and statistics
 * after training steps, the same logits in inference, and each optional entry called
 * as often as the walk has places for it. */
static void test_optional_entries(void) {
    Model m;
    build_seed_cifar(&m);
    const int n = 13, steps = 2;
    StepIn in = step_inputs(&m, n, 12, 6, 3);
    int n_proj = 0, n_convs = 1;
    for (int i = 0; i < m.n_blocks; i++) {
        n_proj += m.blocks[i].has_projection;
        n_convs += model_block_n_convs(&m.blocks[i]) + m.blocks[i].has_projection;
    }
    NetOps t[4];
    static const char *names[4] = {"plain", "folded block backward", "fused entries",
                                   "fused entries + folded"};
    for (int r = 0; r < 4; r++) {
        t[r] = *net_cpu_ops();
        t[r].team = NULL; /* the wrappers allocate and count: one caller at a time */
        if (r & 1) {
            t[r].conv_plan = folded_conv_plan;
            t[r].bn_relu_backward_keep = folded_bn_relu_backward_keep;
            t[r].conv_backward_acc = folded_conv_backward_acc;
        }
        if (r & 2) {
            t[r].conv_bn_forward = fused_conv_bn_forward;
            t[r].bn_conv_backward = fused_bn_conv_backward;
        }
    }
    StepOut out[4];
    float *logits[4];
    for (int r = 0; r < 4; r++) {
        step_out_alloc(&m, &out[r]);
        g_folded_n = g_folded_keep_calls = g_folded_acc_calls = 0;
        g_fused_fwd_calls = g_fused_bwd_calls = 0;
        g_fused_base = &t[r];
        train_steps(&m, &t[r], 2, in.params, in.buffers, in.x, in.labels, n, steps, &out[r]);
        g_folded_n = 0; /* the training executor's plans are gone */
        Net *infer = net_create(&m, &t[r], NULL, n, 0);
        net_forward(infer, out[r].params, out[r].buffers, 0, in.x, n);
        logits[r] = xmalloc((size_t)n * m.fc_out * sizeof(float));
        memcpy(logits[r], net_logits(infer), (size_t)n * m.fc_out * sizeof(float));
        net_free(infer);
        /* per step and block: the last main BN, and the projection's BN */
        int keep = r & 1 ? steps * (m.n_blocks + n_proj) : 0, acc = r & 1 ? steps * m.n_blocks : 0;
        EXPECT(g_folded_keep_calls == keep && g_folded_acc_calls == acc,
               "%s: folded ops called %d and %d times, want %d and %d", names[r],
               g_folded_keep_calls, g_folded_acc_calls, keep, acc);
        int fwd = r & 2 ? (steps + 1) * n_convs : 0, bwd = r & 2 ? steps * n_convs : 0;
        EXPECT(g_fused_fwd_calls == fwd && g_fused_bwd_calls == bwd,
               "%s: fused entries called %d and %d times, want %d and %d", names[r],
               g_fused_fwd_calls, g_fused_bwd_calls, fwd, bwd);
    }
    for (int r = 1; r < 4; r++) {
        expect_same_training(&m, &out[r], &out[0], names[r], "the plain path");
        EXPECT(memcmp(logits[r], logits[0], (size_t)n * m.fc_out * sizeof(float)) == 0,
               "%s: inference logits differ from the plain path", names[r]);
        printf("%s %s (%d blocks, %d projections, %d convs) = plain path, bit for bit\n",
               g_failures ? "FAIL" : "ok  ", names[r], m.n_blocks, n_proj, n_convs);
    }
    for (int r = 0; r < 4; r++) {
        step_out_free(&out[r]);
        free(logits[r]);
    }
    step_inputs_free(&in);
    model_free(&m);
}

/* The CPU's bf16 table sets the folded block backward (cpu_bn.h's keep entry,
 * conv_dnnl.c's conv_backward_acc: the conv's dx into a buffer, then the table's add):
 * it must train bit for bit as the same table without them (the plain block
 * backward). NOT RUN where the CPU or the build has no bf16 table. */
static void test_bf16_folded(void) {
    const NetOps *bf16 = net_cpu_ops_bf16();
    if (!bf16) {
        printf("NOT RUN bf16 folded block backward: %s\n", cpu_bf16_why_not(-1));
        return;
    }
    EXPECT(bf16->bn_relu_backward_keep && bf16->conv_backward_acc,
           "the bf16 table lacks the folded block backward");
    Model m;
    build_seed_cifar(&m);
    const int n = 13, steps = 2;
    StepIn in = step_inputs(&m, n, 14, 8, 3);
    float *x16 = xmalloc_aligned((size_t)n * 32 * 32 * 3 * sizeof(float));
    cpu_bf16_pack((size_t)n * 32 * 32 * 3, in.x, x16);
    NetOps plain = *bf16;
    plain.bn_relu_backward_keep = NULL;
    plain.conv_backward_acc = NULL;
    const NetOps *tables[2] = {&plain, bf16};
    StepOut out[2];
    for (int r = 0; r < 2; r++) {
        step_out_alloc(&m, &out[r]);
        train_steps(&m, tables[r], 2, in.params, in.buffers, x16, in.labels, n, steps, &out[r]);
    }
    expect_same_training(&m, &out[1], &out[0], "bf16 folded", "the plain path");
    printf("%s bf16 table's folded block backward = its plain path, bit for bit\n",
           g_failures ? "FAIL" : "ok  ");
    for (int r = 0; r < 2; r++) step_out_free(&out[r]);
    free(x16);
    step_inputs_free(&in);
    model_free(&m);
}

/* ---- the plans' flags (net_ops.h's conv_plan: backward, need_dx): the stem's
 * backward stops at its weights (its input is the image), so its plan must ask for
 * no input gradient: a GPU table then searches and sizes no backward-data algorithm
 * for it (cuDNN may have none for 3 input channels). Recorded through a table whose
 * conv_plan notes its arguments; the CPU plan itself refuses a dx on such a plan, so
 * the training step below also checks that the executor keeps to it. */

enum { RECORDED_MAX_PLANS = 64 };
static struct {
    int cin, backward, need_dx;
} g_recorded[RECORDED_MAX_PLANS];
static int g_recorded_n;

static void *recording_conv_plan(void *ctx, const ConvSpec *cs, int max_n, int h, int w, int backward,
                                 int need_dx) {
    if (g_recorded_n >= RECORDED_MAX_PLANS) die("test_model: more than %d conv plans", RECORDED_MAX_PLANS);
    g_recorded[g_recorded_n].cin = cs->cin;
    g_recorded[g_recorded_n].backward = backward;
    g_recorded[g_recorded_n++].need_dx = need_dx;
    return net_cpu_ops()->conv_plan(ctx, cs, max_n, h, w, backward, need_dx);
}

/* Planned convs of one executor: how many, and how many of them ask for a dx. */
static void recorded_flags(int *convs, int *backward, int *need_dx, int *stem_need_dx) {
    *convs = g_recorded_n;
    *backward = *need_dx = 0;
    for (int i = 0; i < g_recorded_n; i++) {
        *backward += g_recorded[i].backward;
        *need_dx += g_recorded[i].need_dx;
    }
    *stem_need_dx = g_recorded_n ? g_recorded[0].need_dx : -1;
}

static void test_plan_need_dx(void) {
    Model m;
    build_seed_cifar(&m);
    NetOps rec = *net_cpu_ops();
    rec.team = NULL;
    rec.conv_plan = recording_conv_plan;
    int convs, backward, need_dx, stem;
    g_recorded_n = 0;
    Net *infer = net_create(&m, &rec, NULL, 2, 0);
    recorded_flags(&convs, &backward, &need_dx, &stem);
    EXPECT(convs > 1 && backward == 0 && need_dx == 0,
           "inference-only executor: %d plans, %d with backward, %d with need_dx (want none)", convs,
           backward, need_dx);
    net_free(infer);
    g_recorded_n = 0;
    const int n = 2;
    StepIn in = step_inputs(&m, n, 3, 4, 3);
    StepOut out;
    step_out_alloc(&m, &out);
    train_steps(&m, &rec, 1, in.params, in.buffers, in.x, in.labels, n, 1, &out);
    recorded_flags(&convs, &backward, &need_dx, &stem);
    EXPECT(g_recorded[0].cin == m.cfg.img_channels, "the first plan has %d input channels, not the stem's %d",
           g_recorded[0].cin, m.cfg.img_channels);
    EXPECT(stem == 0, "training executor: the stem's plan asks for a dx (need_dx %d)", stem);
    EXPECT(backward == convs && need_dx == convs - 1,
           "training executor: %d plans, %d with backward, %d with need_dx (want all, all but the stem)", convs,
           backward, need_dx);
    EXPECT(isfinite(out.loss), "a training step on the recording table: loss %g", out.loss);
    printf("%s plan flags: the stem's plan has need_dx 0, the %d others 1; inference plans neither\n",
           g_failures ? "FAIL" : "ok  ", convs - 1);
    step_out_free(&out);
    step_inputs_free(&in);
    model_free(&m);
}

int main(void) {
    log_set_program("test_model");
    test_config_seed_json();
    test_config_basic_and_partial();
    test_config_errors();
    test_config_json_roundtrip();
    test_seed_layout();
    test_build_errors();
    test_init();
    test_basic_blocks_train();
    test_net_inference_only();
    test_threads_bit_identical();
    test_optional_entries();
    test_bf16_folded();
    test_plan_need_dx();
    return unit_report("test_model");
}
