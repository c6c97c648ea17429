/* annotations.c: see annotations.h. */
#include "annotations.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/check.h"
#include "core/fsutil.h"

#define ANNOTATIONS_MAX_BYTES (4ull << 30)
#define ANNOTATIONS_MAX_COUNT 100000000LL /* the dataset's 8-digit keys */

/* Byte offset of cJSON's error position, for "invalid JSON near byte N". */
static size_t json_error_offset(const char *json, size_t len) {
    const char *at = cJSON_GetErrorPtr();
    if (!at || at < json || at > json + len) return len;
    return (size_t)(at - json);
}

static int label_parse(const cJSON *it, int64_t i, int32_t *out, char *err, size_t errlen) {
    double v = it->valuedouble;
    if (!cJSON_IsNumber(it) || !isfinite(v) || v != floor(v) || v < 0 || v > INT32_MAX) {
        char *text = cJSON_PrintUnformatted(it);
        snprintf(err, errlen, "categories[%lld] is not a non-negative integer label (%.40s)",
                 (long long)i, text ? text : "?");
        free(text);
        return -1;
    }
    *out = (int32_t)v;
    return 0;
}

static int annotations_fill(const cJSON *images, const cJSON *cats, Annotations *a, char *err,
                            size_t errlen) {
    int64_t n = cJSON_GetArraySize(images);
    a->files = xcalloc((size_t)n, sizeof *a->files);
    a->labels = xcalloc((size_t)n, sizeof *a->labels);
    size_t pool_len = 0;
    const cJSON *it;
    int64_t i = 0;
    cJSON_ArrayForEach(it, images) {
        if (!cJSON_IsString(it) || it->valuestring[0] == '\0') {
            snprintf(err, errlen, "images[%lld] is not a non-empty file name", (long long)i);
            return -1;
        }
        pool_len += strlen(it->valuestring) + 1;
        i++;
    }
    a->pool = xmalloc(pool_len);
    size_t off = 0;
    i = 0;
    cJSON_ArrayForEach(it, images) {
        size_t l = strlen(it->valuestring) + 1;
        memcpy(a->pool + off, it->valuestring, l);
        a->files[i++] = a->pool + off;
        off += l;
    }
    i = 0;
    a->max_label = 0;
    cJSON_ArrayForEach(it, cats) {
        if (label_parse(it, i, &a->labels[i], err, errlen)) return -1;
        if (a->labels[i] > a->max_label) a->max_label = a->labels[i];
        i++;
    }
    a->count = n;
    return 0;
}

/* The optional "classes" list, which every label must index. */
static int annotations_classes(const cJSON *root, Annotations *a, char *err, size_t errlen) {
    const cJSON *classes = cJSON_GetObjectItemCaseSensitive(root, "classes");
    if (!classes) return 0;
    char why[200];
    if (class_names_from_cjson(classes, &a->classes, why, sizeof why)) {
        snprintf(err, errlen, "\"classes\": %s", why);
        return -1;
    }
    for (int64_t i = 0; i < a->count; i++)
        if (a->labels[i] >= a->classes.count) {
            snprintf(err, errlen, "categories[%lld] = %d, but \"classes\" names %d classes",
                     (long long)i, a->labels[i], a->classes.count);
            return -1;
        }
    return 0;
}

int annotations_parse(const char *json, size_t len, Annotations *a, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        snprintf(err, errlen, "invalid JSON near byte %zu", json_error_offset(json, len));
        return -1;
    }
    int rc = -1;
    const cJSON *images = cJSON_GetObjectItemCaseSensitive(root, "images");
    const cJSON *cats = cJSON_GetObjectItemCaseSensitive(root, "categories");
    if (!cJSON_IsObject(root)) {
        snprintf(err, errlen, "not a JSON object with \"images\" and \"categories\"");
    } else if (!cJSON_IsArray(images) || !cJSON_IsArray(cats)) {
        snprintf(err, errlen, "\"%s\" is missing or not an array",
                 cJSON_IsArray(images) ? "categories" : "images");
    } else if (cJSON_GetArraySize(images) != cJSON_GetArraySize(cats)) {
        snprintf(err, errlen, "\"images\" has %d entries but \"categories\" has %d",
                 cJSON_GetArraySize(images), cJSON_GetArraySize(cats));
    } else if (cJSON_GetArraySize(images) == 0) {
        snprintf(err, errlen, "no images (empty split)");
    } else if (cJSON_GetArraySize(images) > ANNOTATIONS_MAX_COUNT) {
        snprintf(err, errlen, "more than %lld images", ANNOTATIONS_MAX_COUNT);
    } else {
        rc = annotations_fill(images, cats, a, err, errlen);
    }
    if (rc == 0) rc = annotations_classes(root, a, err, errlen);
    cJSON_Delete(root);
    return rc;
}

int annotations_load(const char *path, Annotations *a, char *err, size_t errlen) {
    memset(a, 0, sizeof *a);
    size_t len;
    struct stat st;
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "cannot read the annotation file (it is a folder)");
        return -1;
    }
    char *text = fs_read_file(path, ANNOTATIONS_MAX_BYTES, &len);
    if (!text) {
        snprintf(err, errlen, "cannot read the annotation file (%s)", strerror(errno));
        return -1;
    }
    int rc = annotations_parse(text, len, a, err, errlen);
    free(text);
    return rc;
}

void annotations_free(Annotations *a) {
    free(a->files);
    free(a->labels);
    free(a->pool);
    class_names_free(&a->classes);
    memset(a, 0, sizeof *a);
}
