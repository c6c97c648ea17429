/* bf16.h: bfloat16 storage for the CUDA engine's --precision bf16, written once for
 * the device and the host (plain C, no CUDA header): the kernels store activations
 * with it, tests/test_bn_nhwc.c checks it against an independent reference.
 *
 * bfloat16 is the top half of an IEEE fp32: sign, the same 8-bit exponent (the same
 * range, denormals included), 7 stored mantissa bits (about 2-3 significant decimal
 * digits; relative spacing 2^-8 = 0.39%). Widening is exact (bits << 16); narrowing
 * rounds to nearest, ties to even, like __float2bfloat16_rn: finite values that
 * round past the largest bf16 become infinity, infinities stay, a NaN stays a NaN
 * (quiet, its sign and top payload bits kept). */
#ifndef CIFAR_BF16_H
#define CIFAR_BF16_H

#include <stdint.h>
#include <string.h>

#ifdef __CUDACC__
#define BF16_HD static inline __host__ __device__
#else
#define BF16_HD static inline
#endif

typedef uint16_t bf16_t; /* the bits of one bfloat16 */

BF16_HD uint32_t bf16_f32_bits(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

BF16_HD float bf16_to_float(bf16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

BF16_HD bf16_t bf16_from_float(float f) {
    uint32_t u = bf16_f32_bits(f);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (bf16_t)((u >> 16) | 0x0040u); /* NaN: quiet */
    /* add half an ulp minus one, plus the kept lowest bit: ties go to even; a carry
     * into the exponent is the right rounding (up to infinity at the top) */
    u += 0x7fffu + ((u >> 16) & 1u);
    return (bf16_t)(u >> 16);
}

#endif
