/* classes.c: see classes.h. */
#include "data/classes.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/fsutil.h"

#define CLASS_FILE_MAX_BYTES ((size_t)16 << 20)

static int name_valid(const char *s, size_t len) {
    if (len < 1 || len > CLASS_NAME_MAX) return 0;
    for (size_t i = 0; i < len; i++)
        if ((unsigned char)s[i] < 0x20 || s[i] == 0x7f) return 0;
    return 1;
}

/* Append names[0..n) (lengths lens) to out; checks each name and that none repeats. */
static int class_names_fill(const char *const *names, const size_t *lens, int n, ClassNames *out,
                            char *err, size_t errlen) {
    size_t pool_len = 0;
    for (int i = 0; i < n; i++) {
        if (!name_valid(names[i], lens[i])) {
            snprintf(err, errlen, "class name %d is not 1 to %d characters without control "
                     "characters (tab, newline)", i, CLASS_NAME_MAX);
            return -1;
        }
        pool_len += lens[i] + 1;
    }
    out->names = xcalloc((size_t)n, sizeof *out->names);
    out->pool = xmalloc(pool_len ? pool_len : 1);
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        out->names[i] = out->pool + off;
        memcpy(out->pool + off, names[i], lens[i]);
        out->pool[off + lens[i]] = '\0';
        off += lens[i] + 1;
        for (int j = 0; j < i; j++)
            if (strcmp(out->names[j], out->names[i]) == 0) {
                snprintf(err, errlen, "class name \"%s\" is given twice (%d and %d)", out->names[i], j, i);
                return -1;
            }
        out->count = i + 1;
    }
    return 0;
}

int class_names_from_cjson(const cJSON *arr, ClassNames *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    if (!cJSON_IsArray(arr)) {
        snprintf(err, errlen, "class names must be a JSON array of strings");
        return -1;
    }
    int n = cJSON_GetArraySize(arr);
    if (n < 1 || n > CLASS_NAMES_MAX) {
        snprintf(err, errlen, "class names: expected 1 to %d names, got %d", CLASS_NAMES_MAX, n);
        return -1;
    }
    const char **names = xcalloc((size_t)n, sizeof *names);
    size_t *lens = xcalloc((size_t)n, sizeof *lens);
    int i = 0, rc = 0;
    const cJSON *it;
    cJSON_ArrayForEach(it, arr) {
        if (!cJSON_IsString(it)) {
            snprintf(err, errlen, "class name %d is not a string", i);
            rc = -1;
            break;
        }
        names[i] = it->valuestring;
        lens[i++] = strlen(it->valuestring);
    }
    if (rc == 0) rc = class_names_fill(names, lens, n, out, err, errlen);
    free(names);
    free(lens);
    return rc;
}

int class_names_parse(const char *json, size_t len, ClassNames *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(json, len);
    if (!root) {
        snprintf(err, errlen, "class names are not valid JSON");
        return -1;
    }
    int rc = class_names_from_cjson(root, out, err, errlen);
    cJSON_Delete(root);
    return rc;
}

/* One name per line (a trailing newline, "\r\n" and blank last lines allowed). */
static int class_names_from_lines(char *text, size_t len, ClassNames *out, char *err, size_t errlen) {
    while (len > 0 && (text[len - 1] == '\n' || text[len - 1] == '\r')) len--;
    text[len] = '\0';
    int n = 1;
    for (size_t i = 0; i < len; i++) n += text[i] == '\n';
    if (len == 0 || n > CLASS_NAMES_MAX) {
        snprintf(err, errlen, "expected 1 to %d class names, one per line", CLASS_NAMES_MAX);
        return -1;
    }
    const char **names = xcalloc((size_t)n, sizeof *names);
    size_t *lens = xcalloc((size_t)n, sizeof *lens);
    char *line = text;
    for (int i = 0; i < n; i++) {
        char *end = strchr(line, '\n');
        if (!end) end = text + len;
        *end = '\0';
        size_t l = (size_t)(end - line);
        if (l > 0 && line[l - 1] == '\r') line[--l] = '\0';
        names[i] = line;
        lens[i] = l;
        line = end + 1;
    }
    int rc = class_names_fill(names, lens, n, out, err, errlen);
    free(names);
    free(lens);
    return rc;
}

int class_names_load(const char *path, ClassNames *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    size_t len;
    char *text = fs_read_file(path, CLASS_FILE_MAX_BYTES, &len);
    if (!text) {
        snprintf(err, errlen, "cannot read the class names (%s)", strerror(errno));
        return -1;
    }
    size_t first = strspn(text, " \t\r\n");
    int rc = first < len && text[first] == '['
                 ? class_names_parse(text, len, out, err, errlen)
                 : class_names_from_lines(text, len, out, err, errlen);
    free(text);
    return rc;
}

char *class_names_to_json(const ClassNames *c) {
    cJSON *arr = cJSON_CreateArray();
    CHECK_ALLOC(arr, sizeof(cJSON));
    for (int i = 0; i < c->count; i++) cJSON_AddItemToArray(arr, cJSON_CreateString(c->names[i]));
    char *text = cJSON_PrintUnformatted(arr);
    cJSON_Delete(arr);
    CHECK_ALLOC(text, 4096);
    return text;
}

void class_names_copy(ClassNames *dst, const ClassNames *src) {
    memset(dst, 0, sizeof *dst);
    if (src->count == 0) return;
    size_t *lens = xcalloc((size_t)src->count, sizeof *lens);
    for (int i = 0; i < src->count; i++) lens[i] = strlen(src->names[i]);
    char err[160];
    if (class_names_fill((const char *const *)src->names, lens, src->count, dst, err, sizeof err) != 0)
        die("class names: %s (internal error: the source list was checked)", err);
    free(lens);
}

int class_names_equal(const ClassNames *a, const ClassNames *b) {
    if (a->count != b->count) return 0;
    for (int i = 0; i < a->count; i++)
        if (strcmp(a->names[i], b->names[i]) != 0) return 0;
    return 1;
}

void class_names_free(ClassNames *c) {
    free(c->names);
    free(c->pool);
    memset(c, 0, sizeof *c);
}

const char *class_name(const ClassNames *c, int k, char *buf, size_t buflen) {
    if (k >= 0 && k < c->count) return c->names[k];
    snprintf(buf, buflen, "%d", k);
    return buf;
}
