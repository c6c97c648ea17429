/* ops.h: the layer operations, forward and backward, CPU reference in ops_cpu.c.
 *
 * Layout: activations are NHWC float32 (rows = N*H*W, channels innermost), so a
 * 1x1 convolution is one GEMM over the whole batch and batch norm reduces over
 * rows. Weights keep PyTorch's layouts so snapshots need no conversion:
 * conv weight [Cout][Cin][K][K], linear weight [Out][In].
 *
 * Conventions for every backward:
 *   - parameter gradients (dweight, dbias, dgamma, dbeta) are OVERWRITTEN, not
 *     accumulated: every parameter is used once per step;
 *   - dx is overwritten; a NULL dx skips the input gradient (the stem conv);
 *   - results are deterministic for a given thread count (fixed reduction order).
 * The CUDA versions (ops_cuda.h, same names with a _cuda suffix) take device
 * pointers and follow the same contracts; tests/test_ops_cuda compares them. */
#ifndef CIFAR_OPS_H
#define CIFAR_OPS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int cin, cout;  /* channels in / out */
    int k;          /* square kernel size */
    int stride;
    int pad;
} ConvSpec;

static inline int conv_out_size(int in, int k, int stride, int pad) {
    return (in + 2 * pad - k) / stride + 1;
}

/* Floats of scratch the CPU conv needs for an input of n x h x w (im2col buffer). */
size_t conv2d_workspace_floats(const ConvSpec *cs, int n, int h, int w);

/* y[n,oh,ow,cout] = conv(x[n,h,w,cin], weight) + bias. */
void conv2d_forward(const ConvSpec *cs, int n, int h, int w, const float *x,
                    const float *weight, const float *bias, float *y, float *workspace);
/* From dy[n,oh,ow,cout]: dweight, dbias (overwritten), dx (overwritten unless NULL). */
void conv2d_backward(const ConvSpec *cs, int n, int h, int w, const float *x,
                     const float *weight, const float *dy, float *dx, float *dweight,
                     float *dbias, float *workspace);

/* Batch norm over rows x c (NHWC flattened), training mode: normalises with the
 * batch mean and biased variance, saves mean and 1/sqrt(var+eps) per channel for
 * backward, and updates the running statistics as PyTorch does:
 *   running_mean = (1-momentum)*running_mean + momentum*mean
 *   running_var  = (1-momentum)*running_var  + momentum*var*rows/(rows-1)   (unbiased) */
void batchnorm2d_forward_train(int rows, int c, const float *x, const float *gamma,
                               const float *beta, float *y, float *save_mean,
                               float *save_invstd, float *running_mean, float *running_var,
                               float momentum, float eps);
/* Inference mode: uses the running statistics. */
void batchnorm2d_forward_eval(int rows, int c, const float *x, const float *gamma,
                              const float *beta, const float *running_mean,
                              const float *running_var, float eps, float *y);
void batchnorm2d_backward(int rows, int c, const float *x, const float *gamma,
                          const float *save_mean, const float *save_invstd, const float *dy,
                          float *dx, float *dgamma, float *dbeta);

/* Fused for the bn -> relu pairs of training: batchnorm2d_forward_train then
 * relu_forward in one pass over y (bit-identical results; NaN passes). */
void batchnorm2d_relu_forward_train(int rows, int c, const float *x, const float *gamma,
                                    const float *beta, float *y, float *save_mean,
                                    float *save_invstd, float *running_mean, float *running_var,
                                    float momentum, float eps);
/* relu_backward (y: the ReLU's output, dy: its output gradient) then
 * batchnorm2d_backward (x: the BN's input), without materialising the masked
 * gradient; bit-identical to the two ops. dx may equal dy; NULL dx skips it. */
void batchnorm2d_relu_backward(int rows, int c, const float *x, const float *y,
                               const float *gamma, const float *save_mean,
                               const float *save_invstd, const float *dy, float *dx,
                               float *dgamma, float *dbeta);

/* y = max(x, 0); in place allowed (y == x). */
void relu_forward(size_t n, const float *x, float *y);
/* dx = dy where y > 0 else 0; in place allowed (dx == dy). */
void relu_backward(size_t n, const float *y, const float *dy, float *dx);

/* y = a + b; in place allowed. (Backward of an add is the identity: no op.) */
void add_forward(size_t n, const float *a, const float *b, float *y);
/* y = max(a + b, 0): the residual add fused with the block's last ReLU. */
void add_relu_forward(size_t n, const float *a, const float *b, float *y);

/* Global mean pool: x[n, hw, c] -> y[n, c]. */
void meanpool_forward(int n, int hw, int c, const float *x, float *y);
void meanpool_backward(int n, int hw, int c, const float *dy, float *dx);

/* y[n, out] = x[n, in] * weight[out, in]^T + bias. */
void linear_forward(int n, int in, int out, const float *x, const float *weight,
                    const float *bias, float *y);
void linear_backward(int n, int in, int out, const float *x, const float *weight,
                     const float *dy, float *dx, float *dweight, float *dbias);

/* Mean softmax cross-entropy over n rows of k logits with label smoothing eps
 * (PyTorch's CrossEntropyLoss(label_smoothing=eps)). Writes dlogits (the
 * gradient of the MEAN loss, i.e. already divided by n) when dlogits != NULL,
 * counts rows whose arg-max equals the label into *correct when non-NULL, and
 * returns the mean loss. Labels must be in [0, k). */
float softmax_xent_forward_backward(int n, int k, const float *logits, const int32_t *labels,
                                    float smoothing, float *dlogits, int *correct);

/* SGD with momentum and weight decay over a flat buffer, PyTorch's rule:
 *   g = grad + weight_decay * param      (decay_mask[i] == 0 -> no decay)
 *   buf = momentum * buf + g             (the first step: buf = g)
 *   param -= lr * (nesterov ? g + momentum * buf : buf)
 * decay_mask may be NULL (decay everything). `first_step` selects buf = g. */
void sgd_update(size_t n, float *param, const float *grad, float *momentum_buf,
                const uint8_t *decay_mask, float lr, float momentum, float weight_decay,
                int nesterov, int first_step);

/* Number of threads the CPU ops use (OpenMP and BLAS). */
void ops_set_threads(int threads);
int ops_threads(void);
/* Instruction-set variant of the CPU ops: 0 baseline x86-64 (or non-x86), 1 AVX2+FMA,
 * 2 AVX-512. The default is the best the CPU supports; a level the CPU lacks (or -1)
 * selects that best. Returns the level now in use. For tests and benchmarks. */
int ops_set_isa(int level);

#ifdef __cplusplus
}
#endif
#endif
