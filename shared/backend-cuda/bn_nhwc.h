/* bn_nhwc.h: the arithmetic of the CUDA batch-norm kernels (cuda_bn.cu), written
 * once for the device and the host: cuda_bn.cu launches it, tests/test_bn_nhwc.c
 * runs the very same functions on the CPU, thread by thread in the kernels' order,
 * against ops.h's batch norm (so the indexing and the formulas are tested on every
 * machine, GPU or not). Plain C, no CUDA header.
 *
 * Data: NHWC, rows = n*hw, c channels. The formulas are ops_cpu_impl.h's: statistics
 * in double with the first row as the shift of the one-pass variance; the running
 * update with the unbiased variance; backward as dx = k1*g + k2*x + k3.
 *
 * Reduction order (deterministic, the same on every GPU): the rows are cut into
 * `chunks` chunks (bn_chunks: a function of rows only); a block of BN_TILE channels x
 * BN_LANES row lanes sums one chunk, lane l taking rows r0+l, r0+l+BN_LANES, ...;
 * lanes are added in order 0..BN_LANES-1 into one partial per (chunk, channel). The
 * last block of a channel tile to finish adds the partials: lane l takes chunks
 * l, l+BN_LANES, ..., then lanes in order. Two kernels per batch norm: this
 * reduction (with the per-channel finalisation fused into its last block) and one
 * element-wise pass; or, where the device allows (cuda_bn.cu), one cooperative
 * kernel doing the very same sums in the same order (bn_coop_item).
 *
 * Conv bias folding (net_cuda.cu): a conv bias that the CUDA table defers is added
 * to x as it is read (bn_in) and written back into x by the element-wise pass, so x
 * ends as the conv's contract says; and the backward reduction also sums x - mean,
 * from which the conv's bias gradient (the column sum of this BN's dx) is computed
 * exactly (bn_bwd_final: dsum).
 *
 * Activation type (--precision bf16): every function that reads or writes an
 * activation (x, y, z, dy, dx) takes `bf16` last: 0, they are floats; 1, they are
 * bfloat16 (bf16.h) stored in the same float-typed buffers (half the bytes), read
 * and written through act_load / act_store. The arithmetic, the statistics, the
 * parameters and the saved and running statistics stay in float/double either way.
 * The kernels pass a compile-time constant, so each instance has no branch. */
#ifndef CIFAR_BN_NHWC_H
#define CIFAR_BN_NHWC_H

#include <math.h>
#include <stddef.h>
#include <stdint.h>

#include "backend-cuda/bf16.h"

#ifdef __CUDACC__
#define BN_HD static inline __host__ __device__
#else
#define BN_HD static inline
#endif
/* Row loops unrolled in the device code so that a thread has several loads in
 * flight (the sums are still added one row after the other: unrolling does not
 * reorder them). Nothing for the host compilers, which do not know the pragma. */
#ifdef __CUDA_ARCH__
#define BN_UNROLL _Pragma("unroll 8")
#else
#define BN_UNROLL
#endif

#define BN_TILE 32            /* channels per block */
#define BN_LANES 8            /* row lanes per block */
#define BN_ROWS_PER_CHUNK 512  /* rows one block sums (about): 64 per lane */
#define BN_MAX_CHUNKS 1024
#define BN_MAX_C 4096          /* channels the scratch is sized for */
#define BN_SUMS 3              /* accumulators per channel (backward: dy, dy*(x-m), x-m) */
/* Partial sums per accumulator the scratch holds: chunks * c <= this. */
#define BN_PARTIALS ((int64_t)128 * BN_MAX_C)

/* Element-wise modes of the forward pass. */
enum { BN_PLAIN = 0, BN_RELU = 1, BN_ADD_RELU = 2 };

/* Chunks of rows x c (c <= BN_MAX_C): a function of the shape only, so the reduction
 * order, and the results, are the same on every GPU. */
BN_HD int bn_chunks(int64_t rows, int c) {
    int64_t p = (rows + BN_ROWS_PER_CHUNK - 1) / BN_ROWS_PER_CHUNK;
    int64_t cap = BN_PARTIALS / (c > 0 ? c : 1);
    if (cap > BN_MAX_CHUNKS) cap = BN_MAX_CHUNKS;
    if (p > cap) p = cap;
    return p < 1 ? 1 : (int)p;
}

/* Channel tiles of c channels (the two-kernel reduction's grid.x). */
BN_HD int bn_tiles(int c) { return (c + BN_TILE - 1) / BN_TILE; }

/* The cooperative (one-kernel) order: a grid of any number of blocks of BN_TILE x
 * BN_LANES threads, three phases between grid-wide barriers:
 *   1. block b takes work items w = b, b + blocks, ... < tiles * chunks; item w is
 *      the two-kernel reduction's block (tile, chunk) given by bn_coop_item, with
 *      the same lane sums added in the same order into partial[chunk][k][channel];
 *   2. block b takes tiles b, b + blocks, ... and adds their chunks' partials as the
 *      two-kernel path's last block does, then finalises each channel;
 *   3. thread t of the grid's T takes elements t, t + T, ... (element-wise pass).
 * Each sum is the two-kernel path's in its order, whatever the grid: results are bit
 * for bit the same. */
BN_HD void bn_coop_item(int64_t w, int tiles, int *tile, int *chunk) {
    *tile = (int)(w % tiles);
    *chunk = (int)(w / tiles);
}

/* Phase 3 of the cooperative order: the first element of thread (tx, ty) of block b,
 * and the step of a grid of `blocks` blocks. */
BN_HD int64_t bn_coop_elem0(int b, int ty, int tx) {
    return (int64_t)b * (BN_TILE * BN_LANES) + ty * BN_TILE + tx;
}
BN_HD int64_t bn_coop_elem_step(int blocks) { return (int64_t)blocks * (BN_TILE * BN_LANES); }

/* Channel index of element i of an NHWC tensor (32-bit arithmetic when it fits:
 * a 64-bit remainder is many instructions on a GPU). */
BN_HD int bn_channel(int64_t i, int c) {
    return i <= 0xffffffffLL ? (int)((uint32_t)i % (uint32_t)c) : (int)(i % c);
}

/* Rows [*r0, *r1) of chunk p of `chunks`. */
BN_HD void bn_chunk_rows(int64_t rows, int chunks, int p, int64_t *r0, int64_t *r1) {
    int64_t per = (rows + chunks - 1) / chunks;
    int64_t a = (int64_t)p * per, b = a + per;
    *r0 = a < rows ? a : rows;
    *r1 = b < rows ? b : rows;
}

/* Element i of an activation tensor of floats (bf16 = 0) or bfloat16 (1). */
BN_HD float act_load(const float *p, int64_t i, int bf16) {
    return bf16 ? bf16_to_float(((const bf16_t *)p)[i]) : p[i];
}

BN_HD void act_store(float *p, int64_t i, float v, int bf16) {
    if (bf16)
        ((bf16_t *)p)[i] = bf16_from_float(v);
    else
        p[i] = v;
}

/* dy[i] through the ReLU mask of y (y[i] > 0, so a NaN y masks it to 0),
 * or dy[i] itself when y is NULL. */
BN_HD float bn_masked_dy(const float *y, const float *dy, int64_t i, int bf16) {
    if (y && !(act_load(y, i, bf16) > 0.0f)) return 0.0f;
    return act_load(dy, i, bf16);
}

/* v as the activation type holds it (the identity for floats). */
BN_HD float act_round(float v, int bf16) { return bf16 ? bf16_to_float(bf16_from_float(v)) : v; }

/* x as the BN sees it: plus the conv bias of its channel (a fused conv + BN), when there is one
 * (rounded to the activation type: what the element-wise pass writes back). */
BN_HD float bn_in(const float *x, const float *bias, int64_t i, int ch, int bf16) {
    float v = act_load(x, i, bf16);
    return bias ? act_round(v + bias[ch], bf16) : v;
}

BN_HD float bn_relu(float v) { return v <= 0.0f ? 0.0f : v; } /* NaN passes */

/* Forward statistics of one lane: s[0] = sum (v - shift), s[1] = sum (v - shift)^2. */
BN_HD void bn_fwd_lane(const float *x, const float *bias, int64_t rows, int c, int chunks, int ch,
                       int p, int lane, double *s, int bf16) {
    int64_t r0, r1;
    bn_chunk_rows(rows, chunks, p, &r0, &r1);
    const double shift = (double)bn_in(x, bias, ch, ch, bf16);
    double s1 = 0.0, s2 = 0.0;
    BN_UNROLL
    for (int64_t r = r0 + lane; r < r1; r += BN_LANES) {
        double d = (double)bn_in(x, bias, r * c + ch, ch, bf16) - shift;
        s1 += d;
        s2 += d * d;
    }
    s[0] = s1;
    s[1] = s2;
}

/* Backward sums of one lane, g = dy masked by y > 0 when y is given (the ReLU after
 * the BN): s[0] = sum g, s[1] = sum g*(x - mean), s[2] = sum (x - mean). */
BN_HD void bn_bwd_lane(const float *x, const float *y, const float *dy, const float *save_mean,
                       int64_t rows, int c, int chunks, int ch, int p, int lane, double *s,
                       int bf16) {
    int64_t r0, r1;
    bn_chunk_rows(rows, chunks, p, &r0, &r1);
    const double mean = (double)save_mean[ch];
    double a1 = 0.0, a2 = 0.0, a3 = 0.0;
    BN_UNROLL
    for (int64_t r = r0 + lane; r < r1; r += BN_LANES) {
        int64_t i = r * c + ch;
        float g = bn_masked_dy(y, dy, i, bf16);
        double xm = (double)act_load(x, i, bf16) - mean;
        a1 += g;
        a2 += (double)g * xm;
        a3 += xm;
    }
    s[0] = a1;
    s[1] = a2;
    s[2] = a3;
}

/* y = v*scale + (beta - mean*scale): the per-channel affine a BN applies. */
BN_HD void bn_set_affine(int c, int ch, double scale, double mean, float beta, float *aff) {
    aff[ch] = (float)scale;
    aff[c + ch] = (float)((double)beta - mean * scale);
}

/* PyTorch's running update, with the unbiased batch variance. */
BN_HD void bn_running_update(int64_t rows, double mean, double var, float momentum, float *rm,
                             float *rv) {
    double unbiased = rows > 1 ? var * rows / (rows - 1) : var;
    *rm = (float)((1.0 - momentum) * *rm + momentum * mean);
    *rv = (float)((1.0 - momentum) * *rv + momentum * unbiased);
}

/* Per channel, from the totals of bn_fwd_lane (sums of v - shift and its square,
 * shift = the first row's v): the saved and running statistics and the affine
 * (ops_cpu_impl.h's opsi_bn_train_affine, the same formulas). */
BN_HD void bn_fwd_final(int64_t rows, int c, int ch, const float *x, const float *bias,
                        const double *s, const float *gamma, const float *beta, float momentum,
                        float eps, float *save_mean, float *save_invstd, float *running_mean,
                        float *running_var, float *aff, int bf16) {
    double dm = s[0] / rows, mean = (double)bn_in(x, bias, ch, ch, bf16) + dm;
    double var = s[1] / rows - dm * dm;
    var = var < 0 ? 0 : var; /* NaN stays NaN */
    double invstd = 1.0 / sqrt(var + (double)eps);
    save_mean[ch] = (float)mean;
    save_invstd[ch] = (float)invstd;
    bn_running_update(rows, mean, var, momentum, &running_mean[ch], &running_var[ch]);
    bn_set_affine(c, ch, (double)gamma[ch] * invstd, mean, beta[ch], aff);
}

/* Inference: the affine from the running statistics. */
BN_HD void bn_eval_final(int c, int ch, const float *gamma, const float *beta,
                         const float *running_mean, const float *running_var, float eps,
                         float *aff) {
    double scale = (double)gamma[ch] / sqrt((double)running_var[ch] + (double)eps);
    bn_set_affine(c, ch, scale, (double)running_mean[ch], beta[ch], aff);
}

/* Per channel, from the totals of bn_bwd_lane: dgamma, dbeta, the coefficients
 * k[0..c) k1, k[c..2c) k2, k[2c..3c) k3 (opsi_bn_bwd_coeffs), and dsum[ch] = the sum
 * over rows of the dx the element-wise pass writes, k1*sum g + k2*sum x + rows*k3
 * with the float coefficients: the conv bias gradient when the conv's output is this
 * BN's input (exactly 0 in exact arithmetic: a bias in front of a training-mode BN has
 * no effect on the loss). */
BN_HD void bn_bwd_final(int64_t rows, int c, int ch, const double *s, const float *gamma,
                        const float *save_mean, const float *save_invstd, float *dgamma,
                        float *dbeta, float *k, float *dsum) {
    double sdy = s[0], sdyx = s[1], sxm = s[2];
    double inv = save_invstd[ch], g = gamma[ch], mean = save_mean[ch];
    dbeta[ch] = (float)sdy;
    dgamma[ch] = (float)(sdyx * inv);
    double k1 = g * inv;
    double k2 = -g * inv * inv * inv * sdyx / rows;
    double k3 = -g * inv * sdy / rows - k2 * mean;
    float f1 = (float)k1, f2 = (float)k2, f3 = (float)k3;
    k[ch] = f1;
    k[c + ch] = f2;
    k[2 * c + ch] = f3;
    dsum[ch] = (float)((double)f1 * sdy + (double)f2 * (sxm + rows * mean) + (double)rows * f3);
}

/* Forward element i: v = x (+ the fused conv bias, written back into x), then the affine,
 * then by mode nothing, ReLU, or + z and ReLU. */
BN_HD void bn_fwd_apply(int64_t i, int c, float *x, const float *bias, const float *aff,
                        const float *z, int mode, float *y, int bf16) {
    int ch = bn_channel(i, c);
    float v = bn_in(x, bias, i, ch, bf16);
    if (bias) act_store(x, i, v, bf16);
    float t = v * aff[ch] + aff[c + ch];
    if (mode == BN_RELU) t = bn_relu(t);
    else if (mode == BN_ADD_RELU) t = bn_relu(t + act_load(z, i, bf16));
    act_store(y, i, t, bf16);
}

/* Backward element i: dx = k1*g + k2*x + k3 (dx may be dy). */
BN_HD void bn_bwd_apply(int64_t i, int c, const float *x, const float *y, const float *dy,
                        const float *k, float *dx, int bf16) {
    int ch = bn_channel(i, c);
    float g = bn_masked_dy(y, dy, i, bf16);
    act_store(dx, i, k[ch] * g + k[c + ch] * act_load(x, i, bf16) + k[2 * c + ch], bf16);
}

/* bn_bwd_apply with the ReLU mask (y non-NULL) that also writes the masked gradient
 * back into dy (dy[i] = g, then dx from it: the very same dx): the gradient an
 * identity shortcut carries past a block's output ReLU (net_ops.h:
 * bn_relu_backward_keep). dx != dy. */
BN_HD void bn_bwd_apply_keep(int64_t i, int c, const float *x, const float *y, float *dy,
                             const float *k, float *dx, int bf16) {
    float g = bn_masked_dy(y, dy, i, bf16);
    act_store(dy, i, g, bf16); /* g is a value of dy or 0: exact in bf16 */
    bn_bwd_apply(i, c, x, NULL, dy, k, dx, bf16);
}

#endif
