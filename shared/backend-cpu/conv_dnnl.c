/* conv_dnnl.c: convolutions through oneDNN (Debian's libdnnl-dev 2.6, the library
 * PyTorch's CPU convolutions use; its kernels picked by oneDNN for the running CPU:
 * AVX-512, AVX512-BF16, AMX), for two tables of cpu_bf16.h: the bf16 table's, and the
 * fp32 AVX-512 table's (net_cpu_ops_dnnl: every layer, fp32 activations and weights,
 * fp32 accumulation). Built with CIFAR_DNNL only (the Makefile probes oneDNN).
 *
 * bf16 precision: the activations (x, y, dy, dx) are bf16 in the first half of their
 * fp32-sized buffers, as every op of the bf16 table keeps them (ops_cpu_bf16.c); the
 * conv reads x and dy as they are, rounds the fp32 weight to bf16 (nearest even) in
 * oneDNN's reorder, accumulates in fp32 and rounds y and dx to bf16 (nearest even)
 * as oneDNN writes them; dW is fp32, the bias fp32, and its gradient is oneDNN's
 * fp32 sum of the bf16 dy per tile (in the weight-gradient pass; for pointwise convs,
 * whose gradients are matmuls, bias_grad's), the tiles added in double. The bf16
 * table's conv_backward_acc (its folded block backward, net_ops.h) adds each tile's dx
 * into dx from a per-thread copy, rounded as the table's add rounds.
 *
 * Determinism (net_ops.h: bit-identical for any thread count): the batch is cut into
 * tiles of `tile` images fixed by the shapes (the remainder one image at a time); each
 * tile runs one oneDNN primitive made for its image count on one thread (oneDNN runs
 * single-threaded inside the team's parallel region, and its primitives are made with
 * one thread, so their blocking does not follow the thread count); the weight
 * gradient is one partial per tile, summed in tile order. Which thread runs a tile
 * changes nothing. */
#ifdef CIFAR_DNNL
#include <dnnl.h>
#include <dnnl_debug.h>
#include <dlfcn.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-cpu/cpu_bf16.h"
#include "backend-cpu/ops_cpu.h"
#include "backend-cuda/bf16.h"
#include "core/check.h"

#define DNNL_CHECK(call)                                                                       \
    do {                                                                                       \
        dnnl_status_t st_ = (call);                                                            \
        if (st_ != dnnl_success)                                                               \
            die("oneDNN: %s: %s ---> HINT: CIFAR_CPU_CONV=own with --precision fp32 runs without oneDNN", \
                #call, D.dnnl_status2str(st_));                                                  \
    } while (0)

/* oneDNN is loaded at run time, as the MPI, Gloo and CUDA libraries are: a binary
 * built with its headers runs where libdnnl2 is absent (fp32 with the own convs), and
 * --precision bf16 then says why (cpu_dnnl_load_error). CIFAR_DNNL_LIB names another
 * file. */
#define DNNL_FUNCTIONS(X) \
    X(dnnl_convolution_backward_data_desc_init) \
    X(dnnl_convolution_backward_weights_desc_init) \
    X(dnnl_convolution_forward_desc_init) \
    X(dnnl_engine_create) \
    X(dnnl_matmul_desc_init) \
    X(dnnl_get_effective_cpu_isa) \
    X(dnnl_memory_create) \
    X(dnnl_memory_desc_get_size) \
    X(dnnl_memory_desc_init_by_strides) \
    X(dnnl_memory_desc_init_by_tag) \
    X(dnnl_memory_destroy) \
    X(dnnl_primitive_attr_create) \
    X(dnnl_primitive_attr_destroy) \
    X(dnnl_primitive_attr_set_scratchpad_mode) \
    X(dnnl_primitive_create) \
    X(dnnl_primitive_desc_create) \
    X(dnnl_primitive_desc_destroy) \
    X(dnnl_primitive_desc_query) \
    X(dnnl_primitive_desc_query_md) \
    X(dnnl_primitive_destroy) \
    X(dnnl_primitive_execute) \
    X(dnnl_reorder_primitive_desc_create) \
    X(dnnl_status2str) \
    X(dnnl_stream_create) \
    X(dnnl_stream_wait) \
    X(dnnl_version)

#define DNNL_POINTER(name) __typeof__(&name) name;
static struct {
    DNNL_FUNCTIONS(DNNL_POINTER)
} D;
#undef DNNL_POINTER

static char g_load_error[512];

/* Loads the library and every function above once; "" when it worked. */
static const char *dnnl_load(void) {
    static int tried;
    if (__atomic_load_n(&tried, __ATOMIC_ACQUIRE)) return g_load_error;
    const char *path = getenv("CIFAR_DNNL_LIB");
    if (!path || !*path) path = "libdnnl.so.2";
    void *lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(g_load_error, sizeof g_load_error, "cannot load oneDNN (%s: %s; Debian's libdnnl2)",
                 path, dlerror());
    } else {
#define DNNL_RESOLVE(name)                                                                    \
        if (!g_load_error[0] && !(*(void **)&D.name = dlsym(lib, #name)))                      \
            snprintf(g_load_error, sizeof g_load_error, "%s lacks %s (oneDNN 2.x expected)", path, #name);
        DNNL_FUNCTIONS(DNNL_RESOLVE)
#undef DNNL_RESOLVE
    }
    __atomic_store_n(&tried, 1, __ATOMIC_RELEASE);
    return g_load_error;
}

const char *cpu_dnnl_load_error(void) {
    const char *e = dnnl_load();
    return e[0] ? e : NULL;
}

static dnnl_engine_t g_engine;
static char g_backend[96] = "oneDNN";

/* The primitives of one image count. */
typedef struct {
    dnnl_primitive_t fwd, bwd_data, bwd_w;     /* bwd_*: NULL when not planned */
    dnnl_primitive_t w_fwd_reorder, w_bd_reorder; /* PyTorch's fp32 weight -> its layout and type */
    dnnl_primitive_t dw_reorder; /* bwd_w's fp32 blocked dW -> PyTorch's layout (exact) */
    dnnl_memory_desc_t xa, ya, dya, dxa, w32, w_fwd, w_bd, dw32, dw_any, bias; /* *a: activations */
    /* bwd_w as a matmul (1x1 convs of stride 1, mm_w set): dW[cout][cin] = dy^T x, dy^T
     * read through its strides, dW written in PyTorch's layout (no reorder) */
    int mm_w;
    dnnl_memory_desc_t mm_dyt, mm_x, mm_dw;
    /* bwd_data as a matmul (pointwise convs where oneDNN runs that matmul on AMX, mm_d
     * set): dx[px][cin] = dy[px][cout] W[cout][cin] */
    int mm_d;
    dnnl_memory_desc_t mm_dy, mm_dx;
    dnnl_memory_desc_t w_bd_src; /* what w_bd_reorder reads: PyTorch's fp32 weight */
    void *w_fwd_buf, *w_bd_buf;                /* the weight in that layout, per call */
    size_t scratch_bytes;
} DnnlPass;

typedef struct {
    ConvSpec cs;
    int max_n, h, w, oh, ow, need_dx, backward;
    int tile;          /* images per tile */
    int npass;         /* 2 when tile > 1: pass[1] runs single images */
    DnnlPass pass[2];
    float *zero_bias;  /* for a conv without bias */
    dnnl_data_type_t act; /* the activations' type: dnnl_bf16 (the bf16 table) or dnnl_f32 */
    size_t act_bytes;     /* bytes per activation: 2 or 4 */
} DnnlConvPlan;

/* Per-thread weight gradients in oneDNN's layout, oneDNN scratchpads, bias sums and
 * one tile's dx (conv_backward_acc), grown on
 * demand (OpenMP threads persist: nothing allocates in the loop once warm). */
enum { DNNL_TLS_DW, DNNL_TLS_SCRATCH, DNNL_TLS_BIAS, DNNL_TLS_DX, DNNL_TLS_SLOTS };
static __thread void *tls_buf[DNNL_TLS_SLOTS];
static __thread size_t tls_cap[DNNL_TLS_SLOTS];
static __thread dnnl_stream_t tls_stream;

static void *tls_buffer(int slot, size_t bytes) {
    if (bytes > tls_cap[slot]) {
        free(tls_buf[slot]);
        tls_buf[slot] = xmalloc_aligned(bytes ? bytes : 64);
        tls_cap[slot] = bytes;
    }
    return tls_buf[slot];
}

static dnnl_stream_t thread_stream(void) {
    if (!tls_stream) DNNL_CHECK(D.dnnl_stream_create(&tls_stream, g_engine, dnnl_stream_default_flags));
    return tls_stream;
}

/* fp32 -> bf16, rounded to nearest even: bf16.h's bf16_from_float without its branch,
 * so that GCC vectorises it (AVX-512 is there whenever this runs). The same bits as
 * bf16_from_float for every input (test_bn_nhwc). The CPU engine packs the augmented
 * batch with it (cpu_bf16_pack). */
typedef uint32_t bits32_alias __attribute__((may_alias));
#if defined(__clang__)
#define AVX512_FN __attribute__((target("arch=x86-64-v4"))) static
#else
#define AVX512_FN __attribute__((target("arch=x86-64-v4"), optimize("O3"))) static
#endif
/* The bf16 bits of the fp32 bits v, rounded to nearest even (NaN quieted). */
static inline __attribute__((always_inline)) uint16_t bf16_bits_rounded(uint32_t v) {
    uint32_t rounded = (v + 0x7fffu + ((v >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (v >> 16) | 0x0040u;
    return (uint16_t)((v & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}

AVX512_FN void
pack_bf16(size_t count, const float *src, uint16_t *restrict dst) {
    const bits32_alias *u = (const bits32_alias *)src;
    for (size_t i = 0; i < count; i++) dst[i] = bf16_bits_rounded(u[i]);
}

void cpu_dnnl_pack_bf16(size_t count, const float *src, uint16_t *dst) { pack_bf16(count, src, dst); }

/* ------------------------------------------------------------------- plans */

static void md_nhwc(dnnl_memory_desc_t *md, int n, int c, int h, int w, dnnl_data_type_t t) {
    dnnl_dims_t d = {n, c, h, w};
    DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(md, 4, d, t, dnnl_nhwc));
}

static void md_weight(dnnl_memory_desc_t *md, const ConvSpec *cs, dnnl_data_type_t t,
                      dnnl_format_tag_t tag) {
    dnnl_dims_t d = {cs->cout, cs->cin, cs->k, cs->k};
    DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(md, 4, d, t, tag));
}

static dnnl_primitive_t primitive_of(const_dnnl_primitive_desc_t pd, size_t *scratch) {
    const dnnl_memory_desc_t *s = D.dnnl_primitive_desc_query_md(pd, dnnl_query_scratchpad_md, 0);
    size_t bytes = s ? D.dnnl_memory_desc_get_size(s) : 0;
    if (bytes > *scratch) *scratch = bytes;
    dnnl_primitive_t p;
    DNNL_CHECK(D.dnnl_primitive_create(&p, pd));
    return p;
}

/* The reorder of a weight from layout `from` into `to`, and (buf non-NULL) a buffer
 * for its result. */
static dnnl_primitive_t weight_reorder(const dnnl_memory_desc_t *from, const dnnl_memory_desc_t *to,
                                       void **buf) {
    dnnl_primitive_desc_t pd;
    DNNL_CHECK(D.dnnl_reorder_primitive_desc_create(&pd, from, g_engine, to, g_engine, NULL));
    dnnl_primitive_t p;
    DNNL_CHECK(D.dnnl_primitive_create(&p, pd));
    DNNL_CHECK(D.dnnl_primitive_desc_destroy(pd));
    if (buf) *buf = xmalloc_aligned(D.dnnl_memory_desc_get_size(to));
    return p;
}

/* A 1x1 conv of stride 1 without padding: a matmul over the pixels. */
static int is_pointwise(const ConvSpec *cs) { return cs->k == 1 && cs->stride == 1 && cs->pad == 0; }

/* The weight gradient by oneDNN's convolution: fp32 dW in the layout its kernel picks
 * (with PyTorch's plain layout oneDNN 2.6 falls back to its reference code, ref:any,
 * measured 50x slower), reordered to PyTorch's; the bias gradient comes with it. */
static void weight_grad_conv_create(DnnlPass *ps, const_dnnl_primitive_desc_t fpd,
                                    const_dnnl_primitive_attr_t attr, const dnnl_dim_t *strides,
                                    const dnnl_dim_t *pad) {
    dnnl_convolution_desc_t wd;
    DNNL_CHECK(D.dnnl_convolution_backward_weights_desc_init(&wd, dnnl_convolution_direct, &ps->xa,
                                                           &ps->dw_any, &ps->bias, &ps->dya, strides,
                                                           pad, pad));
    dnnl_primitive_desc_t wpd;
    DNNL_CHECK(D.dnnl_primitive_desc_create(&wpd, &wd, attr, g_engine, fpd));
    ps->dw_any = *D.dnnl_primitive_desc_query_md(wpd, dnnl_query_diff_weights_md, 0);
    ps->bwd_w = primitive_of(wpd, &ps->scratch_bytes);
    ps->dw_reorder = weight_reorder(&ps->dw_any, &ps->dw32, NULL);
    DNNL_CHECK(D.dnnl_primitive_desc_destroy(wpd));
}

/* The weight gradient of a pointwise conv as one matmul, dW[cout][cin] = dy^T x over the
 * n*h*w pixels (dy^T: dy's NHWC rows read through strides), written in PyTorch's layout.
 * oneDNN 2.6's convolution weight gradient is slow for these (mb64 8x8, 64 -> 16
 * channels: 0.12 ms with AMX against 0.024 ms as a matmul, measured alone; over a whole
 * step 3-8% more images/s); the bias gradient is then summed by bias_grad. */
static void weight_grad_matmul_create(const DnnlConvPlan *cp, DnnlPass *ps, int n,
                                      const_dnnl_primitive_attr_t attr) {
    const ConvSpec *cs = &cp->cs;
    dnnl_dim_t px = (dnnl_dim_t)n * cp->h * cp->w;
    dnnl_dims_t dyt = {cs->cout, px}, dyt_strides = {1, cs->cout}, xd = {px, cs->cin},
                dwd = {cs->cout, cs->cin};
    DNNL_CHECK(D.dnnl_memory_desc_init_by_strides(&ps->mm_dyt, 2, dyt, cp->act, dyt_strides));
    DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(&ps->mm_x, 2, xd, cp->act, dnnl_ab));
    DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(&ps->mm_dw, 2, dwd, dnnl_f32, dnnl_ab));
    dnnl_matmul_desc_t md;
    DNNL_CHECK(D.dnnl_matmul_desc_init(&md, &ps->mm_dyt, &ps->mm_x, NULL, &ps->mm_dw));
    dnnl_primitive_desc_t mpd;
    DNNL_CHECK(D.dnnl_primitive_desc_create(&mpd, &md, attr, g_engine, NULL));
    ps->bwd_w = primitive_of(mpd, &ps->scratch_bytes);
    ps->mm_w = 1;
    DNNL_CHECK(D.dnnl_primitive_desc_destroy(mpd));
}

/* The data gradient of a pointwise conv as one matmul, dx = dy W over the n*h*w pixels,
 * kept only where oneDNN runs it on AMX tiles (a property of the processor and the
 * shapes, so the same choice in every run here): there it beats oneDNN 2.6's
 * convolution (mb64 8x8, 64 -> 16 channels, dx of 16: 0.006 against 0.019 ms); with a
 * narrow reduction (16 channels) it runs without AMX and is slower (0.045 against
 * 0.037 ms, measured). Returns 0 (nothing made) where it is not kept. */
static int data_grad_matmul_create(const DnnlConvPlan *cp, DnnlPass *ps, int n,
                                   const_dnnl_primitive_attr_t attr) {
    const ConvSpec *cs = &cp->cs;
    dnnl_dim_t px = (dnnl_dim_t)n * cp->h * cp->w;
    dnnl_dims_t dyd = {px, cs->cout}, dxd = {px, cs->cin}, wd = {cs->cout, cs->cin};
    dnnl_memory_desc_t w_any;
    DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(&ps->mm_dy, 2, dyd, cp->act, dnnl_ab));
    DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(&ps->mm_dx, 2, dxd, cp->act, dnnl_ab));
    DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(&w_any, 2, wd, cp->act, dnnl_format_tag_any));
    dnnl_matmul_desc_t md;
    DNNL_CHECK(D.dnnl_matmul_desc_init(&md, &ps->mm_dy, &w_any, NULL, &ps->mm_dx));
    dnnl_primitive_desc_t mpd;
    DNNL_CHECK(D.dnnl_primitive_desc_create(&mpd, &md, attr, g_engine, NULL));
    const char *impl = "";
    DNNL_CHECK(D.dnnl_primitive_desc_query(mpd, dnnl_query_impl_info_str, 0, &impl));
    int kept = strstr(impl, "amx") != NULL;
    if (kept) {
        DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(&ps->w_bd_src, 2, wd, dnnl_f32, dnnl_ab));
        ps->w_bd = *D.dnnl_primitive_desc_query_md(mpd, dnnl_query_weights_md, 0);
        ps->bwd_data = primitive_of(mpd, &ps->scratch_bytes);
        ps->w_bd_reorder = weight_reorder(&ps->w_bd_src, &ps->w_bd, &ps->w_bd_buf);
        ps->mm_d = 1;
    }
    DNNL_CHECK(D.dnnl_primitive_desc_destroy(mpd));
    return kept;
}

static void pass_create(DnnlConvPlan *cp, DnnlPass *ps, int n) {
    const ConvSpec *cs = &cp->cs;
    dnnl_dims_t strides = {cs->stride, cs->stride}, pad = {cs->pad, cs->pad};
    dnnl_memory_desc_t w_any;
    dnnl_dims_t bd = {cs->cout};
    md_nhwc(&ps->xa, n, cs->cin, cp->h, cp->w, cp->act);
    md_nhwc(&ps->dxa, n, cs->cin, cp->h, cp->w, cp->act);
    md_nhwc(&ps->ya, n, cs->cout, cp->oh, cp->ow, cp->act);
    md_nhwc(&ps->dya, n, cs->cout, cp->oh, cp->ow, cp->act);
    md_weight(&ps->w32, cs, dnnl_f32, dnnl_oihw);
    md_weight(&ps->dw32, cs, dnnl_f32, dnnl_oihw);
    md_weight(&w_any, cs, cp->act, dnnl_format_tag_any);
    md_weight(&ps->dw_any, cs, dnnl_f32, dnnl_format_tag_any);
    DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(&ps->bias, 1, bd, dnnl_f32, dnnl_x));
    dnnl_primitive_attr_t attr;
    DNNL_CHECK(D.dnnl_primitive_attr_create(&attr));
    DNNL_CHECK(D.dnnl_primitive_attr_set_scratchpad_mode(attr, dnnl_scratchpad_mode_user));

    dnnl_convolution_desc_t fd;
    DNNL_CHECK(D.dnnl_convolution_forward_desc_init(
        &fd, dnnl_forward_training, dnnl_convolution_direct, /* one kernel for training and eval */
        &ps->xa, &w_any, &ps->bias, &ps->ya, strides, pad, pad));
    dnnl_primitive_desc_t fpd;
    DNNL_CHECK(D.dnnl_primitive_desc_create(&fpd, &fd, attr, g_engine, NULL));
    ps->w_fwd = *D.dnnl_primitive_desc_query_md(fpd, dnnl_query_weights_md, 0);
    ps->fwd = primitive_of(fpd, &ps->scratch_bytes);
    ps->w_fwd_reorder = weight_reorder(&ps->w32, &ps->w_fwd, &ps->w_fwd_buf);
    if (cp->backward) {
        /* the matmuls for bf16 only: with fp32 activations the weight gradient's measured
         * no faster over a whole step (AVX-512, 2 threads: 4,483-4,551 against
         * 4,433-4,521 images/s), and oneDNN 2.6 has no fp32 matmul on AMX */
        const int pointwise_bf16 = is_pointwise(cs) && cp->act == dnnl_bf16;
        if (cp->need_dx && !(pointwise_bf16 && data_grad_matmul_create(cp, ps, n, attr))) {
            ps->w_bd_src = ps->w32;
            dnnl_convolution_desc_t dd;
            DNNL_CHECK(D.dnnl_convolution_backward_data_desc_init(&dd, dnnl_convolution_direct, &ps->dxa,
                                                                &w_any, &ps->dya, strides, pad, pad));
            dnnl_primitive_desc_t dpd;
            DNNL_CHECK(D.dnnl_primitive_desc_create(&dpd, &dd, attr, g_engine, fpd));
            ps->w_bd = *D.dnnl_primitive_desc_query_md(dpd, dnnl_query_weights_md, 0);
            ps->bwd_data = primitive_of(dpd, &ps->scratch_bytes);
            ps->w_bd_reorder = weight_reorder(&ps->w_bd_src, &ps->w_bd, &ps->w_bd_buf);
            DNNL_CHECK(D.dnnl_primitive_desc_destroy(dpd));
        }
        if (pointwise_bf16) weight_grad_matmul_create(cp, ps, n, attr);
        else weight_grad_conv_create(ps, fpd, attr, strides, pad);
    }
    DNNL_CHECK(D.dnnl_primitive_desc_destroy(fpd));
    DNNL_CHECK(D.dnnl_primitive_attr_destroy(attr));
}

static void pass_destroy(DnnlPass *ps) {
    dnnl_primitive_t all[] = {ps->fwd,           ps->bwd_data,     ps->bwd_w,
                              ps->w_fwd_reorder, ps->w_bd_reorder, ps->dw_reorder};
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        if (all[i]) D.dnnl_primitive_destroy(all[i]);
    free(ps->w_fwd_buf);
    free(ps->w_bd_buf);
}

/* Images per tile: about 4,096 output pixels, a power of two (a batch of 2^k images
 * then splits into equal tiles that 1, 2 or 4 threads share evenly), at most max_n. */
static int tile_images(int max_n, int oh, int ow) {
    int64_t px = (int64_t)oh * ow, t = px > 0 ? 4096 / px : 1;
    if (t < 1) t = 1;
    while (t & (t - 1)) t &= t - 1;
    return (int)(t < max_n ? t : max_n > 0 ? max_n : 1);
}

static void *plan_create(const ConvSpec *cs, int max_n, int h, int w, int backward, int need_dx,
                         dnnl_data_type_t act) {
    DnnlConvPlan *cp = xcalloc(1, sizeof *cp);
    cp->act = act;
    cp->act_bytes = act == dnnl_bf16 ? 2 : 4;
    cp->cs = *cs;
    cp->max_n = max_n;
    cp->h = h;
    cp->w = w;
    cp->oh = conv_out_size(h, cs->k, cs->stride, cs->pad);
    cp->ow = conv_out_size(w, cs->k, cs->stride, cs->pad);
    cp->backward = backward;
    cp->need_dx = backward && need_dx;
    cp->tile = tile_images(max_n, cp->oh, cp->ow);
    cp->npass = cp->tile > 1 ? 2 : 1;
    cp->zero_bias = xcalloc((size_t)cs->cout, sizeof(float));
    /* made with one thread: they run on one (see the top of the file) */
    int threads = omp_get_max_threads();
    omp_set_num_threads(1);
    pass_create(cp, &cp->pass[0], cp->tile);
    if (cp->npass == 2) pass_create(cp, &cp->pass[1], 1);
    omp_set_num_threads(threads);
    return cp;
}

static void *dnnl_conv_plan(void *ctx, const ConvSpec *cs, int max_n, int h, int w, int backward,
                            int need_dx) {
    (void)ctx;
    return plan_create(cs, max_n, h, w, backward, need_dx, dnnl_bf16);
}

static void dnnl_conv_plan_free(void *ctx, void *plan) {
    (void)ctx;
    DnnlConvPlan *cp = plan;
    if (!cp) return;
    for (int i = 0; i < cp->npass; i++) pass_destroy(&cp->pass[i]);
    free(cp->zero_bias);
    free(cp);
}

static void dnnl_conv_prepare(void *ctx, void *plan, int n, size_t ws_bytes) {
    (void)ctx, (void)plan, (void)n, (void)ws_bytes;
}

/* Tiles of a batch of n: `full` of cp->tile images, then n % tile single images. */
static int tile_count(const DnnlConvPlan *cp, int n) { return n / cp->tile + n % cp->tile; }

static void tile_at(const DnnlConvPlan *cp, int n, int t, int *img0, int *nimg, int *pass) {
    int full = n / cp->tile;
    *img0 = t < full ? t * cp->tile : full * cp->tile + (t - full);
    *nimg = t < full ? cp->tile : 1;
    *pass = t < full ? 0 : cp->npass - 1;
}

/* The workspace: per tile an fp32 bias partial and an fp32 weight partial. */
static size_t weight_len(const ConvSpec *cs) { return (size_t)cs->cout * cs->cin * cs->k * cs->k; }

static size_t dnnl_conv_workspace_bytes(void *ctx, void *plan) {
    (void)ctx;
    const DnnlConvPlan *cp = plan;
    int64_t tiles = cp->max_n / cp->tile + cp->tile - 1;
    if (tiles > cp->max_n) tiles = cp->max_n;
    if (tiles < 1) tiles = 1;
    return (size_t)tiles * (cp->cs.cout + weight_len(&cp->cs)) * sizeof(float);
}

/* Weights stay in PyTorch's layout (fp32): export and import are copies. */
static void dnnl_conv_weight_copy(void *ctx, void *plan, const float *src, float *dst) {
    (void)ctx;
    const DnnlConvPlan *cp = plan;
    if (dst != src) memmove(dst, src, weight_len(&cp->cs) * sizeof(float));
}

/* ---------------------------------------------------------------- execution */

typedef struct {
    int arg;
    const dnnl_memory_desc_t *md;
    const void *data;
} DnnlArg;

/* Runs p on this thread with args (memory objects wrapping the caller's buffers) and
 * this thread's scratchpad. */
static void run(dnnl_primitive_t p, const DnnlPass *ps, const DnnlArg *args, int nargs) {
    dnnl_exec_arg_t ex[8];
    dnnl_memory_t mem[8];
    dnnl_memory_desc_t sd;
    dnnl_dims_t sdim = {(dnnl_dim_t)(ps->scratch_bytes ? ps->scratch_bytes : 1)};
    DNNL_CHECK(D.dnnl_memory_desc_init_by_tag(&sd, 1, sdim, dnnl_u8, dnnl_x));
    int k = 0;
    for (; k < nargs; k++) {
        DNNL_CHECK(D.dnnl_memory_create(&mem[k], args[k].md, g_engine, (void *)args[k].data));
        ex[k] = (dnnl_exec_arg_t){args[k].arg, mem[k]};
    }
    DNNL_CHECK(D.dnnl_memory_create(&mem[k], &sd, g_engine, tls_buffer(DNNL_TLS_SCRATCH, ps->scratch_bytes)));
    ex[k] = (dnnl_exec_arg_t){DNNL_ARG_SCRATCHPAD, mem[k]};
    k++;
    dnnl_stream_t s = thread_stream();
    DNNL_CHECK(D.dnnl_primitive_execute(p, s, k, ex));
    DNNL_CHECK(D.dnnl_stream_wait(s));
    for (int i = 0; i < k; i++) D.dnnl_memory_destroy(mem[i]);
}

static void reorder(dnnl_primitive_t r, const DnnlPass *ps, const dnnl_memory_desc_t *from,
                    const void *src, const dnnl_memory_desc_t *to, void *dst) {
    const DnnlArg a[] = {{DNNL_ARG_FROM, from, src}, {DNNL_ARG_TO, to, dst}};
    run(r, ps, a, 2);
}

/* One call's arguments; the activations (x, y, dy, dx) as bytes (plan->act_bytes each). */
typedef struct {
    const DnnlConvPlan *cp;
    int n;
    const char *x, *dy;
    char *y, *dx;
    const float *weight, *bias;
    float *dweight, *dbias;
    void *ws;
    int acc; /* dx += the gradient of x (conv_backward_acc) */
} DnnlCall;

static void forward_body(void *arg) {
    const DnnlCall *c = arg;
    const DnnlConvPlan *cp = c->cp;
    const ConvSpec *cs = &cp->cs;
    const size_t in_img = (size_t)cp->h * cp->w * cs->cin * cp->act_bytes;
    const size_t out_img = (size_t)cp->oh * cp->ow * cs->cout * cp->act_bytes;
    const int tiles = tile_count(cp, c->n);
#pragma omp single
    for (int i = 0; i < cp->npass; i++) {
        DnnlPass *ps = (DnnlPass *)&cp->pass[i];
        reorder(ps->w_fwd_reorder, ps, &ps->w32, c->weight, &ps->w_fwd, ps->w_fwd_buf);
    }
#pragma omp for schedule(static)
    for (int t = 0; t < tiles; t++) {
        int img0, nimg, pi;
        tile_at(cp, c->n, t, &img0, &nimg, &pi);
        const DnnlPass *ps = &cp->pass[pi];
        const DnnlArg a[] = {{DNNL_ARG_SRC, &ps->xa, c->x + img0 * in_img},
                             {DNNL_ARG_WEIGHTS, &ps->w_fwd, ps->w_fwd_buf},
                             {DNNL_ARG_BIAS, &ps->bias, c->bias ? c->bias : cp->zero_bias},
                             {DNNL_ARG_DST, &ps->ya, c->y + img0 * out_img}};
        run(ps->fwd, ps, a, 4);
    }
}

static void dnnl_conv_forward(void *ctx, void *plan, int n, const float *x, const float *weight,
                              const float *bias, float *y, void *ws, size_t ws_bytes) {
    (void)ctx, (void)ws_bytes;
    DnnlCall c = {.cp = plan, .n = n, .x = (const char *)x, .weight = weight, .bias = bias,
                  .y = (char *)y, .ws = ws};
    if (n > 0) ops_team_run(forward_body, &c);
}

/* The bias gradient of one tile of bf16 dy (the pointwise matmuls are bf16 only), out[ch]
 * = the sum of dy[.][ch] over its rows: fp32 sums of 64 rows (AVX-512 vectors over the
 * channels), added in double in row order. */
enum { BIAS_ROWS = 64, BIAS_CHANNELS = 64 };
AVX512_FN void
bias_grad_rows(int64_t rows, int c, const uint16_t *dy, double *acc) {
    for (int ch = 0; ch < c; ch++) acc[ch] = 0.0;
    for (int64_t r0 = 0; r0 < rows; r0 += BIAS_ROWS) {
        int64_t r1 = r0 + BIAS_ROWS < rows ? r0 + BIAS_ROWS : rows;
        for (int c0 = 0; c0 < c; c0 += BIAS_CHANNELS) {
            int cw = c - c0 < BIAS_CHANNELS ? c - c0 : BIAS_CHANNELS;
            float s[BIAS_CHANNELS] = {0};
            for (int64_t r = r0; r < r1; r++)
                for (int j = 0; j < cw; j++) s[j] += bf16_to_float(dy[r * c + c0 + j]);
            for (int j = 0; j < cw; j++) acc[c0 + j] += s[j];
        }
    }
}

static void bias_grad(const DnnlConvPlan *cp, const char *dy, int64_t rows, float *out) {
    const int c = cp->cs.cout;
    double *acc = tls_buffer(DNNL_TLS_BIAS, (size_t)c * sizeof(double));
    bias_grad_rows(rows, c, (const uint16_t *)dy, acc);
    for (int ch = 0; ch < c; ch++) out[ch] = (float)acc[ch];
}

/* dx[i] = tmp[i] + dx[i] in fp32, rounded to bf16 as the bf16 table's add rounds
 * (tmp, the conv's dx, first: the plain path's add(cur, dshort) order). */
AVX512_FN void
add_into_bf16(size_t count, const uint16_t *tmp, uint16_t *restrict dx) {
    for (size_t i = 0; i < count; i++) {
        float s = bf16_to_float(tmp[i]) + bf16_to_float(dx[i]);
        uint32_t v;
        memcpy(&v, &s, sizeof v);
        dx[i] = bf16_bits_rounded(v);
    }
}

/* Tile t's gradients: its dx (acc: added into dx, from a per-thread copy of the tile
 * that is still in cache, so the add costs no pass over memory), its weight partial,
 * its bias partial. */
static void backward_tile(const DnnlCall *c, int t, float *bparts, float *wparts) {
    const DnnlConvPlan *cp = c->cp;
    const ConvSpec *cs = &cp->cs;
    const size_t in_img = (size_t)cp->h * cp->w * cs->cin * cp->act_bytes;
    const size_t out_img = (size_t)cp->oh * cp->ow * cs->cout * cp->act_bytes;
    int img0, nimg, pi;
    tile_at(cp, c->n, t, &img0, &nimg, &pi);
    const DnnlPass *ps = &cp->pass[pi];
    const char *dy = c->dy + img0 * out_img;
    if (c->dx) {
        char *dx = c->dx + img0 * in_img;
        char *out = c->acc ? tls_buffer(DNNL_TLS_DX, (size_t)nimg * in_img) : dx;
        const DnnlArg conv[] = {{DNNL_ARG_DIFF_DST, &ps->dya, dy},
                                {DNNL_ARG_WEIGHTS, &ps->w_bd, ps->w_bd_buf},
                                {DNNL_ARG_DIFF_SRC, &ps->dxa, out}};
        const DnnlArg mm[] = {{DNNL_ARG_SRC, &ps->mm_dy, dy},
                              {DNNL_ARG_WEIGHTS, &ps->w_bd, ps->w_bd_buf},
                              {DNNL_ARG_DST, &ps->mm_dx, out}};
        run(ps->bwd_data, ps, ps->mm_d ? mm : conv, 3);
        if (c->acc)
            add_into_bf16((size_t)nimg * in_img / sizeof(uint16_t), (const uint16_t *)out,
                          (uint16_t *)dx);
    }
    float *wpart = wparts + (size_t)t * weight_len(cs), *bpart = bparts + (size_t)t * cs->cout;
    if (ps->mm_w) {
        const DnnlArg a[] = {{DNNL_ARG_SRC, &ps->mm_dyt, dy},
                             {DNNL_ARG_WEIGHTS, &ps->mm_x, c->x + img0 * in_img},
                             {DNNL_ARG_DST, &ps->mm_dw, wpart}};
        run(ps->bwd_w, ps, a, 3);
        bias_grad(cp, dy, (int64_t)nimg * cp->oh * cp->ow, bpart);
        return;
    }
    void *dw = tls_buffer(DNNL_TLS_DW, D.dnnl_memory_desc_get_size(&ps->dw_any));
    const DnnlArg a[] = {{DNNL_ARG_SRC, &ps->xa, c->x + img0 * in_img},
                         {DNNL_ARG_DIFF_DST, &ps->dya, dy},
                         {DNNL_ARG_DIFF_WEIGHTS, &ps->dw_any, dw},
                         {DNNL_ARG_DIFF_BIAS, &ps->bias, bpart}};
    run(ps->bwd_w, ps, a, 4);
    reorder(ps->dw_reorder, ps, &ps->dw_any, dw, &ps->dw32, wpart);
}

static void backward_body(void *arg) {
    const DnnlCall *c = arg;
    const DnnlConvPlan *cp = c->cp;
    const ConvSpec *cs = &cp->cs;
    const int tiles = tile_count(cp, c->n);
    const size_t wlen = weight_len(cs);
    float *bparts = c->ws, *wparts = bparts + (size_t)tiles * cs->cout;
    if (c->dx) {
#pragma omp single
        for (int i = 0; i < cp->npass; i++) {
            DnnlPass *ps = (DnnlPass *)&cp->pass[i];
            reorder(ps->w_bd_reorder, ps, &ps->w_bd_src, c->weight, &ps->w_bd, ps->w_bd_buf);
        }
    }
#pragma omp for schedule(static)
    for (int t = 0; t < tiles; t++) backward_tile(c, t, bparts, wparts);
    /* the partials in tile order */
#pragma omp for schedule(static) nowait
    for (size_t e = 0; e < wlen; e++) {
        float s = wparts[e];
        for (int t = 1; t < tiles; t++) s += wparts[(size_t)t * wlen + e];
        c->dweight[e] = s;
    }
    if (c->dbias) {
#pragma omp for schedule(static) nowait
        for (int o = 0; o < cs->cout; o++) {
            double s = 0.0;
            for (int t = 0; t < tiles; t++) s += bparts[(size_t)t * cs->cout + o];
            c->dbias[o] = (float)s;
        }
    }
#pragma omp barrier
}

static void conv_backward(void *plan, int n, const float *x, const float *weight, const float *dy,
                          float *dx, float *dweight, float *dbias, void *ws, size_t ws_bytes,
                          int acc) {
    const DnnlConvPlan *cp = plan;
    if (!cp->backward) die("model: conv backward on an inference plan (internal error)");
    if (dx && !cp->need_dx) die("model: conv backward with a dx on a plan made without need_dx (internal error)");
    if (ws_bytes < dnnl_conv_workspace_bytes(NULL, plan)) die("model: conv workspace too small (internal error)");
    if (n <= 0) {
        memset(dweight, 0, weight_len(&cp->cs) * sizeof(float));
        if (dbias) memset(dbias, 0, (size_t)cp->cs.cout * sizeof(float));
        return;
    }
    DnnlCall c = {.cp = cp, .n = n, .x = (const char *)x, .weight = weight,
                  .dy = (const char *)dy, .dx = (char *)dx, .dweight = dweight,
                  .dbias = dbias, .ws = ws, .acc = acc};
    ops_team_run(backward_body, &c);
}

static void dnnl_conv_backward(void *ctx, void *plan, int n, const float *x, const float *weight,
                               const float *dy, float *dx, float *dweight, float *dbias, void *ws,
                               size_t ws_bytes) {
    (void)ctx;
    conv_backward(plan, n, x, weight, dy, dx, dweight, dbias, ws, ws_bytes, 0);
}

/* net_ops.h's conv_backward_acc, for the bf16 table (whose bn_relu_backward_keep goes
 * with it): the same bits as conv_backward into a buffer, then the table's add. */
static void dnnl_conv_backward_acc(void *ctx, void *plan, int n, const float *x,
                                   const float *weight, const float *dy, float *dx, float *dweight,
                                   float *dbias, void *ws, size_t ws_bytes) {
    (void)ctx;
    const DnnlConvPlan *cp = plan;
    if (cp->act != dnnl_bf16 || !dx) die("model: conv_backward_acc on an fp32 plan or without dx (internal error)");
    conv_backward(plan, n, x, weight, dy, dx, dweight, dbias, ws, ws_bytes, 1);
}

/* oneDNN's name of the instructions its kernels use here. */
static const char *dnnl_isa_name(dnnl_cpu_isa_t isa) {
    switch (isa) {
    case dnnl_cpu_isa_avx512_core_amx: return "AMX (avx512_core_amx)";
    case dnnl_cpu_isa_avx512_core_bf16: return "AVX512-BF16 (avx512_core_bf16)";
    default: return "an instruction set without bf16 (bf16 emulated)";
    }
}

void cpu_dnnl_conv_entries(NetOps *t) {
    if (!g_engine) DNNL_CHECK(D.dnnl_engine_create(&g_engine, dnnl_cpu, 0));
    const dnnl_version_t *v = D.dnnl_version();
    snprintf(g_backend, sizeof g_backend, "oneDNN %d.%d.%d, %s", v->major, v->minor, v->patch,
             dnnl_isa_name(D.dnnl_get_effective_cpu_isa()));
    t->conv_plan = dnnl_conv_plan;
    t->conv_workspace_bytes = dnnl_conv_workspace_bytes;
    t->conv_plan_free = dnnl_conv_plan_free;
    t->conv_prepare = dnnl_conv_prepare;
    t->conv_forward = dnnl_conv_forward;
    t->conv_backward = dnnl_conv_backward;
    t->conv_backward_acc = dnnl_conv_backward_acc;
    t->conv_weight_export = dnnl_conv_weight_copy;
    t->conv_weight_import = dnnl_conv_weight_copy;
}

const char *cpu_dnnl_conv_backend(void) { return g_backend; }

/* The fp32 table's convs (cpu_bf16.h's net_cpu_ops_dnnl): the same plans and tiles
 * with fp32 activations, so the same determinism. */
static void *dnnl_conv_plan_f32(void *ctx, const ConvSpec *cs, int max_n, int h, int w, int backward,
                                int need_dx) {
    (void)ctx;
    return plan_create(cs, max_n, h, w, backward, need_dx, dnnl_f32);
}

void cpu_dnnl_conv_entries_f32(NetOps *t) {
    cpu_dnnl_conv_entries(t);
    t->name = "cpu-avx512-onednn";
    t->conv_plan = dnnl_conv_plan_f32;
    t->conv_backward_acc = NULL; /* the plain block backward, as the other fp32 tables */
}

#else
/* ISO C forbids an empty translation unit. */
typedef int conv_dnnl_unused;
#endif
