/* test_ops.c: unit tests of the CPU op tables (backend-cpu/ops_cpu_impl.h).
 *
 * op_cases.h's table, twice: every backward on the CPU's op table compiled in double
 * (tests/cpu_double.h: the very op bodies of shared/backend-cpu/ops_cpu_impl.h, cpu_*)
 * against central finite differences, and every CPU instruction-set variant against
 * the baseline. Also: one bottleneck block's gradients against finite differences, the
 * convolution against a direct 7-loop reference, the float ops against the double
 * ones, the SGD rule and the CE loss against values computed with PyTorch 1.13, the BN
 * running statistics, the fused BN+ReLU against BN then ReLU bit for bit, and bitwise
 * determinism (two runs, and 1 vs 2 threads).
 *
 * OPS_VERBOSE=1 lists every finite-difference check with its error. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/check.h"
#include "core/settings.h"
#include "backend-cpu/cpu_bf16.h"
#include "backend-cpu/ops_cpu.h"
#include "unit.h"
#include "model/net.h"
#include "cpu_double.h"
#include "op_cases.h"

/* -------------------------------------------------- ISA variants (op_cases.h) */

/* The float table of the instruction-set variant under test (use_isa), else the
 * one the commands use. */
static const NetOps *T;

/* The tables under test: each instruction-set variant, then (TEST_DNNL) the AVX-512
 * one with oneDNN's fp32 convolutions (net_cpu_ops_dnnl), the default where oneDNN loads. */
enum { TEST_DNNL = CPU_ISA_COUNT, TEST_TABLES };

static const NetOps *test_table(int isa) {
    return isa == TEST_DNNL ? net_cpu_ops_dnnl() : net_cpu_ops_isa(isa);
}

/* 0 when the CPU (or the build, or the machine's oneDNN) lacks table isa. */
static int use_isa(int isa) {
    T = test_table(isa);
    return T != NULL;
}

static void use_best_isa(void) { T = net_cpu_ops(); }

/* The case table on every instruction-set variant the CPU has against the
 * baseline, each through its own table. */
static void test_isa_cases(void) {
    OpBackend base = {"cpu-baseline", net_cpu_ops_isa(CPU_ISA_BASELINE), NULL, opc_host_copy,
                      opc_host_copy};
    for (int isa = CPU_ISA_AVX2; isa < TEST_TABLES; isa++) {
        const NetOps *t = test_table(isa);
        if (!t) {
            printf("test_ops: SKIP ISA cases for table %d: this CPU (or oneDNN) lacks it\n", isa);
            continue;
        }
        OpBackend v = {t->name, t, NULL, opc_host_copy, opc_host_copy};
        opc_check_all(&base, &v, 0);
    }
}

/* 1 when CIFAR_CPU_CONV says own. */
static int getenv_own(void) {
    const char *v = getenv("CIFAR_CPU_CONV");
    return v && strcmp(v, "own") == 0;
}

/* The exit status of a child that sets CIFAR_CPU_ISA=value and picks the default
 * table (its stderr to /dev/null: the refusal's one line is the command's). */
static int isa_env_child_status(const char *value) {
    fflush(stdout);
    pid_t pid = fork();
    CHECK_STDIO(pid >= 0, "fork");
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(99);
        setenv("CIFAR_CPU_ISA", value, 1);
        Settings settings; /* afresh: the parent's pick came with the fork */
        settings_from_env(&settings);
        net_cpu_ops_pick(settings.cpu_isa);
        _exit(0);
    }
    int status;
    CHECK_STDIO(waitpid(pid, &status, 0) == pid, "waitpid");
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

/* CIFAR_CPU_ISA forces each variant the CPU has; an unknown name, or a variant the
 * CPU lacks, exits 2 (never a silent fallback to another variant). Each child
 * process picks afresh: a process picks its table once. */
static void test_isa_env(void) {
    static const char *const names[3] = {"generic", "avx2", "avx512"};
    char *saved = getenv("CIFAR_CPU_ISA") ? xstrdup(getenv("CIFAR_CPU_ISA")) : NULL;
    const NetOps *before = net_cpu_ops();
    int best = (int)cpu_isa_best();
    for (int isa = 0; isa <= 2; isa++) {
        int status = isa_env_child_status(names[isa]);
        if (isa > best)
            EXPECT(status == 2, "CIFAR_CPU_ISA=%s on a CPU without it: exit %d, 2 expected",
                   names[isa], status);
        else
            EXPECT(status == 0, "CIFAR_CPU_ISA=%s: exit %d, 0 expected", names[isa], status);
        /* the AVX-512 pick comes with oneDNN's fp32 convs where they load, unless
         * CIFAR_CPU_CONV=own */
        const NetOps *want = isa == CPU_ISA_AVX512 && net_cpu_ops_dnnl() && !getenv_own() ? net_cpu_ops_dnnl()
                                                                                          : net_cpu_ops_isa(isa);
        if (isa <= best)
            EXPECT(net_cpu_ops_pick(isa) == want && net_cpu_ops() == want,
                   "the pick of variant %d is not the table net_cpu_ops() returns", isa);
    }
    if (best == CPU_ISA_AVX512) { /* CIFAR_CPU_CONV=own: the plain table */
        char *conv = getenv("CIFAR_CPU_CONV") ? xstrdup(getenv("CIFAR_CPU_CONV")) : NULL;
        setenv("CIFAR_CPU_CONV", "own", 1);
        EXPECT(net_cpu_ops_pick(CPU_ISA_AVX512) == net_cpu_ops_isa(CPU_ISA_AVX512),
               "CIFAR_CPU_CONV=own: the AVX-512 pick is not the plain table");
        if (conv) setenv("CIFAR_CPU_CONV", conv, 1);
        else unsetenv("CIFAR_CPU_CONV");
        free(conv);
    }
    int status = isa_env_child_status("avx9000");
    EXPECT(status == 2, "CIFAR_CPU_ISA=avx9000: exit %d, 2 expected", status);
    char *conv = getenv("CIFAR_CPU_CONV") ? xstrdup(getenv("CIFAR_CPU_CONV")) : NULL;
    setenv("CIFAR_CPU_CONV", "sgemm", 1); /* a malformed CIFAR_CPU_CONV: exit 2 too */
    status = isa_env_child_status("");
    EXPECT(status == 2, "CIFAR_CPU_CONV=sgemm: exit %d, 2 expected", status);
    if (conv) setenv("CIFAR_CPU_CONV", conv, 1);
    else unsetenv("CIFAR_CPU_CONV");
    free(conv);
    if (saved) setenv("CIFAR_CPU_ISA", saved, 1);
    else unsetenv("CIFAR_CPU_ISA");
    free(saved);
    net_cpu_ops_use(before); /* back to this process's own pick */
}

/* Every backward of the case table on the CPU's op table in double against finite
 * differences. */
static void test_fd_cases(void) {
    OpBackendD cpu = {"cpu-double", &net_cpu_opsD, NULL, opc_host_copy, opc_host_copy};
    opc_fd_all(&cpu);
}

/* ------------------------------------------------------------ utilities */

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;

static double urand(void) { /* splitmix64 -> [0, 1) */
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (double)(z >> 11) / 9007199254740992.0;
}

static double *dvec(size_t n) { return xcalloc(n ? n : 1, sizeof(double)); }
static float *fvec(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }

static double *drand_vec(size_t n, double lo, double hi) {
    double *v = dvec(n);
    for (size_t i = 0; i < n; i++) v[i] = lo + (hi - lo) * urand();
    return v;
}

static float *to_float(const double *v, size_t n) {
    float *f = fvec(n);
    for (size_t i = 0; i < n; i++) f[i] = (float)v[i];
    return f;
}

static double dot(const double *a, const double *b, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

static double max_abs(const double *a, size_t n) {
    double m = 0.0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(a[i]));
    return m;
}

/* max|a - b| / max(max|b|, floor) */
static double rel_err(const double *a, const double *b, size_t n, double floor) {
    double d = 0.0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs(a[i] - b[i]));
    return d / fmax(max_abs(b, n), floor);
}

static double rel_err_f(const float *a, const double *b, size_t n, double floor) {
    double d = 0.0;
    for (size_t i = 0; i < n; i++) d = fmax(d, fabs((double)a[i] - b[i]));
    return d / fmax(max_abs(b, n), floor);
}

/* ---------------------------------------------------------- convolution */

typedef struct {
    ConvSpec cs;
    CpuConvPlan plan; /* the double table's plan for cs on n x h x w */
    int n, h, w, oh, ow;
    double *x, *wt, *b, *y, *r, *ws;
    size_t nx, nw, ny, ws_bytes;
} ConvCase;

static void conv_case_init(ConvCase *c, int cin, int cout, int k, int s, int p, int n, int h,
                           int w) {
    memset(c, 0, sizeof(*c));
    c->cs = (ConvSpec){cin, cout, k, s, p};
    c->n = n;
    c->h = h;
    c->w = w;
    c->oh = conv_out_size(h, k, s, p);
    c->ow = conv_out_size(w, k, s, p);
    c->nx = (size_t)n * h * w * cin;
    c->nw = (size_t)cout * cin * k * k;
    c->ny = (size_t)n * c->oh * c->ow * cout;
    c->x = drand_vec(c->nx, -1, 1);
    c->wt = drand_vec(c->nw, -1, 1);
    c->b = drand_vec((size_t)cout, -1, 1);
    c->y = dvec(c->ny);
    c->r = drand_vec(c->ny, -1, 1);
    c->plan = (CpuConvPlan){c->cs, n, h, w, 1};
    c->ws_bytes = cpu_conv_workspace_bytes(NULL, &c->plan);
    c->ws = dvec(c->ws_bytes / sizeof(double));
}

static void conv_case_free(ConvCase *c) {
    free(c->x);
    free(c->wt);
    free(c->b);
    free(c->y);
    free(c->r);
    free(c->ws);
}

/* Direct convolution, NHWC activations, PyTorch weight layout. */
static void conv_reference(const ConvCase *c, double *y) {
    const ConvSpec *cs = &c->cs;
    for (int i = 0; i < c->n; i++)
        for (int oy = 0; oy < c->oh; oy++)
            for (int ox = 0; ox < c->ow; ox++)
                for (int co = 0; co < cs->cout; co++) {
                    double s = c->b[co];
                    for (int ci = 0; ci < cs->cin; ci++)
                        for (int kh = 0; kh < cs->k; kh++)
                            for (int kw = 0; kw < cs->k; kw++) {
                                int iy = oy * cs->stride - cs->pad + kh;
                                int ix = ox * cs->stride - cs->pad + kw;
                                if (iy < 0 || iy >= c->h || ix < 0 || ix >= c->w) continue;
                                s += c->x[(((size_t)i * c->h + iy) * c->w + ix) * cs->cin + ci] *
                                     c->wt[(((size_t)co * cs->cin + ci) * cs->k + kh) * cs->k + kw];
                            }
                    y[(((size_t)i * c->oh + oy) * c->ow + ox) * cs->cout + co] = s;
                }
}

static double conv_loss(void *ctx) {
    ConvCase *c = ctx;
    cpu_conv_forward(NULL, &c->plan, c->n, c->x, c->wt, c->b, c->y, c->ws, c->ws_bytes);
    return dot(c->y, c->r, c->ny);
}

/* The double forward against the direct reference, the backward with dx NULL, and
 * the float op against the double one in every instruction-set variant (the
 * gradients against finite differences: op_cases.h). */
static void test_conv_one(int cin, int cout, int k, int s, int p, int n, int h, int w) {
    ConvCase c;
    conv_case_init(&c, cin, cout, k, s, p, n, h, w);
    char name[128];
    snprintf(name, sizeof(name), "conv %dx%d s%d p%d %d->%d %dx%dx%d", k, k, s, p, cin, cout, n,
             h, w);

    double *yref = dvec(c.ny);
    conv_reference(&c, yref);
    conv_loss(&c);
    double e = rel_err(c.y, yref, c.ny, 1.0);
    EXPECT(e < 1e-12, "%s: forward differs from the direct reference (rel %.3g)", name, e);

    double *dx = dvec(c.nx), *dw = dvec(c.nw), *db = dvec((size_t)cout);
    cpu_conv_backward(NULL, &c.plan, n, c.x, c.wt, c.r, dx, dw, db, c.ws, c.ws_bytes);

    /* NULL dx (the stem) leaves the parameter gradients unchanged */
    double *dw2 = dvec(c.nw), *db2 = dvec((size_t)cout);
    cpu_conv_backward(NULL, &c.plan, n, c.x, c.wt, c.r, NULL, dw2, db2, c.ws, c.ws_bytes);
    EXPECT(memcmp(dw, dw2, c.nw * sizeof(double)) == 0 &&
               memcmp(db, db2, (size_t)cout * sizeof(double)) == 0,
           "%s: backward with dx NULL gives other parameter gradients", name);

    /* the float op agrees with the double one, in every instruction-set variant */
    float *fx = to_float(c.x, c.nx), *fw = to_float(c.wt, c.nw), *fb = to_float(c.b, cout);
    float *fr = to_float(c.r, c.ny), *fy = fvec(c.ny), *fdx = fvec(c.nx), *fdw = fvec(c.nw);
    float *fdb = fvec((size_t)cout);
    for (int isa = 0; isa < TEST_TABLES; isa++) {
        if (!use_isa(isa)) continue;
        void *plan = T->conv_plan(NULL, &c.cs, n, h, w, 1, 1);
        size_t ws_bytes = T->conv_workspace_bytes(NULL, plan);
        float *fws = fvec(ws_bytes / sizeof(float));
        T->conv_forward(NULL, plan, n, fx, fw, fb, fy, fws, ws_bytes);
        T->conv_backward(NULL, plan, n, fx, fw, fr, fdx, fdw, fdb, fws, ws_bytes);
        T->conv_plan_free(NULL, plan);
        free(fws);
        EXPECT(rel_err_f(fy, yref, c.ny, 1.0) < 1e-5, "%s: float forward (isa %d)", name, isa);
        EXPECT(rel_err_f(fdx, dx, c.nx, 1.0) < 1e-5, "%s: float dx (isa %d)", name, isa);
        EXPECT(rel_err_f(fdw, dw, c.nw, 1.0) < 1e-5, "%s: float dW (isa %d)", name, isa);
        EXPECT(rel_err_f(fdb, db, cout, 1.0) < 1e-5, "%s: float db (isa %d)", name, isa);
    }
    use_best_isa();

    free(fx); free(fw); free(fb); free(fr); free(fy); free(fdx); free(fdw); free(fdb);
    free(dw2); free(db2); free(dx); free(dw); free(db); free(yref);
    conv_case_free(&c);
}

/* At the shapes of op_cases.h's conv cases. */
static void test_conv(void) {
    for (size_t i = 0; i < sizeof opc_cases / sizeof *opc_cases; i++) {
        const OpCase *c = &opc_cases[i];
        if (c->op == OPC_CONV)
            test_conv_one(c->cs.cin, c->cs.cout, c->cs.k, c->cs.stride, c->cs.pad, c->n, c->hw, c->k);
    }
}

/* ------------------------------------------------------------ batchnorm */

typedef struct {
    int rows, c;
    double *x, *g, *b, *y, *r, *mean, *invstd, *rm, *rv;
} BNCase;

static double bn_loss(void *ctx) {
    BNCase *t = ctx;
    cpu_bn_train(NULL, t->rows, 1, t->c, t->x, t->g, t->b, t->y, t->mean, t->invstd, t->rm, t->rv,
                 0.1f, 1e-5f);
    return dot(t->y, t->r, (size_t)t->rows * t->c);
}

/* Random inputs of a rows x c batch norm (x, gamma, beta, the loss weights r) and
 * zeroed outputs, drawn in a fixed order. */
static BNCase bn_case_new(int rows, int c) {
    BNCase t = {rows, c, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL};
    size_t n = (size_t)rows * c;
    t.x = drand_vec(n, -2, 3);
    t.g = drand_vec((size_t)c, 0.5, 1.5);
    t.b = drand_vec((size_t)c, -1, 1);
    t.y = dvec(n);
    t.r = drand_vec(n, -1, 1);
    t.mean = dvec((size_t)c);
    t.invstd = dvec((size_t)c);
    t.rm = dvec((size_t)c);
    t.rv = dvec((size_t)c);
    return t;
}

/* The float batch norm against the double one in every instruction-set variant (the
 * gradients against finite differences: op_cases.h, at the same shapes). */
static void test_batchnorm_float(int rows, int c) {
    BNCase t = bn_case_new(rows, c);
    size_t n = (size_t)rows * c;
    bn_loss(&t);
    double *dx = dvec(n), *dg = dvec((size_t)c), *db = dvec((size_t)c);
    cpu_bn_backward(NULL, rows, 1, c, t.x, t.g, t.mean, t.invstd, t.r, dx, dg, db);

    float *fx = to_float(t.x, n), *fg = to_float(t.g, c), *fb = to_float(t.b, c);
    float *fr = to_float(t.r, n), *fy = fvec(n), *fm = fvec(c), *fi = fvec(c), *frm = fvec(c);
    float *frv = fvec(c), *fdx = fvec(n), *fdg = fvec(c), *fdb = fvec(c);
    for (int isa = 0; isa < TEST_TABLES; isa++) {
        if (!use_isa(isa)) continue;
        T->bn_train(NULL, rows, 1, c, fx, fg, fb, fy, fm, fi, frm, frv, 0.1f, 1e-5f);
        T->bn_backward(NULL, rows, 1, c, fx, fg, fm, fi, fr, fdx, fdg, fdb);
        EXPECT(rel_err_f(fy, t.y, n, 1.0) < 1e-5, "batchnorm: float forward (isa %d)", isa);
        EXPECT(rel_err_f(fdx, dx, n, 1.0) < 1e-5, "batchnorm: float dx (isa %d)", isa);
        EXPECT(rel_err_f(fdg, dg, c, 1.0) < 1e-5, "batchnorm: float dgamma (isa %d)", isa);
        EXPECT(rel_err_f(fdb, db, c, 1.0) < 1e-5, "batchnorm: float dbeta (isa %d)", isa);
    }
    use_best_isa();

    free(fx); free(fg); free(fb); free(fr); free(fy); free(fm); free(fi); free(frm); free(frv);
    free(fdx); free(fdg); free(fdb);
    free(dx); free(dg); free(db);
    free(t.x); free(t.g); free(t.b); free(t.y); free(t.r); free(t.mean); free(t.invstd);
    free(t.rm); free(t.rv);
}

static void test_batchnorm_stats(void) {
    /* one channel, x = 1,2,3,4 (+1000 on the second channel to test the shift):
     * mean 2.5, biased var 1.25, unbiased 5/3 */
    float x[8] = {1, 1001, 2, 1002, 3, 1003, 4, 1004};
    float g[2] = {2, 1}, b[2] = {0.5f, 0}, y[8], mean[2], inv[2];
    float rm[2] = {0, 0}, rv[2] = {1, 1};
    T->bn_train(NULL, 4, 1, 2, x, g, b, y, mean, inv, rm, rv, 0.1f, 1e-5f);
    double want_inv = 1.0 / sqrt(1.25 + 1e-5);
    EXPECT(fabs(mean[0] - 2.5) < 1e-6 && fabs(mean[1] - 1002.5) < 1e-4, "bn: save_mean");
    EXPECT(fabs(inv[0] - want_inv) < 1e-6 && fabs(inv[1] - want_inv) < 1e-5, "bn: save_invstd");
    EXPECT(fabs(rm[0] - 0.25) < 1e-6 && fabs(rm[1] - 100.25) < 1e-4, "bn: running_mean %g %g",
           rm[0], rm[1]);
    double want_rv = 0.9 + 0.1 * 5.0 / 3.0;
    EXPECT(fabs(rv[0] - want_rv) < 1e-6 && fabs(rv[1] - want_rv) < 1e-5,
           "bn: running_var (unbiased) %g, want %g", rv[0], want_rv);
    EXPECT(fabs(y[0] - (2 * (1 - 2.5) * want_inv + 0.5)) < 1e-5, "bn: y[0]");

    /* eval mode uses the running statistics */
    float ye[8];
    T->bn_eval(NULL, 4, 1, 2, x, g, b, rm, rv, 1e-5f, ye);
    double want = 2 * (3 - rm[0]) / sqrt(rv[0] + 1e-5) + 0.5;
    EXPECT(fabs(ye[4] - want) < 1e-5, "bn eval: %g, want %g", ye[4], want);
}

/* ------------------------------------------------ elementwise, pool, linear */

/* The float add, add_relu, relu_backward and relu exactly, and in place. */
static void test_elementwise(void) {
    const size_t n = 300;
    double *da = drand_vec(n, -1, 1), *db = drand_vec(n, -1, 1);
    float *fa = to_float(da, n), *fb = to_float(db, n), *fy = fvec(n);
    T->add(NULL, n, fa, fb, fy);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= fy[i] == fa[i] + fb[i];
    EXPECT(ok, "add");
    T->add_relu(NULL, n, fa, fb, fy);
    T->relu_backward(NULL, n, fy, fy, fy); /* in place: dx = dy where y > 0 */
    ok = 1;
    for (size_t i = 0; i < n; i++) {
        float s = fa[i] + fb[i];
        ok &= fy[i] == (s > 0 ? s : 0);
    }
    EXPECT(ok, "add_relu / relu_backward in place");
    T->relu_forward(NULL, n, fa, fa);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= fa[i] >= 0 && (fa[i] == 0 || fa[i] == (float)da[i]);
    EXPECT(ok, "relu_forward in place");
    free(fa); free(fb); free(fy); free(da); free(db);
}

/* One output of the mean pool and of the linear layer, written out. */
static void test_meanpool(void) {
    const int rows = 3, hw = 5, c = 4;
    double *x = drand_vec((size_t)rows * hw * c, -1, 1), *y = dvec((size_t)rows * c);
    cpu_meanpool_forward(NULL, rows, hw, c, x, y);
    EXPECT(fabs(y[1 * 4 + 2] - (x[20 + 2] + x[24 + 2] + x[28 + 2] + x[32 + 2] + x[36 + 2]) / 5) <
               1e-14,
           "meanpool forward");
    free(x); free(y);
}

static void test_linear(void) {
    const int rows = 5, in = 7, out = 3;
    double *x = drand_vec((size_t)rows * in, -1, 1), *w = drand_vec((size_t)in * out, -1, 1);
    double *bias = drand_vec((size_t)out, -1, 1), *y = dvec((size_t)rows * out);
    cpu_linear_forward(NULL, rows, in, out, x, w, bias, y);
    double want = bias[2];
    for (int j = 0; j < in; j++) want += x[1 * in + j] * w[2 * in + j];
    EXPECT(fabs(y[1 * out + 2] - want) < 1e-13, "linear forward");
    free(x); free(w); free(bias); free(y);
}

/* ------------------------------------------------------------------ loss */

static void test_xent(void) {
    /* PyTorch 1.13: F.cross_entropy([[1,2,.5],[0,-1,3]], [1,0], label_smoothing=0.1) */
    float l[6] = {1, 2, 0.5f, 0, -1, 3};
    int32_t lab[2] = {1, 0};
    int correct = -1;
    float d[6];
    float loss = 0;
    T->xent(NULL, 2, 3, l, lab, 0.1f, d, &loss, &correct);
    EXPECT(fabs(loss - 1.7734596772660207) < 1e-6, "xent: loss %.9g, PyTorch 1.77345968", loss);
    EXPECT(correct == 1, "xent: correct %d, want 1", correct);
    double rowsum = d[0] + d[1] + d[2];
    EXPECT(fabs(rowsum) < 1e-7, "xent: dlogits row sums to 0 (%g)", rowsum);

    /* equal logits: log(k) whatever the smoothing */
    double z[10] = {0};
    int32_t zl = 3;
    double zloss = 0;
    cpu_xent(NULL, 1, 10, z, &zl, 0.3, NULL, &zloss, NULL);
    EXPECT(fabs(zloss - log(10.0)) < 1e-14, "xent: uniform logits give log(k)");
}

/* ------------------------------------------------------------------- SGD */

static void test_sgd(void) {
    /* PyTorch 1.13 SGD(lr=.1, momentum=.9, weight_decay=.1), grads .5 and -.25, two steps */
    static const double want_plain[2][2] = {{0.94, 1.015}, {0.8266, 1.04335}};
    static const double want_nest[2][2] = {{0.886, 1.0285}, {0.725566, 1.0686085}};
    static const double want_buf[2] = {1.134, -0.2835};
    const float lr = 0.1f, half = 0.5f;
    for (int nesterov = 0; nesterov < 2; nesterov++) {
        float p[3] = {1, 1, 1}, g[3] = {0.5f, -0.25f, 0.5f}, buf[3] = {7, 7, 7};
        uint8_t mask[3] = {1, 1, 0};
        for (int step = 0; step < 2; step++) {
            int32_t first = step == 0;
            T->sgd(NULL, 3, p, g, buf, mask, &lr, 0.9f, 0.1f, nesterov, &first);
            const double *want = nesterov ? want_nest[step] : want_plain[step];
            EXPECT(fabs(p[0] - want[0]) < 1e-6 && fabs(p[1] - want[1]) < 1e-6,
                   "sgd nesterov=%d step %d: %.7g %.7g, want %.7g %.7g", nesterov, step, p[0],
                   p[1], want[0], want[1]);
        }
        if (!nesterov)
            EXPECT(fabs(buf[0] - want_buf[0]) < 1e-6 && fabs(buf[1] - want_buf[1]) < 1e-6,
                   "sgd momentum buffer");
        /* no decay on the masked entry: buf .5 then .95; p 1-.05 then -.095 */
        double want2 = nesterov ? 1 - 0.1 * (0.5 + 0.45) - 0.1 * (0.5 + 0.9 * 0.95) : 1 - 0.05 - 0.095;
        EXPECT(fabs(p[2] - want2) < 1e-6, "sgd decay mask: %.7g, want %.7g", p[2], want2);
    }
    float p = 2, g = 1, buf = 0;
    const int32_t first = 1, later = 0;
    T->sgd(NULL, 1, &p, &g, &buf, NULL, &half, 0.0f, 0.0f, 0, &first);
    T->sgd(NULL, 1, &p, &g, &buf, NULL, &half, 0.0f, 0.0f, 0, &later);
    EXPECT(p == 1.0f, "sgd without momentum: %g", p);
}

/* ------------------------------------------------- one bottleneck block */

/* conv1 1x1 -> bn1 -> relu -> conv2 3x3 stride 2 -> bn2 -> relu -> conv3 1x1 -> bn3,
 * plus the shortcut 1x1 stride 2 conv -> bn, add, relu: the seed's first block, its
 * 17 gradients against finite differences of the block's output. Not a case of
 * op_cases.h: the table holds single ops (and the conv -> BN pair), whose gradients
 * it checks one by one; this checks how the ops chain, the gradient of x summed over
 * the main path and the projection. */
#define BLOCK_FD_TOL 1e-6
enum { T_X, T_W1, T_B1, T_W2, T_B2, T_W3, T_B3, T_WP, T_BP, T_G1, T_BE1, T_G2, T_BE2, T_G3,
       T_BE3, T_GP, T_BEP, T_COUNT };
static const char *block_names[T_COUNT] = {
    "x", "conv1.w", "conv1.b", "conv2.w", "conv2.b", "conv3.w", "conv3.b", "proj.w", "proj.b",
    "bn1.gamma", "bn1.beta", "bn2.gamma", "bn2.beta", "bn3.gamma", "bn3.beta", "proj_bn.gamma",
    "proj_bn.beta"};

typedef struct {
    int n, h, w, oh, ow, cin, mid, cout;
    ConvSpec c1, c2, c3, cp;
    CpuConvPlan p1, p2, p3, pp; /* their plans (the double table's) */
    double *t[T_COUNT], *g[T_COUNT];
    size_t len[T_COUNT];
    /* activations: a1 conv1 out, r1 relu(bn1), a2 conv2 out, r2 relu(bn2), a3 conv3 out,
     * n3 bn3 out, ap proj out, np proj bn out, out */
    double *a1, *b1, *r1, *a2, *b2, *r2, *a3, *n3, *ap, *np, *out, *r;
    double *mean[4], *inv[4], *rm, *rv, *ws;
    size_t ws_bytes;
} BlockCase;

static double block_loss(void *ctx) {
    BlockCase *b = ctx;
    size_t rin = (size_t)b->n * b->h * b->w, rout = (size_t)b->n * b->oh * b->ow;
    double **t = b->t;
    cpu_conv_forward(NULL, &b->p1, b->n, t[T_X], t[T_W1], t[T_B1], b->a1, b->ws, b->ws_bytes);
    cpu_bn_train(NULL, (int)rin, 1, b->mid, b->a1, t[T_G1], t[T_BE1], b->b1,
                                    b->mean[0], b->inv[0], b->rm, b->rv, 0.1f, 1e-5f);
    cpu_relu_forward(NULL, rin * b->mid, b->b1, b->r1);
    cpu_conv_forward(NULL, &b->p2, b->n, b->r1, t[T_W2], t[T_B2], b->a2, b->ws, b->ws_bytes);
    cpu_bn_train(NULL, (int)rout, 1, b->mid, b->a2, t[T_G2], t[T_BE2], b->b2,
                                    b->mean[1], b->inv[1], b->rm, b->rv, 0.1f, 1e-5f);
    cpu_relu_forward(NULL, rout * b->mid, b->b2, b->r2);
    cpu_conv_forward(NULL, &b->p3, b->n, b->r2, t[T_W3], t[T_B3], b->a3, b->ws, b->ws_bytes);
    cpu_bn_train(NULL, (int)rout, 1, b->cout, b->a3, t[T_G3], t[T_BE3], b->n3,
                                    b->mean[2], b->inv[2], b->rm, b->rv, 0.1f, 1e-5f);
    cpu_conv_forward(NULL, &b->pp, b->n, t[T_X], t[T_WP], t[T_BP], b->ap, b->ws, b->ws_bytes);
    cpu_bn_train(NULL, (int)rout, 1, b->cout, b->ap, t[T_GP], t[T_BEP], b->np,
                                    b->mean[3], b->inv[3], b->rm, b->rv, 0.1f, 1e-5f);
    cpu_add_relu(NULL, rout * b->cout, b->n3, b->np, b->out);
    return dot(b->out, b->r, rout * b->cout);
}

static void block_backward(BlockCase *b) {
    size_t rin = (size_t)b->n * b->h * b->w, rout = (size_t)b->n * b->oh * b->ow;
    size_t big = rin * (size_t)(b->cout > b->cin ? b->cout : b->cin);
    double **t = b->t, **g = b->g;
    double *dpre = dvec(big), *d1 = dvec(big), *d2 = dvec(big), *dx2 = dvec(big);
    cpu_relu_backward(NULL, rout * b->cout, b->out, b->r, dpre);
    /* main path */
    cpu_bn_backward(NULL, (int)rout, 1, b->cout, b->a3, t[T_G3], b->mean[2], b->inv[2], dpre,
                               d1, g[T_G3], g[T_BE3]);
    cpu_conv_backward(NULL, &b->p3, b->n, b->r2, t[T_W3], d1, d2, g[T_W3], g[T_B3],
                          b->ws, b->ws_bytes);
    cpu_relu_backward(NULL, rout * b->mid, b->r2, d2, d2);
    cpu_bn_backward(NULL, (int)rout, 1, b->mid, b->a2, t[T_G2], b->mean[1], b->inv[1], d2, d1,
                               g[T_G2], g[T_BE2]);
    cpu_conv_backward(NULL, &b->p2, b->n, b->r1, t[T_W2], d1, d2, g[T_W2], g[T_B2],
                          b->ws, b->ws_bytes);
    cpu_relu_backward(NULL, rin * b->mid, b->r1, d2, d2);
    cpu_bn_backward(NULL, (int)rin, 1, b->mid, b->a1, t[T_G1], b->mean[0], b->inv[0], d2, d1,
                               g[T_G1], g[T_BE1]);
    cpu_conv_backward(NULL, &b->p1, b->n, t[T_X], t[T_W1], d1, g[T_X], g[T_W1],
                          g[T_B1], b->ws, b->ws_bytes);
    /* shortcut */
    cpu_bn_backward(NULL, (int)rout, 1, b->cout, b->ap, t[T_GP], b->mean[3], b->inv[3], dpre,
                               d1, g[T_GP], g[T_BEP]);
    cpu_conv_backward(NULL, &b->pp, b->n, t[T_X], t[T_WP], d1, dx2, g[T_WP], g[T_BP],
                          b->ws, b->ws_bytes);
    cpu_add(NULL, rin * b->cin, g[T_X], dx2, g[T_X]);
    free(dpre); free(d1); free(d2); free(dx2);
}

static void test_block(void) {
    BlockCase b;
    memset(&b, 0, sizeof(b));
    b.n = 3; b.h = 7; b.w = 6; b.cin = 4; b.mid = 3; b.cout = 5;
    b.c1 = (ConvSpec){b.cin, b.mid, 1, 1, 0};
    b.c2 = (ConvSpec){b.mid, b.mid, 3, 2, 1};
    b.c3 = (ConvSpec){b.mid, b.cout, 1, 1, 0};
    b.cp = (ConvSpec){b.cin, b.cout, 1, 2, 0};
    b.oh = conv_out_size(b.h, 3, 2, 1);
    b.ow = conv_out_size(b.w, 3, 2, 1);
    size_t rin = (size_t)b.n * b.h * b.w, rout = (size_t)b.n * b.oh * b.ow;
    size_t len[T_COUNT] = {rin * b.cin, (size_t)b.cin * b.mid, (size_t)b.mid,
                           (size_t)b.mid * b.mid * 9, (size_t)b.mid, (size_t)b.mid * b.cout,
                           (size_t)b.cout, (size_t)b.cin * b.cout, (size_t)b.cout,
                           (size_t)b.mid, (size_t)b.mid, (size_t)b.mid, (size_t)b.mid,
                           (size_t)b.cout, (size_t)b.cout, (size_t)b.cout, (size_t)b.cout};
    for (int i = 0; i < T_COUNT; i++) {
        b.len[i] = len[i];
        b.t[i] = (i >= T_G1 && (i - T_G1) % 2 == 0) ? drand_vec(len[i], 0.5, 1.5)
                                                     : drand_vec(len[i], -1, 1);
        b.g[i] = dvec(len[i]);
    }
    size_t big = rin * (size_t)(b.cout > b.cin ? b.cout : b.cin);
    b.a1 = dvec(big); b.b1 = dvec(big); b.r1 = dvec(big); b.a2 = dvec(big); b.b2 = dvec(big);
    b.r2 = dvec(big); b.a3 = dvec(big); b.n3 = dvec(big); b.ap = dvec(big); b.np = dvec(big);
    b.out = dvec(big);
    b.r = drand_vec(rout * b.cout, -1, 1);
    for (int i = 0; i < 4; i++) {
        b.mean[i] = dvec(8);
        b.inv[i] = dvec(8);
    }
    b.rm = dvec(8);
    b.rv = dvec(8);
    b.p1 = (CpuConvPlan){b.c1, b.n, b.h, b.w, 1};
    b.p2 = (CpuConvPlan){b.c2, b.n, b.h, b.w, 1};
    b.p3 = (CpuConvPlan){b.c3, b.n, b.oh, b.ow, 1};
    b.pp = (CpuConvPlan){b.cp, b.n, b.h, b.w, 1};
    const CpuConvPlan *plans[4] = {&b.p1, &b.p2, &b.p3, &b.pp};
    for (int i = 0; i < 4; i++) {
        size_t bytes = cpu_conv_workspace_bytes(NULL, (void *)plans[i]);
        if (bytes > b.ws_bytes) b.ws_bytes = bytes;
    }
    b.ws = dvec(b.ws_bytes / sizeof(double) + 1);

    block_loss(&b);
    block_backward(&b);
    for (int i = 0; i < T_COUNT; i++) {
        char what[64];
        snprintf(what, sizeof(what), "bottleneck block d%s", block_names[i]);
        opc_fd_check(what, block_loss, &b, b.t[i], b.g[i], b.len[i], BLOCK_FD_TOL);
    }
    for (int i = 0; i < T_COUNT; i++) {
        free(b.t[i]);
        free(b.g[i]);
    }
    free(b.a1); free(b.b1); free(b.r1); free(b.a2); free(b.b2); free(b.r2); free(b.a3);
    free(b.n3); free(b.ap); free(b.np); free(b.out); free(b.r);
    for (int i = 0; i < 4; i++) {
        free(b.mean[i]);
        free(b.inv[i]);
    }
    free(b.rm); free(b.rv); free(b.ws);
}

/* ------------------------------------------------------------ determinism */

typedef struct {
    float *y, *dx, *dw, *db, *bny, *bndx, *bndg, *bndb;
} DetOut;

/* A seed-shaped conv + BN forward/backward in float; outputs compared bitwise. */
static void det_run(const ConvSpec *cs, int n, int h, int w, const float *x, const float *wt,
                    const float *b, const float *dy, DetOut *o) {
    size_t rows = (size_t)n * conv_out_size(h, cs->k, cs->stride, cs->pad) *
                  conv_out_size(w, cs->k, cs->stride, cs->pad);
    void *plan = T->conv_plan(NULL, cs, n, h, w, 1, 1);
    size_t ws_bytes = T->conv_workspace_bytes(NULL, plan);
    float *ws = fvec(ws_bytes / sizeof(float));
    float g[64], be[64], m[64], inv[64], rm[64] = {0}, rv[64] = {0};
    for (int i = 0; i < 64; i++) {
        g[i] = 1.0f + 0.01f * i;
        be[i] = 0.02f * i;
    }
    T->conv_forward(NULL, plan, n, x, wt, b, o->y, ws, ws_bytes);
    T->conv_backward(NULL, plan, n, x, wt, dy, o->dx, o->dw, o->db, ws, ws_bytes);
    T->bn_train(NULL, (int)rows, 1, cs->cout, o->y, g, be, o->bny, m, inv, rm, rv, 0.1f, 1e-5f);
    T->bn_backward(NULL, (int)rows, 1, cs->cout, o->y, g, m, inv, dy, o->bndx, o->bndg, o->bndb);
    T->conv_plan_free(NULL, plan);
    free(ws);
}

static int det_equal(const DetOut *a, const DetOut *b, size_t ny, size_t nx, size_t nw, int c) {
    return !memcmp(a->y, b->y, ny * 4) && !memcmp(a->dx, b->dx, nx * 4) &&
           !memcmp(a->dw, b->dw, nw * 4) && !memcmp(a->db, b->db, (size_t)c * 4) &&
           !memcmp(a->bny, b->bny, ny * 4) && !memcmp(a->bndx, b->bndx, ny * 4) &&
           !memcmp(a->bndg, b->bndg, (size_t)c * 4) && !memcmp(a->bndb, b->bndb, (size_t)c * 4);
}

static void test_determinism(void) {
    ConvSpec cs = {16, 16, 3, 1, 1};
    int n = 67, h = 8, w = 8; /* the oneDNN tables' tiles: 64 images, then 3 alone */
    size_t nx = (size_t)n * h * w * 16, ny = nx, nw = 16 * 16 * 9;
    double *dx = drand_vec(nx, -1, 1), *dwt = drand_vec(nw, -0.1, 0.1), *dy = drand_vec(ny, -1, 1);
    float *x = to_float(dx, nx), *wt = to_float(dwt, nw), *fdy = to_float(dy, ny);
    float b[16] = {0};
    DetOut o[3];
    for (int k = 0; k < 3; k++) {
        o[k].y = fvec(ny); o[k].dx = fvec(nx); o[k].dw = fvec(nw); o[k].db = fvec(16);
        o[k].bny = fvec(ny); o[k].bndx = fvec(ny); o[k].bndg = fvec(16); o[k].bndb = fvec(16);
    }
    int threads = ops_threads();
    ops_set_threads(2);
    det_run(&cs, n, h, w, x, wt, b, fdy, &o[0]);
    det_run(&cs, n, h, w, x, wt, b, fdy, &o[1]);
    ops_set_threads(1);
    det_run(&cs, n, h, w, x, wt, b, fdy, &o[2]);
    ops_set_threads(threads);
    EXPECT(det_equal(&o[0], &o[1], ny, nx, nw, 16), "determinism: two runs differ");
    EXPECT(det_equal(&o[0], &o[2], ny, nx, nw, 16), "determinism: 1 and 2 threads differ");
    if (T != net_cpu_ops_isa(CPU_ISA_AVX512) && net_cpu_ops_isa(CPU_ISA_AVX512)) {
        /* the default table is oneDNN's: its tiles and single images against the own convs */
        const NetOps *t = T;
        T = net_cpu_ops_isa(CPU_ISA_AVX512);
        det_run(&cs, n, h, w, x, wt, b, fdy, &o[1]);
        T = t;
        const float *got[] = {o[0].y, o[0].dx, o[0].dw, o[0].db}, *want[] = {o[1].y, o[1].dx, o[1].dw, o[1].db};
        const size_t len[] = {ny, nx, nw, 16};
        for (int k = 0; k < 4; k++) {
            double *wd = xmalloc(len[k] * sizeof(double));
            for (size_t i = 0; i < len[k]; i++) wd[i] = want[k][i];
            EXPECT(rel_err_f(got[k], wd, len[k], 1.0) < 1e-5, "%s against the own convs (67 images): output %d off",
                   t->name, k);
            free(wd);
        }
    }
    for (int k = 0; k < 3; k++) {
        free(o[k].y); free(o[k].dx); free(o[k].dw); free(o[k].db);
        free(o[k].bny); free(o[k].bndx); free(o[k].bndg); free(o[k].bndb);
    }
    free(dx); free(dwt); free(dy); free(x); free(wt); free(fdy);
}

/* ------------------------------------------------- fused batchnorm + relu */

static int same_bits(const float *a, const float *b, size_t n) {
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* The fused float ops against bn_train + relu_forward and relu_backward +
 * bn_backward, bit for bit, in every variant, with a NaN
 * and a zero gradient where y is clipped; plus dx in place (dx == dy). */
static void test_bn_relu_equal(int rows, int c) {
    size_t n = (size_t)rows * c;
    double *dx0 = drand_vec(n, -2, 3), *dg0 = drand_vec(c, 0.5, 1.5), *db0 = drand_vec(c, -1, 1);
    double *dr0 = drand_vec(n, -1, 1);
    float *x = to_float(dx0, n), *g = to_float(dg0, c), *b = to_float(db0, c);
    float *dy = to_float(dr0, n);
    float *y1 = fvec(n), *y2 = fvec(n), *m1 = fvec(c), *m2 = fvec(c), *i1 = fvec(c), *i2 = fvec(c);
    float *rm1 = fvec(c), *rm2 = fvec(c), *rv1 = fvec(c), *rv2 = fvec(c);
    float *dx1 = fvec(n), *dx2 = fvec(n), *dg1 = fvec(c), *dg2 = fvec(c), *db1 = fvec(c);
    float *db2 = fvec(c), *mask = fvec(n);
    for (int isa = 0; isa < TEST_TABLES; isa++) {
        if (!use_isa(isa)) continue;
        for (int ch = 0; ch < c; ch++) rm1[ch] = rm2[ch] = 0.5f, rv1[ch] = rv2[ch] = 2.0f;
        T->bn_train(NULL, rows, 1, c, x, g, b, y1, m1, i1, rm1, rv1, 0.1f, 1e-5f);
        T->relu_forward(NULL, n, y1, y1);
        T->bn_relu_train(NULL, rows, 1, c, x, g, b, y2, m2, i2, rm2, rv2, 0.1f, 1e-5f);
        EXPECT(same_bits(y1, y2, n), "bn_relu forward != bn + relu (isa %d)", isa);
        EXPECT(same_bits(m1, m2, c) && same_bits(i1, i2, c) && same_bits(rm1, rm2, c) &&
                   same_bits(rv1, rv2, c),
               "bn_relu forward statistics differ (isa %d)", isa);
        /* a NaN input: relu_forward lets it through, and so must the fused op */
        float keep = x[n / 2];
        x[n / 2] = NAN;
        T->bn_train(NULL, rows, 1, c, x, g, b, y1, m1, i1, rm1, rv1, 0.1f, 1e-5f);
        T->relu_forward(NULL, n, y1, y1);
        T->bn_relu_train(NULL, rows, 1, c, x, g, b, y2, m2, i2, rm2, rv2, 0.1f, 1e-5f);
        EXPECT(isnan(y1[n / 2]) && isnan(y2[n / 2]) && same_bits(y1, y2, n),
               "bn_relu forward with a NaN != bn + relu (isa %d)", isa);
        x[n / 2] = keep;
        T->bn_relu_train(NULL, rows, 1, c, x, g, b, y2, m2, i2, rm2, rv2, 0.1f, 1e-5f);

        T->relu_backward(NULL, n, y2, dy, mask);
        T->bn_backward(NULL, rows, 1, c, x, g, m2, i2, mask, dx1, dg1, db1);
        T->bn_relu_backward(NULL, rows, 1, c, x, y2, g, m2, i2, dy, dx2, dg2, db2);
        EXPECT(same_bits(dx1, dx2, n), "bn_relu backward dx != relu + bn (isa %d)", isa);
        EXPECT(same_bits(dg1, dg2, c) && same_bits(db1, db2, c),
               "bn_relu backward dgamma/dbeta != relu + bn (isa %d)", isa);
        memcpy(dx2, dy, n * sizeof(float));
        T->bn_relu_backward(NULL, rows, 1, c, x, y2, g, m2, i2, dx2, dx2, dg2, db2);
        EXPECT(same_bits(dx1, dx2, n), "bn_relu backward in place (isa %d)", isa);
        T->bn_relu_backward(NULL, rows, 1, c, x, y2, g, m2, i2, dy, NULL, dg2, db2);
        EXPECT(same_bits(dg1, dg2, c) && same_bits(db1, db2, c),
               "bn_relu backward without dx (isa %d)", isa);
    }
    use_best_isa();
    free(dx0); free(dg0); free(db0); free(dr0); free(x); free(g); free(b); free(dy);
    free(y1); free(y2); free(m1); free(m2); free(i1); free(i2); free(rm1); free(rm2);
    free(rv1); free(rv2); free(dx1); free(dx2); free(dg1); free(dg2); free(db1); free(db2);
    free(mask);
}

int main(void) {
    log_set_program("test_ops");
    use_best_isa();
    printf("test_ops: CPU op table %s (variant %d: 0 baseline, 1 AVX2, 2 AVX-512), %d threads\n",
           T->name, (int)cpu_isa_best(), ops_threads());
    test_isa_env();
    test_conv();
    test_batchnorm_float(37, 3);
    test_batchnorm_float(1500, 5); /* several reduction blocks */
    test_batchnorm_stats();
    test_bn_relu_equal(37, 3);
    test_bn_relu_equal(3000, 24);
    test_elementwise();
    test_meanpool();
    test_linear();
    for (int isa = 0; isa < TEST_TABLES; isa++) /* the float loss and optimizer in every variant */
        if (use_isa(isa)) {
            test_xent();
            test_sgd();
        }
    use_best_isa();
    test_block();
    test_determinism();
    test_isa_cases();
    test_fd_cases();
    return unit_report("test_ops");
}
