/* bf16_layout.h: where each conv weight lives in the bf16 shadows of --precision
 * bf16 (ops_cuda.h, "bf16 activations"), plain C (no CUDA header) so that
 * tests/test_bf16_layout.c checks the table on any machine.
 *
 * The shadows hold the conv weights only, each tensor starting on a 128-byte
 * boundary of the shadow (64 bfloat16s) whatever its fp32 offset in the flat
 * params. At the fp32 offsets themselves a bf16 copy is only as aligned as twice
 * the offset (the test model's conv weights start at floats 284, 628, ...: 8-byte
 * boundaries), while cudnnFind* measured its algorithms on buffers it allocated
 * itself (cudaMalloc: 256-byte aligned), and tensor-core kernels want operands
 * aligned to at least 128 bits (cuBLAS documentation, the Tensor Core usage
 * restrictions; NVIDIA/cutlass issue #75: "most kernels targeting Tensor Cores
 * require 128b aligned memory accesses"). 128 bytes covers those with at most 126
 * bytes of padding per tensor; the shadows themselves come from cudaMalloc. */
#ifndef CIFAR_BF16_LAYOUT_H
#define CIFAR_BF16_LAYOUT_H

#include <stddef.h>

#include "model/model.h"

/* Bytes every shadow tensor is aligned to; in bfloat16s (2 bytes each). */
#define BF16_LAYOUT_ALIGN_BYTES 128
#define BF16_LAYOUT_ALIGN_ELEMS (BF16_LAYOUT_ALIGN_BYTES / 2)

/* One conv weight: count floats at src in the flat params (and grads), count
 * bfloat16s at dst in the shadow. */
typedef struct {
    size_t src, dst, count;
} Bf16Segment;

static inline int bf16_layout_is_conv_weight(const TensorInfo *t) {
    return t->kind == TENSOR_PARAM && t->ndim == 4;
}

/* The conv weights of m in the order of their fp32 offsets (the model's tensor
 * order: model_build lays params out in that order), into seg (NULL: count
 * only). Returns the count. */
static inline int bf16_layout_segments(const Model *m, Bf16Segment *seg) {
    int n = 0;
    for (int t = 0; t < m->n_tensors; t++) {
        const TensorInfo *ti = &m->tensors[t];
        if (!bf16_layout_is_conv_weight(ti)) continue;
        if (seg) {
            seg[n].src = ti->offset;
            seg[n].count = ti->numel;
            seg[n].dst = 0;
        }
        n++;
    }
    return n;
}

/* Place each segment at the next 128-byte boundary of the shadow after the
 * previous one; returns the shadow's length in bfloat16s (a multiple of 64). */
static inline size_t bf16_layout_place(Bf16Segment *seg, int n) {
    size_t at = 0;
    for (int i = 0; i < n; i++) {
        seg[i].dst = at;
        at += (seg[i].count + BF16_LAYOUT_ALIGN_ELEMS - 1) / BF16_LAYOUT_ALIGN_ELEMS * BF16_LAYOUT_ALIGN_ELEMS;
    }
    return at;
}

/* The segment holding flat index i (segments sorted by src, not overlapping), or
 * NULL: a binary search, run on the host for every conv call. */
static inline const Bf16Segment *bf16_layout_find(const Bf16Segment *seg, int n, size_t i) {
    int lo = 0, hi = n - 1;
    while (lo <= hi) {
        int mid = lo + (hi - lo) / 2;
        if (i < seg[mid].src)
            hi = mid - 1;
        else if (i >= seg[mid].src + seg[mid].count)
            lo = mid + 1;
        else
            return &seg[mid];
    }
    return NULL;
}

#endif
