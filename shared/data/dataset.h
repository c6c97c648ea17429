/* dataset.h: the LMDB dataset format (ARCHITECTURE.md "Dataset format").
 *
 * One LMDB environment in a single file (MDB_NOSUBDIR):
 *   db "meta",  key "dataset": JSON {"format":"cifar-lmdb","version":1,"height":H,
 *               "width":W,"channels":C,"num_classes":K,"splits":{NAME:{"count":N,
 *               "mean":[C floats],"std":[C floats]},...}}
 *   db NAME (one per split, e.g. "train", "test"): key = record index as 8 ASCII
 *               digits, value = int32 LE label + H*W*C uint8 pixels (HWC).
 * Readers check the magic, the version, every size and every label before use. */
#ifndef CIFAR_DATASET_H
#define CIFAR_DATASET_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define DATASET_FORMAT "cifar-lmdb"
#define DATASET_VERSION 1
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
    int height, width, channels, num_classes;
    int n_splits;
    DatasetSplit splits[DATASET_MAX_SPLITS];
} DatasetInfo;

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
 * checking each record's length and label range. 0, or -1 with a reason
 * naming the record in err. */
int dataset_load_split(Dataset *ds, const char *name, uint8_t *pixels, int32_t *labels,
                       char *err, size_t errlen);
/* Read records [first, first+count) of a split (for streaming loaders). */
int dataset_read_range(Dataset *ds, const char *name, int64_t first, int64_t count,
                       uint8_t *pixels, int32_t *labels, char *err, size_t errlen);

/* Parse/produce the metadata JSON (exposed for tests and the fuzzer). */
int dataset_info_parse(const char *json, size_t len, DatasetInfo *info, char *err, size_t errlen);
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
