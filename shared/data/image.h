/* image.h: PNG and JPEG files and their decoding into 8-bit HWC pixels (cifar-prep
 * and cifar-predict decode with the same code, so an image reads the same in both).
 *
 * PNG through libpng: palette, 16-bit, low bit depths, gray+alpha, RGBA and
 * tRNS are all normalised to 8-bit gray (1 channel) or RGB (3); alpha is
 * dropped. JPEG through TurboJPEG: grayscale JPEGs give 1 channel, others 3;
 * any libjpeg warning (a truncated file, corrupt data) is an error. The header
 * is checked before a pixel is decoded: sides over DATASET_MAX_SIDE are refused
 * (decompression bombs). One decoder per thread; it keeps its buffers. */
#ifndef CIFAR_IMAGE_H
#define CIFAR_IMAGE_H

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
/* The last image_decode dropped an alpha channel (RGBA, gray+alpha, or a PNG tRNS
 * transparency): the dataset keeps gray or RGB only. */
int image_decoder_dropped_alpha(const ImageDecoder *d);

/* src (shape `from`, HWC) resampled into dst (shape `to`): the height and width by
 * bilinear interpolation with pixel centres aligned (OpenCV's INTER_LINEAR, PyTorch's
 * interpolate(align_corners=False), no antialiasing), the channels from gray to RGB by
 * copying, from RGB to gray by the BT.601 luma 0.299 R + 0.587 G + 0.114 B; each
 * result rounded to the nearest 8-bit value. The same shape copies src. */
void image_resample(const uint8_t *src, ImageShape from, uint8_t *dst, ImageShape to);

/* Images larger than this are refused before a byte is read (a PNG of
 * 4096x4096x3 is well under it). */
#define IMAGE_MAX_FILE (256ll << 20)
/* Read the whole file `name` (relative to the folder open as dirfd, or
 * AT_FDCWD) into *buf (grown as needed, reused across calls): open, fstat,
 * read, close. Under dirfd the name must not lead outside its folder (a symlink
 * pointing elsewhere) unless outside_ok; regular files only (a FIFO never blocks).
 * 0, or -1 with a reason in err. */
int image_file_read(int dirfd, const char *name, int outside_ok, uint8_t **buf, size_t *cap,
                    size_t *len, char *err, size_t errlen);

#endif
