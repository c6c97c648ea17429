/* ops.h: what every op table shares: a convolution's spec and its output size, and
 * the kinds of batch norm a fused entry runs.
 * The ops themselves, their contracts and the table a backend fills are net_ops.h's
 * (NetOps); the CPU tables are backend-cpu/ops_cpu_impl.h's, the CUDA table
 * backend-cuda/net_cuda.cu's.
 *
 * Weights keep PyTorch's layouts so snapshots need no conversion: conv weight
 * [Cout][Cin][K][K], linear weight [Out][In]. */
#ifndef CIFAR_OPS_H
#define CIFAR_OPS_H

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

/* The batch norm a fused conv + BN forward runs on the conv's output (net_ops.h's
 * conv_bn_forward): the entry of that name. */
typedef enum {
    NET_BN_EVAL,           /* bn_eval */
    NET_BN_TRAIN,          /* bn_train */
    NET_BN_TRAIN_RELU,     /* bn_relu_train */
    NET_BN_TRAIN_ADD_RELU, /* bn_add_relu_train */
} NetBnForwardKind;

/* The batch-norm backward a fused BN + conv backward runs before the conv's
 * (net_ops.h's bn_conv_backward). */
typedef enum {
    NET_BN_BACKWARD,           /* bn_backward */
    NET_BN_RELU_BACKWARD,      /* bn_relu_backward */
    NET_BN_RELU_BACKWARD_KEEP, /* bn_relu_backward_keep */
} NetBnBackwardKind;

#ifdef __cplusplus
}
#endif
#endif
