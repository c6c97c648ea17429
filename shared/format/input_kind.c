/* input_kind.c: see input_kind.h. */
#include "format/input_kind.h"

#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fsutil.h"
#include "format/safetensors.h"

#define LMDB_MAGIC 0xBEEFC0DEu
#define LMDB_MAGIC_OFFSET 16 /* after the meta page's 16-byte page header */

static InputKind file_kind(const char *path) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC); /* a FIFO must not block */
    if (fd < 0) return INPUT_MISSING;
    unsigned char head[LMDB_MAGIC_OFFSET + 4];
    ssize_t n = read(fd, head, sizeof head);
    close(fd);
    if (n >= 9 && head[8] == '{') return INPUT_SNAPSHOT;
    if (n == (ssize_t)sizeof head) {
        uint32_t magic = (uint32_t)head[16] | (uint32_t)head[17] << 8 | (uint32_t)head[18] << 16 |
                         (uint32_t)head[19] << 24;
        if (magic == LMDB_MAGIC) return INPUT_DATASET;
    }
    return INPUT_FILE;
}

static int has_entry(const char *dir, const char *name) {
    char path[4096];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    return fs_exists(path);
}

static InputKind folder_kind(const char *path) {
    if (has_entry(path, "annotations")) return INPUT_SEED_LAYOUT;
    int count = 0;
    char **snapshots = snapshot_list(path, &count);
    snapshot_list_free(snapshots, count);
    if (count > 0 || has_entry(path, "metrics.jsonl") || has_entry(path, "lock")) return INPUT_RUN_DIR;
    return INPUT_FOLDER;
}

InputKind input_kind_of(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0) return INPUT_MISSING;
    if (S_ISDIR(st.st_mode)) return folder_kind(path);
    if (S_ISREG(st.st_mode)) return file_kind(path);
    return INPUT_FILE;
}

const char *input_kind_name(InputKind kind) {
    switch (kind) {
    case INPUT_MISSING: return "missing";
    case INPUT_SNAPSHOT: return "a snapshot (safetensors)";
    case INPUT_DATASET: return "a cifar-prep dataset (LMDB)";
    case INPUT_SEED_LAYOUT: return "a folder of images in the seed's layout (annotations/ and the image folders)";
    case INPUT_RUN_DIR: return "a cifar-train run folder";
    case INPUT_FOLDER: return "a folder";
    case INPUT_FILE: return "a file of no kind the commands exchange";
    }
    return "?";
}

/* What to do instead, for a path of kind `got` given where `want` belongs. */
static const char *input_kind_hint(InputKind got, InputKind want) {
    if (want == INPUT_SEED_LAYOUT) {
        if (got == INPUT_DATASET) return "it is cifar-prep's output already: give it to cifar-train";
        if (got == INPUT_SNAPSHOT || got == INPUT_RUN_DIR) return "that is cifar-train's output: cifar-eval reads it";
        return "give DATA_DIR with annotations/cifar10_{train,test}.json and the image folders";
    }
    if (want == INPUT_DATASET) {
        if (got == INPUT_SEED_LAYOUT)
            return "run cifar-prep first: cifar-prep DATA_DIR | cifar-train ... (it writes DATA_DIR/cifar10.lmdb)";
        if (got == INPUT_SNAPSHOT || got == INPUT_RUN_DIR)
            return "give the LMDB file cifar-prep wrote; a run continues when rerun with the same --run-dir";
        return "give the LMDB file cifar-prep wrote (DATA_DIR/cifar10.lmdb by default)";
    }
    if (got == INPUT_DATASET)
        return "give a snapshot (RUN_DIR/snapshot-*.safetensors) or a run folder; the dataset goes with --data";
    if (got == INPUT_SEED_LAYOUT)
        return "run cifar-prep and cifar-train first: cifar-prep DATA_DIR | cifar-train ... | cifar-eval";
    return "give a snapshot (RUN_DIR/snapshot-*.safetensors) or a cifar-train run folder";
}

void input_kind_expect(const char *path, InputKind want) {
    InputKind got = input_kind_of(path);
    if (got == want || got == INPUT_MISSING || got == INPUT_FILE) return;
    /* a folder holding the dataset cifar-prep wrote by default: name that file */
    char inside[4096];
    snprintf(inside, sizeof inside, "%s/cifar10.lmdb", path);
    if (want == INPUT_DATASET && (got == INPUT_SEED_LAYOUT || got == INPUT_FOLDER) &&
        input_kind_of(inside) == INPUT_DATASET)
        die_permanent("%s: this is %s, not a dataset ---> HINT: its dataset is %s", path,
                      input_kind_name(got), inside);
    if (got == INPUT_FOLDER) return; /* the reader says "not a regular file" */
    die_permanent("%s: this is %s, not %s ---> HINT: %s", path, input_kind_name(got),
                  input_kind_name(want), input_kind_hint(got, want));
}
