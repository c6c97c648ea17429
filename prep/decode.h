/* decode.h: PNG and JPEG decoding from memory into 8-bit HWC pixels.
 *
 * PNG through libpng: palette, 16-bit, low bit depths, gray+alpha, RGBA and
 * tRNS are all normalised to 8-bit gray (1 channel) or RGB (3); alpha is
 * dropped. JPEG through TurboJPEG: grayscale JPEGs give 1 channel, others 3;
 * any libjpeg warning (a truncated file, corrupt data) is an error. The header
 * is checked before a pixel is decoded: sides over DATASET_MAX_SIDE are refused
 * (decompression bombs). One decoder per thread; it keeps its buffers. */
#ifndef PREP_DECODE_H
#define PREP_DECODE_H

#include <stddef.h>
#include <stdint.h>

typedef struct {
    int width, height, channels;
} ImageShape;

enum {
    IMAGE_OK = 0,
    IMAGE_ERROR = -1,    /* not an image, corrupt, truncated, too large: reason in err */
    IMAGE_MISMATCH = -2, /* decodable, but its shape differs from `expect` (shape set) */
};

typedef struct ImageDecoder ImageDecoder;

ImageDecoder *image_decoder_create(void);
void image_decoder_free(ImageDecoder *d);

/* Read only the header: shape after normalisation. IMAGE_OK or IMAGE_ERROR. */
int image_probe(ImageDecoder *d, const uint8_t *buf, size_t len, ImageShape *shape, char *err,
                size_t errlen);
/* Decode into out (capacity outcap bytes, H*W*C needed). When `expect` is not
 * NULL a different shape returns IMAGE_MISMATCH before decoding. `shape` gets
 * the image's shape whenever the header could be read. */
int image_decode(ImageDecoder *d, const uint8_t *buf, size_t len, const ImageShape *expect,
                 uint8_t *out, size_t outcap, ImageShape *shape, char *err, size_t errlen);

#endif
