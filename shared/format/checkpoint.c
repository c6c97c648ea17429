/* checkpoint.c: see checkpoint.h. */
#include "format/checkpoint.h"

#include <cjson/cJSON.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "core/check.h"

#define MOMENTUM_TENSOR "optimizer.momentum"
#define EMA_PREFIX "ema."

void train_state_alloc(TrainState *s, const Model *m) {
    memset(s, 0, sizeof *s);
    s->params = xmalloc_aligned(m->num_params * sizeof(float));
    s->buffers = xmalloc_aligned((m->num_buffers ? m->num_buffers : 1) * sizeof(float));
    s->momentum = xmalloc_aligned(m->num_params * sizeof(float));
}

void train_state_alloc_ema(TrainState *s, const Model *m) {
    s->ema_params = xmalloc_aligned(m->num_params * sizeof(float));
    s->ema_buffers = xmalloc_aligned((m->num_buffers ? m->num_buffers : 1) * sizeof(float));
}

void train_state_free(TrainState *s) {
    free(s->params);
    free(s->buffers);
    free(s->momentum);
    free(s->ema_params);
    free(s->ema_buffers);
    memset(s, 0, sizeof *s);
}

void checkpoint_info_free(CheckpointInfo *info) {
    free(info->model_json);
    free(info->dataset_path);
    free(info->dataset_shape);
    free(info->dataset_identity);
    free(info->options_json);
    class_names_free(&info->classes);
    memset(info, 0, sizeof *info);
}

void checkpoint_dataset_shape(const ModelConfig *cfg, char *buf, size_t buflen) {
    snprintf(buf, buflen, "%dx%dx%d/%d", cfg->img_height, cfg->img_width, cfg->img_channels,
             cfg->num_classes);
}

static void format_floats(const float *v, int n, char *buf, size_t buflen) {
    size_t off = (size_t)snprintf(buf, buflen, "[");
    for (int i = 0; i < n && off < buflen; i++)
        off += (size_t)snprintf(buf + off, buflen - off, "%s%.9g", i ? "," : "", (double)v[i]);
    if (off < buflen) snprintf(buf + off, buflen - off, "]");
}

static int parse_floats(const char *text, float *out, int n) {
    cJSON *arr = cJSON_Parse(text);
    int ok = cJSON_IsArray(arr) && cJSON_GetArraySize(arr) == n;
    for (int i = 0; ok && i < n; i++) {
        cJSON *it = cJSON_GetArrayItem(arr, i);
        ok = cJSON_IsNumber(it);
        if (ok) out[i] = (float)it->valuedouble;
    }
    cJSON_Delete(arr);
    return ok ? 0 : -1;
}

/* A state dict entry of the model's tensor ti: name, shape, and its floats in
 * params/buffers (or the step counter). */
static SnapTensorIn state_tensor(const TensorInfo *ti, const char *name, const float *params,
                                 const float *buffers, const int64_t *nbt) {
    SnapTensorIn t;
    memset(&t, 0, sizeof t);
    t.name = name;
    t.ndim = ti->ndim;
    memcpy(t.shape, ti->shape, sizeof t.shape);
    if (ti->kind == TENSOR_COUNTER) {
        t.dtype = SNAP_I64;
        t.data = nbt;
    } else {
        t.dtype = SNAP_F32;
        t.data = (ti->kind == TENSOR_PARAM ? params : buffers) + ti->offset;
    }
    return t;
}

/* "ema." + the name of every tensor, in one allocation (freed by the caller). */
static char *ema_names(const Model *m, const char **names) {
    size_t bytes = 0;
    for (int i = 0; i < m->n_tensors; i++) bytes += strlen(EMA_PREFIX) + strlen(m->tensors[i].name) + 1;
    char *all = xmalloc(bytes ? bytes : 1), *at = all;
    for (int i = 0; i < m->n_tensors; i++) {
        names[i] = at;
        at += sprintf(at, EMA_PREFIX "%s", m->tensors[i].name) + 1;
    }
    return all;
}

/* The tensor list of the model's state_dict followed by the momentum vector, then
 * the moving average's state dict when st has one (*names_out: its names; the step
 * counters are the model's own). */
static SnapTensorIn *checkpoint_tensors(const Model *m, const TrainState *st, const int64_t *nbt,
                                        int *count, char **names_out) {
    SnapTensorIn *t = xcalloc(2 * (size_t)m->n_tensors + 1, sizeof *t);
    for (int i = 0; i < m->n_tensors; i++)
        t[i] = state_tensor(&m->tensors[i], m->tensors[i].name, st->params, st->buffers, nbt);
    SnapTensorIn *mom = &t[m->n_tensors];
    mom->name = MOMENTUM_TENSOR;
    mom->dtype = SNAP_F32;
    mom->ndim = 1;
    mom->shape[0] = (int64_t)m->num_params;
    mom->data = st->momentum;
    *count = m->n_tensors + 1;
    *names_out = NULL;
    if (!st->ema_params) return t;
    const char **names = xcalloc((size_t)m->n_tensors + 1, sizeof *names);
    *names_out = ema_names(m, names);
    for (int i = 0; i < m->n_tensors; i++)
        t[(*count)++] = state_tensor(&m->tensors[i], names[i], st->ema_params, st->ema_buffers, nbt);
    free(names);
    return t;
}

/* Whether the snapshot records the epoch's position: only for an epoch that ran
 * with several world sizes (otherwise the step count says it, as it always did). */
static int records_epoch_position(const TrainProgress *p) {
    return p->step_in_epoch > 0 && p->n_epoch_worlds > 1;
}

/* "epoch_position": {"version":1,"consumed":C,"world_sizes":[4,2]}. */
static void format_epoch_position(const TrainProgress *p, char *buf, size_t len) {
    size_t off = (size_t)snprintf(buf, len, "{\"version\":%d,\"consumed\":%" PRId64 ",\"world_sizes\":[",
                                  CHECKPOINT_EPOCH_POSITION_VERSION, p->epoch_position);
    for (int i = 0; i < p->n_epoch_worlds && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%d", i ? "," : "", p->epoch_worlds[i]);
    if (off < len) snprintf(buf + off, len - off, "]}");
}

int checkpoint_write(const char *path, const Model *m, const TrainState *st,
                     const CheckpointInfo *info, char *err, size_t errlen) {
    int64_t nbt = info->progress.step;
    int n_tensors;
    char *ema_name_text;
    SnapTensorIn *tensors = checkpoint_tensors(m, st, &nbt, &n_tensors, &ema_name_text);
    char *model_json = model_config_to_json(&m->cfg);
    char shape[64], mean[160], std[160], epochs[32], step[32], sie[32], partial[160], world[16],
        best[64], position[64 + 12 * CHECKPOINT_MAX_EPOCH_WORLDS];
    checkpoint_dataset_shape(&m->cfg, shape, sizeof shape);
    format_floats(info->mean, m->cfg.img_channels, mean, sizeof mean);
    format_floats(info->std, m->cfg.img_channels, std, sizeof std);
    snprintf(epochs, sizeof epochs, "%" PRId64, info->progress.epochs);
    snprintf(step, sizeof step, "%" PRId64, info->progress.step);
    snprintf(sie, sizeof sie, "%" PRId64, info->progress.step_in_epoch);
    snprintf(partial, sizeof partial, "[%.17g,%.17g,%.17g,%.17g]", info->progress.partial_loss_sum,
             info->progress.partial_correct, info->progress.partial_seen,
             info->progress.partial_seconds);
    snprintf(world, sizeof world, "%d", info->progress.world_size);
    snprintf(best, sizeof best, "[%.17g,%" PRId64 "]", info->progress.best_val_acc,
             info->progress.best_epoch);
    format_epoch_position(&info->progress, position, sizeof position);
    char *classes = class_names_to_json(&info->classes);
    SnapMeta meta[] = {
        {"model", model_json},
        {"dataset", info->dataset_path ? info->dataset_path : ""},
        {"dataset_shape", shape},
        {"dataset_identity", info->dataset_identity ? info->dataset_identity : ""},
        {"normalize_mean", mean},
        {"normalize_std", std},
        {"epochs", epochs},
        {"step", step},
        {"step_in_epoch", sie},
        {"partial_epoch", partial},
        {"world_size", world},
        {"best_val", best},
        {"options", info->options_json ? info->options_json : "{}"},
        {"classes", classes},
        {"epoch_position", position},
    };
    /* The optional entries last: "classes" when the dataset names them, then
     * "epoch_position" when the epoch was resharded (records_epoch_position). */
    int n_meta = (int)(sizeof meta / sizeof meta[0]) - 2;
    if (info->classes.count) n_meta++;
    else meta[n_meta] = meta[n_meta + 1];
    if (records_epoch_position(&info->progress)) n_meta++;
    int rc = snapshot_write(path, tensors, n_tensors, meta, n_meta, err, errlen);
    free(classes);
    free(model_json);
    free(tensors);
    free(ema_name_text);
    return rc;
}

static const char *meta_required(const Snapshot *s, const char *key, char *err, size_t errlen) {
    const char *v = snapshot_meta(s, key);
    if (!v) snprintf(err, errlen, "snapshot metadata lacks \"%s\" (not written by cifar-train?)", key);
    return v;
}

static int parse_i64(const char *text, int64_t *out) {
    char *end;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || v < 0) return -1;
    *out = v;
    return 0;
}

/* A world size a snapshot may name: a count of processes, not a byte size. */
#define CHECKPOINT_MAX_WORLD (1 << 20)

/* A JSON number that is a whole count in [lo, hi] into *out: 0, or -1. */
static int json_count(const cJSON *v, double lo, double hi, int64_t *out) {
    if (!cJSON_IsNumber(v) || v->valuedouble < lo || v->valuedouble > hi ||
        v->valuedouble != floor(v->valuedouble))
        return -1;
    *out = (int64_t)v->valuedouble;
    return 0;
}

/* The list of world sizes of "epoch_position": 2..CHECKPOINT_MAX_EPOCH_WORLDS of them,
 * the last one the snapshot's world_size. 0, or -1. */
static int parse_epoch_worlds(const cJSON *list, TrainProgress *p) {
    int n = cJSON_IsArray(list) ? cJSON_GetArraySize(list) : 0;
    if (n < 2 || n > CHECKPOINT_MAX_EPOCH_WORLDS) return -1;
    for (int i = 0; i < n; i++) {
        int64_t w;
        if (json_count(cJSON_GetArrayItem(list, i), 1, CHECKPOINT_MAX_WORLD, &w) != 0) return -1;
        p->epoch_worlds[i] = (int)w;
    }
    p->n_epoch_worlds = n;
    return p->epoch_worlds[n - 1] == p->world_size ? 0 : -1;
}

/* "epoch_position" (written for a resharded epoch only). Without it, the epoch in
 * progress ran at the snapshot's world size alone and its position is -1 (the
 * trainer derives it from the step count). */
static int parse_epoch_position(const Snapshot *s, TrainProgress *p, char *err, size_t errlen) {
    const char *text = snapshot_meta(s, "epoch_position");
    p->epoch_position = -1;
    p->n_epoch_worlds = p->step_in_epoch > 0;
    p->epoch_worlds[0] = p->world_size;
    if (!text) return 0;
    cJSON *j = cJSON_Parse(text);
    int64_t version = 0;
    int rc = -1;
    if (cJSON_IsObject(j) &&
        json_count(cJSON_GetObjectItemCaseSensitive(j, "version"), 1, 1e9, &version) == 0 &&
        version > CHECKPOINT_EPOCH_POSITION_VERSION) {
        snprintf(err, errlen, "its \"epoch_position\" was written by a newer version (version %" PRId64
                 "; this program reads %d): upgrade cifar-train", version,
                 CHECKPOINT_EPOCH_POSITION_VERSION);
        cJSON_Delete(j);
        return -1;
    }
    if (version == CHECKPOINT_EPOCH_POSITION_VERSION && p->step_in_epoch > 0 &&
        json_count(cJSON_GetObjectItemCaseSensitive(j, "consumed"), 1, 9007199254740992.0,
                   &p->epoch_position) == 0 &&
        parse_epoch_worlds(cJSON_GetObjectItemCaseSensitive(j, "world_sizes"), p) == 0)
        rc = 0;
    cJSON_Delete(j);
    if (rc != 0) snprintf(err, errlen, "snapshot metadata \"epoch_position\" is malformed: %.80s", text);
    return rc;
}

static int parse_progress(const Snapshot *s, TrainProgress *p, char *err, size_t errlen) {
    const char *keys[] = {"epochs", "step", "step_in_epoch"};
    int64_t *dst[] = {&p->epochs, &p->step, &p->step_in_epoch};
    for (int i = 0; i < 3; i++) {
        const char *v = meta_required(s, keys[i], err, errlen);
        if (!v) return -1;
        if (parse_i64(v, dst[i]) != 0) {
            snprintf(err, errlen, "snapshot metadata \"%s\" is not a count: %.40s", keys[i], v);
            return -1;
        }
    }
    if (p->step_in_epoch > p->step) {
        snprintf(err, errlen, "snapshot metadata \"step_in_epoch\" (%" PRId64 ") is more than \"step\" (%"
                 PRId64 ")", p->step_in_epoch, p->step);
        return -1;
    }
    const char *partial = snapshot_meta(s, "partial_epoch");
    if (partial && sscanf(partial, "[%lg,%lg,%lg,%lg]", &p->partial_loss_sum, &p->partial_correct,
                          &p->partial_seen, &p->partial_seconds) != 4) {
        snprintf(err, errlen, "snapshot metadata \"partial_epoch\" is malformed");
        return -1;
    }
    const char *world = snapshot_meta(s, "world_size");
    int64_t world_size = 1;
    if (world && (parse_i64(world, &world_size) != 0 || world_size < 1 ||
                  world_size > CHECKPOINT_MAX_WORLD)) {
        snprintf(err, errlen, "snapshot metadata \"world_size\" is not a world size: %.40s", world);
        return -1;
    }
    p->world_size = (int)world_size;
    if (parse_epoch_position(s, p, err, errlen) != 0) return -1;
    const char *best = snapshot_meta(s, "best_val"); /* absent before validation splits */
    long long best_epoch = 0;
    if (best && (sscanf(best, "[%lg,%lld]", &p->best_val_acc, &best_epoch) != 2 || best_epoch < 0 ||
                 best_epoch > p->epochs)) {
        snprintf(err, errlen, "snapshot metadata \"best_val\" is malformed");
        return -1;
    }
    p->best_epoch = best_epoch;
    return 0;
}

/* The image shape and class count, which model_config_to_json records beside
 * the seed's Config fields. */
static int parse_image_fields(const char *model_json, ModelConfig *cfg) {
    cJSON *root = cJSON_Parse(model_json);
    const char *keys[] = {"img_channels", "img_height", "img_width", "num_classes"};
    int *dst[] = {&cfg->img_channels, &cfg->img_height, &cfg->img_width, &cfg->num_classes};
    int ok = cJSON_IsObject(root);
    for (int i = 0; ok && i < 4; i++) {
        cJSON *v = cJSON_GetObjectItemCaseSensitive(root, keys[i]);
        ok = cJSON_IsNumber(v) && v->valuedouble >= 1 && v->valuedouble <= 1e6;
        if (ok) *dst[i] = (int)v->valuedouble;
    }
    cJSON_Delete(root);
    return ok ? 0 : -1;
}

/* The optional "classes" metadata: as many names as the model has classes. */
static int parse_classes(const Snapshot *s, int num_classes, ClassNames *out, char *err,
                         size_t errlen) {
    const char *text = snapshot_meta(s, "classes");
    if (!text) return 0;
    char why[200];
    if (class_names_parse(text, strlen(text), out, why, sizeof why) != 0) {
        snprintf(err, errlen, "snapshot metadata \"classes\": %s", why);
        return -1;
    }
    if (out->count != num_classes) {
        snprintf(err, errlen, "snapshot metadata \"classes\" names %d classes, the model has %d",
                 out->count, num_classes);
        return -1;
    }
    return 0;
}

Snapshot *checkpoint_open(const char *path, ModelConfig *cfg, CheckpointInfo *info, char *err,
                          size_t errlen) {
    memset(info, 0, sizeof *info);
    Snapshot *s = snapshot_read(path, err, errlen);
    if (!s) return NULL;
    const char *model = meta_required(s, "model", err, errlen);
    if (!model) goto fail;
    char why[256];
    if (model_config_parse_json(model, cfg, why, sizeof why) != 0) {
        snprintf(err, errlen, "snapshot metadata \"model\" is invalid: %s", why);
        goto fail;
    }
    if (parse_image_fields(model, cfg) != 0 || cfg->img_channels < 1 || cfg->img_channels > 4 ||
        cfg->num_classes < 1 || cfg->img_height < 1 || cfg->img_width < 1) {
        snprintf(err, errlen, "snapshot metadata \"model\" lacks the image shape or class count");
        goto fail;
    }
    const char *mean = meta_required(s, "normalize_mean", err, errlen);
    const char *std = meta_required(s, "normalize_std", err, errlen);
    if (!mean || !std) goto fail;
    if (parse_floats(mean, info->mean, cfg->img_channels) != 0 ||
        parse_floats(std, info->std, cfg->img_channels) != 0) {
        snprintf(err, errlen, "snapshot normalisation metadata does not match %d channels",
                 cfg->img_channels);
        goto fail;
    }
    if (parse_progress(s, &info->progress, err, errlen) != 0) goto fail;
    info->channels = cfg->img_channels;
    info->model_json = xstrdup(model);
    const char *ds = snapshot_meta(s, "dataset");
    info->dataset_path = xstrdup(ds ? ds : "");
    const char *shape = snapshot_meta(s, "dataset_shape");
    info->dataset_shape = xstrdup(shape ? shape : "");
    const char *identity = snapshot_meta(s, "dataset_identity");
    info->dataset_identity = xstrdup(identity ? identity : "");
    const char *opts = snapshot_meta(s, "options");
    info->options_json = xstrdup(opts ? opts : "{}");
    if (parse_classes(s, cfg->num_classes, &info->classes, err, errlen) != 0) goto fail;
    return s;
fail:
    snapshot_free(s);
    checkpoint_info_free(info);
    return NULL;
}

static int tensor_matches(const SnapTensor *t, const TensorInfo *ti, SnapDtype dtype) {
    if (t->dtype != dtype || t->ndim != ti->ndim) return 0;
    for (int d = 0; d < ti->ndim; d++)
        if (t->shape[d] != ti->shape[d]) return 0;
    return 1;
}

static void shape_str(int ndim, const int64_t *shape, char *buf, size_t buflen) {
    size_t off = (size_t)snprintf(buf, buflen, "[");
    for (int d = 0; d < ndim && off < buflen; d++)
        off += (size_t)snprintf(buf + off, buflen - off, "%s%" PRId64, d ? "," : "", shape[d]);
    if (off < buflen) snprintf(buf + off, buflen - off, "]");
}

/* NaN or infinite values: the weights of a diverged run, never usable. */
static int floats_refuse_non_finite(const char *name, const float *v, size_t n, char *err,
                                    size_t errlen) {
    size_t i = checkpoint_first_non_finite(v, n);
    if (i == n) return 0;
    snprintf(err, errlen, "tensor %s holds %s values (element %zu): the weights of a diverged run, "
             "not usable", name, isnan(v[i]) ? "NaN" : "infinite", i);
    return -1;
}

size_t checkpoint_first_non_finite(const float *v, size_t n) {
    for (size_t i = 0; i < n; i++)
        if (!isfinite(v[i])) return i;
    return n;
}

/* The tensors named prefix + each model tensor's name into params/buffers, every
 * one checked (the step counters too, which are not copied). 0, or -1 + reason. */
static int load_state_dict(const Snapshot *snap, const Model *m, const char *prefix, float *params,
                           float *buffers, char *err, size_t errlen) {
    for (int i = 0; i < m->n_tensors; i++) {
        const TensorInfo *ti = &m->tensors[i];
        char name[320];
        snprintf(name, sizeof name, "%s%s", prefix, ti->name);
        const SnapTensor *t = snapshot_tensor(snap, name);
        SnapDtype want = ti->kind == TENSOR_COUNTER ? SNAP_I64 : SNAP_F32;
        if (!t) {
            snprintf(err, errlen, "tensor %s is missing: the snapshot is of another model", name);
            return -1;
        }
        if (!tensor_matches(t, ti, want)) {
            char a[64], b[64];
            shape_str(t->ndim, t->shape, a, sizeof a);
            shape_str(ti->ndim, ti->shape, b, sizeof b);
            snprintf(err, errlen, "tensor %s has shape %s, the model needs %s (%s)", name, a, b,
                     want == SNAP_I64 ? "I64" : "F32");
            return -1;
        }
        if (ti->kind == TENSOR_COUNTER) continue;
        float *dst = (ti->kind == TENSOR_PARAM ? params : buffers) + ti->offset;
        memcpy(dst, t->data, ti->numel * sizeof(float));
        if (floats_refuse_non_finite(name, dst, ti->numel, err, errlen) != 0) return -1;
    }
    return 0;
}

/* Whether the snapshot has an average: its first tensor's name with the prefix. */
static int has_ema(const Snapshot *snap, const Model *m) {
    if (m->n_tensors == 0) return 0;
    char name[320];
    snprintf(name, sizeof name, EMA_PREFIX "%s", m->tensors[0].name);
    return snapshot_tensor(snap, name) != NULL;
}

int checkpoint_load_ema(const Snapshot *snap, const Model *m, float *params, float *buffers,
                        char *err, size_t errlen) {
    if (!has_ema(snap, m)) return 0;
    return load_state_dict(snap, m, EMA_PREFIX, params, buffers, err, errlen) == 0 ? 1 : -1;
}

int checkpoint_load_state(const Snapshot *snap, const Model *m, TrainState *st, char *err,
                          size_t errlen) {
    if (load_state_dict(snap, m, "", st->params, st->buffers, err, errlen) != 0) return -1;
    if (st->ema_params) {
        int rc = checkpoint_load_ema(snap, m, st->ema_params, st->ema_buffers, err, errlen);
        if (rc < 0) return -1;
        if (rc == 0) { /* a snapshot of a run without --ema: the average starts here */
            memcpy(st->ema_params, st->params, m->num_params * sizeof(float));
            memcpy(st->ema_buffers, st->buffers, m->num_buffers * sizeof(float));
        }
    }
    const SnapTensor *mom = snapshot_tensor(snap, MOMENTUM_TENSOR);
    if (mom) {
        if (mom->dtype != SNAP_F32 || mom->numel != m->num_params) {
            snprintf(err, errlen, "tensor %s has %zu elements, the model needs %zu", MOMENTUM_TENSOR,
                     mom->numel, m->num_params);
            return -1;
        }
        memcpy(st->momentum, mom->data, m->num_params * sizeof(float));
        if (floats_refuse_non_finite(MOMENTUM_TENSOR, st->momentum, m->num_params, err, errlen) != 0)
            return -1;
    } else {
        memset(st->momentum, 0, m->num_params * sizeof(float));
    }
    return 0;
}

void checkpoint_load_model(const char *path, int prefer_ema, CheckpointModel *out) {
    char err[512];
    memset(out, 0, sizeof *out);
    model_config_seed(&out->cfg);
    Snapshot *snap = checkpoint_open(path, &out->cfg, &out->info, err, sizeof err);
    if (!snap) die_permanent("%s: %s", path, err);
    if (model_build(&out->model, &out->cfg, err, sizeof err) != 0) die_permanent("%s: model: %s", path, err);
    train_state_alloc(&out->state, &out->model);
    out->ema = checkpoint_load_weights(snap, &out->model, &out->state, prefer_ema, err, sizeof err);
    if (out->ema < 0) die_permanent("%s: %s", path, err);
    snapshot_free(snap);
}

void checkpoint_model_free(CheckpointModel *m) {
    train_state_free(&m->state);
    model_free(&m->model);
    checkpoint_info_free(&m->info);
}

void checkpoint_best_path(const char *run_dir, char *buf, size_t buflen) {
    if (snprintf(buf, buflen, "%s/" CHECKPOINT_BEST_NAME, run_dir) >= (int)buflen)
        die_usage("%s: path too long", run_dir);
}

/* The newest snapshot of a run folder that opens, into buf: 0, or -1 when none does. */
static int newest_snapshot(const char *run_dir, char *buf, size_t buflen) {
    int count = 0, found = -1;
    char **paths = snapshot_list(run_dir, &count);
    for (int i = 0; i < count && found < 0; i++) {
        char err[512];
        ModelConfig cfg;
        CheckpointInfo info;
        model_config_seed(&cfg);
        Snapshot *s = checkpoint_open(paths[i], &cfg, &info, err, sizeof err);
        if (!s) {
            log_warn("%s: skipping this snapshot: %s", paths[i], err);
            continue;
        }
        snapshot_free(s);
        checkpoint_info_free(&info);
        snprintf(buf, buflen, "%s", paths[i]);
        found = 0;
    }
    snapshot_list_free(paths, count);
    return found;
}

void checkpoint_for_inference(const char *path, char *buf, size_t buflen) {
    if (!fs_is_dir(path)) {
        if (snprintf(buf, buflen, "%s", path) >= (int)buflen) die_usage("%s: path too long", path);
        return;
    }
    checkpoint_best_path(path, buf, buflen);
    if (fs_exists(buf)) return;
    if (newest_snapshot(path, buf, buflen) != 0)
        die_permanent("%s: a folder without %s or a snapshot that loads ---> HINT: give a snapshot "
                      "file, or the --run-dir of a cifar-train run", path, CHECKPOINT_BEST_NAME);
}

int checkpoint_load_weights(const Snapshot *snap, const Model *m, TrainState *st, int prefer_ema,
                            char *err, size_t errlen) {
    if (checkpoint_load_state(snap, m, st, err, errlen) != 0) return -1;
    if (!prefer_ema) return 0;
    return checkpoint_load_ema(snap, m, st->params, st->buffers, err, errlen);
}

/* ------------------------------------------------------------ resume choice */

/* The snapshot is of another model or dataset: both shapes, and stop. */
static void refuse_foreign_snapshot(const char *path, const CheckpointInfo *info, const Model *m,
                                    const char *dataset_shape) {
    char *mine = model_config_to_json(&m->cfg);
    die_permanent("%s: the snapshot is of another model or dataset: the snapshot has data %s and "
                  "model %s; this run has data %s and model %s ---> HINT: use another --run-dir, "
                  "or the same --model and data",
                  path, info->dataset_shape, info->model_json, dataset_shape, mine);
}

/* Same shape, other data (another identity): refused unless --fine-tune. A snapshot
 * without an identity (written before it was recorded) is resumed from. */
static void check_same_data(const char *path, const CheckpointInfo *info, const CheckpointData *data) {
    if (!info->dataset_identity[0] || !data->identity[0] ||
        strcmp(info->dataset_identity, data->identity) == 0)
        return;
    if (data->other_data_ok) {
        log_warn("%s: trained on other data (dataset identity %s, this run's %s): continuing on "
                 "this data (--fine-tune)", path, info->dataset_identity, data->identity);
        return;
    }
    die_permanent("%s: the snapshot was trained on other data of the same shape (dataset identity "
                  "%s, this run's data %s, %s) ---> HINT: use another --run-dir, the data it was "
                  "trained on, or --fine-tune to continue on this data on purpose",
                  path, info->dataset_identity, data->identity, info->dataset_path);
}

/* Load the snapshot at path into st and progress: 0, or -1 with a reason in err
 * (the file is unusable: truncated, corrupt, wrong tensors). A snapshot of
 * another model or dataset, or of a newer program, stops the run. */
static int resume_from(const char *path, const Model *m, const CheckpointData *data, TrainState *st,
                       TrainProgress *progress, CheckpointInfo *info_out, char *err, size_t errlen) {
    const char *dataset_shape = data->shape;
    ModelConfig cfg = m->cfg;
    CheckpointInfo info;
    Snapshot *s = checkpoint_open(path, &cfg, &info, err, errlen);
    /* A newer program's snapshot is good data we cannot read: retraining would
     * write over it under the same name. */
    if (!s && strstr(err, "newer version"))
        die_permanent("%s: %s ---> HINT: resume with the newer cifar-train, or use another --run-dir",
                      path, err);
    if (!s) return -1;
    if (!model_config_equal(&cfg, &m->cfg) || strcmp(info.dataset_shape, dataset_shape) != 0)
        refuse_foreign_snapshot(path, &info, m, dataset_shape);
    check_same_data(path, &info, data);
    int rc = checkpoint_load_state(s, m, st, err, errlen);
    if (rc == 0) *progress = info.progress;
    snapshot_free(s);
    if (rc == 0 && info_out) {
        checkpoint_info_free(info_out);
        *info_out = info;
    } else {
        checkpoint_info_free(&info);
    }
    return rc;
}

typedef struct {
    char *path;
    int64_t step; /* recorded inside the snapshot */
} Candidate;

static int candidate_newest_first(const void *a, const void *b) {
    int64_t x = ((const Candidate *)a)->step, y = ((const Candidate *)b)->step;
    return x < y ? 1 : x > y ? -1 : 0;
}

/* The run's readable snapshots by the progress recorded inside each, newest first
 * (a file's name is not trusted: a copied snapshot-1000000 says nothing). */
static Candidate *candidates_by_progress(const char *run_dir, int *count) {
    int n = 0;
    char **paths = snapshot_list(run_dir, &n);
    Candidate *c = xcalloc((size_t)n + 1, sizeof *c);
    *count = 0;
    for (int i = 0; i < n; i++) {
        char err[512];
        ModelConfig cfg;
        CheckpointInfo info;
        Snapshot *s = checkpoint_open(paths[i], &cfg, &info, err, sizeof err);
        if (!s && strstr(err, "newer version"))
            die_permanent("%s: %s ---> HINT: resume with the newer cifar-train, or use another "
                          "--run-dir", paths[i], err);
        if (!s) {
            log_warn("%s: skipping this snapshot: %s", paths[i], err);
            continue;
        }
        c[*count].path = xstrdup(paths[i]);
        c[*count].step = info.progress.step;
        (*count)++;
        snapshot_free(s);
        checkpoint_info_free(&info);
    }
    snapshot_list_free(paths, n);
    qsort(c, (size_t)*count, sizeof *c, candidate_newest_first);
    return c;
}

/* Rank 0: the snapshot with the most progress that loads (its path into chosen),
 * or -1. */
static int64_t choose_snapshot(const char *run_dir, const Model *m, const CheckpointData *data,
                               TrainState *st, TrainProgress *progress, CheckpointInfo *info,
                               char *chosen, size_t chosen_len) {
    fs_remove_stale_temps(run_dir);
    int count = 0;
    Candidate *c = candidates_by_progress(run_dir, &count);
    int64_t step = -1;
    for (int i = 0; i < count && step < 0; i++) {
        char err[512];
        if (resume_from(c[i].path, m, data, st, progress, info, err, sizeof err) == 0) {
            step = progress->step;
            snprintf(chosen, chosen_len, "%s", c[i].path);
        } else {
            log_warn_once("%s: skipping this snapshot: %s", c[i].path, err);
        }
    }
    for (int i = 0; i < count; i++) free(c[i].path);
    free(c);
    return step;
}

int checkpoint_resume(const char *run_dir, const Model *m, const CheckpointData *data, Comm *comm,
                      TrainState *st, TrainProgress *progress, char *chosen, size_t chosen_len,
                      CheckpointInfo *info) {
    if (info) memset(info, 0, sizeof *info);
    int64_t step = -1;
    char path[4096] = "";
    if (comm_rank(comm) == 0)
        step = choose_snapshot(run_dir, m, data, st, progress, info, path, sizeof path);
    comm_broadcast_host(comm, &step, sizeof step, 0);
    if (step < 0) return 0;
    comm_broadcast_host(comm, path, sizeof path, 0);
    if (comm_rank(comm) != 0) {
        char err[512];
        if (resume_from(path, m, data, st, progress, info, err, sizeof err) != 0)
            die("%s: %s (the snapshot rank 0 chose)", path, err);
    }
    snprintf(chosen, chosen_len, "%s", path);
    return 1;
}

/* ------------------------------------------------------------ run folder lock */

/* What the lock file says about its holder, for the refusal message. */
static void lock_holder(int fd, char *buf, size_t len) {
    ssize_t n = pread(fd, buf, len - 1, 0);
    if (n <= 0) {
        snprintf(buf, len, "holder unknown");
        return;
    }
    buf[n] = '\0';
    buf[strcspn(buf, "\n")] = '\0';
}

static void lock_record_holder(int fd, const char *path) {
    char host[256] = "?", line[512];
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    time_t now = time(NULL);
    struct tm tm;
    char when[32] = "?";
    if (gmtime_r(&now, &tm)) strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    int n = snprintf(line, sizeof line, "pid %d on host %s since %s\n", (int)getpid(), host, when);
    CHECK_STDIO(ftruncate(fd, 0) == 0, path);
    CHECK_STDIO(pwrite(fd, line, (size_t)n, 0) == n, path);
}

int run_dir_lock(const char *run_dir) {
    if (fs_mkdirs(run_dir, 0755) != 0)
        die("%s: cannot create the run folder: %s", run_dir, strerror(errno));
    char path[4096];
    snprintf(path, sizeof path, "%s/lock", run_dir);
    /* O_NOFOLLOW and a regular file only: the holder's line is written into it, and a
     * symlink or device planted as RUN/lock would have us truncate what it names. */
    int fd = open(path, O_RDWR | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0644);
    if (fd < 0 && errno == ELOOP)
        die("%s: a symlink, not a regular file: the run folder lock is not followed ---> HINT: "
            "remove it (someone planted it) or use another --run-dir", path);
    CHECK_STDIO(fd >= 0, path);
    struct stat st;
    CHECK_STDIO(fstat(fd, &st) == 0, path);
    if (!S_ISREG(st.st_mode))
        die("%s: not a regular file: the run folder lock is not used ---> HINT: remove it "
            "or use another --run-dir", path);
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        CHECK_STDIO(errno == EWOULDBLOCK, path);
        char holder[256];
        lock_holder(fd, holder, sizeof holder);
        die("%s: the run folder is in use by another cifar-train (%s) ---> HINT: wait for it to "
            "finish or stop it, or use another --run-dir",
            run_dir, holder);
    }
    lock_record_holder(fd, path);
    return fd;
}
