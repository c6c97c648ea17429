/* test_dataset.c: the LMDB dataset format (dataset.h).
 *
 * Writer -> reader round trip (two splits, enough data to make the map grow),
 * the writer's refusals (records out of order, metadata that does not match what
 * was written) and its temporary file, the metadata parser's refusals, and
 * hand-made LMDB files with a record of the wrong length, a label out of range
 * and a missing record, which dataset_load_split must refuse; version-1 files
 * (no checksums) still read; CRC-32C (hardware and table agree with the standard
 * check value); a byte flipped in a written file is named by split and record;
 * records read in place (dataset_map_split) equal the copied ones. */
#define _GNU_SOURCE /* memmem */
#include <fcntl.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/check.h"
#include "data/crc32c.h"
#include "data/dataset.h"
#include "core/fsutil.h"

#include "unit.h"

static char g_dir[256];

static void path_in_dir(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", g_dir, name);
}

static uint8_t pixel_of(int split, int64_t i, size_t k) {
    return (uint8_t)((uint64_t)i * 131u + k * 7u + (uint64_t)split * 29u + (k >> 5));
}

/* ------------------------------------------------------------ round trip */

/* dataset_map_split in place: one pointer per record, the same bytes as written;
 * a second call gives the same arrays; asking for a copy afterwards is refused. */
static void check_in_place(Dataset *ds, const char *name, int s, int64_t count, size_t rec, int K) {
    char err[512];
    HostSplit hs, again;
    int rc = dataset_map_split(ds, name, DATASET_IN_PLACE, &hs, err, sizeof err);
    EXPECT(rc == 0 && hs.count == count && hs.records && !hs.pixels, "map %s: %s", name, err);
    if (rc) return;
    int64_t bad = -1;
    for (int64_t i = 0; i < count && bad < 0; i++) {
        const uint8_t *p = host_split_record(&hs, i, rec);
        if (hs.labels[i] != (int32_t)(i % K) || p[0] != pixel_of(s, i, 0) ||
            p[rec - 1] != pixel_of(s, i, rec - 1))
            bad = i;
    }
    EXPECT(bad < 0, "in place %s: record %lld differs", name, (long long)bad);
    uint8_t *two = xmalloc(2 * rec);
    int32_t lab[2];
    int64_t idx[2] = {count - 1, 0};
    host_split_gather(&hs, rec, idx, 0, 2, two, lab);
    EXPECT(memcmp(two, hs.records[count - 1], rec) == 0 && memcmp(two + rec, hs.records[0], rec) == 0 &&
               lab[0] == hs.labels[count - 1] && lab[1] == hs.labels[0],
           "gather by index copies the records and labels");
    free(two);
    EXPECT(dataset_map_split(ds, name, DATASET_IN_PLACE, &again, err, sizeof err) == 0 &&
               again.records == hs.records && again.labels == hs.labels,
           "a second map of %s gives the same arrays", name);
    EXPECT(dataset_map_split(ds, name, DATASET_COPY, &again, err, sizeof err) != 0,
           "a copy after an in-place map is refused");
}

static void test_round_trip(void) {
    const int H = 32, W = 32, C = 3, K = 10;
    const int64_t counts[2] = {7000, 333}; /* 7000 * 3076 bytes: past the 16 MiB first map */
    const char *names[2] = {"train", "test"};
    size_t rec = (size_t)H * W * C;
    char path[512], err[512];
    path_in_dir(path, sizeof path, "round.lmdb");
    DatasetWriter *w = dataset_writer_create(path, err, sizeof err);
    EXPECT(w != NULL, "create: %s", err);
    if (!w) return;
    EXPECT(fs_exists(dataset_writer_temp_path(w)), "temporary file exists while writing");
    EXPECT(strstr(dataset_writer_temp_path(w), ".tmp-") != NULL, "temp name has .tmp-");
    uint8_t *px = xmalloc(rec);
    DatasetInfo info = {.height = H, .width = W, .channels = C, .num_classes = K, .n_splits = 2};
    for (int s = 0; s < 2; s++) {
        snprintf(info.splits[s].name, sizeof info.splits[s].name, "%s", names[s]);
        info.splits[s].count = counts[s];
        for (int c = 0; c < C; c++) {
            info.splits[s].mean[c] = 0.25f + 0.1f * (float)c;
            info.splits[s].std[c] = 0.125f;
        }
        for (int64_t i = 0; i < counts[s]; i++) {
            for (size_t k = 0; k < rec; k++) px[k] = pixel_of(s, i, k);
            int rc = dataset_writer_put(w, names[s], i, (int32_t)(i % K), px, rec, err, sizeof err);
            EXPECT(rc == 0, "put %s %lld: %s", names[s], (long long)i, err);
            if (rc) break;
        }
    }
    EXPECT(dataset_writer_put(w, "train", 5, 1, px, rec, err, sizeof err) != 0,
           "an index out of order is refused");
    EXPECT(!fs_exists(path), "the final name does not exist before finish");
    int rc = dataset_writer_finish(w, &info, err, sizeof err);
    EXPECT(rc == 0, "finish: %s", err);
    char tmp[600];
    snprintf(tmp, sizeof tmp, "%s", dataset_writer_temp_path(w));
    dataset_writer_free(w);
    EXPECT(!fs_exists(tmp), "no temporary file after finish");
    char lock[600];
    snprintf(lock, sizeof lock, "%s-lock", path);
    EXPECT(!fs_exists(lock), "no lock file next to the dataset");

    Dataset *ds = dataset_open(path, err, sizeof err);
    EXPECT(ds != NULL, "open: %s", err);
    if (!ds) {
        free(px);
        return;
    }
    const DatasetInfo *ri = dataset_info(ds);
    EXPECT(ri->height == H && ri->width == W && ri->channels == C && ri->num_classes == K,
           "shape read back %dx%dx%d K=%d", ri->height, ri->width, ri->channels, ri->num_classes);
    EXPECT(ri->n_splits == 2, "2 splits, got %d", ri->n_splits);
    for (int s = 0; s < 2; s++) {
        const DatasetSplit *sp = dataset_split(ds, names[s]);
        EXPECT(sp && sp->count == counts[s], "split %s count", names[s]);
        if (!sp) continue;
        for (int c = 0; c < C; c++)
            EXPECT(sp->mean[c] == info.splits[s].mean[c] && sp->std[c] == info.splits[s].std[c],
                   "split %s mean/std[%d] exact", names[s], c);
        uint8_t *all = xmalloc((size_t)counts[s] * rec);
        int32_t *labels = xmalloc((size_t)counts[s] * sizeof *labels);
        rc = dataset_load_split(ds, names[s], all, labels, err, sizeof err);
        EXPECT(rc == 0, "load %s: %s", names[s], err);
        int64_t bad = -1;
        for (int64_t i = 0; i < counts[s] && bad < 0 && rc == 0; i++) {
            if (labels[i] != (int32_t)(i % K)) bad = i;
            for (size_t k = 0; k < rec && bad < 0; k++)
                if (all[(size_t)i * rec + k] != pixel_of(s, i, k)) bad = i;
        }
        EXPECT(bad < 0, "split %s record %lld differs", names[s], (long long)bad);
        /* a range in the middle */
        rc = dataset_read_range(ds, names[s], 17, 40, all, labels, err, sizeof err);
        EXPECT(rc == 0 && labels[0] == 17 % K && all[5] == pixel_of(s, 17, 5) &&
                   all[39 * rec + 9] == pixel_of(s, 56, 9),
               "read_range %s: %s", names[s], rc ? err : "wrong data");
        EXPECT(dataset_read_range(ds, names[s], counts[s] - 2, 3, all, labels, err, sizeof err) != 0,
               "a range past the end is refused");
        check_in_place(ds, names[s], s, counts[s], rec, K);
        free(all);
        free(labels);
    }
    EXPECT(dataset_split(ds, "valid") == NULL, "unknown split is NULL");
    int32_t lab;
    EXPECT(dataset_load_split(ds, "valid", px, &lab, err, sizeof err) != 0, "unknown split refused");
    dataset_close(ds);
    free(px);
}

/* ------------------------------------------------------------ writer refusals */

static void test_writer_refusals(void) {
    char path[512], err[512], tmp[600];
    path_in_dir(path, sizeof path, "refuse.lmdb");
    uint8_t px[12] = {0};
    DatasetWriter *w = dataset_writer_create(path, err, sizeof err);
    EXPECT(w != NULL, "create: %s", err);
    if (!w) return;
    snprintf(tmp, sizeof tmp, "%s", dataset_writer_temp_path(w));
    EXPECT(dataset_writer_put(w, "meta", 0, 0, px, 12, err, sizeof err) != 0, "split name meta refused");
    EXPECT(dataset_writer_put(w, "a b", 0, 0, px, 12, err, sizeof err) != 0, "split name with a space refused");
    EXPECT(dataset_writer_put(w, "train", 1, 0, px, 12, err, sizeof err) != 0, "first index 1 refused");
    EXPECT(dataset_writer_put(w, "train", 0, 0, px, 12, err, sizeof err) == 0, "put: %s", err);
    DatasetInfo info = {.height = 2, .width = 2, .channels = 3, .num_classes = 2, .n_splits = 1};
    snprintf(info.splits[0].name, sizeof info.splits[0].name, "train");
    info.splits[0].count = 2; /* one was written */
    EXPECT(dataset_writer_finish(w, &info, err, sizeof err) != 0, "finish with a wrong count refused");
    EXPECT(!fs_exists(tmp) && !fs_exists(path), "failed finish leaves no file");
    dataset_writer_free(w);

    w = dataset_writer_create(path, err, sizeof err);
    EXPECT(w != NULL, "create: %s", err);
    if (!w) return;
    EXPECT(dataset_writer_put(w, "train", 0, 0, px, 12, err, sizeof err) == 0, "put: %s", err);
    dataset_writer_abort(w);
    dataset_writer_abort(w); /* idempotent */
    EXPECT(!fs_exists(tmp) && !fs_exists(path), "abort leaves no file");
    dataset_writer_free(w);

    char nodir[512];
    path_in_dir(nodir, sizeof nodir, "no/such/folder/x.lmdb");
    w = dataset_writer_create(nodir, err, sizeof err);
    EXPECT(w == NULL && strstr(err, "cannot create"), "a missing folder is refused (%s)", err);
    dataset_writer_free(w);
}

/* ------------------------------------------------------------ metadata parser */

static int parse_ok(const char *json) {
    DatasetInfo info;
    char err[256];
    int ok = dataset_info_parse(json, strlen(json), &info, err, sizeof err) == 0;
    dataset_info_free(&info);
    return ok;
}

static void test_info_parse(void) {
    const char *good = "{\"format\":\"cifar-lmdb\",\"version\":1,\"height\":32,\"width\":32,"
                       "\"channels\":3,\"num_classes\":10,\"splits\":{\"train\":{\"count\":5,"
                       "\"mean\":[0.5,0.5,0.5],\"std\":[0.25,0.25,0.25]}}}";
    EXPECT(parse_ok(good), "the reference metadata parses");
    DatasetInfo info;
    char err[256];
    EXPECT(dataset_info_parse(good, strlen(good), &info, err, sizeof err) == 0 && info.n_splits == 1 &&
               info.splits[0].count == 5 && info.splits[0].std[2] == 0.25f,
           "fields read back");
    char *again = dataset_info_to_json(&info);
    DatasetInfo info2;
    EXPECT(dataset_info_parse(again, strlen(again), &info2, err, sizeof err) == 0 &&
               memcmp(&info, &info2, sizeof info) == 0,
           "to_json -> parse is the identity");
    free(again);
    struct {
        const char *from, *to, *why;
    } bad[] = {
        {"cifar-lmdb", "other-lmdb", "wrong format"},
        {"\"version\":1", "\"version\":4", "newer version"},
        {"\"version\":1", "\"version\":0", "version 0"},
        {"\"version\":1", "\"version\":1.5", "fractional version"},
        {"\"height\":32", "\"height\":0", "height 0"},
        {"\"width\":32", "\"width\":5000", "width over the limit"},
        {"\"channels\":3", "\"channels\":5", "5 channels"},
        {"\"num_classes\":10", "\"num_classes\":0", "no classes"},
        {"\"count\":5", "\"count\":-1", "negative count"},
        {"[0.5,0.5,0.5]", "[0.5,0.5]", "mean of the wrong length"},
        {"[0.25,0.25,0.25]", "[0.25,0.25,\"x\"]", "std not a number"},
        {"\"train\":", "\"meta\":", "split named meta"},
        {"\"splits\":{", "\"splits\":[", "splits not an object"},
        {"}}}", "}}", "invalid JSON"},
        {"\"height\":32,", "", "height missing"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[1024];
        const char *at = strstr(good, bad[i].from);
        EXPECT(at != NULL, "test setup: %s", bad[i].from);
        if (!at) continue;
        snprintf(buf, sizeof buf, "%.*s%s%s", (int)(at - good), good, bad[i].to,
                 at + strlen(bad[i].from));
        EXPECT(!parse_ok(buf), "refuses %s", bad[i].why);
    }
    EXPECT(dataset_info_parse(good, 40, &info, err, sizeof err) != 0, "a cut document is refused");
    const char *two = "{\"format\":\"cifar-lmdb\",\"version\":1,\"height\":1,\"width\":1,\"channels\":1,"
                      "\"num_classes\":2,\"splits\":{\"a\":{\"count\":1,\"mean\":[0],\"std\":[0]},"
                      "\"a\":{\"count\":1,\"mean\":[0],\"std\":[0]}}}";
    EXPECT(!parse_ok(two), "a split named twice is refused");
    dataset_info_free(&info);
    dataset_info_free(&info2);
}

/* The optional "classes" list: read back, written again, refused when malformed. */
static void test_info_classes(void) {
    const char *named = "{\"format\":\"cifar-lmdb\",\"version\":2,\"height\":1,\"width\":1,"
                        "\"channels\":1,\"num_classes\":2,\"splits\":{\"a\":{\"count\":1,"
                        "\"mean\":[0],\"std\":[0]}},\"classes\":[\"cat\",\"dog\"]}";
    DatasetInfo info, again;
    char err[256];
    EXPECT(dataset_info_parse(named, strlen(named), &info, err, sizeof err) == 0 &&
               info.classes.count == 2 && strcmp(info.classes.names[1], "dog") == 0,
           "class names read back (%s)", err);
    char *json = dataset_info_to_json(&info);
    EXPECT(dataset_info_parse(json, strlen(json), &again, err, sizeof err) == 0 &&
               class_names_equal(&info.classes, &again.classes),
           "class names survive to_json -> parse (%s)", json);
    free(json);
    dataset_info_free(&info);
    dataset_info_free(&again);
    struct {
        const char *to, *why;
    } bad[] = {
        {"[\"cat\"]", "fewer names than classes"},
        {"[\"cat\",\"dog\",\"eel\"]", "more names than classes"},
        {"[\"cat\",\"cat\"]", "a name given twice"},
        {"[\"cat\",\"d\\tg\"]", "a tab in a name"},
        {"[\"cat\",\"\"]", "an empty name"},
        {"[\"cat\",2]", "a name that is not a string"},
        {"\"cat,dog\"", "not an array"},
    };
    const char *at = strstr(named, "[\"cat\",\"dog\"]");
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char buf[1024];
        snprintf(buf, sizeof buf, "%.*s%s}", (int)(at - named), named, bad[i].to);
        EXPECT(!parse_ok(buf), "refuses %s", bad[i].why);
    }
}

/* ------------------------------------------------------------ hand-made files */

/* An LMDB with good metadata (2x2x1, K=3, split "train" of n records) and the
 * given raw records. */
static void handmade_write_version(const char *path, int version, int n, const char *const *keys,
                                   const uint8_t *const *vals, const size_t *lens) {
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi meta, db;
    unlink(path);
    CHECK_LMDB(mdb_env_create(&env), path);
    CHECK_LMDB(mdb_env_set_maxdbs(env, 4), path);
    CHECK_LMDB(mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOLOCK, 0644), path);
    CHECK_LMDB(mdb_txn_begin(env, NULL, 0, &txn), path);
    CHECK_LMDB(mdb_dbi_open(txn, "meta", MDB_CREATE, &meta), path);
    CHECK_LMDB(mdb_dbi_open(txn, "train", MDB_CREATE, &db), path);
    char json[512];
    snprintf(json, sizeof json,
             "{\"format\":\"cifar-lmdb\",\"version\":%d,\"height\":2,\"width\":2,\"channels\":1,"
             "\"num_classes\":3,\"splits\":{\"train\":{\"count\":%d,\"mean\":[0.5],\"std\":[0.1]}}}",
             version, n);
    MDB_val k = {7, "dataset"}, v = {strlen(json), json};
    CHECK_LMDB(mdb_put(txn, meta, &k, &v, 0), path);
    for (int i = 0; i < n; i++) {
        MDB_val rk = {strlen(keys[i]), (void *)keys[i]}, rv = {lens[i], (void *)vals[i]};
        CHECK_LMDB(mdb_put(txn, db, &rk, &rv, 0), path);
    }
    CHECK_LMDB(mdb_txn_commit(txn), path);
    mdb_env_close(env);
}

/* Version 1 records (label + pixels, no checksum): the layout the tests below use. */
static void handmade_write(const char *path, int n, const char *const *keys,
                           const uint8_t *const *vals, const size_t *lens) {
    handmade_write_version(path, 1, n, keys, vals, lens);
}

static int handmade_load(const char *path, int n, char *err, size_t errlen) {
    Dataset *ds = dataset_open(path, err, errlen);
    if (!ds) return -2;
    uint8_t px[64];
    int32_t labels[16];
    int rc = dataset_load_split(ds, "train", px, labels, err, errlen);
    (void)n;
    dataset_close(ds);
    return rc;
}

static void test_handmade(void) {
    char path[512], err[512];
    path_in_dir(path, sizeof path, "hand.lmdb");
    const uint8_t ok0[8] = {1, 0, 0, 0, 9, 9, 9, 9}, ok1[8] = {2, 0, 0, 0, 1, 2, 3, 4};
    const uint8_t longer[9] = {1, 0, 0, 0, 9, 9, 9, 9, 9};
    const uint8_t big_label[8] = {3, 0, 0, 0, 0, 0, 0, 0};
    const uint8_t neg_label[8] = {0xff, 0xff, 0xff, 0xff, 0, 0, 0, 0};
    const char *keys[2] = {"00000000", "00000001"};
    size_t lens[2] = {8, 8};

    const uint8_t *good[2] = {ok0, ok1};
    handmade_write(path, 2, keys, good, lens);
    EXPECT(handmade_load(path, 2, err, sizeof err) == 0, "a good hand-made file loads: %s", err);

    const uint8_t *wrong_len[2] = {ok0, longer};
    size_t lens_long[2] = {8, 9};
    handmade_write(path, 2, keys, wrong_len, lens_long);
    EXPECT(handmade_load(path, 2, err, sizeof err) == -1 && strstr(err, "00000001") &&
               strstr(err, "bytes"),
           "a record of the wrong length is refused, naming it (%s)", err);

    const uint8_t *bad_label[2] = {ok0, big_label};
    handmade_write(path, 2, keys, bad_label, lens);
    EXPECT(handmade_load(path, 2, err, sizeof err) == -1 && strstr(err, "label 3"),
           "a label >= num_classes is refused (%s)", err);
    const uint8_t *negative[2] = {neg_label, ok1};
    handmade_write(path, 2, keys, negative, lens);
    EXPECT(handmade_load(path, 2, err, sizeof err) == -1 && strstr(err, "label -1"),
           "a negative label is refused (%s)", err);

    const char *gap[2] = {"00000000", "00000002"};
    handmade_write(path, 2, gap, good, lens);
    EXPECT(handmade_load(path, 2, err, sizeof err) == -1 && strstr(err, "missing"),
           "a missing record is refused (%s)", err);

    handmade_write(path, 1, keys, good, lens); /* metadata says 1, table holds 1: fine */
    EXPECT(handmade_load(path, 1, err, sizeof err) == 0, "1 record: %s", err);

    /* the metadata's count disagrees with the table */
    MDB_env *env;
    MDB_txn *txn;
    MDB_dbi db;
    CHECK_LMDB(mdb_env_create(&env), path);
    CHECK_LMDB(mdb_env_set_maxdbs(env, 4), path);
    CHECK_LMDB(mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOLOCK, 0644), path);
    CHECK_LMDB(mdb_txn_begin(env, NULL, 0, &txn), path);
    CHECK_LMDB(mdb_dbi_open(txn, "train", 0, &db), path);
    MDB_val k = {8, "00000007"}, v = {8, (void *)ok1};
    CHECK_LMDB(mdb_put(txn, db, &k, &v, 0), path);
    CHECK_LMDB(mdb_txn_commit(txn), path);
    mdb_env_close(env);
    EXPECT(handmade_load(path, 1, err, sizeof err) == -2 && strstr(err, "holds 2 records"),
           "a table larger than its metadata is refused at open (%s)", err);

    char other[512];
    path_in_dir(other, sizeof other, "not-lmdb.txt");
    FILE *f = fopen(other, "w");
    CHECK_STDIO(f != NULL, other);
    for (int i = 0; i < 2000; i++) fputs("not an lmdb file\n", f);
    fclose(f);
    EXPECT(dataset_open(other, err, sizeof err) == NULL, "a text file is refused");
    path_in_dir(other, sizeof other, "absent.lmdb");
    EXPECT(dataset_open(other, err, sizeof err) == NULL && strstr(err, "No such file"),
           "a missing file is refused (%s)", err);
    EXPECT(dataset_open(g_dir, err, sizeof err) == NULL, "a folder is refused");
}

/* ------------------------------------------------------------ checksums */

static void test_crc32c(void) {
    EXPECT(crc32c_extend(0, "123456789", 9) == 0xe3069283u, "CRC-32C check value: %08x",
           crc32c_extend(0, "123456789", 9));
    EXPECT(crc32c_extend_table(0, "123456789", 9) == 0xe3069283u, "table check value");
    EXPECT(crc32c_extend(0, "", 0) == 0, "empty input");
    size_t n = 20000;
    uint8_t *buf = xmalloc(n);
    for (size_t i = 0; i < n; i++) buf[i] = (uint8_t)(i * 2654435761u >> 13);
    int bad = 0;
    size_t lens[] = {1, 7, 8, 9, 63, 1000, 3071, 3072, 3073, 6144, 9216, 12288, 19990};
    for (size_t k = 0; k < sizeof lens / sizeof lens[0]; k++)
        for (size_t off = 0; off < 8; off += 3) {
            uint32_t hw = crc32c_extend(0, buf + off, lens[k]);
            if (hw != crc32c_extend_table(0, buf + off, lens[k])) bad++;
            size_t cut = lens[k] / 3;
            if (crc32c_extend(crc32c_extend(0, buf + off, cut), buf + off + cut, lens[k] - cut) != hw)
                bad++;
        }
    EXPECT(bad == 0, "hardware, table and split checksums agree (%d differ)", bad);
    free(buf);
}

/* A version-2 record by hand: label, CRC of label + pixels, 4 pixels. */
static void record_v2(uint8_t out[12], int label, const uint8_t px[4]) {
    out[0] = (uint8_t)label;
    out[1] = out[2] = out[3] = 0;
    uint32_t c = dataset_record_crc(out, px, 4);
    for (int i = 0; i < 4; i++) out[4 + i] = (uint8_t)(c >> (8 * i));
    memcpy(out + 8, px, 4);
}

static void test_checksums_handmade(void) {
    char path[512], err[512];
    path_in_dir(path, sizeof path, "crc.lmdb");
    const uint8_t px0[4] = {9, 9, 9, 9}, px1[4] = {1, 2, 3, 4};
    uint8_t r0[12], r1[12];
    record_v2(r0, 1, px0);
    record_v2(r1, 2, px1);
    const char *keys[2] = {"00000000", "00000001"};
    size_t lens[2] = {12, 12};
    const uint8_t *vals[2] = {r0, r1};
    handmade_write_version(path, 2, 2, keys, vals, lens);
    Dataset *ds = dataset_open(path, err, sizeof err);
    EXPECT(ds && dataset_has_checksums(ds), "a version-2 file opens with checksums: %s", err);
    HostSplit hs;
    EXPECT(ds && dataset_map_split(ds, "train", DATASET_COPY, &hs, err, sizeof err) == 0 &&
               hs.pixels && hs.pixels[4] == 1 && hs.pixels[7] == 4 && hs.labels[1] == 2,
           "good version-2 records copy: %s", err);
    dataset_close(ds);

    r1[10] ^= 0x10; /* a pixel */
    handmade_write_version(path, 2, 2, keys, vals, lens);
    EXPECT(handmade_load(path, 2, err, sizeof err) == -1 && strstr(err, "\"train\" record 1 ") &&
               strstr(err, "checksum"),
           "a flipped pixel is named by split and record (%s)", err);
    r1[10] ^= 0x10;
    r1[0] = 0; /* the label: covered by the checksum too */
    handmade_write_version(path, 2, 2, keys, vals, lens);
    EXPECT(handmade_load(path, 2, err, sizeof err) == -1 && strstr(err, "record 1 ") &&
               strstr(err, "checksum"),
           "a changed label fails the checksum (%s)", err);
    const uint8_t v1rec[8] = {1, 0, 0, 0, 9, 9, 9, 9};
    const uint8_t *v1vals[2] = {v1rec, v1rec};
    size_t v1lens[2] = {8, 8};
    handmade_write_version(path, 2, 2, keys, v1vals, v1lens);
    EXPECT(handmade_load(path, 2, err, sizeof err) == -1 && strstr(err, "bytes"),
           "version-1 records under version-2 metadata are refused by length (%s)", err);
    handmade_write_version(path, 1, 2, keys, v1vals, v1lens);
    ds = dataset_open(path, err, sizeof err);
    EXPECT(ds && !dataset_has_checksums(ds) && dataset_info(ds)->version == 1,
           "a version-1 file still opens, without checksums: %s", err);
    EXPECT(ds && dataset_map_split(ds, "train", DATASET_IN_PLACE, &hs, err, sizeof err) == 0 &&
               hs.records[1][0] == 9 && hs.labels[0] == 1,
           "version-1 records read in place: %s", err);
    dataset_close(ds);
}

/* A byte flipped in a file the writer made (found by its pixels) is named. */
static void test_checksum_flip(void) {
    const int H = 8, W = 8, C = 3, K = 10, N = 50, TARGET = 37;
    size_t rec = (size_t)H * W * C;
    char path[512], err[512];
    path_in_dir(path, sizeof path, "flip.lmdb");
    DatasetWriter *w = dataset_writer_create(path, err, sizeof err);
    EXPECT(w != NULL, "create: %s", err);
    if (!w) return;
    uint8_t *px = xmalloc(rec), *target = xmalloc(rec);
    for (int64_t i = 0; i < N; i++) {
        for (size_t k = 0; k < rec; k++) px[k] = pixel_of(0, i, k) ^ (uint8_t)(i * 7 + k * 13);
        if (i == TARGET) memcpy(target, px, rec);
        EXPECT(dataset_writer_put(w, "train", i, (int32_t)(i % K), px, rec, err, sizeof err) == 0,
               "put: %s", err);
    }
    DatasetInfo info = {.height = H, .width = W, .channels = C, .num_classes = K, .n_splits = 1};
    snprintf(info.splits[0].name, sizeof info.splits[0].name, "train");
    info.splits[0].count = N;
    EXPECT(dataset_writer_finish(w, &info, err, sizeof err) == 0, "finish: %s", err);
    dataset_writer_free(w);
    size_t len;
    char *file = fs_read_file(path, 1 << 26, &len);
    EXPECT(file != NULL, "read back %s", path);
    const char *at = file ? memmem(file, len, target, rec) : NULL;
    EXPECT(at != NULL, "record %d's pixels are in the file", TARGET);
    if (at) {
        int fd = open(path, O_WRONLY);
        uint8_t b = (uint8_t)(at[rec / 2] ^ 0x01);
        CHECK_STDIO(fd >= 0 && pwrite(fd, &b, 1, (off_t)(at - file) + (off_t)rec / 2) == 1, path);
        close(fd);
        Dataset *ds = dataset_open(path, err, sizeof err);
        EXPECT(ds != NULL, "the damaged file still opens: %s", err);
        HostSplit hs;
        EXPECT(ds && dataset_map_split(ds, "train", DATASET_IN_PLACE, &hs, err, sizeof err) != 0 &&
                   strstr(err, "\"train\" record 37 "),
               "the flipped byte is named as train record 37 (%s)", err);
        dataset_close(ds);
    }
    free(file);
    free(px);
    free(target);
}

int main(void) {
    log_set_program("test_dataset");
    snprintf(g_dir, sizeof g_dir, "/tmp/test_dataset.XXXXXX");
    CHECK_STDIO(mkdtemp(g_dir) != NULL, g_dir);
    test_round_trip();
    test_writer_refusals();
    test_info_parse();
    test_info_classes();
    test_handmade();
    test_crc32c();
    test_checksums_handmade();
    test_checksum_flip();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return unit_report("test_dataset");
}
