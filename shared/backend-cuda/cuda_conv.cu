/* cuda_conv.cu: the convolutions (cuDNN plans, forward, backward, the weight layouts) (ops_cuda.h; shared parts in cuda_internal.h). */
#include "backend-cuda/cuda_internal.h"

/* --------------------------------------------------------------- convolution */

__global__ void weight_to_krsc_kernel(int cout, int cin, int k, const float *kcrs, float *krsc) {
    size_t total = (size_t)cout * cin * k * k;
    GRID_STRIDE(i, total) {
        /* i indexes kcrs: ((o*cin + c)*k + r)*k + s */
        size_t s = i % k, r = (i / k) % k, c = (i / ((size_t)k * k)) % cin, o = i / ((size_t)k * k * cin);
        krsc[((o * k + r) * k + s) * cin + c] = kcrs[i];
    }
}

__global__ void weight_from_krsc_kernel(int cout, int cin, int k, const float *krsc, float *kcrs) {
    size_t total = (size_t)cout * cin * k * k;
    GRID_STRIDE(i, total) {
        size_t s = i % k, r = (i / k) % k, c = (i / ((size_t)k * k)) % cin, o = i / ((size_t)k * k * cin);
        kcrs[i] = krsc[((o * k + r) * k + s) * cin + c];
    }
}

extern "C" void conv_weight_to_krsc_cuda(CudaCtx *ctx, const ConvSpec *cs, const float *kcrs,
                                         float *krsc) {
    size_t total = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    weight_to_krsc_kernel<<<grid_for(total), OPS_CUDA_BLOCK, 0, ctx->stream>>>(cs->cout, cs->cin, cs->k,
                                                                               kcrs, krsc);
    CHECK_CUDA_LAST();
}

extern "C" void conv_weight_from_krsc_cuda(CudaCtx *ctx, const ConvSpec *cs, const float *krsc,
                                           float *kcrs) {
    size_t total = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    weight_from_krsc_kernel<<<grid_for(total), OPS_CUDA_BLOCK, 0, ctx->stream>>>(cs->cout, cs->cin,
                                                                                 cs->k, krsc, kcrs);
    CHECK_CUDA_LAST();
}

struct ConvCuda {
    ConvSpec cs;
    int max_n, h, w, oh, ow;
    size_t ws_limit, ws_bytes;
    cudnnTensorDescriptor_t xd, yd;
    cudnnFilterDescriptor_t wd;
    cudnnConvolutionDescriptor_t cd;
    /* Chosen at max_n, and in use for cur_n (fallbacks when they need more workspace). */
    cudnnConvolutionFwdAlgo_t fwd, cur_fwd;
    cudnnConvolutionBwdDataAlgo_t bwd_data, cur_bwd_data;
    cudnnConvolutionBwdFilterAlgo_t bwd_filter, cur_bwd_filter;
    cudnnMathType_t math_fwd, math_bwd_data, math_bwd_filter;
    int cur_n;
    int backward; /* 0: inference only (forward algorithm only) */
    unsigned passes; /* conv_plan_passes: the stem's has no CONV_PASS_BWD_DATA */
    cudnnDataType_t dtype; /* of x, w and y: float, or bfloat16 (bf16 context) */
    char desc[192];
};

/* fp32: plain FMA math only (cuDNN's default would allow TF32 for float data);
 * tf32: tensor-op math, never the fp16 down-conversion. */
static int conv_math_ok(const CudaCtx *ctx, cudnnMathType_t m) {
    if (m == CUDNN_TENSOR_OP_MATH_ALLOW_CONVERSION) return 0;
    return ctx->tf32 || ctx->bf16 || m != CUDNN_TENSOR_OP_MATH;
}

/* bf16: cuDNN's PSEUDO_BFLOAT16 configuration (x, w, y in bfloat16, the convolution
 * computed in float: CUDNN_DATA_FLOAT in the convolution descriptor), tensor-op math
 * (bfloat16 tensor cores: compute capability 8.0 and newer, checked by the engine). */
static cudnnMathType_t conv_base_math(const CudaCtx *ctx) {
    return ctx->tf32 || ctx->bf16 ? CUDNN_TENSOR_OP_MATH : CUDNN_FMA_MATH;
}

static cudnnMathType_t conv_chosen_math(const CudaCtx *ctx, cudnnMathType_t m) {
    return ctx->tf32 || ctx->bf16 ? m : CUDNN_FMA_MATH;
}

static cudnnDataType_t conv_data_type(const CudaCtx *ctx) {
    return ctx->bf16 ? CUDNN_DATA_BFLOAT16 : CUDNN_DATA_FLOAT;
}

static const char *conv_math_name(const CudaCtx *ctx) {
    return ctx->bf16 ? "bf16" : ctx->tf32 ? "tf32" : "fp32";
}

/* cuDNN's tensor descriptors take int dimensions and at most 2^31-1 elements
 * (the cuDNN API reference on cudnnSetTensor4dDescriptor): refuse larger batches
 * with the reason rather than a bad-parameter status. */
static void conv_check_elements(const ConvCuda *cv, int n) {
    int64_t in = (int64_t)n * cv->h * cv->w * cv->cs.cin, out = (int64_t)n * cv->oh * cv->ow * cv->cs.cout;
    if (in > INT32_MAX || out > INT32_MAX)
        die("convolution on %d images of %dx%dx%d: %lld elements, more than cuDNN's 2^31-1 per tensor: "
            "lower --batch-size", n, cv->h, cv->w, cv->cs.cin, (long long)(in > out ? in : out));
}

static void conv_set_batch_desc(ConvCuda *cv, int n) {
    conv_check_elements(cv, n);
    CHECK_CUDNN(cudnnSetTensor4dDescriptor(cv->xd, CUDNN_TENSOR_NHWC, cv->dtype, n, cv->cs.cin,
                                           cv->h, cv->w));
    CHECK_CUDNN(cudnnSetTensor4dDescriptor(cv->yd, CUDNN_TENSOR_NHWC, cv->dtype, n, cv->cs.cout,
                                           cv->oh, cv->ow));
}

/* Workspace of algorithm a run with math m, for the batch size now in the
 * descriptors; (size_t)-1 when cuDNN rejects the pair for this shape: the
 * cudnnGetConvolution*WorkspaceSize functions return CUDNN_STATUS_NOT_SUPPORTED for
 * a descriptor combination the algorithm does not support (cuDNN 9 API reference,
 * cudnn_cnn library), and an algorithm cudnnFind* listed can still be refused there
 * (NVIDIA developer forum, "Algorithm recommended by
 * cudnnFindConvolutionForwardAlgorithm fails to run when output channels are not a
 * multiple of 8": NOT_SUPPORTED from the workspace query). The math is set first:
 * the size, and whether the algorithm runs at all, depend on it. */
static size_t conv_ws_fwd(CudaCtx *ctx, ConvCuda *cv, cudnnConvolutionFwdAlgo_t a, cudnnMathType_t m) {
    size_t b = 0;
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, m));
    if (cudnnGetConvolutionForwardWorkspaceSize(ctx->cudnn, cv->xd, cv->wd, cv->cd, cv->yd, a, &b) !=
        CUDNN_STATUS_SUCCESS)
        return (size_t)-1;
    return b;
}

static size_t conv_ws_bwd_data(CudaCtx *ctx, ConvCuda *cv, cudnnConvolutionBwdDataAlgo_t a,
                               cudnnMathType_t m) {
    size_t b = 0;
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, m));
    if (cudnnGetConvolutionBackwardDataWorkspaceSize(ctx->cudnn, cv->wd, cv->yd, cv->cd, cv->xd, a, &b) !=
        CUDNN_STATUS_SUCCESS)
        return (size_t)-1;
    return b;
}

static size_t conv_ws_bwd_filter(CudaCtx *ctx, ConvCuda *cv, cudnnConvolutionBwdFilterAlgo_t a,
                                 cudnnMathType_t m) {
    size_t b = 0;
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, m));
    if (cudnnGetConvolutionBackwardFilterWorkspaceSize(ctx->cudnn, cv->xd, cv->yd, cv->cd, cv->wd, a,
                                                       &b) != CUDNN_STATUS_SUCCESS)
        return (size_t)-1;
    return b;
}

/* conv_pick's workspace queries (conv_pick.h's ConvWsQuery), one per pass. */
typedef struct {
    CudaCtx *ctx;
    ConvCuda *cv;
} ConvQuery;

static int conv_query_fwd(void *u, int algo, int math, size_t *bytes) {
    ConvQuery *q = (ConvQuery *)u;
    *bytes = conv_ws_fwd(q->ctx, q->cv, (cudnnConvolutionFwdAlgo_t)algo, (cudnnMathType_t)math);
    return *bytes == (size_t)-1;
}

static int conv_query_bwd_data(void *u, int algo, int math, size_t *bytes) {
    ConvQuery *q = (ConvQuery *)u;
    *bytes = conv_ws_bwd_data(q->ctx, q->cv, (cudnnConvolutionBwdDataAlgo_t)algo, (cudnnMathType_t)math);
    return *bytes == (size_t)-1;
}

static int conv_query_bwd_filter(void *u, int algo, int math, size_t *bytes) {
    ConvQuery *q = (ConvQuery *)u;
    *bytes = conv_ws_bwd_filter(q->ctx, q->cv, (cudnnConvolutionBwdFilterAlgo_t)algo, (cudnnMathType_t)math);
    return *bytes == (size_t)-1;
}

/* cuDNN's list as candidates (cudnnConvolution*AlgoPerf_t: algo, status, memory,
 * determinism, mathType), then, unless determinism is asked, the pass's
 * workspace-free default with the base math (the default is not known to be
 * deterministic for every shape). Returns the count (at most got + 1). */
template <typename Perf>
static int conv_candidates(const CudaCtx *ctx, const Perf *perf, int got, int dflt, ConvCandidate *out) {
    int n = 0;
    for (int i = 0; i < got; i++, n++) {
        out[n].algo = (int)perf[i].algo;
        out[n].math = (int)conv_chosen_math(ctx, perf[i].mathType);
        out[n].status = (int)perf[i].status;
        out[n].succeeded = perf[i].status == CUDNN_STATUS_SUCCESS;
        out[n].math_allowed = conv_math_ok(ctx, perf[i].mathType);
        out[n].deterministic = perf[i].determinism == CUDNN_DETERMINISTIC;
    }
    if (!ctx->deterministic) {
        out[n].algo = dflt;
        out[n].math = (int)conv_base_math(ctx);
        out[n].status = (int)CUDNN_STATUS_SUCCESS;
        out[n].succeeded = out[n].math_allowed = 1;
        out[n].deterministic = 0;
        n++;
    }
    return n;
}

/* No candidate fits: every candidate with what became of it (so the user sees why),
 * cuDNN's last error message, then exit. */
__attribute__((noreturn)) static void conv_none_fits(const CudaCtx *ctx, const ConvCuda *cv,
                                                     const char *pass, const ConvCandidate *c,
                                                     const ConvTried *tried, int n) {
    char last[256] = "";
    cudnnGetLastErrorString(last, sizeof last);
    log_error("cuDNN %s of conv %dx%d stride %d, %d -> %d channels on %dx%dx%d: no candidate fits "
              "(%s, workspace limit %zu bytes, math %s); tried:",
              pass, cv->cs.k, cv->cs.k, cv->cs.stride, cv->cs.cin, cv->cs.cout, cv->max_n, cv->h, cv->w,
              ctx->deterministic ? "deterministic only" : "any determinism", cv->ws_limit,
              conv_math_name(ctx));
    log_error("  algo  status                          deterministic  math  verdict                     workspace");
    for (int i = 0; i < n; i++)
        log_error("  %4d  %-30s  %-13s  %4d  %-26s  %zu", c[i].algo,
                  cudnnGetErrorString((cudnnStatus_t)c[i].status), c[i].deterministic ? "yes" : "no",
                  c[i].math, conv_try_name(tried[i].verdict), tried[i].ws);
    check_fail(__FILE__, __LINE__, "cuDNN convolution algorithm", last[0] ? last : pass,
               ctx->deterministic ? "run without --deterministic, or try --precision fp32 or another cuDNN version"
                                  : "try --precision fp32 or another cuDNN version");
}

/* The candidate conv_pick takes (the picked index), or the table and exit. */
static int conv_pick_or_die(CudaCtx *ctx, ConvCuda *cv, const char *pass, const ConvCandidate *c, int n,
                            ConvWsQuery query, size_t *ws) {
    std::vector<ConvTried> tried((size_t)n + 1);
    ConvQuery q = {ctx, cv};
    int at = conv_pick(c, n, ctx->deterministic, cv->ws_limit, query, &q, tried.data());
    if (at < 0) conv_none_fits(ctx, cv, pass, c, tried.data(), n);
    *ws = tried[at].ws;
    return at;
}

/* One pass (forward, backward data, backward filter): its candidates measured by
 * cudnnFind* (sorted by time), or ranked by heuristics (cudnnGet*_v7) when
 * deterministic; the first whose workspace, sized with the math it will run with,
 * fits (conv_pick.h). Find and Get see the base math (the previous pass's workspace
 * queries changed it). The list asked for is as long as
 * cudnnGetConvolution*AlgorithmMaxCount says these calls can return (the cuDNN API
 * reference on cudnnGetConvolutionForwardAlgorithmMaxCount: "the sum of all
 * algorithms plus the sum of all algorithms with Tensor Core operations supported for
 * the current device"), not the enum's *_ALGO_COUNT: with an entry per algorithm and
 * math type both calls can list more than that, and a list cut at *_ALGO_COUNT can
 * lose the only deterministic or fitting candidate (under --deterministic, Get_v7's
 * ranking, cut, is the whole choice). Paddle's and MegEngine's cuDNN pickers size
 * their lists the same way. */
#define CONV_PASS(perf_t, max_count_fn, enum_count, get_call, find_call, ctx, cv, dflt, query, out_algo, \
                  out_math, out_ws, pass)                                                                 \
    do {                                                                                                  \
        int max_ = 0;                                                                                     \
        CHECK_CUDNN(max_count_fn((ctx)->cudnn, &max_));                                                   \
        const int want_ = conv_list_capacity(max_, (int)(enum_count));                                    \
        std::vector<perf_t> perf_((size_t)want_);                                                         \
        std::vector<ConvCandidate> cand_((size_t)want_ + 1);                                              \
        int got_ = 0;                                                                                     \
        CHECK_CUDNN(cudnnSetConvolutionMathType((cv)->cd, conv_base_math(ctx)));                          \
        if ((ctx)->deterministic)                                                                         \
            CHECK_CUDNN(get_call);                                                                        \
        else                                                                                              \
            CHECK_CUDNN(find_call);                                                                       \
        got_ = conv_list_got(got_, want_);                                                                \
        int n_ = conv_candidates(ctx, perf_.data(), got_, (int)(dflt), cand_.data());                     \
        int at_ = conv_pick_or_die(ctx, cv, pass, cand_.data(), n_, query, &(out_ws));                    \
        (out_algo) = (decltype(out_algo))cand_[at_].algo;                                                 \
        (out_math) = (cudnnMathType_t)cand_[at_].math;                                                    \
    } while (0)

/* Each planned pass's algorithm, math and workspace at max_n (conv_plan_passes). */
static void conv_pick_algorithms(CudaCtx *ctx, ConvCuda *cv, size_t ws[3]) {
    ws[0] = ws[1] = ws[2] = 0;
    cv->fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
    cv->bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
    cv->bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    cv->math_fwd = cv->math_bwd_data = cv->math_bwd_filter = conv_base_math(ctx);
    CONV_PASS(cudnnConvolutionFwdAlgoPerf_t, cudnnGetConvolutionForwardAlgorithmMaxCount,
              CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
              cudnnGetConvolutionForwardAlgorithm_v7(ctx->cudnn, cv->xd, cv->wd, cv->cd, cv->yd, want_, &got_,
                                                     perf_.data()),
              cudnnFindConvolutionForwardAlgorithm(ctx->cudnn, cv->xd, cv->wd, cv->cd, cv->yd, want_, &got_,
                                                   perf_.data()),
              ctx, cv, cv->fwd, conv_query_fwd, cv->fwd, cv->math_fwd, ws[0], "forward");
    /* inference only: no backward search (seconds per run); the stem: no backward data */
    if (cv->passes & CONV_PASS_BWD_DATA)
        CONV_PASS(cudnnConvolutionBwdDataAlgoPerf_t, cudnnGetConvolutionBackwardDataAlgorithmMaxCount,
                  CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                  cudnnGetConvolutionBackwardDataAlgorithm_v7(ctx->cudnn, cv->wd, cv->yd, cv->cd, cv->xd, want_,
                                                              &got_, perf_.data()),
                  cudnnFindConvolutionBackwardDataAlgorithm(ctx->cudnn, cv->wd, cv->yd, cv->cd, cv->xd, want_,
                                                            &got_, perf_.data()),
                  ctx, cv, cv->bwd_data, conv_query_bwd_data, cv->bwd_data, cv->math_bwd_data, ws[1],
                  "backward data");
    if (cv->passes & CONV_PASS_BWD_FILTER)
        CONV_PASS(cudnnConvolutionBwdFilterAlgoPerf_t, cudnnGetConvolutionBackwardFilterAlgorithmMaxCount,
                  CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT,
                  cudnnGetConvolutionBackwardFilterAlgorithm_v7(ctx->cudnn, cv->xd, cv->yd, cv->cd, cv->wd, want_,
                                                                &got_, perf_.data()),
                  cudnnFindConvolutionBackwardFilterAlgorithm(ctx->cudnn, cv->xd, cv->yd, cv->cd, cv->wd, want_,
                                                              &got_, perf_.data()),
                  ctx, cv, cv->bwd_filter, conv_query_bwd_filter, cv->bwd_filter, cv->math_bwd_filter,
                  ws[2], "backward filter");
}

static size_t size_max3(size_t a, size_t b, size_t c) {
    size_t m = a > b ? a : b;
    return m > c ? m : c;
}

extern "C" ConvCuda *conv_cuda_create(CudaCtx *ctx, const ConvSpec *cs, int max_n, int h, int w,
                                      size_t ws_limit, int backward, int need_dx) {
    ConvCuda *cv = (ConvCuda *)xcalloc(1, sizeof *cv);
    cv->cs = *cs;
    cv->passes = conv_plan_passes(backward, need_dx);
    cv->backward = backward;
    cv->max_n = max_n;
    cv->h = h;
    cv->w = w;
    cv->oh = conv_out_size(h, cs->k, cs->stride, cs->pad);
    cv->ow = conv_out_size(w, cs->k, cs->stride, cs->pad);
    cv->ws_limit = ws_limit;
    cv->dtype = conv_data_type(ctx);
    if (max_n < 1 || cv->oh < 1 || cv->ow < 1)
        die("convolution %dx%d stride %d on %dx%d: empty output", cs->k, cs->k, cs->stride, h, w);
    CHECK_CUDNN(cudnnCreateTensorDescriptor(&cv->xd));
    CHECK_CUDNN(cudnnCreateTensorDescriptor(&cv->yd));
    CHECK_CUDNN(cudnnCreateFilterDescriptor(&cv->wd));
    CHECK_CUDNN(cudnnCreateConvolutionDescriptor(&cv->cd));
    CHECK_CUDNN(cudnnSetFilter4dDescriptor(cv->wd, cv->dtype, CUDNN_TENSOR_NHWC, cs->cout, cs->cin,
                                           cs->k, cs->k));
    CHECK_CUDNN(cudnnSetConvolution2dDescriptor(cv->cd, cs->pad, cs->pad, cs->stride, cs->stride, 1, 1,
                                                CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT));
    conv_set_batch_desc(cv, max_n);
    int on, oc, oh, ow;
    CHECK_CUDNN(cudnnGetConvolution2dForwardOutputDim(cv->cd, cv->xd, cv->wd, &on, &oc, &oh, &ow));
    if (on != max_n || oc != cs->cout || oh != cv->oh || ow != cv->ow)
        die("cuDNN computes a %dx%dx%dx%d convolution output where %dx%dx%dx%d was expected", on, oh, ow,
            oc, max_n, cv->oh, cv->ow, cs->cout);
    size_t ws[3];
    conv_pick_algorithms(ctx, cv, ws);
    cv->ws_bytes = size_max3(ws[0], ws[1], ws[2]);
    cv->cur_n = max_n;
    cv->cur_fwd = cv->fwd;
    cv->cur_bwd_data = cv->bwd_data;
    cv->cur_bwd_filter = cv->bwd_filter;
    snprintf(cv->desc, sizeof cv->desc, "fwd=%d bwd_data=%d bwd_filter=%d math=%d/%d/%d ws=%zu",
             (int)cv->fwd, (int)cv->bwd_data, (int)cv->bwd_filter, (int)cv->math_fwd,
             (int)cv->math_bwd_data, (int)cv->math_bwd_filter, cv->ws_bytes);
    return cv;
}

extern "C" void conv_cuda_free(void *vctx, void *plan) {
    ConvCuda *cv = (ConvCuda *)plan;
    (void)vctx;
    if (!cv) return;
    CHECK_CUDNN(cudnnDestroyTensorDescriptor(cv->xd));
    CHECK_CUDNN(cudnnDestroyTensorDescriptor(cv->yd));
    CHECK_CUDNN(cudnnDestroyFilterDescriptor(cv->wd));
    CHECK_CUDNN(cudnnDestroyConvolutionDescriptor(cv->cd));
    free(cv);
}

extern "C" size_t conv_cuda_workspace_bytes(void *vctx, void *plan) {
    (void)vctx;
    return ((const ConvCuda *)plan)->ws_bytes;
}
extern "C" const char *conv_cuda_describe(const ConvCuda *cv) { return cv->desc; }

/* A pass whose chosen algorithm does not fit at this batch size falls back to its
 * workspace-free, deterministic default; that one must be supported and fit too. */
static void conv_check_fallback(const ConvCuda *cv, int n, const char *pass, size_t need, size_t ws_bytes) {
    if (need <= ws_bytes) return;
    char last[256] = "", reason[512];
    cudnnGetLastErrorString(last, sizeof last);
    snprintf(reason, sizeof reason,
             "conv %dx%d stride %d on %dx%dx%dx%d: neither the chosen %s algorithm nor its "
             "fallback fits the %zu-byte workspace%s%s",
             cv->cs.k, cv->cs.k, cv->cs.stride, n, cv->h, cv->w, cv->cs.cin, pass, ws_bytes,
             last[0] ? ": " : "", last);
    check_fail(__FILE__, __LINE__, "cuDNN convolution", reason,
               "use the full batch size (a multiple of --batch-size), or another cuDNN version");
}

/* Point the descriptors at batch n; keep the chosen algorithms when their
 * workspace still fits, else use the workspace-free ones (checked). Host calls only:
 * conv_cuda_prepare runs it before a CUDA graph capture. */
static void conv_use_batch(CudaCtx *ctx, ConvCuda *cv, int n, size_t ws_bytes) {
    if (n == cv->cur_n) return;
    if (n < 1 || n > cv->max_n)
        die("convolution called with batch %d (planned for at most %d)", n, cv->max_n);
    conv_set_batch_desc(cv, n);
    cv->cur_n = n;
    cv->cur_fwd = cv->fwd;
    cv->cur_bwd_data = cv->bwd_data;
    cv->cur_bwd_filter = cv->bwd_filter;
    if (conv_ws_fwd(ctx, cv, cv->fwd, cv->math_fwd) > ws_bytes) {
        cv->cur_fwd = CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM;
        conv_check_fallback(cv, n, "forward", conv_ws_fwd(ctx, cv, cv->cur_fwd, cv->math_fwd), ws_bytes);
    }
    if (!cv->backward) return;
    if ((cv->passes & CONV_PASS_BWD_DATA) &&
        conv_ws_bwd_data(ctx, cv, cv->bwd_data, cv->math_bwd_data) > ws_bytes) {
        cv->cur_bwd_data = CUDNN_CONVOLUTION_BWD_DATA_ALGO_1;
        conv_check_fallback(cv, n, "backward-data",
                            conv_ws_bwd_data(ctx, cv, cv->cur_bwd_data, cv->math_bwd_data), ws_bytes);
    }
    if (conv_ws_bwd_filter(ctx, cv, cv->bwd_filter, cv->math_bwd_filter) > ws_bytes) {
        cv->cur_bwd_filter = CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
        conv_check_fallback(cv, n, "backward-filter",
                            conv_ws_bwd_filter(ctx, cv, cv->cur_bwd_filter, cv->math_bwd_filter), ws_bytes);
    }
}

extern "C" void conv_cuda_prepare(void *vctx, void *plan, int n, size_t ws_bytes) {
    conv_use_batch((CudaCtx *)vctx, (ConvCuda *)plan, n, ws_bytes);
}

extern "C" const ConvSpec *conv_cuda_spec(const ConvCuda *cv) { return &cv->cs; }
extern "C" size_t conv_cuda_out_pixels(const ConvCuda *cv) { return (size_t)cv->oh * cv->ow; }

extern "C" void conv_cuda_forward(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                                  const float *weight_krsc, const float *bias, float *y, void *ws,
                                  size_t ws_bytes) {
    const float one = 1.0f, zero = 0.0f;
    conv_use_batch(ctx, cv, n, ws_bytes);
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, cv->math_fwd));
    CHECK_CUDNN(cudnnConvolutionForward(ctx->cudnn, &one, cv->xd, x, cv->wd, weight_krsc, cv->cd,
                                        cv->cur_fwd, ws, ws_bytes, &zero, cv->yd, y));
    if (bias) bias_apply(ctx, (size_t)n * cv->oh * cv->ow, cv->cs.cout, bias, y, 1, ctx->bf16);
}

/* conv_cuda_backward with dx = dx_beta * dx + the gradient of x: cuDNN's blending
 * ("output = alpha * Op(inputs) + beta * output", cudnn_cnn.h, for every convolution
 * function and algorithm); dx_beta 0 or 1. */
static void conv_cuda_backward_beta(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                                    const float *weight_krsc, const float *dy, float *dx,
                                    float *dweight_krsc, float *dbias, void *ws, size_t ws_bytes,
                                    float dx_beta) {
    const float one = 1.0f, zero = 0.0f;
    if (!cv->backward) die("convolution backward on an inference-only plan (internal error)");
    if (dx && !(cv->passes & CONV_PASS_BWD_DATA))
        die("convolution backward with a dx on a plan made without need_dx (internal error)");
    conv_use_batch(ctx, cv, n, ws_bytes);
    if (dbias) colsum(ctx, (int64_t)n * cv->oh * cv->ow, cv->cs.cout, dy, dbias, ctx->bf16);
    CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, cv->math_bwd_filter));
    CHECK_CUDNN(cudnnConvolutionBackwardFilter(ctx->cudnn, &one, cv->xd, x, cv->yd, dy, cv->cd,
                                               cv->cur_bwd_filter, ws, ws_bytes, &zero, cv->wd,
                                               dweight_krsc));
    if (dx) {
        CHECK_CUDNN(cudnnSetConvolutionMathType(cv->cd, cv->math_bwd_data));
        CHECK_CUDNN(cudnnConvolutionBackwardData(ctx->cudnn, &one, cv->wd, weight_krsc, cv->yd, dy,
                                                 cv->cd, cv->cur_bwd_data, ws, ws_bytes, &dx_beta,
                                                 cv->xd, dx));
    }
}

extern "C" void conv_cuda_backward(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                                   const float *weight_krsc, const float *dy, float *dx,
                                   float *dweight_krsc, float *dbias, void *ws, size_t ws_bytes) {
    conv_cuda_backward_beta(ctx, cv, n, x, weight_krsc, dy, dx, dweight_krsc, dbias, ws, ws_bytes, 0.0f);
}

extern "C" void conv_cuda_backward_acc(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                                       const float *weight_krsc, const float *dy, float *dx,
                                       float *dweight_krsc, float *dbias, void *ws, size_t ws_bytes) {
    if (!dx) die("convolution backward accumulating into no dx (internal error)");
    conv_cuda_backward_beta(ctx, cv, n, x, weight_krsc, dy, dx, dweight_krsc, dbias, ws, ws_bytes, 1.0f);
}

/* Scratch for the contract versions: the KRSC weight copy, the KRSC gradient and
 * the cuDNN workspace, allocated per call. */
#define CONV_ONEOFF_WS_LIMIT ((size_t)256 << 20)

/* The KRSC weight cuDNN reads: wk itself, or in a bf16 context its bfloat16 copy
 * (in *scratch, freed by the caller). */
static const float *conv_oneoff_weight(CudaCtx *ctx, size_t wn, const float *wk, void **scratch) {
    *scratch = NULL;
    if (!ctx->bf16) return wk;
    *scratch = cuda_alloc(wn * sizeof(bf16_t));
    cuda_f32_to_bf16(ctx, wn, wk, (float *)*scratch);
    return (const float *)*scratch;
}

extern "C" void conv2d_forward_cuda(CudaCtx *ctx, const ConvSpec *cs, int n, int h, int w,
                                    const float *x, const float *weight, const float *bias, float *y) {
    size_t wn = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    ConvCuda *cv = conv_cuda_create(ctx, cs, n, h, w, CONV_ONEOFF_WS_LIMIT, 0, 0);
    float *wk = (float *)cuda_alloc(wn * sizeof(float));
    void *ws = cuda_alloc(cv->ws_bytes);
    void *w16 = NULL;
    conv_weight_to_krsc_cuda(ctx, cs, weight, wk);
    conv_cuda_forward(ctx, cv, n, x, conv_oneoff_weight(ctx, wn, wk, &w16), bias, y, ws, cv->ws_bytes);
    cuda_ctx_sync(ctx);
    cuda_free(w16);
    cuda_free(ws);
    cuda_free(wk);
    conv_cuda_free(ctx, cv);
}

extern "C" void conv2d_backward_cuda(CudaCtx *ctx, const ConvSpec *cs, int n, int h, int w,
                                     const float *x, const float *weight, const float *dy, float *dx,
                                     float *dweight, float *dbias) {
    size_t wn = (size_t)cs->cout * cs->cin * cs->k * cs->k;
    ConvCuda *cv = conv_cuda_create(ctx, cs, n, h, w, CONV_ONEOFF_WS_LIMIT, 1, dx != NULL);
    float *wk = (float *)cuda_alloc(wn * sizeof(float));
    float *dwk = (float *)cuda_alloc(wn * sizeof(float));
    void *ws = cuda_alloc(cv->ws_bytes);
    void *w16 = NULL, *dw16 = ctx->bf16 ? cuda_alloc(wn * sizeof(bf16_t)) : NULL;
    conv_weight_to_krsc_cuda(ctx, cs, weight, wk);
    conv_cuda_backward(ctx, cv, n, x, conv_oneoff_weight(ctx, wn, wk, &w16), dy, dx,
                       dw16 ? (float *)dw16 : dwk, dbias, ws, cv->ws_bytes);
    if (dw16) cuda_bf16_to_f32(ctx, wn, (const float *)dw16, dwk);
    conv_weight_from_krsc_cuda(ctx, cs, dwk, dweight);
    cuda_ctx_sync(ctx);
    cuda_free(w16);
    cuda_free(dw16);
    cuda_free(ws);
    cuda_free(dwk);
    cuda_free(wk);
    conv_cuda_free(ctx, cv);
}
