/* ops_cuda.h: the CUDA twins of the ops of net_ops.h (ops.h's former names with a
 * _cuda suffix, the same contracts, device pointers), plus the few GPU-only pieces the CUDA engine needs.
 *
 * Every op takes a CudaCtx first: the device, one stream, the cuDNN and cuBLAS
 * handles (bound to that stream), the math mode (fp32 or tf32) and whether only
 * deterministic algorithms may be used. All work is queued on ctx's stream and is
 * asynchronous unless a function says it synchronises. The ops that are entries of
 * the executor's table (net_cuda.cu's net_cuda_ops) have net_ops.h's signature
 * exactly, so the table holds them directly: their CudaCtx is a void *ctx (a
 * CudaCtx * converts to it implicitly).
 *
 * Convolutions go through cuDNN with NHWC activations. cuDNN wants an NHWC filter
 * (KRSC: [Cout][K][K][Cin]) with NHWC data, while ops.h keeps PyTorch's KCRS
 * ([Cout][Cin][K][K]); so:
 *   - conv2d_forward_cuda / conv2d_backward_cuda keep ops.h's contract (KCRS in,
 *     KCRS dweight out) and convert in scratch memory they allocate per call:
 *     for tests and one-off use;
 *   - ConvCuda is the fast path: algorithms picked once at creation, weights and
 *     weight gradients in KRSC, caller-owned workspace. The CUDA engine keeps its
 *     conv weights in KRSC on the device and converts only at state transfers
 *     (conv_weight_to_krsc_cuda / conv_weight_from_krsc_cuda).
 *
 * Header for C and C++: no CUDA header needed to include it. */
#ifndef CIFAR_OPS_CUDA_H
#define CIFAR_OPS_CUDA_H

#include <stddef.h>
#include <stdint.h>

#include "backend-cuda/bf16_layout.h"
#include "data/augment.h"
#include "model/ops.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CudaCtx CudaCtx;

/* Usable CUDA devices; 0 when there is no driver or no GPU (never fails). */
int ops_cuda_device_count(void);
/* Compute capability of `device` as major*10 + minor (80 for an A100, 90 for an H100). */
int ops_cuda_compute_capability(int device);

/* Select `device`, create its stream and handles. tf32: let cuDNN and cuBLAS use
 * TF32 tensor cores for fp32 data (else plain FMA math). deterministic: only
 * algorithms cuDNN reports as deterministic, picked by heuristics rather than by
 * timing, so two runs choose the same ones. bn_coop: one cooperative kernel per
 * training batch norm where the device allows (0: two; Settings.cuda_bn_coop). Dies
 * with a clear message on failure. */
CudaCtx *cuda_ctx_create(int device, int tf32, int deterministic, int bn_coop);
void cuda_ctx_free(CudaCtx *ctx);
int cuda_ctx_device(const CudaCtx *ctx);
int cuda_ctx_deterministic(const CudaCtx *ctx);
/* The cudaStream_t, as a pointer so that C code needs no CUDA header. */
void *cuda_ctx_stream(const CudaCtx *ctx);
/* Wait for everything queued on ctx's stream. */
void cuda_ctx_sync(CudaCtx *ctx);

/* ---- bf16 activations (--precision bf16) ----
 * cuda_ctx_use_bf16, called right after cuda_ctx_create (before any conv plan):
 * from then on every activation and activation gradient the ops read or write is
 * bfloat16 (bf16.h: round to nearest even), stored in the same float-typed device
 * buffers (an n-element activation uses the first n*2 bytes). That is: conv x, y,
 * dy, dx and the weight and weight gradient cuDNN sees (PSEUDO_BFLOAT16: bf16 data,
 * float compute, tensor-op math); every batch-norm x, y, z, dy, dx; relu, add,
 * add_relu; meanpool_forward's x and meanpool_backward's dx; the augmentation's
 * output. Floats in every case: the conv bias and its gradient, gamma, beta, the
 * saved and running statistics (sums in double as in fp32), the pooled features,
 * the linear layer, the logits, the loss and the SGD. The convolutions of the
 * executor read their weights from a bf16 shadow of the fp32 master conv weights
 * and write their weight gradients to a bf16 shadow of the flat gradients' conv
 * weights, every tensor on a 128-byte boundary of the shadow (bf16_layout.h):
 *   cuda_bf16_shadow_init: register the engine's flat params and grads (count
 *     floats) and the conv weights in them (seg[0 .. n_seg), host, src and count
 *     set, sorted by src: bf16_layout_segments; the shadow offsets are placed here);
 *   cuda_bf16_weights_refresh: shadow = bf16(conv weights), one kernel (before a
 *     forward);
 *   cuda_bf16_grads_collect: conv weight grads = float(shadow), one kernel
 *     (after a backward: the all-reduce, SGD and snapshots see fp32 only);
 *   cuda_bf16_weight / cuda_bf16_grad: the shadow of a pointer into params / grads
 *     (the pointer itself in an fp32 context; NULL stays NULL).
 * Both are graph-capturable. cuda_f32_to_bf16 / cuda_bf16_to_f32 convert n values
 * on the stream (tests, the ops.h-contract conv forms). */
void cuda_ctx_use_bf16(CudaCtx *ctx);
int cuda_ctx_bf16(const CudaCtx *ctx);
void cuda_f32_to_bf16(CudaCtx *ctx, size_t n, const float *src, float *dst_bf16);
void cuda_bf16_to_f32(CudaCtx *ctx, size_t n, const float *src_bf16, float *dst);
void cuda_bf16_shadow_init(CudaCtx *ctx, const float *params, float *grads, size_t count,
                           const Bf16Segment *seg, int n_seg);
void cuda_bf16_weights_refresh(CudaCtx *ctx);
void cuda_bf16_grads_collect(CudaCtx *ctx);
const float *cuda_bf16_weight(CudaCtx *ctx, const float *param);
float *cuda_bf16_grad(CudaCtx *ctx, float *grad);

/* ---- the CUDA engine (engine.h's engine_create_cuda), for tests ----
 * Training steps a CUDA engine ran by replaying its CUDA graph: 0 when graphs are
 * off (CIFAR_CUDA_GRAPH=0) or the capture failed (the engine then runs eagerly and
 * says so in one line, which a test would not notice otherwise). */
typedef struct Engine Engine;
long engine_cuda_graph_replays(const Engine *e);

/* Device memory (checked: dies on failure). cuda_free(NULL) is a no-op. */
void *cuda_alloc(size_t bytes);
void cuda_free(void *ptr);
/* Synchronous copies through ctx's stream. */
void cuda_upload(CudaCtx *ctx, void *dst_dev, const void *src_host, size_t bytes);
void cuda_download(CudaCtx *ctx, void *dst_host, const void *src_dev, size_t bytes);
/* Asynchronous device memset / copy on ctx's stream. */
void cuda_memset_async(CudaCtx *ctx, void *dst_dev, int value, size_t bytes);
/* cuda_copy_d2d_async is net_ops.h's copy: dst == src copies nothing. */
void cuda_copy_d2d_async(void *ctx, void *dst_dev, const void *src_dev, size_t bytes);

/* ---- convolution ---- */

/* PyTorch layout [Cout][Cin][K][K] <-> cuDNN NHWC filter layout [Cout][K][K][Cin]
 * (out of place; 1x1 kernels are the same in both). */
void conv_weight_to_krsc_cuda(CudaCtx *ctx, const ConvSpec *cs, const float *kcrs, float *krsc);
void conv_weight_from_krsc_cuda(CudaCtx *ctx, const ConvSpec *cs, const float *krsc, float *kcrs);

typedef struct ConvCuda ConvCuda;

/* Descriptors for cs on inputs of max_n x h x w, and the forward (and, when
 * backward != 0, backward-filter and, when need_dx != 0 too, backward-data)
 * algorithms for batch max_n: measured by cudnnFind* (the fastest whose workspace,
 * sized with the math it runs with, fits ws_limit bytes; else the workspace-free
 * default), or, when ctx is deterministic, the first deterministic one cuDNN's
 * heuristics rank (none: the candidates are printed, each with why it was passed
 * over, and the process exits: conv_pick.h). Without need_dx the backward must be
 * called with dx NULL. Smaller batches reuse the
 * algorithms (falling back to workspace-free ones if the workspace would not fit). */
ConvCuda *conv_cuda_create(CudaCtx *ctx, const ConvSpec *cs, int max_n, int h, int w,
                           size_t ws_limit, int backward, int need_dx);
/* Point the descriptors at batch n and settle its algorithms now (host calls only):
 * done before a CUDA graph capture, so that nothing inside it resets a
 * descriptor or queries a workspace size. plan: a ConvCuda (net_ops.h's
 * conv_prepare, as conv_cuda_free and conv_cuda_workspace_bytes). */
void conv_cuda_prepare(void *ctx, void *plan, int n, size_t ws_bytes);
const ConvSpec *conv_cuda_spec(const ConvCuda *cv);
/* Output pixels per image (oh * ow). */
size_t conv_cuda_out_pixels(const ConvCuda *cv);
void conv_cuda_free(void *ctx, void *plan);
/* Workspace bytes the chosen algorithms need at max_n (forward and backward). */
size_t conv_cuda_workspace_bytes(void *ctx, void *plan);
/* Names of the chosen algorithms ("fwd=IMPLICIT_PRECOMP_GEMM bwd_data=1 ..."). */
const char *conv_cuda_describe(const ConvCuda *cv);
/* As conv2d_forward / conv2d_backward, weight and dweight in KRSC, n <= max_n;
 * ws is a device workspace of ws_bytes >= conv_cuda_workspace_bytes. */
void conv_cuda_forward(CudaCtx *ctx, ConvCuda *cv, int n, const float *x, const float *weight_krsc,
                       const float *bias, float *y, void *ws, size_t ws_bytes);
void conv_cuda_backward(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                        const float *weight_krsc, const float *dy, float *dx, float *dweight_krsc,
                        float *dbias, void *ws, size_t ws_bytes);
/* conv_cuda_backward that ACCUMULATES into dx (dx += the gradient of x: cuDNN's
 * backward data with beta = 1); dx non-NULL. */
void conv_cuda_backward_acc(CudaCtx *ctx, ConvCuda *cv, int n, const float *x,
                            const float *weight_krsc, const float *dy, float *dx, float *dweight_krsc,
                            float *dbias, void *ws, size_t ws_bytes);

/* ops.h's contract exactly (KCRS weights, floats even in a bf16 context, where x, y,
 * dy and dx are bf16); scratch allocated per call, synchronises. */
void conv2d_forward_cuda(CudaCtx *ctx, const ConvSpec *cs, int n, int h, int w, const float *x,
                         const float *weight, const float *bias, float *y);
void conv2d_backward_cuda(CudaCtx *ctx, const ConvSpec *cs, int n, int h, int w, const float *x,
                          const float *weight, const float *dy, float *dx, float *dweight,
                          float *dbias);

/* ---- batch norm (our NHWC kernels, bn_nhwc.h; the same formulas as ops.h) ----
 * net_ops.h's bn entries: the real shape, n images of hw pixels and c channels
 * (rows = n*hw, any number), NHWC, c <= BN_MAX_C (4096). Deterministic; two kernel
 * launches each, or one cooperative kernel for a training BN (forward, or backward
 * with a dx) where the device allows (cuda_ctx_bn_coop), with the same results bit
 * for bit. The training add+ReLU form never needs its tmp (one pass). */
struct NetBnForward;
struct NetBnBackward;
void batchnorm2d_forward_train_cuda(void *ctx, int n, int hw, int c, const float *x,
                                    const float *gamma, const float *beta, float *y,
                                    float *save_mean, float *save_invstd, float *running_mean,
                                    float *running_var, float momentum, float eps);
void batchnorm2d_forward_eval_cuda(void *ctx, int n, int hw, int c, const float *x,
                                   const float *gamma, const float *beta,
                                   const float *running_mean, const float *running_var,
                                   float eps, float *y);
/* Training BN then ReLU (NaN passes); relu(BN(x) + z). */
void batchnorm2d_relu_forward_train_cuda(void *ctx, int n, int hw, int c, const float *x,
                                         const float *gamma, const float *beta, float *y,
                                         float *save_mean, float *save_invstd,
                                         float *running_mean, float *running_var, float momentum,
                                         float eps);
void batchnorm2d_add_relu_forward_train_cuda(void *ctx, int n, int hw, int c, const float *x,
                                             const float *gamma, const float *beta,
                                             const float *z, float *tmp, float *y,
                                             float *save_mean, float *save_invstd,
                                             float *running_mean, float *running_var,
                                             float momentum, float eps);
/* The batch norm bn (any kind) of x + x_bias, x_bias a per-channel bias that the
 * caller has not yet added to x (the conv bias of net_cuda.cu's fused
 * conv_bn_forward): the BN reads x + x_bias and writes it back into x. */
void batchnorm2d_forward_bias_cuda(void *ctx, int n, const float *x, const float *x_bias,
                                   const struct NetBnForward *bn);
/* dx, dgamma, dbeta (dx may be dy; NULL dx: only dgamma and dbeta); the relu form
 * masks dy by y > 0 (y: the ReLU output) on the fly and leaves dy as it is. */
void batchnorm2d_backward_cuda(void *ctx, int n, int hw, int c, const float *x,
                               const float *gamma, const float *save_mean,
                               const float *save_invstd, const float *dy, float *dx,
                               float *dgamma, float *dbeta);
void batchnorm2d_relu_backward_cuda(void *ctx, int n, int hw, int c, const float *x,
                                    const float *y, const float *gamma, const float *save_mean,
                                    const float *save_invstd, float *dy, float *dx,
                                    float *dgamma, float *dbeta);
/* The relu form that also writes the masked dy back into dy (y and dx non-NULL,
 * dx != dy): the gradient an identity shortcut carries (net_ops.h's
 * bn_relu_backward_keep). dx is bit for bit the relu form's. */
void batchnorm2d_relu_backward_keep_cuda(void *ctx, int n, int hw, int c, const float *x,
                                         const float *y, const float *gamma, const float *save_mean,
                                         const float *save_invstd, float *dy, float *dx,
                                         float *dgamma, float *dbeta);
/* The backward of the fused BN + conv backward (net_cuda.cu's bn_conv_backward): the
 * batch-norm backward bn of its kind (the plain, relu or keep form), whose column sum
 * of dx, the gradient of the bias of the conv in front of the BN, goes to dbias
 * (NULL: none wanted), so that the conv backward sums nothing. */
void batchnorm2d_backward_bias_cuda(void *ctx, int n, const struct NetBnBackward *bn,
                                    float *dbias);

/* Training batch norms (forward, and backward with a dx) as one cooperative kernel
 * each instead of two, bit for bit the same results (bn_nhwc.h): on by default where
 * the device supports it (CIFAR_CUDA_BN_COOP=0: off). enable 0 or 1 switches it
 * (1 only where supported), -1 leaves it; returns whether it is on. */
int cuda_ctx_bn_coop(CudaCtx *ctx, int enable);
/* Tests only: swaps the cooperative grid caps (blocks that fit at once, forward and
 * backward) with *fwd and *bwd. A cap above what fits makes the next cooperative
 * launch refused, which turns the context to two kernels (the fallback's test). */
void cuda_ctx_bn_coop_caps(CudaCtx *ctx, int *fwd, int *bwd);

/* ---- element-wise, pooling, linear (cuBLAS sgemm), SGD ----
 * net_ops.h's entries (device pointers; sgd_update_cuda's decay_mask a device array
 * or NULL). */
void relu_forward_cuda(void *ctx, size_t n, const float *x, float *y);
void relu_backward_cuda(void *ctx, size_t n, const float *y, const float *dy, float *dx);
void add_forward_cuda(void *ctx, size_t n, const float *a, const float *b, float *y);
void add_relu_forward_cuda(void *ctx, size_t n, const float *a, const float *b, float *y);
void meanpool_forward_cuda(void *ctx, int n, int hw, int c, const float *x, float *y);
void meanpool_backward_cuda(void *ctx, int n, int hw, int c, const float *dy, float *dx);
void linear_forward_cuda(void *ctx, int n, int in, int out, const float *x,
                         const float *weight, const float *bias, float *y);
void linear_backward_cuda(void *ctx, int n, int in, int out, const float *x,
                          const float *weight, const float *dy, float *dx, float *dweight,
                          float *dbias);
void sgd_update_cuda(CudaCtx *ctx, size_t n, float *param, const float *grad,
                     float *momentum_buf, const uint8_t *decay_mask, float lr, float momentum,
                     float weight_decay, int nesterov, int first_step);

/* ---- loss ---- */

/* Asynchronous form: the mean loss goes to *loss_dev (one float), the hit count to
 * *correct_dev (one int), the arg-max of each row (first maximum) to pred_dev
 * when non-NULL; dlogits as in ops.h (NULL: none). */
void softmax_xent_cuda_async(CudaCtx *ctx, int n, int k, const float *logits,
                             const int32_t *labels, float smoothing, float *dlogits,
                             float *loss_dev, int *correct_dev, int32_t *pred_dev);
/* ops.h's contract: returns the mean loss (synchronises). */
float softmax_xent_forward_backward_cuda(CudaCtx *ctx, int n, int k, const float *logits,
                                         const int32_t *labels, float smoothing, float *dlogits,
                                         int *correct);

/* ---- optimizer ---- */

/* The same with lr and first_step read from device memory when the kernel runs
 * (so a captured CUDA graph can be replayed with a new learning rate): net_ops.h's
 * sgd. */
void sgd_update_cuda_dev(void *ctx, size_t n, float *param, const float *grad,
                         float *momentum_buf, const uint8_t *decay_mask, const float *lr_dev,
                         float momentum, float weight_decay, int nesterov,
                         const int32_t *first_step_dev);

/* ema.h's ema_update on device memory (avg, value: n floats), on the context's
 * stream (capturable in a CUDA graph), the decay read from decay_dev (one float in
 * device memory) when the kernel runs. */
void ema_update_cuda(CudaCtx *ctx, size_t n, float *avg, const float *value, const float *decay_dev);

/* ---- the executor's op table (net_cuda.cu) ---- */

/* net.h's NetOps for CUDA: ctx is a CudaCtx, memory is device memory. */
struct NetOps;
const struct NetOps *net_cuda_ops(void);

/* ---- augmentation (augment_cuda.cu) ---- */

/* augment.h's augment_batch on the device: pixels/labels are the whole split on
 * the device, idx (n int64) on the device. When epoch_dev is non-NULL the epoch is
 * read from it when the kernel runs (CUDA graphs), else spec->epoch is used. With
 * staged = 1, pixels/labels hold only the batch's n records, in batch order
 * (record i for idx[i]); idx[i] still keys the random crop and flip. out is
 * bfloat16 in a bf16 context (the same values, rounded). */
void augment_batch_cuda(CudaCtx *ctx, const AugmentSpec *spec, const uint8_t *pixels,
                        const int32_t *labels, const int64_t *idx, int n, float *out,
                        int32_t *out_labels, const int64_t *epoch_dev, int staged);

#ifdef __cplusplus
}
#endif
#endif
