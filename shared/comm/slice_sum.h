/* slice_sum.h: the rank-order reduction shared by the MPI (comm_mpi.c) and Gloo
 * (comm_gloo.cc) communicators' reduce-scatter: rank r owns slice r of a chunk
 * and sums it over the sources in rank order 0..W-1 (copy source 0, add sources
 * 1.., then divide by W for the mean): the per-element operations of the
 * shared-memory communicator (comm.c), so every transport gives the same bits.
 * C and C++ (comm_gloo.cc), no state. */
#ifndef CIFAR_SLICE_SUM_H
#define CIFAR_SLICE_SUM_H

#include <stddef.h>
#include <string.h>

/* Slice r of a chunk of n elements: [n r / W, n (r+1) / W), as in comm.c. */
static inline size_t slice_lo(size_t n, int r, int w) { return n * (size_t)r / (size_t)w; }

/* in holds `world` slices of `mine` floats, source 0 first:
 * out = (in[0] + in[1] + ... + in[W-1]) / W, in rank order. */
static inline void sum_slices_mean_f32(void *out_v, const void *in_v, size_t mine, int world) {
    float *out = (float *)out_v;
    const float *in = (const float *)in_v;
    memcpy(out, in, mine * sizeof(float));
    for (int r = 1; r < world; r++)
        for (size_t i = 0; i < mine; i++) out[i] += in[(size_t)r * mine + i];
    const float w = (float)world;
    for (size_t i = 0; i < mine; i++) out[i] /= w;
}

/* The same for doubles, the sum only. */
static inline void sum_slices_f64(void *out_v, const void *in_v, size_t mine, int world) {
    double *out = (double *)out_v;
    const double *in = (const double *)in_v;
    memcpy(out, in, mine * sizeof(double));
    for (int r = 1; r < world; r++)
        for (size_t i = 0; i < mine; i++) out[i] += in[(size_t)r * mine + i];
}

#endif
