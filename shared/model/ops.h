/* ops.h: the shapes every op table shares: a convolution's spec and its output size.
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

#ifdef __cplusplus
}
#endif
#endif
