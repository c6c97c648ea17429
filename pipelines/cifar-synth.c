/* cifar-synth: a small, learnable synthetic dataset in the seed's layout.
 *
 *   cifar-synth OUT_DIR [--train N] [--test N] [--size 32] [--channels 3]
 *               [--classes 10] [--seed S] [--jpeg-fraction 0.2]
 *
 * Writes OUT_DIR/annotations/cifar10_{train,test}.json and the images in
 * OUT_DIR/{train,test}_cifar10/ (PNG through libpng, a fraction as JPEG through
 * TurboJPEG), then prints OUT_DIR as the last stdout line.
 *
 * Each class is one shape (square, disc, stripes in three directions, plus,
 * ring, triangle, checkerboard, X) in its own colour, on a random dark
 * background, at a jittered position and scale, with per-pixel noise: easy for
 * a small ResNet, but not solvable by a single pixel. Every byte is a pure
 * function of the seed (rng.h), so two runs give identical datasets. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <getopt.h>
#include <math.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <turbojpeg.h>

#include "core/check.h"
#include "core/fsutil.h"
#include "core/rng.h"
#include "core/version.h"

typedef struct {
    char out[4000];
    long long train, test;
    int size, channels, classes;
    unsigned long long seed;
    double jpeg_fraction;
} SynthOptions;

static const char USAGE[] =
    "usage: cifar-synth OUT_DIR [--train N] [--test N] [--size 32] [--channels 3]\n"
    "                   [--classes 10] [--seed S] [--jpeg-fraction 0.2]\n"
    "\n"
    "Write a learnable synthetic dataset in the seed's layout (annotations/*.json,\n"
    "train_cifar10/, test_cifar10/) and print OUT_DIR as the last stdout line.\n"
    "Defaults: 1000 train and 200 test images, 32x32, RGB, 10 classes, seed 0,\n"
    "a fifth of the images as JPEG. --channels 1 gives grayscale images.\n"
    "-h, --help gives this help, --version the version.\n"
    "Exit status: 0 done, 1 failure (one line naming the file), 2 bad usage.\n";

/* ------------------------------------------------------------------ drawing */

/* Per image: a stream of numbers keyed by (image id, draw). */
static double draw_uniform(uint64_t seed, uint64_t image, uint64_t k) {
    return rng_uniform(seed, RNG_STREAM_SYNTH, (image << 32) | k);
}

/* Is (x, y), relative to the object's box [0,1)^2, inside shape `s`? */
static int shape_inside(int s, double x, double y) {
    double cx = x - 0.5, cy = y - 0.5, r2 = cx * cx + cy * cy;
    switch (s) {
    case 0: return fabs(cx) < 0.35 && fabs(cy) < 0.35;                 /* square */
    case 1: return r2 < 0.16;                                          /* disc */
    case 2: return ((int)floor(y * 6)) % 2 == 0;                       /* horizontal stripes */
    case 3: return ((int)floor(x * 6)) % 2 == 0;                       /* vertical stripes */
    case 4: return ((int)floor((x + y) * 5)) % 2 == 0;                 /* diagonal stripes */
    case 5: return fabs(cx) < 0.12 || fabs(cy) < 0.12;                 /* plus */
    case 6: return r2 < 0.2 && r2 > 0.07;                              /* ring */
    case 7: return y > 0.15 && fabs(cx) < 0.42 * (y - 0.15) / 0.75;    /* triangle */
    case 8: return ((int)floor(x * 4) + (int)floor(y * 4)) % 2 == 0;   /* checkerboard */
    default: return fabs(cx - cy) < 0.1 || fabs(cx + cy) < 0.1;        /* X */
    }
}

/* A saturated colour per class, hues spread evenly. */
static void class_colour(int c, int classes, double rgb[3]) {
    double h = 6.0 * (double)c / (double)classes;
    int i = (int)h;
    double f = h - i, v = 235, lo = 40;
    double up = lo + (v - lo) * f, down = v - (v - lo) * f;
    double t[6][3] = {{v, up, lo}, {down, v, lo}, {lo, v, up}, {lo, down, v}, {up, lo, v}, {v, lo, down}};
    memcpy(rgb, t[i % 6], sizeof t[0]);
}

static uint8_t clamp_u8(double v) { return v < 0 ? 0 : v > 255 ? 255 : (uint8_t)lround(v); }

static void image_draw(const SynthOptions *o, uint64_t id, int label, uint8_t *px) {
    int S = o->size, C = o->channels;
    uint64_t seed = o->seed;
    double fg[3], bg[3];
    class_colour(label, o->classes, fg);
    for (int k = 0; k < 3; k++) bg[k] = 80 * draw_uniform(seed, id, 1 + (uint64_t)k);
    double scale = S * (0.55 + 0.25 * draw_uniform(seed, id, 4));
    double ox = (S - scale) * draw_uniform(seed, id, 5), oy = (S - scale) * draw_uniform(seed, id, 6);
    int shape = label % 10;
    for (int y = 0; y < S; y++) {
        for (int x = 0; x < S; x++) {
            double bx = (x + 0.5 - ox) / scale, by = (y + 0.5 - oy) / scale;
            int in = bx >= 0 && bx < 1 && by >= 0 && by < 1 && shape_inside(shape, bx, by);
            const double *col = in ? fg : bg;
            uint64_t p = 16 + ((uint64_t)y * (uint64_t)S + (uint64_t)x) * 4;
            double noise = 40 * (draw_uniform(seed, id, p) - 0.5);
            if (C == 1) {
                px[y * S + x] = clamp_u8(0.299 * col[0] + 0.587 * col[1] + 0.114 * col[2] + noise);
            } else {
                for (int k = 0; k < 3; k++)
                    px[(y * S + x) * 3 + k] =
                        clamp_u8(col[k] + noise + 12 * (draw_uniform(seed, id, p + 1 + (uint64_t)k) - 0.5));
            }
        }
    }
}

/* ------------------------------------------------------------------ encoding */

static void png_on_error(png_structp png, png_const_charp msg) {
    const char *path = png_get_error_ptr(png);
    die("%s: cannot write PNG (%s)", path, msg);
}

typedef struct {
    const char *path;
    const uint8_t *px;
    int S, C;
} PngJob;

static int png_write_stream(FILE *f, void *ctx) {
    const PngJob *j = ctx;
    const char *path = j->path;
    int S = j->S, C = j->C;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, (void *)path, png_on_error, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    CHECK_ALLOC(info, sizeof(void *));
    png_init_io(png, f);
    png_set_IHDR(png, info, (png_uint_32)S, (png_uint_32)S, 8,
                 C == 1 ? PNG_COLOR_TYPE_GRAY : PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < S; y++) png_write_row(png, j->px + (size_t)y * (size_t)S * (size_t)C);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return fflush(f) == 0 ? 0 : -1;
}

/* Images go through fs_write_atomic without fsync: the annotation file, written
 * last after a syncfs, commits them (as cifar-unpack does). */
static void png_save(const char *path, const uint8_t *px, int S, int C) {
    PngJob job = {path, px, S, C};
    char err[4400];
    if (fs_write_atomic_stdio(path, png_write_stream, &job, FS_ATOMIC_DEFER_SYNC, err, sizeof err))
        check_fail(__FILE__, __LINE__, path, err, NULL);
}

static void jpeg_save(tjhandle tj, const char *path, const uint8_t *px, int S, int C) {
    unsigned char *jpg = NULL;
    unsigned long size = 0;
    if (tjCompress2(tj, px, S, 0, S, C == 1 ? TJPF_GRAY : TJPF_RGB, &jpg, &size,
                    C == 1 ? TJSAMP_GRAY : TJSAMP_444, 95, 0))
        die("%s: cannot encode JPEG (%s)", path, tjGetErrorStr2(tj));
    fs_write_buf_or_die(path, jpg, size, FS_ATOMIC_DEFER_SYNC);
    tjFree(jpg);
}

/* ------------------------------------------------------------------ splits */

static void json_save(const char *path, const char *image_dir, cJSON *root) {
    fs_syncfs_or_die(image_dir);
    char *text = cJSON_PrintUnformatted(root);
    CHECK_ALLOC(text, 1 << 20);
    size_t n = strlen(text);
    text[n] = '\n'; /* the NUL becomes the final newline */
    fs_write_buf_or_die(path, text, n + 1, 0);
    free(text);
}

static void split_write(const SynthOptions *o, const char *name, long long n, uint64_t id_base,
                        tjhandle tj) {
    char dir[4096], path[4200];
    snprintf(dir, sizeof dir, "%s/%s_cifar10", o->out, name);
    CHECK_STDIO(fs_mkdirs(dir, 0755) == 0, dir);
    cJSON *root = cJSON_CreateObject(), *images = cJSON_AddArrayToObject(root, "images"),
          *cats = cJSON_AddArrayToObject(root, "categories");
    uint8_t *px = xmalloc((size_t)o->size * (size_t)o->size * (size_t)o->channels);
    for (long long i = 0; i < n; i++) {
        uint64_t id = id_base + (uint64_t)i;
        int label = (int)rng_below(o->seed, RNG_STREAM_SYNTH, (id << 32) | 0xFFFFFFFFull,
                                   (uint32_t)o->classes);
        int jpeg = draw_uniform(o->seed, id, 0) < o->jpeg_fraction;
        char file[64];
        snprintf(file, sizeof file, "img_%06lld.%s", i, jpeg ? "jpg" : "png");
        snprintf(path, sizeof path, "%s/%s", dir, file);
        image_draw(o, id, label, px);
        if (jpeg)
            jpeg_save(tj, path, px, o->size, o->channels);
        else
            png_save(path, px, o->size, o->channels);
        cJSON_AddItemToArray(images, cJSON_CreateString(file));
        cJSON_AddItemToArray(cats, cJSON_CreateNumber(label));
    }
    snprintf(path, sizeof path, "%s/annotations/cifar10_%s.json", o->out, name);
    json_save(path, dir, root);
    cJSON_Delete(root);
    free(px);
}

/* ------------------------------------------------------------------ options */

static double parse_num(const char *s, const char *opt, double lo, double hi) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (errno || end == s || *end || !(v >= lo && v <= hi))
        die_usage("%s: expected a number in [%g, %g], got \"%s\"; see --help", opt, lo, hi, s);
    return v;
}

static int parse_whole(const char *s, const char *opt, double lo, double hi, double *out) {
    double v = parse_num(s, opt, lo, hi);
    if (v != floor(v)) die_usage("%s: expected an integer, got \"%s\"", opt, s);
    *out = v;
    return 0;
}

static void options_parse(int argc, char **argv, SynthOptions *o) {
    static const struct option longs[] = {
        {"train", required_argument, NULL, 'n'},   {"test", required_argument, NULL, 'm'},
        {"size", required_argument, NULL, 's'},    {"channels", required_argument, NULL, 'c'},
        {"classes", required_argument, NULL, 'k'}, {"seed", required_argument, NULL, 'r'},
        {"jpeg-fraction", required_argument, NULL, 'j'}, {"help", no_argument, NULL, 'h'},
        {"version", no_argument, NULL, 'V'},       {NULL, 0, NULL, 0},
    };
    *o = (SynthOptions){.train = 1000, .test = 200, .size = 32, .channels = 3, .classes = 10,
                        .seed = 0, .jpeg_fraction = 0.2};
    opterr = 0;
    int c;
    double v;
    while ((c = getopt_long(argc, argv, ":h", longs, NULL)) != -1) {
        switch (c) {
        case 'n': parse_whole(optarg, "--train", 1, 1e8, &v); o->train = (long long)v; break;
        case 'm': parse_whole(optarg, "--test", 1, 1e8, &v); o->test = (long long)v; break;
        case 's': parse_whole(optarg, "--size", 4, 4096, &v); o->size = (int)v; break;
        case 'c':
            parse_whole(optarg, "--channels", 1, 3, &v);
            if (v == 2) die_usage("--channels: 1 (gray) or 3 (RGB)");
            o->channels = (int)v;
            break;
        case 'k': parse_whole(optarg, "--classes", 2, 10000, &v); o->classes = (int)v; break;
        case 'r': parse_whole(optarg, "--seed", 0, 9007199254740992.0, &v); o->seed = (unsigned long long)v; break;
        case 'j': o->jpeg_fraction = parse_num(optarg, "--jpeg-fraction", 0, 1); break;
        case 'h': fputs(USAGE, stdout); exit(0);
        case 'V': version_print_and_exit();
        case ':': die_usage("%s needs a value; see --help", argv[optind - 1]);
        default: die_usage("unknown option %s; see --help", argv[optind - 1]);
        }
    }
    if (argc - optind != 1) die_usage("give one OUT_DIR; see --help");
    if (strlen(argv[optind]) >= sizeof o->out) die_usage("OUT_DIR: path too long");
    snprintf(o->out, sizeof o->out, "%s", argv[optind]);
}

int main(int argc, char **argv) {
    log_set_program("cifar-synth");
    SynthOptions o;
    options_parse(argc, argv, &o);
    char ann[4096];
    snprintf(ann, sizeof ann, "%s/annotations", o.out);
    CHECK_STDIO(fs_mkdirs(ann, 0755) == 0, ann);
    tjhandle tj = tjInitCompress();
    if (!tj) die("cannot create a JPEG encoder (%s)", tjGetErrorStr2(NULL));
    split_write(&o, "train", o.train, 0, tj);
    split_write(&o, "test", o.test, 1ull << 31, tj);
    tjDestroy(tj);
    printf("%s\n", o.out);
    if (fflush(stdout) != 0) die("stdout: %s", strerror(errno));
    return 0;
}
