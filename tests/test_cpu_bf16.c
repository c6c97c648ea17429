/* test_cpu_bf16: the CPU's bf16 table (--precision bf16 on the CPU: every activation in
 * bf16, the first half of its fp32-sized buffer; convolutions through oneDNN with fp32
 * accumulation; parameters, statistics and the head fp32) against the AVX-512 fp32
 * table on the very bf16 values it reads, op by op, and its determinism.
 *
 * Per-op tolerances (the reference is the fp32 op on the same bf16 inputs, so what
 * differs is the bf16 rounding of the outputs and, in the convs, the fp32 accumulation
 * order):
 *   - element-wise (ReLU forward and backward, add, add + ReLU): the rounded fp32
 *     result, bit for bit (one rounding of the same fp32 value);
 *   - batch norm (train: plain, ReLU, add + ReLU; eval; backward plain and ReLU): the
 *     statistics, the running statistics, dgamma and dbeta within 1e-5 relative plus
 *     1e-6 (the same sums of the same values), dgamma and dbeta also plus 1e-7 of the
 *     sum of their terms' magnitudes (the bf16 table sums those in fp32 within chunks
 *     of 32 to 64 rows: about 1e-8 of it measured, on 48 channels); y and dx within
 *     half a bf16 step (2^-8 relative) plus 1e-6; the bf16 table's batch norm bit for
 *     bit with 1, 2 and 3 threads;
 *   - mean pool: forward (bf16 in, fp32 out) within 1e-6 relative, backward (fp32 in,
 *     bf16 out) the rounded fp32 result within half a bf16 step;
 *   - convolutions (the shapes of op_cases.h's conv cases: the stem 3x3/2 from 3
 *     channels, 1x1, 3x3, 3x3/2, the 1x1/2 projection): y and dx within 2^-8 relative
 *     plus 1e-3 of the output's scale (the largest |value|: fp32 sums of up to 144 bf16
 *     products in another order), dW within 1e-3 of its scale, db (double sums of the
 *     same bf16 dy) within 1e-5 relative.
 * A wrong layout, type or index gives errors of the order of the values themselves.
 * NOT RUN where the CPU or the build cannot run the bf16 table (the line says why). */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-cpu/cpu_bf16.h"
#include "backend-cpu/ops_cpu.h"
#include "backend-cuda/bf16.h"
#include "core/check.h"
#include "unit.h"
#include "unit_close.h"


static float round_bf16(float v) { return bf16_to_float(bf16_from_float(v)); }

/* n values in [lo, hi), each already a bf16 value (the inputs both tables read alike). */
static float *bf16_values(size_t n, float lo, float hi) {
    float *v = xmalloc_aligned((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) v[i] = round_bf16(urand(lo, hi));
    return v;
}

static float *zeros(size_t n) {
    float *v = xmalloc_aligned((n ? n : 1) * sizeof(float));
    memset(v, 0, (n ? n : 1) * sizeof(float));
    return v;
}

/* An output buffer of the bf16 table for n activations: the first half zero, the
 * second half a canary (NaN bits) that no op may touch (expect_canary). */
#define CANARY 0x7fc1u
static float *out16(size_t n) {
    float *p = zeros(n);
    uint16_t *h = (uint16_t *)p;
    for (size_t i = n; i < 2 * n; i++) h[i] = CANARY;
    return p;
}

static void expect_canary(const char *what, const float *p, size_t n) {
    const uint16_t *h = (const uint16_t *)p;
    size_t bad = 0;
    for (size_t i = n; i < 2 * n; i++) bad += h[i] != CANARY;
    EXPECT(bad == 0, "%s: %zu values written past the %zu bf16 activations", what, bad, n);
}

/* The bf16 table's buffer of activations v (bf16 in the first half). */
static float *packed(const float *v, size_t n) {
    float *p = zeros(n);
    cpu_bf16_pack(n, v, p);
    return p;
}

/* The floats a bf16 buffer holds. */
static float *unpacked(const float *p, size_t n) {
    float *v = zeros(n);
    const uint16_t *h = (const uint16_t *)p;
    for (size_t i = 0; i < n; i++) v[i] = bf16_to_float(h[i]);
    return v;
}


/* The bf16 buffer got holds exactly the bf16 rounding of every want. */
static void expect_rounded(const char *what, const float *got16, const float *want, size_t n) {
    const uint16_t *h = (const uint16_t *)got16;
    size_t bad = 0, at = 0;
    for (size_t i = 0; i < n; i++)
        if (h[i] != bf16_from_float(want[i])) {
            if (!bad) at = i;
            bad++;
        }
    EXPECT(bad == 0, "%s: %zu of %zu not the rounded fp32 result, first [%zu] got %.8g want %.8g",
           what, bad, n, at, n ? bf16_to_float(h[at]) : 0.0f, n ? want[at] : 0.0f);
    if (!bad) printf("ok   %s (bit for bit, %zu values)\n", what, n);
}

/* A bf16 buffer against fp32 results: within half a bf16 step plus atol. */
static void expect_act(const char *what, const float *got16, const float *want, size_t n, double atol) {
    float *got = unpacked(got16, n);
    expect_close(what, got, want, n, atol, 1.0 / 256.0);
    free(got);
}

static double max_abs(const float *v, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs((double)v[i]));
    return m;
}

static const NetOps *F, *B; /* the fp32 reference and the bf16 table */

/* ------------------------------------------------------------ element-wise */

static void test_elementwise(void) {
    const size_t n = 4099; /* not a multiple of any vector width */
    float *a = bf16_values(n, -2, 2), *b = bf16_values(n, -2, 2), *want = zeros(n);
    float *a16 = packed(a, n), *b16 = packed(b, n), *got = out16(n);
    F->relu_forward(NULL, n, a, want);
    B->relu_forward(NULL, n, a16, got);
    expect_rounded("relu_forward", got, want, n);
    F->relu_backward(NULL, n, a, b, want);
    B->relu_backward(NULL, n, a16, b16, got);
    expect_rounded("relu_backward", got, want, n);
    F->add(NULL, n, a, b, want);
    B->add(NULL, n, a16, b16, got);
    expect_rounded("add", got, want, n);
    F->add_relu(NULL, n, a, b, want);
    B->add_relu(NULL, n, a16, b16, got);
    expect_rounded("add_relu", got, want, n);
    expect_canary("element-wise ops", got, n);
    memcpy(got, a16, n * sizeof(float)); /* in place */
    B->relu_forward(NULL, n, got, got);
    F->relu_forward(NULL, n, a, want);
    expect_rounded("relu_forward in place", got, want, n);
    free(a); free(b); free(want); free(a16); free(b16); free(got);
}

/* ---------------------------------------------------------------- pooling */

static void test_meanpool(void) {
    const int n = 5, hw = 64, c = 16;
    const size_t nx = (size_t)n * hw * c, ny = (size_t)n * c;
    float *x = bf16_values(nx, -2, 2), *x16 = packed(x, nx), *want = zeros(ny), *got = zeros(ny);
    F->meanpool_forward(NULL, n, hw, c, x, want);
    B->meanpool_forward(NULL, n, hw, c, x16, got);
    expect_close("meanpool_forward (bf16 in, fp32 out)", got, want, ny, 1e-6, 1e-6);
    float *dy = bf16_values(ny, -1, 1), *dxw = zeros(nx), *dx16 = out16(nx);
    F->meanpool_backward(NULL, n, hw, c, dy, dxw);
    B->meanpool_backward(NULL, n, hw, c, dy, dx16);
    expect_rounded("meanpool_backward (fp32 in, bf16 out)", dx16, dxw, nx);
    expect_canary("meanpool_backward", dx16, nx);
    free(x); free(x16); free(want); free(got); free(dy); free(dxw); free(dx16);
}

/* ------------------------------------------------------------- batch norm */

typedef struct {
    float *y, *mean, *invstd, *rmean, *rvar, *dx, *dgamma, *dbeta;
} BnOut;

static BnOut bn_out(size_t n, int c, int bf16) {
    BnOut o = {bf16 ? out16(n) : zeros(n), zeros(c), zeros(c), zeros(c), zeros(c),
               bf16 ? out16(n) : zeros(n), zeros(c), zeros(c)};
    for (int ch = 0; ch < c; ch++) o.rmean[ch] = 0.25f, o.rvar[ch] = 1.5f;
    return o;
}

static void bn_free(BnOut *o) {
    free(o->y); free(o->mean); free(o->invstd); free(o->rmean); free(o->rvar);
    free(o->dx); free(o->dgamma); free(o->dbeta);
}

/* kind 0 plain, 1 ReLU, 2 add + ReLU: the training forward, then its backward. */
static void bn_run(const NetOps *t, int kind, int rows, int c, const float *x, const float *z,
                   const float *gamma, const float *beta, const float *dy, BnOut *o) {
    if (kind == 0) t->bn_train(NULL, rows, 1, c, x, gamma, beta, o->y, o->mean, o->invstd, o->rmean, o->rvar, 0.1f, 1e-5f);
    if (kind == 1) t->bn_relu_train(NULL, rows, 1, c, x, gamma, beta, o->y, o->mean, o->invstd, o->rmean, o->rvar, 0.1f, 1e-5f);
    if (kind == 2)
        t->bn_add_relu_train(NULL, rows, 1, c, x, gamma, beta, z, o->dx, o->y, o->mean, o->invstd, o->rmean,
                             o->rvar, 0.1f, 1e-5f);
    float *g = zeros((size_t)rows * c);
    memcpy(g, dy, (size_t)rows * c * sizeof(float)); /* bn_relu_backward may overwrite dy */
    if (kind == 0)
        t->bn_backward(NULL, rows, 1, c, x, gamma, o->mean, o->invstd, g, o->dx, o->dgamma, o->dbeta);
    else
        t->bn_relu_backward(NULL, rows, 1, c, x, o->y, gamma, o->mean, o->invstd, g, o->dx, o->dgamma, o->dbeta);
    free(g);
}

/* outlier: the first row 100 (the others in [-1, 3)), 85 standard deviations from the
 * mean: a shift of the one-pass variance by that row alone would amplify the fp32
 * sums' rounding about 7,000 times (cpu_bn.h's opsi_bn_shift). */
static void test_bn(int rows, int c, int outlier) {
    static const char *kinds[] = {"bn_train + bn_backward", "bn_relu_train + bn_relu_backward",
                                  "bn_add_relu_train + bn_relu_backward"};
    const size_t n = (size_t)rows * c;
    float *x = bf16_values(n, -1, 3), *z = bf16_values(n, -1, 1), *dy = bf16_values(n, -1, 1);
    const char *tag = outlier ? ", first row 100" : "";
    if (outlier)
        for (int ch = 0; ch < c; ch++) x[ch] = 100.0f;
    float *gamma = bf16_values(c, 0.5f, 1.5f), *beta = bf16_values(c, -0.5f, 0.5f);
    float *x16 = packed(x, n), *z16 = packed(z, n), *dy16 = packed(dy, n);
    for (int kind = 0; kind < 3; kind++) {
        BnOut want = bn_out(n, c, 0), got = bn_out(n, c, 1);
        bn_run(F, kind, rows, c, x, z, gamma, beta, dy, &want);
        bn_run(B, kind, rows, c, x16, z16, gamma, beta, dy16, &got);
        char what[160];
        snprintf(what, sizeof what, "%s rows %d c %d%s: y", kinds[kind], rows, c, tag);
        expect_act(what, got.y, want.y, n, 1e-6);
        const float *pairs[][2] = {{got.mean, want.mean}, {got.invstd, want.invstd}, {got.rmean, want.rmean},
                                   {got.rvar, want.rvar}, {got.dgamma, want.dgamma}, {got.dbeta, want.dbeta}};
        static const char *names[] = {"save_mean", "save_invstd", "running_mean", "running_var", "dgamma", "dbeta"};
        /* dgamma, dbeta: the bf16 table sums their terms in fp32 within chunks of 32 to
         * 64 rows (cpu_bn.h), so also 1e-7 of the largest sum of |terms| (|dy| bounds |g|) */
        double s_gamma = 0, s_beta = 0;
        for (int ch = 0; ch < c; ch++) {
            double sg = 0, sb = 0;
            for (int r = 0; r < rows; r++) {
                sb += fabs(dy[(size_t)r * c + ch]);
                sg += fabs(dy[(size_t)r * c + ch]) * fabs(x[(size_t)r * c + ch] - want.mean[ch]) * want.invstd[ch];
            }
            s_gamma = fmax(s_gamma, sg), s_beta = fmax(s_beta, sb);
        }
        const double atol[] = {1e-6, 1e-6, 1e-6, 1e-6, 1e-6 + 1e-7 * s_gamma, 1e-6 + 1e-7 * s_beta};
        for (int k = 0; k < 6; k++) {
            snprintf(what, sizeof what, "%s rows %d c %d%s: %s", kinds[kind], rows, c, tag, names[k]);
            expect_close(what, pairs[k][0], pairs[k][1], c, atol[k], 1e-5);
        }
        snprintf(what, sizeof what, "%s rows %d c %d%s: dx", kinds[kind], rows, c, tag);
        expect_act(what, got.dx, want.dx, n, 1e-3 * max_abs(want.dx, n));
        snprintf(what, sizeof what, "%s rows %d c %d%s", kinds[kind], rows, c, tag);
        expect_canary(what, got.y, n);
        expect_canary(what, got.dx, n);
        bn_free(&want);
        bn_free(&got);
    }
    /* eval: the running statistics */
    float *rm = bf16_values(c, -0.5f, 0.5f), *rv = bf16_values(c, 0.5f, 2.0f), *ye = zeros(n), *ye16 = out16(n);
    F->bn_eval(NULL, rows, 1, c, x, gamma, beta, rm, rv, 1e-5f, ye);
    B->bn_eval(NULL, rows, 1, c, x16, gamma, beta, rm, rv, 1e-5f, ye16);
    char what[96];
    snprintf(what, sizeof what, "bn_eval rows %d c %d%s: y", rows, c, tag);
    expect_act(what, ye16, ye, n, 1e-6);
    expect_canary(what, ye16, n);
    free(rm); free(rv); free(ye); free(ye16);
    free(x); free(z); free(dy); free(gamma); free(beta); free(x16); free(z16); free(dy16);
}

/* The bf16 table's batch norm bit for bit with 1, 2 and 3 threads (its sums run over
 * row blocks fixed by the shapes; cpu_bn.h's AVX-512 loops within them). */
static void test_bn_threads(int rows, int c) {
    const size_t n = (size_t)rows * c;
    float *x = bf16_values(n, -1, 3), *z = bf16_values(n, -1, 1), *dy = bf16_values(n, -1, 1);
    float *x16 = packed(x, n), *z16 = packed(z, n), *dy16 = packed(dy, n);
    float *gamma = bf16_values(c, 0.5f, 1.5f), *beta = bf16_values(c, -0.5f, 0.5f);
    const int saved = ops_threads();
    for (int kind = 0; kind < 3; kind++) {
        BnOut o[3];
        for (int t = 0; t < 3; t++) {
            o[t] = bn_out(n, c, 1);
            ops_set_threads(t + 1);
            bn_run(B, kind, rows, c, x16, z16, gamma, beta, dy16, &o[t]);
        }
        for (int t = 1; t < 3; t++) {
            const float *got[] = {o[t].y, o[t].mean, o[t].invstd, o[t].rmean, o[t].rvar, o[t].dx, o[t].dgamma, o[t].dbeta};
            const float *want[] = {o[0].y, o[0].mean, o[0].invstd, o[0].rmean, o[0].rvar, o[0].dx, o[0].dgamma, o[0].dbeta};
            const size_t len[] = {n, (size_t)c, (size_t)c, (size_t)c, (size_t)c, n, (size_t)c, (size_t)c};
            for (int k = 0; k < 8; k++)
                EXPECT(!memcmp(got[k], want[k], len[k] * sizeof(float)),
                       "bf16 batch norm kind %d rows %d c %d: output %d differs between 1 and %d threads",
                       kind, rows, c, k, t + 1);
        }
        for (int t = 0; t < 3; t++) bn_free(&o[t]);
    }
    ops_set_threads(saved);
    printf("ok   bf16 batch norm rows %d c %d: 1, 2 and 3 threads bit-identical\n", rows, c);
    free(x); free(z); free(dy); free(x16); free(z16); free(dy16); free(gamma); free(beta);
}

/* ------------------------------------------------------------ convolutions */

typedef struct {
    float *y, *dx, *dw, *db;
} ConvOut;

/* Forward and backward of conv cs on n images of h x w (dx skipped for the stem). */
static void conv_run(const NetOps *t, const ConvSpec *cs, int n, int h, int w, int need_dx, const float *x,
                     const float *wt, const float *bias, const float *dy, ConvOut *o) {
    void *plan = t->conv_plan(NULL, cs, n, h, w, 1, need_dx);
    size_t ws_bytes = t->conv_workspace_bytes(NULL, plan);
    void *ws = xmalloc_aligned(ws_bytes ? ws_bytes : 64);
    t->conv_prepare(NULL, plan, n, ws_bytes);
    t->conv_forward(NULL, plan, n, x, wt, bias, o->y, ws, ws_bytes);
    t->conv_backward(NULL, plan, n, x, wt, dy, need_dx ? o->dx : NULL, o->dw, o->db, ws, ws_bytes);
    t->conv_plan_free(NULL, plan);
    free(ws);
}

static void test_conv(const char *name, ConvSpec cs, int n, int h, int w, int need_dx) {
    const int oh = conv_out_size(h, cs.k, cs.stride, cs.pad), ow = conv_out_size(w, cs.k, cs.stride, cs.pad);
    const size_t nx = (size_t)n * h * w * cs.cin, ny = (size_t)n * oh * ow * cs.cout;
    const size_t nw = (size_t)cs.cout * cs.cin * cs.k * cs.k;
    float *x = bf16_values(nx, -1, 1), *dy = bf16_values(ny, -1, 1), *bias = bf16_values(cs.cout, -0.5f, 0.5f);
    float *wt = zeros(nw), *wt16 = zeros(nw);
    for (size_t i = 0; i < nw; i++) {
        wt[i] = urand(-0.3f, 0.3f); /* the bf16 table rounds the fp32 weight itself */
        wt16[i] = round_bf16(wt[i]);
    }
    float *x16 = packed(x, nx), *dy16 = packed(dy, ny);
    ConvOut want = {zeros(ny), zeros(nx), zeros(nw), zeros(cs.cout)};
    ConvOut got = {out16(ny), out16(nx), zeros(nw), zeros(cs.cout)};
    conv_run(F, &cs, n, h, w, need_dx, x, wt16, bias, dy, &want);
    conv_run(B, &cs, n, h, w, need_dx, x16, wt, bias, dy16, &got);
    char what[128];
    snprintf(what, sizeof what, "conv %s: y", name);
    expect_act(what, got.y, want.y, ny, 1e-3 * max_abs(want.y, ny));
    if (need_dx) {
        snprintf(what, sizeof what, "conv %s: dx", name);
        expect_act(what, got.dx, want.dx, nx, 1e-3 * max_abs(want.dx, nx));
    }
    snprintf(what, sizeof what, "conv %s", name);
    expect_canary(what, got.y, ny);
    expect_canary(what, got.dx, nx);
    snprintf(what, sizeof what, "conv %s: dweight", name);
    expect_close(what, got.dw, want.dw, nw, 1e-3 * max_abs(want.dw, nw), 0);
    snprintf(what, sizeof what, "conv %s: dbias", name);
    expect_close(what, got.db, want.db, cs.cout, 1e-5 * max_abs(want.db, cs.cout), 1e-5);
    free(x); free(dy); free(bias); free(wt); free(wt16); free(x16); free(dy16);
    ConvOut *os[] = {&want, &got};
    for (int k = 0; k < 2; k++) { free(os[k]->y); free(os[k]->dx); free(os[k]->dw); free(os[k]->db); }
}

/* ------------------------------------------------------------ determinism */

/* conv -> BN + ReLU forward, then their backward, on the bf16 table: every output's bits. */
/* The floats chain_run writes. */
static size_t chain_len(const ConvSpec *cs, int n, int h, int w) {
    const size_t ny = (size_t)n * h * w * cs->cout; /* stride 1, same padding */
    return 3 * ny + (size_t)n * h * w * cs->cin + (size_t)cs->cout * cs->cin * cs->k * cs->k + 7 * (size_t)cs->cout;
}

static void chain_run(const ConvSpec *cs, int n, int h, int w, const float *x16, const float *wt,
                      const float *dy16, float *out, size_t *len) {
    const int oh = conv_out_size(h, cs->k, cs->stride, cs->pad), ow = conv_out_size(w, cs->k, cs->stride, cs->pad);
    const size_t nx = (size_t)n * h * w * cs->cin, ny = (size_t)n * oh * ow * cs->cout;
    const size_t nw = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    const int c = cs->cout, rows = n * oh * ow;
    float gamma[64], beta[64];
    for (int ch = 0; ch < c; ch++) gamma[ch] = 1.0f + 0.01f * ch, beta[ch] = 0.02f * ch;
    float *p = out;
    float *y = p; p += ny;
    float *bny = p; p += ny;
    float *stats = p; p += 4 * c; /* mean, invstd, running mean, running var */
    float *g = p; p += ny;        /* the BN's dx: the conv's dy */
    float *dgb = p; p += 2 * c;
    float *dx = p; p += nx;
    float *dw = p; p += nw;
    float *db = p; p += c;
    *len = (size_t)(p - out);
    memset(out, 0, *len * sizeof(float));
    for (int ch = 0; ch < c; ch++) stats[2 * c + ch] = 0, stats[3 * c + ch] = 1;
    void *plan = B->conv_plan(NULL, cs, n, h, w, 1, 1);
    size_t ws_bytes = B->conv_workspace_bytes(NULL, plan);
    void *ws = xmalloc_aligned(ws_bytes ? ws_bytes : 64);
    B->conv_forward(NULL, plan, n, x16, wt, NULL, y, ws, ws_bytes);
    B->bn_relu_train(NULL, rows, 1, c, y, gamma, beta, bny, stats, stats + c, stats + 2 * c, stats + 3 * c,
                     0.1f, 1e-5f);
    float *dyc = zeros(ny);
    memcpy(dyc, dy16, ny * sizeof(float));
    B->bn_relu_backward(NULL, rows, 1, c, y, bny, gamma, stats, stats + c, dyc, g, dgb, dgb + c);
    B->conv_backward(NULL, plan, n, x16, wt, g, dx, dw, db, ws, ws_bytes);
    B->conv_plan_free(NULL, plan);
    free(ws);
    free(dyc);
}

/* Bit-identical over two runs and with 1 and 2 threads, on a batch of several tiles
 * and single images (67 images of 8x8: a tile of 64, then 3 alone). */
static void test_determinism(void) {
    const ConvSpec specs[2] = {{16, 16, 3, 1, 1}, {16, 32, 1, 1, 0}};
    for (int sp = 0; sp < 2; sp++) {
        const ConvSpec *cs = &specs[sp];
        const int n = 67, h = 8, w = 8;
        const size_t nx = (size_t)n * h * w * cs->cin, ny = (size_t)n * h * w * cs->cout;
        const size_t nw = (size_t)cs->cout * cs->cin * cs->k * cs->k;
        float *x = bf16_values(nx, -1, 1), *dy = bf16_values(ny, -1, 1), *wt = bf16_values(nw, -0.2f, 0.2f);
        float *x16 = packed(x, nx), *dy16 = packed(dy, ny);
        size_t cap = chain_len(cs, n, h, w), len[3];
        EXPECT(cap == 3 * ny + nx + nw + 7 * (size_t)cs->cout, "determinism: chain_len (test error)");
        float *o[3];
        int threads = ops_threads();
        for (int k = 0; k < 3; k++) {
            o[k] = zeros(cap);
            ops_set_threads(k < 2 ? 2 : 1);
            chain_run(cs, n, h, w, x16, wt, dy16, o[k], &len[k]);
        }
        ops_set_threads(threads);
        EXPECT(len[0] == cap && len[1] == cap && len[2] == cap, "determinism: chain_len (test error)");
        EXPECT(!memcmp(o[0], o[1], len[0] * sizeof(float)), "bf16 determinism (k %d): two runs differ", cs->k);
        EXPECT(!memcmp(o[0], o[2], len[0] * sizeof(float)), "bf16 determinism (k %d): 1 and 2 threads differ", cs->k);
        printf("ok   bf16 determinism k %d: two runs and 1/2 threads bit-identical\n", cs->k);
        for (int k = 0; k < 3; k++) free(o[k]);
        free(x); free(dy); free(wt); free(x16); free(dy16);
    }
}

int main(void) {
    log_set_program("test_cpu_bf16");
    const char *why = cpu_bf16_features() ? cpu_bf16_why_not(-1) : "CPU lacks AVX512-BF16 (and AMX-BF16)";
    if (why) {
        printf("test_cpu_bf16: NOT RUN: the CPU bf16 table: %s\n", why);
        return unit_report("test_cpu_bf16");
    }
    F = net_cpu_ops_isa(CPU_ISA_AVX512);
    B = net_cpu_ops_bf16();
    printf("test_cpu_bf16: %s (%s) against %s\n", B->name, cpu_bf16_backend(), F->name);
    ops_set_threads(2);
    test_elementwise();
    test_meanpool();
    test_bn(4099, 8, 0);
    test_bn(2048, 16, 0);
    test_bn(1024, 32, 0);
    test_bn(512, 64, 0);
    test_bn(7, 3, 0);
    /* cpu_bn.h's AVX-512 loops: chunks cut short by the row blocks (16), 48 channels
     * (three phases), an odd row count of 8 channels */
    test_bn(1000, 16, 0);
    test_bn(777, 48, 0);
    test_bn(333, 8, 0);
    test_bn(2048, 16, 1);
    test_bn_threads(4099, 8);
    test_bn_threads(1000, 32);
    test_conv("stem 3x3/2", (ConvSpec){3, 16, 3, 2, 1}, 3, 16, 16, 0);
    test_conv("1x1", (ConvSpec){16, 8, 1, 1, 0}, 5, 8, 8, 1);
    test_conv("3x3", (ConvSpec){8, 8, 3, 1, 1}, 5, 8, 8, 1);
    test_conv("3x3/2", (ConvSpec){16, 16, 3, 2, 1}, 4, 8, 8, 1);
    test_conv("projection 1x1/2", (ConvSpec){16, 64, 1, 2, 0}, 3, 8, 8, 1);
    test_conv("16->16 3x3, 67 images (tiles and single images)", (ConvSpec){16, 16, 3, 1, 1}, 67, 8, 8, 1);
    /* pointwise: dW (and, where oneDNN runs it on AMX, dx) by a matmul (conv_dnnl.c) */
    test_conv("16->64 1x1, 67 images (tiles and single images)", (ConvSpec){16, 64, 1, 1, 0}, 67, 8, 8, 1);
    /* rows and channels not multiples of bias_grad's 64-row, 64-channel blocks */
    test_conv("24->72 1x1 7x7", (ConvSpec){24, 72, 1, 1, 0}, 5, 7, 7, 1);
    test_determinism();
    return unit_report("test_cpu_bf16");
}
