/* safetensors.c: safetensors snapshots (see safetensors.h).
 *
 * Writing: the header is built with cJSON, padded with spaces so that the data
 * section starts 8-byte aligned (as the safetensors library does), and the
 * file goes to "<path>.tmp-<pid>", is fsynced and renamed into place.
 *
 * Reading treats the file as hostile: every number in the header is checked
 * before it is used (header length against the file, dims and offsets as exact
 * non-negative integers, byte counts without overflow, ranges inside the data
 * section, no overlap and no gap), and the data checksum is verified last. */
#include "format/safetensors.h"

#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fsutil.h"

#define SNAP_META_KEY "__metadata__"
/* Largest integer a JSON number (a double in cJSON) holds exactly. */
#define SNAP_MAX_EXACT 9007199254740992.0

static void snap_err(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void snap_err(char *err, size_t errlen, const char *fmt, ...) {
    if (!err || errlen == 0) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, errlen, fmt, ap);
    va_end(ap);
    /* Reasons quote names and values from the file: keep them on one line. */
    for (char *c = err; *c; c++)
        if ((unsigned char)*c < 0x20 || *c == 0x7f) *c = '?';
}

static size_t snap_elsize(SnapDtype d) { return d == SNAP_I64 ? 8 : 4; }

static const char *snap_dtype_name(SnapDtype d) { return d == SNAP_I64 ? "I64" : "F32"; }

static int snap_dtype_parse(const char *s, SnapDtype *out) {
    if (strcmp(s, "F32") == 0) {
        *out = SNAP_F32;
        return 0;
    }
    if (strcmp(s, "I64") == 0) {
        *out = SNAP_I64;
        return 0;
    }
    return -1;
}

/* FNV-1a 64, continued from h (start with SNAP_FNV_OFFSET). */
#define SNAP_FNV_OFFSET 0xcbf29ce484222325ull
static uint64_t snap_fnv1a(uint64_t h, const void *data, size_t n) {
    const unsigned char *p = data;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

/* numel of a shape, 0 on success, -1 on overflow of numel * elsize. */
static int snap_numel(const int64_t *shape, int ndim, size_t elsize, size_t *numel) {
    size_t n = 1;
    for (int d = 0; d < ndim; d++) {
        if (shape[d] < 0) return -1;
        size_t dim = (size_t)shape[d];
        if (dim != 0 && n > SIZE_MAX / elsize / dim) return -1;
        n *= dim;
    }
    *numel = n;
    return 0;
}

/* ------------------------------------------------------------------ writing */

static int snap_names_unique(const SnapTensorIn *t, int n, char *err, size_t errlen) {
    for (int i = 0; i < n; i++)
        for (int j = i + 1; j < n; j++)
            if (strcmp(t[i].name, t[j].name) == 0) {
                snap_err(err, errlen, "tensor name \"%s\" appears twice", t[i].name);
                return -1;
            }
    return 0;
}

/* Check the caller's tensors and metadata; byte sizes into sizes[]. */
static int snap_check_inputs(const SnapTensorIn *t, int n, const SnapMeta *meta, int n_meta,
                             size_t *sizes, char *err, size_t errlen) {
    for (int i = 0; i < n; i++) {
        if (!t[i].name || !t[i].name[0] || strcmp(t[i].name, SNAP_META_KEY) == 0) {
            snap_err(err, errlen, "tensor %d has no usable name", i);
            return -1;
        }
        if (t[i].ndim < 0 || t[i].ndim > 4 || (t[i].dtype != SNAP_F32 && t[i].dtype != SNAP_I64)) {
            snap_err(err, errlen, "tensor %s: bad dtype or ndim %d", t[i].name, t[i].ndim);
            return -1;
        }
        size_t numel;
        if (snap_numel(t[i].shape, t[i].ndim, snap_elsize(t[i].dtype), &numel) != 0) {
            snap_err(err, errlen, "tensor %s: negative or overflowing shape", t[i].name);
            return -1;
        }
        sizes[i] = numel * snap_elsize(t[i].dtype);
        if (sizes[i] > 0 && !t[i].data) {
            snap_err(err, errlen, "tensor %s: no data", t[i].name);
            return -1;
        }
    }
    for (int i = 0; i < n_meta; i++) {
        const char *k = meta[i].key;
        if (!k || !meta[i].value) {
            snap_err(err, errlen, "metadata entry %d is incomplete", i);
            return -1;
        }
        if (!strcmp(k, "format") || !strcmp(k, "format_version") || !strcmp(k, "data_checksum")) {
            snap_err(err, errlen, "metadata key \"%s\" is reserved for the writer", k);
            return -1;
        }
    }
    return snap_names_unique(t, n, err, errlen);
}

/* The padded header text (malloc'd, *len set), or NULL (out of memory). */
static char *snap_header_build(const SnapTensorIn *t, int n, const size_t *sizes,
                               const SnapMeta *meta, int n_meta, uint64_t checksum,
                               size_t *len) {
    cJSON *root = cJSON_CreateObject();
    cJSON *md = cJSON_AddObjectToObject(root, SNAP_META_KEY);
    char sum[17], ver[16];
    snprintf(sum, sizeof sum, "%016" PRIx64, checksum);
    snprintf(ver, sizeof ver, "%d", SNAPSHOT_VERSION);
    cJSON_AddStringToObject(md, "format", SNAPSHOT_FORMAT);
    cJSON_AddStringToObject(md, "format_version", ver);
    cJSON_AddStringToObject(md, "data_checksum", sum);
    for (int i = 0; i < n_meta; i++) cJSON_AddStringToObject(md, meta[i].key, meta[i].value);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        cJSON *e = cJSON_AddObjectToObject(root, t[i].name);
        cJSON_AddStringToObject(e, "dtype", snap_dtype_name(t[i].dtype));
        cJSON *shape = cJSON_AddArrayToObject(e, "shape");
        for (int d = 0; d < t[i].ndim; d++)
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)t[i].shape[d]));
        cJSON *offs = cJSON_AddArrayToObject(e, "data_offsets");
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)off));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(off + sizes[i])));
        off += sizes[i];
    }
    char *text = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!text) return NULL;
    size_t raw = strlen(text);
    size_t padded = (raw + 7) / 8 * 8; /* 8 + padded is a multiple of 8 */
    char *out = realloc(text, padded + 1);
    if (!out) {
        free(text);
        return NULL;
    }
    memset(out + raw, ' ', padded - raw);
    out[padded] = '\0';
    *len = padded;
    return out;
}

typedef struct {
    const char *header;
    size_t hlen;
    const SnapTensorIn *tensors;
    int n;
    const size_t *sizes;
} SnapBody;

/* Header and data to the temporary (fs_write_atomic fsyncs and renames it). */
static int snap_write_fd(int fd, const char *tmp_path, void *ctx, char *err, size_t errlen) {
    (void)tmp_path, (void)err, (void)errlen;
    const SnapBody *b = ctx;
    unsigned char lenbuf[8];
    for (int i = 0; i < 8; i++) lenbuf[i] = (unsigned char)((uint64_t)b->hlen >> (8 * i));
    if (fs_write_all(fd, lenbuf, 8) != 0 || fs_write_all(fd, b->header, b->hlen) != 0) return -1;
    for (int i = 0; i < b->n; i++)
        if (b->sizes[i] > 0 && fs_write_all(fd, b->tensors[i].data, b->sizes[i]) != 0) return -1;
    return 0;
}

int snapshot_write(const char *path, const SnapTensorIn *tensors, int n_tensors,
                   const SnapMeta *meta, int n_meta, char *err, size_t errlen) {
    if (n_tensors < 0 || n_meta < 0) {
        snap_err(err, errlen, "negative tensor or metadata count");
        return -1;
    }
    size_t *sizes = xcalloc((size_t)n_tensors + 1, sizeof *sizes);
    if (snap_check_inputs(tensors, n_tensors, meta, n_meta, sizes, err, errlen) != 0) {
        free(sizes);
        return -1;
    }
    uint64_t sum = SNAP_FNV_OFFSET;
    for (int i = 0; i < n_tensors; i++) sum = snap_fnv1a(sum, tensors[i].data, sizes[i]);
    size_t hlen = 0;
    char *header = snap_header_build(tensors, n_tensors, sizes, meta, n_meta, sum, &hlen);
    CHECK_ALLOC(header, hlen);
    SnapBody body = {header, hlen, tensors, n_tensors, sizes};
    int rc = fs_write_atomic(path, snap_write_fd, &body, err, errlen);
    free(header);
    free(sizes);
    return rc;
}

/* ------------------------------------------------------------------ reading */

/* A JSON number that is an exact integer in [0, 2^53]. */
static int snap_json_uint(const cJSON *j, uint64_t *out) {
    if (!cJSON_IsNumber(j)) return -1;
    double v = j->valuedouble;
    if (!(v >= 0.0 && v <= SNAP_MAX_EXACT) || v != (double)(uint64_t)v) return -1;
    *out = (uint64_t)v;
    return 0;
}

static int snap_meta_parse(const cJSON *md, Snapshot *s, char *err, size_t errlen) {
    if (!cJSON_IsObject(md)) {
        snap_err(err, errlen, "__metadata__ is not an object");
        return -1;
    }
    int n = cJSON_GetArraySize(md);
    s->meta = xcalloc((size_t)n + 1, sizeof *s->meta);
    for (const cJSON *e = md->child; e; e = e->next) {
        if (!cJSON_IsString(e) || !e->string) {
            snap_err(err, errlen, "__metadata__ value \"%.64s\" is not a string",
                     e->string ? e->string : "");
            return -1;
        }
        s->meta[s->n_meta].key = xstrdup(e->string);
        s->meta[s->n_meta].value = xstrdup(e->valuestring);
        s->n_meta++;
    }
    return 0;
}

/* Exactly 16 hex digits. */
static int snap_hex64(const char *s, uint64_t *out) {
    if (!s || strlen(s) != 16) return -1;
    uint64_t v = 0;
    for (int i = 0; i < 16; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0'
              : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = (v << 4) | (uint64_t)d;
    }
    *out = v;
    return 0;
}

/* format, format_version and data_checksum; checked before the tensors so that a
 * foreign or newer file is named as such rather than as "corrupt". */
static int snap_meta_check(const Snapshot *s, uint64_t *checksum, char *err, size_t errlen) {
    const char *fmt = snapshot_meta(s, "format");
    if (!fmt || strcmp(fmt, SNAPSHOT_FORMAT) != 0) {
        snap_err(err, errlen, "not a cifar snapshot (a safetensors file without "
                              "__metadata__.format = \"" SNAPSHOT_FORMAT "\")");
        return -1;
    }
    const char *ver = snapshot_meta(s, "format_version");
    char *end = NULL;
    errno = 0;
    long long v = ver ? strtoll(ver, &end, 10) : 0;
    if (!ver || ver[0] < '0' || ver[0] > '9' || *end != '\0' || errno != 0 || v < 1) {
        snap_err(err, errlen, "bad format_version \"%.32s\"", ver ? ver : "(missing)");
        return -1;
    }
    if (v > SNAPSHOT_VERSION) {
        snap_err(err, errlen, "written by a newer version (format_version %lld; this program "
                              "reads %d): upgrade cifar-train/cifar-eval", v, SNAPSHOT_VERSION);
        return -1;
    }
    if (snap_hex64(snapshot_meta(s, "data_checksum"), checksum) != 0) {
        snap_err(err, errlen, "missing or malformed data_checksum in __metadata__");
        return -1;
    }
    return 0;
}

/* One tensor entry; offsets relative to the data section into b/e. */
static int snap_tensor_parse(const cJSON *j, SnapTensor *t, uint64_t *b, uint64_t *e,
                             char *err, size_t errlen) {
    const char *name = j->string;
    if (!cJSON_IsObject(j)) {
        snap_err(err, errlen, "tensor %.128s: entry is not an object", name);
        return -1;
    }
    const cJSON *dt = cJSON_GetObjectItemCaseSensitive(j, "dtype");
    const cJSON *sh = cJSON_GetObjectItemCaseSensitive(j, "shape");
    const cJSON *of = cJSON_GetObjectItemCaseSensitive(j, "data_offsets");
    if (!cJSON_IsString(dt) || !cJSON_IsArray(sh) || !cJSON_IsArray(of)) {
        snap_err(err, errlen, "tensor %.128s: needs \"dtype\", \"shape\" and \"data_offsets\"", name);
        return -1;
    }
    if (snap_dtype_parse(dt->valuestring, &t->dtype) != 0) {
        snap_err(err, errlen, "tensor %.128s: unsupported dtype \"%.16s\" (F32 and I64 are read)",
                 name, dt->valuestring);
        return -1;
    }
    int ndim = cJSON_GetArraySize(sh);
    if (ndim > 4) {
        snap_err(err, errlen, "tensor %.128s: %d dimensions (at most 4)", name, ndim);
        return -1;
    }
    t->ndim = ndim;
    int d = 0;
    for (const cJSON *x = sh->child; x; x = x->next, d++) {
        uint64_t v;
        if (snap_json_uint(x, &v) != 0) {
            snap_err(err, errlen, "tensor %.128s: shape holds a value that is not a size", name);
            return -1;
        }
        t->shape[d] = (int64_t)v;
    }
    if (cJSON_GetArraySize(of) != 2 || snap_json_uint(of->child, b) != 0 ||
        snap_json_uint(of->child->next, e) != 0 || *e < *b) {
        snap_err(err, errlen, "tensor %.128s: data_offsets must be [begin, end] with begin <= end",
                 name);
        return -1;
    }
    size_t es = snap_elsize(t->dtype);
    if (snap_numel(t->shape, ndim, es, &t->numel) != 0 || t->numel * es != *e - *b) {
        snap_err(err, errlen, "tensor %.128s: shape and dtype %s do not match data_offsets "
                              "[%" PRIu64 ", %" PRIu64 "]", name, snap_dtype_name(t->dtype), *b, *e);
        return -1;
    }
    t->name = xstrdup(name);
    return 0;
}

typedef struct {
    uint64_t b, e;
    int index;
} SnapRange;

static int snap_range_cmp(const void *pa, const void *pb) {
    const SnapRange *a = pa, *b = pb;
    if (a->b != b->b) return a->b < b->b ? -1 : 1;
    if (a->e != b->e) return a->e < b->e ? -1 : 1;
    return 0;
}

/* The ranges must tile [0, data_size): no gap, no overlap, nothing past the end. */
static int snap_ranges_check(SnapRange *r, const Snapshot *s, uint64_t data_size, char *err,
                             size_t errlen) {
    int n = s->n_tensors;
    for (int i = 0; i < n; i++)
        if (r[i].e > data_size) {
            snap_err(err, errlen, "truncated data: tensor %.128s ends at byte %" PRIu64
                     " but the data section holds %" PRIu64 " bytes",
                     s->tensors[r[i].index].name, r[i].e, data_size);
            return -1;
        }
    qsort(r, (size_t)n, sizeof *r, snap_range_cmp);
    uint64_t cur = 0;
    for (int i = 0; i < n; i++) {
        if (r[i].b != cur) {
            snap_err(err, errlen, "tensor %.128s: data_offsets %s the previous tensor (begin %"
                     PRIu64 ", expected %" PRIu64 ")", s->tensors[r[i].index].name,
                     r[i].b < cur ? "overlap" : "leave a gap after", r[i].b, cur);
            return -1;
        }
        cur = r[i].e;
    }
    if (cur != data_size) {
        snap_err(err, errlen, "%" PRIu64 " bytes of data follow the last tensor",
                 data_size - cur);
        return -1;
    }
    return 0;
}

static int snap_name_cmp(const void *pa, const void *pb) {
    return strcmp(*(char *const *)pa, *(char *const *)pb);
}

/* The keys of a JSON object are unique (cJSON keeps duplicate keys). */
static int snap_unique_keys(const cJSON *root, const char *where, char *err, size_t errlen) {
    int n = cJSON_GetArraySize(root);
    const char **names = xcalloc((size_t)n + 1, sizeof *names);
    int k = 0;
    for (const cJSON *e = root->child; e; e = e->next) names[k++] = e->string ? e->string : "";
    qsort(names, (size_t)k, sizeof *names, snap_name_cmp);
    int rc = 0;
    for (int i = 1; i < k && rc == 0; i++)
        if (strcmp(names[i - 1], names[i]) == 0) {
            snap_err(err, errlen, "name \"%.128s\" appears twice in %s", names[i], where);
            rc = -1;
        }
    free(names);
    return rc;
}

/* Tensors of the parsed header; data pointers set relative to data. */
static int snap_tensors_parse(const cJSON *root, Snapshot *s, const unsigned char *data,
                              uint64_t data_size, char *err, size_t errlen) {
    int n = cJSON_GetArraySize(root);
    s->tensors = xcalloc((size_t)n + 1, sizeof *s->tensors);
    SnapRange *r = xcalloc((size_t)n + 1, sizeof *r);
    int rc = 0;
    for (const cJSON *j = root->child; j && rc == 0; j = j->next) {
        if (strcmp(j->string, SNAP_META_KEY) == 0) continue;
        SnapTensor *t = &s->tensors[s->n_tensors];
        uint64_t b = 0, e = 0;
        rc = snap_tensor_parse(j, t, &b, &e, err, errlen);
        if (rc == 0) {
            r[s->n_tensors] = (SnapRange){b, e, s->n_tensors};
            s->n_tensors++;
        }
    }
    if (rc == 0) rc = snap_ranges_check(r, s, data_size, err, errlen);
    if (rc == 0)
        for (int i = 0; i < s->n_tensors; i++) s->tensors[r[i].index].data = data + r[i].b;
    free(r);
    return rc;
}

/* Header text -> JSON object. The text is copied to add the NUL cJSON wants; a
 * NUL inside the header then shows up as trailing garbage and is refused. */
static cJSON *snap_header_parse(const unsigned char *p, size_t n, char *err, size_t errlen) {
    char *text = xmalloc(n + 1);
    memcpy(text, p, n);
    text[n] = '\0';
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(text, &end, 0);
    if (!root) {
        const char *at = cJSON_GetErrorPtr();
        size_t pos = at && at >= text && at <= text + n ? (size_t)(at - text) : 0;
        snap_err(err, errlen, "header is not valid JSON (near byte %zu of %zu)", pos, n);
        free(text);
        return NULL;
    }
    /* safetensors pads the header with spaces; nothing else may follow the JSON. */
    size_t tail = (size_t)(end - text);
    while (tail < n && (text[tail] == ' ' || text[tail] == '\n' || text[tail] == '\t' ||
                        text[tail] == '\r'))
        tail++;
    free(text);
    if (tail != n) {
        snap_err(err, errlen, "header is not valid JSON (extra bytes at %zu of %zu)", tail, n);
        cJSON_Delete(root);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        snap_err(err, errlen, "header is not a JSON object");
        cJSON_Delete(root);
        return NULL;
    }
    return root;
}

static int snap_parse_into(Snapshot *s, char *err, size_t errlen) {
    const unsigned char *p = s->blob;
    size_t size = s->blob_size;
    if (size < 8) {
        snap_err(err, errlen, "too short for a safetensors file (%zu bytes)", size);
        return -1;
    }
    uint64_t hlen = 0;
    for (int b = 7; b >= 0; b--) hlen = (hlen << 8) | p[b];
    if (hlen > SNAPSHOT_MAX_HEADER) {
        snap_err(err, errlen, "header length %" PRIu64 " is over the %u MiB limit (not a "
                 "safetensors file?)", hlen, SNAPSHOT_MAX_HEADER >> 20);
        return -1;
    }
    if (hlen > size - 8) {
        snap_err(err, errlen, "truncated header: header length %" PRIu64 " but only %zu bytes "
                 "follow", hlen, size - 8);
        return -1;
    }
    cJSON *root = snap_header_parse(p + 8, (size_t)hlen, err, errlen);
    if (!root) return -1;
    uint64_t data_size = size - 8 - hlen, want = 0;
    const unsigned char *data = p + 8 + hlen;
    const cJSON *md = cJSON_GetObjectItemCaseSensitive(root, SNAP_META_KEY);
    int rc = snap_unique_keys(root, "the header", err, errlen);
    if (rc == 0 && !md) {
        snap_err(err, errlen, "not a cifar snapshot (no __metadata__)");
        rc = -1;
    }
    if (rc == 0 && cJSON_IsObject(md)) rc = snap_unique_keys(md, "__metadata__", err, errlen);
    if (rc == 0) rc = snap_meta_parse(md, s, err, errlen);
    if (rc == 0) rc = snap_meta_check(s, &want, err, errlen);
    if (rc == 0) rc = snap_tensors_parse(root, s, data, data_size, err, errlen);
    cJSON_Delete(root);
    if (rc != 0) return -1;
    uint64_t got = snap_fnv1a(SNAP_FNV_OFFSET, data, (size_t)data_size);
    if (got != want) {
        snap_err(err, errlen, "checksum mismatch: the file is corrupt (data hashes to %016" PRIx64
                 ", the header says %016" PRIx64 ")", got, want);
        return -1;
    }
    return 0;
}

Snapshot *snapshot_parse(void *blob, size_t size, char *err, size_t errlen) {
    Snapshot *s = xcalloc(1, sizeof *s);
    s->blob = blob;
    s->blob_size = size;
    if (snap_parse_into(s, err, errlen) != 0) {
        snapshot_free(s);
        return NULL;
    }
    return s;
}

/* The whole file into a malloc'd buffer. NULL with a reason. */
static void *snap_slurp(const char *path, size_t *size, char *err, size_t errlen) {
    /* O_NONBLOCK first: a FIFO under a snapshot's name must not block the open. */
    int fd = fs_open_regular(path, O_RDONLY);
    if (fd < 0 && errno == EINVAL) {
        snap_err(err, errlen, "%s, not a regular file", fs_open_regular_why());
        return NULL;
    }
    if (fd < 0) {
        snap_err(err, errlen, "cannot open: %s", strerror(errno));
        return NULL;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        snap_err(err, errlen, "cannot stat: %s", strerror(errno));
        close(fd);
        return NULL;
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = malloc(n ? n : 1);
    if (!buf) {
        snap_err(err, errlen, "out of memory reading %zu bytes", n);
        close(fd);
        return NULL;
    }
    size_t got = 0;
    while (got < n) {
        ssize_t r = read(fd, buf + got, n - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snap_err(err, errlen, "read failed after %zu of %zu bytes: %s", got, n,
                     r < 0 ? strerror(errno) : "the file shrank");
            free(buf);
            close(fd);
            return NULL;
        }
        got += (size_t)r;
    }
    close(fd);
    *size = n;
    return buf;
}

Snapshot *snapshot_read(const char *path, char *err, size_t errlen) {
    size_t size = 0;
    void *blob = snap_slurp(path, &size, err, errlen);
    return blob ? snapshot_parse(blob, size, err, errlen) : NULL;
}

void snapshot_free(Snapshot *s) {
    if (!s) return;
    for (int i = 0; i < s->n_tensors; i++) free(s->tensors[i].name);
    for (int i = 0; i < s->n_meta; i++) {
        free((char *)s->meta[i].key);
        free((char *)s->meta[i].value);
    }
    free(s->tensors);
    free(s->meta);
    free(s->blob);
    free(s);
}

const SnapTensor *snapshot_tensor(const Snapshot *s, const char *name) {
    for (int i = 0; i < s->n_tensors; i++)
        if (strcmp(s->tensors[i].name, name) == 0) return &s->tensors[i];
    return NULL;
}

const char *snapshot_meta(const Snapshot *s, const char *key) {
    for (int i = 0; i < s->n_meta; i++)
        if (strcmp(s->meta[i].key, key) == 0) return s->meta[i].value;
    return NULL;
}

int64_t snapshot_i64(const SnapTensor *t, size_t i) {
    int64_t v;
    memcpy(&v, (const unsigned char *)t->data + i * sizeof v, sizeof v);
    return v;
}

/* ------------------------------------------------------------ run folders */

#define SNAP_PREFIX "snapshot-"
#define SNAP_SUFFIX ".safetensors"

void snapshot_path_for(const char *dir, int64_t epochs, char *buf, size_t buflen) {
    snprintf(buf, buflen, "%s/" SNAP_PREFIX "%06lld" SNAP_SUFFIX, dir, (long long)epochs);
}

/* The epoch count of a snapshot file name, or -1 (temporaries included). */
static int64_t snap_name_epochs(const char *name) {
    size_t plen = strlen(SNAP_PREFIX), slen = strlen(SNAP_SUFFIX), n = strlen(name);
    if (n <= plen + slen || strncmp(name, SNAP_PREFIX, plen) != 0 ||
        strcmp(name + n - slen, SNAP_SUFFIX) != 0)
        return -1;
    int64_t v = 0;
    for (size_t i = plen; i < n - slen; i++) {
        if (name[i] < '0' || name[i] > '9' || v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (name[i] - '0');
    }
    return v;
}

typedef struct {
    int64_t epochs;
    char *path;
} SnapEntry;

static int snap_entry_cmp(const void *pa, const void *pb) {
    const SnapEntry *a = pa, *b = pb;
    if (a->epochs != b->epochs) return a->epochs > b->epochs ? -1 : 1;
    return strcmp(a->path, b->path);
}

char **snapshot_list(const char *dir, int *count) {
    *count = 0;
    DIR *d = opendir(dir);
    if (!d) return NULL;
    SnapEntry *v = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t ep = snap_name_epochs(e->d_name);
        if (ep < 0) continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            v = xrealloc(v, (size_t)cap * sizeof *v);
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        v[n].path = xmalloc(len);
        snprintf(v[n].path, len, "%s/%s", dir, e->d_name);
        v[n].epochs = ep;
        n++;
    }
    closedir(d);
    if (n == 0) {
        free(v);
        return NULL;
    }
    qsort(v, (size_t)n, sizeof *v, snap_entry_cmp);
    char **paths = xmalloc((size_t)n * sizeof *paths);
    for (int i = 0; i < n; i++) paths[i] = v[i].path;
    free(v);
    *count = n;
    return paths;
}

void snapshot_list_free(char **paths, int count) {
    if (!paths) return;
    for (int i = 0; i < count; i++) free(paths[i]);
    free(paths);
}

void snapshot_prune(const char *dir, int keep, int64_t newest) {
    if (keep <= 0) return;
    int n = 0;
    char **paths = snapshot_list(dir, &n);
    int kept = 0;
    for (int i = 0; i < n; i++) {
        const char *base = strrchr(paths[i], '/');
        if (snap_name_epochs(base ? base + 1 : paths[i]) > newest) continue; /* not ours to judge */
        if (kept++ < keep) continue;
        if (unlink(paths[i]) != 0 && errno != ENOENT)
            log_warn("%s: cannot remove old snapshot: %s", paths[i], strerror(errno));
    }
    snapshot_list_free(paths, n);
}
