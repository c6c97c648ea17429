/* test_ops_cuda: every op of the CUDA op table (net_cuda.cu) against the CPU table
 * on op_cases.h's case table (forward and backward, within each case's tolerance),
 * NaN through the GPU ReLU, the conv in ops.h's contract form (fp32 and tf32), our
 * batch-norm kernels repeatable bit for bit; the augmentation kernel (crop, flip,
 * cutout; its bf16 instance too) and the moving average's kernel bit for bit;
 * then the whole CUDA engine against the CPU engine on two tiny networks
 * (bottleneck and basic blocks): a few SGD steps (the second full batch is
 * captured as a CUDA graph, the third replays it, the fourth is a partial batch),
 * then the weights, BN buffers, momentum, their moving average (--ema) and an
 * evaluation compared (the batches with cutout); and an
 * engine that streams its splits through pinned buffers (CIFAR_CUDA_DATA=stream)
 * against one that keeps them in device memory, bit for bit.
 *
 * bf16 (--precision bf16), against the same CPU ops in fp32 on the very bf16 values
 * the GPU reads (inputs rounded on the host first), per-op tolerances:
 *   - relu, relu backward, add, add_relu: exact (the fp32 result rounded once);
 *   - the conv (ops.h contract form, bf16 x/w/dy): y, dx within 1e-2 absolute and
 *     relative (one bf16 rounding of the output, 2^-8 relative, plus tensor-core
 *     accumulation order), dweight and dbias within 1e-1 absolute, 1e-2 relative (sums
 *     over the batch of bf16 products);
 *   - our batch norm (training forward with ReLU, then its backward) against the CPU's:
 *     y and dx within 2^-8 relative (one bf16 rounding) plus the fp32 tolerances
 *     (2e-5 absolute; dx 1e-4 relative), the saved statistics within 1e-5, dgamma and
 *     dbeta within 1e-4; and repeatable bit for bit, as in fp32;
 *   - the mean pool: forward (bf16 in, float out) within 1e-6, backward (float in,
 *     bf16 out) exact;
 *   - the whole engine against the fp32 CPU engine: loss, parameter, BN buffer and
 *     momentum changes within 15% relative L2 error (fp32: 0.2%, tf32: 5%).
 *
 * Without a usable GPU (or in a CPU-only build) it prints one line saying why and
 * exits 0 (SKIP, as one of the unit tests) or, with --gpu-only (make test-gpu), 77.
 * It links libcifar-cuda.so itself and hands it the callbacks (cuda_host.h); the
 * engine entry points still go through cuda_loader.c (as in the commands), pointed
 * at that very library. */
#define _GNU_SOURCE /* dladdr */
#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "unit.h"

/* "SKIP: why" and the exit status: 77 for make test-gpu, 0 inside test-unit. */
static int skip(int argc, char **argv, const char *why) {
    int gpu_only = argc > 1 && strcmp(argv[1], "--gpu-only") == 0;
    printf("test_ops_cuda: SKIP: %s\n", why);
    return gpu_only ? 77 : 0;
}

#ifndef CIFAR_CUDA
int main(int argc, char **argv) { return skip(argc, argv, "CPU-only build (no GPU code)"); }
#else

#include <dlfcn.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "data/augment.h"
#include "data/dataset.h"
#include "core/check.h"
#include "comm/comm.h"
#include "model/ema.h"
#include "model/engine.h"
#include "model/model.h"
#include "backend-cpu/ops_cpu.h"
#include "backend-cuda/ops_cuda.h"
#include "core/rng.h"
#include "backend-cuda/cuda_host.h"
#include "model/net.h"
#include "backend-cuda/bf16.h"
#include "op_cases.h"

int cifar_cuda_init(const CudaHostApi *api);
static uint64_t rand_counter;

static float frand(float lo, float hi) {
    return lo + (hi - lo) * rng_uniform(1234, 99, rand_counter++);
}

static float *rand_vec(size_t n, float lo, float hi) {
    float *v = xmalloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) v[i] = frand(lo, hi);
    return v;
}

static float *dev_from(CudaCtx *ctx, const float *h, size_t n) {
    float *d = cuda_alloc(n * sizeof(float));
    cuda_upload(ctx, d, h, n * sizeof(float));
    return d;
}

static float *host_from(CudaCtx *ctx, const float *d, size_t n) {
    float *h = xmalloc(n * sizeof(float) + 1);
    cuda_ctx_sync(ctx);
    cuda_download(ctx, h, d, n * sizeof(float));
    return h;
}

/* ---- activations: floats, or bfloat16 in a bf16 context ---- */

/* The values the context's activation type holds (a no-op in fp32). */
static void act_round_host(const CudaCtx *ctx, float *v, size_t n) {
    if (!cuda_ctx_bf16(ctx)) return;
    for (size_t i = 0; i < n; i++) v[i] = bf16_to_float(bf16_from_float(v[i]));
}

/* n activations on the device from host floats (converted there in bf16). */
static float *dev_act_from(CudaCtx *ctx, const float *h, size_t n) {
    float *wide = dev_from(ctx, h, n);
    if (!cuda_ctx_bf16(ctx)) return wide;
    float *d = cuda_alloc(n * sizeof(float)); /* as the executor's buffers: n floats */
    cuda_f32_to_bf16(ctx, n, wide, d);
    cuda_ctx_sync(ctx);
    cuda_free(wide);
    return d;
}

/* n device activations as host floats. */
static float *host_act_from(CudaCtx *ctx, const float *d, size_t n) {
    if (!cuda_ctx_bf16(ctx)) return host_from(ctx, d, n);
    float *wide = cuda_alloc(n * sizeof(float));
    cuda_bf16_to_f32(ctx, n, d, wide);
    float *h = host_from(ctx, wide, n);
    cuda_free(wide);
    return h;
}

/* |got - want| <= atol + rtol*|want| everywhere; reports the worst element. */
static void expect_close(const char *what, const float *got, const float *want, size_t n, float atol,
                         float rtol) {
    size_t bad = 0, worst = 0;
    double worst_err = -1.0;
    for (size_t i = 0; i < n; i++) {
        double err = fabs((double)got[i] - (double)want[i]);
        double lim = atol + rtol * fabs((double)want[i]);
        if (!(err <= lim)) bad++;
        if (!(err <= worst_err)) {
            worst_err = err;
            worst = i;
        }
    }
    EXPECT(bad == 0, "%s", what);
    if (bad) {
        printf("FAIL %s: %zu of %zu elements off (worst [%zu] got %.7g want %.7g)\n", what, bad, n,
               worst, n ? got[worst] : 0.0f, n ? want[worst] : 0.0f);
    } else {
        printf("ok   %s (max err %.3g over %zu)\n", what, n ? worst_err : 0.0, n);
    }
}

/* The device array d (n floats) against the host reference. */
static void expect_dev(CudaCtx *ctx, const char *what, const float *d, const float *want, size_t n,
                       float atol, float rtol) {
    float *h = host_from(ctx, d, n);
    expect_close(what, h, want, n, atol, rtol);
    free(h);
}

/* The device activations d against the host reference. */
static void expect_dev_act(CudaCtx *ctx, const char *what, const float *d, const float *want, size_t n,
                           float atol, float rtol) {
    float *h = host_act_from(ctx, d, n);
    expect_close(what, h, want, n, atol, rtol);
    free(h);
}

static void expect_true(const char *what, int ok) {
    EXPECT(ok, "%s", what);
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

/* ------------------------------------------------------------- convolution */

/* The CPU table's conv of cs on n x h x w inputs, in host memory: the forward into y
 * unless y is NULL, then the backward from dy. */
static void cpu_conv(const ConvSpec *cs, int n, int h, int w, const float *x, const float *wt,
                     const float *b, float *y, const float *dy, float *dx, float *dw, float *db) {
    const NetOps *cpu = net_cpu_ops();
    void *plan = cpu->conv_plan(NULL, cs, n, h, w, 1, 1);
    size_t ws_bytes = cpu->conv_workspace_bytes(NULL, plan);
    void *ws = xmalloc(ws_bytes + sizeof(float));
    if (y) cpu->conv_forward(NULL, plan, n, x, wt, b, y, ws, ws_bytes);
    cpu->conv_backward(NULL, plan, n, x, wt, dy, dx, dw, db, ws, ws_bytes);
    free(ws);
    cpu->conv_plan_free(NULL, plan);
}

/* tol: y and dx (atol and rtol); dweight and dbias: 10*tol absolute, tol relative.
 * In a bf16 context x, the weight and dy are bf16 values (rounded here first). */
static void test_conv(CudaCtx *ctx, ConvSpec cs, int n, int h, int w, float tol, const char *tag) {
    char name[160];
    int oh = conv_out_size(h, cs.k, cs.stride, cs.pad), ow = conv_out_size(w, cs.k, cs.stride, cs.pad);
    size_t nx = (size_t)n * h * w * cs.cin, ny = (size_t)n * oh * ow * cs.cout;
    size_t nw = (size_t)cs.cout * cs.cin * cs.k * cs.k;
    float *x = rand_vec(nx, -1, 1), *wt = rand_vec(nw, -0.5f, 0.5f), *b = rand_vec(cs.cout, -1, 1);
    float *dy = rand_vec(ny, -1, 1);
    act_round_host(ctx, x, nx);
    act_round_host(ctx, wt, nw);
    act_round_host(ctx, dy, ny);
    float *y = xmalloc(ny * sizeof(float)), *dx = xmalloc(nx * sizeof(float));
    float *dw = xmalloc(nw * sizeof(float)), *db = xmalloc(cs.cout * sizeof(float));
    cpu_conv(&cs, n, h, w, x, wt, b, y, dy, dx, dw, db);

    float *gx = dev_act_from(ctx, x, nx), *gw = dev_from(ctx, wt, nw), *gb = dev_from(ctx, b, cs.cout);
    float *gdy = dev_act_from(ctx, dy, ny);
    float *gy = cuda_alloc(ny * sizeof(float)), *gdx = cuda_alloc(nx * sizeof(float));
    float *gdw = cuda_alloc(nw * sizeof(float)), *gdb = cuda_alloc(cs.cout * sizeof(float));
    conv2d_forward_cuda(ctx, &cs, n, h, w, gx, gw, gb, gy);
    conv2d_backward_cuda(ctx, &cs, n, h, w, gx, gw, gdy, gdx, gdw, gdb);
#define CONV_NAME(s) (snprintf(name, sizeof name, "conv %s k%d s%d p%d %d->%d on %dx%dx%d: %s", tag, \
                               cs.k, cs.stride, cs.pad, cs.cin, cs.cout, n, h, w, s), name)
    expect_dev_act(ctx, CONV_NAME("y"), gy, y, ny, tol, tol);
    expect_dev_act(ctx, CONV_NAME("dx"), gdx, dx, nx, tol, tol);
    expect_dev(ctx, CONV_NAME("dweight"), gdw, dw, nw, tol * 10, tol);
    expect_dev(ctx, CONV_NAME("dbias"), gdb, db, cs.cout, tol * 10, tol);
    /* dx == NULL (the stem) must still give the parameter gradients. */
    cuda_memset_async(ctx, gdw, 0, nw * sizeof(float));
    conv2d_backward_cuda(ctx, &cs, n, h, w, gx, gw, gdy, NULL, gdw, gdb);
    expect_dev(ctx, CONV_NAME("dweight (dx NULL)"), gdw, dw, nw, tol * 10, tol);
#undef CONV_NAME
    /* KCRS -> KRSC -> KCRS is the identity. */
    float *gk = cuda_alloc(nw * sizeof(float)), *gback = cuda_alloc(nw * sizeof(float));
    conv_weight_to_krsc_cuda(ctx, &cs, gw, gk);
    conv_weight_from_krsc_cuda(ctx, &cs, gk, gback);
    float *back = host_from(ctx, gback, nw);
    expect_true("conv weight KCRS -> KRSC -> KCRS round trip", memcmp(back, wt, nw * sizeof(float)) == 0);
    free(back);
    cuda_free(gk);
    cuda_free(gback);
    cuda_free(gx); cuda_free(gw); cuda_free(gb); cuda_free(gdy);
    cuda_free(gy); cuda_free(gdx); cuda_free(gdw); cuda_free(gdb);
    free(x); free(wt); free(b); free(dy); free(y); free(dx); free(dw); free(db);
}

/* The KRSC weight (floats) as the context's convs read it: a bf16 copy in a bf16
 * context (the engine's shadow), else itself. */
static float *conv_weight_act(CudaCtx *ctx, float *krsc, size_t nw) {
    if (!cuda_ctx_bf16(ctx)) return krsc;
    float *d = cuda_alloc(nw * sizeof(float));
    cuda_f32_to_bf16(ctx, nw, krsc, d);
    return d;
}

/* conv_cuda_backward_acc (cuDNN backward data with beta = 1): dx holding r before
 * ends as r + the CPU's dx; the weight gradient is the plain backward's. In a bf16
 * context (cuDNN's PSEUDO_BFLOAT16 configuration) x, the weight, dy and r are bf16
 * values, and the KRSC weight and its gradient bf16 as the engine's shadows. */
static void test_conv_backward_acc(CudaCtx *ctx, ConvSpec cs, int n, int h, int w, float tol,
                                   const char *tag) {
    int oh = conv_out_size(h, cs.k, cs.stride, cs.pad), ow = conv_out_size(w, cs.k, cs.stride, cs.pad);
    size_t nx = (size_t)n * h * w * cs.cin, ny = (size_t)n * oh * ow * cs.cout;
    size_t nw = (size_t)cs.cout * cs.cin * cs.k * cs.k;
    float *x = rand_vec(nx, -1, 1), *wt = rand_vec(nw, -0.5f, 0.5f), *dy = rand_vec(ny, -1, 1);
    float *r = rand_vec(nx, -1, 1), *dx = xmalloc(nx * sizeof(float)), *dw = xmalloc(nw * sizeof(float));
    float *db = xmalloc(cs.cout * sizeof(float));
    act_round_host(ctx, x, nx);
    act_round_host(ctx, wt, nw);
    act_round_host(ctx, dy, ny);
    act_round_host(ctx, r, nx);
    cpu_conv(&cs, n, h, w, x, wt, NULL, NULL, dy, dx, dw, db);
    for (size_t i = 0; i < nx; i++) dx[i] += r[i];
    ConvCuda *cv = conv_cuda_create(ctx, &cs, n, h, w, (size_t)256 << 20, 1, 1);
    size_t ws_bytes = conv_cuda_workspace_bytes(ctx, cv);
    void *ws = cuda_alloc(ws_bytes ? ws_bytes : 1);
    float *gx = dev_act_from(ctx, x, nx), *gw = dev_from(ctx, wt, nw), *gdy = dev_act_from(ctx, dy, ny);
    float *gdx = dev_act_from(ctx, r, nx), *gwk = cuda_alloc(nw * sizeof(float));
    float *gdwk = cuda_alloc(nw * sizeof(float)), *gdw = cuda_alloc(nw * sizeof(float));
    conv_weight_to_krsc_cuda(ctx, &cs, gw, gwk);
    float *wk = conv_weight_act(ctx, gwk, nw);
    float *dwk = cuda_ctx_bf16(ctx) ? cuda_alloc(nw * sizeof(float)) : gdwk; /* bf16 in a bf16 context */
    conv_cuda_prepare(ctx, cv, n, ws_bytes);
    conv_cuda_backward_acc(ctx, cv, n, gx, wk, gdy, gdx, dwk, NULL, ws, ws_bytes);
    if (dwk != gdwk) cuda_bf16_to_f32(ctx, nw, dwk, gdwk);
    conv_weight_from_krsc_cuda(ctx, &cs, gdwk, gdw);
    char name[160];
    snprintf(name, sizeof name, "conv %s backward accumulating (beta 1) k%d s%d %d->%d: dx = r + dx", tag,
             cs.k, cs.stride, cs.cin, cs.cout);
    expect_dev_act(ctx, name, gdx, dx, nx, tol, tol);
    snprintf(name, sizeof name, "conv %s backward accumulating (beta 1) k%d s%d %d->%d: dweight", tag,
             cs.k, cs.stride, cs.cin, cs.cout);
    expect_dev(ctx, name, gdw, dw, nw, tol * 10, tol);
    conv_cuda_free(ctx, cv);
    if (wk != gwk) cuda_free(wk);
    if (dwk != gdwk) cuda_free(dwk);
    cuda_free(ws); cuda_free(gx); cuda_free(gw); cuda_free(gdy); cuda_free(gdx); cuda_free(gwk);
    cuda_free(gdwk); cuda_free(gdw);
    free(x); free(wt); free(dy); free(r); free(dx); free(dw); free(db);
}

/* ------------------------------------------- the op table against the CPU */

static void cuda_up(void *ctx, void *dev, const void *host, size_t bytes) {
    cuda_upload((CudaCtx *)ctx, dev, host, bytes);
}

static void cuda_down(void *ctx, void *host, const void *dev, size_t bytes) {
    cuda_ctx_sync((CudaCtx *)ctx);
    cuda_download((CudaCtx *)ctx, host, dev, bytes);
}

/* op_cases.h's table: every op of the CUDA table against the CPU table. */
static void test_op_cases(CudaCtx *ctx) {
    OpBackend cpu = {"cpu", net_cpu_ops(), NULL, opc_host_copy, opc_host_copy};
    OpBackend gpu = {"cuda", net_cuda_ops(), ctx, cuda_up, cuda_down};
    opc_check_all(&cpu, &gpu, 1);
}

/* ------------------------------------------- bf16 batch norm and mean pool */

/* Our BN kernels' bf16 instances and the pool against the CPU ops on the bf16 values
 * (inputs rounded first; the backward's reference gets the GPU's own y and saved
 * statistics, so the ReLU mask and the coefficients are the same on both sides). */
static void test_bn_pool_bf16(CudaCtx *ctx) {
    const int n = 6, hw = 500, c = 40; /* 3,000 rows: several chunks; c across two tiles */
    const size_t nx = (size_t)n * hw * c, rows = (size_t)n * hw;
    const double rt = 1.0 / 256.0; /* half a bf16 step, relative */
    float *x = rand_vec(nx, -2, 3), *dy = rand_vec(nx, -1, 1), *g = rand_vec(c, 0.5f, 1.5f);
    float *b = rand_vec(c, -0.5f, 0.5f), *rm = xcalloc(c, sizeof(float)), *rv = xcalloc(c, sizeof(float));
    act_round_host(ctx, x, nx);
    act_round_host(ctx, dy, nx);
    float *y = xmalloc(nx * sizeof(float)), *m = xmalloc(c * sizeof(float)), *inv = xmalloc(c * sizeof(float));
    net_cpu_ops()->bn_relu_train(NULL, (int)rows, 1, c, x, g, b, y, m, inv, rm, rv, 0.1f, 1e-5f);
    float *gx = dev_act_from(ctx, x, nx), *gdy = dev_act_from(ctx, dy, nx), *gg = dev_from(ctx, g, c);
    float *gb = dev_from(ctx, b, c), *gy = cuda_alloc(nx * sizeof(float)), *gdx = cuda_alloc(nx * sizeof(float));
    float *gm = cuda_alloc(c * sizeof(float)), *ginv = cuda_alloc(c * sizeof(float));
    float *grm = cuda_alloc(c * sizeof(float)), *grv = cuda_alloc(c * sizeof(float));
    float *gdg = cuda_alloc(c * sizeof(float)), *gdb = cuda_alloc(c * sizeof(float));
    cuda_memset_async(ctx, grm, 0, c * sizeof(float));
    cuda_memset_async(ctx, grv, 0, c * sizeof(float));
    batchnorm2d_relu_forward_train_cuda(ctx, n, hw, c, gx, gg, gb, gy, gm, ginv, grm, grv, 0.1f, 1e-5f);
    expect_dev_act(ctx, "bf16 bn+relu train: y", gy, y, nx, 2e-5f, (float)(2e-5 + rt));
    expect_dev(ctx, "bf16 bn+relu train: save_mean", gm, m, c, 1e-5f, 1e-5f);
    expect_dev(ctx, "bf16 bn+relu train: save_invstd", ginv, inv, c, 1e-5f, 1e-5f);
    expect_dev(ctx, "bf16 bn+relu train: running_var", grv, rv, c, 1e-5f, 1e-5f);
    float *yg = host_act_from(ctx, gy, nx), *mg = host_from(ctx, gm, c), *ig = host_from(ctx, ginv, c);
    float *dx = xmalloc(nx * sizeof(float)), *dg = xmalloc(c * sizeof(float)), *db = xmalloc(c * sizeof(float));
    net_cpu_ops()->bn_relu_backward(NULL, (int)rows, 1, c, x, yg, g, mg, ig, dy, dx, dg, db);
    batchnorm2d_relu_backward_cuda(ctx, n, hw, c, gx, gy, gg, gm, ginv, gdy, gdx, gdg, gdb);
    expect_dev_act(ctx, "bf16 bn+relu backward: dx", gdx, dx, nx, 2e-5f, (float)(1e-4 + rt));
    expect_dev(ctx, "bf16 bn+relu backward: dgamma", gdg, dg, c, 1e-4f, 1e-4f);
    expect_dev(ctx, "bf16 bn+relu backward: dbeta", gdb, db, c, 1e-4f, 1e-4f);
    /* the pool: bf16 activations in, float features out; float gradient in, bf16 out */
    float *p = xmalloc((size_t)n * c * sizeof(float)), *gp = cuda_alloc((size_t)n * c * sizeof(float));
    net_cpu_ops()->meanpool_forward(NULL, n, hw, c, x, p);
    meanpool_forward_cuda(ctx, n, hw, c, gx, gp);
    expect_dev(ctx, "bf16 meanpool forward (float out)", gp, p, (size_t)n * c, 1e-6f, 1e-5f);
    meanpool_backward_cuda(ctx, n, hw, c, gp, gdx);
    float *pg = host_from(ctx, gp, (size_t)n * c);
    net_cpu_ops()->meanpool_backward(NULL, n, hw, c, pg, dx); /* from the GPU's own features: exact */
    act_round_host(ctx, dx, nx);
    expect_dev_act(ctx, "bf16 meanpool backward (bf16 out)", gdx, dx, nx, 0, 0);
    float *dev[] = {gx, gdy, gg, gb, gy, gdx, gm, ginv, grm, grv, gdg, gdb, gp};
    for (size_t i = 0; i < sizeof dev / sizeof *dev; i++) cuda_free(dev[i]);
    free(x); free(dy); free(g); free(b); free(rm); free(rv); free(y); free(m); free(inv);
    free(yg); free(mg); free(ig); free(dx); free(dg); free(db); free(p); free(pg);
}

/* ---------------------------------------------------------- element-wise */

/* Exact in both activation types: the CPU's fp32 result, rounded once to bf16 in a
 * bf16 context, is what the GPU stores. */
static void test_elementwise(CudaCtx *ctx) {
    const size_t n = 100003;
    const char *tag = cuda_ctx_bf16(ctx) ? " (bf16)" : "";
    char name[96];
#define EW_NAME(s) (snprintf(name, sizeof name, "%s%s", s, tag), name)
    float *a = rand_vec(n, -1, 1), *b = rand_vec(n, -1, 1), *r = xmalloc(n * sizeof(float));
    act_round_host(ctx, a, n);
    act_round_host(ctx, b, n);
    float *ga = dev_act_from(ctx, a, n), *gb = dev_act_from(ctx, b, n), *gr = cuda_alloc(n * sizeof(float));
    net_cpu_ops()->relu_forward(NULL, n, a, r);
    relu_forward_cuda(ctx, n, ga, gr);
    expect_dev_act(ctx, EW_NAME("relu forward"), gr, r, n, 0, 0);
    float *y = xmalloc(n * sizeof(float));
    memcpy(y, r, n * sizeof(float));
    net_cpu_ops()->relu_backward(NULL, n, y, b, r);
    relu_backward_cuda(ctx, n, gr, gb, gr); /* in place, as ops.h allows */
    expect_dev_act(ctx, EW_NAME("relu backward (in place)"), gr, r, n, 0, 0);
    net_cpu_ops()->add(NULL, n, a, b, r);
    act_round_host(ctx, r, n);
    add_forward_cuda(ctx, n, ga, gb, gr);
    expect_dev_act(ctx, EW_NAME("add"), gr, r, n, 0, 0);
    net_cpu_ops()->add_relu(NULL, n, a, b, r);
    act_round_host(ctx, r, n);
    add_relu_forward_cuda(ctx, n, ga, gb, gr);
    expect_dev_act(ctx, EW_NAME("add_relu"), gr, r, n, 0, 0);
    /* NaN passes through ReLU and the fused add+ReLU, as on the CPU and in PyTorch
     * (the trainer's NaN stop relies on it). */
    float nan_in[2] = {NAN, -1.0f}, zero2[2] = {0.0f, 0.0f}, *out;
    float *gn = dev_act_from(ctx, nan_in, 2), *gz = dev_act_from(ctx, zero2, 2);
    relu_forward_cuda(ctx, 2, gn, gr);
    out = host_act_from(ctx, gr, 2);
    expect_true(EW_NAME("relu passes NaN"), isnan(out[0]) && out[1] == 0.0f);
    free(out);
    add_relu_forward_cuda(ctx, 2, gn, gz, gr);
    out = host_act_from(ctx, gr, 2);
    expect_true(EW_NAME("add_relu passes NaN"), isnan(out[0]) && out[1] == 0.0f);
    free(out);
#undef EW_NAME
    cuda_free(gn); cuda_free(gz);
    cuda_free(ga); cuda_free(gb); cuda_free(gr);
    free(a); free(b); free(r); free(y);
}

/* Our batch-norm kernels twice on the same input, into fresh buffers: bit-identical
 * (fixed reduction order), and the second launch finalises too (the per-tile block
 * counters are back at 0 after each launch, as graph replays need). */
static void test_bn_repeatable(CudaCtx *ctx) {
    const int n = 50, hw = 1000, c = 40; /* 50,000 rows: several chunks; c across two tiles */
    size_t nx = (size_t)n * hw * c;
    float *x = rand_vec(nx, -2, 3), *dy = rand_vec(nx, -1, 1), *g = rand_vec(c, 0.5f, 1.5f);
    float *b = rand_vec(c, -0.5f, 0.5f);
    float *gx = dev_act_from(ctx, x, nx), *gdy = dev_act_from(ctx, dy, nx), *gg = dev_from(ctx, g, c);
    float *gb = dev_from(ctx, b, c);
    float *out[2][6];
    for (int run = 0; run < 2; run++) {
        float *y = cuda_alloc(nx * sizeof(float)), *dx = cuda_alloc(nx * sizeof(float));
        float *m = cuda_alloc(c * sizeof(float)), *inv = cuda_alloc(c * sizeof(float));
        float *rm = cuda_alloc(c * sizeof(float)), *rv = cuda_alloc(c * sizeof(float));
        float *dg = cuda_alloc(c * sizeof(float)), *db = cuda_alloc(c * sizeof(float));
        float *dev[] = {y, dx, m, inv, rm, rv, dg, db};
        for (int i = 0; i < 8; i++) cuda_memset_async(ctx, dev[i], 0, (i < 2 ? nx : (size_t)c) * sizeof(float));
        batchnorm2d_relu_forward_train_cuda(ctx, n, hw, c, gx, gg, gb, y, m, inv, rm, rv, 0.1f, 1e-5f);
        batchnorm2d_relu_backward_cuda(ctx, n, hw, c, gx, y, gg, m, inv, gdy, dx, dg, db);
        out[run][0] = host_from(ctx, y, nx);
        out[run][1] = host_from(ctx, dx, nx);
        out[run][2] = host_from(ctx, m, c);
        out[run][3] = host_from(ctx, inv, c);
        out[run][4] = host_from(ctx, dg, c);
        out[run][5] = host_from(ctx, db, c);
        for (int i = 0; i < 8; i++) cuda_free(dev[i]);
    }
    int same = 1, finalized = 0;
    for (int k = 0; k < 6; k++) same &= memcmp(out[0][k], out[1][k], (k < 2 ? nx : (size_t)c) * sizeof(float)) == 0;
    for (int ch = 0; ch < c; ch++) finalized += out[1][3][ch] > 0.0f; /* invstd > 0 once finalised */
    expect_true(cuda_ctx_bf16(ctx) ? "batch norm (ours, bf16) twice: bit-identical y, dx, statistics and gradients"
                                   : "batch norm (ours) twice: bit-identical y, dx, statistics and gradients",
                same);
    expect_true("batch norm (ours): the second launch finalises every channel", finalized == c);
    for (int run = 0; run < 2; run++)
        for (int k = 0; k < 6; k++) free(out[run][k]);
    cuda_free(gx); cuda_free(gdy); cuda_free(gg); cuda_free(gb);
    free(x); free(dy); free(g); free(b);
}

/* The keep form of the ReLU-masked BN backward against the CPU (dx as
 * batchnorm2d_relu_backward's; dy left masked, exactly relu_backward's). */
static void test_bn_backward_keep(CudaCtx *ctx) {
    const int n = 20, hw = 500, c = 40;
    size_t nx = (size_t)n * hw * c;
    float *x = rand_vec(nx, -2, 3), *y = rand_vec(nx, -1, 1), *dy = rand_vec(nx, -1, 1);
    float *g = rand_vec(c, 0.5f, 1.5f), *m = xmalloc(c * sizeof(float)), *inv = xmalloc(c * sizeof(float));
    for (int ch = 0; ch < c; ch++) {
        m[ch] = frand(-0.3f, 0.3f);
        inv[ch] = frand(0.5f, 1.5f);
    }
    float *dx = xmalloc(nx * sizeof(float)), *dg = xmalloc(c * sizeof(float)), *db = xmalloc(c * sizeof(float));
    float *masked = xmalloc(nx * sizeof(float));
    net_cpu_ops()->bn_relu_backward(NULL, n, hw, c, x, y, g, m, inv, dy, dx, dg, db);
    net_cpu_ops()->relu_backward(NULL, nx, y, dy, masked);
    float *gx = dev_from(ctx, x, nx), *gy = dev_from(ctx, y, nx), *gdy = dev_from(ctx, dy, nx);
    float *gg = dev_from(ctx, g, c), *gm = dev_from(ctx, m, c), *gi = dev_from(ctx, inv, c);
    float *gdx = cuda_alloc(nx * sizeof(float)), *gdg = cuda_alloc(c * sizeof(float)), *gdb = cuda_alloc(c * sizeof(float));
    batchnorm2d_relu_backward_keep_cuda(ctx, n, hw, c, gx, gy, gg, gm, gi, gdy, gdx, gdg, gdb);
    expect_dev(ctx, "bn+relu backward keep: dx", gdx, dx, nx, 2e-5f, 1e-4f);
    expect_dev(ctx, "bn+relu backward keep: dgamma", gdg, dg, c, 1e-3f, 1e-5f);
    expect_dev(ctx, "bn+relu backward keep: dbeta", gdb, db, c, 1e-3f, 1e-5f);
    float *kept = host_from(ctx, gdy, nx);
    expect_true("bn+relu backward keep: dy left masked (relu_backward's, exactly)",
                memcmp(kept, masked, nx * sizeof(float)) == 0);
    free(kept);
    cuda_free(gx); cuda_free(gy); cuda_free(gdy); cuda_free(gg); cuda_free(gm); cuda_free(gi);
    cuda_free(gdx); cuda_free(gdg); cuda_free(gdb);
    free(x); free(y); free(dy); free(g); free(m); free(inv); free(dx); free(dg); free(db); free(masked);
}

/* One training batch norm (add+ReLU forward with a deferred bias, then the keep
 * backward) with the cooperative kernels and with the two-kernel path: every output
 * bit for bit the same (bn_nhwc.h: the same sums in the same order). */
enum { COOP_OUTS = 10 };
static void bn_coop_case(CudaCtx *ctx, int n, int hw, int c, const float *x, const float *bias,
                         const float *z, const float *g, const float *b, const float *dy,
                         float **out) {
    size_t nx = (size_t)n * hw * c;
    float *gx = dev_act_from(ctx, x, nx), *gbias = dev_from(ctx, bias, c), *gz = dev_act_from(ctx, z, nx);
    float *gg = dev_from(ctx, g, c), *gb = dev_from(ctx, b, c), *gdy = dev_act_from(ctx, dy, nx);
    float *y = cuda_alloc(nx * sizeof(float)), *dx = cuda_alloc(nx * sizeof(float));
    float *m = cuda_alloc(c * sizeof(float)), *inv = cuda_alloc(c * sizeof(float));
    float *rm = dev_from(ctx, g, c), *rv = dev_from(ctx, g, c);
    float *dg = cuda_alloc(c * sizeof(float)), *db = cuda_alloc(c * sizeof(float));
    NetBnForward bn = {NET_BN_TRAIN_ADD_RELU, hw, c, gg, gb, gz, NULL, y, m, inv, rm, rv, 0.1f, 1e-5f};
    batchnorm2d_forward_bias_cuda(ctx, n, gx, gbias, &bn);
    batchnorm2d_relu_backward_keep_cuda(ctx, n, hw, c, gx, y, gg, m, inv, gdy, dx, dg, db);
    float *dev[COOP_OUTS] = {y, gx, m, inv, rm, rv, dx, gdy, dg, db};
    for (int k = 0; k < COOP_OUTS; k++) /* activations in the context's type, as they are */
        out[k] = k < 2 || k == 6 || k == 7 ? host_act_from(ctx, dev[k], nx) : host_from(ctx, dev[k], (size_t)c);
    for (int k = 0; k < COOP_OUTS; k++) cuda_free(dev[k]);
    cuda_free(gbias); cuda_free(gz); cuda_free(gg); cuda_free(gb);
}

static void test_bn_coop(CudaCtx *ctx) {
    if (!cuda_ctx_bn_coop(ctx, -1)) {
        printf("SKIP cooperative batch norm against two kernels: off on this device or by "
               "CIFAR_CUDA_BN_COOP=0 (the log line of the context says which)\n");
        return;
    }
    static const struct { int n, hw, c; } shapes[] = {{64, 1024, 64}, {50, 1000, 40}, {3, 7, 130}};
    static const char *names[COOP_OUTS] = {"y", "x + bias written back", "save_mean", "save_invstd",
                                           "running_mean", "running_var", "dx", "dy kept", "dgamma", "dbeta"};
    for (size_t s = 0; s < sizeof shapes / sizeof *shapes; s++) {
        int n = shapes[s].n, hw = shapes[s].hw, c = shapes[s].c;
        size_t nx = (size_t)n * hw * c;
        float *x = rand_vec(nx, -2, 3), *z = rand_vec(nx, -1, 1), *dy = rand_vec(nx, -1, 1);
        float *bias = rand_vec(c, -0.5f, 0.5f), *g = rand_vec(c, 0.5f, 1.5f), *b = rand_vec(c, -0.5f, 0.5f);
        float *out[2][COOP_OUTS];
        for (int run = 0; run < 2; run++) { /* 0: cooperative, 1: two kernels */
            cuda_ctx_bn_coop(ctx, run == 0);
            bn_coop_case(ctx, n, hw, c, x, bias, z, g, b, dy, out[run]);
        }
        cuda_ctx_bn_coop(ctx, 1);
        for (int k = 0; k < COOP_OUTS; k++) {
            char what[160];
            size_t cnt = k < 2 || k == 6 || k == 7 ? nx : (size_t)c;
            snprintf(what, sizeof what, "batch norm %s %d x %d x %d: cooperative %s = two kernels, bit for bit",
                     cuda_ctx_bf16(ctx) ? "bf16" : "fp32", n, hw, c, names[k]);
            expect_true(what, memcmp(out[0][k], out[1][k], cnt * sizeof(float)) == 0);
            free(out[0][k]);
            free(out[1][k]);
        }
        free(x); free(z); free(dy); free(bias); free(g); free(b);
    }
}

/* bn_coop_case with the cooperative grid caps set above what fits for the forward
 * (refuse_fwd: refused at once, the backward then two kernels although it fits) or
 * for the backward only (the forward cooperative, the backward refused half-way
 * through the step), the real caps back after; returns whether the context turned
 * to two kernels, and leaves it on again. */
static int bn_coop_case_refused(CudaCtx *ctx, int refuse_fwd, int n, int hw, int c, const float *x,
                                const float *bias, const float *z, const float *g, const float *b,
                                const float *dy, float **out) {
    int fwd = 0, bwd = 0;
    cuda_ctx_bn_coop_caps(ctx, &fwd, &bwd); /* the real caps out */
    int cap_fwd = refuse_fwd ? 1 << 30 : fwd, cap_bwd = refuse_fwd ? bwd : 1 << 30;
    cuda_ctx_bn_coop_caps(ctx, &cap_fwd, &cap_bwd); /* a cap above any GPU: refused */
    bn_coop_case(ctx, n, hw, c, x, bias, z, g, b, dy, out);
    int turned = !cuda_ctx_bn_coop(ctx, -1);
    cuda_ctx_bn_coop_caps(ctx, &fwd, &bwd); /* the real caps back */
    cuda_ctx_bn_coop(ctx, 1);
    return turned;
}

/* A cooperative launch the GPU refuses (a grid cap above what fits, as under MPS),
 * the forward's or only the backward's, turns the context to two kernels, with the
 * two kernels' results bit for bit. */
static void test_bn_coop_refused(CudaCtx *ctx) {
    if (!cuda_ctx_bn_coop(ctx, -1)) {
        printf("SKIP cooperative launch refused: the cooperative batch norm is off here\n");
        return;
    }
    const int n = 64, hw = 1024, c = 64; /* 16,384 blocks of elements: never all resident */
    size_t nx = (size_t)n * hw * c;
    float *x = rand_vec(nx, -2, 3), *z = rand_vec(nx, -1, 1), *dy = rand_vec(nx, -1, 1);
    float *bias = rand_vec(c, -0.5f, 0.5f), *g = rand_vec(c, 0.5f, 1.5f), *b = rand_vec(c, -0.5f, 0.5f);
    float *two[COOP_OUTS], *out[COOP_OUTS];
    cuda_ctx_bn_coop(ctx, 0);
    bn_coop_case(ctx, n, hw, c, x, bias, z, g, b, dy, two);
    cuda_ctx_bn_coop(ctx, 1);
    const char *type = cuda_ctx_bf16(ctx) ? "bf16" : "fp32";
    for (int refuse_fwd = 1; refuse_fwd >= 0; refuse_fwd--) {
        const char *which = refuse_fwd ? "forward" : "backward (after a cooperative forward)";
        char what[200];
        int turned = bn_coop_case_refused(ctx, refuse_fwd, n, hw, c, x, bias, z, g, b, dy, out);
        snprintf(what, sizeof what, "batch norm %s: a refused cooperative %s turns the context to two kernels",
                 type, which);
        expect_true(what, turned);
        int same = 1;
        for (int k = 0; k < COOP_OUTS; k++) {
            size_t cnt = k < 2 || k == 6 || k == 7 ? nx : (size_t)c;
            same &= memcmp(out[k], two[k], cnt * sizeof(float)) == 0;
            free(out[k]);
        }
        snprintf(what, sizeof what, "batch norm %s: after a refused cooperative %s: the two kernels' "
                 "results, bit for bit", type, which);
        expect_true(what, same);
    }
    for (int k = 0; k < COOP_OUTS; k++) free(two[k]);
    free(x); free(z); free(dy); free(bias); free(g); free(b);
}

/* ema_update_cuda against ema.h's CPU loop, bit for bit, over a few updates. */
static void test_ema(CudaCtx *ctx) {
    const size_t n = 3001;
    const float decays[] = {0.5f, 0.9f, 0.9999f};
    float *avg = xmalloc(n * sizeof(float)), *val = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) avg[i] = (float)((double)(rng_u64(7, 1, i) >> 40) / 16777216.0 - 0.5);
    float *gavg = dev_from(ctx, avg, n);
    for (int k = 0; k < 3; k++) {
        for (size_t i = 0; i < n; i++) val[i] = (float)((double)(rng_u64(7, 2 + k, i) >> 40) / 4194304.0 - 2.0);
        float *gval = dev_from(ctx, val, n), *gdecay = dev_from(ctx, &decays[k], 1);
        ema_update(n, avg, val, decays[k]);
        ema_update_cuda(ctx, n, gavg, gval, gdecay);
        cuda_ctx_sync(ctx); /* cudaFree "may" synchronise (runtime API): the kernel reads both */
        cuda_free(gval);
        cuda_free(gdecay);
    }
    float *got = host_from(ctx, gavg, n);
    expect_true("ema_update_cuda: bit-identical to the CPU's ema_update", memcmp(got, avg, n * sizeof(float)) == 0);
    free(got);
    cuda_free(gavg);
    free(avg);
    free(val);
}

/* augment_batch_cuda against augment.c's augment_batch, bit for bit: in a bf16
 * context the CPU's values rounded once to bfloat16 (the kernel's act_store). The
 * output is filled with NaNs before every launch, so a pixel the kernel does not
 * write (a cutout square left as it was: the engine's batch buffer holds the
 * previous batch) cannot pass for a 0. */
static void test_augment(CudaCtx *ctx, int c, int pad, int flip, int cutout) {
    const int h = 12, w = 10, count = 40, n = 17;
    size_t rec = (size_t)h * w * c;
    uint8_t *px = xmalloc((size_t)count * rec);
    int32_t *lab = xmalloc(count * sizeof(int32_t));
    for (size_t i = 0; i < (size_t)count * rec; i++) px[i] = (uint8_t)(rng_u64(3, 4, i) & 255);
    for (int i = 0; i < count; i++) lab[i] = i % 10;
    int64_t idx[17];
    for (int i = 0; i < n; i++) idx[i] = (i * 7 + 3) % count;
    AugmentSpec s;
    memset(&s, 0, sizeof s);
    s.h = h; s.w = w; s.c = c; s.pad = pad; s.flip = flip; s.cutout = cutout; s.seed = 77; s.epoch = 5;
    for (int i = 0; i < 4; i++) {
        s.mean[i] = 0.4f + 0.03f * i;
        s.std[i] = 0.2f + 0.01f * i;
    }
    float *out = xmalloc((size_t)n * rec * sizeof(float));
    int32_t out_lab[17], gout_lab[17];
    augment_batch(&s, px, lab, idx, n, out, out_lab);
    act_round_host(ctx, out, (size_t)n * rec);
    const char *pn = cuda_ctx_bf16(ctx) ? " bf16" : "";
    uint8_t *gpx = cuda_alloc((size_t)count * rec);
    int32_t *glab = cuda_alloc(count * sizeof(int32_t)), *gol = cuda_alloc(n * sizeof(int32_t));
    int64_t *gidx = cuda_alloc(n * sizeof(int64_t)), *gepoch = cuda_alloc(sizeof(int64_t));
    float *gout = cuda_alloc((size_t)n * rec * sizeof(float));
    cuda_upload(ctx, gpx, px, (size_t)count * rec);
    cuda_upload(ctx, glab, lab, count * sizeof(int32_t));
    cuda_upload(ctx, gidx, idx, n * sizeof(int64_t));
    char name[128];
    /* the epoch from the spec, then from device memory (the CUDA-graph path) */
    for (int from_dev = 0; from_dev < 2; from_dev++) {
        cuda_memset_async(ctx, gout, 0xFF, (size_t)n * rec * sizeof(float)); /* NaNs */
        AugmentSpec sd = s;
        if (from_dev) {
            cuda_upload(ctx, gepoch, &s.epoch, sizeof(int64_t));
            sd.epoch = 999;
        }
        augment_batch_cuda(ctx, &sd, gpx, glab, gidx, n, gout, gol, from_dev ? gepoch : NULL, 0);
        float *got = host_act_from(ctx, gout, (size_t)n * rec);
        cuda_download(ctx, gout_lab, gol, n * sizeof(int32_t));
        snprintf(name, sizeof name, "augment%s c=%d pad=%d flip=%d cutout=%d epoch %s: bit-identical", pn,
                 c, pad, flip, cutout, from_dev ? "on device" : "in spec");
        expect_true(name, memcmp(got, out, (size_t)n * rec * sizeof(float)) == 0 &&
                              memcmp(gout_lab, out_lab, sizeof out_lab) == 0);
        free(got);
    }
    /* staged: the batch's records in batch order (as the streaming engine copies
     * them), the crop and flip still keyed by the sample indices */
    uint8_t *staged = xmalloc((size_t)n * rec);
    int32_t staged_lab[17];
    HostSplit split = {.pixels = px, .labels = lab, .count = count};
    host_split_gather(&split, rec, idx, 0, n, staged, staged_lab);
    cuda_upload(ctx, gpx, staged, (size_t)n * rec);
    cuda_upload(ctx, glab, staged_lab, n * sizeof(int32_t));
    cuda_memset_async(ctx, gout, 0xFF, (size_t)n * rec * sizeof(float)); /* NaNs */
    augment_batch_cuda(ctx, &s, gpx, glab, gidx, n, gout, gol, NULL, 1);
    float *got = host_act_from(ctx, gout, (size_t)n * rec);
    cuda_download(ctx, gout_lab, gol, n * sizeof(int32_t));
    snprintf(name, sizeof name, "augment%s c=%d pad=%d flip=%d cutout=%d staged batch: bit-identical", pn,
             c, pad, flip, cutout);
    expect_true(name, memcmp(got, out, (size_t)n * rec * sizeof(float)) == 0 &&
                          memcmp(gout_lab, out_lab, sizeof out_lab) == 0);
    free(got);
    free(staged);
    cuda_free(gpx); cuda_free(glab); cuda_free(gol); cuda_free(gidx); cuda_free(gepoch); cuda_free(gout);
    free(px); free(lab); free(out);
}

/* The bias of a conv (every conv feeds a batch norm here): its gradient is 0 in
 * exact arithmetic, rounding noise on both devices (the CPU sums its float dx, the
 * GPU's table computes the sum from the BN's double sums), so only weight decay
 * moves it for sure. */
static int is_conv_bias(const char *name) {
    size_t len = strlen(name);
    return strstr(name, "conv") && len > 5 && strcmp(name + len - 5, ".bias") == 0;
}

/* Per state_dict tensor of `kind`: the change from base (NULL: from 0) on the GPU
 * against the CPU's, as a relative L2 error with an absolute floor per element: 1e-5,
 * 1e-4 for conv biases (rounding noise of about 1e-7 to 1e-6 per step around the
 * weight decay's 5e-5; a wrong bias gradient, of the order of the other gradients,
 * still fails). Comparing changes, not values, keeps a wrong gradient from hiding
 * behind the size of the weights. */
static void expect_tensors(const char *what, const Model *m, TensorKind kind, const float *got,
                           const float *want, const float *base, double rel) {
    double worst = 0.0;
    const char *worst_name = "-";
    for (int t = 0; t < m->n_tensors; t++) {
        const TensorInfo *ti = &m->tensors[t];
        if (ti->kind != kind) continue;
        double num = 0.0, den = 0.0;
        for (size_t i = ti->offset; i < ti->offset + ti->numel; i++) {
            double b = base ? base[i] : 0.0;
            double dg = got[i] - b, dw = want[i] - b;
            num += (dg - dw) * (dg - dw);
            den += dw * dw;
        }
        double floor = is_conv_bias(ti->name) ? 1e-4 : 1e-5;
        double err = sqrt(num) / (sqrt(den) + floor * sqrt((double)ti->numel));
        if (!(err <= worst)) {
            worst = err;
            worst_name = ti->name;
        }
    }
    int ok = worst <= rel;
    EXPECT(ok, "%s", what);
    printf("%s %s (worst relative error %.3g in %s, limit %.3g)\n", ok ? "ok  " : "FAIL", what, worst,
           worst_name, rel);
}

#include "engine_cases_cuda.h"

static void loader_use_linked_library(void) {
    Dl_info info;
    if (!dladdr((void *)cuda_ctx_create, &info) || !info.dli_fname)
        die("test_ops_cuda: cannot find the path of the linked libcifar-cuda.so");
    setenv("CIFAR_CUDA_LIB", info.dli_fname, 1);
}

int main(int argc, char **argv) {
    log_set_program("test_ops_cuda");
    cifar_cuda_init(cuda_host_api());
    loader_use_linked_library();
    if (engine_cuda_device_count() == 0 && cuda_library_error())
        die("test_ops_cuda: the loader cannot use the linked library: %s", cuda_library_error());
    if (engine_cuda_device_count() == 0)
        return skip(argc, argv, "no usable CUDA device (no driver or no GPU)");
    ops_set_threads(2);
    CudaCtx *ctx = cuda_ctx_create(0, 0, 1, 1);
    test_conv(ctx, (ConvSpec){16, 32, 3, 2, 1}, 4, 8, 8, 1e-4f, "3x3/2 (ops.h contract form)");
    test_op_cases(ctx);
    test_elementwise(ctx);
    test_bn_repeatable(ctx);
    test_bn_backward_keep(ctx);
    test_bn_coop(ctx);
    test_bn_coop_refused(ctx);
    test_conv_backward_acc(ctx, (ConvSpec){16, 32, 3, 1, 1}, 4, 8, 8, 1e-4f, "fp32");
    test_conv_backward_acc(ctx, (ConvSpec){16, 32, 1, 2, 0}, 4, 8, 8, 1e-4f, "fp32");
    test_augment(ctx, 3, 4, 1, 0);
    test_augment(ctx, 1, 2, 1, 0);
    test_augment(ctx, 3, 0, 0, 0);
    test_augment(ctx, 3, 4, 1, 6);  /* cutout: squares clipped at the border too */
    test_augment(ctx, 1, 0, 1, 5);  /* odd side, flip only */
    test_augment(ctx, 3, 0, 0, 30); /* a square larger than the image */
    test_ema(ctx);
    cuda_ctx_free(ctx);

    CudaCtx *t32 = cuda_ctx_create(0, 1, 0, 1);
    test_conv(t32, (ConvSpec){16, 32, 3, 1, 1}, 4, 8, 8, 2e-2f, "tf32");
    cuda_ctx_free(t32);

    test_engine(1, PRECISION_FP32, 2e-3f);
    test_engine(0, PRECISION_FP32, 2e-3f);
    test_engine(1, PRECISION_TF32, 5e-2f);
    test_engine_stream();
    test_engine_stage(PRECISION_FP32, "resident");
    test_engine_stage(PRECISION_FP32, "stream:3");

    /* bf16 last: a cuDNN refusal there (which exits) leaves the results above intact */
    if (bf16_device_ok()) {
        CudaCtx *b16 = cuda_ctx_create(0, 0, 0, 1);
        cuda_ctx_use_bf16(b16);
        test_elementwise(b16);
        test_bn_pool_bf16(b16);
        test_bn_repeatable(b16);
        test_bn_coop(b16); /* the bf16 instances of the cooperative kernels */
        test_bn_coop_refused(b16);
        test_conv_backward_acc(b16, (ConvSpec){16, 32, 3, 1, 1}, 4, 8, 8, 1e-2f, "bf16");
        test_conv_backward_acc(b16, (ConvSpec){16, 32, 1, 2, 0}, 4, 8, 8, 1e-2f, "bf16");
        test_conv(b16, (ConvSpec){16, 32, 3, 1, 1}, 4, 8, 8, 1e-2f, "bf16");
        test_conv(b16, (ConvSpec){3, 16, 3, 1, 1}, 4, 8, 8, 1e-2f, "bf16 stem (3 channels)");
        test_augment(b16, 3, 4, 1, 6); /* augment_kernel<1>: the bf16 store, cutout's 0 included */
        test_augment(b16, 1, 0, 1, 5);
        cuda_ctx_free(b16);
        test_engine(1, PRECISION_BF16, 0.15f);
        test_engine(0, PRECISION_BF16, 0.15f);
        test_engine_stage(PRECISION_BF16, "resident");
    }
    return unit_report("test_ops_cuda");
}
#endif
