/* annotations.h: the seed's annotation files.
 *
 * {"images": ["name relative to the image folder", ...], "categories": [label, ...],
 *  "classes": ["name of label 0", ...]}
 * Both arrays have the same, non-zero length; every name is a non-empty string;
 * every label a non-negative integer that fits an int32. "classes" is optional
 * (data/classes.h); when given, every label must be below its length. */
#ifndef PREP_ANNOTATIONS_H
#define PREP_ANNOTATIONS_H

#include <stddef.h>
#include <stdint.h>

#include "data/classes.h"

typedef struct {
    int64_t count;
    char **files;    /* count names, each pointing into `pool` */
    int32_t *labels; /* count labels */
    char *pool;      /* all names, NUL-terminated, back to back */
    int32_t max_label;
    ClassNames classes; /* count 0 when the file names none */
} Annotations;

/* Parse an annotation document held in memory (need not be NUL-terminated).
 * 0, or -1 with a one-line reason in err (the caller prefixes the file name);
 * `a` needs annotations_free either way. */
int annotations_parse(const char *json, size_t len, Annotations *a, char *err, size_t errlen);
/* Read and parse a file; the reason covers unreadable files too. */
int annotations_load(const char *path, Annotations *a, char *err, size_t errlen);
void annotations_free(Annotations *a);

#endif
