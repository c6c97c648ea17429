/* fuzz_snapshot.c: libFuzzer target for the snapshot reader.
 *
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -Ishared tests/fuzz/fuzz_snapshot.c \
 *         shared/format/safetensors.c shared/core/check.c shared/core/fsutil.c -lcjson -llmdb -o fuzz_snapshot
 *   ./fuzz_snapshot tests/fuzz/corpus_snapshot
 *
 * Any bytes must give a Snapshot or NULL with a one-line reason: never a crash,
 * a read outside the image, or a tensor whose bytes lie outside it. Every byte
 * of every accepted tensor is read so that the sanitizer sees a bad range. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "format/safetensors.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void fuzz_touch(const Snapshot *s) {
    const unsigned char *lo = s->blob, *hi = lo + s->blob_size;
    volatile unsigned char sink = 0;
    for (int i = 0; i < s->n_tensors; i++) {
        const SnapTensor *t = &s->tensors[i];
        size_t bytes = t->numel * (t->dtype == SNAP_I64 ? 8 : 4);
        const unsigned char *p = t->data;
        if (p < lo || p + bytes > hi) abort(); /* a range the reader should have refused */
        for (size_t b = 0; b < bytes; b++) sink ^= p[b];
        if (snapshot_tensor(s, t->name) == NULL) abort();
    }
    for (int i = 0; i < s->n_meta; i++)
        if (snapshot_meta(s, s->meta[i].key) == NULL) abort();
    (void)sink;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    /* snapshot_parse owns (and frees) its blob: give it an exact-size copy so
     * that any read past the end is caught. */
    void *blob = malloc(size ? size : 1);
    if (!blob) return 0;
    if (size) memcpy(blob, data, size);
    char err[256];
    err[0] = '\0';
    Snapshot *s = snapshot_parse(blob, size, err, sizeof err);
    if (s) {
        fuzz_touch(s);
        snapshot_free(s);
    } else if (err[0] == '\0' || memchr(err, '\n', strlen(err))) {
        abort(); /* every refusal names its reason on one line */
    }
    return 0;
}
