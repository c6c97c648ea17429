/* net.h: the one walk of the network, for every device.
 *
 * A Net executes a Model (model.h) through a device's op table (net_ops.h): it
 * plans every activation, saved statistic, gradient scratch buffer and the conv
 * workspace in one arena of the device's memory, makes one conv plan per conv
 * layer, and runs forward (training or inference), loss + backward, and the SGD
 * step over the flat parameter / gradient buffers, calling only table ops. The
 * same code drives the CPU (backend-cpu/ops_cpu_impl.h's tables), the CPU in double
 * (tests: finite differences and the float64 PyTorch reference) and CUDA
 * (shared/backend-cuda/net_cuda.cu). The executor itself is written once over the
 * scalar type in net_impl.h.
 *
 * Activations are NHWC. params, buffers, grads and momentum are the flat buffers
 * of model.h at the Model's offsets, in the device's memory (conv weights in the
 * table's layout). */
#ifndef CIFAR_NET_H
#define CIFAR_NET_H

#include <stddef.h>
#include <stdint.h>

#include "model/model.h"

#ifdef __cplusplus
extern "C" {
#endif

#define NET_REAL float
#define NET_T(name) name
#include "model/net_ops.h"
#undef NET_REAL
#undef NET_T

typedef struct NetOps NetOps;
typedef struct NetBnForward NetBnForward;
typedef struct NetBnBackward NetBnBackward;
typedef struct Net Net;

/* The executor of m for batches of up to max_batch on the device of ops/ctx;
 * backward == 0: inference only (no gradient buffers, no backward conv plans). */
Net *net_create(const Model *m, const NetOps *ops, void *ctx, int max_batch, int backward);
void net_free(Net *net);
/* Device bytes of the arena (activations, scratch, conv workspace). */
size_t net_arena_bytes(const Net *net);
size_t net_workspace_bytes(const Net *net);

/* Settle every conv plan for batch n (descriptors, algorithms, workspace sizes):
 * host work only, so that a CUDA graph capture of a step of n images that follows
 * does none of it. Calls at other batch sizes in between undo it. */
void net_prepare(Net *net, int n);

/* Forward on x[n,H,W,C] (device memory, kept until the backward of this step):
 * BN in training mode (running statistics in `buffers` updated) or inference mode
 * (buffers read only). Logits land in net_logits. */
void net_forward(Net *net, const float *params, float *buffers, int train, const float *x, int n);
const float *net_logits(const Net *net);
/* After a training forward: softmax cross-entropy on labels (device memory) with
 * label smoothing, then backward; every gradient OVERWRITTEN into grads. The mean
 * loss and the hit count go to *loss / *correct (device memory; correct may be NULL). */
void net_backward(Net *net, const float *params, const int32_t *labels, int n, float smoothing,
                  float *grads, float *loss, int *correct);
/* The SGD rule of net_ops.h over all num_params floats; lr and first_step are read from
 * device memory when the step runs. */
void net_sgd(Net *net, float *params, const float *grads, float *momentum,
             const uint8_t *decay_mask, const float *lr, float momentum_coef, float weight_decay,
             int nesterov, const int32_t *first_step);

/* Flat parameter-shaped buffer, device layout -> PyTorch layout (conv weights
 * converted, the rest copied); both in device memory. And back. */
void net_params_export(Net *net, const float *dev, float *torch_layout);
void net_params_import(Net *net, const float *torch_layout, float *dev);

/* The op table of the CPU (on the host): the instruction-set variant picked at start
 * (CIFAR_CPU_ISA's, else the best this CPU runs: backend-cpu/ops_cpu.h), the same for
 * the rest of the process. */
const NetOps *net_cpu_ops(void);

#ifdef __cplusplus
}
#endif
#endif
