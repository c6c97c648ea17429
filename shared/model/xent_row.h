/* xent_row.h: one row of the softmax cross-entropy with label smoothing, written
 * once for the CPU ops (ops_cpu_impl.h, float and double) and the CUDA kernel
 * (cuda_head.cu), so both compute the same formula in the same order, in double:
 *   target = off + (1-smoothing)*onehot(y), off = smoothing/k
 *   loss   = -sum_j target_j * log softmax_j,  d[j] = (softmax_j - target_j) / n
 * XENT_ROW_DEFINE(name, R, QUAL) defines
 *   QUAL double name(const R *l, int k, int y, double on, double off, int n, R *d,
 *                    int *arg)
 * returning the row's loss, writing d (when non-NULL) and the first arg-max. */
#ifndef CIFAR_XENT_ROW_H
#define CIFAR_XENT_ROW_H

#include <math.h>

#define XENT_ROW_DEFINE(name, R, QUAL)                                                    \
    QUAL double name(const R *l, int k, int y, double on, double off, int n, R *d,        \
                     int *arg_out) {                                                      \
        int arg = 0;                                                                      \
        for (int j = 1; j < k; j++)                                                       \
            if (l[j] > l[arg]) arg = j;                                                   \
        *arg_out = arg;                                                                   \
        double m = l[arg], s = 0.0, sum_l = 0.0;                                          \
        for (int j = 0; j < k; j++) {                                                     \
            s += exp((double)l[j] - m);                                                   \
            sum_l += l[j];                                                                \
        }                                                                                 \
        double lse = m + log(s);                                                          \
        if (d)                                                                            \
            for (int j = 0; j < k; j++) {                                                 \
                double p = exp((double)l[j] - lse);                                       \
                d[j] = (R)((p - (j == y ? on : off)) / n);                                \
            }                                                                             \
        return -(on - off) * ((double)l[y] - lse) - off * (sum_l - k * lse);              \
    }

#endif
