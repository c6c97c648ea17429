/* dataset.c: the LMDB dataset format: metadata and reader (see dataset.h; the
 * writer is dataset_writer.c).
 *
 * Both sides open the environment with MDB_NOLOCK: readers never run while the
 * file is written (the writer works on a private temporary name), so no lock
 * file is needed, and none is left next to the dataset. */
#include "data/dataset.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <lmdb.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "data/crc32c.h"
#include "data/dataset_record.h"
#include "core/check.h"
#include "core/progress.h"
#include "core/fsutil.h"

#define DATASET_MAX_CLASSES 1000000


uint32_t dataset_record_crc(const uint8_t label_le[4], const uint8_t *pixels, size_t nbytes) {
    return crc32c_extend(crc32c_extend(0, label_le, RECORD_LABEL_BYTES), pixels, nbytes);
}

uint32_t dataset_record_crc_v3(const char *split, int64_t index, const uint8_t label_le[4],
                               const uint8_t *pixels, size_t nbytes) {
    uint8_t where[8];
    for (int b = 0; b < 8; b++) where[b] = (uint8_t)((uint64_t)index >> (8 * b));
    uint32_t c = crc32c_extend(0, split, strlen(split) + 1); /* the name and its NUL */
    c = crc32c_extend(c, where, sizeof where);
    return crc32c_extend(crc32c_extend(c, label_le, RECORD_LABEL_BYTES), pixels, nbytes);
}


int dataset_split_name_valid(const char *name) {
    size_t n = strlen(name);
    if (n == 0 || n >= sizeof(((DatasetSplit *)0)->name)) return 0;
    if (strcmp(name, "meta") == 0) return 0;
    for (size_t i = 0; i < n; i++) {
        char c = name[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-' || c == '.'))
            return 0;
    }
    return 1;
}

/* ------------------------------------------------------------------ metadata */

/* An integer field in [lo, hi]; -1 with a reason otherwise. */
static int json_get_int(const cJSON *obj, const char *key, int64_t lo, int64_t hi, int64_t *out,
                        char *err, size_t errlen) {
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!it) {
        snprintf(err, errlen, "metadata lacks \"%s\"", key);
        return -1;
    }
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v) || v < (double)lo || v > (double)hi) {
        snprintf(err, errlen, "metadata \"%s\" must be an integer in [%lld, %lld]", key,
                 (long long)lo, (long long)hi);
        return -1;
    }
    *out = (int64_t)v;
    return 0;
}

static int json_get_floats(const cJSON *obj, const char *split, const char *key, int n,
                           float *out, char *err, size_t errlen) {
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsArray(arr) || cJSON_GetArraySize(arr) != n) {
        snprintf(err, errlen, "metadata split \"%s\": \"%s\" must be an array of %d numbers", split,
                 key, n);
        return -1;
    }
    int i = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < 0 ||
            it->valuedouble > 1) {
            snprintf(err, errlen, "metadata split \"%s\": \"%s\"[%d] must be a number in [0, 1]",
                     split, key, i);
            return -1;
        }
        out[i++] = (float)it->valuedouble;
    }
    return 0;
}

static int info_parse_split(const cJSON *node, const DatasetInfo *info, DatasetSplit *s, char *err,
                            size_t errlen) {
    const char *name = node->string;
    if (!name || !dataset_split_name_valid(name)) {
        /* The name comes from the file: keep the reason on one line. */
        char shown[41];
        snprintf(shown, sizeof shown, "%s", name ? name : "");
        for (char *c = shown; *c; c++)
            if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
        snprintf(err, errlen, "metadata has an invalid split name \"%s\"", shown);
        return -1;
    }
    if (!cJSON_IsObject(node)) {
        snprintf(err, errlen, "metadata split \"%s\" is not an object", name);
        return -1;
    }
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    int64_t count;
    if (json_get_int(node, "count", 0, DATASET_MAX_RECORDS, &count, err, errlen)) return -1;
    s->count = count;
    if (json_get_floats(node, name, "mean", info->channels, s->mean, err, errlen)) return -1;
    if (json_get_floats(node, name, "std", info->channels, s->std, err, errlen)) return -1;
    return 0;
}

static int info_parse_root(const cJSON *root, DatasetInfo *info, char *err, size_t errlen) {
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "metadata is not a JSON object");
        return -1;
    }
    const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(root, "format");
    if (!cJSON_IsString(fmt) || strcmp(fmt->valuestring, DATASET_FORMAT) != 0) {
        snprintf(err, errlen, "not a %s dataset (metadata \"format\" is %s)", DATASET_FORMAT,
                 cJSON_IsString(fmt) ? "another format" : "missing");
        return -1;
    }
    int64_t version, h, w, c, k;
    if (json_get_int(root, "version", 1, INT32_MAX, &version, err, errlen)) return -1;
    if (version > DATASET_VERSION) {
        snprintf(err, errlen,
                 "written by a newer cifar-prep (format version %lld, this build reads up to %d)",
                 (long long)version, DATASET_VERSION);
        return -1;
    }
    if (json_get_int(root, "height", 1, DATASET_MAX_SIDE, &h, err, errlen) ||
        json_get_int(root, "width", 1, DATASET_MAX_SIDE, &w, err, errlen) ||
        json_get_int(root, "channels", 1, DATASET_MAX_CHANNELS, &c, err, errlen) ||
        json_get_int(root, "num_classes", 1, DATASET_MAX_CLASSES, &k, err, errlen))
        return -1;
    info->version = (int)version;
    info->height = (int)h;
    info->width = (int)w;
    info->channels = (int)c;
    info->num_classes = (int)k;
    const cJSON *splits = cJSON_GetObjectItemCaseSensitive(root, "splits");
    if (!cJSON_IsObject(splits) || cJSON_GetArraySize(splits) < 1 ||
        cJSON_GetArraySize(splits) > DATASET_MAX_SPLITS) {
        snprintf(err, errlen, "metadata \"splits\" must be an object with 1 to %d splits",
                 DATASET_MAX_SPLITS);
        return -1;
    }
    const cJSON *node;
    cJSON_ArrayForEach(node, splits) {
        DatasetSplit *s = &info->splits[info->n_splits];
        if (info_parse_split(node, info, s, err, errlen)) return -1;
        for (int i = 0; i < info->n_splits; i++) {
            if (strcmp(info->splits[i].name, s->name) == 0) {
                snprintf(err, errlen, "metadata names split \"%s\" twice", s->name);
                return -1;
            }
        }
        info->n_splits++;
    }
    const cJSON *classes = cJSON_GetObjectItemCaseSensitive(root, "classes");
    if (!classes) return 0;
    char why[200];
    if (class_names_from_cjson(classes, &info->classes, why, sizeof why)) {
        snprintf(err, errlen, "metadata \"classes\": %s", why);
        return -1;
    }
    if (info->classes.count != info->num_classes) {
        snprintf(err, errlen, "metadata \"classes\" names %d classes, \"num_classes\" is %d",
                 info->classes.count, info->num_classes);
        return -1;
    }
    return 0;
}

int dataset_info_parse(const char *json, size_t len, DatasetInfo *info, char *err, size_t errlen) {
    memset(info, 0, sizeof *info);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        snprintf(err, errlen, "metadata is not valid JSON");
        return -1;
    }
    int rc = info_parse_root(root, info, err, errlen);
    cJSON_Delete(root);
    if (rc) dataset_info_free(info);
    return rc;
}

void dataset_info_free(DatasetInfo *info) {
    class_names_free(&info->classes);
    memset(info, 0, sizeof *info);
}

static cJSON *floats_to_json(const float *v, int n) {
    cJSON *arr = cJSON_CreateArray();
    for (int i = 0; i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((double)v[i]));
    return arr;
}

char *dataset_info_to_json(const DatasetInfo *info) {
    cJSON *root = cJSON_CreateObject();
    CHECK_ALLOC(root, sizeof(cJSON));
    cJSON_AddStringToObject(root, "format", DATASET_FORMAT);
    int version = info->version >= 1 && info->version <= DATASET_VERSION ? info->version
                                                                          : DATASET_VERSION;
    cJSON_AddNumberToObject(root, "version", version);
    cJSON_AddNumberToObject(root, "height", info->height);
    cJSON_AddNumberToObject(root, "width", info->width);
    cJSON_AddNumberToObject(root, "channels", info->channels);
    cJSON_AddNumberToObject(root, "num_classes", info->num_classes);
    cJSON *splits = cJSON_AddObjectToObject(root, "splits");
    int c = info->channels < 0 ? 0 : info->channels > DATASET_MAX_CHANNELS ? DATASET_MAX_CHANNELS
                                                                          : info->channels;
    for (int i = 0; i < info->n_splits && i < DATASET_MAX_SPLITS; i++) {
        const DatasetSplit *s = &info->splits[i];
        cJSON *js = cJSON_AddObjectToObject(splits, s->name);
        cJSON_AddNumberToObject(js, "count", (double)s->count);
        cJSON_AddItemToObject(js, "mean", floats_to_json(s->mean, c));
        cJSON_AddItemToObject(js, "std", floats_to_json(s->std, c));
    }
    if (info->classes.count > 0) {
        cJSON *names = cJSON_AddArrayToObject(root, "classes");
        for (int i = 0; i < info->classes.count; i++)
            cJSON_AddItemToArray(names, cJSON_CreateString(info->classes.names[i]));
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    CHECK_ALLOC(text, 4096);
    return text;
}

/* ------------------------------------------------------------------ reading */

/* A split as dataset_map_split described it (arrays owned by the Dataset). */
typedef struct {
    int mapped;
    DatasetAccess how;
    const uint8_t **records; /* DATASET_IN_PLACE: into the map */
    uint8_t *pixels;         /* DATASET_COPY */
    int32_t *labels;
    uint64_t crcs;           /* FNV-1a of the records' stored CRCs, in index order */
} SplitView;

struct Dataset {
    MDB_env *env;
    MDB_txn *txn; /* read-only, open until dataset_close: the map's pointers stay valid */
    const void *in_map; /* the metadata record: an address inside the file's map */
    int guard;          /* 1 + its SIGBUS guard slot, 0 when unguarded */
    DatasetInfo info;
    MDB_dbi dbi[DATASET_MAX_SPLITS];
    SplitView views[DATASET_MAX_SPLITS];
    uint64_t identity; /* FNV-1a of the metadata JSON, then of each mapped split's CRCs */
};

#define IDENTITY_FNV_OFFSET 0xcbf29ce484222325ull
static uint64_t identity_extend(uint64_t h, const void *data, size_t n) {
    const uint8_t *p = data;
    for (size_t i = 0; i < n; i++) h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

static const char *lmdb_reason(int rc) {
    if (rc == MDB_INVALID) return "not an LMDB file (or a corrupt one)";
    return mdb_strerror(rc);
}

/* Version 3 stores the metadata's CRC-32C beside it: a changed mean or count is
 * refused, not trained with. */
static int meta_check_crc(MDB_txn *txn, MDB_dbi meta, const MDB_val *json, int version, char *err,
                          size_t errlen) {
    if (version < 3) return 0;
    MDB_val key = {sizeof META_CRC_KEY - 1, (void *)META_CRC_KEY}, val;
    int rc = mdb_get(txn, meta, &key, &val);
    char stored[9] = "";
    if (!rc && val.mv_size == 8) memcpy(stored, val.mv_data, 8);
    char actual[9];
    snprintf(actual, sizeof actual, "%08x", crc32c_extend(0, json->mv_data, json->mv_size));
    if (rc || val.mv_size != 8) {
        snprintf(err, errlen, "the metadata's checksum (meta/%s) is missing: not a complete "
                 "cifar-prep file; rebuild it with cifar-prep -f", META_CRC_KEY);
        return -1;
    }
    if (memcmp(stored, actual, 8) != 0) {
        snprintf(err, errlen, "the metadata fails its checksum (CRC-32C %s, stored %.8s): the file "
                 "was changed after cifar-prep wrote it; rebuild it with cifar-prep -f", actual,
                 stored);
        return -1;
    }
    return 0;
}

/* Inside a read transaction: metadata, then each split's table and its size. */
static int dataset_open_tables(Dataset *ds, MDB_txn *txn, char *err, size_t errlen) {
    MDB_dbi meta;
    int rc = mdb_dbi_open(txn, "meta", 0, &meta);
    if (rc) {
        snprintf(err, errlen, "no cifar-lmdb metadata (%s)", lmdb_reason(rc));
        return -1;
    }
    MDB_val key = {7, (void *)"dataset"}, val;
    rc = mdb_get(txn, meta, &key, &val);
    if (rc) {
        snprintf(err, errlen, "no cifar-lmdb metadata record (%s)", lmdb_reason(rc));
        return -1;
    }
    ds->in_map = val.mv_data;
    if (dataset_info_parse(val.mv_data, val.mv_size, &ds->info, err, errlen)) return -1;
    if (meta_check_crc(txn, meta, &val, ds->info.version, err, errlen)) return -1;
    ds->identity = identity_extend(IDENTITY_FNV_OFFSET, val.mv_data, val.mv_size);
    for (int i = 0; i < ds->info.n_splits; i++) {
        const DatasetSplit *s = &ds->info.splits[i];
        MDB_stat st;
        rc = mdb_dbi_open(txn, s->name, 0, &ds->dbi[i]);
        if (!rc) rc = mdb_stat(txn, ds->dbi[i], &st);
        if (rc) {
            snprintf(err, errlen, "split \"%s\" has no records table (%s)", s->name,
                     lmdb_reason(rc));
            return -1;
        }
        if ((int64_t)st.ms_entries != s->count) {
            snprintf(err, errlen, "split \"%s\" holds %zu records, the metadata says %lld",
                     s->name, st.ms_entries, (long long)s->count);
            return -1;
        }
    }
    return 0;
}

/* LMDB maps the file and trusts its header: a page past the end of a truncated
 * file would be a SIGBUS on first touch, so the size is checked before any read. */
static int dataset_check_size(const Dataset *ds, const struct stat *st, char *err,
                              size_t errlen) {
    MDB_envinfo ei;
    MDB_stat ms;
    int rc = mdb_env_info(ds->env, &ei);
    if (!rc) rc = mdb_env_stat(ds->env, &ms);
    if (rc) {
        snprintf(err, errlen, "%s", lmdb_reason(rc));
        return -1;
    }
    uint64_t need = ((uint64_t)ei.me_last_pgno + 1) * (uint64_t)ms.ms_psize;
    if (ei.me_last_pgno >= SIZE_MAX / ms.ms_psize || need > (uint64_t)st->st_size) {
        snprintf(err, errlen,
                 "truncated LMDB file: %lld bytes, its header says %llu pages of %u bytes "
                 "---> HINT: rerun cifar-prep to rebuild it",
                 (long long)st->st_size, (unsigned long long)ei.me_last_pgno + 1, ms.ms_psize);
        return -1;
    }
    return 0;
}

Dataset *dataset_open(const char *path, char *err, size_t errlen) {
    struct stat st;
    if (stat(path, &st) != 0) {
        snprintf(err, errlen, "%s", strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode)) {
        snprintf(err, errlen, "not a regular file (a dataset is one LMDB file)");
        return NULL;
    }
    if (st.st_size == 0) { /* LMDB itself says "Bad file descriptor" */
        snprintf(err, errlen, "an empty file (0 bytes), not a cifar-prep LMDB ---> HINT: rerun "
                 "cifar-prep to rebuild it");
        return NULL;
    }
    Dataset *ds = xcalloc(1, sizeof *ds);
    int rc = mdb_env_create(&ds->env);
    if (!rc) rc = mdb_env_set_maxdbs(ds->env, DATASET_MAX_SPLITS + 1);
    if (!rc)
        rc = mdb_env_open(ds->env, path, MDB_RDONLY | MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOTLS,
                          0644);
    if (rc) {
        snprintf(err, errlen, "%s", lmdb_reason(rc));
        dataset_close(ds);
        return NULL;
    }
    if (dataset_check_size(ds, &st, err, errlen)) {
        dataset_close(ds);
        return NULL;
    }
    MDB_txn *txn;
    rc = mdb_txn_begin(ds->env, NULL, MDB_RDONLY, &txn);
    if (rc) {
        snprintf(err, errlen, "%s", lmdb_reason(rc));
        dataset_close(ds);
        return NULL;
    }
    if (dataset_open_tables(ds, txn, err, errlen)) {
        mdb_txn_abort(txn);
        dataset_close(ds);
        return NULL;
    }
    ds->txn = txn; /* kept: records are read in place for the life of the Dataset */
    return ds;
}

static void map_unguard(Dataset *ds);

void dataset_close(Dataset *ds) {
    if (!ds) return;
    map_unguard(ds);
    for (int i = 0; i < DATASET_MAX_SPLITS; i++) {
        free(ds->views[i].records);
        free(ds->views[i].pixels);
        free(ds->views[i].labels);
    }
    if (ds->txn) mdb_txn_abort(ds->txn);
    if (ds->env) mdb_env_close(ds->env);
    class_names_free(&ds->info.classes);
    free(ds);
}

int dataset_has_checksums(const Dataset *ds) { return ds->info.version >= 2; }

const DatasetInfo *dataset_info(const Dataset *ds) { return &ds->info; }

static int dataset_split_index(const Dataset *ds, const char *name) {
    for (int i = 0; i < ds->info.n_splits; i++)
        if (strcmp(ds->info.splits[i].name, name) == 0) return i;
    return -1;
}

const DatasetSplit *dataset_split(const Dataset *ds, const char *name) {
    int i = dataset_split_index(ds, name);
    return i < 0 ? NULL : &ds->info.splits[i];
}

/* One record's label and pixels, checked: key, length, label and checksum. */
typedef struct {
    int32_t label;
    uint32_t crc; /* as stored (version >= 2), 0 before */
    const uint8_t *pixels;
} RecordRef;

static int record_check(const Dataset *ds, const char *split, int64_t index, const MDB_val *key,
                        const MDB_val *val, RecordRef *out, char *err, size_t errlen) {
    char want[DATASET_KEY_DIGITS + 1];
    key_format(index, want);
    size_t rec = (size_t)ds->info.height * (size_t)ds->info.width * (size_t)ds->info.channels;
    size_t head = record_header_bytes(ds->info.version);
    if (key->mv_size != DATASET_KEY_DIGITS || memcmp(key->mv_data, want, DATASET_KEY_DIGITS)) {
        snprintf(err, errlen, "record %s/%s is missing", split, want);
        return -1;
    }
    if (val->mv_size != head + rec) {
        snprintf(err, errlen, "record %s/%s has %zu bytes, expected %zu (%zu + %dx%dx%d)", split,
                 want, val->mv_size, head + rec, head, ds->info.height, ds->info.width,
                 ds->info.channels);
        return -1;
    }
    const uint8_t *b = val->mv_data;
    if (ds->info.version >= 2) {
        uint32_t stored = le32_read(b + RECORD_LABEL_BYTES);
        uint32_t actual = record_crc(ds->info.version, split, index, b, b + head, rec);
        if (stored != actual) {
            snprintf(err, errlen,
                     "split \"%s\" record %lld fails its checksum (CRC-32C %08x, stored %08x): the "
                     "file was damaged after cifar-prep wrote it (or the record is another one's, "
                     "read under this key); rebuild it with cifar-prep -f",
                     split, (long long)index, actual, stored);
            return -1;
        }
        out->crc = stored;
    }
    int32_t lab = (int32_t)le32_read(b);
    if (lab < 0 || lab >= ds->info.num_classes) {
        snprintf(err, errlen, "record %s/%s has label %d, outside [0, %d)", split, want, lab,
                 ds->info.num_classes);
        return -1;
    }
    out->label = lab;
    out->pixels = b + head;
    return 0;
}

/* What a walk does with each checked record: position i in the walk. */
typedef void (*RecordVisit)(void *ctx, int64_t i, const RecordRef *r);

/* Walk records [first, first+count) of split si in order, checking each. */
static int split_walk(Dataset *ds, int si, int64_t first, int64_t count, RecordVisit visit,
                      void *ctx, char *err, size_t errlen) {
    const char *name = ds->info.splits[si].name;
    MDB_cursor *cur;
    int rc = mdb_cursor_open(ds->txn, ds->dbi[si], &cur);
    if (rc) {
        snprintf(err, errlen, "split \"%s\": %s", name, lmdb_reason(rc));
        return -1;
    }
    char kbuf[DATASET_KEY_DIGITS + 1];
    key_format(first, kbuf);
    MDB_val key = {DATASET_KEY_DIGITS, kbuf}, val = {0, NULL};
    int result = 0;
    for (int64_t i = 0; i < count; i++) {
        rc = mdb_cursor_get(cur, &key, &val, i == 0 ? MDB_SET_KEY : MDB_NEXT);
        if (rc == MDB_NOTFOUND) {
            key.mv_size = 0; /* reported as a missing record below */
        } else if (rc) {
            snprintf(err, errlen, "split \"%s\": %s", name, lmdb_reason(rc));
            result = -1;
            break;
        }
        RecordRef r;
        if (record_check(ds, name, first + i, &key, &val, &r, err, errlen)) {
            result = -1;
            break;
        }
        visit(ctx, i, &r);
    }
    mdb_cursor_close(cur);
    return result;
}

static int split_find(const Dataset *ds, const char *name, char *err, size_t errlen) {
    int si = dataset_split_index(ds, name);
    if (si < 0) snprintf(err, errlen, "no split \"%s\" in the dataset", name);
    return si;
}

typedef struct {
    uint8_t *pixels;
    int32_t *labels;
    size_t rec;
    uint64_t *crcs; /* folded into when not NULL */
} CopyTarget;

static void visit_copy(void *ctx, int64_t i, const RecordRef *r) {
    CopyTarget *t = ctx;
    if (t->crcs) *t->crcs = identity_extend(*t->crcs, &r->crc, sizeof r->crc);
    memcpy(t->pixels + (size_t)i * t->rec, r->pixels, t->rec);
    t->labels[i] = r->label;
}

static size_t dataset_record_bytes(const Dataset *ds) {
    return (size_t)ds->info.height * (size_t)ds->info.width * (size_t)ds->info.channels;
}

int dataset_read_range(Dataset *ds, const char *name, int64_t first, int64_t count,
                       uint8_t *pixels, int32_t *labels, char *err, size_t errlen) {
    int si = split_find(ds, name, err, errlen);
    if (si < 0) return -1;
    const DatasetSplit *s = &ds->info.splits[si];
    if (first < 0 || count < 0 || first > s->count || count > s->count - first) {
        snprintf(err, errlen, "records [%lld, %lld) are outside split \"%s\" (%lld records)",
                 (long long)first, (long long)(first + count), name, (long long)s->count);
        return -1;
    }
    if (count == 0) return 0;
    CopyTarget t = {pixels, labels, dataset_record_bytes(ds), NULL};
    return split_walk(ds, si, first, count, visit_copy, &t, err, errlen);
}

int dataset_load_split(Dataset *ds, const char *name, uint8_t *pixels, int32_t *labels, char *err,
                       size_t errlen) {
    const DatasetSplit *s = dataset_split(ds, name);
    if (!s) {
        snprintf(err, errlen, "no split \"%s\" in the dataset", name);
        return -1;
    }
    return dataset_read_range(ds, name, 0, s->count, pixels, labels, err, errlen);
}

static void visit_in_place(void *ctx, int64_t i, const RecordRef *r) {
    SplitView *v = ctx;
    v->crcs = identity_extend(v->crcs, &r->crc, sizeof r->crc);
    v->records[i] = r->pixels;
    v->labels[i] = r->label;
}

static void view_describe(const SplitView *v, int64_t count, HostSplit *out) {
    out->pixels = v->pixels;
    out->labels = v->labels;
    out->count = count;
    out->records = v->how == DATASET_IN_PLACE ? (const uint8_t *const *)v->records : NULL;
}

int dataset_map_split(Dataset *ds, const char *name, DatasetAccess how, HostSplit *out, char *err,
                      size_t errlen) {
    memset(out, 0, sizeof *out);
    int si = split_find(ds, name, err, errlen);
    if (si < 0) return -1;
    SplitView *v = &ds->views[si];
    int64_t n = ds->info.splits[si].count;
    if (v->mapped && v->how == how) {
        view_describe(v, n, out);
        return 0;
    }
    if (v->mapped) {
        snprintf(err, errlen, "split \"%s\" is already read another way", name);
        return -1;
    }
    v->how = how;
    v->labels = xmalloc((size_t)n * sizeof *v->labels + 1);
    v->crcs = IDENTITY_FNV_OFFSET;
    int rc;
    if (how == DATASET_COPY) {
        v->pixels = xmalloc((size_t)n * dataset_record_bytes(ds) + 1);
        CopyTarget t = {v->pixels, v->labels, dataset_record_bytes(ds), &v->crcs};
        rc = split_walk(ds, si, 0, n, visit_copy, &t, err, errlen);
    } else {
        v->records = xmalloc((size_t)n * sizeof *v->records + 1);
        rc = split_walk(ds, si, 0, n, visit_in_place, v, err, errlen);
    }
    if (rc) return -1;
    v->mapped = 1;
    view_describe(v, n, out);
    return 0;
}

void dataset_identity(const Dataset *ds, char out[DATASET_IDENTITY_CHARS + 1]) {
    uint64_t h = ds->identity;
    for (int i = 0; i < ds->info.n_splits; i++) {
        if (!ds->views[i].mapped) continue;
        h = identity_extend(h, ds->info.splits[i].name, strlen(ds->info.splits[i].name) + 1);
        h = identity_extend(h, &ds->views[i].crcs, sizeof ds->views[i].crcs);
    }
    snprintf(out, DATASET_IDENTITY_CHARS + 1, "%016llx", (unsigned long long)h);
}

/* ------------------------------------------------------------------ for the commands */

/* A file truncated under a running job: its pages past the new end fault with
 * SIGBUS on the next touch. The handler names the file when the address is in a
 * guarded map (messages are formatted beforehand: only write and _exit run in the
 * handler) and leaves any other SIGBUS to the default action. */
#define GUARD_SLOTS 4
typedef struct {
    volatile uintptr_t start, end; /* end == 0: a free slot */
    char msg[1024];
    size_t len;
} MapGuard;
static MapGuard g_guards[GUARD_SLOTS];

static void on_sigbus(int sig, siginfo_t *si, void *uctx) {
    (void)uctx;
    uintptr_t a = (uintptr_t)si->si_addr;
    for (int i = 0; i < GUARD_SLOTS; i++) {
        if (g_guards[i].end && a >= g_guards[i].start && a < g_guards[i].end) {
            ssize_t w = write(STDERR_FILENO, g_guards[i].msg, g_guards[i].len);
            (void)w;
            fs_unlink_temps_now(); /* a snapshot being written must not outlive us */
            _exit(1);
        }
    }
    signal(sig, SIG_DFL); /* not ours: the faulting access repeats under the default */
}

/* The mapping of /proc/self/maps that holds address a (LMDB does not export its
 * map's address: mdb_env_info's me_mapaddr is only set for MDB_FIXEDMAP). */
static int mapping_of(const void *a, uintptr_t *start, uintptr_t *end) {
    FILE *f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    char line[4608];
    int found = -1;
    while (found && fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        if (sscanf(line, "%lx-%lx", &lo, &hi) == 2 && (uintptr_t)a >= lo && (uintptr_t)a < hi) {
            *start = lo;
            *end = hi;
            found = 0;
        }
    }
    fclose(f);
    return found;
}

static void map_guard(Dataset *ds, const char *path) {
    uintptr_t start, end;
    if (mapping_of(ds->in_map, &start, &end) != 0) {
        log_warn("%s: cannot find the dataset's map in /proc/self/maps: a file truncated under "
                 "this job will not be named", path);
        return;
    }
    for (int i = 0; i < GUARD_SLOTS; i++) {
        MapGuard *g = &g_guards[i];
        if (g->end) continue;
        int n = snprintf(g->msg, sizeof g->msg,
                         "%s: %s: the dataset file was truncated or overwritten in place while "
                         "this job read it (SIGBUS); replace datasets by rename (cifar-prep -f "
                         "does) and rerun\n",
                         log_program(), path);
        g->len = n < 0 ? 0 : (size_t)n < sizeof g->msg ? (size_t)n : sizeof g->msg - 1;
        g->start = start;
        g->end = end;
        ds->guard = i + 1;
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_sigaction = on_sigbus;
        sa.sa_flags = SA_SIGINFO;
        sigemptyset(&sa.sa_mask);
        CHECK_STDIO(sigaction(SIGBUS, &sa, NULL) == 0, "sigaction(SIGBUS)");
        return;
    }
    /* more datasets open than slots: this one is simply not named on SIGBUS */
}

void dataset_prepare_for_job(Dataset *ds, const char *path) {
    if (!dataset_has_checksums(ds))
        log_warn_once("%s: format version %d carries no record checksums: records are not verified "
                      "(rebuild it with cifar-prep -f to add them)",
                      path, ds->info.version);
    else if (ds->info.version < 3)
        log_warn_once("%s: format version %d: its checksums cover neither a record's index nor the "
                      "metadata, so a record read under another key or a changed mean is not caught "
                      "(rebuild it with cifar-prep -f to add them)",
                      path, ds->info.version);
    map_guard(ds, path);
}

/* The map goes away with the Dataset: its addresses may serve another mapping. */
static void map_unguard(Dataset *ds) {
    if (ds->guard) g_guards[ds->guard - 1].end = 0;
    ds->guard = 0;
}
