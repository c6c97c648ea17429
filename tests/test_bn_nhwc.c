/* test_bn_nhwc: the CUDA batch-norm arithmetic (shared/backend-cuda/bn_nhwc.h) run on the
 * CPU, against ops.h's batch norm, on every machine (no GPU needed).
 *
 * The kernels of cuda_bn.cu call bn_nhwc.h's functions per thread; this test calls
 * the same functions in the kernels' order (the per-lane sums of each (chunk, channel)
 * block, lanes added in order, then the chunks added lane by lane in the tile's last
 * block, then the element-wise pass), so the indexing, the chunking, the reduction
 * order and the formulas are all checked here; what only a GPU can check (the launch
 * configuration, the last-block handshake) is in test_ops_cuda's op cases.
 *
 * Checked: training forward (plain, ReLU, add+ReLU), inference, backward (plain and
 * ReLU-masked, and its keep form that leaves the masked dy in dy) against the CPU ops, on shapes that cross the channel tile, the chunk
 * clamp and odd row counts; the deferred conv bias (folded into the read, written
 * back into x); and the conv bias gradient (dsum) against the column sum of dx; and the cooperative one-kernel order
 * (bn_coop_item, bn_coop_elem0: grids of 1 block to more blocks than the work), every
 * partial, final and element done exactly once and every output bit for bit the
 * two-kernel order's.
 *
 * bf16 (--precision bf16): bf16.h's round-to-nearest-even conversion against an
 * independent reference (the nearer of the two neighbours, computed in double; ties,
 * overflow, denormals, infinities, NaN), and every case above again with bfloat16
 * activations: the reference is the CPU op on the very bf16 values the kernel reads
 * (x + bias rounded as the kernel writes it back), so the statistics and gradients
 * keep the fp32 tolerances and the bf16 outputs (y, dx) are within half a bf16 ulp
 * (relative 2^-8) of the fp32 result, plus the fp32 tolerance. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-cuda/bn_nhwc.h"
#include "backend-cpu/cpu_bf16.h"
#include "backend-cpu/ops_cpu.h"
#include "core/check.h"
#include "unit.h"
#include "unit_close.h"


static float *vec(size_t n, float lo, float hi) {
    float *v = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = urand(lo, hi);
    return v;
}

static float *copy_of(const float *v, size_t n) {
    float *c = xmalloc((n ? n : 1) * sizeof(float));
    memcpy(c, v, n * sizeof(float));
    return c;
}


/* ---- bfloat16: the activations as the kernels store them ---- */

/* 2^-8: half a bf16 ulp relative to the value (8 significant bits). */
#define BF16_RTOL (1.0 / 256.0)

static void round_all(float *v, size_t n, int bf16) {
    for (size_t i = 0; i < n; i++) v[i] = act_round(v[i], bf16);
}

/* A buffer of n activations with v's values: floats, or bf16 in the first half. */
static float *pack(const float *v, size_t n, int bf16) {
    float *p = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) act_store(p, (int64_t)i, v[i], bf16);
    return p;
}

static float *unpack(const float *p, size_t n, int bf16) {
    float *v = xmalloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = act_load(p, (int64_t)i, bf16);
    return v;
}

/* The bf16 nearest to the finite or infinite f, ties to even, by comparing the
 * distances to the two neighbours in double (exact for floats); a finite f past
 * the largest bf16 by half an ulp or more becomes infinity (IEEE: the neighbour
 * above the largest finite value counts as 2^128). */
static bf16_t bf16_reference(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    uint32_t lo = u & 0xffff0000u, hi = lo + 0x10000u;
    if ((u & 0xffffu) == 0) return (bf16_t)(lo >> 16);
    double a = fabs((double)f), dlo = fabs((double)bf16_to_float((bf16_t)(lo >> 16)));
    double dhi = (hi & 0x7f800000u) == 0x7f800000u ? ldexp(1.0, 128)
                                                   : fabs((double)bf16_to_float((bf16_t)(hi >> 16)));
    if (a - dlo < dhi - a) return (bf16_t)(lo >> 16);
    if (a - dlo > dhi - a) return (bf16_t)(hi >> 16);
    return (bf16_t)(((lo >> 16) & 1u) ? hi >> 16 : lo >> 16);
}

static int bf16_is_nan(bf16_t h) { return (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0; }

static int bf16_check_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    bf16_t got = bf16_from_float(f);
    if (isnan(f)) return bf16_is_nan(got) && (got & 0x8000u) == ((u >> 16) & 0x8000u);
    return got == bf16_reference(f);
}

/* The CPU bf16 table's batch packing (cpu_bf16_pack, backend-cpu/conv_dnnl.c): bf16.h's rounding bit for bit, on the values where
 * rounding goes wrong (ties both ways, carries into the exponent and to infinity,
 * denormals, NaNs, infinities) and on random bit patterns. */
static void test_bf16_packing(void) {
#ifdef CIFAR_DNNL
    if (cpu_bf16_why_not(-1)) { /* its AVX-512 code needs the CPU bf16 runs on */
        printf("test_bn_nhwc: NOT RUN: the bf16 batch packing: %s\n", cpu_bf16_why_not(-1));
        return;
    }
    enum { N = 4096 };
    static const uint32_t special[] = {0x00000000u, 0x80000000u, 0x3f808000u, 0x3f818000u, 0x3f80ffffu,
                                       0x7f7fffffu, 0xff7fffffu, 0x7f800000u, 0xff800000u, 0x7fc00001u,
                                       0x7f800001u, 0xffbfffffu, 0x00000001u, 0x00008000u, 0x00018000u,
                                       0x007fffffu, 0x3f7fffffu, 0x477fe000u, 0xbf808001u};
    float *src = xmalloc(N * sizeof(float));
    uint16_t *got = xmalloc(N * sizeof(uint16_t));
    uint64_t st = 0x9e3779b97f4a7c15ull;
    for (int i = 0; i < N; i++) {
        uint32_t u;
        if (i < (int)(sizeof special / sizeof special[0])) {
            u = special[i];
        } else {
            st ^= st << 13, st ^= st >> 7, st ^= st << 17;
            u = (uint32_t)(st >> 32);
        }
        memcpy(&src[i], &u, sizeof u);
    }
    cpu_dnnl_pack_bf16(N, src, got);
    int bad = 0;
    for (int i = 0; i < N; i++)
        if (got[i] != bf16_from_float(src[i])) {
            if (!bad) printf("bf16 packing: input %08x gave %04x, bf16.h %04x\n", bf16_f32_bits(src[i]), got[i],
                             bf16_from_float(src[i]));
            bad++;
        }
    EXPECT(bad == 0, "bf16 packing: %d of %d values differ from bf16.h's rounding", bad, N);
    free(src);
    free(got);
#endif
}

static void test_bf16_convert(void) {
    static const uint32_t special[] = {
        0x00000000u, 0x80000000u, 0x00000001u, 0x80000001u, 0x00008000u, 0x00018000u, /* denormals, */
        0x007fffffu, 0x807fffffu, 0x00800000u, 0x0000ffffu, 0x00007fffu,             /* ties */
        0x3f808000u, 0x3f818000u, 0x3f807fffu, 0x3f808001u, 0xbf808000u, 0xbf818000u, /* around 1 */
        0x7f7f0000u, 0x7f7f7fffu, 0x7f7f8000u, 0x7f7fffffu, 0xff7fffffu,             /* overflow */
        0x7f800000u, 0xff800000u, 0x7f800001u, 0xff800001u, 0x7fc00000u, 0x7fffffffu, /* Inf, NaN */
        0xffc00000u, 0x7f810000u};
    int ok = 1;
    uint64_t checked = 0;
    for (size_t i = 0; i < sizeof special / sizeof *special; i++, checked++) ok &= bf16_check_bits(special[i]);
    for (uint64_t u = 0; u <= 0xffffffffull; u += 4099, checked++) ok &= bf16_check_bits((uint32_t)u);
    for (uint32_t h = 0; h <= 0xffffu; h++, checked++) /* every bf16 survives the round trip */
        ok &= bf16_is_nan((bf16_t)h) ? bf16_is_nan(bf16_from_float(bf16_to_float((bf16_t)h)))
                                     : bf16_from_float(bf16_to_float((bf16_t)h)) == h;
    EXPECT(ok, "bf16 round-to-nearest-even conversion against the reference");
    printf("%s bf16 conversion against the reference (%llu values: ties, denormals, overflow, Inf, "
           "NaN, every bf16 round trip)\n", ok ? "ok  " : "FAIL", (unsigned long long)checked);
    /* the values the forward/backward cases rely on */
    ok = bf16_from_float(1.0f) == 0x3f80u && bf16_from_float(-2.0f) == 0xc000u &&
         bf16_to_float(0x3f80u) == 1.0f && bf16_from_float(3.4e38f) == 0x7f80u;
    EXPECT(ok, "bf16 known values");
    printf("%s bf16 known values\n", ok ? "ok  " : "FAIL");
}

/* ---- the kernels' reduction, thread by thread ---- */

typedef void (*LaneFn)(const void *a, int ch, int p, int lane, double *s);
typedef void (*FinalFn)(void *a, int ch, const double *t);

/* bn_tile_partial of cuda_bn.cu: block (tile, chunk p), lanes added in order into
 * partial[p][k][ch]; writes[p * c + ch] counts the writes of each partial. */
static void emulate_tile_partial(int K, int tile, int p, int c, const void *a, LaneFn lane_fn,
                                 double *partial, int *writes) {
    for (int ch = tile * BN_TILE; ch < c && ch < (tile + 1) * BN_TILE; ch++) {
        double sh[BN_LANES][BN_SUMS];
        for (int l = 0; l < BN_LANES; l++) lane_fn(a, ch, p, l, sh[l]);
        for (int k = 0; k < K; k++) {
            double t = 0.0;
            for (int l = 0; l < BN_LANES; l++) t += sh[l][k];
            partial[((size_t)p * K + k) * c + ch] = t;
        }
        writes[(size_t)p * c + ch]++;
    }
}

/* bn_tile_final of cuda_bn.cu: lane l adds chunks l, l + BN_LANES, ..., then the
 * lanes in order; finals[ch] counts the finalisations of each channel. */
static void emulate_tile_final(int K, int tile, int c, int chunks, const double *partial, void *a,
                               FinalFn fin, int *finals) {
    for (int ch = tile * BN_TILE; ch < c && ch < (tile + 1) * BN_TILE; ch++) {
        double sl[BN_LANES][BN_SUMS] = {{0}}, t[BN_SUMS];
        for (int l = 0; l < BN_LANES; l++)
            for (int q = l; q < chunks; q += BN_LANES)
                for (int k = 0; k < K; k++) sl[l][k] += partial[((size_t)q * K + k) * c + ch];
        for (int k = 0; k < K; k++) {
            t[k] = 0.0;
            for (int l = 0; l < BN_LANES; l++) t[k] += sl[l][k];
        }
        fin(a, ch, t);
        finals[ch]++;
    }
}

/* The reduction: the two-kernel order (blocks = 0: one block per (tile, chunk), the
 * tile's last block finalising) or the cooperative order of a grid of `blocks`
 * (bn_nhwc.h: items round robin by bn_coop_item, barrier, tiles round robin). Every
 * partial and every channel's final must be written exactly once. */
static void emulate_reduce_grid(int K, int64_t rows, int c, void *a, LaneFn lane_fn, FinalFn fin,
                                int blocks) {
    int chunks = bn_chunks(rows, c), tiles = bn_tiles(c);
    double *partial = xcalloc((size_t)chunks * K * c, sizeof(double));
    int *writes = xcalloc((size_t)chunks * c, sizeof(int)), *finals = xcalloc((size_t)c, sizeof(int));
    if (!blocks) {
        for (int t = 0; t < tiles; t++)
            for (int p = 0; p < chunks; p++) emulate_tile_partial(K, t, p, c, a, lane_fn, partial, writes);
        for (int t = 0; t < tiles; t++) emulate_tile_final(K, t, c, chunks, partial, a, fin, finals);
    } else {
        for (int b = 0; b < blocks; b++)
            for (int64_t w = b; w < (int64_t)tiles * chunks; w += blocks) {
                int tile, p;
                bn_coop_item(w, tiles, &tile, &p);
                emulate_tile_partial(K, tile, p, c, a, lane_fn, partial, writes);
            }
        for (int b = 0; b < blocks; b++) /* after the grid barrier */
            for (int t = b; t < tiles; t += blocks) emulate_tile_final(K, t, c, chunks, partial, a, fin, finals);
    }
    int once = 1;
    for (size_t i = 0; i < (size_t)chunks * c; i++) once &= writes[i] == 1;
    for (int ch = 0; ch < c; ch++) once &= finals[ch] == 1;
    EXPECT(once, "reduction of %lld x %d over %d blocks: a partial or a final not written exactly once",
           (long long)rows, c, blocks);
    free(partial);
    free(writes);
    free(finals);
}

static void emulate_reduce(int K, int64_t rows, int c, void *a, LaneFn lane_fn, FinalFn fin) {
    emulate_reduce_grid(K, rows, c, a, lane_fn, fin, 0);
}

typedef struct {
    int64_t rows;
    int c;
    const float *x, *bias, *gamma, *beta, *y, *dy;
    float *save_mean, *save_invstd, *running_mean, *running_var, *aff, *dgamma, *dbeta, *dsum;
    float momentum, eps;
    int bf16; /* activations stored as bfloat16 */
} BnCase;

static void fwd_lane(const void *p, int ch, int chunk, int lane, double *s) {
    const BnCase *a = p;
    bn_fwd_lane(a->x, a->bias, a->rows, a->c, bn_chunks(a->rows, a->c), ch, chunk, lane, s, a->bf16);
}

static void fwd_final(void *p, int ch, const double *t) {
    BnCase *a = p;
    bn_fwd_final(a->rows, a->c, ch, a->x, a->bias, t, a->gamma, a->beta, a->momentum, a->eps,
                 a->save_mean, a->save_invstd, a->running_mean, a->running_var, a->aff, a->bf16);
}

static void bwd_lane(const void *p, int ch, int chunk, int lane, double *s) {
    const BnCase *a = p;
    bn_bwd_lane(a->x, a->y, a->dy, a->save_mean, a->rows, a->c, bn_chunks(a->rows, a->c), ch, chunk, lane, s, a->bf16);
}

static void bwd_final(void *p, int ch, const double *t) {
    BnCase *a = p;
    bn_bwd_final(a->rows, a->c, ch, t, a->gamma, a->save_mean, a->save_invstd, a->dgamma, a->dbeta,
                 a->aff, a->dsum);
}

/* ---- training forward, with and without a deferred bias ---- */

static void test_forward(int64_t rows, int c, int mode, int with_bias, int bf16) {
    size_t nx = (size_t)rows * c;
    char what[160];
    float *x0 = vec(nx, -2, 3), *z = vec(nx, -1, 1), *bias = vec((size_t)c, -0.5f, 0.5f);
    round_all(x0, nx, bf16); /* the values the activation type holds */
    round_all(z, nx, bf16);
    float *gamma = vec((size_t)c, 0.5f, 1.5f), *beta = vec((size_t)c, -0.5f, 0.5f);
    float *rm = vec((size_t)c, -0.2f, 0.2f), *rv = vec((size_t)c, 0.5f, 1.5f);
    /* the CPU: the conv output with its bias already added, then the ops */
    float *xb = copy_of(x0, nx);
    if (with_bias)
        for (size_t i = 0; i < nx; i++) xb[i] = act_round(x0[i] + bias[i % (size_t)c], bf16);
    float *want = xmalloc(nx * sizeof(float)), *wm = xmalloc(c * sizeof(float));
    float *wi = xmalloc(c * sizeof(float)), *wrm = copy_of(rm, c), *wrv = copy_of(rv, c);
    if (mode == BN_RELU) {
        net_cpu_ops()->bn_relu_train(NULL, (int)rows, 1, c, xb, gamma, beta, want, wm, wi, wrm, wrv, 0.1f, 1e-5f);
    } else {
        net_cpu_ops()->bn_train(NULL, (int)rows, 1, c, xb, gamma, beta, want, wm, wi, wrm, wrv, 0.1f, 1e-5f);
        if (mode == BN_ADD_RELU) net_cpu_ops()->add_relu(NULL, nx, want, z, want);
    }
    /* the kernels' functions */
    float *x = pack(with_bias ? x0 : xb, nx, bf16), *y = xmalloc(nx * sizeof(float));
    float *zp = pack(z, nx, bf16);
    float *gm = xmalloc(c * sizeof(float)), *gi = xmalloc(c * sizeof(float));
    float *grm = copy_of(rm, c), *grv = copy_of(rv, c), *aff = xmalloc(2 * c * sizeof(float));
    BnCase a = {rows, c, x, with_bias ? bias : NULL, gamma, beta, NULL, NULL,
                gm, gi, grm, grv, aff, NULL, NULL, NULL, 0.1f, 1e-5f, bf16};
    emulate_reduce(2, rows, c, &a, fwd_lane, fwd_final);
    for (size_t i = 0; i < nx; i++)
        bn_fwd_apply((int64_t)i, c, x, a.bias, aff, zp, mode, y, bf16);
    static const char *modes[] = {"bn", "bn+relu", "bn+add+relu"};
    const char *bt = with_bias ? ", deferred bias" : "";
#define WHAT(s) (snprintf(what, sizeof what, "%s train %lld x %d%s%s: %s", modes[mode], (long long)rows, \
                          c, bt, bf16 ? ", bf16" : "", s), what)
    float *yv = unpack(y, nx, bf16), *xv = unpack(x, nx, bf16);
    expect_close(WHAT("y"), yv, want, nx, 2e-5, 2e-5 + (bf16 ? BF16_RTOL : 0.0));
    expect_close(WHAT("save_mean"), gm, wm, c, 1e-6, 1e-5);
    expect_close(WHAT("save_invstd"), gi, wi, c, 1e-6, 1e-5);
    expect_close(WHAT("running_mean"), grm, wrm, c, 1e-6, 1e-5);
    expect_close(WHAT("running_var"), grv, wrv, c, 1e-6, 1e-5);
    if (with_bias) {
        int same = memcmp(xv, xb, nx * sizeof(float)) == 0;
        WHAT("x + bias written back");
        EXPECT(same, "%s", what);
        printf("%s %s\n", same ? "ok  " : "FAIL", what);
    }
#undef WHAT
    free(x0); free(z); free(bias); free(gamma); free(beta); free(rm); free(rv); free(xb);
    free(want); free(wm); free(wi); free(wrm); free(wrv); free(x); free(y); free(gm); free(gi);
    free(grm); free(grv); free(aff); free(zp); free(yv); free(xv);
}

/* ---- inference ---- */

static void test_eval(int64_t rows, int c, int with_bias, int bf16) {
    size_t nx = (size_t)rows * c;
    char what[128];
    float *x0 = vec(nx, -2, 3), *bias = vec((size_t)c, -0.5f, 0.5f);
    round_all(x0, nx, bf16);
    float *gamma = vec((size_t)c, 0.5f, 1.5f), *beta = vec((size_t)c, -0.5f, 0.5f);
    float *rm = vec((size_t)c, -0.2f, 0.2f), *rv = vec((size_t)c, 0.5f, 1.5f);
    float *xb = copy_of(x0, nx), *want = xmalloc(nx * sizeof(float)), *y = xmalloc(nx * sizeof(float));
    if (with_bias)
        for (size_t i = 0; i < nx; i++) xb[i] = act_round(x0[i] + bias[i % (size_t)c], bf16);
    net_cpu_ops()->bn_eval(NULL, (int)rows, 1, c, xb, gamma, beta, rm, rv, 1e-5f, want);
    float *x = pack(with_bias ? x0 : xb, nx, bf16), *aff = xmalloc(2 * c * sizeof(float));
    for (int ch = 0; ch < c; ch++) bn_eval_final(c, ch, gamma, beta, rm, rv, 1e-5f, aff);
    for (size_t i = 0; i < nx; i++)
        bn_fwd_apply((int64_t)i, c, x, with_bias ? bias : NULL, aff, NULL, BN_PLAIN, y, bf16);
    snprintf(what, sizeof what, "bn eval %lld x %d%s%s: y", (long long)rows, c,
             with_bias ? ", deferred bias" : "", bf16 ? ", bf16" : "");
    float *yv = unpack(y, nx, bf16);
    expect_close(what, yv, want, nx, 2e-5, 2e-5 + (bf16 ? BF16_RTOL : 0.0));
    free(yv);
    free(x0); free(bias); free(gamma); free(beta); free(rm); free(rv); free(xb); free(want); free(y);
    free(x); free(aff);
}

/* ---- backward, and the conv bias gradient ---- */

static void test_backward(int64_t rows, int c, int relu, int bf16) {
    size_t nx = (size_t)rows * c;
    char what[160];
    float *x = vec(nx, -2, 3), *y = vec(nx, -1, 1), *dy = vec(nx, -1, 1);
    round_all(x, nx, bf16);
    round_all(y, nx, bf16);
    round_all(dy, nx, bf16);
    float *gamma = vec((size_t)c, 0.5f, 1.5f), *mean = xmalloc(c * sizeof(float));
    float *inv = xmalloc(c * sizeof(float));
    for (size_t i = 0; i < nx; i++) y[i] = y[i] < 0 ? 0 : y[i];
    /* statistics consistent with x (as a training forward leaves them) */
    for (int ch = 0; ch < c; ch++) {
        double s = 0, s2 = 0;
        for (int64_t r = 0; r < rows; r++) s += x[r * c + ch];
        double m = s / rows;
        for (int64_t r = 0; r < rows; r++) s2 += (x[r * c + ch] - m) * (x[r * c + ch] - m);
        mean[ch] = (float)m;
        inv[ch] = (float)(1.0 / sqrt(s2 / rows + 1e-5));
    }
    float *want = xmalloc(nx * sizeof(float)), *wg = xmalloc(c * sizeof(float)), *wb = xmalloc(c * sizeof(float));
    if (relu)
        net_cpu_ops()->bn_relu_backward(NULL, (int)rows, 1, c, x, y, gamma, mean, inv, dy, want, wg, wb);
    else
        net_cpu_ops()->bn_backward(NULL, (int)rows, 1, c, x, gamma, mean, inv, dy, want, wg, wb);
    float *dx = xmalloc(nx * sizeof(float)), *dg = xmalloc(c * sizeof(float)), *db = xmalloc(c * sizeof(float));
    float *k = xmalloc(3 * c * sizeof(float)), *dsum = xmalloc(c * sizeof(float));
    float *xp = pack(x, nx, bf16), *yp = pack(y, nx, bf16), *dyp = pack(dy, nx, bf16);
    BnCase a = {rows, c, xp, NULL, gamma, NULL, relu ? yp : NULL, dyp,
                mean, inv, NULL, NULL, k, dg, db, dsum, 0.0f, 0.0f, bf16};
    emulate_reduce(3, rows, c, &a, bwd_lane, bwd_final);
    for (size_t i = 0; i < nx; i++) bn_bwd_apply((int64_t)i, c, xp, a.y, dyp, k, dx, bf16);
#define WHAT(s) (snprintf(what, sizeof what, "bn%s backward %lld x %d%s: %s", relu ? "+relu" : "", \
                          (long long)rows, c, bf16 ? ", bf16" : "", s), what)
    float *dxv = unpack(dx, nx, bf16);
    expect_close(WHAT("dx"), dxv, want, nx, 2e-5, 1e-4 + (bf16 ? BF16_RTOL : 0.0));
    expect_close(WHAT("dgamma"), dg, wg, c, 1e-4, 1e-5);
    expect_close(WHAT("dbeta"), db, wb, c, 1e-4, 1e-5);
    /* dsum: the column sum of dx (the conv bias gradient), against the CPU conv's
     * bias gradient of that dx (conv2d_backward's dbias is its column sum): both are
     * rounding noise around 0, within float rounding of the |dx| summed. */
    float *colsum = xcalloc(c, sizeof(float)), *lim = xcalloc(c, sizeof(float));
    for (int ch = 0; ch < c; ch++) {
        double s = 0, m = 0;
        for (int64_t r = 0; r < rows; r++) {
            s += want[r * c + ch];
            m += fabs(want[r * c + ch]);
        }
        colsum[ch] = (float)s;
        lim[ch] = (float)(m * 1e-5 + 1e-6);
    }
    int ok = 1;
    for (int ch = 0; ch < c; ch++) ok &= fabsf(dsum[ch] - colsum[ch]) <= lim[ch];
    WHAT("dsum = column sum of dx");
    EXPECT(ok, "%s", what);
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
    if (relu) { /* the keep form: the same dx, and the masked dy left in dy */
        float *dyk = copy_of(dyp, nx), *dxk = xmalloc(nx * sizeof(float));
        for (size_t i = 0; i < nx; i++) bn_bwd_apply_keep((int64_t)i, c, xp, yp, dyk, k, dxk, bf16);
        ok = 1;
        for (size_t i = 0; i < nx; i++) {
            ok &= act_load(dxk, (int64_t)i, bf16) == act_load(dx, (int64_t)i, bf16);
            float g = act_load(yp, (int64_t)i, bf16) > 0.0f ? act_load(dyp, (int64_t)i, bf16) : 0.0f;
            ok &= act_load(dyk, (int64_t)i, bf16) == g;
        }
        WHAT("keep: dx bit for bit, masked dy written back");
        EXPECT(ok, "%s", what);
        printf("%s %s\n", ok ? "ok  " : "FAIL", what);
        free(dyk);
        free(dxk);
    }
#undef WHAT
    free(x); free(y); free(dy); free(gamma); free(mean); free(inv); free(want); free(wg); free(wb);
    free(dx); free(dg); free(db); free(k); free(dsum); free(colsum); free(lim);
    free(xp); free(yp); free(dyp); free(dxv);
}

/* ---- the cooperative (one-kernel) order against the two-kernel order ---- */

/* The element-wise pass of bn_coop_run (bn_coop_elem0, bn_coop_elem_step): seen[i]
 * counts the visits of element i. */
static void emulate_coop_elems(size_t total, int blocks, int *seen) {
    for (int b = 0; b < blocks; b++)
        for (int ty = 0; ty < BN_LANES; ty++)
            for (int tx = 0; tx < BN_TILE; tx++)
                for (int64_t i = bn_coop_elem0(b, ty, tx); i < (int64_t)total; i += bn_coop_elem_step(blocks))
                    seen[i]++;
}

/* Forward (add+ReLU, deferred bias) and keep-backward, both orders: every output bit
 * for bit equal, every element visited once, for grids smaller and larger than the
 * work. */
static void test_coop_order(int64_t rows, int c, int blocks) {
    size_t nx = (size_t)rows * c;
    float *x0 = vec(nx, -2, 3), *z = vec(nx, -1, 1), *bias = vec((size_t)c, -0.5f, 0.5f);
    float *gamma = vec((size_t)c, 0.5f, 1.5f), *beta = vec((size_t)c, -0.5f, 0.5f);
    float *dy0 = vec(nx, -1, 1), *rm0 = vec((size_t)c, -0.2f, 0.2f), *rv0 = vec((size_t)c, 0.5f, 1.5f);
    float *out[2][8];
    for (int o = 0; o < 2; o++) { /* o = 0: two kernels; 1: cooperative */
        float *x = copy_of(x0, nx), *y = xmalloc(nx * sizeof(float)), *m = xmalloc(c * sizeof(float));
        float *inv = xmalloc(c * sizeof(float)), *rm = copy_of(rm0, c), *rv = copy_of(rv0, c);
        float *aff = xmalloc(3 * c * sizeof(float)), *dy = copy_of(dy0, nx), *dx = xmalloc(nx * sizeof(float));
        float *dg = xmalloc(c * sizeof(float)), *db = xmalloc(c * sizeof(float)), *ds = xmalloc(c * sizeof(float));
        BnCase f = {rows, c, x, bias, gamma, beta, NULL, NULL, m, inv, rm, rv, aff, NULL, NULL, NULL, 0.1f, 1e-5f, 0};
        emulate_reduce_grid(2, rows, c, &f, fwd_lane, fwd_final, o ? blocks : 0);
        int *seen = xcalloc(nx ? nx : 1, sizeof(int));
        if (o) emulate_coop_elems(nx, blocks, seen);
        for (size_t i = 0; i < nx; i++) bn_fwd_apply((int64_t)i, c, x, bias, aff, z, BN_ADD_RELU, y, 0);
        BnCase b = {rows, c, x, NULL, gamma, NULL, y, dy, m, inv, NULL, NULL, aff, dg, db, ds, 0.0f, 0.0f, 0};
        emulate_reduce_grid(3, rows, c, &b, bwd_lane, bwd_final, o ? blocks : 0);
        for (size_t i = 0; i < nx; i++) bn_bwd_apply_keep((int64_t)i, c, x, y, dy, aff, dx, 0);
        int once = 1;
        for (size_t i = 0; o && i < nx; i++) once &= seen[i] == 1;
        EXPECT(once, "cooperative element pass of %zu over %d blocks: an element not visited once", nx, blocks);
        free(seen);
        float *keep[8] = {y, m, inv, rm, rv, dx, dy, dg};
        memcpy(out[o], keep, sizeof keep);
        free(x); free(aff); free(db); free(ds);
    }
    static const char *names[8] = {"y", "save_mean", "save_invstd", "running_mean", "running_var",
                                   "dx", "dy kept", "dgamma"};
    int same = 1;
    for (int j = 0; j < 8; j++) {
        size_t n = j == 0 || j >= 5 ? nx : (size_t)c;
        if (j == 7) n = (size_t)c;
        int eq = memcmp(out[0][j], out[1][j], n * sizeof(float)) == 0;
        EXPECT(eq, "cooperative order %lld x %d, %d blocks: %s differs from the two-kernel order",
               (long long)rows, c, blocks, names[j]);
        same &= eq;
    }
    printf("%s cooperative order %lld x %d over %d blocks = two-kernel order, bit for bit\n",
           same ? "ok  " : "FAIL", (long long)rows, c, blocks);
    for (int o = 0; o < 2; o++)
        for (int j = 0; j < 8; j++) free(out[o][j]);
    free(x0); free(z); free(bias); free(gamma); free(beta); free(dy0); free(rm0); free(rv0);
}

/* The chunking covers every row once, whatever the row count. */
static void test_chunks(void) {
    static const int64_t counts[] = {1, 7, 2047, 2048, 2049, 100000, 262144, 262145, 1048576, 5000001};
    static const int chans[] = {1, 64, 513, BN_MAX_C};
    int ok = 1;
    for (size_t t = 0; t < sizeof counts / sizeof *counts * 4; t++) {
        int64_t rows = counts[t / 4], covered = 0, prev = 0;
        int c = chans[t % 4], chunks = bn_chunks(rows, c);
        ok &= chunks >= 1 && chunks <= BN_MAX_CHUNKS && (int64_t)chunks * c <= BN_PARTIALS;
        for (int p = 0; p < chunks; p++) {
            int64_t r0, r1;
            bn_chunk_rows(rows, chunks, p, &r0, &r1);
            ok &= r0 == prev && r1 >= r0;
            covered += r1 - r0;
            prev = r1;
        }
        ok &= covered == rows;
    }
    EXPECT(ok, "bn_chunk_rows covers every row exactly once, within the scratch");
    printf("%s bn chunks cover every row exactly once, within the scratch\n", ok ? "ok  " : "FAIL");
    ok = 1; /* the channel of element i, 32-bit path and 64-bit path */
    for (int64_t i = 0xfffffff0LL; i < 0x100000010LL; i++) ok &= bn_channel(i, 70) == (int)(i % 70);
    EXPECT(ok, "bn_channel on both sides of 2^32");
    printf("%s bn_channel on both sides of 2^32\n", ok ? "ok  " : "FAIL");
}

int main(void) {
    log_set_program("test_bn_nhwc");
    ops_set_threads(1);
    test_chunks();
    test_bf16_convert();
    test_bf16_packing();
    /* channel counts across the 32-channel tile; rows: tiny, odd, past the chunk clamp */
    static const struct { int64_t rows; int c; } shapes[] = {{1, 3}, {7, 8}, {147, 33}, {3000, 16},
                                                            {300001, 4}, {4100, 70}};
    for (int bf16 = 0; bf16 <= 1; bf16++) /* fp32 activations, then bfloat16 */
        for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
            int64_t rows = shapes[s].rows;
            int c = shapes[s].c;
            for (int mode = BN_PLAIN; mode <= BN_ADD_RELU; mode++) test_forward(rows, c, mode, 0, bf16);
            test_forward(rows, c, BN_RELU, 1, bf16);
            test_eval(rows, c, 0, bf16);
            test_eval(rows, c, 1, bf16);
            if (rows > 1) {
                test_backward(rows, c, 0, bf16);
                test_backward(rows, c, 1, bf16);
            }
        }
    /* grids of 1 block, fewer blocks than items, and more than the work */
    /* (after the cases above: they keep their random data) */
    static const struct { int64_t rows; int c; } coop[] = {{7, 8}, {3000, 70}, {300001, 4}, {2049, 33}};
    static const int grids[] = {1, 5, 132, 4096};
    for (size_t s = 0; s < sizeof coop / sizeof *coop; s++)
        for (size_t g = 0; g < sizeof grids / sizeof *grids; g++) test_coop_order(coop[s].rows, coop[s].c, grids[g]);
    /* NaN passes through the fused ReLU (the trainer's NaN stop relies on it) */
    float x[2] = {NAN, -1.0f}, aff[2] = {1.0f, 0.0f}, y[2];
    for (int i = 0; i < 2; i++) bn_fwd_apply(i, 1, x, NULL, aff, NULL, BN_RELU, y, 0);
    EXPECT(isnan(y[0]) && y[1] == 0.0f, "bn+relu passes NaN");
    printf("%s bn+relu passes NaN\n", isnan(y[0]) && y[1] == 0.0f ? "ok  " : "FAIL");
    float xb[2], yb[2];
    for (int i = 0; i < 2; i++) act_store(xb, i, x[i], 1);
    for (int i = 0; i < 2; i++) bn_fwd_apply(i, 1, xb, NULL, aff, NULL, BN_RELU, yb, 1);
    int nan_ok = isnan(act_load(yb, 0, 1)) && act_load(yb, 1, 1) == 0.0f;
    EXPECT(nan_ok, "bn+relu passes NaN (bf16)");
    printf("%s bn+relu passes NaN (bf16)\n", nan_ok ? "ok  " : "FAIL");
    return unit_report("test_bn_nhwc");
}
