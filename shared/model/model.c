/* model.c: the seed's ResNet on the CPU ops (see model.h).
 *
 * Layout: model_build walks the network in PyTorch's registration order and
 * appends one TensorInfo per state_dict entry; parameters get consecutive
 * offsets in `params`, running statistics in `buffers`. So the flat buffers are
 * the state_dict, minus the num_batches_tracked counters.
 *
 * Activations, forward and backward are the network executor's (net.h); the
 * ModelRun functions below run it with the CPU's op table. */
#include "model/model.h"

#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"
#include "model/net.h"

/* ---------------------------------------------------------------- config */

void model_config_seed(ModelConfig *cfg) {
    static const int channels[3] = {16, 32, 64};
    static const int bottlenecks[3] = {8, 16, 16};
    memset(cfg, 0, sizeof *cfg);
    cfg->n_stages = 3;
    for (int i = 0; i < 3; i++) {
        cfg->n_channels[i] = channels[i];
        cfg->bottlenecks[i] = bottlenecks[i];
        cfg->n_blocks[i] = 6;
    }
    cfg->use_bottleneck = 1;
    cfg->first_kernel_size = 3;
    cfg->stem_stride = 2;
    cfg->first_block_stride = 2;
}

/* Upper bound on any single size in a config: keeps products far from overflow. */
#define CONFIG_MAX_VALUE 65536

static int json_get_int(const cJSON *item, const char *field, int min, int *out, char *err,
                        size_t errlen) {
    if (!cJSON_IsNumber(item)) {
        snprintf(err, errlen, "\"%s\" must be an integer", field);
        return -1;
    }
    double v = item->valuedouble;
    if (v != floor(v) || v < min || v > CONFIG_MAX_VALUE) {
        snprintf(err, errlen, "\"%s\" must be an integer in [%d, %d], got %g", field, min,
                 CONFIG_MAX_VALUE, v);
        return -1;
    }
    *out = (int)v;
    return 0;
}

/* An array of positive ints: returns its length, or -1 with err set. */
static int json_get_int_array(const cJSON *item, const char *field, int *out, char *err,
                              size_t errlen) {
    if (!cJSON_IsArray(item)) {
        snprintf(err, errlen, "\"%s\" must be an array of positive integers", field);
        return -1;
    }
    int n = cJSON_GetArraySize(item);
    if (n < 1 || n > MODEL_MAX_STAGES) {
        snprintf(err, errlen, "\"%s\" has %d entries; 1 to %d stages are supported", field, n,
                 MODEL_MAX_STAGES);
        return -1;
    }
    char name[64];
    for (int i = 0; i < n; i++) {
        snprintf(name, sizeof name, "%s[%d]", field, i);
        if (json_get_int(cJSON_GetArrayItem(item, i), name, 1, &out[i], err, errlen)) return -1;
    }
    return n;
}

/* Optional scalar field: absent leaves *out as it is. */
static int json_opt_int(const cJSON *root, const char *field, int min, int *out, char *err,
                        size_t errlen) {
    const cJSON *item = cJSON_GetObjectItemCaseSensitive(root, field);
    if (!item) return 0;
    return json_get_int(item, field, min, out, err, errlen);
}

/* The keys a model file may hold: the seed's Config network fields, our two
 * strides, and the image fields snapshots record (a model file's are replaced by
 * the dataset's). */
static const char *const model_keys[] = {
    "n_channels", "bottlenecks", "n_blocks", "first_kernel_size", "stem_stride",
    "first_block_stride", "img_channels", "img_height", "img_width", "num_classes",
};
/* The seed's Config also holds training settings, so that its class dumped as
 * JSON loads: they are options here, and ignored with a warning. */
static const char *const seed_training_keys[][2] = {
    {"total_epoches", "--epochs"}, {"batch_size", "--batch-size"}, {"Lr", "--lr"},
};

/* The option that replaces one of the seed's training keys, or NULL. */
static const char *seed_training_option(const char *key) {
    for (size_t t = 0; t < sizeof seed_training_keys / sizeof *seed_training_keys; t++)
        if (strcmp(key, seed_training_keys[t][0]) == 0) return seed_training_keys[t][1];
    return NULL;
}

static int is_model_key(const char *key) {
    for (size_t k = 0; k < sizeof model_keys / sizeof *model_keys; k++)
        if (strcmp(key, model_keys[k]) == 0) return 1;
    return 0;
}

/* A key the model does not know is an error (a misspelt "n_channel" would
 * otherwise train the default network): name it and the known ones. */
static int check_model_keys(const cJSON *root, char *err, size_t errlen) {
    for (const cJSON *item = root->child; item; item = item->next) {
        const char *option = seed_training_option(item->string);
        if (option) {
            log_warn_once("model config: \"%s\" is one of the seed's training settings, ignored here "
                          "(the option is %s)", item->string, option);
            continue;
        }
        if (is_model_key(item->string)) continue;
        size_t off = (size_t)snprintf(err, errlen, "unknown key \"%s\" (the keys are", item->string);
        for (size_t k = 0; k < sizeof model_keys / sizeof *model_keys && off < errlen; k++)
            off += (size_t)snprintf(err + off, errlen - off, "%s %s", k ? "," : "", model_keys[k]);
        if (off < errlen) snprintf(err + off, errlen - off, ")");
        return -1;
    }
    return 0;
}

int model_config_parse_json(const char *json, ModelConfig *cfg, char *err, size_t errlen) {
    cJSON *root = cJSON_Parse(json);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        snprintf(err, errlen, "not valid JSON (near \"%.20s\")", at ? at : "");
        return -1;
    }
    ModelConfig c = *cfg;
    int rc = -1;
    int n_bneck = c.use_bottleneck ? c.n_stages : 0;
    int len;
    const cJSON *item;
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "the model config must be a JSON object");
        goto done;
    }
    if (check_model_keys(root, err, errlen) != 0) goto done;
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "n_channels"))) {
        if ((len = json_get_int_array(item, "n_channels", c.n_channels, err, errlen)) < 0)
            goto done;
        c.n_stages = len;
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "n_blocks"))) {
        if ((len = json_get_int_array(item, "n_blocks", c.n_blocks, err, errlen)) < 0) goto done;
        if (len != c.n_stages) {
            snprintf(err, errlen, "\"n_blocks\" has %d entries but \"n_channels\" has %d", len,
                     c.n_stages);
            goto done;
        }
    }
    if ((item = cJSON_GetObjectItemCaseSensitive(root, "bottlenecks"))) {
        if (cJSON_IsNull(item)) {
            c.use_bottleneck = 0;
            n_bneck = 0;
            memset(c.bottlenecks, 0, sizeof c.bottlenecks);
        } else {
            memset(c.bottlenecks, 0, sizeof c.bottlenecks);
            if ((n_bneck = json_get_int_array(item, "bottlenecks", c.bottlenecks, err, errlen)) < 0)
                goto done;
            c.use_bottleneck = 1;
        }
    }
    if (c.n_stages < 1 || c.n_stages > MODEL_MAX_STAGES) {
        snprintf(err, errlen, "\"n_channels\" is missing (1 to %d stages)", MODEL_MAX_STAGES);
        goto done;
    }
    if (c.use_bottleneck && n_bneck != c.n_stages) {
        snprintf(err, errlen, "\"bottlenecks\" has %d entries but \"n_channels\" has %d", n_bneck,
                 c.n_stages);
        goto done;
    }
    for (int i = 0; i < c.n_stages; i++) {
        if (c.n_blocks[i] < 1) {
            snprintf(err, errlen, "\"n_blocks\" must have %d positive entries", c.n_stages);
            goto done;
        }
    }
    if (json_opt_int(root, "first_kernel_size", 1, &c.first_kernel_size, err, errlen) ||
        json_opt_int(root, "stem_stride", 1, &c.stem_stride, err, errlen) ||
        json_opt_int(root, "first_block_stride", 1, &c.first_block_stride, err, errlen) ||
        json_opt_int(root, "img_channels", 1, &c.img_channels, err, errlen) ||
        json_opt_int(root, "img_height", 1, &c.img_height, err, errlen) ||
        json_opt_int(root, "img_width", 1, &c.img_width, err, errlen) ||
        json_opt_int(root, "num_classes", 1, &c.num_classes, err, errlen))
        goto done;
    if (c.first_kernel_size < 1 || c.stem_stride < 1 || c.first_block_stride < 1) {
        snprintf(err, errlen,
                 "\"first_kernel_size\", \"stem_stride\" and \"first_block_stride\" "
                 "must be positive");
        goto done;
    }
    *cfg = c;
    rc = 0;
done:
    cJSON_Delete(root);
    return rc;
}

static cJSON *json_int_array(const int *v, int n) {
    cJSON *arr = cJSON_CreateArray();
    CHECK_ALLOC(arr, sizeof(cJSON));
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber(v[i]));
    return arr;
}

char *model_config_to_json(const ModelConfig *cfg) {
    cJSON *root = cJSON_CreateObject();
    CHECK_ALLOC(root, sizeof(cJSON));
    cJSON_AddItemToObject(root, "n_channels", json_int_array(cfg->n_channels, cfg->n_stages));
    if (cfg->use_bottleneck)
        cJSON_AddItemToObject(root, "bottlenecks", json_int_array(cfg->bottlenecks, cfg->n_stages));
    else
        cJSON_AddNullToObject(root, "bottlenecks");
    cJSON_AddItemToObject(root, "n_blocks", json_int_array(cfg->n_blocks, cfg->n_stages));
    cJSON_AddNumberToObject(root, "first_kernel_size", cfg->first_kernel_size);
    cJSON_AddNumberToObject(root, "stem_stride", cfg->stem_stride);
    cJSON_AddNumberToObject(root, "first_block_stride", cfg->first_block_stride);
    cJSON_AddNumberToObject(root, "img_channels", cfg->img_channels);
    cJSON_AddNumberToObject(root, "img_height", cfg->img_height);
    cJSON_AddNumberToObject(root, "img_width", cfg->img_width);
    cJSON_AddNumberToObject(root, "num_classes", cfg->num_classes);
    char *text = cJSON_PrintUnformatted(root);
    CHECK_ALLOC(text, 1024);
    cJSON_Delete(root);
    return text;
}

int model_config_equal(const ModelConfig *a, const ModelConfig *b) {
    if (a->n_stages != b->n_stages || a->use_bottleneck != b->use_bottleneck ||
        a->first_kernel_size != b->first_kernel_size || a->stem_stride != b->stem_stride ||
        a->first_block_stride != b->first_block_stride || a->img_channels != b->img_channels ||
        a->img_height != b->img_height || a->img_width != b->img_width ||
        a->num_classes != b->num_classes)
        return 0;
    for (int i = 0; i < a->n_stages; i++) {
        if (a->n_channels[i] != b->n_channels[i] || a->n_blocks[i] != b->n_blocks[i]) return 0;
        if (a->use_bottleneck && a->bottlenecks[i] != b->bottlenecks[i]) return 0;
    }
    return 1;
}

/* ---------------------------------------------------------------- layout */

typedef struct {
    Model *m;
    int cap;
} Builder;

static TensorInfo *builder_add(Builder *b, const char *name, TensorKind kind, int ndim,
                               const int64_t *shape) {
    Model *m = b->m;
    if (m->n_tensors == b->cap) {
        b->cap = b->cap ? 2 * b->cap : 64;
        m->tensors = xrealloc(m->tensors, (size_t)b->cap * sizeof *m->tensors);
    }
    TensorInfo *t = &m->tensors[m->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->kind = kind;
    t->ndim = ndim;
    t->numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = shape[i];
        t->numel *= (size_t)shape[i];
    }
    if (kind == TENSOR_PARAM) {
        t->offset = m->num_params;
        m->num_params += t->numel;
        t->decay = 1; /* the seed's SGD decays every parameter */
    } else if (kind == TENSOR_BUFFER) {
        t->offset = m->num_buffers;
        m->num_buffers += t->numel;
    }
    return t;
}

static size_t builder_add_named(Builder *b, const char *prefix, const char *suffix, TensorKind kind,
                                int ndim, const int64_t *shape) {
    char name[96];
    snprintf(name, sizeof name, "%s.%s", prefix, suffix);
    return builder_add(b, name, kind, ndim, shape)->offset;
}

static ConvLayer builder_conv(Builder *b, const char *prefix, int cin, int cout, int k, int stride,
                              int pad) {
    ConvLayer l;
    l.spec = (ConvSpec){.cin = cin, .cout = cout, .k = k, .stride = stride, .pad = pad};
    int64_t wshape[4] = {cout, cin, k, k};
    int64_t bshape[1] = {cout};
    l.weight = builder_add_named(b, prefix, "weight", TENSOR_PARAM, 4, wshape);
    l.bias = builder_add_named(b, prefix, "bias", TENSOR_PARAM, 1, bshape);
    return l;
}

static BNLayer builder_bn(Builder *b, const char *prefix, int c) {
    BNLayer l;
    int64_t shape[1] = {c};
    l.c = c;
    l.gamma = builder_add_named(b, prefix, "weight", TENSOR_PARAM, 1, shape);
    l.beta = builder_add_named(b, prefix, "bias", TENSOR_PARAM, 1, shape);
    l.running_mean = builder_add_named(b, prefix, "running_mean", TENSOR_BUFFER, 1, shape);
    l.running_var = builder_add_named(b, prefix, "running_var", TENSOR_BUFFER, 1, shape);
    builder_add_named(b, prefix, "num_batches_tracked", TENSOR_COUNTER, 0, NULL);
    return l;
}

/* One block in registration order (conv1, bn1, conv2, bn2, [conv3, bn3], shortcut),
 * as the seed's ResidualBlock / BottleneckResidualBlock. */
static void builder_block(Builder *b, Block *blk, int index, int cin, int cmid, int cout,
                          int stride, int bottleneck, int in_h, int in_w) {
    char p[64], name[80];
    snprintf(p, sizeof p, "0.blocks.%d", index);
    memset(blk, 0, sizeof *blk);
    blk->in_h = in_h;
    blk->in_w = in_w;
    blk->out_h = conv_out_size(in_h, 3, stride, 1);
    blk->out_w = conv_out_size(in_w, 3, stride, 1);
    blk->cin = cin;
    blk->cout = cout;
    blk->bottleneck = bottleneck;
#define SUB(s) (snprintf(name, sizeof name, "%s.%s", p, s), name)
    if (bottleneck) {
        blk->cmid = cmid;
        blk->conv1 = builder_conv(b, SUB("conv1"), cin, cmid, 1, 1, 0);
        blk->bn1 = builder_bn(b, SUB("bn1"), cmid);
        blk->conv2 = builder_conv(b, SUB("conv2"), cmid, cmid, 3, stride, 1);
        blk->bn2 = builder_bn(b, SUB("bn2"), cmid);
        blk->conv3 = builder_conv(b, SUB("conv3"), cmid, cout, 1, 1, 0);
        blk->bn3 = builder_bn(b, SUB("bn3"), cout);
    } else {
        blk->cmid = cout;
        blk->conv1 = builder_conv(b, SUB("conv1"), cin, cout, 3, stride, 1);
        blk->bn1 = builder_bn(b, SUB("bn1"), cout);
        blk->conv2 = builder_conv(b, SUB("conv2"), cout, cout, 3, 1, 1);
        blk->bn2 = builder_bn(b, SUB("bn2"), cout);
    }
    blk->has_projection = stride != 1 || cin != cout;
    if (blk->has_projection) {
        blk->proj_conv = builder_conv(b, SUB("shortcut.conv"), cin, cout, 1, stride, 0);
        blk->proj_bn = builder_bn(b, SUB("shortcut.bn"), cout);
    }
#undef SUB
}

static int config_check(const ModelConfig *cfg, char *err, size_t errlen) {
    if (cfg->n_stages < 1 || cfg->n_stages > MODEL_MAX_STAGES) {
        snprintf(err, errlen, "the model needs 1 to %d stages, got %d", MODEL_MAX_STAGES,
                 cfg->n_stages);
        return -1;
    }
    for (int i = 0; i < cfg->n_stages; i++) {
        if (cfg->n_channels[i] < 1 || cfg->n_blocks[i] < 1 ||
            (cfg->use_bottleneck && cfg->bottlenecks[i] < 1)) {
            snprintf(err, errlen,
                     "stage %d: channels, blocks and bottleneck width must be positive", i);
            return -1;
        }
    }
    if (cfg->first_kernel_size < 1 || cfg->stem_stride < 1 || cfg->first_block_stride < 1) {
        snprintf(err, errlen,
                 "first_kernel_size, stem_stride and first_block_stride must be positive");
        return -1;
    }
    if (cfg->img_channels < 1 || cfg->img_height < 1 || cfg->img_width < 1 ||
        cfg->num_classes < 1) {
        snprintf(err, errlen, "image shape %dx%dx%d with %d classes: all must be positive",
                 cfg->img_height, cfg->img_width, cfg->img_channels, cfg->num_classes);
        return -1;
    }
    return 0;
}

int model_build(Model *m, const ModelConfig *cfg, char *err, size_t errlen) {
    memset(m, 0, sizeof *m);
    if (config_check(cfg, err, errlen)) return -1;
    m->cfg = *cfg;
    int k = cfg->first_kernel_size;
    m->stem_h = conv_out_size(cfg->img_height, k, cfg->stem_stride, k / 2);
    m->stem_w = conv_out_size(cfg->img_width, k, cfg->stem_stride, k / 2);
    if (m->stem_h < 1 || m->stem_w < 1) {
        snprintf(err, errlen, "a %dx%d image is too small for a %dx%d stem kernel with stride %d",
                 cfg->img_height, cfg->img_width, k, k, cfg->stem_stride);
        return -1;
    }
    int total = 0;
    for (int i = 0; i < cfg->n_stages; i++) total += cfg->n_blocks[i];
    Builder b = {.m = m, .cap = 0};
    m->n_blocks = total;
    m->blocks = xcalloc((size_t)total, sizeof *m->blocks);
    m->stem_conv = builder_conv(&b, "0.conv", cfg->img_channels, cfg->n_channels[0], k,
                                cfg->stem_stride, k / 2);
    m->stem_bn = builder_bn(&b, "0.bn", cfg->n_channels[0]);
    int h = m->stem_h, w = m->stem_w, prev = cfg->n_channels[0], index = 0;
    for (int s = 0; s < cfg->n_stages; s++) {
        for (int j = 0; j < cfg->n_blocks[s]; j++) {
            /* The seed: stride 2 only while no block exists yet. */
            int stride = index == 0 ? cfg->first_block_stride : 1;
            int cmid = cfg->use_bottleneck ? cfg->bottlenecks[s] : cfg->n_channels[s];
            Block *blk = &m->blocks[index];
            builder_block(&b, blk, index, prev, cmid, cfg->n_channels[s], stride,
                          cfg->use_bottleneck, h, w);
            h = blk->out_h;
            w = blk->out_w;
            prev = cfg->n_channels[s];
            index++;
        }
    }
    if (h < 1 || w < 1) {
        snprintf(err, errlen,
                 "a %dx%d image is too small for the strides (stem %d, first block %d)",
                 cfg->img_height, cfg->img_width, cfg->stem_stride, cfg->first_block_stride);
        model_free(m);
        return -1;
    }
    m->fc_in = prev;
    m->fc_out = cfg->num_classes;
    int64_t wshape[2] = {m->fc_out, m->fc_in};
    int64_t bshape[1] = {m->fc_out};
    m->fc_weight = builder_add(&b, "1.weight", TENSOR_PARAM, 2, wshape)->offset;
    m->fc_bias = builder_add(&b, "1.bias", TENSOR_PARAM, 1, bshape)->offset;
    return 0;
}

void model_free(Model *m) {
    free(m->blocks);
    free(m->tensors);
    m->blocks = NULL;
    m->tensors = NULL;
    m->n_blocks = 0;
    m->n_tensors = 0;
}

/* ---------------------------------------------------------------- init */

/* The table index of the parameter tensor at `offset`: it keys the init stream. */
static uint64_t tensor_index_of(const Model *m, size_t offset) {
    for (int i = 0; i < m->n_tensors; i++)
        if (m->tensors[i].kind == TENSOR_PARAM && m->tensors[i].offset == offset)
            return (uint64_t)i;
    die("model: no parameter tensor at offset %zu (internal error)", offset);
}

static void init_uniform(const Model *m, float *params, size_t offset, size_t n, double fan_in,
                         uint64_t seed) {
    float bound = (float)(1.0 / sqrt(fan_in));
    uint64_t t = tensor_index_of(m, offset);
    for (size_t i = 0; i < n; i++) {
        float u = rng_uniform(seed, RNG_STREAM_INIT, (t << 32) | (uint64_t)i);
        params[offset + i] = (2.0f * u - 1.0f) * bound;
    }
}

/* kaiming_uniform(a=sqrt(5)) on the weight is U(-1/sqrt(fan_in), +); the bias uses
 * the same bound (PyTorch's _ConvNd/Linear reset_parameters). */
static void init_conv(const Model *m, const ConvLayer *l, float *params, uint64_t seed) {
    const ConvSpec *s = &l->spec;
    double fan_in = (double)s->cin * s->k * s->k;
    init_uniform(m, params, l->weight, (size_t)s->cout * s->cin * s->k * s->k, fan_in, seed);
    init_uniform(m, params, l->bias, (size_t)s->cout, fan_in, seed);
}

static void init_bn(const BNLayer *l, float *params, float *buffers) {
    for (int i = 0; i < l->c; i++) {
        params[l->gamma + i] = 1.0f;
        params[l->beta + i] = 0.0f;
        buffers[l->running_mean + i] = 0.0f;
        buffers[l->running_var + i] = 1.0f;
    }
}

void model_init(const Model *m, float *params, float *buffers, uint64_t seed) {
    init_conv(m, &m->stem_conv, params, seed);
    init_bn(&m->stem_bn, params, buffers);
    for (int i = 0; i < m->n_blocks; i++) {
        const Block *b = &m->blocks[i];
        init_conv(m, &b->conv1, params, seed);
        init_bn(&b->bn1, params, buffers);
        init_conv(m, &b->conv2, params, seed);
        init_bn(&b->bn2, params, buffers);
        if (b->bottleneck) {
            init_conv(m, &b->conv3, params, seed);
            init_bn(&b->bn3, params, buffers);
        }
        if (b->has_projection) {
            init_conv(m, &b->proj_conv, params, seed);
            init_bn(&b->proj_bn, params, buffers);
        }
    }
    init_uniform(m, params, m->fc_weight, (size_t)m->fc_out * m->fc_in, m->fc_in, seed);
    init_uniform(m, params, m->fc_bias, (size_t)m->fc_out, m->fc_in, seed);
}

/* ---------------------------------------------------------------- run (CPU) */

/* model.h's CPU run: the network executor (net.h) with the CPU's op table. */
struct ModelRun {
    Net *net;
};

static ModelRun *model_run_new(const Model *m, int max_batch, int backward) {
    ModelRun *run = xcalloc(1, sizeof *run);
    run->net = net_create(m, net_cpu_ops(), NULL, max_batch, backward);
    return run;
}

ModelRun *model_run_create(const Model *m, int max_batch) { return model_run_new(m, max_batch, 1); }

ModelRun *model_run_create_inference(const Model *m, int max_batch) {
    return model_run_new(m, max_batch, 0);
}

void model_run_free(ModelRun *run) {
    if (!run) return;
    net_free(run->net);
    free(run);
}

const float *model_run_logits(const ModelRun *run) { return net_logits(run->net); }

float model_forward_backward(const Model *m, ModelRun *run, const float *params, float *buffers,
                             const float *x, const int32_t *labels, int n, float label_smoothing,
                             float *grads, int *correct) {
    for (int i = 0; i < n; i++)
        if (labels[i] < 0 || labels[i] >= m->fc_out)
            die("model: label %d of image %d is outside [0, %d)", (int)labels[i], i, m->fc_out);
    net_forward(run->net, params, buffers, 1, x, n);
    float loss = 0.0f;
    if (correct) *correct = 0;
    net_backward(run->net, params, labels, n, label_smoothing, grads, &loss, correct);
    return loss;
}

void model_forward_eval(const Model *m, ModelRun *run, const float *params, const float *buffers,
                        const float *x, int n, float *logits) {
    /* Inference reads the running statistics only. */
    net_forward(run->net, params, (float *)buffers, 0, x, n);
    memcpy(logits, net_logits(run->net), (size_t)n * m->fc_out * sizeof(float));
}

/* ---------------------------------------------------------------- cost */

static double conv_macs(const ConvSpec *s, int h, int w) {
    int oh = conv_out_size(h, s->k, s->stride, s->pad),
        ow = conv_out_size(w, s->k, s->stride, s->pad);
    return (double)oh * ow * s->cout * s->cin * s->k * s->k;
}

/* Convolutions and the linear head; BN, ReLU, adds and the pool are not MACs. */
double model_forward_macs(const Model *m) {
    double macs = conv_macs(&m->stem_conv.spec, m->cfg.img_height, m->cfg.img_width);
    for (int i = 0; i < m->n_blocks; i++) {
        const Block *b = &m->blocks[i];
        for (int j = 0; j < model_block_n_convs(b); j++) {
            int h, w;
            model_block_conv_input(b, j, &h, &w);
            macs += conv_macs(&model_block_conv(b, j)->spec, h, w);
        }
        if (b->has_projection) macs += conv_macs(&b->proj_conv.spec, b->in_h, b->in_w);
    }
    return macs + (double)m->fc_in * m->fc_out;
}
