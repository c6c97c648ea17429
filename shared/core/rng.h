/* rng.h: counter-based randomness, identical on CPU and GPU.
 *
 * Every random number is a pure function of (seed, stream, counter): no hidden
 * state, so a resumed, re-sharded or GPU run draws exactly the numbers an
 * uninterrupted CPU run draws. The mixer is SplitMix64's finaliser applied to a
 * combination of the three words (a strong 64-bit bijection; the streams below
 * keep uses apart). Header-only so CUDA kernels use the very same code. */
#ifndef CIFAR_RNG_H
#define CIFAR_RNG_H

#include <stdint.h>

#ifdef __CUDACC__
#define RNG_FN static inline __host__ __device__
#else
#define RNG_FN static inline
#endif

enum {
    RNG_STREAM_INIT = 1,      /* parameter initialisation: counter = tensor index << 32 | element */
    RNG_STREAM_SHUFFLE = 2,   /* sampler permutation: counter = epoch << 32 | step */
    RNG_STREAM_AUGMENT = 3,   /* crop/flip: counter = epoch << 40 | sample index */
    RNG_STREAM_SYNTH = 4,     /* synthetic dataset generator */
    RNG_STREAM_HOLDOUT = 5,   /* validation hold-out: counter = class << 32 | position */
    RNG_STREAM_CUTOUT = 6,    /* cutout square: counter = epoch << 40 | sample index */
};

RNG_FN uint64_t rng_mix64(uint64_t z) {
    z += 0x9E3779B97F4A7C15ull;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
}

/* A 64-bit random word for (seed, stream, counter). */
RNG_FN uint64_t rng_u64(uint64_t seed, uint64_t stream, uint64_t counter) {
    return rng_mix64(rng_mix64(seed ^ (stream * 0xD6E8FEB86659FD93ull)) ^ counter);
}

/* Uniform in [0, 1) with 24 random bits (exact in float). */
RNG_FN float rng_uniform(uint64_t seed, uint64_t stream, uint64_t counter) {
    return (float)(rng_u64(seed, stream, counter) >> 40) * (1.0f / 16777216.0f);
}

/* Uniform integer in [0, n), n >= 1 (Lemire's multiply-shift; bias < 2^-32 for our n). */
RNG_FN uint32_t rng_below(uint64_t seed, uint64_t stream, uint64_t counter, uint32_t n) {
    uint64_t r = rng_u64(seed, stream, counter) >> 32;
    return (uint32_t)((r * (uint64_t)n) >> 32);
}

/* The augmentation of one sample in one epoch: crop offsets in [0, 2*pad] and a flip. */
typedef struct {
    int dy, dx;
    int flip;
} AugmentDraw;

RNG_FN AugmentDraw rng_augment(uint64_t seed, uint64_t epoch, uint64_t sample, int pad) {
    uint64_t r = rng_u64(seed, RNG_STREAM_AUGMENT, (epoch << 40) ^ sample);
    AugmentDraw d;
    uint32_t span = (uint32_t)(2 * pad + 1);
    d.dy = (int)(((r & 0xFFFFFFFFull) * span) >> 32);
    d.dx = (int)((((r >> 32) & 0x7FFFFFFFull) * span) >> 31);
    d.flip = (int)((r >> 63) & 1);
    return d;
}

/* The cutout square of one sample in one epoch (DeVries & Taylor 2017): its centre,
 * uniform over the h x w image (the square may reach past the border and is clipped
 * there, as in their code). */
typedef struct {
    int cy, cx;
} CutoutDraw;

RNG_FN CutoutDraw rng_cutout(uint64_t seed, uint64_t epoch, uint64_t sample, int h, int w) {
    uint64_t r = rng_u64(seed, RNG_STREAM_CUTOUT, (epoch << 40) ^ sample);
    CutoutDraw d;
    d.cy = (int)(((r & 0xFFFFFFFFull) * (uint64_t)h) >> 32);
    d.cx = (int)(((r >> 32) * (uint64_t)w) >> 32);
    return d;
}

#endif
