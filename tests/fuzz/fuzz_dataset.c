/* fuzz_dataset.c: libFuzzer target for the LMDB dataset reader (dataset.h).
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Ishared tests/fuzz/fuzz_dataset.c \
 *         shared/data/dataset.c shared/data/crc32c.c shared/core/check.c shared/core/progress.c \
 *         shared/core/fsutil.c \
 *         -llmdb -lcjson -lm -o fuzz_dataset
 *   ./fuzz_dataset tests/fuzz/corpus_dataset
 *
 * The first input byte picks what the rest is:
 *   0: the metadata JSON alone: dataset_info_parse, and for an accepted document the
 *      round trip through dataset_info_to_json must parse to the same info;
 *   1: a whole LMDB built from the input: the metadata JSON up to a NUL byte, then
 *      records [table byte][key byte][length, 2 bytes LE][value]; the table byte picks
 *      "train", "test", "meta" or "other", the key byte the record's index (so keys
 *      can repeat, skip or be missing) or a key that is not 8 digits;
 *   2: the same LMDB as 1, then the file cut short or extended with zeros: the byte
 *      after the last 0xff 0xfe marker says to how many 256ths of its size.
 * Bytes overwritten inside the LMDB's B-tree pages are not fuzzed: liblmdb trusts its
 * pages and crashes on them (found here: SEGV in mdb_dbi_open); the format has no
 * checksum over the file that would let the reader refuse them first.
 * Every accepted dataset is read in full and in pieces, copied and in place: the
 * reader must give records or a one-line reason, never a crash or an out-of-bounds
 * access (in place: every byte of every record the map describes is read). Version-2
 * metadata makes every record's checksum checked first. */
#include <errno.h>
#include <fcntl.h>
#include <lmdb.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "data/dataset.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char g_path[256];

/* A broken promise of the reader: say which, then abort (libFuzzer keeps the input). */
#define FUZZ_FAIL(...)                     \
    do {                                   \
        fprintf(stderr, "fuzz_dataset: "); \
        fprintf(stderr, __VA_ARGS__);      \
        fprintf(stderr, "\n");             \
        abort();                           \
    } while (0)

static void fuzz_path_init(void) {
    if (g_path[0]) return;
    const char *dir = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(g_path, sizeof g_path, "%s/fuzz_dataset-%ld.lmdb", dir, (long)getpid());
}

static void fuzz_reason_check(const char *err) {
    if (err[0] == '\0' || strchr(err, '\n')) FUZZ_FAIL("reason empty or not one line: \"%s\"", err);
}

static void fuzz_meta(const uint8_t *data, size_t size) {
    DatasetInfo info, again;
    char err[512] = "";
    if (dataset_info_parse((const char *)data, size, &info, err, sizeof err) != 0) {
        fuzz_reason_check(err);
        return;
    }
    char *json = dataset_info_to_json(&info);
    if (dataset_info_parse(json, strlen(json), &again, err, sizeof err) != 0)
        FUZZ_FAIL("own JSON refused: %s: %s", err, json);
    if (again.height != info.height || again.width != info.width ||
        again.channels != info.channels || again.num_classes != info.num_classes ||
        again.n_splits != info.n_splits)
        FUZZ_FAIL("round trip changed the sizes");
    for (int i = 0; i < info.n_splits; i++)
        if (strcmp(again.splits[i].name, info.splits[i].name) != 0 ||
            again.splits[i].count != info.splits[i].count)
            FUZZ_FAIL("round trip changed split %d", i);
    if (!class_names_equal(&info.classes, &again.classes)) FUZZ_FAIL("round trip changed the class names");
    free(json);
    dataset_info_free(&info);
    dataset_info_free(&again);
}

/* Write the LMDB of mode 1 to g_path. 0, or -1 when LMDB refused the input (a key
 * too long, an empty key): nothing to read then. */
static int fuzz_build_lmdb(const uint8_t *data, size_t size) {
    static const char *tables[] = {"train", "test", "meta", "other"};
    const uint8_t *nul = memchr(data, 0, size);
    size_t meta_len = nul ? (size_t)(nul - data) : size;
    MDB_env *env;
    MDB_txn *txn;
    unlink(g_path);
    if (mdb_env_create(&env)) return -1;
    mdb_env_set_maxdbs(env, 8);
    mdb_env_set_mapsize(env, 64u << 20);
    if (mdb_env_open(env, g_path, MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOSYNC, 0644) ||
        mdb_txn_begin(env, NULL, 0, &txn)) {
        mdb_env_close(env);
        return -1;
    }
    MDB_dbi dbi[4];
    int rc = 0;
    for (int t = 0; t < 4 && !rc; t++) rc = mdb_dbi_open(txn, tables[t], MDB_CREATE, &dbi[t]);
    MDB_val key = {7, "dataset"}, val = {meta_len, (void *)data};
    if (!rc && meta_len > 0) rc = mdb_put(txn, dbi[2], &key, &val, 0);
    size_t off = nul ? meta_len + 1 : size;
    while (!rc && off + 4 <= size) {
        int table = data[off] & 3, k = data[off + 1];
        size_t len = (size_t)data[off + 2] | (size_t)data[off + 3] << 8;
        off += 4;
        if (len > size - off) len = size - off;
        char kbuf[16];
        if (k == 255)
            snprintf(kbuf, sizeof kbuf, "x%d", (int)(len & 7)); /* not 8 digits */
        else
            snprintf(kbuf, sizeof kbuf, "%08d", k);
        MDB_val rk = {strlen(kbuf), kbuf}, rv = {len, (void *)(data + off)};
        rc = mdb_put(txn, dbi[table], &rk, &rv, 0);
        off += len;
    }
    if (rc) {
        mdb_txn_abort(txn);
        mdb_env_close(env);
        return -1;
    }
    rc = mdb_txn_commit(txn);
    mdb_env_sync(env, 1);
    mdb_env_close(env);
    return rc ? -1 : 0;
}

/* Mode 2's damage: new length = size * d[0] / 256 (0 doubles the file). */
static void fuzz_damage(const uint8_t *d, size_t n) {
    if (n == 0) return;
    int fd = open(g_path, O_RDWR);
    if (fd < 0) return;
    off_t file = lseek(fd, 0, SEEK_END);
    off_t len = d[0] ? file * d[0] / 256 : file * 2;
    if (ftruncate(fd, len) != 0) { /* the reader then sees the file as it is */ }
    close(fd);
}

static volatile unsigned g_sink;

/* The split in place: every record's bytes are read (ASan checks them against the
 * map) and every label is in range. */
static void fuzz_in_place(Dataset *ds, const DatasetSplit *sp, size_t rec) {
    const DatasetInfo *info = dataset_info(ds);
    HostSplit hs;
    char err[512] = "";
    if (dataset_map_split(ds, sp->name, DATASET_IN_PLACE, &hs, err, sizeof err) != 0) {
        fuzz_reason_check(err);
        return;
    }
    if (hs.count != sp->count) FUZZ_FAIL("in-place %s has %lld records, not %lld", sp->name,
                                         (long long)hs.count, (long long)sp->count);
    unsigned sum = 0;
    for (int64_t i = 0; i < hs.count; i++) {
        const uint8_t *p = host_split_record(&hs, i, rec);
        for (size_t k = 0; k < rec; k++) sum += p[k];
        if (hs.labels[i] < 0 || hs.labels[i] >= info->num_classes)
            FUZZ_FAIL("label %d accepted in place with %d classes", hs.labels[i], info->num_classes);
    }
    g_sink += sum; /* keeps the reads */
}

static void fuzz_read_all(Dataset *ds) {
    const DatasetInfo *info = dataset_info(ds);
    size_t rec = (size_t)info->height * info->width * info->channels;
    char err[512];
    for (int s = 0; s < info->n_splits; s++) {
        const DatasetSplit *sp = &info->splits[s];
        if (dataset_split(ds, sp->name) != sp) FUZZ_FAIL("split %s not found by name", sp->name);
        int64_t n = sp->count > 64 ? 64 : sp->count; /* bounded work per input */
        if (rec > (64u << 20) / (size_t)(n + 1)) n = 1;
        uint8_t *pixels = malloc((size_t)n * rec + 1);
        int32_t *labels = malloc((size_t)n * sizeof *labels + 1);
        if (!pixels || !labels) FUZZ_FAIL("out of memory");
        err[0] = '\0';
        if (dataset_read_range(ds, sp->name, 0, n, pixels, labels, err, sizeof err) == 0) {
            for (int64_t i = 0; i < n; i++)
                if (labels[i] < 0 || labels[i] >= info->num_classes)
                    FUZZ_FAIL("label %d accepted with %d classes", labels[i], info->num_classes);
        } else {
            fuzz_reason_check(err);
        }
        /* a piece from the middle, and one past the end (must be refused) */
        if (n > 1) {
            err[0] = '\0';
            if (dataset_read_range(ds, sp->name, n / 2, 1, pixels, labels, err, sizeof err))
                fuzz_reason_check(err);
        }
        if (dataset_read_range(ds, sp->name, sp->count, 1, pixels, labels, err, sizeof err) == 0)
            FUZZ_FAIL("record past the end of %s accepted", sp->name);
        free(pixels);
        free(labels);
        fuzz_in_place(ds, sp, rec);
    }
    if (dataset_read_range(ds, "no-such-split", 0, 0, NULL, NULL, err, sizeof err) == 0)
        FUZZ_FAIL("a split that does not exist accepted");
}

static void fuzz_lmdb(const uint8_t *data, size_t size, int damaged) {
    fuzz_path_init();
    size_t build = size, damage = size; /* damage list: data[damage, size) */
    if (damaged) { /* split at the last 0xff 0xfe; without one, all of it is damage */
        build = damage = 0;
        for (size_t i = size; i >= 2; i--)
            if (data[i - 2] == 0xff && data[i - 1] == 0xfe) {
                build = i - 2;
                damage = i;
                break;
            }
    }
    if (fuzz_build_lmdb(data, build) != 0) {
        unlink(g_path);
        return;
    }
    if (damaged) fuzz_damage(data + damage, size - damage);
    char err[512] = "";
    Dataset *ds = dataset_open(g_path, err, sizeof err);
    if (ds) {
        fuzz_read_all(ds);
        dataset_close(ds);
    } else {
        fuzz_reason_check(err);
    }
    unlink(g_path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    switch (data[0] % 3) {
    case 0: fuzz_meta(data + 1, size - 1); break;
    case 1: fuzz_lmdb(data + 1, size - 1, 0); break;
    default: fuzz_lmdb(data + 1, size - 1, 1); break;
    }
    return 0;
}
