/* augment.h: build a batch from uint8 records, as the seed's transforms do:
 * ToTensor (/255), RandomCrop(H, padding=pad) with zero padding, RandomHorizontalFlip(0.5),
 * Normalize(mean, std) — but in NHWC and with counter-based randomness
 * (rng_augment(seed, epoch, sample index)), so any run, resumed or re-sharded, on
 * CPU or GPU, sees the same crops and flips. Zero padding happens BEFORE
 * normalisation, as in the seed (a padded pixel becomes -mean/std). */
#ifndef CIFAR_AUGMENT_H
#define CIFAR_AUGMENT_H

#include <stdint.h>

#include "data/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int h, w, c;
    int pad;          /* 0 = no crop */
    int flip;         /* 1 = random horizontal flip */
    uint64_t seed;
    int64_t epoch;
    float mean[4], std[4];
} AugmentSpec;

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
