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
 *   - results are bit-identical for any thread count (reductions over partitions
 *     fixed by the shapes, combined in a fixed order).
 * The prototypes come from the one op list (ops_list.h). The CUDA versions
 * (ops_cuda.h, same names with a _cuda suffix, a CudaCtx first) take device
 * pointers and follow the same contracts; the network executor reaches both through
 * its op tables (net_ops.h), and tests/op_cases.h's case table compares every
 * backend with the CPU through them. */
#ifndef CIFAR_OPS_H
#define CIFAR_OPS_H

#include <stddef.h>
#include <stdint.h>

#include "model/ops_list.h"

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

/* The ops, declared from the one list (ops_list.h); what each does:
 *
 * conv2d_workspace_floats: floats of scratch the CPU conv needs for an input of
 *   n x h x w (the weight gradient's partial sums).
 * conv2d_forward: y[n,oh,ow,cout] = conv(x[n,h,w,cin], weight) + bias.
 * conv2d_backward: from dy[n,oh,ow,cout]: dweight, dbias (overwritten), dx
 *   (overwritten unless NULL).
 * batchnorm2d_forward_train: batch norm over rows x c (NHWC flattened), training
 *   mode: normalises with the batch mean and biased variance, saves mean and
 *   1/sqrt(var+eps) per channel for backward, and updates the running statistics
 *   as PyTorch does:
 *     running_mean = (1-momentum)*running_mean + momentum*mean
 *     running_var  = (1-momentum)*running_var  + momentum*var*rows/(rows-1)  (unbiased)
 * batchnorm2d_forward_eval: inference mode: uses the running statistics.
 * batchnorm2d_backward: dx, dgamma, dbeta from dy and the saved statistics.
 * batchnorm2d_relu_forward_train: batchnorm2d_forward_train then relu_forward in
 *   one pass over y (bit-identical results; NaN passes), for the bn -> relu pairs.
 * batchnorm2d_add_relu_forward_train: y = max(batchnorm2d_forward_train(x) + z, 0) in one
 *   pass over y (bit-identical to the BN then add_relu_forward; NaN passes), for the
 *   residual add that ends a block.
 * batchnorm2d_relu_backward: relu_backward (y: the ReLU's output, dy: its output
 *   gradient) then batchnorm2d_backward (x: the BN's input), without materialising
 *   the masked gradient; bit-identical to the two ops. dx may equal dy; NULL dx
 *   skips it.
 * softmax_xent_forward_backward: mean softmax cross-entropy over n rows of k logits
 *   with label smoothing eps (PyTorch's CrossEntropyLoss(label_smoothing=eps)).
 *   Writes dlogits (the gradient of the MEAN loss, i.e. already divided by n) when
 *   non-NULL, counts rows whose arg-max equals the label into *correct when
 *   non-NULL, returns the mean loss. Labels must be in [0, k).
 * relu_forward: y = max(x, 0), NaN passes; in place allowed (y == x).
 * relu_backward: dx = dy where y > 0 else 0; in place allowed (dx == dy).
 * add_forward: y = a + b; in place allowed. (Backward of an add is the identity.)
 * add_relu_forward: y = max(a + b, 0): the residual add fused with the block's ReLU.
 * meanpool_forward / meanpool_backward: global mean pool x[n, hw, c] -> y[n, c].
 * linear_forward: y[n, out] = x[n, in] * weight[out, in]^T + bias.
 * linear_backward: dx (unless NULL), dweight, dbias from dy.
 * sgd_update: SGD with momentum and weight decay over a flat buffer, PyTorch's rule:
 *     g = grad + weight_decay * param      (decay_mask[i] == 0 -> no decay)
 *     buf = momentum * buf + g             (the first step: buf = g)
 *     param -= lr * (nesterov ? g + momentum * buf : buf)
 *   decay_mask may be NULL (decay everything). `first_step` selects buf = g. */
OPS_LIST_ALL(OPS_DECLARE_VOID, OPS_DECLARE_RET, float)

/* Number of threads the CPU ops use (OpenMP and BLAS). */
void ops_set_threads(int threads);
int ops_threads(void);
/* Instruction-set variant of the CPU ops: 0 baseline x86-64 (or non-x86), 1 AVX2+FMA,
 * 2 AVX-512. The default is CIFAR_CPU_ISA's (generic | avx2 | avx512; a variant the CPU
 * lacks or an unknown name exits 2), else the best the CPU supports; -1 selects that
 * default, a level the CPU lacks the best it has. Returns the level now in use. For
 * tests and benchmarks. ops_isa_name: the variant in use ("generic", "avx2", "avx512"). */
int ops_set_isa(int level);
const char *ops_isa_name(void);

/* Teams: ops_team_run(body, arg) runs body(arg) once on every thread of one OpenMP
 * parallel region (ops_threads() threads); every thread makes the same sequence of
 * op calls with the same arguments and each op shares out its own work among them
 * (orphaned worksharing, fixed partitions), so a whole network walk costs one
 * region instead of one per op, with bit-identical results. Outside a team each op
 * opens a region of its own. Inside one already, ops_team_run just calls body. */
void ops_team_run(void (*body)(void *arg), void *arg);
/* For the op bodies (ops_cpu_impl.h): */
int ops_in_team(void);
/* The calling thread's scratch, to hand to the threads of a region it opens. */
void *ops_team_lead(void);
/* Every thread of a region the leader opened: join (its ops_team_lead()) or leave (NULL). */
void ops_team_join(void *lead);
/* A scratch buffer of at least `bytes` (64-byte aligned) shared by the team, the
 * same pointer in every thread; called by all of them together, one op at a time
 * (its contents are the op's until its last barrier). Grows, never shrinks. */
void *ops_team_scratch(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
