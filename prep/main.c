/* cifar-prep: the seed's JSON + PNG/JPEG layout -> one LMDB file (dataset.h).
 *
 *   cifar-prep DATA_DIR [-o OUT]      prints OUT as the last stdout line
 *   echo DATA_DIR | cifar-prep
 *
 * Everything is validated before the output appears: the LMDB is built under
 * "<OUT>.tmp-<pid>" and renamed only when complete; any failure (or SIGINT,
 * SIGTERM) removes the temporary file. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "annotations.h"
#include "core/check.h"
#include "convert.h"
#include "data/dataset.h"
#include "data/image.h"
#include "core/fsutil.h"
#include "core/progress.h"
#include "core/version.h"
#include "format/input_kind.h"

#define PATH_CAP 4096
#define CLASSES_MAX 1000000

static const char USAGE[] =
    "usage: cifar-prep DATA_DIR [-o OUT] [options]\n"
    "       echo DATA_DIR | cifar-prep [options]\n"
    "\n"
    "Convert the seed's layout (DATA_DIR/annotations/cifar10_{train,test}.json,\n"
    "DATA_DIR/train_cifar10/, DATA_DIR/test_cifar10/) into one LMDB file and print\n"
    "its path as the last line on stdout.\n"
    "\n"
    "  -o, --output OUT        output file (default DATA_DIR/cifar10.lmdb)\n"
    "      --split NAME=ANNOTATIONS.json:IMAGE_DIR\n"
    "                          a split from another layout (repeatable; replaces\n"
    "                          the default train/test splits)\n"
    "      --num-classes K     number of classes (default: the names' count, else\n"
    "                          largest label + 1)\n"
    "      --classes FILE      class names, label 0 first: a JSON array of strings or\n"
    "                          one name per line (default: the annotation files'\n"
    "                          \"classes\" list, when they have one); stored in OUT\n"
    "      --threads N         decoding threads (default: online cores)\n"
    "  -f, --force             replace an existing OUT (a regular file only; never an\n"
    "                          input of this run)\n"
    "      --allow-outside-symlinks\n"
    "                          read images through symlinks that lead outside their\n"
    "                          image folder (refused by default)\n"
    "  -q, --quiet             no progress or summary on stderr\n"
    "  -h, --help              this help\n"
    "      --version           the version\n"
    "\n"
    "Images are PNG or JPEG, all of one height/width/channel count (1 or 3).\n"
    "Image names are paths relative to the image folder: no leading '/', no \"..\"\n"
    "component, no NUL.\n"
    "Exit status: 0 done, 1 failure (one line naming the file), 2 bad usage.\n";

typedef struct {
    char name[32];
    char ann[PATH_CAP];
    char dir[PATH_CAP];
} SplitSpec;

typedef struct {
    char data_dir[PATH_CAP];
    char out[PATH_CAP];
    int threads;
    int num_classes; /* 0: the names' count, else largest label + 1 */
    const char *classes_file;
    int force;
    int quiet;
    int outside_ok; /* --allow-outside-symlinks */
    int n_splits;
    SplitSpec splits[DATASET_MAX_SPLITS];
} Options;

/* ------------------------------------------------------------------ cleanup */

/* The temporary file's name, fixed before it exists, for the handlers below. */
static char g_temp_path[PATH_CAP + 64];

static void cleanup_temp(void) {
    if (g_temp_path[0]) unlink(g_temp_path);
}

static void on_signal(int sig) {
    /* async-signal-safe only: unlink, write, re-raise with the default action */
    if (g_temp_path[0]) unlink(g_temp_path);
    static const char msg[] = "cifar-prep: interrupted; removed the partial output\n";
    ssize_t ignored = write(STDERR_FILENO, msg, sizeof msg - 1);
    (void)ignored;
    signal(sig, SIG_DFL);
    raise(sig);
}

static void signals_install(void) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_signal;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    sigaction(SIGHUP, &sa, NULL);
}

/* ------------------------------------------------------------------ options */

static void copy_path(char *dst, const char *src, const char *what) {
    if (strlen(src) >= PATH_CAP) die_usage("%s: path too long", what);
    snprintf(dst, PATH_CAP, "%s", src);
}

static int parse_int(const char *s, const char *opt, int lo, int hi) {
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno || end == s || *end != '\0' || v < lo || v > hi)
        die_usage("%s: expected an integer in [%d, %d], got \"%s\"; see --help", opt, lo, hi, s);
    return (int)v;
}

/* NAME=ANNOTATIONS.json:IMAGE_DIR */
static void parse_split(Options *o, const char *arg) {
    if (o->n_splits == DATASET_MAX_SPLITS) die_usage("--split: at most %d splits", DATASET_MAX_SPLITS);
    const char *eq = strchr(arg, '=');
    const char *colon = eq ? strchr(eq + 1, ':') : NULL;
    if (!eq || !colon || eq == arg || colon == eq + 1 || colon[1] == '\0')
        die_usage("--split %s: expected NAME=ANNOTATIONS.json:IMAGE_DIR", arg);
    SplitSpec *s = &o->splits[o->n_splits];
    size_t nlen = (size_t)(eq - arg);
    if (nlen >= sizeof s->name) die_usage("--split %s: name too long", arg);
    memcpy(s->name, arg, nlen);
    s->name[nlen] = '\0';
    for (const char *c = s->name; *c; c++)
        if (!(*c == '_' || *c == '-' || *c == '.' || (*c >= '0' && *c <= '9') ||
              (*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z')) ||
            strcmp(s->name, "meta") == 0)
            die_usage("--split %s: a name is letters, digits, '_', '-', '.' (not \"meta\")", arg);
    for (int i = 0; i < o->n_splits; i++)
        if (strcmp(o->splits[i].name, s->name) == 0) die_usage("--split %s: named twice", s->name);
    size_t alen = (size_t)(colon - eq - 1);
    if (alen >= PATH_CAP) die_usage("--split %s: path too long", arg);
    memcpy(s->ann, eq + 1, alen);
    s->ann[alen] = '\0';
    copy_path(s->dir, colon + 1, "--split");
    o->n_splits++;
}

/* DATA_DIR from the first line of stdin (the previous stage's output). */
static void read_data_dir_stdin(Options *o) {
    if (isatty(STDIN_FILENO)) die_usage("give DATA_DIR (or pipe it on stdin); see --help");
    char line[PATH_CAP];
    if (!fgets(line, sizeof line, stdin)) die_usage("no DATA_DIR on stdin; see --help");
    line[strcspn(line, "\r\n")] = '\0';
    if (line[0] == '\0') die_usage("empty DATA_DIR on stdin; see --help");
    copy_path(o->data_dir, line, "DATA_DIR");
}

static void default_splits(Options *o) {
    static const char *names[] = {"train", "test"};
    char dd[PATH_CAP]; /* a copy: the outputs below live in the same struct */
    memcpy(dd, o->data_dir, sizeof dd);
    for (int i = 0; i < 2; i++) {
        SplitSpec *s = &o->splits[i];
        snprintf(s->name, sizeof s->name, "%s", names[i]);
        if (snprintf(s->ann, PATH_CAP, "%s/annotations/cifar10_%s.json", dd, names[i]) >=
                PATH_CAP ||
            snprintf(s->dir, PATH_CAP, "%s/%s_cifar10", dd, names[i]) >= PATH_CAP)
            die_usage("DATA_DIR: path too long");
    }
    o->n_splits = 2;
}

static void options_parse(int argc, char **argv, Options *o) {
    static const struct option longs[] = {
        {"output", required_argument, NULL, 'o'},     {"split", required_argument, NULL, 's'},
        {"num-classes", required_argument, NULL, 'k'}, {"threads", required_argument, NULL, 't'},
        {"classes", required_argument, NULL, 'c'},
        {"force", no_argument, NULL, 'f'},            {"quiet", no_argument, NULL, 'q'},
        {"help", no_argument, NULL, 'h'},             {"version", no_argument, NULL, 'V'},
        {"allow-outside-symlinks", no_argument, NULL, 'L'}, {NULL, 0, NULL, 0},
    };
    memset(o, 0, sizeof *o);
    long cores = sysconf(_SC_NPROCESSORS_ONLN);
    o->threads = cores < 1 ? 1 : cores > 256 ? 256 : (int)cores;
    opterr = 0;
    int c;
    while ((c = getopt_long(argc, argv, ":o:fqh", longs, NULL)) != -1) {
        switch (c) {
        case 'o': copy_path(o->out, optarg, "--output"); break;
        case 's': parse_split(o, optarg); break;
        case 'k': o->num_classes = parse_int(optarg, "--num-classes", 1, CLASSES_MAX); break;
        case 't': o->threads = parse_int(optarg, "--threads", 1, 1024); break;
        case 'c': o->classes_file = optarg; break;
        case 'f': o->force = 1; break;
        case 'L': o->outside_ok = 1; break;
        case 'q': o->quiet = 1; break;
        case 'h': fputs(USAGE, stdout); exit(0);
        case 'V': version_print_and_exit();
        case ':': die_usage("%s needs a value; see --help", argv[optind - 1]);
        default: die_usage("unknown option %s; see --help", argv[optind - 1]);
        }
    }
    if (argc - optind > 1) die_usage("one DATA_DIR expected, got %d arguments; see --help", argc - optind);
    if (argc - optind == 1) copy_path(o->data_dir, argv[optind], "DATA_DIR");
    else if (o->n_splits == 0) read_data_dir_stdin(o);
    size_t dl = strlen(o->data_dir);
    while (dl > 1 && o->data_dir[dl - 1] == '/') o->data_dir[--dl] = '\0';
    if (o->out[0] == '\0') {
        if (!o->data_dir[0]) die_usage("with --split and no DATA_DIR, give -o OUT; see --help");
        if (snprintf(o->out, PATH_CAP, "%s/cifar10.lmdb", o->data_dir) >= PATH_CAP)
            die_usage("DATA_DIR: path too long");
    }
    if (o->n_splits == 0) {
        input_kind_expect(o->data_dir, INPUT_SEED_LAYOUT); /* a dataset already, a run folder */
        if (!fs_is_dir(o->data_dir)) die("%s: not a folder (%s)", o->data_dir,
                                         fs_exists(o->data_dir) ? "a file" : "does not exist");
        default_splits(o);
    }
}

/* ------------------------------------------------------------------ steps */

static void output_check(const Options *o) {
    if (fs_is_dir(o->out)) die("%s: is a folder; give -o a file name", o->out);
    if (fs_exists(o->out) && !o->force)
        die("%s: already exists (use --force to replace it)", o->out);
    /* -f replaces a regular file only: renaming over /dev/null, a FIFO or a device
     * would replace the node itself (and a symlink is not ours to replace). */
    const char *kind = fs_not_regular(o->out);
    if (kind)
        die("%s: is %s, not a regular file: --force replaces only a regular file (a previous "
            "dataset) ---> HINT: give -o a file name", o->out, kind);
    char dir[PATH_CAP];
    fs_dirname(o->out, dir, sizeof dir);
    if (!fs_is_dir(dir)) die("%s: the output folder %s does not exist", o->out, dir);
}

static int same_file(const struct stat *a, const char *path) {
    struct stat b;
    return stat(path, &b) == 0 && a->st_dev == b.st_dev && a->st_ino == b.st_ino;
}

static void refuse_output_is_input(const Options *o, const char *input) {
    die("%s: is an input of this run (%s): refusing to overwrite it ---> HINT: give -o another "
        "file name", o->out, input);
}

/* An existing OUT (replaced with -f) must not be an annotation file: checked before
 * any annotation file is read. */
static void output_not_annotations(const Options *o) {
    struct stat out;
    if (stat(o->out, &out) != 0) return;
    for (int i = 0; i < o->n_splits; i++)
        if (same_file(&out, o->splits[i].ann)) refuse_output_is_input(o, o->splits[i].ann);
}

/* ... nor one of the images: checked before any image is read. */
static void output_not_images(const Options *o, const Annotations *anns) {
    struct stat out;
    if (stat(o->out, &out) != 0) return;
    char path[PATH_CAP];
    for (int i = 0; i < o->n_splits; i++)
        for (int64_t j = 0; j < anns[i].count; j++) {
            convert_image_path(o->splits[i].dir, anns[i].files[j], path, sizeof path);
            if (same_file(&out, path)) refuse_output_is_input(o, path);
        }
}

/* The class names: --classes, else the annotation files' (which must agree), else
 * none. Their count must be --num-classes when both are given. */
static void classes_choose(const Options *o, const Annotations *anns, ClassNames *out) {
    char err[512];
    const ClassNames *from = NULL;
    const char *from_file = NULL;
    if (o->classes_file) {
        if (class_names_load(o->classes_file, out, err, sizeof err)) die("%s: %s", o->classes_file, err);
        from_file = o->classes_file;
    }
    for (int i = 0; i < o->n_splits && !o->classes_file; i++) {
        if (anns[i].classes.count == 0) continue;
        if (from && !class_names_equal(from, &anns[i].classes))
            die("%s: its \"classes\" differ from those of %s ---> HINT: give the same list in every "
                "annotation file, or one with --classes", o->splits[i].ann, from_file);
        if (!from) from = &anns[i].classes, from_file = o->splits[i].ann;
    }
    if (from) class_names_copy(out, from);
    if (out->count && o->num_classes && out->count != o->num_classes)
        die("%s: names %d classes, but --num-classes is %d", from_file, out->count, o->num_classes);
}

static int labels_check(const Options *o, Annotations *anns, const ClassNames *names) {
    int32_t max = 0;
    for (int i = 0; i < o->n_splits; i++)
        if (anns[i].max_label > max) max = anns[i].max_label;
    int k = o->num_classes ? o->num_classes : names->count ? names->count
                                            : max < CLASSES_MAX ? max + 1 : CLASSES_MAX;
    if (max >= k) {
        for (int i = 0; i < o->n_splits; i++)
            for (int64_t j = 0; j < anns[i].count; j++)
                if (anns[i].labels[j] >= k && !o->num_classes && names->count == 0)
                    die("%s: categories[%lld] = %d is above the largest label cifar-prep accepts, "
                        "%d (at most %d classes)",
                        o->splits[i].ann, (long long)j, anns[i].labels[j], CLASSES_MAX - 1,
                        CLASSES_MAX);
                else if (anns[i].labels[j] >= k)
                    die("%s: categories[%lld] = %d is out of range for %d classes (%s)",
                        o->splits[i].ann, (long long)j, anns[i].labels[j], k,
                        o->num_classes ? "--num-classes" : o->classes_file ? o->classes_file
                                                                           : "\"classes\"");
    }
    return k;
}

/* The shape of the first image of the first split: every other must match it. */
static ImageShape shape_probe(const Options *o, const char *dir, const char *name, const char *path) {
    uint8_t *buf = NULL;
    size_t cap = 0, len;
    char why[768];
    ImageShape shape;
    int dirfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dirfd < 0) die("%s: cannot open the image folder (%s)", dir, strerror(errno));
    if (image_file_read(dirfd, name, o->outside_ok, &buf, &cap, &len, why, sizeof why))
        die("%s: %s", path, why);
    close(dirfd);
    ImageDecoder *dec = image_decoder_create();
    if (image_probe(dec, buf, len, &shape, why, sizeof why) != IMAGE_OK) die("%s: %s", path, why);
    image_decoder_free(dec);
    free(buf);
    return shape;
}

int main(int argc, char **argv) {
    log_set_program("cifar-prep");
    Options o;
    options_parse(argc, argv, &o);
    log_set_quiet(o.quiet);
    output_check(&o);
    output_not_annotations(&o);

    Annotations anns[DATASET_MAX_SPLITS];
    char err[1024];
    for (int i = 0; i < o.n_splits; i++) {
        if (annotations_load(o.splits[i].ann, &anns[i], err, sizeof err))
            die("%s: %s", o.splits[i].ann, err);
        if (!fs_is_dir(o.splits[i].dir)) die("%s: image folder not found", o.splits[i].dir);
    }
    DatasetInfo info;
    memset(&info, 0, sizeof info);
    classes_choose(&o, anns, &info.classes);
    int k = labels_check(&o, anns, &info.classes);
    output_not_images(&o, anns);

    char first[PATH_CAP];
    convert_image_path(o.splits[0].dir, anns[0].files[0], first, sizeof first);
    ImageShape shape = shape_probe(&o, o.splits[0].dir, anns[0].files[0], first);

    char out_dir[PATH_CAP];
    fs_dirname(o.out, out_dir, sizeof out_dir);
    fs_remove_stale_temps(out_dir);
    fs_temp_name(o.out, g_temp_path, sizeof g_temp_path);
    signals_install();
    check_set_cleanup(cleanup_temp);
    DatasetWriter *w = dataset_writer_create(o.out, err, sizeof err);
    if (!w) die("%s: %s", o.out, err);
    /* only to start its writeback early (convert.h); -1: the final sync does it all */
    int writeback_fd = open(dataset_writer_temp_path(w), O_RDONLY | O_CLOEXEC);

    info.height = shape.height;
    info.width = shape.width;
    info.channels = shape.channels;
    info.num_classes = k;
    info.n_splits = o.n_splits;
    double t0 = now_seconds();
    int64_t total = 0;
    for (int i = 0; i < o.n_splits; i++) {
        ConvertJob job = {o.splits[i].name, o.splits[i].dir, &anns[i], shape, first,
                          o.threads, w, o.out, o.outside_ok, writeback_fd};
        convert_split(&job, &info.splits[i]);
        total += anns[i].count;
    }
    if (writeback_fd >= 0) close(writeback_fd);
    if (dataset_writer_finish(w, &info, err, sizeof err)) die("%s: %s", o.out, err);
    check_set_cleanup(NULL);
    g_temp_path[0] = '\0';
    dataset_writer_free(w);
    double dt = now_seconds() - t0;
    log_info("wrote %lld images (%dx%dx%d, %d classes) in %.2fs, %.0f img/s", (long long)total,
             shape.height, shape.width, shape.channels, k, dt, dt > 0 ? (double)total / dt : 0.0);
    for (int i = 0; i < o.n_splits; i++) annotations_free(&anns[i]);
    dataset_info_free(&info);
    printf("%s\n", o.out);
    if (fflush(stdout) != 0) die("stdout: %s", strerror(errno));
    return 0;
}
