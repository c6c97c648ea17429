/* fuzz_image.c: libFuzzer target for image decoding (prep/decode.c).
 *
 * Any bytes must give IMAGE_OK with a shape that fits the output buffer, or an
 * error with a one-line reason: never a crash, a read past the input, or a
 * write past the output (the output is an exact-size allocation, so ASan sees
 * an overflow of a single byte). Images larger than 256 KiB decoded are refused
 * after the header, which keeps the run fast; the side limit is checked too.
 * The first 2 bytes of the input pick whether to decode against an expected
 * shape. Built and run by tests/fuzz/run.sh. */
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "data/dataset.h"
#include "data/image.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static ImageDecoder *g_dec; /* reused across inputs, as each thread reuses its own */

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!g_dec) g_dec = image_decoder_create();
    uint8_t *in = malloc(size ? size : 1);
    if (!in) return 0;
    memcpy(in, data, size);
    char err[512];
    ImageShape probe, shape;
    err[0] = '\0';
    int prc = image_probe(g_dec, in, size, &probe, err, sizeof err);
    if (prc != IMAGE_OK && (prc != IMAGE_ERROR || err[0] == '\0')) abort();
    if (prc == IMAGE_OK && (probe.width < 1 || probe.width > DATASET_MAX_SIDE || probe.height < 1 ||
                            probe.height > DATASET_MAX_SIDE ||
                            (probe.channels != 1 && probe.channels != 3)))
        abort();
    size_t cap = 256 * 1024;
    if (prc == IMAGE_OK) {
        size_t need = (size_t)probe.width * (size_t)probe.height * (size_t)probe.channels;
        if (need <= cap) cap = need; /* exact size: any overflow is caught */
    }
    uint8_t *out = malloc(cap);
    if (!out) {
        free(in);
        return 0;
    }
    ImageShape expect = {32, 32, 3};
    int use_expect = size > 1 && (data[size - 1] & 1);
    err[0] = '\0';
    int rc = image_decode(g_dec, in, size, use_expect ? &expect : NULL, out, cap, &shape, err,
                          sizeof err);
    if (rc == IMAGE_OK) {
        if (prc != IMAGE_OK || memcmp(&shape, &probe, sizeof shape) != 0) abort();
        size_t need = (size_t)shape.width * (size_t)shape.height * (size_t)shape.channels;
        if (need > cap) abort();
        volatile uint8_t sink = 0;
        for (size_t i = 0; i < need; i++) sink ^= out[i];
        (void)sink;
    } else if (rc == IMAGE_MISMATCH) {
        if (!use_expect || memcmp(&shape, &expect, sizeof shape) == 0) abort();
    } else if (rc != IMAGE_ERROR || err[0] == '\0' || memchr(err, '\n', strlen(err))) {
        abort();
    }
    free(out);
    free(in);
    return 0;
}
