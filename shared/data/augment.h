/* augment.h: build a batch from uint8 records, as the seed's transforms do:
 * ToTensor (/255), RandomCrop(H, padding=pad) with zero padding, RandomHorizontalFlip(0.5),
 * Normalize(mean, std), then Cutout(size) (DeVries & Taylor: one size x size square
 * set to 0 after normalisation, centred uniformly on the image, clipped at its
 * border) — but in NHWC and with counter-based randomness (rng_augment and
 * rng_cutout of (seed, epoch, sample index)), so any run, resumed or re-sharded, on
 * CPU or GPU, sees the same crops, flips and squares. Zero padding happens BEFORE
 * normalisation, as in the seed (a padded pixel becomes -mean/std). Each of crop
 * (pad > 0), flip and cutout (> 0) can be off (cifar-train --augment, --cutout). */
#ifndef CIFAR_AUGMENT_H
#define CIFAR_AUGMENT_H

#include <stdint.h>

#include "core/rng.h"
#include "data/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int h, w, c;
    int pad;          /* 0 = no crop */
    int flip;         /* 1 = random horizontal flip */
    int cutout;       /* side of the cutout square, 0 = none */
    uint64_t seed;
    int64_t epoch;
    float mean[4], std[4];
} AugmentSpec;

#ifdef __CUDACC__
#define AUGMENT_FN static inline __host__ __device__
#else
#define AUGMENT_FN static inline
#endif

/* Sample `sample`'s crop offsets and flip in `epoch` (offsets pad, pad and no flip
 * where those are off): the one draw both devices use. */
AUGMENT_FN AugmentDraw augment_draw(const AugmentSpec *s, int64_t epoch, int64_t sample) {
    AugmentDraw d;
    d.dy = d.dx = s->pad;
    d.flip = 0;
    if (s->pad > 0 || s->flip) d = rng_augment(s->seed, (uint64_t)epoch, (uint64_t)sample, s->pad);
    if (s->pad == 0) d.dy = d.dx = 0;
    if (!s->flip) d.flip = 0;
    return d;
}

/* 1 when output pixel (y, x) lies in the sample's cutout square (drawn by
 * rng_cutout; the rows cy - size/2 .. cy - size/2 + size - 1, the same columns). */
AUGMENT_FN int augment_cut(const AugmentSpec *s, CutoutDraw d, int y, int x) {
    const int y0 = d.cy - s->cutout / 2, x0 = d.cx - s->cutout / 2;
    return s->cutout > 0 && y >= y0 && y < y0 + s->cutout && x >= x0 && x < x0 + s->cutout;
}

/* out[n,h,w,c] floats and out_labels[n] from records idx[0..n) of pixels/labels. */
void augment_batch(const AugmentSpec *spec, const uint8_t *pixels, const int32_t *labels,
                   const int64_t *idx, int n, float *out, int32_t *out_labels);
/* The same from a split wherever its records are (contiguous or in the dataset's
 * map): the batch is gathered straight from the mapped pages, nothing copied first. */
void augment_split(const AugmentSpec *spec, const HostSplit *split, const int64_t *idx, int n,
                   float *out, int32_t *out_labels);

#ifdef __cplusplus
}
#endif
#endif
