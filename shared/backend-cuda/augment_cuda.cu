/* augment_cuda.cu: augment.h's augment_batch on the device (declared in ops_cuda.h).
 * The dataset split sits on the device as uint8; one thread builds one output
 * pixel (all its channels) exactly as augment.c's augment_one does, with the same
 * augment_draw, rng_cutout and augment_cut (augment.h), so CPU and GPU batches
 * are bit-identical: the normalisation is written with explicit _rn operations so
 * that nvcc cannot fuse it into an FMA (nor can the CPU's compiler: augment.c is
 * built with -ffp-contract=off, Makefile's FP_EXACT_OBJS).
 *
 * Staged batches (a split streamed through pinned buffers, engine_cuda.cu): the
 * pixels and labels hold the batch's records in batch order, so sample i's record
 * is row i, while its random crop and flip are still keyed by its index in the
 * split, idx[i]: the same batch as from the resident split. */
#include "backend-cuda/bn_nhwc.h"
#include "backend-cuda/cuda_check.h"
#include "backend-cuda/ops_cuda.h"
#include "core/rng.h"

#define AUGMENT_BLOCK 256

template <int BF16>
__global__ void augment_kernel(AugmentSpec s, const uint8_t *pixels, const int32_t *labels,
                               const int64_t *idx, int n, float *out, int32_t *out_labels,
                               const int64_t *epoch_dev, int staged) {
    const int h = s.h, w = s.w, c = s.c;
    const int64_t epoch = epoch_dev ? *epoch_dev : s.epoch;
    const int64_t rec_bytes = (int64_t)h * w * c;
    const int64_t total = (int64_t)n * h * w;
    for (int64_t t = (int64_t)blockIdx.x * blockDim.x + threadIdx.x; t < total;
         t += (int64_t)gridDim.x * blockDim.x) {
        const int i = (int)(t / ((int64_t)h * w));
        const int y = (int)((t / w) % h);
        const int x = (int)(t % w);
        const int64_t sample = idx[i];
        const int64_t row = staged ? (int64_t)i : sample;
        const AugmentDraw d = augment_draw(&s, epoch, sample);
        CutoutDraw cut = {0, 0};
        if (s.cutout > 0) cut = rng_cutout(s.seed, (uint64_t)epoch, (uint64_t)sample, h, w);
        const int cutout = augment_cut(&s, cut, y, x);
        const int sy = y + d.dy - s.pad;
        const int xx = d.flip ? w - 1 - x : x; /* flip after cropping, as torchvision */
        const int sx = xx + d.dx - s.pad;
        const int64_t o = (int64_t)i * rec_bytes + ((int64_t)y * w + x) * c;
        const int inside = sy >= 0 && sy < h && sx >= 0 && sx < w;
        const uint8_t *p = inside ? pixels + row * rec_bytes + ((int64_t)sy * w + sx) * c : pixels;
        for (int ch = 0; ch < c; ch++) {
            const float scale = __fdiv_rn(1.0f, __fmul_rn(255.0f, s.std[ch]));
            const float shift = __fdiv_rn(-s.mean[ch], s.std[ch]);
            const float v = inside ? __fadd_rn(__fmul_rn((float)p[ch], scale), shift) : shift;
            act_store(out, o + ch, cutout ? 0.0f : v, BF16);
        }
        if (y == 0 && x == 0) out_labels[i] = labels[row];
    }
}

extern "C" void augment_batch_cuda(CudaCtx *ctx, const AugmentSpec *spec, const uint8_t *pixels,
                                   const int32_t *labels, const int64_t *idx, int n, float *out,
                                   int32_t *out_labels, const int64_t *epoch_dev, int staged) {
    if (n <= 0) return;
    if (spec->c < 1 || spec->c > 4) die("augment: %d channels (1 to 4 supported)", spec->c);
    int64_t total = (int64_t)n * spec->h * spec->w;
    int64_t blocks = (total + AUGMENT_BLOCK - 1) / AUGMENT_BLOCK;
    if (blocks > (1 << 20)) blocks = 1 << 20;
    cudaStream_t s = (cudaStream_t)cuda_ctx_stream(ctx);
    if (cuda_ctx_bf16(ctx)) /* the stem conv reads bfloat16 (ops_cuda.h) */
        augment_kernel<1><<<(unsigned)blocks, AUGMENT_BLOCK, 0, s>>>(*spec, pixels, labels, idx, n, out,
                                                                    out_labels, epoch_dev, staged);
    else
        augment_kernel<0><<<(unsigned)blocks, AUGMENT_BLOCK, 0, s>>>(*spec, pixels, labels, idx, n, out,
                                                                    out_labels, epoch_dev, staged);
    CHECK_CUDA_LAST();
}
