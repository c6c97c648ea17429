/* cpu_bn.h: the batch-norm entries (cpu_bn_train, cpu_bn_relu_train, cpu_bn_add_relu_train,
 * cpu_bn_eval, cpu_bn_backward, cpu_bn_relu_backward; the bf16 table's
 * cpu_bn_relu_backward_keep).
 * Part of the CPU op table (ops_cpu_impl.h), instanced with it: no include guard,
 * included once per instance, after cpu_common.h. x, y, z, dy and dx are activations
 * (opsi_ld/opsi_st, cpu_common.h); statistics, gamma/beta and their gradients real_t. */

/* ------------------------------------------------------------- batchnorm */

/* a1[ch] += x - shift[ch], a2[ch] += its square, in double, over rows [r0, r1) of x[][c]. */
static inline __attribute__((always_inline)) void opsi_bn_stat_rows(int64_t r0, int64_t r1, const int c,
                                                                    const real_t *x, const real_t *shift,
                                                                    double *a1, double *a2) {
    for (int64_t r = r0; r < r1; r++) {
        for (int ch = 0; ch < c; ch++) {
            double d = (double)opsi_ld(x, r * c + ch) - (double)shift[ch];
            a1[ch] += d;
            a2[ch] += d * d;
        }
    }
}

#ifdef OPS_ACT_BF16
/* The bf16 table's row loops of the statistics in AVX-512 (the table is built for
 * x86-64-v4), for 8, 16, 32, 48 or 64 channels: the sums (forward: of x - shift and
 * its square; backward: of g and g (x - mean)) over the rows' elements taken flat, 16
 * fp32 lanes a vector (two rows of 8 channels), each lane summed in fp32 over
 * OPSI_BN_CHUNK vectors (32 to 64 rows), those sums added in double in row order
 * within the fixed row blocks (so the same for any thread count): about 1e-7 of the
 * sum of the terms' magnitudes (test_cpu_bf16). The forward's shift is the mean of the
 * first rows (opsi_bn_shift), so the one-pass variance does not amplify that error
 * (it would by 1 + (mean - shift)^2 / var). Measured with perf, GCC's loops in double
 * were the hottest code of a bf16 step: it left the 8-channel ReLU backward scalar,
 * stored every row's sums, and the converts to double took most of the rest. */
#include <immintrin.h>

enum { OPSI_PHASES_MAX = 4, OPSI_BN_CHUNK = 32, OPSI_BN_SHIFT_ROWS = 64 };
#define OPSI_BN_VEC(c) ((c) == 8 || ((c) % 16 == 0 && (c) <= 16 * OPSI_PHASES_MAX))

/* 16 bf16 values from element i of p (the lanes of m; the others 0), widened to fp32
 * (exact). */
static inline __attribute__((always_inline)) __m512 opsi_ld16(const real_t *p, int64_t i, __mmask16 m) {
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

/* Vector k of a row block (16 elements, flat from its first row) holds channels
 * (16 * (k mod P) + lane) mod c: P phases (1 for 8 channels, two rows a vector). */
static inline __attribute__((always_inline)) int opsi_bn_phases(const int c) { return c == 8 ? 1 : c / 16; }

/* The lanes of each phase of per-channel values v. */
static inline __attribute__((always_inline)) void opsi_bn_pattern(const int c, const float *v, __m512 *out) {
    for (int j = 0; j < opsi_bn_phases(c); j++) {
        float t[16];
        for (int l = 0; l < 16; l++) t[l] = v[(16 * j + l) % c];
        out[j] = _mm512_loadu_ps(t);
    }
}

/* d (8 channels a vector) += the fp32 sums f of every phase, in lane order; f = 0. */
static inline __attribute__((always_inline)) void opsi_bn_flush(const int c, __m512 *f, __m512d *d) {
    for (int j = 0; j < opsi_bn_phases(c); j++) {
        const int lo = (16 * j) % c / 8, hi = (16 * j + 8) % c / 8;
        d[lo] = _mm512_add_pd(d[lo], _mm512_cvtps_pd(_mm512_castps512_ps256(f[j])));
        d[hi] = _mm512_add_pd(d[hi], _mm512_cvtps_pd(_mm512_extractf32x8_ps(f[j], 1)));
        f[j] = _mm512_setzero_ps();
    }
}

/* One vector (lanes m) at element i: bwd: f1 += g, f2 += g * (x - p) with g = relu ?
 * (y > 0 ? dy : 0) : dy; else f1 += x - p, f2 += its square. */
static inline __attribute__((always_inline)) void
opsi_bn_sums_step(const int bwd, const int relu, const real_t *x, const real_t *y, const real_t *dy,
                  int64_t i, __mmask16 m, __m512 p, __m512 *f1, __m512 *f2) {
    __m512 d = _mm512_maskz_sub_ps(m, opsi_ld16(x, i, m), p);
    if (!bwd) {
        *f1 = _mm512_add_ps(*f1, d);
        *f2 = _mm512_fmadd_ps(d, d, *f2);
        return;
    }
    __m512 g = opsi_ld16(dy, i, m);
    if (relu) g = _mm512_maskz_mov_ps(_mm512_cmp_ps_mask(opsi_ld16(y, i, m), _mm512_setzero_ps(), _CMP_GT_OQ), g);
    *f1 = _mm512_add_ps(*f1, g);
    *f2 = _mm512_fmadd_ps(g, d, *f2);
}

/* a1, a2 += the sums of opsi_bn_sums_step over rows [r0, r1) of c channels; p: the
 * per-channel values subtracted from x (the shift, or the mean). */
static inline __attribute__((always_inline)) void
opsi_bn_sums_vec(int64_t r0, int64_t r1, const int c, const int bwd, const int relu, const real_t *x,
                 const real_t *y, const real_t *dy, const float *p, double *a1, double *a2) {
    const int P = opsi_bn_phases(c);
    __m512 pat[OPSI_PHASES_MAX], f1[OPSI_PHASES_MAX], f2[OPSI_PHASES_MAX];
    __m512d d1[2 * OPSI_PHASES_MAX], d2[2 * OPSI_PHASES_MAX];
    opsi_bn_pattern(c, p, pat);
    for (int j = 0; j < P; j++) f1[j] = f2[j] = _mm512_setzero_ps();
    for (int v = 0; v < c / 8; v++) d1[v] = _mm512_loadu_pd(a1 + 8 * v), d2[v] = _mm512_loadu_pd(a2 + 8 * v);
    const int64_t base = r0 * c, nel = (r1 - r0) * c, nvec = nel / 16, nper = nvec / P;
    for (int64_t q0 = 0; q0 < nper; q0 += OPSI_BN_CHUNK) {
        const int64_t q1 = q0 + OPSI_BN_CHUNK < nper ? q0 + OPSI_BN_CHUNK : nper;
        for (int64_t q = q0; q < q1; q++)
            for (int j = 0; j < P; j++)
                opsi_bn_sums_step(bwd, relu, x, y, dy, base + 16 * (q * P + j), 0xffff, pat[j], &f1[j], &f2[j]);
        opsi_bn_flush(c, f1, d1);
        opsi_bn_flush(c, f2, d2);
    }
    /* c = 16 P: a row is P vectors, so nvec = nper P; 8 channels: an odd row count
     * leaves 8 elements, of phase 0 (P = 1) */
    if (nel % 16) opsi_bn_sums_step(bwd, relu, x, y, dy, base + 16 * nvec, 0x00ff, pat[0], &f1[0], &f2[0]);
    opsi_bn_flush(c, f1, d1);
    opsi_bn_flush(c, f2, d2);
    for (int v = 0; v < c / 8; v++) _mm512_storeu_pd(a1 + 8 * v, d1[v]), _mm512_storeu_pd(a2 + 8 * v, d2[v]);
}

/* opsi_bn_stat_rows in these loops. */
static inline __attribute__((always_inline)) void
opsi_bn_stat_rows_vec(int64_t r0, int64_t r1, const int c, const real_t *x, const real_t *shift,
                      double *a1, double *a2) {
    opsi_bn_sums_vec(r0, r1, c, 0, 0, x, NULL, NULL, shift, a1, a2);
}

/* opsi_bn_bwd_rows in these loops. */
static inline __attribute__((always_inline)) void
opsi_bn_bwd_rows_vec(int64_t r0, int64_t r1, const int c, const real_t *x, const real_t *y,
                     const real_t *dy, const real_t *save_mean, const int relu, double *a1,
                     double *a2) {
    opsi_bn_sums_vec(r0, r1, c, 1, relu, x, y, dy, save_mean, a1, a2);
}
#else
#define OPSI_BN_VEC(c) 0
#define opsi_bn_stat_rows_vec opsi_bn_stat_rows
#define opsi_bn_bwd_rows_vec opsi_bn_bwd_rows
#endif

/* The per-channel shift of the statistics' sums, which keeps the one-pass variance free
 * of cancellation: the first row; in the bf16 table's fp32 loops (OPSI_BN_VEC), the
 * mean of the first OPSI_BN_SHIFT_ROWS rows (in double, rounded to fp32), nearer the
 * mean than one row (see there). */
static void opsi_bn_shift(int rows, int c, const real_t *x, real_t *shift) {
    (void)rows; /* in the bf16 table's instance only */
#ifdef OPS_ACT_BF16
    if (OPSI_BN_VEC(c) && rows > 0) {
        const int k = rows < OPSI_BN_SHIFT_ROWS ? rows : OPSI_BN_SHIFT_ROWS;
        for (int ch = 0; ch < c; ch++) {
            double s = 0.0;
            for (int r = 0; r < k; r++) s += opsi_ld(x, (int64_t)r * c + ch);
            shift[ch] = (real_t)(s / k);
        }
        return;
    }
#endif
    for (int ch = 0; ch < c; ch++) shift[ch] = opsi_ld(x, ch);
}

/* Team. Training-mode statistics: per-channel sums of (x - shift) and of its square
 * in double over the fixed row blocks (opsi_bn_shift), combined in block order; saves mean and invstd,
 * updates the running ones (thread 0), and returns the per-channel affine (aff[0..c)
 * scale, aff[c..2c) shift; the calling thread's copy) that maps x to y. */
static const real_t *opsi_bn_train_affine(int rows, int c, const real_t *x, const real_t *gamma,
                                          const real_t *beta, real_t *save_mean,
                                          real_t *save_invstd, real_t *running_mean,
                                          real_t *running_var, real_t momentum, real_t eps) {
    int nb = opsi_block_count(rows);
    double *part = ops_team_scratch((size_t)nb * 2 * (size_t)c * sizeof(double));
    real_t *aff = opsi_thread_copy(OPSI_TLS_STATS, (size_t)c * 2);
    /* every thread its own copy of the shift, in aff's second half: the loop below
     * reads channel ch's before it writes that channel's affine shift there */
    real_t *shift = aff + c;
    opsi_bn_shift(rows, c, x, shift);
    const int first = omp_get_thread_num() == 0; /* writes the statistics */
#pragma omp for schedule(static)
    for (int b = 0; b < nb; b++) {
        double *a1 = part + (size_t)b * 2 * c, *a2 = a1 + c;
        for (int ch = 0; ch < 2 * c; ch++) a1[ch] = 0.0;
        const int64_t r0 = opsi_block_start(rows, nb, b), r1 = opsi_block_start(rows, nb, b + 1);
        if (OPSI_BN_VEC(c)) OPSI_WITH_C(c, opsi_bn_stat_rows_vec(r0, r1, C_, x, shift, a1, a2));
        else OPSI_WITH_C(c, opsi_bn_stat_rows(r0, r1, C_, x, shift, a1, a2));
    }
    /* every thread combines the partials in block order for its own copy of the affine */
    for (int ch = 0; ch < c; ch++) {
        double s1 = 0.0, s2 = 0.0;
        for (int b = 0; b < nb; b++) {
            s1 += part[(size_t)b * 2 * c + ch];
            s2 += part[(size_t)b * 2 * c + c + ch];
        }
        double dm = s1 / rows;
        double mean = (double)shift[ch] + dm;
        double var = s2 / rows - dm * dm;
        if (var < 0) var = 0;
        double invstd = 1.0 / sqrt(var + (double)eps);
        if (first) {
            save_mean[ch] = (real_t)mean;
            save_invstd[ch] = (real_t)invstd;
            double unbiased = rows > 1 ? var * rows / (rows - 1) : var;
            running_mean[ch] = (real_t)((1.0 - momentum) * running_mean[ch] + momentum * mean);
            running_var[ch] = (real_t)((1.0 - momentum) * running_var[ch] + momentum * unbiased);
        }
        double scale = (double)gamma[ch] * invstd;
        aff[ch] = (real_t)scale;
        aff[c + ch] = (real_t)((double)beta[ch] - mean * scale);
    }
    return aff;
}

/* Team. y = x * aff[ch] + aff[c + ch], then max(., 0) when relu, or max(. + z, 0)
 * when z is given (NaN passes, as in PyTorch): the same arithmetic as the affine then
 * relu_forward or add_relu_forward, in one pass. */
static inline __attribute__((always_inline)) void
opsi_channel_affine_c(int64_t rows, const int c, const real_t *x, const real_t *aff, int relu,
                      const real_t *z, real_t *y) {
    const real_t *scale = aff, *shift = aff + c;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t r0 = r * c;
        if (z) {
            for (int ch = 0; ch < c; ch++) {
                real_t v = opsi_ld(x, r0 + ch) * scale[ch] + shift[ch];
                real_t s = v + opsi_ld(z, r0 + ch);
                opsi_st(y, r0 + ch, s <= 0 ? 0 : s);
            }
        } else if (relu)
            for (int ch = 0; ch < c; ch++) {
                real_t v = opsi_ld(x, r0 + ch) * scale[ch] + shift[ch];
                opsi_st(y, r0 + ch, v <= 0 ? 0 : v);
            }
        else
            for (int ch = 0; ch < c; ch++) opsi_st(y, r0 + ch, opsi_ld(x, r0 + ch) * scale[ch] + shift[ch]);
    }
}

static void opsi_channel_affine(int64_t rows, int c, const real_t *x, const real_t *aff, int relu,
                                const real_t *z, real_t *y) {
    OPSI_WITH_C(c, opsi_channel_affine_c(rows, C_, x, aff, relu, z, y));
}

static void opsi_bn_forward_train(int rows, int c, const real_t *x, const real_t *gamma,
                                  const real_t *beta, real_t *y, real_t *save_mean,
                                  real_t *save_invstd, real_t *running_mean, real_t *running_var,
                                  real_t momentum, real_t eps, int relu, const real_t *z) {
    const real_t *aff = opsi_bn_train_affine(rows, c, x, gamma, beta, save_mean, save_invstd,
                                             running_mean, running_var, momentum, eps);
    opsi_channel_affine(rows, c, x, aff, relu, z, y);
}

static void cpu_bn_train(void *ctx, int n, int hw, int c, const real_t *x, const real_t *gamma,
                         const real_t *beta, real_t *y, real_t *save_mean, real_t *save_invstd,
                         real_t *running_mean, real_t *running_var, float momentum, float eps) {
    (void)ctx;
    OPSI_TEAM(opsi_bn_forward_train(n * hw, c, x, gamma, beta, y, save_mean, save_invstd,
                                    running_mean, running_var, momentum, eps, 0, NULL));
}

static void cpu_bn_relu_train(void *ctx, int n, int hw, int c, const real_t *x,
                              const real_t *gamma, const real_t *beta, real_t *y,
                              real_t *save_mean, real_t *save_invstd, real_t *running_mean,
                              real_t *running_var, float momentum, float eps) {
    (void)ctx;
    OPSI_TEAM(opsi_bn_forward_train(n * hw, c, x, gamma, beta, y, save_mean, save_invstd,
                                    running_mean, running_var, momentum, eps, 1, NULL));
}

/* One pass: tmp (the BN output before the add) is never needed. */
static void cpu_bn_add_relu_train(void *ctx, int n, int hw, int c, const real_t *x,
                                  const real_t *gamma, const real_t *beta, const real_t *z,
                                  real_t *tmp, real_t *y, real_t *save_mean, real_t *save_invstd,
                                  real_t *running_mean, real_t *running_var, float momentum,
                                  float eps) {
    (void)ctx;
    (void)tmp;
    OPSI_TEAM(opsi_bn_forward_train(n * hw, c, x, gamma, beta, y, save_mean, save_invstd,
                                    running_mean, running_var, momentum, eps, 1, z));
}

static void opsi_bn_forward_eval(int rows, int c, const real_t *x, const real_t *gamma,
                                 const real_t *beta, const real_t *running_mean,
                                 const real_t *running_var, real_t eps, real_t *y) {
    real_t *aff = opsi_thread_copy(OPSI_TLS_STATS, (size_t)c * 2);
    for (int ch = 0; ch < c; ch++) {
        double scale = (double)gamma[ch] / sqrt((double)running_var[ch] + (double)eps);
        aff[ch] = (real_t)scale;
        aff[c + ch] = (real_t)((double)beta[ch] - (double)running_mean[ch] * scale);
    }
    opsi_channel_affine(rows, c, x, aff, 0, NULL, y);
}

static void cpu_bn_eval(void *ctx, int n, int hw, int c, const real_t *x, const real_t *gamma,
                        const real_t *beta, const real_t *running_mean, const real_t *running_var,
                        float eps, real_t *y) {
    (void)ctx;
    OPSI_TEAM(opsi_bn_forward_eval(n * hw, c, x, gamma, beta, running_mean, running_var, eps, y));
}

/* From the per-block partial sums part[b*2cs + 0..c) = sum dy, part[b*2cs + cs..cs+c) =
 * sum dy * (x - mean): dgamma, dbeta (overwritten, unless NULL) and the coefficients of
 * dx = k1*dy + k2*x + k3 (the usual formula, expanded) into kc[0..3c). */
static void opsi_bn_bwd_coeffs(int rows, int c, int nb, int64_t cs, const double *part,
                               const real_t *gamma,
                               const real_t *save_mean, const real_t *save_invstd,
                               real_t *dgamma, real_t *dbeta, real_t *kc) {
    for (int ch = 0; ch < c; ch++) {
        double sdy = 0.0, sdyx = 0.0;
        for (int b = 0; b < nb; b++) {
            sdy += part[(size_t)b * 2 * cs + ch];
            sdyx += part[(size_t)b * 2 * cs + cs + ch];
        }
        double inv = save_invstd[ch], g = gamma[ch];
        if (dgamma) {
            dbeta[ch] = (real_t)sdy;
            dgamma[ch] = (real_t)(sdyx * inv);
        }
        double k1 = g * inv;
        double k2 = -g * inv * inv * inv * sdyx / rows;
        double k3 = -g * inv * sdy / rows - k2 * save_mean[ch];
        kc[ch] = (real_t)k1;
        kc[c + ch] = (real_t)k2;
        kc[2 * c + ch] = (real_t)k3;
    }
}

/* Team. The backward of batch norm, with the gradient g = relu ? (y > 0 ? dy : 0) : dy
 * formed on the fly in both passes (the ReLU's backward fused in: the same values in
 * the same order as the two ops, with no g buffer). The mask feeding the double
 * accumulators stays a branch (scalar code) unless GCC may assume FP operations do
 * not trap; no effect on the results (no reassociation). */
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC push_options
#pragma GCC optimize("no-trapping-math")
#endif
/* a1[ch] += g, a2[ch] += g * (x - mean), in double, over rows [r0, r1); g as below. */
static inline __attribute__((always_inline)) void
opsi_bn_bwd_rows(int64_t r0, int64_t r1, const int c, const real_t *x, const real_t *y,
                 const real_t *dy, const real_t *save_mean, const int relu, double *a1, double *a2) {
    for (int64_t r = r0; r < r1; r++) {
        const int64_t i0 = r * c;
        for (int ch = 0; ch < c; ch++) {
            real_t g = relu ? (opsi_ld(y, i0 + ch) > 0 ? opsi_ld(dy, i0 + ch) : 0) : opsi_ld(dy, i0 + ch);
            a1[ch] += g;
            a2[ch] += (double)g * ((double)opsi_ld(x, i0 + ch) - save_mean[ch]);
        }
    }
}

/* Team. dx = k1*g + k2*x + k3 over every row; keep: g written back into dy (the
 * folded block backward's masked gradient, the bits relu_backward would write). */
static inline __attribute__((always_inline)) void
opsi_bn_bwd_dx(int64_t rows, const int c, const real_t *x, const real_t *y, real_t *dy,
               const real_t *kc, const int relu, const int keep, real_t *dx) {
    const real_t *k1 = kc, *k2 = kc + c, *k3 = kc + 2 * c;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        const int64_t r0 = r * c;
        for (int ch = 0; ch < c; ch++) {
            real_t g = relu ? (opsi_ld(y, r0 + ch) > 0 ? opsi_ld(dy, r0 + ch) : 0) : opsi_ld(dy, r0 + ch);
            opsi_st(dx, r0 + ch, k1[ch] * g + k2[ch] * opsi_ld(x, r0 + ch) + k3[ch]);
            if (keep) opsi_st(dy, r0 + ch, g);
        }
    }
}

static inline __attribute__((always_inline)) void
opsi_bn_backward(int rows, int c, const real_t *x, const real_t *y, const real_t *gamma,
                 const real_t *save_mean, const real_t *save_invstd, real_t *dy, real_t *dx,
                 real_t *dgamma, real_t *dbeta, const int relu, const int keep) {
    int nb = opsi_block_count(rows);
    /* a2 at least 16 doubles past a1: for narrow layers (8 channels) GCC's run-time
     * overlap check fails otherwise and the loop runs scalar, on a branch */
    int64_t cs = relu && c < 16 ? 16 : c;
    double *part = ops_team_scratch((size_t)nb * 2 * (size_t)cs * sizeof(double));
    real_t *kc = opsi_thread_copy(OPSI_TLS_STATS, (size_t)c * 3);
    const int first = omp_get_thread_num() == 0; /* writes dgamma, dbeta; all get kc */
#pragma omp for schedule(static)
    for (int b = 0; b < nb; b++) {
        double *a1 = part + (size_t)b * 2 * cs, *a2 = a1 + cs;
        for (int64_t ch = 0; ch < 2 * cs; ch++) a1[ch] = 0.0;
        const int64_t r0 = opsi_block_start(rows, nb, b), r1 = opsi_block_start(rows, nb, b + 1);
        if (OPSI_BN_VEC(c)) OPSI_WITH_C(c, opsi_bn_bwd_rows_vec(r0, r1, C_, x, y, dy, save_mean, relu, a1, a2));
        else OPSI_WITH_C(c, opsi_bn_bwd_rows(r0, r1, C_, x, y, dy, save_mean, relu, a1, a2));
    }
    opsi_bn_bwd_coeffs(rows, c, nb, cs, part, gamma, save_mean, save_invstd,
                       first ? dgamma : NULL, dbeta, kc);
    if (!dx) {
#pragma omp barrier
        return; /* the partials (scratch) are read until here */
    }
    OPSI_WITH_C(c, opsi_bn_bwd_dx(rows, C_, x, y, dy, kc, relu, keep, dx));
}

static void opsi_bn_backward_plain(int rows, int c, const real_t *x, const real_t *gamma,
                                   const real_t *save_mean, const real_t *save_invstd,
                                   const real_t *dy, real_t *dx, real_t *dgamma, real_t *dbeta) {
    /* dy is only read (keep 0) */
    opsi_bn_backward(rows, c, x, NULL, gamma, save_mean, save_invstd, (real_t *)dy, dx, dgamma,
                     dbeta, 0, 0);
}

static void opsi_bn_relu_backward(int rows, int c, const real_t *x, const real_t *y,
                                  const real_t *gamma, const real_t *save_mean,
                                  const real_t *save_invstd, const real_t *dy, real_t *dx,
                                  real_t *dgamma, real_t *dbeta) {
    opsi_bn_backward(rows, c, x, y, gamma, save_mean, save_invstd, (real_t *)dy, dx, dgamma,
                     dbeta, 1, 0);
}

#ifdef OPS_ACT_BF16
/* The bf16 table's folded block backward (net_ops.h's bn_relu_backward_keep). */
static void opsi_bn_relu_backward_keep(int rows, int c, const real_t *x, const real_t *y,
                                       const real_t *gamma, const real_t *save_mean,
                                       const real_t *save_invstd, real_t *dy, real_t *dx,
                                       real_t *dgamma, real_t *dbeta) {
    opsi_bn_backward(rows, c, x, y, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta, 1, 1);
}
#endif
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC pop_options
#endif

static void cpu_bn_backward(void *ctx, int n, int hw, int c, const real_t *x, const real_t *gamma,
                            const real_t *save_mean, const real_t *save_invstd, const real_t *dy,
                            real_t *dx, real_t *dgamma, real_t *dbeta) {
    (void)ctx;
    OPSI_TEAM(opsi_bn_backward_plain(n * hw, c, x, gamma, save_mean, save_invstd, dy, dx, dgamma,
                                     dbeta));
}

static void cpu_bn_relu_backward(void *ctx, int n, int hw, int c, const real_t *x, const real_t *y,
                                 const real_t *gamma, const real_t *save_mean,
                                 const real_t *save_invstd, real_t *dy, real_t *dx, real_t *dgamma,
                                 real_t *dbeta) {
    (void)ctx;
    OPSI_TEAM(opsi_bn_relu_backward(n * hw, c, x, y, gamma, save_mean, save_invstd, dy, dx, dgamma,
                                    dbeta));
}

#ifdef OPS_ACT_BF16
static void cpu_bn_relu_backward_keep(void *ctx, int n, int hw, int c, const real_t *x,
                                      const real_t *y, const real_t *gamma,
                                      const real_t *save_mean, const real_t *save_invstd,
                                      real_t *dy, real_t *dx, real_t *dgamma, real_t *dbeta) {
    (void)ctx;
    OPSI_TEAM(opsi_bn_relu_backward_keep(n * hw, c, x, y, gamma, save_mean, save_invstd, dy, dx,
                                         dgamma, dbeta));
}
#endif
