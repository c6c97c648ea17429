/* trainer.c: one worker's epoch loop: data in memory, the engine, the sampler,
 * the schedule, evaluation, metrics, snapshots and resume. */
#include <cjson/cJSON.h>
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <unistd.h>

#include "core/check.h"
#include "format/checkpoint.h"
#include "data/crc32c.h"
#include "format/input_kind.h"
#include "data/dataset.h"
#include "core/fsutil.h"
#include "core/omp_env.h"
#include "model/model.h"
#include "core/progress.h"
#include "data/sampler.h"
#include "format/safetensors.h"
#include "epoch_position.h"
#include "metrics.h"
#include "resume_options.h"
#include "snapshot_writer.h"
#include "format/tb_events.h"
#include "test_hooks.h"
#include "train.h"

volatile int g_train_stop_signal;
volatile int g_train_wait_stop;

static void on_stop_signal(int sig) {
    if (g_train_stop_signal) _exit(128 + sig); /* a second signal: stop now */
    g_train_stop_signal = sig;
    g_train_wait_stop = sig;
}

void train_install_signal_handlers(SignalSet set) { signal_set_install(set, on_stop_signal); }

/* ---- data ---- */

typedef struct {
    Dataset *ds;
    DatasetInfo info;
    HostSplit train, test; /* read in place from the dataset's map */
    /* What the engine evaluates: the test split's records, then the validation
     * hold-out's (n_val, 0 without --val-fraction). With a hold-out, train and eval
     * point into the map through the arrays below (owned). */
    HostSplit eval;
    int64_t n_val;
    uint32_t holdout_crc;  /* CRC-32C of the hold-out's marks (one byte per train record) */
    const uint8_t **train_records, **eval_records;
    int32_t *train_labels, *eval_labels;
    char identity[DATASET_IDENTITY_CHARS + 1]; /* of the metadata and both splits */
} TrainData;

static void train_data_load(TrainData *d, const char *path, int in_memory) {
    memset(d, 0, sizeof *d);
    input_kind_expect(path, INPUT_DATASET); /* the seed's layout: run cifar-prep first */
    char err[512];
    d->ds = dataset_open(path, err, sizeof err);
    if (!d->ds) die_permanent("%s: %s", path, err);
    dataset_prepare_for_job(d->ds, path);
    d->info = *dataset_info(d->ds);
    host_split_load(d->ds, path, "train", 1, in_memory, &d->train);
    host_split_load(d->ds, path, "test", 0, in_memory, &d->test);
    dataset_identity(d->ds, d->identity);
}

/* Record i of `from` appended to (records, labels) at *at. */
static void split_take(const HostSplit *from, int64_t i, size_t rec, const uint8_t **records,
                       int32_t *labels, int64_t *at) {
    records[*at] = host_split_record(from, i, rec);
    labels[(*at)++] = from->labels[i];
}

/* --val-fraction: the hold-out (sampler_holdout) leaves the train split, and the
 * evaluation split becomes test + hold-out. Without it eval is the test split. */
static void train_data_holdout(TrainData *d, const TrainOptions *o) {
    d->eval = d->test;
    if (o->val_fraction <= 0) return;
    const HostSplit full = d->train;
    const size_t rec = (size_t)d->info.height * d->info.width * d->info.channels;
    uint8_t *is_val = xmalloc((size_t)full.count);
    d->n_val = sampler_holdout(o->seed, full.labels, full.count, d->info.num_classes, o->val_fraction, is_val);
    const int64_t n_train = full.count - d->n_val, n_eval = d->test.count + d->n_val;
    if (d->n_val == 0 || n_train == 0)
        die_usage("--val-fraction %g holds out %s of the %" PRId64 " train images: give a %s fraction",
                  o->val_fraction, d->n_val ? "all" : "none", full.count, d->n_val ? "smaller" : "larger");
    d->train_records = xmalloc((size_t)n_train * sizeof *d->train_records);
    d->train_labels = xmalloc((size_t)n_train * sizeof *d->train_labels);
    d->eval_records = xmalloc((size_t)n_eval * sizeof *d->eval_records);
    d->eval_labels = xmalloc((size_t)n_eval * sizeof *d->eval_labels);
    int64_t t = 0, e = 0;
    d->holdout_crc = crc32c_extend(0, is_val, (size_t)full.count);
    for (int64_t i = 0; i < d->test.count; i++) split_take(&d->test, i, rec, d->eval_records, d->eval_labels, &e);
    for (int64_t i = 0; i < full.count; i++) {
        if (is_val[i])
            split_take(&full, i, rec, d->eval_records, d->eval_labels, &e);
        else
            split_take(&full, i, rec, d->train_records, d->train_labels, &t);
    }
    free(is_val);
    d->train = (HostSplit){.labels = d->train_labels, .count = n_train, .records = d->train_records};
    d->eval = (HostSplit){.labels = d->eval_labels, .count = n_eval, .records = d->eval_records};
}

/* Every rank must hold out the same records (it does when they read the same
 * data with the same options); ranks that read other copies of the dataset, or
 * were given other options, would validate on images others train on. */
static void holdout_agree(const TrainData *d, Comm *comm, int rank) {
    if (d->n_val == 0) return;
    uint32_t root = d->holdout_crc;
    comm_broadcast_host(comm, &root, sizeof root, 0);
    if (root != d->holdout_crc)
        die_permanent("rank %d: its validation hold-out differs from rank 0's ---> HINT: every rank "
                      "must read the same dataset file with the same --val-fraction and --seed", rank);
}

/* The splits' arrays belong to the dataset; the hold-out's to d. */
static void train_data_free(TrainData *d) {
    free(d->train_records);
    free(d->train_labels);
    free(d->eval_records);
    free(d->eval_labels);
    dataset_close(d->ds);
}

/* ---- model and normalisation ---- */

static void build_model(Model *m, const TrainOptions *o, const DatasetInfo *info) {
    ModelConfig cfg;
    model_config_seed(&cfg);
    if (o->model_file) {
        size_t len;
        char *text = fs_read_file(o->model_file, 1 << 20, &len);
        if (!text) die_permanent("%s: cannot read the model file: %s", o->model_file, strerror(errno));
        char err[256];
        if (model_config_parse_json(text, &cfg, err, sizeof err) != 0)
            die_permanent("%s: %s", o->model_file, err);
        free(text);
    }
    cfg.img_channels = info->channels;
    cfg.img_height = info->height;
    cfg.img_width = info->width;
    cfg.num_classes = info->num_classes;
    char err[256];
    if (model_build(m, &cfg, err, sizeof err) != 0) die_permanent("model: %s", err);
}

static void normalisation(const TrainOptions *o, const DatasetInfo *info, float *mean, float *std) {
    static const float imagenet_mean[3] = {0.485f, 0.456f, 0.406f};
    static const float imagenet_std[3] = {0.229f, 0.224f, 0.225f};
    const DatasetSplit *train = NULL;
    for (int i = 0; i < info->n_splits; i++)
        if (strcmp(info->splits[i].name, "train") == 0) train = &info->splits[i];
    for (int c = 0; c < 4; c++) {
        mean[c] = 0.0f;
        std[c] = 1.0f;
    }
    if (o->normalize == NORMALIZE_IMAGENET) {
        if (info->channels != 3) die_usage("--normalize imagenet needs RGB images, the data has %d channel(s)", info->channels);
        memcpy(mean, imagenet_mean, sizeof imagenet_mean);
        memcpy(std, imagenet_std, sizeof imagenet_std);
        return;
    }
    for (int c = 0; c < info->channels; c++) {
        mean[c] = train->mean[c];
        std[c] = train->std[c] > 1e-6f ? train->std[c] : 1.0f;
    }
}

/* ---- the worker ---- */

typedef struct {
    const TrainOptions *o;
    const DistEnv *env;
    TrainData data;
    Model model;
    Engine *engine;
    Comm *comm;
    TrainState state;
    TrainProgress progress;
    float mean[4], std[4];
    char *options_json;
    int64_t *perm, *mine;
    int64_t steps_per_epoch; /* of an epoch at this world size */
    /* the epoch in progress: this process's segment of it (from a resume's position or
     * 0), its samples per rank, and the epoch's steps (those before the segment too) */
    EpochSegment segment;
    int64_t per_rank, epoch_steps;
    const TestHooks *hooks; /* NULL: none (always in the shipped build: test_hooks.h) */
    /* snapshots: the writer thread, the job it is given (rank 0) */
    SnapshotWriter *writer;
    TrainState staging;        /* host copy for engines without state_stage */
    char snapshot_path[4096];  /* the job's file */
    CheckpointInfo snapshot_info;
    char *dataset_abs;         /* the data path recorded in snapshots */
    double last_snapshot_time; /* when the last snapshot was staged (snapshot_clock) */
    /* stragglers: this rank's step time outside collectives this epoch; on rank 0,
     * per rank, the epochs running it was more than 20% slower than the median */
    double compute_seconds;
    int *slow_epochs;
    TbWriter *tb; /* rank 0: RUN_DIR/tb's event file */
    double run_t0;        /* when this process began to train, and the step then: */
    int64_t run_step0;    /* the whole run's ETA is measured from there */
} Worker;

/* ---- TensorBoard (rank 0) ---- */

/* Events after the resumed step are dropped (they are redone), then this
 * process's event file is opened. */
static void tb_start(Worker *w) {
    char err[4400];
    w->tb = tb_open(w->o->run_dir, w->progress.step, err, sizeof err);
    if (!w->tb) die("%s ---> HINT: the run folder must be writable", err);
}

static void tb_put(Worker *w, const char *tag, int64_t step, double value) {
    char err[4400];
    if (tb_scalar(w->tb, tag, step, value, err, sizeof err) != 0) die("%s", err);
}

static void tb_sync(Worker *w) {
    char err[4400];
    if (w->tb && tb_flush(w->tb, err, sizeof err) != 0) die("%s", err);
}

/* Every --log-every steps: the step's loss (rank 0's batch) and learning rate. */
static void tb_step(Worker *w, float loss, float lr) {
    if (!w->tb || w->progress.step % w->o->log_every != 0) return;
    tb_put(w, "train/loss", w->progress.step, loss);
    tb_put(w, "train/lr", w->progress.step, lr);
}

static int64_t steps_per_epoch(const Worker *w) {
    int64_t per_rank = sampler_per_rank(w->data.train.count, w->env->world_size);
    return (per_rank + w->o->batch_size - 1) / w->o->batch_size;
}

/* A snapshot must never hold NaN or infinite weights: the previous one is kept.
 * 0, or -1 with the reason in err. */
static int refuse_non_finite(const Worker *w, const TrainState *st, char *err, size_t errlen) {
    const float *bufs[2] = {st->params, st->buffers};
    size_t counts[2] = {w->model.num_params, w->model.num_buffers};
    for (int b = 0; b < 2; b++)
        for (size_t i = 0; i < counts[b]; i++)
            if (!isfinite(bufs[b][i])) {
                snprintf(err, errlen, "the weights became %s at step %" PRId64 ": no snapshot written "
                         "---> HINT: lower --lr; the last good snapshot is kept",
                         isnan(bufs[b][i]) ? "NaN" : "infinite", w->snapshot_info.progress.step);
                return -1;
            }
    return 0;
}

/* The clock of --save-interval: seconds, or on rank 0 of the test build the hooks'
 * seconds per step (a clock that decides the same steps on any machine). */
static double snapshot_clock(const Worker *w) {
    double step_seconds = w->hooks ? test_hooks_step_seconds(w->hooks) : 0;
    if (step_seconds > 0 && w->env->rank == 0) return (double)w->progress.step * step_seconds;
    return now_seconds();
}

/* The writer thread's job: the staged state to w->snapshot_path, through the
 * same checkpoint_write as every snapshot, then the old ones pruned. */
static int snapshot_job(void *arg, char *err, size_t errlen) {
    Worker *w = arg;
    TrainState st = w->staging;
    if (w->engine->ops->state_staged)
        w->engine->ops->state_staged(w->engine, (const float **)&st.params,
                                     (const float **)&st.buffers, (const float **)&st.momentum);
    if (refuse_non_finite(w, &st, err, errlen) != 0) return SNAPSHOT_JOB_PERMANENT;
    char why[512];
    if (checkpoint_write(w->snapshot_path, &w->model, &st, &w->snapshot_info, why, sizeof why) != 0) {
        snprintf(err, errlen, "%s: cannot write the snapshot: %s", w->snapshot_path, why);
        return SNAPSHOT_JOB_FAILED;
    }
    snapshot_prune(w->o->run_dir, w->o->keep, w->snapshot_info.progress.step);
    return 0;
}

/* Every rank, at a step boundary all of them agreed on: BN statistics from rank 0
 * (what every snapshot holds); rank 0 then copies the state to the staging memory
 * (on the GPU an asynchronous copy ordered after the step) and hands it to the
 * writer thread, which writes it to path while training goes on. The previous
 * write is waited for first (callers skip optional snapshots while one is in flight). */
static void snapshot_start_at(Worker *w, const char *path) {
    w->engine->ops->broadcast_buffers(w->engine, 0);
    w->last_snapshot_time = snapshot_clock(w);
    if (w->env->rank != 0) return;
    snapshot_writer_wait(w->writer);
    if (w->engine->ops->state_stage)
        w->engine->ops->state_stage(w->engine);
    else
        w->engine->ops->state_to_host(w->engine, w->staging.params, w->staging.buffers,
                                      w->staging.momentum);
    /* the moving average: a synchronous copy to the host (it is not staged) */
    if (w->staging.ema_params)
        w->engine->ops->ema_to_host(w->engine, w->staging.ema_params, w->staging.ema_buffers);
    epoch_position_snapshot(&w->progress, &w->segment, w->env->world_size, w->o->batch_size,
                            w->data.train.count, &w->snapshot_info.progress);
    snprintf(w->snapshot_path, sizeof w->snapshot_path, "%s", path);
    snapshot_writer_start(w->writer, snapshot_job, w);
}

/* The snapshot of this step: RUN_DIR/snapshot-STEP.safetensors. */
static void snapshot_start(Worker *w) {
    char path[sizeof w->snapshot_path];
    snapshot_path_for(w->o->run_dir, w->progress.step, path, sizeof path);
    snapshot_start_at(w, path);
}

/* A snapshot that must be on disk before going on (the last one, a stop): its
 * path into path_out on rank 0. */
static void write_snapshot(Worker *w, char *path_out, size_t path_len) {
    snapshot_start(w);
    if (w->env->rank != 0) return;
    snapshot_writer_wait(w->writer);
    snprintf(path_out, path_len, "%s", w->snapshot_path);
}

/* RUN_DIR/best.safetensors, in the background like any snapshot: never pruned
 * (snapshot_list does not list it). */
static void write_best(Worker *w) {
    char path[sizeof w->snapshot_path];
    checkpoint_best_path(w->o->run_dir, path, sizeof path);
    snapshot_start_at(w, path);
}

/* --early-stop: N epochs done since the best validation accuracy. */
static int early_stop_due(const Worker *w) {
    return w->o->early_stop > 0 && w->progress.best_epoch > 0 &&
           w->progress.epochs - w->progress.best_epoch >= w->o->early_stop;
}

/* Rank 0: is a snapshot by time (--save-interval) due now? Not while the previous
 * one is still being written: it is then taken at the first agreed step after that
 * write (waiting would stall training for the rest of the write). */
static int snapshot_due_by_time(Worker *w) {
    if (w->env->rank != 0) return 0;
    snapshot_writer_poll(w->writer); /* a failed background write stops the run here */
    return w->o->save_interval > 0 &&
           snapshot_clock(w) - w->last_snapshot_time >= w->o->save_interval &&
           !snapshot_writer_busy(w->writer);
}

/* --save-every-steps: at every multiple of N, on every rank alike (the step count
 * decides, no agreement needed). A write still in flight is waited for: the user
 * asked for these very steps. */
static int snapshot_due_by_steps(const Worker *w) {
    return w->o->save_every_steps > 0 && w->progress.step % w->o->save_every_steps == 0;
}

/* A snapshot taken within an epoch: continue it from its position (another world
 * size gets the rest of the epoch dealt to its ranks), or redo it when its order
 * of samples changed. */
static void resume_partial_epoch(Worker *w, int order_changed) {
    const int snap_world = w->progress.world_size, world = w->env->world_size;
    const int64_t n = w->data.train.count;
    EpochResume how = epoch_position_resume(&w->progress, &w->segment, w->env->rank, world,
                                            w->o->batch_size, n, order_changed);
    if (how == EPOCH_RESUME_RESTART)
        log_warn_once("resuming a partial epoch with another batch size, seed, --val-fraction or "
                      "data: the epoch restarts from its beginning");
    if (how == EPOCH_RESUME_RESHARD)
        log_info_once("resuming a partial epoch at image %" PRId64 " of %" PRId64 " with %d process%s "
                      "(the snapshot's had %d): the %" PRId64 " images left are dealt to them, each "
                      "once; the global batch is now %d x %d", w->progress.epoch_position, n, world,
                      world == 1 ? "" : "es", snap_world, n - w->progress.epoch_position,
                      w->o->batch_size, world);
}

static void resume_or_init(Worker *w) {
    char shape[64];
    checkpoint_dataset_shape(&w->model.cfg, shape, sizeof shape);
    char resumed_from[4096];
    CheckpointData data = {shape, w->data.identity, w->o->fine_tune};
    CheckpointInfo snap;
    int resumed = checkpoint_resume(w->o->run_dir, &w->model, &data, w->comm, &w->state, &w->progress,
                                    resumed_from, sizeof resumed_from, &snap);
    /* the snapshot's options and this run's, to compare */
    cJSON *was = resumed ? cJSON_Parse(snap.options_json ? snap.options_json : "{}") : NULL;
    cJSON *now = cJSON_Parse(w->options_json);
    if (resumed && w->env->rank == 0)
        resume_report_changed_options(snap.dataset_path, w->o->data_path, was, now);
    if (!resumed) {
        memset(&w->progress, 0, sizeof w->progress);
        model_init(&w->model, w->state.params, w->state.buffers, w->o->seed);
        memset(w->state.momentum, 0, w->model.num_params * sizeof(float));
        if (w->state.ema_params) { /* the average starts from the initial weights, as timm's */
            memcpy(w->state.ema_params, w->state.params, w->model.num_params * sizeof(float));
            memcpy(w->state.ema_buffers, w->state.buffers, w->model.num_buffers * sizeof(float));
        }
    } else {
        resume_partial_epoch(w, resume_order_changed(was, now));
    }
    cJSON_Delete(was);
    cJSON_Delete(now);
    checkpoint_info_free(&snap);
    w->engine->ops->state_from_host(w->engine, w->state.params, w->state.buffers, w->state.momentum);
    if (w->state.ema_params)
        w->engine->ops->ema_from_host(w->engine, w->state.ema_params, w->state.ema_buffers);
    if (w->env->rank == 0) {
        if (resumed)
            log_info_once("resuming from %s: %" PRId64 " epochs done, step %" PRId64, resumed_from,
                          w->progress.epochs, w->progress.step);
        metrics_truncate(w->o->run_dir, w->progress.epochs);
        tb_start(w);
    }
}

/* This rank's next evaluation batch into idx: images first + *next, first + *next +
 * world, ... (*next below n), at most b of them. Returns how many (0 when none is left). */
static int eval_batch_fill(int64_t *idx, int b, int64_t first, int64_t *next, int64_t n, int world) {
    int k = 0;
    for (; k < b && *next < n; k++, *next += world) idx[k] = first + *next;
    return k;
}

/* Loss and accuracy over images [first, first + n) of the evaluation split (the
 * test split, then the validation hold-out). */
static void evaluate(Worker *w, int64_t first, int64_t n, double *loss, double *acc) {
    *loss = *acc = 0;
    if (n == 0) return;
    const int world = w->env->world_size, rank = w->env->rank, b = w->o->batch_size;
    /* Every image exactly once: rank r takes r, r+W, ... (no padding). Batch
     * i+1 is named to the engine (prefetch) before batch i runs. */
    int64_t *idx[2] = {xmalloc((size_t)b * sizeof(int64_t)), xmalloc((size_t)b * sizeof(int64_t))};
    double sums[2] = {0, 0};
    int64_t hits = 0, next = rank;
    int k = eval_batch_fill(idx[0], b, first, &next, n, world);
    for (int cur = 0; k > 0; cur ^= 1) {
        int k_next = eval_batch_fill(idx[cur ^ 1], b, first, &next, n, world);
        if (k_next > 0) engine_prefetch(w->engine, idx[cur ^ 1], k_next, 0);
        w->engine->ops->eval_batch(w->engine, idx[cur], k, &sums[0], &hits, NULL, NULL);
        k = k_next;
    }
    sums[1] = (double)hits;
    comm_allreduce_sum_f64(w->comm, sums, 2);
    *loss = sums[0] / (double)n;
    *acc = sums[1] / (double)n;
    free(idx[0]);
    free(idx[1]);
}

typedef enum { GO_ON, GO_SNAPSHOT, GO_STOP } StepDecision;

/* All ranks agree, at the same step, whether to stop (a signal reaches them at
 * different steps) and whether to take a snapshot (rank 0's clock and writer
 * decide): one small all-reduce, every step (every 16th on NCCL, where a host
 * round trip costs more than a step). */
static StepDecision agree_next(Worker *w, int64_t step) {
    if (w->env->world_size > 1 && comm_kind(w->comm) == COMM_NCCL && step % 16 != 0) return GO_ON;
    double flags[2] = {g_train_stop_signal ? 1.0 : 0.0, snapshot_due_by_time(w) ? 1.0 : 0.0};
    if (w->env->world_size > 1) comm_allreduce_sum_f64(w->comm, flags, 2);
    return flags[0] > 0 ? GO_STOP : flags[1] > 0 ? GO_SNAPSHOT : GO_ON;
}

static void run_test_hooks(Worker *w) {
    if (!w->hooks) return; /* the shipped build */
    TestHookPoint at = {w->engine, &w->state, w->model.num_params, w->progress.step, w->env->rank,
                        w->env->restart_count};
    test_hooks_after_step(w->hooks, &at);
}

typedef enum { EPOCH_DONE, EPOCH_STOPPED } EpochResult;

/* Images in step s of an epoch on this rank (the last one may be short). */
static int step_images(const Worker *w, int64_t s) {
    int64_t first = s * w->o->batch_size;
    return (int)(w->per_rank - first < w->o->batch_size ? w->per_rank - first : w->o->batch_size);
}

/* "run ETA 1:23:45": the steps left to --epochs at this process's pace so far
 * (evaluations included, since the pace is measured in wall time). */
static void run_eta_str(const Worker *w, char *buf, size_t len) {
    int64_t done = w->progress.step - w->run_step0;
    int64_t left = (w->epoch_steps - w->progress.step_in_epoch) +
                   ((int64_t)w->o->epochs - w->progress.epochs - 1) * w->steps_per_epoch;
    double elapsed = now_seconds() - w->run_t0;
    char eta[32];
    progress_format_duration(done > 0 && elapsed > 0 ? (double)left * elapsed / (double)done : -1,
                             eta, sizeof eta);
    snprintf(buf, len, "run ETA %s", left > 0 ? eta : "0:00");
}

/* This process's samples of the epoch: dealt from the segment's start (0, or where a
 * resume found the epoch) to this world size; the epoch's step count with them. */
static void deal_segment(Worker *w, int64_t epoch) {
    const int64_t n = w->data.train.count;
    const int world = w->env->world_size;
    if (w->progress.step_in_epoch == 0) epoch_position_begin(&w->progress, &w->segment, world);
    sampler_epoch_from(w->o->seed, epoch, n, w->segment.start, w->env->rank, world, w->perm, w->mine);
    w->per_rank = sampler_per_rank_from(n, w->segment.start, world);
    w->epoch_steps = w->segment.step0 + (w->per_rank + w->o->batch_size - 1) / w->o->batch_size;
}

static EpochResult run_epoch(Worker *w, int64_t epoch, double *lr_out) {
    const TrainOptions *o = w->o;
    const int world = w->env->world_size;
    deal_segment(w, epoch);
    const int64_t seg_steps = w->epoch_steps - w->segment.step0, at0 = w->segment.start;
    Progress bar;
    char label[64];
    snprintf(label, sizeof label, "epoch %" PRId64 "/%d", epoch + 1, o->epochs);
    progress_begin(&bar, label, at0 + w->per_rank * world, "img");
    w->compute_seconds = 0;
    double t0 = now_seconds() - w->progress.partial_seconds;
    const LrSchedule sched = train_lr_schedule(o);
    /* s counts the segment's steps, e = segment.step0 + s the epoch's */
    for (int64_t s = w->progress.step_in_epoch - w->segment.step0; s < seg_steps; s++) {
        const int64_t e = w->segment.step0 + s;
        int64_t first = s * o->batch_size;
        int n = step_images(w, s);
        /* the engine may gather step s+1's samples while step s runs */
        if (s + 1 < seg_steps)
            engine_prefetch(w->engine, w->mine + (s + 1) * o->batch_size, step_images(w, s + 1), 1);
        double pos = (double)epoch + (double)(e + 1) / (double)w->epoch_steps;
        float lr = (float)lr_schedule_at(&sched, pos);
        int correct = 0;
        double t_step = now_seconds(), in_collectives = comm_seconds_in_collectives(w->comm);
        float loss = w->engine->ops->train_step(w->engine, w->mine + first, n, epoch,
                                                w->progress.step, lr, &correct);
        if (!isfinite(loss))
            die_permanent("the loss became %s at epoch %" PRId64 " step %" PRId64
                " ---> HINT: lower --lr; the last good snapshot is kept",
                isnan(loss) ? "NaN" : "infinite", epoch + 1, e);
        w->progress.step++;
        w->progress.step_in_epoch = e + 1;
        w->progress.partial_loss_sum += (double)loss * n;
        w->progress.partial_correct += correct;
        w->progress.partial_seen += n;
        *lr_out = lr;
        tb_step(w, loss, lr);
        run_test_hooks(w);
        if (w->env->rank == 0 && !o->quiet) {
            char extra[96], run_eta[48];
            run_eta_str(w, run_eta, sizeof run_eta);
            snprintf(extra, sizeof extra, "loss %.4f lr %.4f, %s", loss, lr, run_eta);
            progress_update(&bar, at0 + (first + n) * world, extra);
        }
        comm_board_step(w->comm, w->progress.step);
        if (s + 1 < seg_steps) {
            StepDecision next = agree_next(w, w->progress.step);
            w->progress.partial_seconds = now_seconds() - t0;
            if (next == GO_STOP) return EPOCH_STOPPED;
            if (next == GO_SNAPSHOT || snapshot_due_by_steps(w)) snapshot_start(w);
        }
        w->compute_seconds += now_seconds() - t_step -
                              (comm_seconds_in_collectives(w->comm) - in_collectives);
    }
    w->progress.partial_seconds = now_seconds() - t0;
    if (w->env->rank == 0 && !o->quiet) {
        char run_eta[48];
        run_eta_str(w, run_eta, sizeof run_eta);
        progress_end(&bar, run_eta);
    }
    return EPOCH_DONE;
}

static int compare_doubles(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* The lower median: with two ranks, the faster one. */
static double median_of(const double *v, int n) {
    double *sorted = xmalloc((size_t)n * sizeof *sorted);
    memcpy(sorted, v, (size_t)n * sizeof *sorted);
    qsort(sorted, (size_t)n, sizeof *sorted, compare_doubles);
    double m = sorted[(n - 1) / 2];
    free(sorted);
    return m;
}

/* Rank 0: a rank more than 20% slower than the median for two epochs running is
 * named (one epoch could be a hiccup: a page-cache miss, another job's burst). */
static void stragglers_report(Worker *w, const double *rank_seconds) {
    int world = w->env->world_size;
    if (world < 2) return;
    double median = median_of(rank_seconds, world);
    for (int r = 0; r < world; r++) {
        int slow = median > 0 && rank_seconds[r] > 1.2 * median;
        w->slow_epochs[r] = slow ? w->slow_epochs[r] + 1 : 0;
        if (w->slow_epochs[r] >= 2)
            log_warn_once("straggler: rank %d's steps took %.2f s of compute this epoch, %.0f%% more "
                          "than the median rank's %.2f s, for %d epochs running ---> HINT: every rank "
                          "waits for it in each all-reduce; look at that rank's host (other jobs, "
                          "thermal throttling, a slower device)",
                          r, rank_seconds[r], 100 * (rank_seconds[r] / median - 1), median,
                          w->slow_epochs[r]);
    }
}

static int slowest_of(const double *v, int n) {
    int k = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[k]) k = i;
    return k;
}

/* An epoch's metrics.jsonl numbers as TensorBoard scalars "epoch/<field>" (val_loss
 * and val_acc with a hold-out), at the step that ends it, then the file synced. */
static void tb_epoch(Worker *w, const EpochMetrics *m) {
    const int64_t step = w->progress.step;
    const struct {
        const char *tag;
        double value;
    } scalars[] = {
        {"epoch/train_loss", m->train_loss}, {"epoch/train_acc", m->train_acc},
        {"epoch/test_loss", m->test_loss},   {"epoch/test_acc", m->test_acc},
        {"epoch/lr", m->lr},                 {"epoch/images_per_s", m->images_per_s},
        {"epoch/seconds", m->seconds},       {"epoch/epoch", (double)m->epoch},
        {"epoch/world_size", m->world_size}, {"epoch/restarts", m->restarts},
    };
    for (size_t i = 0; i < sizeof scalars / sizeof scalars[0]; i++)
        tb_put(w, scalars[i].tag, step, scalars[i].value);
    if (m->has_val) {
        tb_put(w, "epoch/val_loss", step, m->val_loss);
        tb_put(w, "epoch/val_acc", step, m->val_acc);
    }
    tb_sync(w);
}

/* Returns 1 when the epoch's validation accuracy is the best so far (always 0
 * without a hold-out); the first epoch is the first best. */
static int finish_epoch(Worker *w, int64_t epoch, double lr) {
    double sums[3];
    epoch_position_sums(&w->progress, &w->segment, sums);
    comm_allreduce_sum_f64(w->comm, sums, 3);
    EpochMetrics m;
    memset(&m, 0, sizeof m);
    m.epoch = epoch + 1;
    m.train_loss = sums[2] > 0 ? sums[0] / sums[2] : 0;
    m.train_acc = sums[2] > 0 ? sums[1] / sums[2] : 0;
    m.seconds = w->progress.partial_seconds;
    m.images_per_s = m.seconds > 0 ? sums[2] / m.seconds : 0;
    m.lr = lr;
    w->engine->ops->broadcast_buffers(w->engine, 0);
    evaluate(w, 0, w->data.test.count, &m.test_loss, &m.test_acc);
    m.has_val = w->data.n_val > 0;
    if (m.has_val) evaluate(w, w->data.test.count, w->data.n_val, &m.val_loss, &m.val_acc);
    /* val_acc is the same double on every rank (all-reduced): so is this choice */
    int best = m.has_val && (w->progress.best_epoch == 0 || m.val_acc > w->progress.best_val_acc);
    if (best) {
        w->progress.best_val_acc = m.val_acc;
        w->progress.best_epoch = epoch + 1;
    }
    int world = w->env->world_size;
    double *rank_seconds = xcalloc((size_t)world, sizeof *rank_seconds);
    rank_seconds[w->env->rank] = w->compute_seconds;
    comm_allreduce_sum_f64(w->comm, rank_seconds, (size_t)world);
    m.rank_seconds = rank_seconds;
    m.slowest_rank = slowest_of(rank_seconds, world);
    m.world_size = world;
    int worlds[CHECKPOINT_MAX_EPOCH_WORLDS];
    m.n_world_sizes = w->progress.n_epoch_worlds;
    memcpy(worlds, w->progress.epoch_worlds, sizeof worlds);
    m.world_sizes = worlds;
    m.images = sums[2];
    m.restarts = w->env->restart_count;
    m.device = w->engine->ops->name;
    m.comm = comm_kind_name(comm_kind(w->comm));
    w->progress.epochs = epoch + 1;
    epoch_position_end(&w->progress, &w->segment);
    if (w->env->rank == 0) {
        metrics_append(w->o->run_dir, &m);
        stragglers_report(w, rank_seconds);
        tb_epoch(w, &m);
        char val[96] = "";
        if (m.has_val)
            snprintf(val, sizeof val, " | val loss %.4f acc %.2f%%%s", m.val_loss, 100 * m.val_acc,
                     best ? " (best)" : "");
        log_info_once("epoch %" PRId64 "/%d: train loss %.4f acc %.2f%% | test loss %.4f acc "
                      "%.2f%%%s | %.0f img/s, %.1f s",
                      m.epoch, w->o->epochs, m.train_loss, 100 * m.train_acc, m.test_loss,
                      100 * m.test_acc, val, m.images_per_s, m.seconds);
    }
    free(rank_seconds);
    return best;
}

/* Rank 0, after a stop by signal: what was kept and what to do next (stderr only). */
static void report_stopped(const Worker *w, const char *path) {
    char where[96];
    if (w->progress.step_in_epoch > 0)
        snprintf(where, sizeof where, "in epoch %" PRId64 "/%d (step %" PRId64 " of %" PRId64 ")",
                 w->progress.epochs + 1, w->o->epochs, w->progress.step_in_epoch, w->epoch_steps);
    else
        snprintf(where, sizeof where, "after epoch %" PRId64 "/%d", w->progress.epochs, w->o->epochs);
    log_warn_once("stopped by signal %d %s: snapshot %s written; the run is not finished, so no "
                  "snapshot path goes to stdout ---> HINT: rerun the same command to resume",
                  g_train_stop_signal ? g_train_stop_signal : SIGTERM, where, path);
}

/* Rank 0, when the run had already reached --epochs: say what is, truthfully. */
static void report_nothing_to_do(const Worker *w) {
    const TrainProgress *p = &w->progress;
    if (p->epochs == w->o->epochs && p->step_in_epoch == 0)
        log_info_once("already trained for %d epochs (--epochs %d): nothing to do", w->o->epochs,
                      w->o->epochs);
    else
        log_info_once("already trained for %" PRId64 " epochs%s, more than --epochs %d asks: nothing "
                      "to do ---> HINT: a larger --epochs continues the run; a fresh --run-dir trains "
                      "%d from the start",
                      p->epochs, p->step_in_epoch > 0 ? " and part of the next" : "", w->o->epochs,
                      w->o->epochs);
}

static void worker_setup(Worker *w, const TrainOptions *o, const DistEnv *env) {
    memset(w, 0, sizeof *w);
    w->o = o;
    w->env = env;
    Settings settings;
    settings_from_env(&settings); /* every CIFAR_* tuning variable, here only */
    train_data_load(&w->data, o->data_path, settings.data_in_memory);
    train_data_holdout(&w->data, o);
    if (env->rank == 0 && w->data.n_val)
        log_info_once("validation: %" PRId64 " of the %" PRId64 " train images held out "
                      "(--val-fraction %g, by class, seed %" PRIu64 ")", w->data.n_val,
                      w->data.n_val + w->data.train.count, o->val_fraction, o->seed);
    build_model(&w->model, o, &w->data.info);
    normalisation(o, &w->data.info, w->mean, w->std);
    EngineConfig ec;
    memset(&ec, 0, sizeof ec);
    ec.model = &w->model;
    ec.train = w->data.train;
    ec.test = w->data.eval;
    memcpy(ec.mean, w->mean, sizeof ec.mean);
    memcpy(ec.std, w->std, sizeof ec.std);
    ec.pad = o->crop ? o->crop_padding : 0;
    ec.flip = o->flip;
    ec.cutout = o->cutout;
    ec.max_batch = o->batch_size;
    ec.seed = o->seed;
    ec.label_smoothing = (float)o->label_smoothing;
    ec.momentum = (float)o->momentum;
    ec.weight_decay = (float)o->weight_decay;
    ec.nesterov = o->nesterov;
    ec.ema_decay = (float)o->ema_decay;
    ec.ema_warmup = o->ema_warmup;
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    int local = env->local_world_size > 0 ? env->local_world_size : 1;
    ec.threads = o->threads > 0 ? o->threads : (int)(cores / local > 0 ? cores / local : 1);
    ec.precision = o->precision;
    ec.deterministic = o->deterministic;
    ec.settings = settings;
    w->engine = device_engine_create(o->device, &ec, env->local_rank, env->local_world_size,
                                     env->rank == 0);
    w->comm = device_comm_create(w->engine, env, o->comm);
    holdout_agree(&w->data, w->comm, env->rank);
    comm_board_open(w->comm, o->run_dir, env->run_id);
    w->slow_epochs = xcalloc((size_t)env->world_size, sizeof *w->slow_epochs);
    if (env->local_rank == 0 && strcmp(w->engine->ops->name, "cpu") == 0)
        threads_warn_oversubscribed(local, ec.threads);
    train_state_alloc(&w->state, &w->model);
    if (o->ema_decay > 0) train_state_alloc_ema(&w->state, &w->model);
    w->options_json = train_options_to_json(o);
    w->perm = xmalloc((size_t)w->data.train.count * sizeof(int64_t));
    w->mine = xmalloc((size_t)sampler_per_rank(w->data.train.count, env->world_size) * sizeof(int64_t));
    w->steps_per_epoch = steps_per_epoch(w);
    w->hooks = test_hooks_from_env();
    w->writer = snapshot_writer_create();
    if (!w->engine->ops->state_stage) train_state_alloc(&w->staging, &w->model);
    if (o->ema_decay > 0) train_state_alloc_ema(&w->staging, &w->model);
    /* Absolute, so cifar-eval finds the data from any folder. */
    w->dataset_abs = realpath(o->data_path, NULL);
    CheckpointInfo *info = &w->snapshot_info;
    info->dataset_path = w->dataset_abs ? w->dataset_abs : (char *)o->data_path;
    memcpy(info->mean, w->mean, sizeof info->mean);
    memcpy(info->std, w->std, sizeof info->std);
    info->options_json = w->options_json;
    info->classes = w->data.info.classes; /* the dataset's: not freed here */
    info->dataset_identity = w->data.identity;
}

static void worker_free(Worker *w) {
    tb_sync(w);
    tb_close(w->tb);
    snapshot_writer_free(w->writer); /* before the engine: a job reads its staging */
    train_state_free(&w->staging); /* what was allocated of it */
    free(w->dataset_abs);
    free(w->slow_epochs);
    w->engine->ops->destroy(w->engine);
    comm_destroy(w->comm);
    train_state_free(&w->state);
    model_free(&w->model);
    train_data_free(&w->data);
    free(w->options_json);
    free(w->perm);
    free(w->mine);
}

int train_worker(const TrainOptions *o, const DistEnv *env, int locked) {
    /* one line per job for what every rank would say, unless each rank has its own log */
    if (!getenv(LOG_EVERY_RANK_VAR)) log_set_rank(env->rank, env->world_size);
    /* First, before anything is read or removed in the folder. */
    int lock_fd = env->rank == 0 && !locked ? run_dir_lock(o->run_dir) : -1;
    Worker w;
    worker_setup(&w, o, env);
    resume_or_init(&w);
    char path[4096] = "";
    if (w.env->rank == 0) {
        log_info_once("training %s: %d epochs from %" PRId64 ", %" PRId64 " images, %d process%s x "
                      "batch %d, %zu parameters, device %s, comm %s",
                      o->data_path, o->epochs, w.progress.epochs, w.data.train.count, env->world_size,
                      env->world_size == 1 ? "" : "es", o->batch_size, w.model.num_params,
                      w.engine->ops->name, comm_kind_name(comm_kind(w.comm)));
    }
    int stopped = 0;
    double lr = 0;
    w.run_t0 = now_seconds();
    w.run_step0 = w.progress.step;
    int early = early_stop_due(&w);
    w.last_snapshot_time = snapshot_clock(&w);
    for (int64_t epoch = w.progress.epochs; epoch < o->epochs && !stopped && !early; epoch++) {
        if (run_epoch(&w, epoch, &lr) == EPOCH_STOPPED) {
            stopped = 1;
            break;
        }
        if (finish_epoch(&w, epoch, lr)) write_best(&w);
        early = early_stop_due(&w);
        int last = epoch + 1 == o->epochs;
        if (last || early) {
            write_snapshot(&w, path, sizeof path);
            if (early && env->rank == 0)
                log_info_once("early stop: no better val_acc in %d epochs (best %.2f%% at epoch %" PRId64
                              ", kept as %s/best.safetensors)",
                              o->early_stop, 100 * w.progress.best_val_acc, w.progress.best_epoch,
                              o->run_dir);
            break;
        }
        StepDecision next = agree_next(&w, 0);
        if (next == GO_STOP) stopped = 1;
        else if (next == GO_SNAPSHOT || snapshot_due_by_steps(&w) || (epoch + 1) % o->save_every == 0)
            snapshot_start(&w);
    }
    if (stopped) {
        /* Every rank agreed to stop: its peers are alive and coming, so the waits of
         * the last snapshot and the final barrier get the normal timeout, not the
         * stop grace (a rank would otherwise leave while rank 0 still writes). */
        g_train_wait_stop = 0;
        write_snapshot(&w, path, sizeof path);
        if (env->rank == 0) report_stopped(&w, path);
    } else if (path[0] == '\0' && env->rank == 0) {
        /* Nothing left to train: report the snapshot we resumed from. */
        snapshot_path_for(o->run_dir, w.progress.step, path, sizeof path);
        if (!fs_exists(path)) write_snapshot(&w, path, sizeof path);
        if (early)
            log_info_once("already stopped early at epoch %" PRId64 " (--early-stop %d)", w.progress.epochs,
                          o->early_stop);
        else
            report_nothing_to_do(&w);
    }
    comm_barrier(w.comm);
    /* The pipeline contract: stdout's last line is a finished run's snapshot. A
     * stopped run prints none, so that the next stage fails instead of going on
     * with a half-trained model. */
    if (env->rank == 0 && !stopped) {
        printf("%s\n", path);
        if (fflush(stdout) != 0) /* a reader that left (SIGPIPE is ignored): say where it is */
            log_warn_once("cannot print the final snapshot's path on stdout (%s): it is %s",
                          strerror(errno), path);
    }
    worker_free(&w);
    if (lock_fd >= 0) close(lock_fd);
    return stopped ? 128 + (g_train_stop_signal ? g_train_stop_signal : SIGTERM) : 0;
}
