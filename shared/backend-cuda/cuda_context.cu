/* cuda_context.cu: the CUDA context (stream, cuDNN and cuBLAS handles, scratch), device memory and the deterministic column sums (ops_cuda.h; shared parts in cuda_internal.h). */
#include "backend-cuda/cuda_internal.h"

/* ---------------------------------------------------------------- context */

extern "C" int ops_cuda_device_count(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* clear the sticky "no driver" error */
        return 0;
    }
    return n;
}

extern "C" int ops_cuda_compute_capability(int device) {
    int major = 0, minor = 0;
    CHECK_CUDA(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device));
    CHECK_CUDA(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device));
    return major * 10 + minor;
}

extern "C" CudaCtx *cuda_ctx_create(int device, int tf32, int deterministic, int bn_coop) {
    CudaCtx *ctx = (CudaCtx *)xcalloc(1, sizeof *ctx);
    ctx->device = device;
    ctx->tf32 = tf32;
    ctx->deterministic = deterministic;
    CHECK_CUDA(cudaSetDevice(device));
    CHECK_CUDA(cudaStreamCreateWithFlags(&ctx->stream, cudaStreamNonBlocking));
    CHECK_CUDNN(cudnnCreate(&ctx->cudnn));
    CHECK_CUDNN(cudnnSetStream(ctx->cudnn, ctx->stream));
    CHECK_CUBLAS(cublasCreate(&ctx->cublas));
    CHECK_CUBLAS(cublasSetStream(ctx->cublas, ctx->stream));
    CHECK_CUBLAS(cublasSetMathMode(ctx->cublas, tf32 ? CUBLAS_TF32_TENSOR_OP_MATH : CUBLAS_DEFAULT_MATH));
    ctx->cublas_ws = cuda_alloc(CUBLAS_WORKSPACE_BYTES);
    CHECK_CUBLAS(cublasSetWorkspace(ctx->cublas, ctx->cublas_ws, CUBLAS_WORKSPACE_BYTES));
    ctx->bn_partial = (double *)cuda_alloc((size_t)BN_PARTIALS * BN_SUMS * sizeof(double));
    ctx->bn_counters = (unsigned *)cuda_alloc(BN_MAX_C / BN_TILE * sizeof(unsigned));
    ctx->bn_aff = (float *)cuda_alloc((size_t)3 * BN_MAX_C * sizeof(float));
    ctx->bn_dsum = (float *)cuda_alloc((size_t)BN_MAX_C * sizeof(float));
    cuda_memset_async(ctx, ctx->bn_counters, 0, BN_MAX_C / BN_TILE * sizeof(unsigned));
    ctx->colsum_scratch = (float *)cuda_alloc(COLSUM_SCRATCH_FLOATS * sizeof(float));
    bn_coop_plan(ctx, bn_coop);
    ctx->loss_dev = (float *)cuda_alloc(sizeof(float));
    ctx->correct_dev = (int *)cuda_alloc(sizeof(int));
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
    return ctx;
}

extern "C" void cuda_ctx_free(CudaCtx *ctx) {
    if (!ctx) return;
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
    cuda_free(ctx->colsum_scratch);
    cuda_free(ctx->loss_dev);
    cuda_free(ctx->correct_dev);
    cuda_free(ctx->bn_partial);
    cuda_free(ctx->bn_counters);
    cuda_free(ctx->bn_aff);
    cuda_free(ctx->bn_dsum);
    bf16_shadow_release(ctx);
    CHECK_CUBLAS(cublasDestroy(ctx->cublas));
    cuda_free(ctx->cublas_ws);
    CHECK_CUDNN(cudnnDestroy(ctx->cudnn));
    CHECK_CUDA(cudaStreamDestroy(ctx->stream));
    free(ctx);
}

extern "C" void cuda_ctx_use_bf16(CudaCtx *ctx) { ctx->bf16 = 1; }
extern "C" int cuda_ctx_bf16(const CudaCtx *ctx) { return ctx->bf16; }
extern "C" int cuda_ctx_device(const CudaCtx *ctx) { return ctx->device; }
extern "C" int cuda_ctx_deterministic(const CudaCtx *ctx) { return ctx->deterministic; }
extern "C" void *cuda_ctx_stream(const CudaCtx *ctx) { return (void *)ctx->stream; }
extern "C" void cuda_ctx_sync(CudaCtx *ctx) {
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
}

extern "C" void *cuda_alloc(size_t bytes) {
    void *p = NULL;
    if (bytes == 0) bytes = 1;
    CHECK_CUDA(cudaMalloc(&p, bytes));
    return p;
}

extern "C" void cuda_free(void *ptr) {
    if (ptr) CHECK_CUDA(cudaFree(ptr));
}

extern "C" void cuda_upload(CudaCtx *ctx, void *dst_dev, const void *src_host, size_t bytes) {
    if (bytes == 0) return;
    CHECK_CUDA(cudaMemcpyAsync(dst_dev, src_host, bytes, cudaMemcpyHostToDevice, ctx->stream));
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
}

extern "C" void cuda_download(CudaCtx *ctx, void *dst_host, const void *src_dev, size_t bytes) {
    if (bytes == 0) return;
    CHECK_CUDA(cudaMemcpyAsync(dst_host, src_dev, bytes, cudaMemcpyDeviceToHost, ctx->stream));
    CHECK_CUDA(cudaStreamSynchronize(ctx->stream));
}

extern "C" void cuda_memset_async(CudaCtx *ctx, void *dst_dev, int value, size_t bytes) {
    if (bytes) CHECK_CUDA(cudaMemsetAsync(dst_dev, value, bytes, ctx->stream));
}

extern "C" void cuda_copy_d2d_async(void *vctx, void *dst_dev, const void *src_dev, size_t bytes) {
    CudaCtx *ctx = (CudaCtx *)vctx;
    if (bytes && dst_dev != src_dev)
        CHECK_CUDA(cudaMemcpyAsync(dst_dev, src_dev, bytes, cudaMemcpyDeviceToDevice, ctx->stream));
}

/* ------------------------------------------------- deterministic column sums */

/* partial[chunk][col] = sum of x[r][col] over the rows of that chunk, in a fixed
 * order: each of the 8 row lanes strides through the chunk, then lanes add up. */
template <int BF16>
__global__ void colsum_partial_kernel(const float *x, int64_t rows, int c, int64_t rows_per_chunk,
                                      float *partial) {
    __shared__ float sh[8][33];
    int col = blockIdx.x * 32 + threadIdx.x;
    int64_t r0 = (int64_t)blockIdx.y * rows_per_chunk;
    int64_t r1 = r0 + rows_per_chunk < rows ? r0 + rows_per_chunk : rows;
    float s = 0.0f;
    if (col < c)
        for (int64_t r = r0 + threadIdx.y; r < r1; r += 8) s += act_load(x, r * c + col, BF16);
    sh[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && col < c) {
        float t = 0.0f;
        for (int i = 0; i < 8; i++) t += sh[i][threadIdx.x];
        partial[(size_t)blockIdx.y * c + col] = t;
    }
}

__global__ void colsum_final_kernel(const float *partial, int chunks, int c, float *out) {
    int col = blockIdx.x * blockDim.x + threadIdx.x;
    if (col >= c) return;
    float t = 0.0f;
    for (int i = 0; i < chunks; i++) t += partial[(size_t)i * c + col];
    out[col] = t;
}

/* out[c] = sum over rows of x[rows][c] (overwritten); x bfloat16 when bf16. */
void colsum(CudaCtx *ctx, int64_t rows, int c, const float *x, float *out, int bf16) {
    if ((size_t)c > COLSUM_SCRATCH_FLOATS)
        die("column sum over %d channels exceeds the %zu-float scratch", c, COLSUM_SCRATCH_FLOATS);
    int64_t chunks = (rows + 255) / 256;
    int64_t max_chunks = (int64_t)(COLSUM_SCRATCH_FLOATS / (size_t)c);
    if (max_chunks > COLSUM_MAX_CHUNKS) max_chunks = COLSUM_MAX_CHUNKS;
    if (chunks > max_chunks) chunks = max_chunks;
    if (chunks < 1) chunks = 1;
    int64_t per = (rows + chunks - 1) / chunks;
    if (per < 1) per = 1;
    dim3 block(32, 8), grid((unsigned)((c + 31) / 32), (unsigned)chunks);
    ACT_LAUNCH(ctx, bf16, colsum_partial_kernel, grid, block, x, rows, c, per, ctx->colsum_scratch);
    colsum_final_kernel<<<(unsigned)((c + 127) / 128), 128, 0, ctx->stream>>>(
        ctx->colsum_scratch, (int)chunks, c, out);
    CHECK_CUDA_LAST();
}
