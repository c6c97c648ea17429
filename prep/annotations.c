/* annotations.c: see annotations.h.
 *
 * The document is read by a small parser of its own shape, not into a cJSON tree
 * (a 3-million-entry file once took ten times its size that way): one pass checks
 * it and counts the entries, a second one writes the labels and unescapes the
 * names in place, inside the file's own text, which becomes the pool. Memory stays
 * near the file's size plus 12 bytes an entry. Values of other keys are skipped
 * with cJSON (any JSON is allowed there), as are the entries that are not of the
 * expected type (to name them). */
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

/* The bracket depth at byte `at` (outside strings): how deep the document was nested
 * where a parser stopped. */
static int json_depth_at(const char *json, size_t at) {
    int depth = 0, in_string = 0;
    for (size_t i = 0; i < at; i++) {
        char c = json[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = 0;
        } else if (c == '"') {
            in_string = 1;
        } else if (c == '[' || c == '{') {
            depth++;
        } else if (c == ']' || c == '}') {
            depth--;
        }
    }
    return depth;
}

typedef enum { KEY_OTHER, KEY_IMAGES, KEY_CATEGORIES } Key;

typedef struct {
    char *text; /* the document; pass 2 writes the names into it */
    size_t len, pos;
    int fill;   /* pass 2: write names and labels */
    Annotations *a;
    int seen[3];       /* keys met, by Key */
    int is_array[3];   /* their values were arrays */
    int64_t count[3];  /* entries of those arrays */
    /* The first entry of each array that is not of its type (-1: none) and why. */
    int64_t bad_at[3];
    char bad_why[3][320];
    int seen_classes;
    cJSON *classes; /* the optional "classes" value, kept by pass 1 */
    char *err;
    size_t errlen;
} Parser;

static int syntax_error(Parser *p) {
    if (json_depth_at(p->text, p->pos) >= CJSON_NESTING_LIMIT)
        snprintf(p->err, p->errlen, "JSON nested deeper than %d levels near byte %zu (the parser's "
                 "limit; annotation files need 3)", CJSON_NESTING_LIMIT, p->pos);
    else
        snprintf(p->err, p->errlen, "invalid JSON near byte %zu", p->pos);
    return -1;
}

static void skip_ws(Parser *p) {
    while (p->pos < p->len && strchr(" \t\r\n", p->text[p->pos]) && p->text[p->pos]) p->pos++;
}

static int peek(const Parser *p) { return p->pos < p->len ? (unsigned char)p->text[p->pos] : -1; }

static int hex4(const char *s, unsigned *out) {
    unsigned v = 0;
    for (int i = 0; i < 4; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10
              : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return -1;
        v = v << 4 | (unsigned)d;
    }
    *out = v;
    return 0;
}

/* UTF-8 of code point u into out (at most 4 bytes); the byte count. */
static size_t utf8_put(unsigned u, char *out) {
    if (u < 0x80) return out[0] = (char)u, 1;
    if (u < 0x800) return out[0] = (char)(0xc0 | u >> 6), out[1] = (char)(0x80 | (u & 0x3f)), 2;
    if (u < 0x10000) {
        out[0] = (char)(0xe0 | u >> 12), out[1] = (char)(0x80 | (u >> 6 & 0x3f));
        out[2] = (char)(0x80 | (u & 0x3f));
        return 3;
    }
    out[0] = (char)(0xf0 | u >> 18), out[1] = (char)(0x80 | (u >> 12 & 0x3f));
    out[2] = (char)(0x80 | (u >> 6 & 0x3f)), out[3] = (char)(0x80 | (u & 0x3f));
    return 4;
}

/* A \uXXXX escape at p->pos (after the backslash's 'u'), a surrogate pair as one. */
static int string_unicode(Parser *p, unsigned *u) {
    if (p->len - p->pos < 4 || hex4(p->text + p->pos, u)) return syntax_error(p);
    p->pos += 4;
    if (*u >= 0xd800 && *u < 0xdc00) {
        unsigned lo;
        if (p->len - p->pos < 6 || p->text[p->pos] != '\\' || p->text[p->pos + 1] != 'u' ||
            hex4(p->text + p->pos + 2, &lo) || lo < 0xdc00 || lo >= 0xe000)
            return syntax_error(p);
        p->pos += 6;
        *u = 0x10000 + ((*u - 0xd800) << 10) + (lo - 0xdc00);
    } else if (*u >= 0xdc00 && *u < 0xe000) {
        return syntax_error(p);
    }
    return 0;
}

/* The string at p->pos (its opening quote), unescaped into out (which may be the
 * text itself at or before the string: the unescaped form is never longer) when
 * out is not NULL, NUL-terminated; its length into *n. A NUL (\u0000) is refused:
 * a name would end there. */
static int parse_string(Parser *p, char *out, size_t outcap, size_t *n) {
    size_t start = p->pos++, w = 0;
    for (;;) {
        int c = peek(p);
        if (c < 0 || c < 0x20) return syntax_error(p);
        p->pos++;
        if (c == '"') break;
        char buf[4];
        size_t k = 1;
        buf[0] = (char)c;
        if (c == '\\') {
            int e = peek(p);
            p->pos++;
            const char *from = "\"\\/bfnrt", *to = "\"\\/\b\f\n\r\t";
            const char *at = e > 0 ? strchr(from, e) : NULL;
            if (e == 'u') {
                unsigned u;
                if (string_unicode(p, &u)) return -1;
                if (u == 0) {
                    snprintf(p->err, p->errlen, "a NUL character (\\u0000) in a string at byte %zu: "
                             "names cannot hold one", start);
                    return -1;
                }
                k = utf8_put(u, buf);
            } else if (at && e) {
                buf[0] = to[at - from];
            } else {
                p->pos--;
                return syntax_error(p);
            }
        }
        if (out && w + k < outcap) memcpy(out + w, buf, k);
        w += k;
    }
    if (out) out[w < outcap ? w : outcap - 1] = '\0';
    *n = w;
    return 0;
}

/* Any JSON value at p->pos, checked and skipped by cJSON; the parsed item into
 * *item when item is not NULL (the caller deletes it). */
static int skip_value(Parser *p, cJSON **item) {
    const char *end = NULL;
    cJSON *v = cJSON_ParseWithLengthOpts(p->text + p->pos, p->len - p->pos, &end, 0);
    if (!v) {
        const char *at = cJSON_GetErrorPtr();
        if (at && at >= p->text && at <= p->text + p->len) p->pos = (size_t)(at - p->text);
        return syntax_error(p);
    }
    p->pos = (size_t)(end - p->text);
    if (item) *item = v;
    else cJSON_Delete(v);
    return 0;
}

static void note_bad(Parser *p, Key k, int64_t i, const char *fmt, const char *text) {
    if (p->bad_at[k] >= 0) return;
    p->bad_at[k] = i;
    snprintf(p->bad_why[k], sizeof p->bad_why[k], fmt, (long long)i, text ? text : "?");
}

/* A value that is not of the array's type: skipped, and its first one named. */
static int entry_other(Parser *p, Key k, int64_t i) {
    cJSON *v = NULL;
    if (skip_value(p, &v)) return -1;
    char *text = cJSON_PrintUnformatted(v);
    if (k == KEY_IMAGES)
        note_bad(p, k, i, "images[%lld] is not a non-empty file name", NULL);
    else
        note_bad(p, k, i, "categories[%lld] is not a non-negative integer label (%.40s)", text);
    free(text);
    cJSON_Delete(v);
    return 0;
}

/* A name is a path relative to the image folder: not absolute, no ".." component
 * (a symlink leading out is refused when the image is opened, convert.c). */
static const char *name_problem(const char *name) {
    if (name[0] == '/') return "is an absolute path";
    for (const char *q = name; *q;) {
        size_t n = strcspn(q, "/");
        if (n == 2 && q[0] == '.' && q[1] == '.') return "has a \"..\" component";
        q += n;
        while (*q == '/') q++;
    }
    return NULL;
}

static int entry_image(Parser *p, int64_t i) {
    if (peek(p) != '"') return entry_other(p, KEY_IMAGES, i);
    size_t start = p->pos, n;
    /* pass 1 only checks; pass 2 writes the name over its own text */
    char *out = p->fill ? p->text + start : NULL;
    if (parse_string(p, out, p->pos - start + (p->len - p->pos), &n)) return -1;
    if (!p->fill) return 0;
    if (n == 0) {
        note_bad(p, KEY_IMAGES, i, "images[%lld] is not a non-empty file name", NULL);
        return 0;
    }
    const char *problem = name_problem(out);
    if (problem && p->bad_at[KEY_IMAGES] < 0) {
        p->bad_at[KEY_IMAGES] = i;
        snprintf(p->bad_why[KEY_IMAGES], sizeof p->bad_why[KEY_IMAGES],
                 "images[%lld] \"%.80s\" %s: names are paths inside the image folder",
                 (long long)i, out, problem);
    }
    p->a->files[i] = out;
    return 0;
}

/* JSON's number grammar: -?(0|[1-9][0-9]*)(.[0-9]+)?([eE][+-]?[0-9]+)?; its length. */
static size_t number_length(const char *s, size_t left) {
    size_t i = 0;
#define DIGITS(min) do { size_t d0 = i; while (i < left && s[i] >= '0' && s[i] <= '9') i++; if (i - d0 < (min)) return 0; } while (0)
    if (i < left && s[i] == '-') i++;
    if (i < left && s[i] == '0') i++;
    else DIGITS(1);
    if (i < left && s[i] == '.') { i++; DIGITS(1); }
    if (i < left && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < left && (s[i] == '+' || s[i] == '-')) i++;
        DIGITS(1);
    }
#undef DIGITS
    return i;
}

static int entry_label(Parser *p, int64_t i) {
    int c = peek(p);
    if (!(c == '-' || (c >= '0' && c <= '9'))) return entry_other(p, KEY_CATEGORIES, i);
    size_t n = number_length(p->text + p->pos, p->len - p->pos);
    if (n == 0 || n > 60) return n ? entry_other(p, KEY_CATEGORIES, i) : syntax_error(p);
    char num[64];
    memcpy(num, p->text + p->pos, n);
    num[n] = '\0';
    p->pos += n;
    double v = strtod(num, NULL);
    if (!isfinite(v) || v != floor(v) || v < 0 || v > INT32_MAX) {
        note_bad(p, KEY_CATEGORIES, i, "categories[%lld] is not a non-negative integer label (%.40s)",
                 num);
        return 0;
    }
    if (p->fill) {
        p->a->labels[i] = (int32_t)v;
        if (p->a->labels[i] > p->a->max_label) p->a->max_label = p->a->labels[i];
    }
    return 0;
}

/* One of our arrays: its entries counted (and in pass 2 written). */
static int parse_array(Parser *p, Key k) {
    p->pos++; /* '[' */
    skip_ws(p);
    int64_t i = 0;
    if (peek(p) == ']') {
        p->pos++;
        p->count[k] = 0;
        return 0;
    }
    for (;; i++) {
        if (i >= ANNOTATIONS_MAX_COUNT) {
            snprintf(p->err, p->errlen, "more than %lld images", ANNOTATIONS_MAX_COUNT);
            return -1;
        }
        int rc = k == KEY_IMAGES ? entry_image(p, i) : entry_label(p, i);
        if (rc) return -1;
        skip_ws(p);
        int c = peek(p);
        p->pos++;
        if (c == ']') break;
        if (c != ',') return p->pos--, syntax_error(p);
        skip_ws(p);
    }
    p->count[k] = i + 1;
    return 0;
}

static int parse_member(Parser *p) {
    if (peek(p) != '"') return syntax_error(p);
    char key[16];
    size_t n;
    if (parse_string(p, key, sizeof key, &n)) return -1;
    Key k = n == 6 && !strcmp(key, "images") ? KEY_IMAGES
          : n == 10 && !strcmp(key, "categories") ? KEY_CATEGORIES : KEY_OTHER;
    skip_ws(p);
    if (peek(p) != ':') return syntax_error(p);
    p->pos++;
    skip_ws(p);
    if (n == 7 && !strcmp(key, "classes")) {
        if (p->seen_classes++) {
            snprintf(p->err, p->errlen, "the key \"classes\" appears more than once");
            return -1;
        }
        return skip_value(p, p->fill ? NULL : &p->classes);
    }
    if (k != KEY_OTHER && p->seen[k]) {
        snprintf(p->err, p->errlen, "the key \"%s\" appears more than once", key);
        return -1;
    }
    p->seen[k] = 1;
    if (k != KEY_OTHER && peek(p) == '[') {
        p->is_array[k] = 1;
        return parse_array(p, k);
    }
    return skip_value(p, NULL);
}

/* The whole document, as one pass. */
static int parse_document(Parser *p) {
    p->pos = 0;
    memset(p->seen, 0, sizeof p->seen);
    memset(p->is_array, 0, sizeof p->is_array);
    p->seen_classes = 0;
    for (int k = 0; k < 3; k++) p->bad_at[k] = -1;
    skip_ws(p);
    if (peek(p) != '{') {
        if (skip_value(p, NULL)) return -1; /* invalid JSON, or nested too deep: said so */
        snprintf(p->err, p->errlen, "not a JSON object with \"images\" and \"categories\"");
        return -1;
    }
    p->pos++;
    skip_ws(p);
    if (peek(p) == '}') {
        p->pos++;
    } else {
        for (;;) {
            if (parse_member(p)) return -1;
            skip_ws(p);
            int c = peek(p);
            p->pos++;
            if (c == '}') break;
            if (c != ',') return p->pos--, syntax_error(p);
            skip_ws(p);
        }
    }
    skip_ws(p);
    if (p->pos < p->len) {
        snprintf(p->err, p->errlen, "unexpected data after the JSON document at byte %zu", p->pos);
        return -1;
    }
    return 0;
}

/* The checks of the document's shape, in the order they are reported. */
static int shape_check(const Parser *p) {
    int64_t ni = p->count[KEY_IMAGES], nc = p->count[KEY_CATEGORIES];
    if (!p->is_array[KEY_IMAGES] || !p->is_array[KEY_CATEGORIES]) {
        snprintf(p->err, p->errlen, "\"%s\" is missing or not an array",
                 p->is_array[KEY_IMAGES] ? "categories" : "images");
    } else if (ni != nc) {
        snprintf(p->err, p->errlen, "\"images\" has %lld entries but \"categories\" has %lld",
                 (long long)ni, (long long)nc);
    } else if (ni == 0) {
        snprintf(p->err, p->errlen, "no images (empty split)");
    } else {
        return 0;
    }
    return -1;
}

static int entries_check(const Parser *p) {
    for (int k = KEY_IMAGES; k <= KEY_CATEGORIES; k++) {
        if (p->bad_at[k] < 0) continue;
        snprintf(p->err, p->errlen, "%s", p->bad_why[k]);
        return -1;
    }
    return 0;
}

/* The optional "classes" list, which every label must index. */
static int annotations_classes(const cJSON *classes, Annotations *a, char *err, size_t errlen) {
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

/* Parse text (len bytes, NUL-terminated, malloc'd): on success it becomes a->pool. */
static int annotations_parse_owned(char *text, size_t len, Annotations *a, char *err,
                                   size_t errlen) {
    memset(a, 0, sizeof *a);
    Parser p = {.text = text, .len = len, .a = a, .err = err, .errlen = errlen};
    if (parse_document(&p) || shape_check(&p) || entries_check(&p)) {
        cJSON_Delete(p.classes);
        free(text);
        return -1;
    }
    int64_t n = p.count[KEY_IMAGES];
    a->files = xcalloc((size_t)n, sizeof *a->files);
    a->labels = xcalloc((size_t)n, sizeof *a->labels);
    a->pool = text;
    a->count = n;
    p.fill = 1;
    int rc = parse_document(&p) || entries_check(&p) ||
             annotations_classes(p.classes, a, err, errlen) ? -1 : 0;
    cJSON_Delete(p.classes);
    return rc;
}

int annotations_parse(const char *json, size_t len, Annotations *a, char *err, size_t errlen) {
    char *copy = xmalloc(len + 1);
    memcpy(copy, json, len);
    copy[len] = '\0';
    return annotations_parse_owned(copy, len, a, err, errlen);
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
    if (!text && errno == EINVAL) { /* fs_read_file opens regular files only: never blocks */
        snprintf(err, errlen, "cannot read the annotation file (it is %s, not a regular file)",
                 fs_open_regular_why());
        return -1;
    }
    if (!text) {
        snprintf(err, errlen, "cannot read the annotation file (%s)", strerror(errno));
        return -1;
    }
    return annotations_parse_owned(text, len, a, err, errlen);
}

void annotations_free(Annotations *a) {
    free(a->files);
    free(a->labels);
    free(a->pool);
    class_names_free(&a->classes);
    memset(a, 0, sizeof *a);
}
