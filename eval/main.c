/* cifar-eval: load a snapshot, evaluate it on a split of a cifar-prep LMDB and
 * report overall accuracy, per-class accuracy and the confusion matrix. */
#include <cjson/cJSON.h>
#include <getopt.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "core/omp_env.h"
#include "format/checkpoint.h"
#include "format/input_kind.h"
#include "data/dataset.h"
#include "model/engine.h"
#include "core/fsutil.h"
#include "model/device.h"
#include "model/inference_options.h"
#include "model/model.h"
#include "core/options.h"
#include "core/progress.h"
#include "core/settings.h"
#include "core/version.h"

static const char *usage_text =
    "usage: cifar-eval [OPTIONS] [SNAPSHOT.safetensors|RUN_DIR]\n"
    "Evaluate a cifar-train snapshot (path from stdin when omitted: the last line).\n"
    "A RUN_DIR stands for its best snapshot (best.safetensors, kept by cifar-train\n"
    "--val-fraction) when it has one, else its newest.\n"
    "\n"
    "  --data DATA.lmdb   the dataset (default: the one recorded in the snapshot)\n"
    "  --split NAME       the split to evaluate (default test)\n"
    "  --json             one JSON document on stdout instead of the text report\n"
    "  --device D         auto (GPU when usable, default) | cpu | cuda\n"
    "  --batch-size N     images per forward pass (default 500)\n"
    "  --threads N        CPU threads (default: all cores)\n"
    "  --weights W        ema: the moving average of the weights when the snapshot has\n"
    "                     one (cifar-train --ema), else its trained weights (default) |\n"
    "                     raw: the trained weights; the report says which it used\n"
    "  --quiet            no progress output\n"
    "  -h, --help         this help\n"
    "  --version          the version\n"
    "\n" SETTINGS_HELP
    "  CIFAR_CUDA_LIB=PATH    the GPU library, if not beside the command\n"
    "  OMP_WAIT_POLICY, GOMP_SPINCOUNT  override the OpenMP wait policy chosen at start;\n"
    "  OPENBLAS_NUM_THREADS   1 unless set (the ops run BLAS inside their own threads)\n"
    "  CUDA_VISIBLE_DEVICES   as for any CUDA program\n"
    "\n"
    "Exit status: 0 the report is printed; 1 failure: a missing, corrupt or foreign snapshot\n"
    "or dataset (one line naming the file), --device cuda without a usable GPU, or nothing\n"
    "on a piped stdin (the previous stage failed or was stopped); 2 bad usage.\n";

typedef struct {
    const char *given;    /* the SNAPSHOT or RUN_DIR given */
    const char *snapshot; /* the snapshot it stands for */
    const char *data;
    const char *split;
    int json;
    InferenceOptions common; /* --device, --batch-size, --threads, --quiet, --weights */
} EvalOptions;

static const char *last_line_of_stdin(void) {
    static char path[4096];
    fs_input_path_from_stdin("SNAPSHOT", path, sizeof path);
    return path;
}

static void eval_options_parse(EvalOptions *o, int argc, char **argv) {
    static const struct option longs[] = {
        {"data", required_argument, 0, 'd'}, {"split", required_argument, 0, 's'},
        {"json", no_argument, 0, 'j'},       INFERENCE_LONG_OPTIONS, {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    o->split = "test";
    inference_options_init(&o->common, 500);
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        if (inference_option(&o->common, c, optarg, usage_text, "cifar-eval")) continue;
        switch (c) {
        case 'd': o->data = optarg; break;
        case 's': o->split = optarg; break;
        case 'j': o->json = 1; break;
        default: fputs("see `cifar-eval --help`\n", stderr); exit(2);
        }
    }
    if (argc - optind > 1) die_usage("expected one SNAPSHOT or RUN_DIR, got %d arguments", argc - optind);
    static char chosen[4096];
    o->given = optind < argc ? argv[optind] : last_line_of_stdin();
    /* a dataset, the seed's layout: named, with what to give instead */
    if (input_kind_of(o->given) != INPUT_RUN_DIR) input_kind_expect(o->given, INPUT_SNAPSHOT);
    checkpoint_for_inference(o->given, chosen, sizeof chosen);
    o->snapshot = chosen;
}

typedef struct {
    int k;
    const char *weights; /* "ema" or "raw": what was evaluated */
    int64_t total, correct;
    double loss_sum;
    int64_t *confusion; /* [true][predicted] */
} EvalResult;

static void run_eval(const EvalOptions *o, Engine *e, int64_t n, const int32_t *labels, EvalResult *r) {
    int64_t *idx = xmalloc((size_t)o->common.batch * sizeof(int64_t));
    int64_t *idx_next = xmalloc((size_t)o->common.batch * sizeof(int64_t));
    int32_t *pred = xmalloc((size_t)o->common.batch * sizeof(int32_t));
    Progress bar;
    progress_begin(&bar, "eval", n, "img");
    for (int64_t first = 0; first < n; first += o->common.batch) {
        int b = engine_batch_in_order(idx, first, o->common.batch, n);
        /* the engine may gather the next batch while this one runs */
        if (first + b < n)
            engine_prefetch(e, idx_next, engine_batch_in_order(idx_next, first + b, o->common.batch, n), 0);
        e->ops->eval_batch(e, idx, b, &r->loss_sum, &r->correct, pred, NULL);
        for (int i = 0; i < b; i++) r->confusion[(int64_t)labels[first + i] * r->k + pred[i]]++;
        progress_update(&bar, first + b, NULL);
    }
    progress_end(&bar, NULL);
    r->total = n;
    free(idx);
    free(idx_next);
    free(pred);
}

static void print_text(const EvalOptions *o, const char *data, const EvalResult *r,
                       const ClassNames *names) {
    printf("snapshot: %s\nweights: %s\ndata: %s (split %s, %" PRId64 " images)\n", o->snapshot,
           strcmp(r->weights, "ema") == 0 ? "ema (the moving average; --weights raw for the trained ones)"
                                          : "raw (the trained weights)",
           data, o->split, r->total);
    printf("accuracy: %.2f%% (%" PRId64 "/%" PRId64 "), mean loss %.4f\n",
           100.0 * (double)r->correct / (double)r->total, r->correct, r->total,
           r->loss_sum / (double)r->total);
    int width = 0;
    for (int t = 0; t < names->count; t++)
        if ((int)strlen(names->names[t]) > width) width = (int)strlen(names->names[t]);
    printf("per class:\n");
    for (int t = 0; t < r->k; t++) {
        int64_t row = 0;
        for (int p = 0; p < r->k; p++) row += r->confusion[(int64_t)t * r->k + p];
        int64_t hit = r->confusion[(int64_t)t * r->k + t];
        if (names->count)
            printf("  %2d %-*s %6.2f%% (%" PRId64 "/%" PRId64 ")\n", t, width, names->names[t],
                   row ? 100.0 * (double)hit / (double)row : 0.0, hit, row);
        else
            printf("  class %2d: %6.2f%% (%" PRId64 "/%" PRId64 ")\n", t,
                   row ? 100.0 * (double)hit / (double)row : 0.0, hit, row);
    }
    printf("confusion matrix (rows: true class, columns: predicted):\n");
    if (names->count) {
        /* a header of the column classes, each cut to the column's 6 characters */
        printf("  %*s ", width, "");
        for (int p = 0; p < r->k; p++) printf(" %6.6s", names->names[p]);
        printf("\n");
    }
    for (int t = 0; t < r->k; t++) {
        if (names->count)
            printf("  %*s:", width, names->names[t]);
        else
            printf("  %2d:", t);
        for (int p = 0; p < r->k; p++) printf(" %6" PRId64, r->confusion[(int64_t)t * r->k + p]);
        printf("\n");
    }
}

static cJSON *int64_array(const int64_t *v, int n) {
    cJSON *a = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(a, cJSON_CreateNumber((double)v[i]));
    return a;
}

static void print_json(const EvalOptions *o, const char *data, const EvalResult *r,
                       const ClassNames *names) {
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "snapshot", o->snapshot);
    cJSON_AddStringToObject(j, "weights", r->weights);
    cJSON_AddStringToObject(j, "data", data);
    cJSON_AddStringToObject(j, "split", o->split);
    cJSON_AddNumberToObject(j, "images", (double)r->total);
    cJSON_AddNumberToObject(j, "correct", (double)r->correct);
    cJSON_AddNumberToObject(j, "accuracy", (double)r->correct / (double)r->total);
    cJSON_AddNumberToObject(j, "loss", r->loss_sum / (double)r->total);
    if (names->count)
        cJSON_AddItemToObject(j, "classes", cJSON_CreateStringArray((const char *const *)names->names,
                                                                    names->count));
    cJSON *per_class = cJSON_AddArrayToObject(j, "per_class");
    cJSON *confusion = cJSON_AddArrayToObject(j, "confusion");
    for (int t = 0; t < r->k; t++) {
        const int64_t *row = r->confusion + (int64_t)t * r->k;
        int64_t n = 0;
        for (int p = 0; p < r->k; p++) n += row[p];
        cJSON_AddItemToArray(per_class, cJSON_CreateNumber(n ? (double)row[t] / (double)n : 0.0));
        cJSON_AddItemToArray(confusion, int64_array(row, r->k));
    }
    char *text = cJSON_PrintUnformatted(j);
    CHECK_ALLOC(text, 4096);
    printf("%s\n", text);
    free(text);
    cJSON_Delete(j);
}

/* The dataset to evaluate on (--data, else the snapshot's), checked against the model. */
static Dataset *open_data(const EvalOptions *o, const ModelConfig *cfg, const CheckpointInfo *info,
                          const char **data_out) {
    char err[512];
    const char *data = o->data ? o->data : info->dataset_path;
    if (!data || !data[0]) die_usage("%s: the snapshot records no dataset: give --data", o->snapshot);
    input_kind_expect(data, INPUT_DATASET);
    Dataset *ds = dataset_open(data, err, sizeof err);
    if (!ds && !o->data)
        die_permanent("%s: %s (the dataset the snapshot was trained on; give --data)", data, err);
    if (!ds) die_permanent("%s: %s", data, err);
    dataset_prepare_for_job(ds, data);
    const DatasetInfo *di = dataset_info(ds);
    if (di->height != cfg->img_height || di->width != cfg->img_width ||
        di->channels != cfg->img_channels || di->num_classes != cfg->num_classes)
        die_permanent("%s: the dataset is %dx%dx%d/%d (HxWxC/classes), the snapshot's model expects %s",
                      data, di->height, di->width, di->channels, di->num_classes, info->dataset_shape);
    *data_out = data;
    return ds;
}

int main(int argc, char **argv) {
    log_set_program("cifar-eval");
    omp_env_prefer_passive(argc, argv);
    memory_limit_check((size_t)512 << 20);
    EvalOptions o;
    eval_options_parse(&o, argc, argv);
    log_set_quiet(o.common.quiet);
    if (strcmp(o.given, o.snapshot) != 0) log_info("%s: a run folder: evaluating %s", o.given, o.snapshot);

    CheckpointModel snap;
    checkpoint_load_model(o.snapshot, !o.common.raw_weights, &snap);
    const CheckpointInfo *info = &snap.info;
    const char *data;
    Dataset *ds = open_data(&o, &snap.cfg, info, &data);
    Settings settings;
    settings_from_env(&settings); /* every CIFAR_* tuning variable, here only */
    HostSplit split;
    host_split_load(ds, data, o.split, 1, settings.data_in_memory, &split); /* in place in the map */

    Comm *comm;
    Engine *e = device_inference_engine(o.common.device, &snap.model, split, info->mean, info->std, o.common.batch,
                                        o.common.threads, snap.state.params, snap.state.buffers, &settings, &comm);

    EvalResult r;
    memset(&r, 0, sizeof r);
    r.k = snap.cfg.num_classes;
    r.weights = snap.ema ? "ema" : "raw";
    r.confusion = xcalloc((size_t)r.k * r.k, sizeof(int64_t));
    run_eval(&o, e, split.count, split.labels, &r);
    /* the snapshot's names; a snapshot of before names took the dataset's */
    const ClassNames *names = info->classes.count ? &info->classes : &dataset_info(ds)->classes;
    if (o.json)
        print_json(&o, data, &r, names);
    else
        print_text(&o, data, &r, names);

    e->ops->destroy(e);
    comm_destroy(comm);
    free(r.confusion);
    dataset_close(ds);
    checkpoint_model_free(&snap);
    return 0;
}
