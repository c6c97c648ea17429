/* safetensors.h: training snapshots as safetensors files (README "Data formats",
 * docs/ARCHITECTURE.md).
 *
 *   8-byte LE header length N | N bytes of JSON header | raw tensor data
 *   header: {"__metadata__":{string:string,...},
 *            NAME:{"dtype":"F32"|"I64","shape":[...],"data_offsets":[begin,end]},...}
 * Tensor names are the seed model's state_dict() keys (PyTorch loads them with
 * strict=True) plus "optimizer.*" extras. __metadata__ carries
 * "format":"cifar-snapshot", "format_version", and "data_checksum" (FNV-1a 64 of
 * the data section, hex) plus whatever the trainer records. Reading checks the
 * header length against the file size, every offset against the data size, the
 * dtype/shape against the byte count, and the checksum. */
#ifndef CIFAR_SNAPSHOT_H
#define CIFAR_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define SNAPSHOT_FORMAT "cifar-snapshot"
#define SNAPSHOT_VERSION 1
#define SNAPSHOT_MAX_HEADER (64u << 20)

typedef enum { SNAP_F32, SNAP_I64 } SnapDtype;

typedef struct {
    const char *name;
    SnapDtype dtype;
    int ndim;            /* 0 for a scalar */
    int64_t shape[4];
    const void *data;    /* numel * element size bytes */
} SnapTensorIn;

typedef struct {
    const char *key;
    const char *value;
} SnapMeta;

/* Write atomically: temp file in the same folder, fsync, rename, fsync folder.
 * The "format", "format_version" and "data_checksum" keys are added here.
 * 0, or -1 with a reason in err (the temp file is removed). */
int snapshot_write(const char *path, const SnapTensorIn *tensors, int n_tensors,
                   const SnapMeta *meta, int n_meta, char *err, size_t errlen);

typedef struct {
    char *name;
    SnapDtype dtype;
    int ndim;
    int64_t shape[4];
    size_t numel;
    const void *data;  /* points into the loaded file: 4-byte aligned for files
                          snapshot_write made, but an I64 tensor after an F32 one
                          with an odd count is not 8-byte aligned: copy I64 values
                          out with memcpy (or snapshot_i64) */
} SnapTensor;

typedef struct {
    SnapTensor *tensors;
    int n_tensors;
    SnapMeta *meta;     /* owned strings */
    int n_meta;
    void *blob;         /* the whole file */
    size_t blob_size;
} Snapshot;

/* Read and validate the whole file. NULL with a one-line reason in err (the
 * caller prefixes the path): "not a cifar snapshot ...", "written by a newer
 * version ...", "checksum mismatch: the file is corrupt ...", "truncated ...". */
Snapshot *snapshot_read(const char *path, char *err, size_t errlen);
/* Validate an in-memory image (the fuzzer's entry point; takes ownership of blob). */
Snapshot *snapshot_parse(void *blob, size_t size, char *err, size_t errlen);
void snapshot_free(Snapshot *s);
const SnapTensor *snapshot_tensor(const Snapshot *s, const char *name);
const char *snapshot_meta(const Snapshot *s, const char *key);
/* Element i of an I64 tensor (alignment-safe). */
int64_t snapshot_i64(const SnapTensor *t, size_t i);

/* Snapshot files of a run folder are "<dir>/snapshot-<epochs, 6 digits>.safetensors".
 * snapshot_path_for builds that name. */
void snapshot_path_for(const char *dir, int64_t epochs, char *buf, size_t buflen);
/* The paths of the run's snapshots, newest (highest epoch) first; *count set.
 * Free with snapshot_list_free. Temporaries are not listed. NULL with *count 0
 * when the folder is missing or holds none. */
char **snapshot_list(const char *dir, int *count);
void snapshot_list_free(char **paths, int count);
/* Delete all but the newest `keep` snapshots named at most step `newest` (keep <= 0:
 * keep all). A name beyond `newest` (a copied file, or a run's future) is never
 * deleted: the run that prunes resumed from the most progress it could read. */
void snapshot_prune(const char *dir, int keep, int64_t newest);

#ifdef __cplusplus
}
#endif
#endif
