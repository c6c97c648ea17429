/* cuda_bf16.cu: the bf16 shadows of the conv weights and gradients (ops_cuda.h; shared parts in cuda_internal.h). */
#include "backend-cuda/cuda_internal.h"

/* ------------------------------------------------------------ bf16 shadows */

__global__ void f32_to_bf16_kernel(size_t n, const float *src, bf16_t *dst) {
    GRID_STRIDE(i, n) dst[i] = bf16_from_float(src[i]);
}

__global__ void bf16_to_f32_kernel(size_t n, const bf16_t *src, float *dst) {
    GRID_STRIDE(i, n) dst[i] = bf16_to_float(src[i]);
}

extern "C" void cuda_f32_to_bf16(CudaCtx *ctx, size_t n, const float *src, float *dst_bf16) {
    if (!n) return;
    f32_to_bf16_kernel<<<grid_for(n), OPS_CUDA_BLOCK, 0, ctx->stream>>>(n, src, (bf16_t *)dst_bf16);
    CHECK_CUDA_LAST();
}

extern "C" void cuda_bf16_to_f32(CudaCtx *ctx, size_t n, const float *src_bf16, float *dst) {
    if (!n) return;
    bf16_to_f32_kernel<<<grid_for(n), OPS_CUDA_BLOCK, 0, ctx->stream>>>(n, (const bf16_t *)src_bf16, dst);
    CHECK_CUDA_LAST();
}

/* One block row per segment (blockIdx.y), grid-striding over its elements. */
__global__ void bf16_segments_narrow_kernel(const Bf16Segment *seg, const float *src32, bf16_t *dst16) {
    const Bf16Segment s = seg[blockIdx.y];
    GRID_STRIDE(i, s.count) dst16[s.dst + i] = bf16_from_float(src32[s.src + i]);
}

__global__ void bf16_segments_widen_kernel(const Bf16Segment *seg, const bf16_t *src16, float *dst32) {
    const Bf16Segment s = seg[blockIdx.y];
    GRID_STRIDE(i, s.count) dst32[s.src + i] = bf16_to_float(src16[s.dst + i]);
}

/* Blocks for the segment kernels: x covers the largest segment, y one per segment. */
static dim3 bf16_segments_grid(const CudaCtx *ctx) { return dim3(grid_for(ctx->seg_max), (unsigned)ctx->n_seg); }

void bf16_shadow_release(CudaCtx *ctx) {
    cuda_free(ctx->w16);
    cuda_free(ctx->g16);
    cuda_free(ctx->seg_dev);
    free(ctx->seg);
    ctx->w16 = ctx->g16 = NULL;
    ctx->seg_dev = ctx->seg = NULL;
    ctx->n_seg = 0;
}

extern "C" void cuda_bf16_shadow_init(CudaCtx *ctx, const float *params, float *grads, size_t count,
                                      const Bf16Segment *seg, int n_seg) {
    if (!ctx->bf16) die("bf16 shadows on a context without bf16 activations (internal error)");
    /* gridDim.y of the segment kernels (the CUDA programming guide's limit: 65535) */
    if (n_seg < 1 || n_seg > 65535) die("bf16: %d conv weights to shadow (1 to 65535 supported)", n_seg);
    bf16_shadow_release(ctx);
    ctx->params32 = params;
    ctx->grads32 = grads;
    ctx->nparams = count;
    ctx->n_seg = n_seg;
    ctx->seg = (Bf16Segment *)xmalloc((size_t)n_seg * sizeof *seg);
    memcpy(ctx->seg, seg, (size_t)n_seg * sizeof *seg);
    size_t total = bf16_layout_place(ctx->seg, n_seg);
    ctx->seg_max = 0;
    for (int i = 0; i < n_seg; i++) {
        if (i && ctx->seg[i].src < ctx->seg[i - 1].src + ctx->seg[i - 1].count)
            die("bf16: conv weights out of order or overlapping in the flat params (internal error)");
        if (ctx->seg[i].src + ctx->seg[i].count > count)
            die("bf16: a conv weight beyond the flat params (internal error)");
        if (ctx->seg[i].count > ctx->seg_max) ctx->seg_max = ctx->seg[i].count;
    }
    ctx->seg_dev = (Bf16Segment *)cuda_alloc((size_t)n_seg * sizeof *seg);
    cuda_upload(ctx, ctx->seg_dev, ctx->seg, (size_t)n_seg * sizeof *seg);
    ctx->w16 = (bf16_t *)cuda_alloc(total * sizeof(bf16_t));
    ctx->g16 = (bf16_t *)cuda_alloc(total * sizeof(bf16_t));
    cuda_memset_async(ctx, ctx->w16, 0, total * sizeof(bf16_t));
    cuda_memset_async(ctx, ctx->g16, 0, total * sizeof(bf16_t));
}

extern "C" void cuda_bf16_weights_refresh(CudaCtx *ctx) {
    if (!ctx->w16) return;
    bf16_segments_narrow_kernel<<<bf16_segments_grid(ctx), OPS_CUDA_BLOCK, 0, ctx->stream>>>(
        ctx->seg_dev, ctx->params32, ctx->w16);
    CHECK_CUDA_LAST();
}

extern "C" void cuda_bf16_grads_collect(CudaCtx *ctx) {
    if (!ctx->g16) return;
    bf16_segments_widen_kernel<<<bf16_segments_grid(ctx), OPS_CUDA_BLOCK, 0, ctx->stream>>>(
        ctx->seg_dev, ctx->g16, ctx->grads32);
    CHECK_CUDA_LAST();
}

/* Where the shadow holds p, a pointer into the flat buffer base[0 .. count) within a
 * conv weight, or die (the executor hands the table pointers into the engine's
 * flat buffers, conv weights only). */
static size_t shadow_index(const CudaCtx *ctx, const float *base, const float *p, const char *what) {
    const Bf16Segment *s = NULL;
    if (base && p >= base && p < base + ctx->nparams) s = bf16_layout_find(ctx->seg, ctx->n_seg, (size_t)(p - base));
    if (!s) die("bf16: a conv %s outside the shadowed conv weights (internal error)", what);
    return s->dst + ((size_t)(p - base) - s->src);
}

extern "C" const float *cuda_bf16_weight(CudaCtx *ctx, const float *param) {
    if (!ctx->bf16 || !param) return param; /* NULL stays NULL, as cuda_bf16_grad */
    return (const float *)(ctx->w16 + shadow_index(ctx, ctx->params32, param, "weight"));
}

extern "C" float *cuda_bf16_grad(CudaCtx *ctx, float *grad) {
    if (!ctx->bf16 || !grad) return grad;
    return (float *)(ctx->g16 + shadow_index(ctx, ctx->grads32, grad, "weight gradient"));
}
