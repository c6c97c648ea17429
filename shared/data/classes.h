/* classes.h: the names of a dataset's classes, index k -> "cat".
 *
 * Written as a JSON array of strings ["airplane", "automobile", ...] wherever
 * they travel: the annotation file's optional "classes" key (or cifar-prep
 * --classes FILE), the dataset's meta JSON ("classes", covered by its checksum
 * where the format has one), a snapshot's "classes" metadata. A name is 1 to
 * CLASS_NAME_MAX bytes with no control character (tab and newline included:
 * cifar-predict prints names in tab-separated lines), and names are distinct.
 * A list has exactly as many names as the dataset has classes. */
#ifndef CIFAR_CLASSES_H
#define CIFAR_CLASSES_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CLASS_NAME_MAX 63
#define CLASS_NAMES_MAX 100000

typedef struct {
    int count;    /* 0: no names (classes are shown by number) */
    char **names; /* count names, each pointing into pool */
    char *pool;
} ClassNames;

struct cJSON;
/* Parse a JSON array of names (a cJSON node). 0, or -1 with a one-line reason in err;
 * `out` needs class_names_free either way. */
int class_names_from_cjson(const struct cJSON *arr, ClassNames *out, char *err, size_t errlen);
/* The same from JSON text (need not be NUL-terminated). */
int class_names_parse(const char *json, size_t len, ClassNames *out, char *err, size_t errlen);
/* Read and parse a file holding a JSON array of names, or one name per line. */
int class_names_load(const char *path, ClassNames *out, char *err, size_t errlen);
/* The list as compact JSON text (allocated), "[]" when empty. */
char *class_names_to_json(const ClassNames *c);
/* An owned copy. */
void class_names_copy(ClassNames *dst, const ClassNames *src);
int class_names_equal(const ClassNames *a, const ClassNames *b);
void class_names_free(ClassNames *c);
/* Class k's name, or its number written into buf when the list has no names. */
const char *class_name(const ClassNames *c, int k, char *buf, size_t buflen);

#ifdef __cplusplus
}
#endif
#endif
