/* test_reference: the C model against PyTorch, as llm.c's test_gpt2 does.
 *
 * Reads tests/data/reference.bin (written by tests/make_reference.py, format
 * documented there; PyTorch computed it in float64), loads PyTorch's initial
 * state_dict into the flat buffers, and compares with per-tensor tolerances:
 *   - the tensor table (every state_dict name, in order, with its shape);
 *   - train-mode logits and loss of one forward/backward;
 *   - every parameter gradient and the BN running statistics after it;
 *   - every parameter and buffer after 3 SGD steps (sgd_update), and the
 *     eval-mode logits after them.
 * Two runs of the same network executor (shared/model/net_impl.h):
 *   double  - the executor and the CPU ops instantiated for double: every
 *             comparison, with tolerances a little above the float32 rounding
 *             of the stored reference;
 *   float   - the library (model.c, ops_cpu.c) as the commands use it: logits,
 *             loss, BN statistics and gradients with float32-sized tolerances.
 *             Gradients are compared by relative norm, 0.25 per tensor and 3e-2
 *             over all of them: float32 rounding flips a few ReLU masks in this
 *             56-layer net, and PyTorch's own float32 gradients are off from
 *             float64 by 0.75% overall and up to 7% on single tensors here. The SGD steps are
 *             not compared in float: 3 steps at lr 0.1 on one batch are chaotic
 *             (PyTorch float32 vs float64 weights differ by 60% after them).
 * Usage: test_reference [reference.bin] [-v]  (default tests/data/reference.bin;
 * -v prints every tensor, otherwise only failures and per-group maxima). */
#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/fsutil.h"
#include "model/model.h"
#include "unit.h"

/* The ops, their op table and the network executor in double. */
#include "cpu_double.h"

#define REF_MAGIC "CIFREF01"
#define REF_VERSION 1
#define REF_MAX_BYTES ((size_t)64 << 20)

typedef struct {
    char name[128];
    int ndim;
    int64_t shape[8];
    size_t numel;
    const float *data; /* into the file image; may be unaligned: read with memcpy */
} RefTensor;

typedef struct {
    char *image;
    size_t len;
    char *config_json;
    RefTensor *t;
    size_t n;
} RefFile;

static const char *g_path;

static void ref_fail(const char *reason) {
    die("%s: %s\n---> HINT: regenerate it with /usr/bin/python3 tests/make_reference.py", g_path,
        reason);
}

/* Bounds-checked reader over the file image. */
static const char *ref_take(const RefFile *f, size_t *pos, size_t bytes) {
    if (bytes > f->len || *pos > f->len - bytes) ref_fail("truncated (a size runs past the end)");
    const char *p = f->image + *pos;
    *pos += bytes;
    return p;
}

static uint64_t ref_u64(const RefFile *f, size_t *pos) {
    uint64_t v;
    memcpy(&v, ref_take(f, pos, 8), 8);
    return v;
}

static void ref_load(RefFile *f, const char *path) {
    g_path = path;
    f->image = fs_read_file(path, REF_MAX_BYTES, &f->len);
    CHECK_STDIO(f->image != NULL, path);
    size_t pos = 0;
    if (memcmp(ref_take(f, &pos, 8), REF_MAGIC, 8) != 0)
        ref_fail("bad magic (not a CIFREF01 file)");
    if (ref_u64(f, &pos) != REF_VERSION) ref_fail("unsupported version");
    uint64_t clen = ref_u64(f, &pos);
    if (clen > f->len) ref_fail("config length larger than the file");
    const char *c = ref_take(f, &pos, (size_t)clen);
    f->config_json = xmalloc((size_t)clen + 1);
    memcpy(f->config_json, c, (size_t)clen);
    f->config_json[clen] = 0;
    uint64_t n = ref_u64(f, &pos);
    if (n > f->len / 16) ref_fail("tensor count larger than the file can hold");
    f->n = (size_t)n;
    f->t = xcalloc(f->n ? f->n : 1, sizeof *f->t);
    for (size_t i = 0; i < f->n; i++) {
        RefTensor *t = &f->t[i];
        uint64_t nl = ref_u64(f, &pos);
        if (nl == 0 || nl >= sizeof t->name) ref_fail("tensor name empty or too long");
        memcpy(t->name, ref_take(f, &pos, (size_t)nl), (size_t)nl);
        uint64_t nd = ref_u64(f, &pos);
        if (nd > 8) ref_fail("tensor with more than 8 dimensions");
        t->ndim = (int)nd;
        t->numel = 1;
        for (int d = 0; d < t->ndim; d++) {
            uint64_t s = ref_u64(f, &pos);
            if (s > f->len) ref_fail("tensor dimension larger than the file");
            t->shape[d] = (int64_t)s;
            t->numel *= (size_t)s;
            if (t->numel > f->len) ref_fail("tensor larger than the file");
        }
        t->data = (const float *)ref_take(f, &pos, t->numel * sizeof(float));
    }
    if (pos != f->len) ref_fail("trailing bytes after the last tensor");
}

static const RefTensor *ref_find(const RefFile *f, const char *name) {
    for (size_t i = 0; i < f->n; i++)
        if (strcmp(f->t[i].name, name) == 0) return &f->t[i];
    return NULL;
}

static const RefTensor *ref_get(const RefFile *f, const char *name, size_t numel) {
    const RefTensor *t = ref_find(f, name);
    if (!t) {
        fprintf(stderr, "%s: missing tensor \"%s\"\n", g_path, name);
        ref_fail("missing tensor");
    }
    if (t->numel != numel) {
        fprintf(stderr, "%s: \"%s\" has %zu values, expected %zu\n", g_path, name, t->numel, numel);
        ref_fail("tensor size mismatch");
    }
    return t;
}

static float *ref_copy(const RefTensor *t) {
    float *p = xmalloc(t->numel * sizeof(float) + 1);
    memcpy(p, t->data, t->numel * sizeof(float));
    return p;
}

/* ---------------------------------------------------------------- comparison */

typedef struct {
    const char *name;
    double worst_abs, worst_rel;
    char worst_tensor[128];
    int failures, count;
    double diff2, ref2; /* over all the group's tensors */
} Group;

static int g_verbose;

/* abs_tol: bound on the max abs error scaled by max(1, max|ref|); rel_tol: bound on
 * ||got-ref|| / ||ref||. A tensor passes when its max abs error is within abs_tol,
 * or (rel_tol > 0) its relative norm error is within rel_tol. */
static void compare(Group *g, const char *name, const float *got, const float *ref_unaligned,
                    size_t n, double abs_tol, double rel_tol) {
    double max_abs = 0, max_ref = 0, diff2 = 0, ref2 = 0;
    int finite = 1;
    for (size_t i = 0; i < n; i++) {
        float r;
        memcpy(&r, ref_unaligned + i, sizeof r);
        double d = fabs((double)got[i] - r);
        if (!isfinite(got[i])) finite = 0;
        if (d > max_abs) max_abs = d;
        if (fabs(r) > max_ref) max_ref = fabs(r);
        diff2 += d * d;
        ref2 += (double)r * r;
    }
    double scaled = max_abs / (max_ref > 1 ? max_ref : 1);
    double rel = ref2 > 0 ? sqrt(diff2 / ref2) : (diff2 > 0 ? INFINITY : 0);
    int ok = finite && (scaled <= abs_tol || (rel_tol > 0 && rel <= rel_tol));
    g->count++;
    if (scaled > g->worst_abs || g->count == 1) {
        g->worst_abs = scaled;
        snprintf(g->worst_tensor, sizeof g->worst_tensor, "%s", name);
    }
    /* Tensors that pass on the absolute floor (true value ~0) would swamp the
     * relative figure with noise ratios: only the others count for it. */
    if (rel > g->worst_rel && max_ref > 100 * abs_tol) g->worst_rel = rel;
    g->diff2 += diff2;
    g->ref2 += ref2;
    if (!ok) g->failures++;
    if (!ok || g_verbose)
        printf("  %-4s %-44s max_abs %.3e (scaled %.3e, tol %.0e)  rel_norm %.3e%s\n",
               ok ? "ok" : "FAIL", name, max_abs, scaled, abs_tol, rel,
               rel_tol > 0 ? "" : " (not used)");
}

static int group_report(const Group *g) {
    printf("%-12s %4d tensors  worst scaled max_abs %.3e (%s)  worst rel_norm %.3e  "
           "all-tensor rel_norm %.3e  %s\n",
           g->name, g->count, g->worst_abs, g->worst_tensor, g->worst_rel,
           g->ref2 > 0 ? sqrt(g->diff2 / g->ref2) : 0.0, g->failures ? "FAIL" : "ok");
    return g->failures;
}

/* ---------------------------------------------------------------- test */

static double json_number(const char *json, const char *field) {
    cJSON *root = cJSON_Parse(json);
    const cJSON *item = root ? cJSON_GetObjectItemCaseSensitive(root, field) : NULL;
    if (!cJSON_IsNumber(item)) ref_fail("config JSON lacks a numeric training field");
    double v = item->valuedouble;
    cJSON_Delete(root);
    return v;
}

/* Every "init/" tensor, in order, must be the model's table entry of the same index. */
static int check_table(const RefFile *f, const Model *m) {
    int k = 0, bad = 0;
    for (size_t i = 0; i < f->n; i++) {
        if (strncmp(f->t[i].name, "init/", 5) != 0) continue;
        const RefTensor *r = &f->t[i];
        if (k >= m->n_tensors) {
            printf("  table: PyTorch has extra tensor %s\n", r->name + 5);
            bad++;
            k++;
            continue;
        }
        const TensorInfo *t = &m->tensors[k++];
        int same = strcmp(t->name, r->name + 5) == 0 && t->ndim == r->ndim;
        for (int d = 0; same && d < t->ndim; d++) same = t->shape[d] == r->shape[d];
        if (!same) {
            printf("  table[%d]: C has %s (ndim %d), PyTorch has %s (ndim %d)\n", k - 1, t->name,
                   t->ndim, r->name + 5, r->ndim);
            bad++;
        }
    }
    if (k != m->n_tensors) {
        printf("  table: C has %d tensors, PyTorch %d\n", m->n_tensors, k);
        bad++;
    }
    printf("%-12s %4d tensors  names, order and shapes %s\n", "table", k, bad ? "FAIL" : "ok");
    return bad;
}

/* ---------------------------------------------------------------- the two runs */

/* Tolerances of one run. */
typedef struct {
    const char *label;
    double logits, loss, grad_rel, grad_floor, grad_all, stats, steps;
} Tolerances;

/* The reference batch, loaded once. */
typedef struct {
    const RefFile *f;
    const Model *m;
    int batch, steps;
    double lr, momentum, wd, smoothing;
    const float *x_nhwc;
    const int32_t *labels;
} Case;

/* Every state entry "<prefix><name>" into params / buffers (either precision). */
#define LOAD_STATE(T, c, prefix, params, buffers)                                                  \
    do {                                                                                           \
        char key_[160];                                                                            \
        for (int i_ = 0; i_ < (c)->m->n_tensors; i_++) {                                           \
            const TensorInfo *t_ = &(c)->m->tensors[i_];                                           \
            if (t_->kind == TENSOR_COUNTER) continue;                                              \
            snprintf(key_, sizeof key_, "%s%s", prefix, t_->name);                                 \
            const RefTensor *r_ = ref_get((c)->f, key_, t_->numel);                                \
            T *dst_ = (t_->kind == TENSOR_PARAM ? (params) : (buffers)) + t_->offset;              \
            for (size_t j_ = 0; j_ < t_->numel; j_++) {                                            \
                float v_;                                                                          \
                memcpy(&v_, r_->data + j_, sizeof v_);                                             \
                dst_[j_] = (T)v_;                                                                  \
            }                                                                                      \
        }                                                                                          \
    } while (0)

static float *to_float(const double *p, size_t n) {
    float *out = xmalloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) out[i] = (float)p[i];
    return out;
}

/* Compare a double buffer (rounded to float: the reference is stored in float). */
static void compare_d(Group *g, const char *name, const double *got, const float *ref, size_t n,
                      double abs_tol, double rel_tol) {
    float *tmp = to_float(got, n);
    compare(g, name, tmp, ref, n, abs_tol, rel_tol);
    free(tmp);
}

/* Gradients of every parameter, and the BN buffers against "<prefix>". */
static void compare_grads(Group *g, const Case *c, const float *grads, const Tolerances *tol) {
    char key[160];
    for (int i = 0; i < c->m->n_tensors; i++) {
        const TensorInfo *t = &c->m->tensors[i];
        if (t->kind != TENSOR_PARAM) continue;
        snprintf(key, sizeof key, "grad/%s", t->name);
        /* Conv biases in front of a BN (and the stem BN's beta, whose every path
         * meets a BN) have a true gradient of 0: only rounding noise on both
         * sides, so an absolute floor applies besides the relative norm. */
        compare(g, t->name, grads + t->offset, ref_get(c->f, key, t->numel)->data, t->numel,
                tol->grad_floor, tol->grad_rel);
    }
    /* The whole gradient vector: tighter than any one tensor can be held to. */
    double all = g->ref2 > 0 ? sqrt(g->diff2 / g->ref2) : INFINITY;
    if (!(all <= tol->grad_all)) {
        printf("  FAIL all gradients: rel_norm %.3e > %.0e\n", all, tol->grad_all);
        g->failures++;
    }
}

static void compare_buffers(Group *g, const Case *c, const char *prefix, const float *params,
                            const float *buffers, int with_params, double tol) {
    char key[160];
    for (int i = 0; i < c->m->n_tensors; i++) {
        const TensorInfo *t = &c->m->tensors[i];
        if (t->kind == TENSOR_COUNTER || (t->kind == TENSOR_PARAM && !with_params)) continue;
        snprintf(key, sizeof key, "%s%s", prefix, t->name);
        compare(g, t->name, (t->kind == TENSOR_PARAM ? params : buffers) + t->offset,
                ref_get(c->f, key, t->numel)->data, t->numel, tol, 0);
    }
}

static int report(const char *label, Group *groups, int n) {
    int failures = 0;
    printf("[%s]\n", label);
    for (int i = 0; i < n; i++) failures += group_report(&groups[i]);
    return failures;
}

/* The model code in double: every comparison. */
static int run_double(const Case *c, const Tolerances *tol) {
    const Model *m = c->m;
    size_t np = m->num_params, nb = m->num_buffers;
    int n = c->batch, K = m->fc_out;
    double *params = xmalloc(np * sizeof(double)), *buffers = xmalloc(nb * sizeof(double));
    double *grads = xmalloc(np * sizeof(double)), *mom = xcalloc(np, sizeof(double));
    LOAD_STATE(double, c, "init/", params, buffers);
    size_t nx = (size_t)n * m->cfg.img_height * m->cfg.img_width * m->cfg.img_channels;
    double *x = xmalloc(nx * sizeof(double));
    for (size_t i = 0; i < nx; i++) x[i] = c->x_nhwc[i];
    struct NetD *run = net_createD(m, &net_cpu_opsD, NULL, n, 1);

    Group g[5] = {{.name = "forward"},
                  {.name = "grads"},
                  {.name = "bn stats"},
                  {.name = "after steps"},
                  {.name = "eval logits"}};
    double loss = 0.0;
    net_forwardD(run, params, buffers, 1, x, n);
    net_backwardD(run, params, c->labels, n, c->smoothing, grads, &loss, NULL);
    compare_d(&g[0], "logits", net_logitsD(run),
              ref_get(c->f, "logits", (size_t)n * K)->data, (size_t)n * K, tol->logits, 0);
    compare_d(&g[0], "loss", &loss, ref_get(c->f, "loss", 1)->data, 1, tol->loss, 0);
    float *gf = to_float(grads, np), *pf = to_float(params, np), *bf = to_float(buffers, nb);
    compare_grads(&g[1], c, gf, tol);
    compare_buffers(&g[2], c, "stats1/", pf, bf, 0, tol->stats);
    for (int s = 0; s < c->steps; s++) {
        if (s > 0) {
            double step_loss;
            net_forwardD(run, params, buffers, 1, x, n);
            net_backwardD(run, params, c->labels, n, c->smoothing, grads, &step_loss, NULL);
        }
        /* the sgd entry's body in double (the entry reads lr as a float, from device
         * memory; the reference's rates are doubles) */
        opsi_sgd_update(np, params, grads, mom, NULL, c->lr, c->momentum, c->wd, 0, s == 0);
    }
    free(pf);
    free(bf);
    pf = to_float(params, np);
    bf = to_float(buffers, nb);
    compare_buffers(&g[3], c, "step3/", pf, bf, 1, tol->steps);
    double *logits = xmalloc((size_t)n * K * sizeof(double));
    net_forwardD(run, params, buffers, 0, x, n);
    memcpy(logits, net_logitsD(run), (size_t)n * K * sizeof(double));
    compare_d(&g[4], "eval_logits", logits, ref_get(c->f, "eval_logits", (size_t)n * K)->data,
              (size_t)n * K, tol->steps, 0);
    int failures = report(tol->label, g, 5);
    net_freeD(run);
    free(logits);
    free(gf);
    free(pf);
    free(bf);
    free(x);
    free(params);
    free(buffers);
    free(grads);
    free(mom);
    return failures;
}

/* The library's float model: one forward/backward. */
static int run_float(const Case *c, const Tolerances *tol) {
    const Model *m = c->m;
    size_t np = m->num_params, nb = m->num_buffers;
    int n = c->batch, K = m->fc_out;
    float *params = xmalloc(np * sizeof(float)), *buffers = xmalloc(nb * sizeof(float));
    float *grads = xmalloc(np * sizeof(float));
    LOAD_STATE(float, c, "init/", params, buffers);
    ModelRun *run = model_run_create(m, n);
    Group g[3] = {{.name = "forward"}, {.name = "grads"}, {.name = "bn stats"}};
    int correct = -1;
    float loss = model_forward_backward(m, run, params, buffers, c->x_nhwc, c->labels, n,
                                        (float)c->smoothing, grads, &correct);
    compare(&g[0], "logits", model_run_logits(run), ref_get(c->f, "logits", (size_t)n * K)->data,
            (size_t)n * K, tol->logits, 0);
    compare(&g[0], "loss", &loss, ref_get(c->f, "loss", 1)->data, 1, tol->loss, 0);
    compare_grads(&g[1], c, grads, tol);
    compare_buffers(&g[2], c, "stats1/", params, buffers, 0, tol->stats);
    int failures = report(tol->label, g, 3);
    if (correct < 0 || correct > n) {
        printf("correct count %d outside [0, %d]: FAIL\n", correct, n);
        failures++;
    }
    model_run_free(run);
    free(params);
    free(buffers);
    free(grads);
    return failures;
}

/* The model's keys of the reference's config: it also holds the run's training
 * fields (batch, steps, lr, ...), which the model parser rightly refuses as
 * unknown keys. */
static char *config_model_part(const char *config_json) {
    static const char *const training_fields[] = {"batch", "steps", "lr", "momentum", "weight_decay",
                                                  "label_smoothing", "precision"};
    cJSON *j = cJSON_Parse(config_json);
    if (!j) ref_fail("config is not valid JSON");
    for (size_t i = 0; i < sizeof training_fields / sizeof *training_fields; i++)
        cJSON_DeleteItemFromObjectCaseSensitive(j, training_fields[i]);
    char *out = cJSON_PrintUnformatted(j);
    cJSON_Delete(j);
    if (!out) ref_fail("config: out of memory");
    return out;
}

int main(int argc, char **argv) {
    log_set_program("test_reference");
    const char *path = "tests/data/reference.bin";
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "-v") == 0)
            g_verbose = 1;
        else
            path = argv[i];
    }
    RefFile f = {0};
    ref_load(&f, path);

    ModelConfig cfg;
    model_config_seed(&cfg);
    char err[256];
    char *model_json = config_model_part(f.config_json);
    if (model_config_parse_json(model_json, &cfg, err, sizeof err))
        die("%s: config: %s", path, err);
    free(model_json);
    Model m;
    if (model_build(&m, &cfg, err, sizeof err)) die("%s: model: %s", path, err);
    Case c = {.f = &f, .m = &m};
    c.batch = (int)json_number(f.config_json, "batch");
    c.steps = (int)json_number(f.config_json, "steps");
    c.lr = json_number(f.config_json, "lr");
    c.momentum = json_number(f.config_json, "momentum");
    c.wd = json_number(f.config_json, "weight_decay");
    c.smoothing = json_number(f.config_json, "label_smoothing");
    if (c.batch < 1 || c.steps < 1) ref_fail("batch and steps must be positive");
    printf("reference %s: %zu tensors, batch %d, model %zu params, %zu buffer floats, %.0f "
           "MACs/image\n",
           path, f.n, c.batch, m.num_params, m.num_buffers, model_forward_macs(&m));
    int table_failures = check_table(&f, &m);
    EXPECT(table_failures == 0, "%d tensor-table mismatches", table_failures);

    /* NCHW -> NHWC */
    int C = cfg.img_channels, H = cfg.img_height, W = cfg.img_width, N = c.batch;
    float *xin = ref_copy(ref_get(&f, "input", (size_t)N * C * H * W));
    float *x = xmalloc((size_t)N * H * W * C * sizeof(float));
    for (int n = 0; n < N; n++)
        for (int ch = 0; ch < C; ch++)
            for (int h = 0; h < H; h++)
                for (int w = 0; w < W; w++)
                    x[(((size_t)n * H + h) * W + w) * C + ch] =
                        xin[(((size_t)n * C + ch) * H + h) * W + w];
    float *lab = ref_copy(ref_get(&f, "labels", (size_t)N));
    int32_t *labels = xmalloc((size_t)N * sizeof(int32_t));
    for (int i = 0; i < N; i++) labels[i] = (int32_t)lab[i];
    c.x_nhwc = x;
    c.labels = labels;

    /* double: the stored reference is float32-rounded (6e-8 relative), so a few
     * 1e-7 of slack; the steps amplify differences, hence 1e-5 there. */
    Tolerances td = {.label = "double",
                     .logits = 1e-6,
                     .loss = 1e-6,
                     .grad_rel = 1e-5,
                     .grad_floor = 1e-9,
                     .grad_all = 1e-6,
                     .stats = 1e-6,
                     .steps = 1e-5};
    /* float: PyTorch's own float32 gradients here are off from float64 by 0.75%
     * over all tensors and by up to 7% on single BN weights (ReLU mask flips). */
    Tolerances tf = {.label = "float",
                     .logits = 1e-4,
                     .loss = 1e-5,
                     .grad_rel = 0.25,
                     .grad_floor = 1e-5,
                     .grad_all = 3e-2,
                     .stats = 1e-4,
                     .steps = 0};
    int double_failures = run_double(&c, &td);
    EXPECT(double_failures == 0, "%d comparisons failed in double", double_failures);
    int float_failures = run_float(&c, &tf);
    EXPECT(float_failures == 0, "%d comparisons failed in float", float_failures);

    model_free(&m);
    free(labels);
    free(lab);
    free(x);
    free(xin);
    free(f.t);
    free(f.config_json);
    free(f.image);
    return unit_report("test_reference");
}
