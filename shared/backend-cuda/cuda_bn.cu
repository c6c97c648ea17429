/* cuda_bn.cu: the batch norms (our NHWC kernels, bn_nhwc.h; one cooperative kernel or two) (ops_cuda.h; shared parts in cuda_internal.h). */
#include "backend-cuda/cuda_internal.h"
#include "model/net.h"

/* ---------------------------------------------------------------- batch norm */

/* Our own NHWC kernels (bn_nhwc.h has the arithmetic and the reduction order): two
 * launches per batch norm, forward or backward, any number of rows, deterministic,
 * ReLU / residual add / the conv bias of a fused conv + BN (net_cuda.cu) fused in. The reduction's last block per
 * channel tile finalises the statistics: the blocks of a tile count themselves in
 * ctx->bn_counters (one unsigned per tile, atomicInc back to 0 by the tile's last
 * block, so graph replays start clean) after a __threadfence() that makes their
 * partials visible (the CUDA Programming Guide's "last block" reduction pattern,
 * its threadFenceReduction sample). */

struct BnFwdArgs {
    const float *x, *bias, *gamma, *beta;
    float *save_mean, *save_invstd, *running_mean, *running_var, *aff;
    float momentum, eps;
};

struct BnBwdArgs {
    const float *x, *y, *dy, *gamma, *save_mean, *save_invstd;
    float *dgamma, *dbeta, *k, *dsum;
};

/* Shared-memory staging of one block's lane sums: [K][lane][channel of the tile]. */
template <int K>
using BnShared = double[K][BN_LANES][BN_TILE + 1];

/* Block (tile, chunk p) of the reduction: the per-lane sums of chunk p for the
 * tile's channels, the lanes added in order into partial[p][k][ch]. Lane work is
 * bn_nhwc.h's. Ends with sh still read by row 0: the caller syncs before reusing it. */
template <int K, class Lane>
__device__ void bn_tile_partial(int tile, int p, int c, double *partial, Lane lane_sums,
                                BnShared<K> &sh) {
    const int tx = threadIdx.x, ty = threadIdx.y, ch = tile * BN_TILE + tx;
    double s[K];
    for (int k = 0; k < K; k++) s[k] = 0.0;
    if (ch < c) lane_sums(ch, p, ty, s);
    for (int k = 0; k < K; k++) sh[k][ty][tx] = s[k];
    __syncthreads();
    if (ty == 0 && ch < c) {
        for (int k = 0; k < K; k++) {
            double t = 0.0;
            for (int l = 0; l < BN_LANES; l++) t += sh[k][l][tx];
            partial[((size_t)p * K + k) * c + ch] = t;
        }
    }
}

/* Tile `tile` once every chunk's partial is in: lane l adds chunks l, l + BN_LANES,
 * ..., the lanes are added in order, and fin(ch, totals) is called per channel. */
template <int K, class Final>
__device__ void bn_tile_final(int tile, int c, int chunks, const double *partial, Final fin,
                              BnShared<K> &sh) {
    const int tx = threadIdx.x, ty = threadIdx.y, ch = tile * BN_TILE + tx;
    double s[K];
    for (int k = 0; k < K; k++) s[k] = 0.0;
    if (ch < c)
#pragma unroll 8
        for (int q = ty; q < chunks; q += BN_LANES)
            for (int k = 0; k < K; k++) s[k] += __ldcg(&partial[((size_t)q * K + k) * c + ch]);
    for (int k = 0; k < K; k++) sh[k][ty][tx] = s[k];
    __syncthreads();
    if (ty == 0 && ch < c) {
        double t[K];
        for (int k = 0; k < K; k++) {
            t[k] = 0.0;
            for (int l = 0; l < BN_LANES; l++) t[k] += sh[k][l][tx];
        }
        fin(ch, t);
    }
}

/* The two-kernel reduction's block (tile blockIdx.x, chunk blockIdx.y): its
 * partial, then, in the tile's last block to finish, the tile's final. */
template <int K, class Lane, class Final>
__device__ void bn_reduce_tile(int64_t rows, int c, int chunks, double *partial,
                               unsigned *counters, Lane lane_sums, Final fin) {
    __shared__ BnShared<K> sh;
    __shared__ int is_last;
    (void)rows;
    bn_tile_partial<K>((int)blockIdx.x, (int)blockIdx.y, c, partial, lane_sums, sh);
    if (threadIdx.y == 0) __threadfence(); /* the partials reach device memory before the count */
    __syncthreads();
    /* atomicInc wraps to 0 on the tile's last block: the counter is ready for the
     * next launch (or graph replay) without a store of its own */
    if (threadIdx.x == 0 && threadIdx.y == 0)
        is_last = atomicInc(&counters[blockIdx.x], gridDim.y - 1) == gridDim.y - 1;
    __syncthreads();
    if (!is_last) return;
    __threadfence();
    bn_tile_final<K>((int)blockIdx.x, c, chunks, partial, fin, sh);
}

/* The one-kernel (cooperative) batch norm, bn_nhwc.h "cooperative order": the
 * partials of every (tile, chunk) item, grid barrier, the finals of every tile, grid
 * barrier, the element-wise pass. Every sum is the two-kernel path's in its order. */
template <int K, class Lane, class Final, class Apply>
__device__ void bn_coop_run(int64_t rows, int c, int chunks, double *partial, Lane lane_sums,
                            Final fin, Apply apply) {
    __shared__ BnShared<K> sh;
    cooperative_groups::grid_group grid = cooperative_groups::this_grid();
    const int tiles = bn_tiles(c);
    for (int64_t w = blockIdx.x; w < (int64_t)tiles * chunks; w += gridDim.x) {
        int tile, p;
        bn_coop_item(w, tiles, &tile, &p);
        bn_tile_partial<K>(tile, p, c, partial, lane_sums, sh);
        __syncthreads(); /* sh is rewritten by the next item */
    }
    grid.sync(); /* every partial written (grid.sync orders global memory) */
    for (int t = blockIdx.x; t < tiles; t += gridDim.x) {
        bn_tile_final<K>(t, c, chunks, partial, fin, sh);
        __syncthreads();
    }
    grid.sync(); /* every channel's affine or coefficients written */
    const int64_t step = bn_coop_elem_step((int)gridDim.x); /* blocks of BN_TILE x BN_LANES */
    for (int64_t i = bn_coop_elem0((int)blockIdx.x, (int)threadIdx.y, (int)threadIdx.x); i < rows * c;
         i += step)
        apply(i);
}

template <int BF16>
__global__ void bn_fwd_reduce_kernel(int64_t rows, int c, int chunks, BnFwdArgs a, double *partial,
                                     unsigned *counters) {
    bn_reduce_tile<2>(
        rows, c, chunks, partial, counters,
        [&](int ch, int p, int lane, double *s) { bn_fwd_lane(a.x, a.bias, rows, c, chunks, ch, p, lane, s, BF16); },
        [&](int ch, const double *t) {
            bn_fwd_final(rows, c, ch, a.x, a.bias, t, a.gamma, a.beta, a.momentum, a.eps, a.save_mean,
                         a.save_invstd, a.running_mean, a.running_var, a.aff, BF16);
        });
}

template <int BF16>
__global__ void bn_bwd_reduce_kernel(int64_t rows, int c, int chunks, BnBwdArgs a, double *partial,
                                     unsigned *counters) {
    bn_reduce_tile<3>(
        rows, c, chunks, partial, counters,
        [&](int ch, int p, int lane, double *s) {
            bn_bwd_lane(a.x, a.y, a.dy, a.save_mean, rows, c, chunks, ch, p, lane, s, BF16);
        },
        [&](int ch, const double *t) {
            bn_bwd_final(rows, c, ch, t, a.gamma, a.save_mean, a.save_invstd, a.dgamma, a.dbeta, a.k,
                         a.dsum);
        });
}

template <int BF16>
__global__ void bn_fwd_coop_kernel(int64_t rows, int c, int chunks, BnFwdArgs a, const float *z,
                                   int mode, float *y, double *partial) {
    bn_coop_run<2>(
        rows, c, chunks, partial,
        [&](int ch, int p, int lane, double *s) { bn_fwd_lane(a.x, a.bias, rows, c, chunks, ch, p, lane, s, BF16); },
        [&](int ch, const double *t) {
            bn_fwd_final(rows, c, ch, a.x, a.bias, t, a.gamma, a.beta, a.momentum, a.eps, a.save_mean,
                         a.save_invstd, a.running_mean, a.running_var, a.aff, BF16);
        },
        [&](int64_t i) { bn_fwd_apply(i, c, (float *)a.x, a.bias, a.aff, z, mode, y, BF16); });
}

/* keep: the masked dy written back into dy (bn_bwd_apply_keep); dx NULL: no pass. */
template <int BF16>
__global__ void bn_bwd_coop_kernel(int64_t rows, int c, int chunks, BnBwdArgs a, float *dx, int keep,
                                   double *partial) {
    bn_coop_run<3>(
        rows, c, chunks, partial,
        [&](int ch, int p, int lane, double *s) {
            bn_bwd_lane(a.x, a.y, a.dy, a.save_mean, rows, c, chunks, ch, p, lane, s, BF16);
        },
        [&](int ch, const double *t) {
            bn_bwd_final(rows, c, ch, t, a.gamma, a.save_mean, a.save_invstd, a.dgamma, a.dbeta, a.k,
                         a.dsum);
        },
        [&](int64_t i) {
            if (!dx) return;
            if (keep)
                bn_bwd_apply_keep(i, c, a.x, a.y, (float *)a.dy, a.k, dx, BF16);
            else
                bn_bwd_apply(i, c, a.x, a.y, a.dy, a.k, dx, BF16);
        });
}

__global__ void bn_eval_final_kernel(int c, const float *gamma, const float *beta,
                                     const float *running_mean, const float *running_var, float eps,
                                     float *aff) {
    int ch = blockIdx.x * blockDim.x + threadIdx.x;
    if (ch < c) bn_eval_final(c, ch, gamma, beta, running_mean, running_var, eps, aff);
}

template <int BF16>
__global__ void bn_fwd_apply_kernel(size_t total, int c, float *x, const float *bias,
                                    const float *aff, const float *z, int mode, float *y) {
    GRID_STRIDE(i, total) bn_fwd_apply((int64_t)i, c, x, bias, aff, z, mode, y, BF16);
}

template <int BF16>
__global__ void bn_bwd_apply_kernel(size_t total, int c, const float *x, const float *y,
                                    const float *dy, const float *k, float *dx) {
    GRID_STRIDE(i, total) bn_bwd_apply((int64_t)i, c, x, y, dy, k, dx, BF16);
}

template <int BF16>
__global__ void bn_bwd_apply_keep_kernel(size_t total, int c, const float *x, const float *y,
                                         float *dy, const float *k, float *dx) {
    GRID_STRIDE(i, total) bn_bwd_apply_keep((int64_t)i, c, x, y, dy, k, dx, BF16);
}

/* rows = n*hw, checked against the scratch the context holds. */
static int64_t bn_rows(int n, int hw, int c) {
    if (n < 1 || hw < 1 || c < 1) die("batch norm over %d x %d rows of %d channels: empty", n, hw, c);
    if (c > BN_MAX_C) die("batch norm over %d channels: the CUDA kernels take at most %d", c, BN_MAX_C);
    return (int64_t)n * hw;
}

static dim3 bn_grid(int64_t rows, int c) {
    return dim3((unsigned)((c + BN_TILE - 1) / BN_TILE), (unsigned)bn_chunks(rows, c));
}

/* ---- one cooperative kernel per training batch norm ----
 * Cooperative launches may be captured into a CUDA graph (CUDA 12+: a kernel node's
 * cudaLaunchAttributeCooperative, "valid for graph nodes, launches", driver_types.h).
 * cudaGraphExecUpdate cannot turn a cooperative node into a plain one or back
 * (cuda_runtime_api.h): after cuda_ctx_bn_coop switches, recapture (the engine never
 * updates a graph). The grid is at most what the
 * occupancy calculator says fits at once (blocks per SM x SMs), as a grid barrier
 * needs; the launch fails rather than deadlocks when it would not fit
 * (cudaErrorCooperativeLaunchTooLarge). CIFAR_CUDA_BN_COOP=0 turns it off. */

static int imin(int a, int b) { return a < b ? a : b; }

/* Blocks of kernel that fit on the device at once, 0 when none. */
template <class Kernel>
static int bn_coop_max_blocks(Kernel kernel, int sms) {
    int per_sm = 0;
    CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kernel, BN_TILE * BN_LANES, 0));
    return per_sm * sms;
}

/* bn_coop 0: two kernels (CIFAR_CUDA_BN_COOP=0, Settings.cuda_bn_coop). */
void bn_coop_plan(CudaCtx *ctx, int bn_coop) {
    static int logged;
    int coop = 0, sms = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&coop, cudaDevAttrCooperativeLaunch, ctx->device));
    CHECK_CUDA(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, ctx->device));
    int off = !bn_coop;
    if (coop) {
        /* one grid size for both activation types: the smaller fit */
        ctx->bn_coop_fwd_blocks = imin(bn_coop_max_blocks(bn_fwd_coop_kernel<0>, sms),
                                       bn_coop_max_blocks(bn_fwd_coop_kernel<1>, sms));
        ctx->bn_coop_bwd_blocks = imin(bn_coop_max_blocks(bn_bwd_coop_kernel<0>, sms),
                                       bn_coop_max_blocks(bn_bwd_coop_kernel<1>, sms));
    }
    int fits = ctx->bn_coop_fwd_blocks > 0 && ctx->bn_coop_bwd_blocks > 0;
    ctx->bn_coop_on = coop && fits && !off;
    if (logged++) return;
    if (ctx->bn_coop_on)
        log_info("batch norm: one cooperative kernel per training batch norm (grids of up to %d "
                 "and %d blocks)", ctx->bn_coop_fwd_blocks, ctx->bn_coop_bwd_blocks);
    else
        log_info("batch norm: two kernels per training batch norm (%s)",
                 off ? "CIFAR_CUDA_BN_COOP=0" : !coop ? "the device has no cooperative launch"
                                                      : "a cooperative grid does not fit");
}

extern "C" int cuda_ctx_bn_coop(CudaCtx *ctx, int enable) {
    if (enable >= 0)
        ctx->bn_coop_on = enable && ctx->bn_coop_fwd_blocks > 0 && ctx->bn_coop_bwd_blocks > 0;
    return ctx->bn_coop_on;
}

extern "C" void cuda_ctx_bn_coop_caps(CudaCtx *ctx, int *fwd, int *bwd) {
    int f = ctx->bn_coop_fwd_blocks, b = ctx->bn_coop_bwd_blocks;
    ctx->bn_coop_fwd_blocks = *fwd;
    ctx->bn_coop_bwd_blocks = *bwd;
    *fwd = f;
    *bwd = b;
}

/* The grid of a cooperative batch norm: enough blocks for every (tile, chunk) item
 * and every element once, capped by what fits at once. */
static unsigned bn_coop_grid(int64_t rows, int c, int max_blocks) {
    int64_t items = (int64_t)bn_tiles(c) * bn_chunks(rows, c);
    int64_t elems = (rows * c + BN_TILE * BN_LANES - 1) / (BN_TILE * BN_LANES);
    int64_t want = items > elems ? items : elems;
    return (unsigned)(want < max_blocks ? want : max_blocks);
}

/* A cooperative launch the runtime refused outside a capture (the grid no longer fits
 * because the GPU is shared or limited now, MPS, or cooperative launches are not
 * supported there): the context turns to two kernels per batch norm for good, said
 * once, and 0 is returned so that the caller launches them. The refusal happens at
 * launch, before anything runs, and is not sticky (cleared here). Inside a capture
 * the error is fatal to the capture, whose guard ends it and runs the step (and every
 * later one: no capture again) eagerly, where this fallback then applies; the first
 * full step is eager anyway, so a
 * refusal is normally met before any capture. */
static int bn_coop_refused(CudaCtx *ctx, cudaError_t rc) {
    int refusal = rc == cudaErrorCooperativeLaunchTooLarge || rc == cudaErrorNotSupported;
    cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
    /* only for a refusal: any other error (a sticky one of an earlier kernel too, which
     * cudaStreamIsCapturing would return as its own) is reported as the launch's */
    if (refusal) CHECK_CUDA(cudaStreamIsCapturing(ctx->stream, &capturing));
    if (!refusal || capturing != cudaStreamCaptureStatusNone)
        check_fail(__FILE__, __LINE__, "cudaLaunchKernelEx (a cooperative batch norm)",
                   cudaGetErrorString(rc), cuda_check_hint(rc));
    (void)cudaGetLastError(); /* the refusal is the thread's last error: the next check reads it */
    ctx->bn_coop_on = 0;
    log_warn("batch norm: the GPU refused a cooperative launch (%s); two kernels per batch norm "
             "from now on", cudaGetErrorString(rc));
    return 0;
}

/* Launches kernel cooperatively on the context's stream: 1, or 0 when the launch was
 * refused and the context turned to two kernels (bn_coop_refused). */
template <class... Params, class... Args>
static int bn_coop_launch(CudaCtx *ctx, unsigned blocks, void (*kernel)(Params...), Args... args) {
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeCooperative;
    attr[0].val.cooperative = 1;
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(blocks);
    cfg.blockDim = dim3(BN_TILE, BN_LANES);
    cfg.dynamicSmemBytes = 0;
    cfg.stream = ctx->stream;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    cudaError_t rc = cudaLaunchKernelEx(&cfg, kernel, args...);
    return rc == cudaSuccess ? 1 : bn_coop_refused(ctx, rc);
}

/* bn_coop_launch of kernel<1> (bf16 activations) or kernel<0>, as ACT_LAUNCH: 1 when
 * launched, 0 when refused (then launch the two kernels). */
#define BN_COOP_LAUNCH(ctx, blocks, kernel, ...)                                               \
    ((ctx)->bf16 ? bn_coop_launch(ctx, blocks, kernel<1>, __VA_ARGS__)                         \
                 : bn_coop_launch(ctx, blocks, kernel<0>, __VA_ARGS__))

/* Training forward: the reduction, then y by mode (x_bias: the bias of the conv whose
 * output x is, not yet added (net_cuda.cu's conv_bn_forward): added to x as it is read
 * and written back into x). */
static void bn_train_run(CudaCtx *ctx, int n, int hw, int c, const float *x, const float *x_bias,
                         const float *gamma, const float *beta, const float *z, int mode, float *y,
                         float *save_mean, float *save_invstd, float *running_mean,
                         float *running_var, float momentum, float eps) {
    int64_t rows = bn_rows(n, hw, c);
    BnFwdArgs a = {x, x_bias, gamma, beta, save_mean, save_invstd, running_mean, running_var,
                   ctx->bn_aff, momentum, eps};
    /* one kernel, the same sums in the same order; two where it is off or refused */
    if (ctx->bn_coop_on &&
        BN_COOP_LAUNCH(ctx, bn_coop_grid(rows, c, ctx->bn_coop_fwd_blocks), bn_fwd_coop_kernel, rows,
                       c, bn_chunks(rows, c), a, z, mode, y, ctx->bn_partial))
        return;
    ACT_LAUNCH(ctx, ctx->bf16, bn_fwd_reduce_kernel, bn_grid(rows, c), dim3(BN_TILE, BN_LANES),
               rows, c, bn_chunks(rows, c), a, ctx->bn_partial, ctx->bn_counters);
    size_t total = (size_t)rows * c;
    ACT_LAUNCH(ctx, ctx->bf16, bn_fwd_apply_kernel, grid_for(total), OPS_CUDA_BLOCK,
               total, c, (float *)x, x_bias, ctx->bn_aff, z, mode, y);
}

/* Inference forward with the running statistics (x_bias as bn_train_run's). */
static void bn_eval_run(CudaCtx *ctx, int n, int hw, int c, const float *x, const float *x_bias,
                        const float *gamma, const float *beta, const float *running_mean,
                        const float *running_var, float eps, float *y) {
    int64_t rows = bn_rows(n, hw, c);
    bn_eval_final_kernel<<<(unsigned)((c + 127) / 128), 128, 0, ctx->stream>>>(
        c, gamma, beta, running_mean, running_var, eps, ctx->bn_aff);
    CHECK_CUDA_LAST();
    size_t total = (size_t)rows * c;
    ACT_LAUNCH(ctx, ctx->bf16, bn_fwd_apply_kernel, grid_for(total), OPS_CUDA_BLOCK,
               total, c, (float *)x, x_bias, ctx->bn_aff, (const float *)NULL, (int)BN_PLAIN, y);
}

extern "C" void batchnorm2d_forward_train_cuda(void *vctx, int n, int hw, int c, const float *x,
                                               const float *gamma, const float *beta, float *y,
                                               float *save_mean, float *save_invstd,
                                               float *running_mean, float *running_var,
                                               float momentum, float eps) {
    bn_train_run((CudaCtx *)vctx, n, hw, c, x, NULL, gamma, beta, NULL, BN_PLAIN, y, save_mean,
                 save_invstd, running_mean, running_var, momentum, eps);
}

extern "C" void batchnorm2d_relu_forward_train_cuda(void *vctx, int n, int hw, int c,
                                                    const float *x, const float *gamma,
                                                    const float *beta, float *y, float *save_mean,
                                                    float *save_invstd, float *running_mean,
                                                    float *running_var, float momentum, float eps) {
    bn_train_run((CudaCtx *)vctx, n, hw, c, x, NULL, gamma, beta, NULL, BN_RELU, y, save_mean,
                 save_invstd, running_mean, running_var, momentum, eps);
}

/* tmp is never needed: one pass, the BN output is never stored. */
extern "C" void batchnorm2d_add_relu_forward_train_cuda(void *vctx, int n, int hw, int c,
                                                        const float *x, const float *gamma,
                                                        const float *beta, const float *z,
                                                        float *tmp, float *y, float *save_mean,
                                                        float *save_invstd, float *running_mean,
                                                        float *running_var, float momentum,
                                                        float eps) {
    (void)tmp;
    bn_train_run((CudaCtx *)vctx, n, hw, c, x, NULL, gamma, beta, z, BN_ADD_RELU, y, save_mean,
                 save_invstd, running_mean, running_var, momentum, eps);
}

extern "C" void batchnorm2d_forward_eval_cuda(void *vctx, int n, int hw, int c, const float *x,
                                              const float *gamma, const float *beta,
                                              const float *running_mean, const float *running_var,
                                              float eps, float *y) {
    bn_eval_run((CudaCtx *)vctx, n, hw, c, x, NULL, gamma, beta, running_mean, running_var, eps,
                y);
}

extern "C" void batchnorm2d_forward_bias_cuda(void *vctx, int n, const float *x,
                                              const float *x_bias, const NetBnForward *bn) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    switch (bn->kind) {
    case NET_BN_EVAL:
        bn_eval_run(ctx, n, bn->hw, bn->c, x, x_bias, bn->gamma, bn->beta, bn->running_mean,
                    bn->running_var, bn->eps, bn->y);
        break;
    case NET_BN_TRAIN:
        bn_train_run(ctx, n, bn->hw, bn->c, x, x_bias, bn->gamma, bn->beta, NULL, BN_PLAIN, bn->y,
                     bn->save_mean, bn->save_invstd, bn->running_mean, bn->running_var,
                     bn->momentum, bn->eps);
        break;
    case NET_BN_TRAIN_RELU:
        bn_train_run(ctx, n, bn->hw, bn->c, x, x_bias, bn->gamma, bn->beta, NULL, BN_RELU, bn->y,
                     bn->save_mean, bn->save_invstd, bn->running_mean, bn->running_var,
                     bn->momentum, bn->eps);
        break;
    case NET_BN_TRAIN_ADD_RELU: /* one pass: bn->tmp is never needed */
        bn_train_run(ctx, n, bn->hw, bn->c, x, x_bias, bn->gamma, bn->beta, bn->z, BN_ADD_RELU,
                     bn->y, bn->save_mean, bn->save_invstd, bn->running_mean, bn->running_var,
                     bn->momentum, bn->eps);
        break;
    }
}

/* The backward reduction of rows x c (with the finalisation: dgamma, dbeta, the
 * coefficients into ctx->bn_aff, dsum). */
static void bn_bwd_reduce_launch(CudaCtx *ctx, int64_t rows, int c, const BnBwdArgs &a) {
    ACT_LAUNCH(ctx, ctx->bf16, bn_bwd_reduce_kernel, bn_grid(rows, c), dim3(BN_TILE, BN_LANES),
               rows, c, bn_chunks(rows, c), a, ctx->bn_partial, ctx->bn_counters);
}

/* The backward as one cooperative kernel (dx non-NULL; keep: bn_bwd_apply_keep);
 * 0 when the context has it off or the launch was refused (the caller launches the
 * two kernels). */
static int bn_bwd_coop_launch(CudaCtx *ctx, int64_t rows, int c, const BnBwdArgs &a, float *dx,
                              int keep) {
    if (!ctx->bn_coop_on) return 0;
    return BN_COOP_LAUNCH(ctx, bn_coop_grid(rows, c, ctx->bn_coop_bwd_blocks), bn_bwd_coop_kernel,
                          rows, c, bn_chunks(rows, c), a, dx, keep, ctx->bn_partial);
}

/* Backward (y: the ReLU output after the BN, or NULL): the reduction, then dx. The
 * column sum of dx (the gradient of a conv bias in front) goes to dsum. keep (y and dx
 * non-NULL, dy writable): the masked dy is also written back into dy
 * (bn_bwd_apply_keep). */
static void bn_backward_run(CudaCtx *ctx, int n, int hw, int c, const float *x, const float *y,
                            const float *gamma, const float *save_mean, const float *save_invstd,
                            const float *dy, float *dx, float *dgamma, float *dbeta, float *dsum,
                            int keep) {
    int64_t rows = bn_rows(n, hw, c);
    BnBwdArgs a = {x, y, dy, gamma, save_mean, save_invstd, dgamma, dbeta, ctx->bn_aff, dsum};
    if (dx && bn_bwd_coop_launch(ctx, rows, c, a, dx, keep)) return;
    bn_bwd_reduce_launch(ctx, rows, c, a);
    if (!dx) return;
    size_t total = (size_t)rows * c;
    if (keep)
        ACT_LAUNCH(ctx, ctx->bf16, bn_bwd_apply_keep_kernel, grid_for(total), OPS_CUDA_BLOCK,
                   total, c, x, y, (float *)dy, (const float *)ctx->bn_aff, dx);
    else
        ACT_LAUNCH(ctx, ctx->bf16, bn_bwd_apply_kernel, grid_for(total), OPS_CUDA_BLOCK,
                   total, c, x, y, dy, (const float *)ctx->bn_aff, dx);
}

/* The keep form's contract: the ReLU output y, and a dx that is not dy. */
static void bn_keep_check(const float *y, const float *dy, const float *dx) {
    if (!y || !dx || dx == dy)
        die("batch norm backward keeping the masked dy: needs y and a dx other than dy "
            "(internal error)");
}

extern "C" void batchnorm2d_relu_backward_keep_cuda(void *vctx, int n, int hw, int c,
                                                    const float *x, const float *y,
                                                    const float *gamma, const float *save_mean,
                                                    const float *save_invstd, float *dy, float *dx,
                                                    float *dgamma, float *dbeta) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    bn_keep_check(y, dy, dx);
    bn_backward_run(ctx, n, hw, c, x, y, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta,
                    ctx->bn_dsum, 1);
}

extern "C" void batchnorm2d_backward_cuda(void *vctx, int n, int hw, int c, const float *x,
                                          const float *gamma, const float *save_mean,
                                          const float *save_invstd, const float *dy, float *dx,
                                          float *dgamma, float *dbeta) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    bn_backward_run(ctx, n, hw, c, x, NULL, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta,
                    ctx->bn_dsum, 0);
}

extern "C" void batchnorm2d_relu_backward_cuda(void *vctx, int n, int hw, int c, const float *x,
                                               const float *y, const float *gamma,
                                               const float *save_mean, const float *save_invstd,
                                               float *dy, float *dx, float *dgamma, float *dbeta) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    bn_backward_run(ctx, n, hw, c, x, y, gamma, save_mean, save_invstd, dy, dx, dgamma, dbeta,
                    ctx->bn_dsum, 0);
}

extern "C" void batchnorm2d_backward_bias_cuda(void *vctx, int n, const NetBnBackward *bn,
                                               float *dbias) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    const float *y = bn->kind == NET_BN_BACKWARD ? NULL : bn->y;
    int keep = bn->kind == NET_BN_RELU_BACKWARD_KEEP;
    if (keep) bn_keep_check(y, bn->dy, bn->dx);
    bn_backward_run(ctx, n, bn->hw, bn->c, bn->x, y, bn->gamma, bn->save_mean, bn->save_invstd,
                    bn->dy, bn->dx, bn->dgamma, bn->dbeta, dbias ? dbias : ctx->bn_dsum, keep);
}
