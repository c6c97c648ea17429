/* cifar-unpack: the official CIFAR-10 binary distribution -> the seed's layout.
 *
 *   cifar-unpack BATCH_DIR OUT_DIR
 *
 * BATCH_DIR is the folder cifar-10-binary.tar.gz unpacks to
 * (cifar-10-batches-bin/), holding data_batch_1.bin .. data_batch_5.bin (the
 * train split, in that order) and test_batch.bin. Each file is a run of
 * 3073-byte records: one label byte (0-9), then the 32x32 image as three
 * 1024-byte planes (red, green, blue), rows top to bottom.
 *
 * Writes OUT_DIR/train_cifar10/img_NNNNN.png and OUT_DIR/test_cifar10/...
 * (RGB PNG, record order kept, so record i of the LMDB is image i of the
 * batches), then OUT_DIR/annotations/cifar10_{train,test}.json last, each
 * through a temporary name and a rename (each with CIFAR-10's class names as
 * "classes"): an interrupted run leaves no annotation file and cifar-prep
 * refuses the folder instead of reading half a split. Prints OUT_DIR as the last stdout line, so `cifar-unpack B D |
 * cifar-prep` chains. Every file is checked before a byte is trusted: its size
 * must be a whole number of records and every label a CIFAR-10 class. */
#include <cjson/cJSON.h>
#include <errno.h>
#include <png.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fsutil.h"
#include "core/version.h"

enum { SIDE = 32, PLANE = SIDE * SIDE, RECORD = 1 + 3 * PLANE, CLASSES = 10 };

/* CIFAR-10's class names, label 0 first (batches.meta.txt of the distribution). */
static const char *const class_names[CLASSES] = {"airplane", "automobile", "bird", "cat", "deer",
                                                 "dog", "frog", "horse", "ship", "truck"};

static const char USAGE[] =
    "usage: cifar-unpack BATCH_DIR OUT_DIR\n"
    "\n"
    "Convert the CIFAR-10 binary distribution (BATCH_DIR = the cifar-10-batches-bin/\n"
    "folder of cifar-10-binary.tar.gz: data_batch_1..5.bin, test_batch.bin) into the\n"
    "seed's layout: OUT_DIR/annotations/cifar10_{train,test}.json (with CIFAR-10's\n"
    "ten class names as \"classes\") and PNG images in OUT_DIR/train_cifar10/ and\n"
    "OUT_DIR/test_cifar10/. Prints OUT_DIR as the last\n"
    "stdout line, so `cifar-unpack BATCH_DIR OUT_DIR | cifar-prep` chains.\n"
    "-h, --help gives this help, --version the version.\n"
    "Exit status: 0 done, 1 failure (one line naming the file), 2 bad usage.\n";

static void png_on_error(png_structp png, png_const_charp msg) {
    const char *path = png_get_error_ptr(png);
    die("%s: cannot write PNG (%s)", path, msg);
}

typedef struct {
    const char *path;
    const uint8_t *hwc;
} PngJob;

static int png_write_stream(FILE *f, void *ctx) {
    const char *path = ((PngJob *)ctx)->path;
    const uint8_t *hwc = ((PngJob *)ctx)->hwc;
    png_structp png = png_create_write_struct(PNG_LIBPNG_VER_STRING, (void *)path, png_on_error, NULL);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    CHECK_ALLOC(info, sizeof(void *));
    png_init_io(png, f);
    png_set_compression_level(png, 1);
    png_set_IHDR(png, info, SIDE, SIDE, 8, PNG_COLOR_TYPE_RGB, PNG_INTERLACE_NONE,
                 PNG_COMPRESSION_TYPE_DEFAULT, PNG_FILTER_TYPE_DEFAULT);
    png_write_info(png, info);
    for (int y = 0; y < SIDE; y++) png_write_row(png, hwc + (size_t)y * SIDE * 3);
    png_write_end(png, NULL);
    png_destroy_write_struct(&png, &info);
    return fflush(f) == 0 ? 0 : -1;
}

/* One 32x32 RGB image (HWC) to `path`, by fs_write_atomic without its fsyncs: the
 * annotation file, written last after a syncfs, commits a split's images. Fast zlib
 * level: these files are read once by cifar-prep, not archived. */
static void png_save(const char *path, const uint8_t *hwc) {
    PngJob job = {path, hwc};
    char err[4400];
    if (fs_write_atomic_stdio(path, png_write_stream, &job, FS_ATOMIC_DEFER_SYNC, err, sizeof err))
        check_fail(__FILE__, __LINE__, path, err, NULL);
}

/* The record's three planes (R, G, B) interleaved into rows of RGB pixels. */
static void record_to_hwc(const uint8_t *rec, uint8_t *hwc) {
    const uint8_t *planes = rec + 1;
    for (int p = 0; p < PLANE; p++)
        for (int c = 0; c < 3; c++) hwc[p * 3 + c] = planes[c * PLANE + p];
}

/* Checked size of a batch file: a positive whole number of records. */
static int64_t batch_records(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) {
        if (errno == ENOENT)
            check_fail(__FILE__, __LINE__, path, "no such file",
                       "give the cifar-10-batches-bin folder of cifar-10-binary.tar.gz "
                       "(data_batch_1..5.bin, test_batch.bin)");
        CHECK_STDIO(0, path);
    }
    if (!S_ISREG(st.st_mode)) die("%s: not a regular file", path);
    if (st.st_size == 0 || st.st_size % RECORD != 0) {
        char reason[160];
        snprintf(reason, sizeof reason,
                 "%lld bytes is not a whole number of %d-byte records "
                 "(1 label byte + 32x32x3 pixels)", (long long)st.st_size, RECORD);
        check_fail(__FILE__, __LINE__, path, reason,
                   "a truncated download or extraction, or not the CIFAR-10 binary version "
                   "(CIFAR-100 records are 3074 bytes); fetch cifar-10-binary.tar.gz again");
    }
    return (int64_t)st.st_size / RECORD;
}

/* Append every record of `path` to the split: images into image_dir (names
 * continue from *next), labels and names into the JSON arrays. */
static void batch_unpack(const char *path, const char *image_dir, int64_t *next, cJSON *images,
                         cJSON *cats) {
    int64_t n = batch_records(path);
    FILE *f = fopen(path, "rb");
    CHECK_STDIO(f != NULL, path);
    uint8_t rec[RECORD], hwc[3 * PLANE];
    char file[64], out[4300];
    for (int64_t i = 0; i < n; i++) {
        if (fread(rec, 1, RECORD, f) != RECORD) {
            if (ferror(f)) CHECK_STDIO(0, path);
            die("%s: ends early at record %lld of %lld (the file shrank while being read)", path,
                (long long)i, (long long)n);
        }
        if (rec[0] >= CLASSES) {
            char reason[96];
            snprintf(reason, sizeof reason, "record %lld: label %d is not a CIFAR-10 class (0-9)",
                     (long long)i, rec[0]);
            check_fail(__FILE__, __LINE__, path, reason,
                       "not the CIFAR-10 binary version, or a damaged file; fetch it again");
        }
        record_to_hwc(rec, hwc);
        snprintf(file, sizeof file, "img_%05lld.png", (long long)*next);
        snprintf(out, sizeof out, "%s/%s", image_dir, file);
        png_save(out, hwc);
        cJSON_AddItemToArray(images, cJSON_CreateString(file));
        cJSON_AddItemToArray(cats, cJSON_CreateNumber(rec[0]));
        (*next)++;
    }
    CHECK_STDIO(fclose(f) == 0, path);
}

/* The annotation document, written whole by fs_write_atomic after a syncfs that
 * makes the split's images (written without fsync) durable first. */
static void json_commit(const char *path, const char *image_dir, cJSON *root) {
    fs_syncfs_or_die(image_dir);
    char *text = cJSON_PrintUnformatted(root);
    CHECK_ALLOC(text, 1 << 20);
    size_t n = strlen(text);
    text[n] = '\n'; /* the NUL becomes the final newline: the buffer is not a string after */
    fs_write_buf_or_die(path, text, n + 1, 0);
    free(text);
}

/* One split from its batch files (in order), e.g. train from data_batch_1..5. */
static void split_unpack(const char *batch_dir, const char *out, const char *name,
                         const char *const *batches, int nbatches) {
    char image_dir[4200], path[4300];
    snprintf(image_dir, sizeof image_dir, "%s/%s_cifar10", out, name);
    CHECK_STDIO(fs_mkdirs(image_dir, 0755) == 0, image_dir);
    cJSON *root = cJSON_CreateObject(), *images = cJSON_AddArrayToObject(root, "images"),
          *cats = cJSON_AddArrayToObject(root, "categories");
    CHECK_ALLOC(cats, 64);
    cJSON *names = cJSON_CreateStringArray(class_names, CLASSES);
    CHECK_ALLOC(names, 256);
    cJSON_AddItemToObject(root, "classes", names);
    int64_t next = 0;
    for (int b = 0; b < nbatches; b++) {
        snprintf(path, sizeof path, "%s/%s", batch_dir, batches[b]);
        batch_unpack(path, image_dir, &next, images, cats);
    }
    snprintf(path, sizeof path, "%s/annotations/cifar10_%s.json", out, name);
    json_commit(path, image_dir, root);
    cJSON_Delete(root);
    log_info("%s: %lld images", name, (long long)next);
}

int main(int argc, char **argv) {
    log_set_program("cifar-unpack");
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
            fputs(USAGE, stdout);
            return 0;
        }
        if (!strcmp(argv[i], "--version")) version_print_and_exit();
        if (argv[i][0] == '-' && argv[i][1]) die_usage("unknown option %s; see --help", argv[i]);
    }
    if (argc != 3) die_usage("give BATCH_DIR and OUT_DIR; see --help");
    const char *batch_dir = argv[1], *out = argv[2];
    if (strlen(batch_dir) > 3000 || strlen(out) > 3000) die_usage("path too long");
    if (!fs_is_dir(batch_dir)) die("%s: not a folder (expected cifar-10-batches-bin/)", batch_dir);

    static const char *const train[] = {"data_batch_1.bin", "data_batch_2.bin", "data_batch_3.bin",
                                        "data_batch_4.bin", "data_batch_5.bin"};
    static const char *const test[] = {"test_batch.bin"};
    /* Check every file's size before writing anything: a missing batch fails at once. */
    for (int b = 0; b < 5; b++) {
        char path[4200];
        snprintf(path, sizeof path, "%s/%s", batch_dir, train[b]);
        batch_records(path);
    }
    char path[4200];
    snprintf(path, sizeof path, "%s/%s", batch_dir, test[0]);
    batch_records(path);

    snprintf(path, sizeof path, "%s/annotations", out);
    CHECK_STDIO(fs_mkdirs(path, 0755) == 0, path);
    split_unpack(batch_dir, out, "train", train, 5);
    split_unpack(batch_dir, out, "test", test, 1);
    printf("%s\n", out);
    if (fflush(stdout) != 0) die("stdout: %s", strerror(errno));
    return 0;
}
