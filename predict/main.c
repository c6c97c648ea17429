/* cifar-predict: classify PNG/JPEG images with a cifar-train snapshot.
 *
 *   cifar-predict SNAPSHOT IMAGE...      one line per image, in the order given
 *   find pics -name '*.png' | cifar-predict SNAPSHOT
 *
 * Every image is read and decoded first (cifar-prep's decoder, data/image.h),
 * checked against the snapshot's image shape, and only then classified in
 * batches on the engine cifar-eval uses (the same --device policy): a bad image
 * stops the command before anything is printed, with cifar-prep's one line
 * naming the file. The engine normalises with the snapshot's statistics. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "core/omp_env.h"
#include "core/options.h"
#include "core/progress.h"
#include "core/settings.h"
#include "core/version.h"
#include "data/image.h"
#include "format/checkpoint.h"
#include "model/device.h"
#include "model/inference_options.h"
#include "model/engine.h"
#include "model/model.h"

#define PATH_CAP 4096

static const char *usage_text =
    "usage: cifar-predict [OPTIONS] SNAPSHOT|RUN_DIR [IMAGE...]\n"
    "Classify PNG/JPEG images with a cifar-train snapshot (image paths from stdin,\n"
    "one per line, when none are given). A RUN_DIR stands for its best snapshot\n"
    "(best.safetensors, kept by --val-fraction) when it has one, else its newest.\n"
    "Prints one line per image, in the order given:\n"
    "  PATH<TAB>CLASS<TAB>PROBABILITY[<TAB>CLASS<TAB>PROBABILITY...]\n"
    "the most likely class first; CLASS is the name the dataset gave it (cifar-prep\n"
    "--classes), else its number. Images must have the training data's height, width\n"
    "and channel count (or --resize); they are normalised with the snapshot's mean\n"
    "and std.\n"
    "\n"
    "  --top K            the K most likely classes of each image (default 1)\n"
    "  --json             one JSON object per image and line instead:\n"
    "                     {\"path\":...,\"top\":[{\"class\":...,\"index\":k,\"probability\":p},...]}\n"
    "  --resize           resample images of another size to the training data's\n"
    "                     (bilinear, pixel centres aligned, no antialiasing), gray to\n"
    "                     RGB by copying, RGB to gray by BT.601 luma (default: refuse)\n"
    "  --device D         auto (GPU when usable, default) | cpu | cuda\n"
    "  --batch-size N     images per forward pass (default 256)\n"
    "  --threads N        CPU threads (default: all cores)\n"
    "  --weights W        ema: the moving average of the weights when the snapshot has\n"
    "                     one (cifar-train --ema), else its trained weights (default) |\n"
    "                     raw: the trained weights\n"
    "  --quiet            no progress output\n"
    "  -h, --help         this help\n"
    "  --version          the version\n"
    "\n" SETTINGS_HELP
    "\n"
    "Exit status: 0 done, 1 failure (one line naming the file: a snapshot or image\n"
    "that cannot be read, an image of another shape without --resize), 2 bad usage.\n";

typedef struct {
    const char *snapshot;
    char **images; /* count paths */
    int64_t count;
    int top, json, resize;
    InferenceOptions common; /* --device, --batch-size, --threads, --quiet, --weights */
} PredictOptions;

/* ------------------------------------------------------------------ options */

static void paths_add(PredictOptions *o, int64_t *cap, const char *path) {
    if (o->count == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        o->images = xrealloc(o->images, (size_t)*cap * sizeof *o->images);
    }
    o->images[o->count++] = xstrdup(path);
}

/* Image paths from stdin, one per line (empty lines are ignored). */
static void paths_from_stdin(PredictOptions *o, int64_t *cap) {
    if (isatty(STDIN_FILENO)) die_usage("no IMAGE given (give paths, or pipe them on stdin); see --help");
    char *line = NULL;
    size_t linecap = 0;
    ssize_t n;
    while ((n = getline(&line, &linecap, stdin)) > 0) {
        while (n > 0 && (line[n - 1] == '\n' || line[n - 1] == '\r')) line[--n] = '\0';
        if (n > 0) paths_add(o, cap, line);
    }
    CHECK_STDIO(!ferror(stdin), "stdin");
    free(line);
    if (o->count == 0) die_usage("no IMAGE given and none on stdin; see --help");
}

static void predict_options_parse(PredictOptions *o, int argc, char **argv) {
    static const struct option longs[] = {
        {"top", required_argument, 0, 'k'}, {"json", no_argument, 0, 'j'},
        {"resize", no_argument, 0, 'r'},    INFERENCE_LONG_OPTIONS, {0, 0, 0, 0},
    };
    memset(o, 0, sizeof *o);
    o->top = 1;
    inference_options_init(&o->common, 256);
    int c;
    while ((c = getopt_long(argc, argv, "h", longs, NULL)) != -1) {
        if (inference_option(&o->common, c, optarg, usage_text, "cifar-predict")) continue;
        switch (c) {
        case 'k': o->top = (int)option_int("top", optarg, 1, 1000000); break;
        case 'j': o->json = 1; break;
        case 'r': o->resize = 1; break;
        default: fputs("see `cifar-predict --help`\n", stderr); exit(2);
        }
    }
    if (optind >= argc) die_usage("give a SNAPSHOT (or RUN_DIR) and images; see --help");
    static char chosen[PATH_CAP];
    checkpoint_for_inference(argv[optind++], chosen, sizeof chosen);
    o->snapshot = chosen;
    int64_t cap = 0;
    for (int i = optind; i < argc; i++) paths_add(o, &cap, argv[i]);
    if (o->count == 0) paths_from_stdin(o, &cap);
    /* a tab or newline in a path would make the text output ambiguous */
    for (int64_t i = 0; i < o->count && !o->json; i++)
        if (strpbrk(o->images[i], "\t\n"))
            die_usage("image %lld: its path holds a tab or newline: use --json", (long long)i + 1);
}

static void predict_options_free(PredictOptions *o) {
    for (int64_t i = 0; i < o->count; i++) free(o->images[i]);
    free(o->images);
}

/* ------------------------------------------------------------------ images */

/* Decode the image in file[0..len) into out (the model's shape `want`), through
 * `scratch` (grown as needed) and image_resample when it has another shape: --resize. */
static int image_decode_resized(ImageDecoder *dec, const uint8_t *file, size_t len, ImageShape want,
                                uint8_t *out, uint8_t **scratch, size_t *scratch_cap, ImageShape *got,
                                char *why, size_t whylen) {
    if (image_probe(dec, file, len, got, why, whylen) != IMAGE_OK) return IMAGE_ERROR;
    size_t bytes = (size_t)got->width * got->height * got->channels;
    if (bytes > *scratch_cap) {
        *scratch = xrealloc(*scratch, bytes);
        *scratch_cap = bytes;
    }
    int rc = image_decode(dec, file, len, NULL, *scratch, *scratch_cap, got, why, whylen);
    if (rc == IMAGE_OK) image_resample(*scratch, *got, out, want);
    return rc;
}

/* Every image decoded into pixels[count * H*W*C] (HWC, the dataset's layout);
 * any unreadable image, or one of another shape than the model's without
 * --resize, ends the process naming it. */
static uint8_t *images_decode(const PredictOptions *o, const ModelConfig *cfg) {
    const ImageShape want = {cfg->img_width, cfg->img_height, cfg->img_channels};
    const size_t rec = (size_t)want.width * want.height * want.channels;
    uint8_t *pixels = xmalloc((size_t)o->count * rec);
    ImageDecoder *dec = image_decoder_create();
    uint8_t *file = NULL, *scratch = NULL;
    size_t cap = 0, scratch_cap = 0, len;
    char why[768];
    Progress bar;
    progress_begin(&bar, "decode", o->count, "img");
    for (int64_t i = 0; i < o->count; i++) {
        const char *path = o->images[i];
        uint8_t *out = pixels + (size_t)i * rec;
        if (image_file_read(AT_FDCWD, path, 1, &file, &cap, &len, why, sizeof why)) die("%s: %s", path, why);
        ImageShape got;
        int rc = o->resize ? image_decode_resized(dec, file, len, want, out, &scratch, &scratch_cap, &got,
                                                  why, sizeof why)
                           : image_decode(dec, file, len, &want, out, rec, &got, why, sizeof why);
        if (rc == IMAGE_MISMATCH)
            die("%s: the image is %dx%dx%d (HxWxC), the snapshot's model takes %dx%dx%d ---> HINT: "
                "convert it to the training data's size and channel count, or give --resize",
                path, got.height, got.width, got.channels, want.height, want.width, want.channels);
        if (rc != IMAGE_OK) die("%s: %s", path, why);
        progress_update(&bar, i + 1, NULL);
    }
    progress_end(&bar, NULL);
    free(file);
    free(scratch);
    image_decoder_free(dec);
    return pixels;
}

/* ------------------------------------------------------------------ output */

typedef struct {
    int index;
    double probability;
} Ranked;

/* The softmax of one row of logits (in double), its `top` largest into out. */
static void rank_row(const float *logits, int k, int top, Ranked *out) {
    double max = logits[0], sum = 0;
    for (int j = 1; j < k; j++)
        if (logits[j] > max) max = logits[j];
    for (int j = 0; j < k; j++) sum += exp((double)logits[j] - max);
    for (int t = 0; t < top; t++) out[t].index = -1;
    for (int j = 0; j < k; j++) {
        double p = exp((double)logits[j] - max) / sum;
        int t = top;
        /* insertion into the sorted prefix: the lower index first among equals */
        while (t > 0 && (out[t - 1].index < 0 || p > out[t - 1].probability)) t--;
        if (t == top) continue;
        memmove(out + t + 1, out + t, (size_t)(top - t - 1) * sizeof *out);
        out[t] = (Ranked){j, p};
    }
}

static void print_text(const char *path, const Ranked *r, int top, const ClassNames *names) {
    char num[16];
    printf("%s", path);
    for (int t = 0; t < top; t++)
        printf("\t%s\t%.6f", class_name(names, r[t].index, num, sizeof num), r[t].probability);
    printf("\n");
}

static void print_json(const char *path, const Ranked *r, int top, const ClassNames *names) {
    char num[16];
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "path", path);
    cJSON *arr = cJSON_AddArrayToObject(j, "top");
    for (int t = 0; t < top; t++) {
        cJSON *it = cJSON_CreateObject();
        cJSON_AddStringToObject(it, "class", class_name(names, r[t].index, num, sizeof num));
        cJSON_AddNumberToObject(it, "index", r[t].index);
        cJSON_AddNumberToObject(it, "probability", r[t].probability);
        cJSON_AddItemToArray(arr, it);
    }
    char *text = cJSON_PrintUnformatted(j);
    CHECK_ALLOC(text, 4096);
    printf("%s\n", text);
    free(text);
    cJSON_Delete(j);
}

/* ------------------------------------------------------------------ run */

static void predict_all(const PredictOptions *o, Engine *e, int k, const ClassNames *names) {
    int64_t *idx = xmalloc((size_t)o->common.batch * sizeof(int64_t));
    int64_t *idx_next = xmalloc((size_t)o->common.batch * sizeof(int64_t));
    float *logits = xmalloc((size_t)o->common.batch * k * sizeof(float));
    const int top = o->top < k ? o->top : k;
    Ranked *ranked = xmalloc((size_t)top * sizeof *ranked);
    Progress bar;
    progress_begin(&bar, "predict", o->count, "img");
    for (int64_t first = 0; first < o->count; first += o->common.batch) {
        int b = engine_batch_in_order(idx, first, o->common.batch, o->count);
        if (first + b < o->count)
            engine_prefetch(e, idx_next,
                            engine_batch_in_order(idx_next, first + b, o->common.batch, o->count), 0);
        double loss = 0; /* of the placeholder labels: meaningless */
        int64_t hits = 0;
        e->ops->eval_batch(e, idx, b, &loss, &hits, NULL, logits);
        for (int i = 0; i < b; i++) {
            rank_row(logits + (size_t)i * k, k, top, ranked);
            (o->json ? print_json : print_text)(o->images[first + i], ranked, top, names);
        }
        progress_update(&bar, first + b, NULL);
    }
    progress_end(&bar, NULL);
    CHECK_STDIO(fflush(stdout) == 0, "stdout");
    free(idx);
    free(idx_next);
    free(logits);
    free(ranked);
}

int main(int argc, char **argv) {
    log_set_program("cifar-predict");
    omp_env_prefer_passive(argc, argv);
    memory_limit_check((size_t)512 << 20);
    PredictOptions o;
    predict_options_parse(&o, argc, argv);
    log_set_quiet(o.common.quiet);

    CheckpointModel snap;
    checkpoint_load_model(o.snapshot, !o.common.raw_weights, &snap);
    uint8_t *pixels = images_decode(&o, &snap.cfg);
    int32_t *labels = xcalloc((size_t)o.count, sizeof *labels); /* unknown: class 0 */

    Settings settings;
    settings_from_env(&settings); /* every CIFAR_* tuning variable, here only */
    Comm *comm;
    HostSplit images = {.pixels = pixels, .labels = labels, .count = o.count};
    Engine *e = device_inference_engine(o.common.device, &snap.model, images, snap.info.mean, snap.info.std,
                                        o.common.batch, o.common.threads, snap.state.params, snap.state.buffers,
                                        &settings, &comm);

    predict_all(&o, e, snap.cfg.num_classes, &snap.info.classes);

    e->ops->destroy(e);
    comm_destroy(comm);
    free(pixels);
    free(labels);
    checkpoint_model_free(&snap);
    predict_options_free(&o);
    return 0;
}
