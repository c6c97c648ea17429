/* dataset.h: the LMDB dataset format (README "Data formats"; docs/ARCHITECTURE.md
 * says where it sits).
 *
 * One LMDB environment in a single file (MDB_NOSUBDIR):
 *   db "meta",  key "dataset": JSON {"format":"cifar-lmdb","version":2,"height":H,
 *               "width":W,"channels":C,"num_classes":K,"splits":{NAME:{"count":N,
 *               "mean":[C floats],"std":[C floats]},...},"classes":[K names]}
 *               ("classes" is optional: classes.h; readers without it ignore it)
 *               key "dataset.crc32c" (version 3): the CRC-32C of that JSON, 8 hex digits
 *   db NAME (one per split, e.g. "train", "test"): key = record index as 8 ASCII
 *               digits, value = int32 LE label, uint32 LE CRC-32C, then H*W*C uint8
 *               pixels (HWC). Version 3's CRC covers the split name and its NUL,
 *               the index (int64 LE), the label's 4 bytes and the pixels, so a record
 *               read under another key fails it; version 2's (still read, with a
 *               note) covered label and pixels only. Version 1 (still read, without
 *               verification) had no CRC field: label + pixels.
 * Readers check the magic, the version, every size, every label and every
 * checksum before use.
 *
 * Reading in place: dataset_map_split walks a split once (checking each record),
 * then describes it as one pointer per record into the read-only map. The pixels
 * stay in the page cache, shared by every process that maps the file; private
 * memory holds 12 bytes per record. The map stays valid until dataset_close; a
 * file replaced by rename (cifar-prep -f) leaves the map on the old data. */
#ifndef CIFAR_DATASET_H
#define CIFAR_DATASET_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "data/classes.h"

#ifdef __cplusplus
extern "C" {
#endif

#define DATASET_FORMAT "cifar-lmdb"
#define DATASET_VERSION 3          /* written; 1 and 2 are still read */
#define DATASET_MAX_SPLITS 8
#define DATASET_MAX_CHANNELS 4
#define DATASET_MAX_SIDE 4096      /* images larger than this are refused */

typedef struct {
    char name[32];
    int64_t count;
    float mean[DATASET_MAX_CHANNELS]; /* of pixel/255, per channel */
    float std[DATASET_MAX_CHANNELS];
} DatasetSplit;

typedef struct {
    int version;               /* of the file read; 0 = DATASET_VERSION when written */
    int height, width, channels, num_classes;
    int n_splits;
    DatasetSplit splits[DATASET_MAX_SPLITS];
    ClassNames classes;        /* count 0 when the dataset names none; owned by the
                                  Dataset (reader) or the caller (writer) */
} DatasetInfo;

/* One split as the engines see it: count records of H*W*C uint8 (HWC) and their
 * labels, either contiguous (pixels: record i at i*H*W*C) or one pointer per
 * record (records[i], e.g. into a dataset's map; used when non-NULL). */
typedef struct {
    const uint8_t *pixels;
    const int32_t *labels;
    int64_t count;
    const uint8_t *const *records;
} HostSplit;

/* Record i's H*W*C pixels (rec_bytes = H*W*C), wherever they are. */
static inline const uint8_t *host_split_record(const HostSplit *s, int64_t i, size_t rec_bytes) {
    return s->records ? s->records[i] : s->pixels + (size_t)i * rec_bytes;
}
/* Copy records idx[0..n) (or first..first+n when idx is NULL) into dst
 * (n*rec_bytes, contiguous) and their labels into dst_labels (may be NULL): how
 * an engine that stages data (a GPU's upload or pinned buffer) takes a batch.
 * Inline: the GPU library uses it without importing the host's symbols. */
static inline void host_split_gather(const HostSplit *s, size_t rec_bytes, const int64_t *idx,
                                     int64_t first, int64_t n, uint8_t *dst, int32_t *dst_labels) {
    for (int64_t i = 0; i < n; i++) {
        int64_t r = idx ? idx[i] : first + i;
        memcpy(dst + (size_t)i * rec_bytes, host_split_record(s, r, rec_bytes), rec_bytes);
        if (dst_labels) dst_labels[i] = s->labels[r];
    }
}

/* ---- reading ---- */
typedef struct Dataset Dataset;

/* Open read-only and validate the metadata. NULL with a one-line reason in err
 * (the caller prefixes the path) on any problem: missing file, not an LMDB, no
 * metadata, wrong format or newer version, bad sizes. */
Dataset *dataset_open(const char *path, char *err, size_t errlen);
void dataset_close(Dataset *ds);
const DatasetInfo *dataset_info(const Dataset *ds);
/* The split named `name`, or NULL. */
const DatasetSplit *dataset_split(const Dataset *ds, const char *name);
/* Read every record of a split into pixels[count*H*W*C] and labels[count],
 * checking each record's length, label range and checksum. 0, or -1 with a
 * reason naming the split and record in err. */
int dataset_load_split(Dataset *ds, const char *name, uint8_t *pixels, int32_t *labels,
                       char *err, size_t errlen);
/* Read records [first, first+count) of a split (for streaming loaders). */
int dataset_read_range(Dataset *ds, const char *name, int64_t first, int64_t count,
                       uint8_t *pixels, int32_t *labels, char *err, size_t errlen);

/* How dataset_map_split gives the records: in place (pointers into the map), or
 * copied into one private array (the behaviour before in-place reading; for
 * comparison, or for a file that may be truncated under the job). */
typedef enum { DATASET_IN_PLACE, DATASET_COPY } DatasetAccess;
/* Walk split `name` once, checking every record (key, length, label, checksum),
 * and describe it in *out (arrays owned by ds, valid until dataset_close; a second
 * call for the same split returns the same description). 0, or -1 with a reason
 * naming the split and record in err. */
int dataset_map_split(Dataset *ds, const char *name, DatasetAccess how, HostSplit *out, char *err,
                      size_t errlen);
/* 1 when the file's records carry checksums (version >= 2). */
int dataset_has_checksums(const Dataset *ds);
/* The dataset's identity: 16 hex digits of an FNV-1a 64 over the metadata JSON and
 * the stored CRCs of every split mapped so far (dataset_map_split: the walk reads
 * them anyway), so two datasets of one shape differ. A snapshot records it. */
#define DATASET_IDENTITY_CHARS 16
void dataset_identity(const Dataset *ds, char out[DATASET_IDENTITY_CHARS + 1]);

/* ---- for the commands (cifar-train, cifar-eval): failures end the process ---- */
/* Notes on stderr that a version-1 file carries no checksums, and guards the map:
 * a file truncated under the job ends it (SIGBUS) with one line naming the file
 * and exit status 1, not a core dump. */
void dataset_prepare_for_job(Dataset *ds, const char *path);

/* The CRC-32C stored with a version-2 record (label bytes, then pixels). */
uint32_t dataset_record_crc(const uint8_t label_le[4], const uint8_t *pixels, size_t nbytes);
/* ... and with a version-3 record: split name and NUL, index (int64 LE), label, pixels. */
uint32_t dataset_record_crc_v3(const char *split, int64_t index, const uint8_t label_le[4],
                               const uint8_t *pixels, size_t nbytes);

/* Parse/produce the metadata JSON (exposed for tests and the fuzzer). A parsed
 * info owns its class names: dataset_info_free (also after a failure). */
int dataset_info_parse(const char *json, size_t len, DatasetInfo *info, char *err, size_t errlen);
void dataset_info_free(DatasetInfo *info);
char *dataset_info_to_json(const DatasetInfo *info);

/* ---- writing (cifar-prep) ---- */
typedef struct DatasetWriter DatasetWriter;

/* Create "<path>.tmp-<pid>" (removed again by dataset_writer_abort or on failure);
 * the map grows on demand. NULL with a reason in err. */
DatasetWriter *dataset_writer_create(const char *path, char *err, size_t errlen);
/* Append record `index` of split `name`; records are committed in batched
 * transactions. 0, or -1 with a reason in err. */
int dataset_writer_put(DatasetWriter *w, const char *split, int64_t index, int32_t label,
                       const uint8_t *pixels, size_t nbytes, char *err, size_t errlen);
/* Write the metadata, commit, fsync, rename to the final path, fsync the folder.
 * Checks that `info` names exactly the splits and counts written. On failure the
 * temporary file is removed. Either way the writer is closed (free it after). */
int dataset_writer_finish(DatasetWriter *w, const DatasetInfo *info, char *err, size_t errlen);
/* Close and remove the temporary file (safe to call from a cleanup hook;
 * idempotent; a no-op after a successful finish). */
void dataset_writer_abort(DatasetWriter *w);
/* dataset_writer_abort (when not finished) and release the writer's memory.
 * create ... put ... finish ... free; on failure paths abort alone is enough
 * before exit. */
void dataset_writer_free(DatasetWriter *w);
/* The temporary file's path (for signal-handler cleanup). */
const char *dataset_writer_temp_path(const DatasetWriter *w);

#ifdef __cplusplus
}
#endif
#endif
