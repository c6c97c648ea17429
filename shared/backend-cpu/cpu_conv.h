/* cpu_conv.h: the convolution entries (cpu_conv_plan ... cpu_conv_backward): plans, im2col +
 * GEMM, the direct kernels, the weight gradient's fixed partials.
 * Part of the CPU op table (ops_cpu_impl.h), instanced with it: no include guard,
 * included once per instance, after cpu_common.h. */

/* ---------------------------------------------------------------- conv2d */

static int opsi_conv_is_pointwise(const ConvSpec *cs) {
    return cs->k == 1 && cs->stride == 1 && cs->pad == 0;
}

/* The weight gradient: the batch is cut into tiles of whole images (at most
 * OPSI_COL_TARGET im2col elements each, at least one image), the tiles are grouped
 * into at most OPSI_MAX_PARTS parts, each summing its tiles in order into its own
 * partial, and the partials are added in part order: the partition depends on the
 * shapes only, never on the thread count. The direct kernels (below) compute every
 * output element the same way whatever the tiling, so they split the work finer: a
 * part's dW sum in slices of kernel taps, the forward and the input gradient over
 * work tiles of fewer images. GEMM paths keep their tiles: OpenBLAS's rounding
 * depends on the GEMM's shape (how it blocks the rows: measured, a split of 6,144 rows
 * at 2,048 changes bits, at 1,536 not), so a finer split would change the results.
 * Work tiles go to threads statically (each thread keeps the same images from op to
 * op, and their rows stay in its cache); the dW items, which read across images
 * anyway, dynamically after the dx tiles. Which thread computes an item never changes
 * a result. */
typedef struct {
    int oh, ow, kk;   /* output size, im2col row length cin*k*k */
    int tile_imgs;    /* images per dW tile */
    int ntiles, nparts;
    int nslices;      /* pieces of one part's dW sum */
    int work_imgs, nwork; /* forward: images per work tile, work tiles */
    int dx_imgs, ndx;     /* the same for dx */
    size_t part_len;  /* elements of one dW partial (cout * kk) */
} OpsiConvPlan;

#define OPSI_MAX_PARTS 32
/* cap on all partials together, in elements */
#define OPSI_PARTS_TARGET (4 * 1024 * 1024)
/* work items an op aims at, so that any team of up to a few threads gets even shares */
#define OPSI_WORK_ITEMS 16

static int opsi_conv_is_direct(const ConvSpec *cs);
static int opsi_conv_dx_is_direct(const ConvSpec *cs);

/* Images per work tile: finer than a dW tile where the kernel allows it. */
static int opsi_work_imgs(int n, int tile_imgs, int fine_ok) {
    int fine = (n + OPSI_WORK_ITEMS - 1) / OPSI_WORK_ITEMS;
    return fine_ok && fine >= 1 && fine < tile_imgs ? fine : tile_imgs;
}

static OpsiConvPlan opsi_conv_plan(const ConvSpec *cs, int n, int h, int w) {
    OpsiConvPlan p;
    p.oh = conv_out_size(h, cs->k, cs->stride, cs->pad);
    p.ow = conv_out_size(w, cs->k, cs->stride, cs->pad);
    p.kk = cs->cin * cs->k * cs->k;
    int64_t per_img = (int64_t)p.oh * p.ow * p.kk;
    int64_t imgs = per_img > 0 ? OPSI_COL_TARGET / per_img : n;
    if (imgs < 1) imgs = 1;
    /* A power of two at most the cache target: a batch of 2^k images then splits into
     * equal tiles whose count is a power of two, which 1, 2 or 4 threads share evenly
     * (96-image tiles cut 256 images 96/96/64: on 2 threads 192 against 64). Before
     * the clamp to n, so that the tile count never grows as n shrinks (the workspace
     * is sized for the largest batch). */
    while (imgs & (imgs - 1)) imgs &= imgs - 1;
    if (imgs > n) imgs = n;
    p.tile_imgs = imgs > 0 ? (int)imgs : 1;
    p.ntiles = n > 0 ? (n + p.tile_imgs - 1) / p.tile_imgs : 0;
    p.part_len = (size_t)cs->cout * p.kk;
    int64_t parts = OPSI_PARTS_TARGET / (int64_t)(p.part_len ? p.part_len : 1);
    if (parts > OPSI_MAX_PARTS) parts = OPSI_MAX_PARTS;
    if (parts > p.ntiles) parts = p.ntiles;
    if (parts < 1) parts = 1;
    p.nparts = (int)parts;
    p.nslices = 1;
    if (opsi_conv_is_direct(cs)) {
        int want = (OPSI_WORK_ITEMS + p.nparts - 1) / p.nparts, taps = cs->k * cs->k;
        p.nslices = want < taps ? want : taps;
    }
    p.work_imgs = opsi_work_imgs(n, p.tile_imgs, opsi_conv_is_direct(cs));
    p.nwork = n > 0 ? (n + p.work_imgs - 1) / p.work_imgs : 0;
    p.dx_imgs = opsi_work_imgs(n, p.tile_imgs, opsi_conv_dx_is_direct(cs));
    p.ndx = n > 0 ? (n + p.dx_imgs - 1) / p.dx_imgs : 0;
    return p;
}

/* The table's conv plan: the layer's spec and largest input (weights stay in
 * PyTorch's layout); the tiling (OpsiConvPlan) follows from it per call. */
typedef struct {
    ConvSpec cs;
    int max_n, h, w;
    int need_dx; /* net_ops.h: 0 when the backward gets no dx */
} CpuConvPlan;

static void *cpu_conv_plan(void *ctx, const ConvSpec *cs, int max_n, int h, int w, int backward,
                           int need_dx) {
    (void)ctx;
    (void)backward;
    CpuConvPlan *p = xcalloc(1, sizeof *p);
    p->cs = *cs;
    p->need_dx = need_dx;
    p->max_n = max_n;
    p->h = h;
    p->w = w;
    return p;
}

static void cpu_conv_plan_free(void *ctx, void *plan) {
    (void)ctx;
    free(plan);
}

/* Nothing to settle: the tiling is a function of the call's shapes. */
static void cpu_conv_prepare(void *ctx, void *plan, int n, size_t ws_bytes) {
    (void)ctx;
    (void)plan;
    (void)n;
    (void)ws_bytes;
}

/* The dW partials of the largest batch. */
static size_t cpu_conv_workspace_bytes(void *ctx, void *plan) {
    (void)ctx;
    const CpuConvPlan *cp = plan;
    OpsiConvPlan p = opsi_conv_plan(&cp->cs, cp->max_n, cp->h, cp->w);
    return (size_t)p.nparts * p.part_len * sizeof(real_t);
}

/* Weights stay in PyTorch's layout: export and import are copies. */
static void cpu_conv_weight_copy(void *ctx, void *plan, const real_t *src, real_t *dst) {
    (void)ctx;
    const CpuConvPlan *p = plan;
    size_t n = (size_t)p->cs.cout * p->cs.cin * p->cs.k * p->cs.k;
    if (dst != src) memmove(dst, src, n * sizeof(real_t));
}

/* [cout][cin][k][k] -> [cout][k][k][cin] */
static void opsi_weight_to_hwc(const ConvSpec *cs, const real_t *w, real_t *wp) {
    int kk2 = cs->k * cs->k;
    for (int o = 0; o < cs->cout; o++)
        for (int ci = 0; ci < cs->cin; ci++)
            for (int t = 0; t < kk2; t++)
                wp[((size_t)o * kk2 + t) * cs->cin + ci] = w[((size_t)o * cs->cin + ci) * kk2 + t];
}

static void opsi_copy(real_t *dst, const real_t *src, int n) {
    for (int i = 0; i < n; i++) dst[i] = src[i];
}

static void opsi_zero(real_t *dst, int n) {
    for (int i = 0; i < n; i++) dst[i] = 0;
}

/* col[(img,oy,ox)][(kh,kw,ci)] for images [img0, img0+nimg) of x[n][h][w][cin].
 * With stride 1 the k taps of one kernel row are k*cin contiguous inputs. */
static void opsi_im2col(const ConvSpec *cs, int h, int w, int oh, int ow, const real_t *x,
                        int img0, int nimg, real_t *col) {
    const int cin = cs->cin, k = cs->k, s = cs->stride, p = cs->pad, kc = k * cin;
    const size_t kk = (size_t)kc * k;
    for (int i = 0; i < nimg; i++) {
        const real_t *ximg = x + (size_t)(img0 + i) * h * w * cin;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                real_t *dst = col + (((size_t)i * oh + oy) * ow + ox) * kk;
                int ix0 = ox * s - p;
                for (int kh = 0; kh < k; kh++, dst += kc) {
                    int iy = oy * s - p + kh;
                    if (iy < 0 || iy >= h) {
                        opsi_zero(dst, kc);
                        continue;
                    }
                    const real_t *xrow = ximg + (size_t)iy * w * cin;
                    if (ix0 >= 0 && ix0 + k <= w && s == 1) {
                        opsi_copy(dst, xrow + (size_t)ix0 * cin, kc);
                        continue;
                    }
                    for (int kw = 0; kw < k; kw++) {
                        int ix = ix0 + kw;
                        if (ix < 0 || ix >= w)
                            opsi_zero(dst + kw * cin, cin);
                        else
                            opsi_copy(dst + kw * cin, xrow + (size_t)ix * cin, cin);
                    }
                }
            }
    }
}

/* dx (images [img0, img0+nimg), overwritten) = scatter-add of col, in a fixed order. */
static void opsi_col2im(const ConvSpec *cs, int h, int w, int oh, int ow, const real_t *col,
                        int img0, int nimg, real_t *dx) {
    const int cin = cs->cin, k = cs->k, s = cs->stride, p = cs->pad;
    const size_t kk = (size_t)cin * k * k;
    real_t *dimg0 = dx + (size_t)img0 * h * w * cin;
    opsi_zero(dimg0, nimg * h * w * cin);
    for (int i = 0; i < nimg; i++) {
        real_t *dimg = dimg0 + (size_t)i * h * w * cin;
        for (int oy = 0; oy < oh; oy++)
            for (int ox = 0; ox < ow; ox++) {
                const real_t *src = col + (((size_t)i * oh + oy) * ow + ox) * kk;
                for (int kh = 0; kh < k; kh++) {
                    int iy = oy * s - p + kh;
                    if (iy < 0 || iy >= h) {
                        src += (size_t)k * cin;
                        continue;
                    }
                    for (int kw = 0; kw < k; kw++, src += cin) {
                        int ix = ox * s - p + kw;
                        if (ix < 0 || ix >= w) continue;
                        real_t *d = dimg + ((size_t)iy * w + ix) * cin;
                        for (int ci = 0; ci < cin; ci++) d[ci] += src[ci];
                    }
                }
            }
    }
}

/* ------------------------------------------------- direct conv kernels
 *
 * For k > 1 with few output channels the im2col copy and small GEMMs cost more
 * than the arithmetic; these loops convolve straight from the NHWC input with
 * the weight in HWIO order ([kh][kw][ci][co]), so the innermost loop runs over
 * `cout` contiguous outputs (one vector for 16 channels). The per-size
 * instances (constant cout) let the compiler keep the accumulator in registers. */

#define OPSI_DIRECT_MAX_COUT 64

static int opsi_conv_is_direct(const ConvSpec *cs) {
    return cs->k > 1 && cs->cout <= OPSI_DIRECT_MAX_COUT;
}

/* [cout][cin][k][k] -> [k][k][cin][cout]; flip != 0 gives the weight of the
 * transposed convolution (dx from dy): [k-1-kh][k-1-kw][cout][cin]. */
static void opsi_weight_to_hwio(const ConvSpec *cs, const real_t *w, real_t *wt, int flip) {
    const int kk2 = cs->k * cs->k, cin = cs->cin, cout = cs->cout;
    for (int o = 0; o < cout; o++)
        for (int ci = 0; ci < cin; ci++)
            for (int t = 0; t < kk2; t++) {
                real_t v = w[((size_t)o * cin + ci) * kk2 + t];
                if (flip)
                    wt[((size_t)(kk2 - 1 - t) * cout + o) * cin + ci] = v;
                else
                    wt[((size_t)t * cin + ci) * cout + o] = v;
            }
}

/* Output columns ox whose input column ox*s - p + kw lies inside [0, w). */
static void opsi_tap_range(int w, int ow, int s, int p, int kw, int *lo, int *hi) {
    int a = p - kw, b = w - 1 + p - kw;
    *lo = a > 0 ? (a + s - 1) / s : 0;
    *hi = b >= 0 ? b / s + 1 : 0;
    if (*hi > ow) *hi = ow;
    if (*lo > *hi) *lo = *hi;
}

typedef struct {
    int cin, k, s, p, h, w, oh, ow;
} OpsiDirect;

/* 32-byte vectors (GCC vector extension, lowered to what the ISA has): 8 floats or
 * 4 doubles; as fast as 64-byte ones where AVX-512 splits into two 256-bit halves
 * (AMD Zen 4), and they fit cout = 8. Kernels run on them when cout is a multiple
 * of the lane count, with a plain scalar loop otherwise. Loads and stores go
 * through an unaligned, may_alias type (macros: no vector-ABI functions). */
typedef real_t opsi_vec __attribute__((vector_size(32)));
typedef real_t opsi_vec_u __attribute__((vector_size(32), aligned(sizeof(real_t)), may_alias));
#define OPSI_VL ((int)(32 / sizeof(real_t)))
#define OPSI_MAX_NV 8                /* cout <= 8 vectors */
#define OPSI_DW_REGS 32              /* dW accumulators of one tap: cin * nv vectors */
#define opsi_vload(p) (*(const opsi_vec_u *)(p))
#define opsi_vstore(p, v) (*(opsi_vec_u *)(p) = (v))
/* every lane = x (x - 0 folds to x; x + 0 would cost an add, for -0.0) */
#define opsi_vbcast(x) ((real_t)(x) - (opsi_vec){0})

/* Copies images [img0, img0+nimg) of x[n][h][w][cin] into xp with a zero border of p
 * pixels, so the vector kernel below needs no bounds checks. */
static void opsi_pad_images(int cin, int h, int w, int p, const real_t *x, int img0, int nimg,
                            real_t *xp) {
    const int hp = h + 2 * p, wp = w + 2 * p;
    for (int i = 0; i < nimg; i++)
        for (int yy = 0; yy < hp; yy++) {
            real_t *dst = xp + ((size_t)i * hp + yy) * wp * cin;
            int iy = yy - p;
            if (iy < 0 || iy >= h) {
                memset(dst, 0, (size_t)wp * cin * sizeof(real_t));
                continue;
            }
            memset(dst, 0, (size_t)p * cin * sizeof(real_t));
            memcpy(dst + (size_t)p * cin, x + (((size_t)img0 + i) * h + iy) * w * cin,
                   (size_t)w * cin * sizeof(real_t));
            memset(dst + (size_t)(p + w) * cin, 0, (size_t)p * cin * sizeof(real_t));
        }
}

/* npx consecutive output pixels of one row (cout = nv vectors): xq is the padded
 * input at the first pixel's top-left tap, wpc the padded row length times cin. The
 * npx * nv accumulators stay in registers; each weight vector is loaded once per
 * npx pixels. */
static inline __attribute__((always_inline)) void
opsi_direct_px(const int npx, const int nv, int cin, int k, int s, size_t wpc,
               const real_t *restrict xq, const real_t *restrict wt,
               const real_t *restrict bias, real_t *restrict yp) {
    const int cout = nv * OPSI_VL;
    opsi_vec acc[8][OPSI_MAX_NV];
    for (int q = 0; q < npx; q++)
        for (int j = 0; j < nv; j++)
            acc[q][j] = bias ? (opsi_vec)opsi_vload(bias + j * OPSI_VL) : (opsi_vec){0};
    for (int kh = 0; kh < k; kh++)
        for (int kw = 0; kw < k; kw++) {
            const real_t *xt = xq + kh * wpc + (size_t)kw * cin;
            const real_t *wq = wt + (size_t)(kh * k + kw) * cin * cout;
            for (int ci = 0; ci < cin; ci++) {
                opsi_vec wv[OPSI_MAX_NV];
                for (int j = 0; j < nv; j++) wv[j] = opsi_vload(wq + (size_t)ci * cout + j * OPSI_VL);
                for (int q = 0; q < npx; q++) {
                    const opsi_vec xs = opsi_vbcast(xt[(size_t)q * s * cin + ci]);
                    for (int j = 0; j < nv; j++) acc[q][j] += xs * wv[j];
                }
            }
        }
    for (int q = 0; q < npx; q++)
        for (int j = 0; j < nv; j++) opsi_vstore(yp + (size_t)q * cout + j * OPSI_VL, acc[q][j]);
}

/* y[img][oy][ox][:] = bias + sum over taps and ci of x * wt for images [img0,
 * img0+nimg) (cout = nv vectors), through a padded copy of the tile's input. */
static inline __attribute__((always_inline)) void
opsi_direct_fwd_vec(const OpsiDirect *d, const int nv, const real_t *x, const real_t *wt,
                    const real_t *bias, int img0, int nimg, real_t *y) {
    const int cin = d->cin, k = d->k, s = d->s, p = d->p, cout = nv * OPSI_VL;
    const int hp = d->h + 2 * p, wp = d->w + 2 * p;
    const int npx = nv <= 2 ? 8 : 8 / nv; /* at most 16 accumulators */
    real_t *xp = opsi_col_buffer((size_t)nimg * hp * wp * cin);
    opsi_pad_images(cin, d->h, d->w, p, x, img0, nimg, xp);
    const size_t wpc = (size_t)wp * cin;
    for (int i = 0; i < nimg; i++)
        for (int oy = 0; oy < d->oh; oy++) {
            const real_t *xrow = xp + ((size_t)i * hp + (size_t)oy * s) * wpc;
            real_t *yrow = y + (((size_t)img0 + i) * d->oh + oy) * d->ow * cout;
            int ox = 0;
            if (npx == 8)
                for (; ox + 8 <= d->ow; ox += 8)
                    opsi_direct_px(8, nv, cin, k, s, wpc, xrow + (size_t)ox * s * cin, wt, bias,
                                   yrow + (size_t)ox * cout);
            if (npx >= 4)
                for (; ox + 4 <= d->ow; ox += 4)
                    opsi_direct_px(4, nv, cin, k, s, wpc, xrow + (size_t)ox * s * cin, wt, bias,
                                   yrow + (size_t)ox * cout);
            for (; ox + 2 <= d->ow; ox += 2)
                opsi_direct_px(2, nv, cin, k, s, wpc, xrow + (size_t)ox * s * cin, wt, bias,
                               yrow + (size_t)ox * cout);
            for (; ox < d->ow; ox++)
                opsi_direct_px(1, nv, cin, k, s, wpc, xrow + (size_t)ox * s * cin, wt, bias,
                               yrow + (size_t)ox * cout);
        }
}

/* The same in scalars, any cout (odd shapes: tests, tiny layers). */
static void opsi_direct_fwd_scalar(const OpsiDirect *d, int cout, const real_t *x,
                                   const real_t *wt, const real_t *bias, int img0, int nimg,
                                   real_t *y) {
    const int cin = d->cin, k = d->k, s = d->s, p = d->p, h = d->h, w = d->w;
    for (int i = img0; i < img0 + nimg; i++)
        for (int oy = 0; oy < d->oh; oy++)
            for (int ox = 0; ox < d->ow; ox++) {
                real_t *yp = y + (((size_t)i * d->oh + oy) * d->ow + ox) * cout;
                for (int co = 0; co < cout; co++) yp[co] = bias ? bias[co] : 0;
                for (int kh = 0; kh < k; kh++) {
                    int iy = oy * s - p + kh;
                    if (iy < 0 || iy >= h) continue;
                    for (int kw = 0; kw < k; kw++) {
                        int ix = ox * s - p + kw;
                        if (ix < 0 || ix >= w) continue;
                        const real_t *xp = x + (((size_t)i * h + iy) * w + ix) * cin;
                        const real_t *wp = wt + (size_t)(kh * k + kw) * cin * cout;
                        for (int ci = 0; ci < cin; ci++)
                            for (int co = 0; co < cout; co++)
                                yp[co] += xp[ci] * wp[(size_t)ci * cout + co];
                    }
                }
            }
}

static void opsi_direct_fwd(const OpsiDirect *d, int cout, const real_t *x, const real_t *wt,
                            const real_t *bias, int img0, int nimg, real_t *y) {
    if (cout % OPSI_VL != 0 || cout > OPSI_MAX_NV * OPSI_VL) {
        opsi_direct_fwd_scalar(d, cout, x, wt, bias, img0, nimg, y);
        return;
    }
    switch (cout / OPSI_VL) {
    case 1: opsi_direct_fwd_vec(d, 1, x, wt, bias, img0, nimg, y); break;
    case 2: opsi_direct_fwd_vec(d, 2, x, wt, bias, img0, nimg, y); break;
    case 4: opsi_direct_fwd_vec(d, 4, x, wt, bias, img0, nimg, y); break;
    case 8: opsi_direct_fwd_vec(d, 8, x, wt, bias, img0, nimg, y); break;
    default: opsi_direct_fwd_scalar(d, cout, x, wt, bias, img0, nimg, y); break;
    }
}

/* acc[kh][kw][ci][co] += sum over output pixels of x[tap input][ci] * dy[co]; one tap
 * at a time, its cin * nv accumulators held in registers (constant cin and nv). */
static inline __attribute__((always_inline)) void
opsi_direct_dw_vec(const OpsiDirect *d, const int cin, const int nv, const real_t *restrict x,
                   const real_t *restrict dy, int img0, int nimg, int tap0, int tap1,
                   real_t *restrict acc) {
    const int k = d->k, s = d->s, p = d->p, h = d->h, w = d->w, cout = nv * OPSI_VL;
    for (int tap = tap0; tap < tap1; tap++) {
            const int kh = tap / k, kw = tap % k;
            real_t *a = acc + (size_t)(kh * k + kw) * cin * cout;
            opsi_vec ra[OPSI_DW_REGS];
            for (int r = 0; r < cin * nv; r++) ra[r] = opsi_vload(a + (size_t)r * OPSI_VL);
            int lo, hi;
            opsi_tap_range(w, d->ow, s, p, kw, &lo, &hi);
            for (int i = img0; i < img0 + nimg; i++)
                for (int oy = 0; oy < d->oh; oy++) {
                    int iy = oy * s - p + kh;
                    if (iy < 0 || iy >= h) continue;
                    const real_t *xrow = x + ((size_t)i * h + iy) * w * cin;
                    const real_t *dyrow = dy + ((size_t)i * d->oh + oy) * d->ow * cout;
                    for (int ox = lo; ox < hi; ox++) {
                        const real_t *xp = xrow + (size_t)(ox * s - p + kw) * cin;
                        opsi_vec dv[OPSI_MAX_NV];
                        for (int j = 0; j < nv; j++)
                            dv[j] = opsi_vload(dyrow + (size_t)ox * cout + j * OPSI_VL);
                        for (int ci = 0; ci < cin; ci++) {
                            const opsi_vec xs = opsi_vbcast(xp[ci]);
                            for (int j = 0; j < nv; j++) ra[ci * nv + j] += xs * dv[j];
                        }
                    }
                }
            for (int r = 0; r < cin * nv; r++) opsi_vstore(a + (size_t)r * OPSI_VL, ra[r]);
        }
}

static void opsi_direct_dw_scalar(const OpsiDirect *d, int cout, const real_t *x,
                                  const real_t *dy, int img0, int nimg, int tap0, int tap1,
                                  real_t *acc) {
    const int cin = d->cin, k = d->k, s = d->s, p = d->p, h = d->h, w = d->w;
    for (int tap = tap0; tap < tap1; tap++) {
            const int kh = tap / k, kw = tap % k;
            real_t *a = acc + (size_t)(kh * k + kw) * cin * cout;
            int lo, hi;
            opsi_tap_range(w, d->ow, s, p, kw, &lo, &hi);
            for (int i = img0; i < img0 + nimg; i++)
                for (int oy = 0; oy < d->oh; oy++) {
                    int iy = oy * s - p + kh;
                    if (iy < 0 || iy >= h) continue;
                    for (int ox = lo; ox < hi; ox++) {
                        const real_t *xp = x + (((size_t)i * h + iy) * w + ox * s - p + kw) * cin;
                        const real_t *dyp = dy + (((size_t)i * d->oh + oy) * d->ow + ox) * cout;
                        for (int ci = 0; ci < cin; ci++)
                            for (int co = 0; co < cout; co++)
                                a[(size_t)ci * cout + co] += xp[ci] * dyp[co];
                    }
                }
        }
}

/* Taps [tap0, tap1) of acc (kh * k + kw). */
static void opsi_direct_dw(const OpsiDirect *d, int cout, const real_t *x, const real_t *dy,
                           int img0, int nimg, int tap0, int tap1, real_t *acc) {
    const int nv = cout / OPSI_VL, cin = d->cin;
#define OPSI_DW_CASE(CIN, NV)                                          \
    if (cin == CIN && nv == NV && cout % OPSI_VL == 0) {               \
        opsi_direct_dw_vec(d, CIN, NV, x, dy, img0, nimg, tap0, tap1, acc); \
        return;                                                        \
    }
    OPSI_DW_CASE(3, 1)
    OPSI_DW_CASE(3, 2)
    OPSI_DW_CASE(8, 1)
    OPSI_DW_CASE(8, 2)
    OPSI_DW_CASE(16, 1)
    OPSI_DW_CASE(16, 2)
#undef OPSI_DW_CASE
    opsi_direct_dw_scalar(d, cout, x, dy, img0, nimg, tap0, tap1, acc);
}

/* The GEMM's input rows of images [img0, img0+nimg): x itself for a pointwise
 * (1x1, stride 1) conv, else their im2col in this thread's column buffer. */
static const real_t *opsi_gemm_rows(const ConvSpec *cs, const OpsiConvPlan *p, int h, int w,
                                    const real_t *x, int img0, int nimg) {
    const size_t per_img = (size_t)p->oh * p->ow;
    if (opsi_conv_is_pointwise(cs)) return x + (size_t)img0 * per_img * cs->cin;
    real_t *col = opsi_col_buffer((size_t)nimg * per_img * p->kk);
    opsi_im2col(cs, h, w, p->oh, p->ow, x, img0, nimg, col);
    return col;
}

/* Forward of work tile t. */
static void opsi_conv_forward_tile(const ConvSpec *cs, const OpsiConvPlan *p, int n, int h, int w,
                                   const real_t *x, const real_t *wmat, const real_t *bias,
                                   real_t *y, int t) {
    const int direct = opsi_conv_is_direct(cs);
    const int cout = cs->cout, per_img = p->oh * p->ow;
    const OpsiDirect d = {cs->cin, cs->k, cs->stride, cs->pad, h, w, p->oh, p->ow};
    int img0 = t * p->work_imgs;
    int nimg = n - img0 < p->work_imgs ? n - img0 : p->work_imgs;
    int rows = nimg * per_img;
    if (direct) {
        opsi_direct_fwd(&d, cout, x, wmat, bias, img0, nimg, y);
        return;
    }
    const real_t *a = opsi_gemm_rows(cs, p, h, w, x, img0, nimg);
    real_t *yt = y + (size_t)img0 * per_img * cout;
    OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cout, p->kk, 1, a, p->kk, wmat,
             p->kk, 0, yt, cout);
    if (bias)
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < cout; o++) yt[(size_t)r * cout + o] += bias[o];
}

static void opsi_conv_forward(const ConvSpec *cs, int n, int h, int w, const real_t *x,
                              const real_t *weight, const real_t *bias, real_t *y,
                              real_t *workspace) {
    const OpsiConvPlan p = opsi_conv_plan(cs, n, h, w);
    const int pointwise = opsi_conv_is_pointwise(cs), direct = opsi_conv_is_direct(cs);
    (void)workspace;
    const real_t *wmat = weight;
    if (!pointwise) {
        real_t *wt = opsi_thread_copy(OPSI_TLS_WEIGHT, p.part_len);
        if (direct)
            opsi_weight_to_hwio(cs, weight, wt, 0);
        else
            opsi_weight_to_hwc(cs, weight, wt);
        wmat = wt;
    }
    /* statically: each thread keeps the images it had in the layer before, in its
     * cache (the power-of-two tiles of opsi_conv_plan share a batch of 2^k evenly;
     * taking uneven tiles dynamically measured no faster) */
#pragma omp for schedule(static)
    for (int t = 0; t < p.nwork; t++) opsi_conv_forward_tile(cs, &p, n, h, w, x, wmat, bias, y, t);
}

static void cpu_conv_forward(void *ctx, void *plan, int n, const real_t *x, const real_t *weight,
                             const real_t *bias, real_t *y, void *ws, size_t ws_bytes) {
    (void)ctx;
    (void)ws_bytes;
    const CpuConvPlan *p = plan;
    OPSI_TEAM(opsi_conv_forward(&p->cs, n, p->h, p->w, x, weight, bias, y, ws));
}

/* The input gradient of a stride-1 conv is the direct conv of dy with the flipped,
 * transposed weight and padding k-1-pad. */
static int opsi_conv_dx_is_direct(const ConvSpec *cs) {
    return opsi_conv_is_direct(cs) && cs->stride == 1 && cs->pad <= cs->k - 1 &&
           cs->cin <= OPSI_DIRECT_MAX_COUT;
}

/* dbq[o] += sum over rows of dy[r][o], in double (vectors when cout allows). */
typedef double opsi_dvec __attribute__((vector_size(OPSI_VL * sizeof(double))));
static void opsi_bias_partial(int rows, int cout, const real_t *dy, double *dbq) {
    if (cout % OPSI_VL != 0 || cout > OPSI_MAX_NV * OPSI_VL) {
        for (int r = 0; r < rows; r++)
            for (int o = 0; o < cout; o++) dbq[o] += dy[(size_t)r * cout + o];
        return;
    }
    const int nv = cout / OPSI_VL;
    opsi_dvec acc[OPSI_MAX_NV];
    for (int j = 0; j < nv; j++) acc[j] = (opsi_dvec){0};
    for (int r = 0; r < rows; r++)
        for (int j = 0; j < nv; j++)
            acc[j] += __builtin_convertvector(
                (opsi_vec)opsi_vload(dy + (size_t)r * cout + j * OPSI_VL), opsi_dvec);
    for (int j = 0; j < nv; j++)
        for (int l = 0; l < OPSI_VL; l++) dbq[j * OPSI_VL + l] += acc[j][l];
}

/* Slice sl of dW tile t's contribution to its part's partial dwq (overwritten when
 * `first`), and with slice 0 the bias partial in double. Only the direct kernel
 * has more than one slice. */
static void opsi_conv_bwd_dw_tile(const ConvSpec *cs, const OpsiConvPlan *p, int n, int h, int w,
                                  const real_t *x, const real_t *dy, int t, int sl, int first,
                                  real_t *dwq, double *dbq) {
    const int direct = opsi_conv_is_direct(cs);
    const int cout = cs->cout, per_img = p->oh * p->ow;
    int img0 = t * p->tile_imgs;
    int nimg = n - img0 < p->tile_imgs ? n - img0 : p->tile_imgs;
    int rows = nimg * per_img;
    const real_t *dyt = dy + (size_t)img0 * per_img * cout;
    if (dbq && sl == 0) opsi_bias_partial(rows, cout, dyt, dbq);
    if (direct) {
        const OpsiDirect d = {cs->cin, cs->k, cs->stride, cs->pad, h, w, p->oh, p->ow};
        const int taps = cs->k * cs->k;
        int tap0 = taps * sl / p->nslices, tap1 = taps * (sl + 1) / p->nslices;
        size_t per_tap = (size_t)cs->cin * cout;
        if (first) memset(dwq + tap0 * per_tap, 0, (size_t)(tap1 - tap0) * per_tap * sizeof(real_t));
        opsi_direct_dw(&d, cout, x, dy, img0, nimg, tap0, tap1, dwq);
        return;
    }
    const real_t *a = opsi_gemm_rows(cs, p, h, w, x, img0, nimg);
    OPS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, cout, p->kk, rows, 1, dyt, cout, a, p->kk,
             first ? 0 : 1, dwq, p->kk);
}

/* dx of work tile t's images. */
static void opsi_conv_bwd_dx_tile(const ConvSpec *cs, const OpsiConvPlan *p, int n, int h, int w,
                                  const real_t *wmat, const real_t *dy, int t, real_t *dx) {
    const int pointwise = opsi_conv_is_pointwise(cs);
    const int cout = cs->cout, per_img = p->oh * p->ow;
    int img0 = t * p->dx_imgs;
    int nimg = n - img0 < p->dx_imgs ? n - img0 : p->dx_imgs;
    int rows = nimg * per_img;
    const real_t *dyt = dy + (size_t)img0 * per_img * cout;
    if (pointwise) {
        OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, p->kk, cout, 1, dyt, cout, wmat,
                 p->kk, 0, dx + (size_t)img0 * per_img * cs->cin, p->kk);
    } else if (opsi_conv_dx_is_direct(cs)) {
        const OpsiDirect dt = {cout, cs->k, 1, cs->k - 1 - cs->pad, p->oh, p->ow, h, w};
        opsi_direct_fwd(&dt, cs->cin, dy, wmat, NULL, img0, nimg, dx);
    } else {
        real_t *col = opsi_col_buffer((size_t)rows * p->kk);
        OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, p->kk, cout, 1, dyt, cout, wmat,
                 p->kk, 0, col, p->kk);
        opsi_col2im(cs, h, w, p->oh, p->ow, col, img0, nimg, dx);
    }
}

/* Team. */
static void opsi_conv_backward(const ConvSpec *cs, int n, int h, int w, const real_t *x,
                               const real_t *weight, const real_t *dy, real_t *dx,
                               real_t *dweight, real_t *dbias, real_t *workspace) {
    const OpsiConvPlan p = opsi_conv_plan(cs, n, h, w);
    const int pointwise = opsi_conv_is_pointwise(cs), direct = opsi_conv_is_direct(cs);
    const int cout = cs->cout;
    if (p.ntiles == 0) { /* empty batch: zero gradients */
#pragma omp single
        {
            memset(dweight, 0, p.part_len * sizeof(real_t));
            if (dbias) memset(dbias, 0, (size_t)cout * sizeof(real_t));
        }
        return;
    }
    real_t *parts = workspace;
    double *bparts = dbias ? ops_team_scratch((size_t)p.nparts * cout * sizeof(double)) : NULL;
    /* the weight in the layout the dx path reads, this thread's copy */
    const real_t *wmat = weight;
    if (dx && !pointwise) {
        real_t *wt = opsi_thread_copy(OPSI_TLS_WEIGHT, p.part_len);
        if (opsi_conv_dx_is_direct(cs))
            opsi_weight_to_hwio(cs, weight, wt, 1);
        else
            opsi_weight_to_hwc(cs, weight, wt);
        wmat = wt;
    }
    /* dx first, each thread on its share of the images (static: the same images as the
     * ops before and after, whose rows stay in its cache), then the (part, slice)
     * items of dW, taken dynamically: a thread done with its dx takes more of them */
    if (dx) {
#pragma omp for schedule(static) nowait
        for (int t = 0; t < p.ndx; t++) opsi_conv_bwd_dx_tile(cs, &p, n, h, w, wmat, dy, t, dx);
    }
    const int ndw = p.nparts * p.nslices;
#pragma omp for schedule(dynamic)
    for (int it = 0; it < ndw; it++) {
        int q = it / p.nslices, sl = it % p.nslices;
        int t0 = (int)((int64_t)p.ntiles * q / p.nparts);
        int t1 = (int)((int64_t)p.ntiles * (q + 1) / p.nparts);
        double *bq = bparts ? bparts + (size_t)q * cout : NULL;
        if (bq && sl == 0) memset(bq, 0, (size_t)cout * sizeof(double));
        for (int t = t0; t < t1; t++)
            opsi_conv_bwd_dw_tile(cs, &p, n, h, w, x, dy, t, sl, t == t0,
                                  parts + (size_t)q * p.part_len, bq);
    }
    /* partials summed in part order, each sum stored at its place in PyTorch's layout */
    if (bparts) {
#pragma omp for schedule(static) nowait
        for (int o = 0; o < cout; o++) {
            double s = 0.0;
            for (int q = 0; q < p.nparts; q++) s += bparts[(size_t)q * cout + o];
            dbias[o] = (real_t)s;
        }
    }
    /* read in the partials' order (the direct kernel's [t][ci][o], else [o][t][ci]) */
    const int cin = cs->cin, kk2 = cs->k * cs->k;
    const int outer = direct ? kk2 : cout, mid = direct ? cin : kk2, inner = direct ? cout : cin;
#pragma omp for collapse(2) schedule(static)
    for (int a = 0; a < outer; a++)
        for (int b = 0; b < mid; b++) {
            const size_t row = ((size_t)a * mid + b) * inner;
            for (int c = 0; c < inner; c++) {
                real_t s = parts[row + c];
                for (int q = 1; q < p.nparts; q++) s += parts[(size_t)q * p.part_len + row + c];
                /* (o, ci, t) = direct ? (c, b, a) : (a, c, b) */
                size_t dst = direct ? ((size_t)c * cin + b) * kk2 + a : ((size_t)a * cin + c) * kk2 + b;
                dweight[dst] = s;
            }
        }
}

static void cpu_conv_backward(void *ctx, void *plan, int n, const real_t *x, const real_t *weight,
                              const real_t *dy, real_t *dx, real_t *dweight, real_t *dbias,
                              void *ws, size_t ws_bytes) {
    (void)ctx;
    (void)ws_bytes;
    const CpuConvPlan *p = plan;
    /* the contract the GPU's plans rely on (no backward-data algorithm planned) */
    if (dx && !p->need_dx) die("model: conv backward with a dx on a plan made without need_dx (internal error)");
    OPSI_TEAM(opsi_conv_backward(&p->cs, n, p->h, p->w, x, weight, dy, dx, dweight, dbias, ws));
}
