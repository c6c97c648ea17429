/* dataset_writer.c: writes an LMDB dataset (dataset.h) under a private temporary
 * name, in batches of records, and renames it into place when finished. */
#include "data/dataset.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <lmdb.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fsutil.h"
#include "data/crc32c.h"
#include "data/dataset_record.h"

#define WRITER_INITIAL_MAP (16ull << 20)
#define WRITER_BATCH_RECORDS 1024
#define WRITER_BATCH_BYTES (32ull << 20)
#define WRITER_MAX_RECORD_BYTES (1ull << 30)

/* ------------------------------------------------------------------ writing */

typedef struct {
    char name[32];
    int64_t written; /* records accepted so far (indices must arrive in order) */
} WriterSplit;

/* A batch entry: header, then `vlen` bytes of value (label + pixels). */
typedef struct {
    int32_t split;
    uint32_t vlen;
    int64_t index;
} BatchEntry;

struct DatasetWriter {
    MDB_env *env;
    FsAtomic file; /* the temporary, created and renamed by fs_atomic_* */
    char final_path[4096];
    char temp_path[4200];
    size_t map_size;
    WriterSplit splits[DATASET_MAX_SPLITS];
    int n_splits;
    uint8_t *batch;
    size_t batch_len, batch_cap;
    int64_t batch_count;
    int done; /* 1 once renamed or removed: abort is then a no-op */
};

static void writer_close_env(DatasetWriter *w) {
    if (w->env) mdb_env_close(w->env);
    w->env = NULL;
}

DatasetWriter *dataset_writer_create(const char *path, char *err, size_t errlen) {
    DatasetWriter *w = xcalloc(1, sizeof *w);
    if (strlen(path) >= sizeof w->final_path - 32) {
        snprintf(err, errlen, "path too long");
        free(w);
        return NULL;
    }
    snprintf(w->final_path, sizeof w->final_path, "%s", path);
    if (fs_atomic_begin(&w->file, path, err, errlen) != 0) {
        free(w);
        return NULL;
    }
    snprintf(w->temp_path, sizeof w->temp_path, "%s", w->file.tmp);
    w->map_size = WRITER_INITIAL_MAP;
    int rc = mdb_env_create(&w->env);
    if (!rc) rc = mdb_env_set_maxdbs(w->env, DATASET_MAX_SPLITS + 1);
    if (!rc) rc = mdb_env_set_mapsize(w->env, w->map_size);
    /* NOSYNC: nothing is durable before finish, which syncs once. LMDB opens by
     * name: it gets the exclusive temporary's /proc/self/fd name, not the entry. */
    if (!rc) rc = mdb_env_open(w->env, w->file.reopen, MDB_NOSUBDIR | MDB_NOLOCK | MDB_NOSYNC, 0644);
    if (rc) {
        snprintf(err, errlen, "cannot create the temporary file %s (%s)", w->temp_path,
                 mdb_strerror(rc));
        writer_close_env(w);
        fs_atomic_abort(&w->file);
        free(w);
        return NULL;
    }
    w->batch_cap = 1 << 20;
    w->batch = xmalloc(w->batch_cap);
    return w;
}

const char *dataset_writer_temp_path(const DatasetWriter *w) { return w->temp_path; }

/* "cannot <verb> <temp>: <reason>". LMDB turns a short write on a full disk into
 * EIO, so an EIO with (almost) no space left is reported as the full disk it is. */
static void writer_error(const DatasetWriter *w, const char *verb, int rc, char *err,
                         size_t errlen) {
    struct statvfs vfs;
    char dir[4096];
    fs_dirname(w->temp_path, dir, sizeof dir);
    if (rc == EIO && statvfs(dir, &vfs) == 0 &&
        (uint64_t)vfs.f_bavail * vfs.f_frsize < w->batch_len + (1u << 20))
        rc = ENOSPC;
    snprintf(err, errlen, "cannot %s %s (%s)", verb, w->temp_path, mdb_strerror(rc));
}

/* One attempt at committing the batch in a single transaction; an LMDB code. */
static int writer_try_commit(DatasetWriter *w) {
    MDB_txn *txn;
    int rc = mdb_txn_begin(w->env, NULL, 0, &txn);
    if (rc) return rc;
    MDB_dbi dbi[DATASET_MAX_SPLITS];
    for (int i = 0; i < w->n_splits && !rc; i++)
        rc = mdb_dbi_open(txn, w->splits[i].name, MDB_CREATE, &dbi[i]);
    size_t off = 0;
    for (int64_t n = 0; n < w->batch_count && !rc; n++) {
        BatchEntry e;
        memcpy(&e, w->batch + off, sizeof e);
        off += sizeof e;
        char kbuf[DATASET_KEY_DIGITS + 1];
        key_format(e.index, kbuf);
        MDB_val key = {DATASET_KEY_DIGITS, kbuf}, val = {e.vlen, w->batch + off};
        rc = mdb_put(txn, dbi[e.split], &key, &val, MDB_APPEND);
        off += e.vlen;
    }
    if (rc) {
        mdb_txn_abort(txn);
        return rc;
    }
    return mdb_txn_commit(txn);
}

/* Commit a batch, growing the map (and replaying the batch) whenever it is full. */
static int writer_commit_batch(DatasetWriter *w, char *err, size_t errlen) {
    for (;;) {
        int rc = writer_try_commit(w);
        if (rc == 0) break;
        if (rc == MDB_MAP_FULL) {
            w->map_size *= 2;
            rc = mdb_env_set_mapsize(w->env, w->map_size);
            if (rc == 0) continue;
        }
        writer_error(w, "write", rc, err, errlen);
        return -1;
    }
    w->batch_len = 0;
    w->batch_count = 0;
    return 0;
}

static int writer_split_index(DatasetWriter *w, const char *name, char *err, size_t errlen) {
    for (int i = 0; i < w->n_splits; i++)
        if (strcmp(w->splits[i].name, name) == 0) return i;
    if (!dataset_split_name_valid(name)) {
        snprintf(err, errlen, "invalid split name \"%.40s\" (letters, digits, _-. only; not meta)",
                 name);
        return -1;
    }
    if (w->n_splits == DATASET_MAX_SPLITS) {
        snprintf(err, errlen, "more than %d splits", DATASET_MAX_SPLITS);
        return -1;
    }
    WriterSplit *s = &w->splits[w->n_splits];
    snprintf(s->name, sizeof s->name, "%s", name);
    s->written = 0;
    return w->n_splits++;
}

int dataset_writer_put(DatasetWriter *w, const char *split, int64_t index, int32_t label,
                       const uint8_t *pixels, size_t nbytes, char *err, size_t errlen) {
    if (w->done || !w->env) {
        snprintf(err, errlen, "the writer is closed");
        return -1;
    }
    int si = writer_split_index(w, split, err, errlen);
    if (si < 0) return -1;
    WriterSplit *s = &w->splits[si];
    if (index != s->written || index >= DATASET_MAX_RECORDS) {
        snprintf(err, errlen, "split \"%s\": record %lld out of order (expected %lld, at most %lld)",
                 split, (long long)index, (long long)s->written, DATASET_MAX_RECORDS - 1);
        return -1;
    }
    if (nbytes == 0 || nbytes > WRITER_MAX_RECORD_BYTES) {
        snprintf(err, errlen, "record %s/%lld has %zu pixel bytes", split, (long long)index, nbytes);
        return -1;
    }
    size_t head = record_header_bytes(DATASET_VERSION);
    size_t need = sizeof(BatchEntry) + head + nbytes;
    if (w->batch_len + need > w->batch_cap) {
        while (w->batch_len + need > w->batch_cap) w->batch_cap *= 2;
        w->batch = xrealloc(w->batch, w->batch_cap);
    }
    BatchEntry e = {si, (uint32_t)(head + nbytes), index};
    uint8_t *p = w->batch + w->batch_len;
    memcpy(p, &e, sizeof e);
    p += sizeof e;
    le32_write(p, (uint32_t)label);
    le32_write(p + RECORD_LABEL_BYTES, record_crc(DATASET_VERSION, split, index, p, pixels, nbytes));
    memcpy(p + head, pixels, nbytes);
    w->batch_len += need;
    w->batch_count++;
    s->written++;
    if (w->batch_count >= WRITER_BATCH_RECORDS || w->batch_len >= WRITER_BATCH_BYTES)
        return writer_commit_batch(w, err, errlen);
    return 0;
}

/* The metadata must describe exactly the records written. */
static int writer_check_info(const DatasetWriter *w, const DatasetInfo *info, char *err,
                             size_t errlen) {
    if (info->n_splits != w->n_splits) {
        snprintf(err, errlen, "metadata names %d splits, %d were written", info->n_splits,
                 w->n_splits);
        return -1;
    }
    for (int i = 0; i < w->n_splits; i++) {
        const WriterSplit *s = &w->splits[i];
        int found = 0;
        for (int j = 0; j < info->n_splits; j++) {
            if (strcmp(info->splits[j].name, s->name) != 0) continue;
            found = 1;
            if (info->splits[j].count != s->written) {
                snprintf(err, errlen, "metadata says split \"%s\" has %lld records, %lld written",
                         s->name, (long long)info->splits[j].count, (long long)s->written);
                return -1;
            }
        }
        if (!found) {
            snprintf(err, errlen, "metadata lacks split \"%s\"", s->name);
            return -1;
        }
    }
    char *json = dataset_info_to_json(info);
    DatasetInfo check;
    int rc = dataset_info_parse(json, strlen(json), &check, err, errlen);
    free(json);
    dataset_info_free(&check);
    return rc;
}

static int writer_put_meta(DatasetWriter *w, const DatasetInfo *info, char *err, size_t errlen) {
    DatasetInfo written = *info;
    written.version = DATASET_VERSION; /* the records were written in this version */
    char *json = dataset_info_to_json(&written);
    int rc;
    for (;;) {
        MDB_txn *txn;
        MDB_dbi meta;
        rc = mdb_txn_begin(w->env, NULL, 0, &txn);
        if (rc) break;
        rc = mdb_dbi_open(txn, "meta", MDB_CREATE, &meta);
        MDB_val key = {7, (void *)"dataset"}, val = {strlen(json), json};
        if (!rc) rc = mdb_put(txn, meta, &key, &val, 0);
        char crc[9];
        snprintf(crc, sizeof crc, "%08x", crc32c_extend(0, json, strlen(json)));
        MDB_val ckey = {sizeof META_CRC_KEY - 1, (void *)META_CRC_KEY}, cval = {8, crc};
        if (!rc) rc = mdb_put(txn, meta, &ckey, &cval, 0);
        if (rc)
            mdb_txn_abort(txn);
        else
            rc = mdb_txn_commit(txn);
        if (rc != MDB_MAP_FULL) break;
        w->map_size *= 2;
        rc = mdb_env_set_mapsize(w->env, w->map_size);
        if (rc) break;
    }
    free(json);
    if (rc) writer_error(w, "write", rc, err, errlen);
    return rc ? -1 : 0;
}

int dataset_writer_finish(DatasetWriter *w, const DatasetInfo *info, char *err, size_t errlen) {
    if (w->done || !w->env) {
        snprintf(err, errlen, "the writer is closed");
        return -1;
    }
    if (writer_commit_batch(w, err, errlen) || writer_check_info(w, info, err, errlen) ||
        writer_put_meta(w, info, err, errlen)) {
        dataset_writer_abort(w);
        return -1;
    }
    int rc = mdb_env_sync(w->env, 1);
    if (rc) {
        writer_error(w, "sync", rc, err, errlen);
        dataset_writer_abort(w);
        return -1;
    }
    writer_close_env(w);
    w->done = 1;
    return fs_atomic_commit(&w->file, err, errlen);
}

void dataset_writer_abort(DatasetWriter *w) {
    if (!w || w->done) return;
    writer_close_env(w);
    fs_atomic_abort(&w->file);
    w->done = 1;
}

void dataset_writer_free(DatasetWriter *w) {
    if (!w) return;
    dataset_writer_abort(w);
    free(w->batch);
    free(w);
}
