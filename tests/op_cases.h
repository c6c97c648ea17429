/* op_cases.h: the op cases of every backend.
 *
 * Quick start for adding a new op (ggml's test-backend-ops has the same opening):
 *   1. its contract: a field of struct NetOps with what it reads, overwrites and
 *      allows (NULL, in place), in shared/model/net_ops.h (the one op contract);
 *   2. its CPU function: static cpu_<field>(void *ctx, ...) with the field's
 *      signature, in the file of its family (shared/backend-cpu/cpu_conv.h,
 *      cpu_bn.h, cpu_elementwise.h, cpu_head.h, cpu_sgd.h), its body an opsi_*
 *      function run on the team (OPSI_TEAM), and one line in the table at the end of
 *      shared/backend-cpu/ops_cpu_impl.h (every ISA and the double tests get it);
 *   3. its CUDA function: the kernel and <op>_cuda(void *ctx, ...) with the field's
 *      signature (the CudaCtx cast back on its first line) in the file of its family
 *      (shared/backend-cuda/cuda_conv.cu, cuda_bn.cu, cuda_elementwise.cu,
 *      cuda_head.cu, cuda_sgd.cu), declared in ops_cuda.h, and one line in the table
 *      of shared/backend-cuda/net_cuda.cu (an nc_<field> there only when the entry
 *      is more than the one op);
 *   4. its case here: an OpKind, its name in opc_kind_names, its inputs in
 *      opc_make_inputs, a row of opc_cases (shapes, tolerances, fd_tol > 0 for the
 *      finite differences) and, with a backward, its opc_fd_spec; how it runs on a
 *      table in op_cases_run.h (once, for every backend and scalar type);
 *   5. its place in the walk: shared/model/net_impl.h (and its buffers there; its
 *      parameters in shared/model/model.c when it has any).
 * A fusion is an optional field (NULL: the walk composes it from the plain entries,
 * net_ops.h's net_ops_* helpers): steps 1 and 3 and a case that runs it through the
 * helper, so that the fused entry is checked against the CPU's composition.
 * Files touched: 9 (net_ops.h, one cpu_<family>.h, ops_cpu_impl.h, one cuda_<family>.cu,
 * ops_cuda.h, net_cuda.cu, op_cases.h, op_cases_run.h, net_impl.h), 11 with model.[ch];
 * before NetOps was the only contract it was 11 (the X-macro list ops_list.h, the CPU
 * contract ops.h and the forwarding table net_cpu_impl.h, but one CPU body file), 13
 * with model.[ch].
 *
 * One table of op cases (op, shapes, tolerances) run through the executor's op
 * tables (net_ops.h), so that "this op is right on that device" is written once:
 *   - test_ops.c: every backward on the CPU table in double against central finite
 *     differences (opc_fd_all), and every CPU instruction-set variant against the
 *     baseline;
 *   - test_ops_cuda.c: the CUDA table against the CPU table (the conv -> BN pairs
 *     run the CUDA table's fused entries, conv_bn_forward and bn_conv_backward,
 *     against the CPU table's composition of the plain entries).
 * Each case builds its inputs once on the host (fixed pseudo-random values, float
 * values held in double). Two backends: each runs the case and every output is
 * compared with |got - want| <= atol + rtol*|want|. Finite differences (cases with
 * fd_tol > 0, CPU double): the scalar L = <forward output, dy> (dy: the case's
 * backward input; the loss itself for xent) is differenced in every input that has
 * a gradient output, and per tensor max|analytic - numeric| / max(max|numeric|, 1e-2)
 * must stay below fd_tol. Checks are counted by tests/unit.h.
 * How a case runs on a table is written once over the scalar type (op_cases_run.h).
 * Include after unit.h and model/net.h; include tests/cpu_double.h first to get the
 * double instance (OpBackendD, opc_runD) and the finite differences. */
#ifndef CIFAR_TESTS_OP_CASES_H
#define CIFAR_TESTS_OP_CASES_H

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/net.h"
#include "core/check.h"

typedef enum {
    OPC_CONV,          /* conv forward + backward (dx, dweight, dbias) */
    OPC_BN_TRAIN,      /* y, save_mean, save_invstd, running stats; backward dx, dgamma, dbeta */
    OPC_BN_RELU_TRAIN, /* the same, fused with the ReLU both ways */
    OPC_BN_ADD_RELU_TRAIN, /* the same with the residual added before the ReLU; also dz */
    OPC_BN_EVAL,
    OPC_BN_BACKWARD,   /* dx, dgamma, dbeta of arbitrary statistics (no forward) */
    OPC_BN_RELU_BACKWARD,
    OPC_RELU,          /* forward and backward */
    OPC_ADD_RELU,      /* add, add_relu, and add_relu's backward */
    OPC_MEANPOOL,      /* forward and backward */
    OPC_LINEAR,        /* forward and backward */
    OPC_XENT,          /* loss, hits, dlogits */
    OPC_SGD,           /* param, momentum */
    OPC_CONV_BN,       /* conv -> bn train -> bn backward -> conv backward, as the executor
                        * pairs them (c: 0 bn+relu, 1 bn, 2 bn+add+relu): the table's fused
                        * entries, e.g. the CUDA table's conv bias inside the BN */
    OPC_CONV_BN_EVAL,  /* conv -> bn eval (fused: conv_bn_forward) */
} OpKind;
#define OPC_KINDS (OPC_CONV_BN_EVAL + 1)

static const char *const opc_kind_names[OPC_KINDS] = {
    "conv", "bn train", "bn+relu train", "bn+add+relu train", "bn eval", "bn backward",
    "bn+relu backward", "relu", "add_relu", "meanpool", "linear", "xent", "sgd", "conv->bn train",
    "conv->bn eval"};

typedef struct {
    OpKind op;
    int n, hw, c, k; /* images, pixels per image, channels; k: classes / outputs;
                      * OPC_XENT: c is the label smoothing in percent;
                      * OPC_SGD: k is Nesterov */
    ConvSpec cs;     /* OPC_CONV: the conv on an h x w = hw x k input */
    float atol, rtol;
    double fd_tol;   /* > 0: also checked against finite differences in double */
    const char *label;
} OpCase;

#define OPC_MAX_TENSORS 16

/* The host side of one run: inputs shared by both backends, outputs per backend. */
typedef struct {
    double *in[OPC_MAX_TENSORS];
    size_t in_n[OPC_MAX_TENSORS];
    int n_in;
    double *out[OPC_MAX_TENSORS];
    size_t out_n[OPC_MAX_TENSORS];
    const char *out_name[OPC_MAX_TENSORS];
    int n_out;
} OpcRun;

static uint64_t opc_seed = 0x2545F4914F6CDD1Dull;

static float opc_rand(float lo, float hi) {
    opc_seed ^= opc_seed << 13;
    opc_seed ^= opc_seed >> 7;
    opc_seed ^= opc_seed << 17;
    return lo + (hi - lo) * (float)((opc_seed >> 11) * (1.0 / 9007199254740992.0));
}

/* n random floats in [lo, hi) (held in double) as the run's next input. */
static double *opc_host_rand(OpcRun *r, size_t n, float lo, float hi) {
    double *v = xmalloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) v[i] = opc_rand(lo, hi);
    r->in[r->n_in] = v;
    r->in_n[r->n_in++] = n;
    return v;
}

static void opc_free_inputs(OpcRun *r) {
    for (int i = 0; i < r->n_in; i++) free(r->in[i]);
    r->n_in = 0;
}

static void opc_free_outputs(OpcRun *r) {
    for (int i = 0; i < r->n_out; i++) free(r->out[i]);
    r->n_out = 0;
}

/* Inputs of a case, drawn once (their order is each op's argument order). */
static void opc_make_inputs(const OpCase *c, OpcRun *r) {
    size_t rows = (size_t)c->n * c->hw, nx = rows * c->c;
    switch (c->op) {
    case OPC_CONV: {
        const ConvSpec *s = &c->cs;
        int oh = conv_out_size(c->hw, s->k, s->stride, s->pad), ow = conv_out_size(c->k, s->k, s->stride, s->pad);
        opc_host_rand(r, (size_t)c->n * c->hw * c->k * s->cin, -1, 1);         /* x */
        opc_host_rand(r, (size_t)s->cout * s->cin * s->k * s->k, -0.5f, 0.5f);  /* weight (KCRS) */
        opc_host_rand(r, (size_t)s->cout, -0.5f, 0.5f);                        /* bias */
        opc_host_rand(r, (size_t)c->n * oh * ow * s->cout, -1, 1);             /* dy */
        break;
    }
    case OPC_CONV_BN:
    case OPC_CONV_BN_EVAL: {
        const ConvSpec *s = &c->cs;
        int oh = conv_out_size(c->hw, s->k, s->stride, s->pad), ow = conv_out_size(c->k, s->k, s->stride, s->pad);
        opc_host_rand(r, (size_t)c->n * c->hw * c->k * s->cin, -1, 1);         /* x */
        opc_host_rand(r, (size_t)s->cout * s->cin * s->k * s->k, -0.5f, 0.5f);  /* weight (KCRS) */
        opc_host_rand(r, (size_t)s->cout, -0.5f, 0.5f);                        /* conv bias */
        opc_host_rand(r, (size_t)c->n * oh * ow * s->cout, -1, 1);             /* dy of the BN+ReLU */
        opc_host_rand(r, (size_t)s->cout, 0.5f, 1.5f);                         /* gamma */
        opc_host_rand(r, (size_t)s->cout, -0.5f, 0.5f);                        /* beta */
        opc_host_rand(r, (size_t)s->cout, -0.2f, 0.2f);                        /* running mean */
        opc_host_rand(r, (size_t)s->cout, 0.5f, 1.5f);                         /* running var */
        if (c->op == OPC_CONV_BN && c->c == 2) {                              /* the residual form: */
            opc_host_rand(r, (size_t)c->n * oh * ow * s->cout, -1, 1);         /* z */
            opc_host_rand(r, (size_t)c->n * c->hw * c->k * s->cin, -1, 1);     /* dx accumulated into */
        }
        /* what the conv bias gradient holds before the backward (a previous step's):
         * the true gradient is rounding noise around 0 (a training BN's dx sums to 0
         * per channel), so from zeros a backward that never writes it would pass */
        if (c->op == OPC_CONV_BN) opc_host_rand(r, (size_t)s->cout, 1, 2);
        break;
    }
    case OPC_BN_TRAIN:
    case OPC_BN_RELU_TRAIN:
    case OPC_BN_ADD_RELU_TRAIN:
    case OPC_BN_EVAL:
        opc_host_rand(r, nx, -2, 3);                  /* x */
        opc_host_rand(r, (size_t)c->c, 0.5f, 1.5f);   /* gamma */
        opc_host_rand(r, (size_t)c->c, -0.5f, 0.5f);  /* beta */
        opc_host_rand(r, (size_t)c->c, -0.2f, 0.2f);  /* running mean */
        opc_host_rand(r, (size_t)c->c, 0.5f, 1.5f);   /* running var */
        opc_host_rand(r, nx, -1, 1);                  /* z (the residual) */
        opc_host_rand(r, nx, -1, 1);                  /* dy (training) */
        break;
    case OPC_BN_BACKWARD:
    case OPC_BN_RELU_BACKWARD:
        opc_host_rand(r, nx, -2, 3);                  /* x */
        opc_host_rand(r, nx, -1, 1);                  /* y: the ReLU output (sign matters) */
        opc_host_rand(r, (size_t)c->c, 0.5f, 1.5f);   /* gamma */
        opc_host_rand(r, (size_t)c->c, -0.3f, 0.3f);  /* save_mean */
        opc_host_rand(r, (size_t)c->c, 0.5f, 1.5f);   /* save_invstd */
        opc_host_rand(r, nx, -1, 1);                  /* dy */
        for (size_t i = 0; i < nx; i++) r->in[1][i] = r->in[1][i] < 0 ? 0 : r->in[1][i];
        break;
    case OPC_RELU:
        opc_host_rand(r, nx, -1, 1); /* x */
        opc_host_rand(r, nx, -1, 1); /* dy */
        break;
    case OPC_ADD_RELU:
        opc_host_rand(r, nx, -1, 1); /* a */
        opc_host_rand(r, nx, -1, 1); /* b */
        opc_host_rand(r, nx, -1, 1); /* dy of add_relu */
        break;
    case OPC_MEANPOOL:
        opc_host_rand(r, nx, -1, 1);                  /* x */
        opc_host_rand(r, (size_t)c->n * c->c, -1, 1); /* dy */
        break;
    case OPC_LINEAR:
        opc_host_rand(r, (size_t)c->n * c->c, -1, 1);       /* x [n][in] */
        opc_host_rand(r, (size_t)c->k * c->c, -0.5f, 0.5f); /* weight [out][in] */
        opc_host_rand(r, (size_t)c->k, -0.5f, 0.5f);        /* bias */
        opc_host_rand(r, (size_t)c->n * c->k, -1, 1);       /* dy */
        break;
    case OPC_XENT:
        opc_host_rand(r, (size_t)c->n * c->k, -4, 4);  /* logits */
        opc_host_rand(r, (size_t)c->n, 0, (float)c->k); /* labels (as floats) */
        break;
    case OPC_SGD:
        opc_host_rand(r, nx, -1, 1);     /* param */
        opc_host_rand(r, nx, -0.1f, 0.1f); /* grad */
        opc_host_rand(r, nx, -0.1f, 0.1f); /* momentum buffer */
        break;
    }
}

/* Worst |got - want| - (atol + rtol*|want|) over n; > 0 is a failure. */
static double opc_excess(const double *got, const double *want, size_t n, float atol, float rtol,
                         size_t *at) {
    double worst = -INFINITY;
    *at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs(got[i] - want[i]) - (atol + rtol * fabs(want[i]));
        if (isnan(e)) e = INFINITY;
        if (e > worst) {
            worst = e;
            *at = i;
        }
    }
    return worst;
}

/* Every output of run b (backend dut) against run a (backend ref). */
static void opc_compare(const OpCase *c, const OpcRun *a, const OpcRun *b, const char *ref,
                        const char *dut, int verbose) {
    for (int i = 0; i < a->n_out && i < b->n_out; i++) {
        size_t at;
        double ex = opc_excess(b->out[i], a->out[i], a->out_n[i], c->atol, c->rtol, &at);
        EXPECT(ex <= 0, "%s %s vs %s: %s [%zu] got %.8g want %.8g", c->label, dut, ref,
               a->out_name[i], at, b->out[i][at], a->out[i][at]);
        if (verbose) printf("ok   %s %s vs %s: %s\n", c->label, dut, ref, a->out_name[i]);
    }
    EXPECT(a->n_out == b->n_out, "%s: %d outputs vs %d", c->label, a->n_out, b->n_out);
}

/* The case table: every op of the executor's table, at shapes that cover the edge
 * paths (1x1 convs, strides, odd sizes, no padding, the CPU's direct and im2col conv
 * kernels, several BN reduction blocks, rows past cuDNN's N limit). Finite
 * differences (fd_tol) on the small ones: test_ops runs under ASan in CI. */
static const OpCase opc_cases[] = {
    /* {OPC_CONV, n, h, 0, w, {cin, cout, k, stride, pad}, ...} */
    {OPC_CONV, 2, 9, 0, 9, {3, 8, 3, 2, 1}, 1e-4f, 1e-3f, 1e-6, "conv stem 3x3/2"},
    {OPC_CONV, 3, 7, 0, 7, {8, 16, 1, 1, 0}, 1e-4f, 1e-3f, 1e-6, "conv 1x1"},
    {OPC_CONV, 3, 8, 0, 6, {8, 8, 3, 1, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3"},
    {OPC_CONV, 4, 8, 0, 8, {16, 32, 3, 2, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3/2"},
    {OPC_CONV, 4, 8, 0, 8, {16, 32, 1, 2, 0}, 1e-4f, 1e-3f, 1e-6, "conv projection 1x1/2"},
    {OPC_CONV, 2, 7, 0, 6, {3, 5, 3, 1, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3 3->5 on 7x6"},
    {OPC_CONV, 2, 7, 0, 7, {4, 6, 3, 2, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3/2 4->6 on 7x7"},
    {OPC_CONV, 2, 8, 0, 7, {2, 3, 3, 2, 0}, 1e-4f, 1e-3f, 1e-6, "conv 3x3/2 unpadded on 8x7"},
    {OPC_CONV, 3, 4, 0, 5, {5, 3, 1, 1, 0}, 1e-4f, 1e-3f, 1e-6, "conv 1x1 5->3 on 4x5"},
    {OPC_CONV, 2, 7, 0, 5, {4, 6, 1, 2, 0}, 1e-4f, 1e-3f, 1e-6, "conv 1x1/2 on 7x5"},
    {OPC_CONV, 2, 9, 0, 8, {3, 4, 5, 2, 2}, 1e-4f, 1e-3f, 1e-6, "conv 5x5/2"},
    /* several im2col chunks (see OPSI_COL_TARGET) */
    {OPC_CONV, 25, 8, 0, 8, {8, 6, 3, 1, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3 25 images (im2col chunks)"},
    /* the vector direct kernels (cout a multiple of the vector width; register-held
     * dW taps for cin 3/8/16; padded rows in blocks of 8, 4, 2, 1 pixels) */
    {OPC_CONV, 2, 6, 0, 11, {16, 16, 3, 1, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3 16->16 on 6x11 (direct)"},
    {OPC_CONV, 2, 9, 0, 8, {3, 16, 3, 2, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3/2 3->16 (direct)"},
    {OPC_CONV, 2, 8, 0, 8, {8, 8, 3, 2, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3/2 8->8 (direct)"},
    {OPC_CONV, 1, 5, 0, 7, {8, 32, 3, 1, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3 8->32 on 5x7 (direct)"},
    /* cout above the direct kernels' limit: im2col + GEMM */
    {OPC_CONV, 1, 4, 0, 4, {2, 70, 3, 1, 1}, 1e-4f, 1e-3f, 1e-6, "conv 3x3 cout 70 (im2col + GEMM)"},
    {OPC_BN_TRAIN, 3, 49, 16, 0, {0}, 1e-4f, 1e-4f, 1e-6, "bn train"},
    {OPC_BN_TRAIN, 1, 37, 3, 0, {0}, 1e-4f, 1e-4f, 1e-6, "bn train 37 rows"},
    {OPC_BN_TRAIN, 3, 500, 5, 0, {0}, 1e-4f, 1e-3f, 1e-6, "bn train 1500 rows (reduction blocks)"},
    {OPC_BN_TRAIN, 100000, 10, 4, 0, {0}, 1e-4f, 1e-3f, 0, "bn train N>65535"},
    {OPC_BN_RELU_TRAIN, 2, 256, 8, 0, {0}, 1e-4f, 1e-4f, 1e-6, "bn+relu train"},
    {OPC_BN_RELU_TRAIN, 1, 37, 3, 0, {0}, 1e-4f, 1e-4f, 1e-6, "bn+relu train 37 rows"},
    {OPC_BN_RELU_TRAIN, 3, 500, 5, 0, {0}, 1e-4f, 1e-3f, 1e-6, "bn+relu train 1500 rows"},
    {OPC_BN_ADD_RELU_TRAIN, 2, 64, 8, 0, {0}, 1e-4f, 1e-4f, 1e-6, "bn+add+relu train"},
    {OPC_BN_EVAL, 500, 256, 16, 0, {0}, 1e-5f, 1e-5f, 0, "bn eval 128000 rows"},
    {OPC_BN_EVAL, 100000, 10, 4, 0, {0}, 1e-5f, 1e-5f, 0, "bn eval N>65535"},
    /* the backward alone, at statistics no forward gives (its gradients are checked
     * against finite differences through the training cases above) */
    {OPC_BN_BACKWARD, 3, 49, 16, 0, {0}, 1e-4f, 1e-3f, 0, "bn backward"},
    {OPC_BN_RELU_BACKWARD, 2, 64, 8, 0, {0}, 1e-4f, 1e-3f, 0, "bn+relu backward"},
    {OPC_RELU, 1, 100003, 1, 0, {0}, 0, 0, 0, "relu"},
    {OPC_RELU, 1, 300, 1, 0, {0}, 0, 0, 1e-6, "relu 300"},
    {OPC_ADD_RELU, 1, 100003, 1, 0, {0}, 0, 0, 0, "add, add+relu"},
    {OPC_ADD_RELU, 1, 300, 1, 0, {0}, 0, 0, 1e-6, "add, add+relu 300"},
    {OPC_MEANPOOL, 5, 16, 24, 0, {0}, 1e-6f, 1e-5f, 1e-6, "meanpool"},
    {OPC_MEANPOOL, 3, 5, 4, 0, {0}, 1e-6f, 1e-5f, 1e-6, "meanpool 5 pixels"},
    {OPC_LINEAR, 7, 0, 64, 10, {0}, 1e-5f, 1e-4f, 1e-6, "linear"},
    {OPC_LINEAR, 5, 0, 7, 3, {0}, 1e-5f, 1e-4f, 1e-6, "linear 7->3"},
    {OPC_XENT, 300, 0, 10, 10, {0}, 1e-6f, 1e-5f, 1e-6, "softmax xent (smoothing .1)"},
    {OPC_XENT, 6, 0, 0, 10, {0}, 1e-6f, 1e-5f, 1e-6, "softmax xent (no smoothing)"},
    {OPC_SGD, 1, 1000, 3, 0, {0}, 1e-7f, 1e-6f, 0, "sgd"},
    {OPC_SGD, 1, 1000, 3, 1, {0}, 1e-7f, 1e-6f, 0, "sgd nesterov"},
    /* conv bias gradient in front of a training BN: rounding noise around 0 on both
     * (finite differences on the small pair only: the 40-channel one costs a second) */
    {OPC_CONV_BN, 3, 8, 0, 8, {8, 40, 3, 1, 1}, 1e-4f, 1e-3f, 0, "conv 3x3 -> bn+relu (fused)"},
    {OPC_CONV_BN, 2, 9, 0, 9, {3, 8, 3, 2, 1}, 1e-4f, 1e-3f, 1e-6, "conv stem -> bn+relu (fused)"},
    {OPC_CONV_BN, 2, 9, 1, 9, {3, 8, 3, 2, 1}, 1e-4f, 1e-3f, 1e-6, "conv stem -> bn (fused)"},
    {OPC_CONV_BN, 3, 8, 1, 8, {8, 40, 1, 2, 0}, 1e-4f, 1e-3f, 0, "conv 1x1/2 projection -> bn (fused)"},
    {OPC_CONV_BN, 3, 8, 2, 8, {8, 40, 1, 1, 0}, 1e-4f, 1e-3f, 0,
     "conv 1x1 -> bn+add+relu, folded backward (fused)"},
    {OPC_CONV_BN_EVAL, 3, 8, 0, 8, {8, 40, 3, 1, 1}, 1e-4f, 1e-3f, 0, "conv 3x3 -> bn eval (fused)"},
};

/* The CPU backend's copies (host memory both sides). */
static void opc_host_copy(void *ctx, void *dst, const void *src, size_t bytes) {
    (void)ctx;
    memcpy(dst, src, bytes);
}

/* The float instance (OpBackend, opc_run): the CPU and CUDA tables. */
#define OPC_REAL float
#define OPC_T(name) name
#include "op_cases_run.h"
#undef OPC_REAL
#undef OPC_T

/* One case on the reference and on the backend under test; every output compared. */
static void opc_check(const OpCase *c, const OpBackend *ref, const OpBackend *dut, int verbose) {
    OpcRun in = {0}, a, b;
    opc_make_inputs(c, &in);
    a = in;
    b = in;
    opc_run(c, ref, &a);
    opc_run(c, dut, &b);
    opc_compare(c, &a, &b, ref->name, dut->name, verbose);
    opc_free_outputs(&a);
    opc_free_outputs(&b);
    opc_free_inputs(&in);
}

static void opc_check_all(const OpBackend *ref, const OpBackend *dut, int verbose) {
    for (size_t i = 0; i < sizeof opc_cases / sizeof *opc_cases; i++)
        opc_check(&opc_cases[i], ref, dut, verbose);
}

#ifdef CIFAR_TESTS_CPU_DOUBLE_H
/* The double instance (OpBackendD, opc_runD): the CPU table in double. */
#define OPC_REAL double
#define OPC_T(name) name##D
#include "op_cases_run.h"
#undef OPC_REAL
#undef OPC_T

/* ------------------------------------------- finite differences (CPU double) */

#define OPC_FD_STEP 1e-5
#define OPC_FD_FLOOR 1e-2
#define OPC_FD_MAX_ENTRIES 100 /* per tensor; larger ones are sampled */
#define OPC_FD_KINK 1e-6

typedef double (*OpcLossFn)(void *ctx);

/* 1 when all n entries are differenced, else the smallest prime stride that keeps
 * them under OPC_FD_MAX_ENTRIES (a prime walks across the channels). */
static size_t opc_fd_stride(size_t n) {
    size_t s = (n + OPC_FD_MAX_ENTRIES - 1) / OPC_FD_MAX_ENTRIES;
    if (s <= 1) return 1;
    for (;; s++) {
        size_t d = 2;
        while (d * d <= s && s % d) d++;
        if (d * d > s) return s;
    }
}

/* The central difference of f in *param, step h; f(x + h) and f(x - h) into fp, fm. */
static double opc_fd_central(OpcLossFn f, void *ctx, double *param, double h, double *fp,
                             double *fm) {
    double keep = *param;
    *param = keep + h;
    *fp = f(ctx);
    *param = keep - h;
    *fm = f(ctx);
    *param = keep;
    return (*fp - *fm) / (2 * h);
}

/* Whether f has a kink (a ReLU switching) within a step of *param, where the central
 * difference num is no derivative. For f linear on each side of a kink at distance
 * c < h, (f(x+h) + f(x-h) - 2f(x)) / 2h is num's error, and the difference at h/2
 * differs from num by |jump| min(c, h - c) / 2h; for a smooth f, by h^2 |f'''| / 8. */
static int opc_fd_kink(OpcLossFn f, void *ctx, double *param, double f0, double fp, double fm,
                       double num) {
    if (fabs(fp + fm - 2 * f0) / (2 * OPC_FD_STEP) <= OPC_FD_KINK) return 0;
    double hp, hm;
    return fabs(opc_fd_central(f, ctx, param, OPC_FD_STEP / 2, &hp, &hm) - num) > OPC_FD_KINK;
}

/* Differences f in param[i] (central, step OPC_FD_STEP) for every opc_fd_stride(n)-th
 * entry and compares with analytic[i]: max|analytic - numeric| / max(max|numeric|,
 * OPC_FD_FLOOR) must stay below tol. Entries at a kink (opc_fd_kink) are left out,
 * counted, and must stay rare. Returns the relative error. */
static double opc_fd_check(const char *what, OpcLossFn f, void *ctx, double *param,
                           const double *analytic, size_t n, double tol) {
    int threads = ops_threads();
    ops_set_threads(1); /* thousands of tiny runs: no thread-pool wake-ups */
    size_t stride = opc_fd_stride(n), checked = 0, kinks = 0;
    double f0 = f(ctx), diff = 0, scale = 0;
    for (size_t i = 0; i < n; i += stride) {
        double fp, fm, num = opc_fd_central(f, ctx, param + i, OPC_FD_STEP, &fp, &fm);
        if (opc_fd_kink(f, ctx, param + i, f0, fp, fm, num)) {
            kinks++;
            continue;
        }
        double d = fabs(analytic[i] - num);
        if (isnan(d)) d = INFINITY;
        if (d > diff) diff = d;
        scale = fmax(scale, fabs(num));
        checked++;
    }
    ops_set_threads(threads);
    double err = diff / fmax(scale, OPC_FD_FLOOR);
    EXPECT(err < tol, "%s: gradient rel err %.3g > %.3g against finite differences (max|g| %.3g)",
           what, err, tol, scale);
    EXPECT(kinks <= 1 + checked / 50, "%s: %zu of %zu entries at a kink", what, kinks,
           kinks + checked);
    if (getenv("OPS_VERBOSE"))
        printf("  fd %-58s %5zu of %-5zu rel err %.2e%s\n", what, checked, n, err,
               kinks ? " (kinks left out)" : "");
    return err;
}

/* A case's finite-difference scalar L = <output `loss`, input weight_in> (weight_in
 * < 0: the output itself, a scalar) and its gradient outputs, each the gradient of L
 * in one input. */
typedef struct {
    const char *out;
    int in;
} OpcGrad;

typedef struct {
    const char *loss;
    int weight_in;
    OpcGrad grad[5];
    int n_grad;
} OpcFdSpec;

static OpcFdSpec opc_fd_spec(OpKind op) {
    switch (op) {
    case OPC_CONV: return (OpcFdSpec){"y", 3, {{"dx", 0}, {"dweight", 1}, {"dbias", 2}}, 3};
    case OPC_LINEAR: return (OpcFdSpec){"linear", 3, {{"dx", 0}, {"dweight", 1}, {"dbias", 2}}, 3};
    case OPC_BN_TRAIN:
    case OPC_BN_RELU_TRAIN: return (OpcFdSpec){"y", 6, {{"dx", 0}, {"dgamma", 1}, {"dbeta", 2}}, 3};
    case OPC_BN_ADD_RELU_TRAIN:
        return (OpcFdSpec){"y", 6, {{"dx", 0}, {"dgamma", 1}, {"dbeta", 2}, {"dz", 5}}, 4};
    case OPC_RELU: return (OpcFdSpec){"relu", 1, {{"relu_backward", 0}}, 1};
    case OPC_ADD_RELU:
        return (OpcFdSpec){"add_relu", 2, {{"add_relu_backward", 0}, {"add_relu_backward", 1}}, 2};
    case OPC_MEANPOOL: return (OpcFdSpec){"pool", 1, {{"pool_backward", 0}}, 1};
    case OPC_XENT: return (OpcFdSpec){"loss", -1, {{"dlogits", 0}}, 1};
    case OPC_CONV_BN:
        return (OpcFdSpec){"y", 3,
                           {{"conv dx", 0}, {"conv dweight", 1}, {"conv dbias", 2}, {"dgamma", 4},
                            {"dbeta", 5}},
                           5};
    default: return (OpcFdSpec){NULL, 0, {{NULL, 0}}, 0}; /* no forward and backward */
    }
}

static int opc_out_index(const OpcRun *r, const char *name) {
    for (int i = 0; i < r->n_out; i++)
        if (!strcmp(r->out_name[i], name)) return i;
    die("op_cases: no output \"%s\" (internal error)", name);
}

typedef struct {
    const OpCase *c;
    const OpBackendD *b;
    const OpcRun *in; /* the inputs, perturbed in place by opc_fd_check */
    OpcFdSpec spec;
} OpcFdRun;

static double opc_fd_loss(void *ctx) {
    const OpcFdRun *fr = ctx;
    OpcRun r = *fr->in;
    opc_runD(fr->c, fr->b, &r);
    int o = opc_out_index(&r, fr->spec.loss);
    double loss = 0;
    if (fr->spec.weight_in < 0)
        loss = r.out[o][0];
    else
        for (size_t i = 0; i < r.out_n[o]; i++) loss += r.out[o][i] * fr->in->in[fr->spec.weight_in][i];
    opc_free_outputs(&r);
    return loss;
}

/* Every gradient output of case c on backend b (the CPU table in double) against
 * finite differences of its scalar; the worst error per op kind into worst. */
static void opc_fd_case(const OpCase *c, const OpBackendD *b, double *worst) {
    OpcFdSpec s = opc_fd_spec(c->op);
    EXPECT(s.n_grad > 0, "%s: finite differences asked of an op without forward and backward",
           c->label);
    OpcRun in = {0}, a;
    opc_make_inputs(c, &in);
    a = in;
    opc_runD(c, b, &a);
    OpcFdRun fr = {c, b, &in, s};
    EXPECT(s.weight_in < 0 || a.out_n[opc_out_index(&a, s.loss)] == in.in_n[s.weight_in],
           "%s: output %s and its weights differ in size (internal error)", c->label, s.loss);
    for (int g = 0; g < s.n_grad; g++) {
        int o = opc_out_index(&a, s.grad[g].out), i = s.grad[g].in;
        char what[160];
        snprintf(what, sizeof what, "%s: %s of input %d", c->label, s.grad[g].out, i);
        if (a.out_n[o] != in.in_n[i]) {
            EXPECT(a.out_n[o] == in.in_n[i], "%s: %zu gradients of %zu inputs (internal error)",
                   what, a.out_n[o], in.in_n[i]);
            continue;
        }
        worst[c->op] = fmax(worst[c->op], opc_fd_check(what, opc_fd_loss, &fr, in.in[i], a.out[o],
                                                       in.in_n[i], c->fd_tol));
    }
    opc_free_outputs(&a);
    opc_free_inputs(&in);
}

/* The table's finite-difference cases on backend b; prints the worst error per op. */
static void opc_fd_all(const OpBackendD *b) {
    double worst[OPC_KINDS];
    for (int k = 0; k < OPC_KINDS; k++) worst[k] = -1;
    for (size_t i = 0; i < sizeof opc_cases / sizeof *opc_cases; i++)
        if (opc_cases[i].fd_tol > 0) opc_fd_case(&opc_cases[i], b, worst);
    printf("op_cases: finite differences on %s, worst relative error per op:", b->name);
    for (int k = 0; k < OPC_KINDS; k++)
        if (worst[k] >= 0) printf(" %s %.1e;", opc_kind_names[k], worst[k]);
    printf("\n");
}
#endif

#endif
