/* fuzz_annotations.c: libFuzzer target for the annotation parser (prep/annotations.c).
 *
 * Any bytes must give either a complete Annotations (count > 0 names and labels,
 * every name a non-empty string, every label in [0, max_label]) or -1 with a
 * one-line reason: never a crash, a leak or a read past the buffer (the input
 * is copied to an exact-size allocation, not NUL-terminated). Built and run by
 * tests/fuzz/run.sh. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "annotations.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char *copy = malloc(size ? size : 1);
    if (!copy) return 0;
    memcpy(copy, data, size);
    Annotations a;
    char err[256];
    err[0] = '\0';
    int rc = annotations_parse(copy, size, &a, err, sizeof err);
    if (rc == 0) {
        if (a.count <= 0) abort();
        volatile size_t sink = 0;
        for (int64_t i = 0; i < a.count; i++) {
            if (!a.files[i] || a.files[i][0] == '\0') abort();
            if (a.labels[i] < 0 || a.labels[i] > a.max_label) abort();
            sink += strlen(a.files[i]);
        }
        (void)sink;
    } else if (rc != -1 || err[0] == '\0' || memchr(err, '\n', strlen(err))) {
        abort(); /* a failure must come with a one-line reason */
    }
    annotations_free(&a);
    free(copy);
    return 0;
}
