/* image.c: see image.h. */
#include "data/image.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <png.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <turbojpeg.h>
#include <unistd.h>

#include "core/check.h"
#include "data/dataset.h"

/* libpng's memory (its structs, zlib's state and window, row buffers: ~50 KiB
 * for a small image) comes from a per-decoder arena that is reset for every
 * image, so decoding allocates nothing once the arena has grown to the largest
 * image's needs. What does not fit is malloc'd (and freed by libpng as usual);
 * the next image then gets an arena large enough. */
typedef struct {
    uint8_t *base;
    size_t cap, top; /* top: the bytes this image has asked for (may pass cap) */
} PngArena;

#define ARENA_ALIGN 64
#define ARENA_INITIAL (128u << 10)
#define ARENA_MAX (8u << 20) /* beyond: malloc, not a lasting arena (a huge text chunk) */
/* Under AddressSanitizer every block is malloc'd, so ASan checks libpng's accesses. */
#if defined(__SANITIZE_ADDRESS__)
#define ARENA_SANITIZED 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define ARENA_SANITIZED 1
#endif
#endif
#ifndef ARENA_SANITIZED
#define ARENA_SANITIZED 0
#endif

struct ImageDecoder {
    tjhandle tj;        /* created on first JPEG */
    png_bytep *rows;    /* row pointers, reused */
    size_t rows_cap;
    PngArena arena;
    int alpha_dropped;  /* the last decoded image had an alpha channel (or tRNS) */
};

int image_decoder_dropped_alpha(const ImageDecoder *d) { return d->alpha_dropped; }

ImageDecoder *image_decoder_create(void) {
    ImageDecoder *d = xcalloc(1, sizeof(ImageDecoder));
    d->arena.cap = ARENA_INITIAL;
    d->arena.base = xmalloc(d->arena.cap);
    return d;
}

void image_decoder_free(ImageDecoder *d) {
    if (!d) return;
    if (d->tj) tjDestroy(d->tj);
    free(d->rows);
    free(d->arena.base);
    free(d);
}

static void arena_reset(PngArena *a) {
    if (a->top > a->cap && a->cap < ARENA_MAX) {
        free(a->base);
        a->cap = a->top < ARENA_MAX ? a->top : ARENA_MAX;
        a->base = xmalloc(a->cap);
    }
    a->top = 0;
}

static png_voidp arena_alloc(png_structp png, png_alloc_size_t n) {
    PngArena *a = png_get_mem_ptr(png);
    if (ARENA_SANITIZED) return malloc(n);
    size_t start = (a->top + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (n <= a->cap && start <= a->cap - n) {
        a->top = start + n;
        return a->base + start;
    }
    if (n < ARENA_MAX) a->top = start + n;
    return malloc(n); /* NULL is libpng's "out of memory" */
}

static void arena_free(png_structp png, png_voidp p) {
    PngArena *a = png_get_mem_ptr(png);
    uint8_t *b = p;
    if (b >= a->base && b < a->base + a->cap) return; /* released by arena_reset */
    free(p);
}

/* Common checks on a header's shape; IMAGE_OK to go on decoding. */
static int shape_check(const ImageShape *s, const ImageShape *expect, size_t outcap, char *err,
                       size_t errlen) {
    if (s->width < 1 || s->height < 1 || s->width > DATASET_MAX_SIDE ||
        s->height > DATASET_MAX_SIDE) {
        snprintf(err, errlen, "image is %dx%d, over the %d-pixel side limit (not decoded)",
                 s->width, s->height, DATASET_MAX_SIDE);
        return IMAGE_ERROR;
    }
    if (expect && (s->width != expect->width || s->height != expect->height ||
                   s->channels != expect->channels))
        return IMAGE_MISMATCH;
    size_t need = (size_t)s->width * (size_t)s->height * (size_t)s->channels;
    if (need > outcap) {
        snprintf(err, errlen, "image is %dx%dx%d, larger than the %zu-byte buffer", s->height,
                 s->width, s->channels, outcap);
        return IMAGE_ERROR;
    }
    return IMAGE_OK;
}

/* ------------------------------------------------------------------ PNG */

typedef struct {
    const uint8_t *buf;
    size_t len, pos;
    char *err;
    size_t errlen;
} PngSource;

static void png_source_read(png_structp png, png_bytep out, png_size_t n) {
    PngSource *s = png_get_io_ptr(png);
    if (n > s->len - s->pos) png_error(png, "truncated PNG (the file ends early)");
    memcpy(out, s->buf + s->pos, n);
    s->pos += n;
}

static void png_on_error(png_structp png, png_const_charp msg) {
    PngSource *s = png_get_error_ptr(png);
    if (strncmp(msg, "truncated", 9) == 0)
        snprintf(s->err, s->errlen, "%s", msg);
    else
        snprintf(s->err, s->errlen, "corrupt PNG (%s)", msg);
    png_longjmp(png, 1);
}

/* PNG warnings concern ancillary data (colour profiles, text): not the pixels. */
static void png_on_warning(png_structp png, png_const_charp msg) {
    (void)png;
    (void)msg;
}

/* Ask libpng for 8-bit gray or RGB whatever the file holds. */
static void png_normalise(png_structp png, int depth, int ctype) {
    if (ctype == PNG_COLOR_TYPE_PALETTE) png_set_palette_to_rgb(png);
    if (ctype == PNG_COLOR_TYPE_GRAY && depth < 8) png_set_expand_gray_1_2_4_to_8(png);
    if (depth == 16) png_set_scale_16(png);
    png_set_strip_alpha(png);
    png_set_interlace_handling(png);
}

/* From here on (the header, PLTE and tRNS are read and their CRCs checked) the
 * chunk CRCs are not computed: the image data is checked by zlib's adler32 over
 * the whole inflated stream, which a flipped bit fails just the same, and the
 * ancillary chunks after the data are never used. */
static void png_skip_idat_crc(png_structp png) {
    png_set_crc_action(png, PNG_CRC_QUIET_USE, PNG_CRC_QUIET_USE);
}

static int png_run(ImageDecoder *d, png_structp png, png_infop info, const ImageShape *expect,
                   uint8_t *out, size_t outcap, ImageShape *shape, char *err, size_t errlen) {
    if (setjmp(png_jmpbuf(png))) return IMAGE_ERROR;
    png_read_info(png, info);
    png_uint_32 w, h;
    int depth, ctype;
    png_get_IHDR(png, info, &w, &h, &depth, &ctype, NULL, NULL, NULL);
    shape->width = (int)w;
    shape->height = (int)h;
    shape->channels = (ctype & PNG_COLOR_MASK_COLOR) ? 3 : 1;
    int rc = shape_check(shape, expect, outcap, err, errlen);
    if (rc != IMAGE_OK || !out) return rc;
    d->alpha_dropped = (ctype & PNG_COLOR_MASK_ALPHA) || png_get_valid(png, info, PNG_INFO_tRNS);
    png_normalise(png, depth, ctype);
    png_read_update_info(png, info);
    size_t row = (size_t)w * (size_t)shape->channels;
    if (png_get_rowbytes(png, info) != row) {
        snprintf(err, errlen, "unsupported PNG layout (%zu bytes per row, expected %zu)",
                 (size_t)png_get_rowbytes(png, info), row);
        return IMAGE_ERROR;
    }
    if (d->rows_cap < h) {
        d->rows = xrealloc(d->rows, h * sizeof *d->rows);
        d->rows_cap = h;
    }
    for (png_uint_32 y = 0; y < h; y++) d->rows[y] = out + (size_t)y * row;
    png_skip_idat_crc(png);
    png_read_image(png, d->rows);
    png_read_end(png, NULL); /* checks the rest of the file: CRCs, IEND */
    return IMAGE_OK;
}

static int png_decode(ImageDecoder *d, const uint8_t *buf, size_t len, const ImageShape *expect,
                      uint8_t *out, size_t outcap, ImageShape *shape, char *err, size_t errlen) {
    PngSource src = {buf, len, 0, err, errlen};
    arena_reset(&d->arena);
    png_structp png = png_create_read_struct_2(PNG_LIBPNG_VER_STRING, &src, png_on_error,
                                               png_on_warning, &d->arena, arena_alloc, arena_free);
    png_infop info = png ? png_create_info_struct(png) : NULL;
    if (!info) {
        if (png) png_destroy_read_struct(&png, NULL, NULL);
        snprintf(err, errlen, "out of memory creating a PNG decoder");
        return IMAGE_ERROR;
    }
    png_set_read_fn(png, &src, png_source_read);
    int rc = png_run(d, png, info, expect, out, outcap, shape, err, errlen);
    png_destroy_read_struct(&png, &info, NULL);
    return rc;
}

/* ------------------------------------------------------------------ JPEG */

static int jpeg_fail(ImageDecoder *d, char *err, size_t errlen) {
    const char *msg = tjGetErrorStr2(d->tj);
    if (strstr(msg, "Premature end"))
        snprintf(err, errlen, "truncated JPEG (%s)", msg);
    else
        snprintf(err, errlen, "corrupt JPEG (%s)", msg);
    return IMAGE_ERROR;
}

static int jpeg_decode(ImageDecoder *d, const uint8_t *buf, size_t len, const ImageShape *expect,
                       uint8_t *out, size_t outcap, ImageShape *shape, char *err, size_t errlen) {
    if (!d->tj) d->tj = tjInitDecompress();
    if (!d->tj) {
        snprintf(err, errlen, "cannot create a JPEG decoder (%s)", tjGetErrorStr2(NULL));
        return IMAGE_ERROR;
    }
    int w, h, subsamp, colorspace;
    if (tjDecompressHeader3(d->tj, buf, (unsigned long)len, &w, &h, &subsamp, &colorspace))
        return jpeg_fail(d, err, errlen);
    shape->width = w;
    shape->height = h;
    shape->channels = colorspace == TJCS_GRAY ? 1 : 3;
    int rc = shape_check(shape, expect, outcap, err, errlen);
    if (rc != IMAGE_OK || !out) return rc;
    int pf = shape->channels == 1 ? TJPF_GRAY : TJPF_RGB;
    /* STOPONWARNING: libjpeg "recovers" from truncation by inventing pixels. */
    if (tjDecompress2(d->tj, buf, (unsigned long)len, out, w, 0, h, pf,
                      TJFLAG_STOPONWARNING | TJFLAG_LIMITSCANS))
        return jpeg_fail(d, err, errlen);
    return IMAGE_OK;
}

/* ------------------------------------------------------------------ dispatch */

static int image_run(ImageDecoder *d, const uint8_t *buf, size_t len, const ImageShape *expect,
                     uint8_t *out, size_t outcap, ImageShape *shape, char *err, size_t errlen) {
    memset(shape, 0, sizeof *shape);
    if (len == 0) {
        snprintf(err, errlen, "empty file (not a PNG or JPEG image)");
        return IMAGE_ERROR;
    }
    if (len >= 8 && png_sig_cmp(buf, 0, 8) == 0)
        return png_decode(d, buf, len, expect, out, outcap, shape, err, errlen);
    if (len >= 3 && buf[0] == 0xFF && buf[1] == 0xD8 && buf[2] == 0xFF)
        return jpeg_decode(d, buf, len, expect, out, outcap, shape, err, errlen);
    snprintf(err, errlen, "not a PNG or JPEG image");
    return IMAGE_ERROR;
}

int image_probe(ImageDecoder *d, const uint8_t *buf, size_t len, ImageShape *shape, char *err,
                size_t errlen) {
    return image_run(d, buf, len, NULL, NULL, SIZE_MAX, shape, err, errlen);
}

int image_decode(ImageDecoder *d, const uint8_t *buf, size_t len, const ImageShape *expect,
                 uint8_t *out, size_t outcap, ImageShape *shape, char *err, size_t errlen) {
    if (!out) {
        snprintf(err, errlen, "no output buffer");
        return IMAGE_ERROR;
    }
    return image_run(d, buf, len, expect, out, outcap, shape, err, errlen);
}

/* The kernels before openat2 (Linux 5.6), or a seccomp filter that hides it: the
 * file's resolved path (/proc/self/fd) must lie under the folder's. */
static int open_beneath_by_path(int dirfd, const char *name, int flags) {
    int fd = openat(dirfd, name, flags);
    if (fd < 0) return -1;
    char link[64], dir[PATH_MAX], file[PATH_MAX];
    snprintf(link, sizeof link, "/proc/self/fd/%d", dirfd);
    ssize_t dn = readlink(link, dir, sizeof dir - 1);
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t fn = readlink(link, file, sizeof file - 1);
    if (dn > 0 && fn > dn && strncmp(dir, file, (size_t)dn) == 0 &&
        (file[dn] == '/' || (dn == 1 && dir[0] == '/')))
        return fd;
    close(fd);
    errno = EXDEV;
    return -1;
}

/* Open `name` under the folder dirfd without leaving it (through "..", an absolute
 * path or a symlink; EXDEV then), unless outside_ok. O_NONBLOCK: a FIFO named as an
 * image must not block the open (the caller refuses it by its type). */
static int open_image(int dirfd, const char *name, int outside_ok) {
    int flags = O_RDONLY | O_NONBLOCK | O_CLOEXEC;
    if (outside_ok || dirfd == AT_FDCWD) return openat(dirfd, name, flags);
    struct open_how how = {.flags = (uint64_t)flags, .resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS};
    int fd = (int)syscall(SYS_openat2, dirfd, name, &how, sizeof how);
    if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return fd;
    return open_beneath_by_path(dirfd, name, flags);
}

int image_file_read(int dirfd, const char *name, int outside_ok, uint8_t **buf, size_t *cap,
                    size_t *len, char *err, size_t errlen) {
    int fd = open_image(dirfd, name, outside_ok);
    struct stat st;
    if (fd < 0 && errno == EXDEV) {
        snprintf(err, errlen, "the name leads outside the image folder (through a symlink): "
                 "refused ---> HINT: --allow-outside-symlinks reads images that symlinks in the "
                 "image folder point to elsewhere");
        return -1;
    }
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot read the image (%s)", strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > IMAGE_MAX_FILE) {
        snprintf(err, errlen, S_ISREG(st.st_mode) ? "file too large for an image (%lld bytes)"
                                                   : "not a regular file",
                 (long long)st.st_size);
        close(fd);
        return -1;
    }
    size_t want = (size_t)st.st_size;
    if (*cap < want + 1) {
        *cap = want + 1;
        *buf = xrealloc(*buf, *cap);
    }
    size_t got = 0;
    while (got < want) {
        ssize_t r = read(fd, *buf + got, want - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(err, errlen, "cannot read the image (%s)", r < 0 ? strerror(errno)
                                                                    : "file shrank while read");
            close(fd);
            return -1;
        }
        got += (size_t)r;
    }
    close(fd);
    *len = got;
    return 0;
}

/* ------------------------------------------------------------------ resampling */

/* Source coordinate of destination index i along an axis of n_src -> n_dst
 * (pixel centres aligned), as the lower neighbour, the upper one (edges clamped)
 * and the weight of the upper one. */
static void resample_axis(int i, int n_src, int n_dst, int *lo, int *hi, double *w) {
    double x = ((double)i + 0.5) * (double)n_src / (double)n_dst - 0.5;
    if (x < 0) x = 0;
    int l = (int)x;
    if (l > n_src - 1) l = n_src - 1;
    *lo = l;
    *hi = l + 1 < n_src ? l + 1 : l;
    *w = x - (double)l;
}

/* Channel c of a pixel of `to_c` channels from the source pixel p (`from_c` channels). */
static double pixel_channel(const uint8_t *p, int from_c, int to_c, int c) {
    if (from_c == to_c) return p[c];
    if (from_c == 1) return p[0];                      /* gray -> RGB */
    return 0.299 * p[0] + 0.587 * p[1] + 0.114 * p[2]; /* RGB -> gray */
}

void image_resample(const uint8_t *src, ImageShape from, uint8_t *dst, ImageShape to) {
    for (int y = 0; y < to.height; y++) {
        int y0, y1;
        double wy;
        resample_axis(y, from.height, to.height, &y0, &y1, &wy);
        for (int x = 0; x < to.width; x++) {
            int x0, x1;
            double wx;
            resample_axis(x, from.width, to.width, &x0, &x1, &wx);
            const uint8_t *p00 = src + ((size_t)y0 * from.width + x0) * from.channels;
            const uint8_t *p01 = src + ((size_t)y0 * from.width + x1) * from.channels;
            const uint8_t *p10 = src + ((size_t)y1 * from.width + x0) * from.channels;
            const uint8_t *p11 = src + ((size_t)y1 * from.width + x1) * from.channels;
            for (int c = 0; c < to.channels; c++) {
                double top = (1 - wx) * pixel_channel(p00, from.channels, to.channels, c) +
                             wx * pixel_channel(p01, from.channels, to.channels, c);
                double bottom = (1 - wx) * pixel_channel(p10, from.channels, to.channels, c) +
                                wx * pixel_channel(p11, from.channels, to.channels, c);
                double v = (1 - wy) * top + wy * bottom + 0.5;
                dst[((size_t)y * to.width + x) * to.channels + c] = (uint8_t)(v > 255 ? 255 : v);
            }
        }
    }
}
