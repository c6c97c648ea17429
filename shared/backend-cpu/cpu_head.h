/* cpu_head.h: the head: the linear layer and the loss (cpu_linear_forward,
 * cpu_linear_backward, cpu_xent).
 * Part of the CPU op table (ops_cpu_impl.h), instanced with it: no include guard,
 * included once per instance, after cpu_common.h. */

/* ---------------------------------------------------------------- linear */

static void opsi_linear_forward(int n, int in, int out, const real_t *x, const real_t *weight,
                                const real_t *bias, real_t *y) {
#pragma omp single
    OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1, x, in, weight, in, 0, y,
             out);
    opsi_add_bias(n, out, bias, y);
}

static void opsi_linear_backward(int n, int in, int out, const real_t *x, const real_t *weight,
                                 const real_t *dy, real_t *dx, real_t *dweight, real_t *dbias) {
#pragma omp single
    {
        if (dx)
            OPS_GEMM(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1, dy, out, weight,
                     in, 0, dx, in);
        OPS_GEMM(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1, dy, out, x, in, 0,
                 dweight, in);
    }
    if (dbias) opsi_colsums(n, out, dy, dbias);
}

static void cpu_linear_forward(void *ctx, int n, int in, int out, const real_t *x,
                               const real_t *weight, const real_t *bias, real_t *y) {
    (void)ctx;
    OPSI_TEAM(opsi_linear_forward(n, in, out, x, weight, bias, y));
}

static void cpu_linear_backward(void *ctx, int n, int in, int out, const real_t *x,
                                const real_t *weight, const real_t *dy, real_t *dx,
                                real_t *dweight, real_t *dbias) {
    (void)ctx;
    OPSI_TEAM(opsi_linear_backward(n, in, out, x, weight, dy, dx, dweight, dbias));
}

/* ------------------------------------------------------------------ loss */

XENT_ROW_DEFINE(opsi_xent_row, real_t, static inline)

static real_t opsi_xent(int n, int k, const real_t *logits, const int32_t *labels,
                        real_t smoothing, real_t *dlogits, int *correct) {
    double loss = 0.0;
    int hits = 0;
    const double off = (double)smoothing / k, on = 1.0 - (double)smoothing + off;
    for (int i = 0; i < n; i++) {
        int y = labels[i];
        if (y < 0 || y >= k) die("softmax_xent: label %d of row %d outside [0, %d)", y, i, k);
        int arg;
        loss += opsi_xent_row(logits + (size_t)i * k, k, y, on, off, n,
                              dlogits ? dlogits + (size_t)i * k : NULL, &arg);
        hits += arg == y;
    }
    if (correct) *correct = hits;
    return (real_t)(loss / n);
}

/* Serial: on one worker of the team (a barrier after), or on the caller outside one. */
static void cpu_xent(void *ctx, int n, int k, const real_t *logits, const int32_t *labels,
                     real_t smoothing, real_t *dlogits, real_t *loss, int *correct) {
    (void)ctx;
#pragma omp single
    *loss = opsi_xent(n, k, logits, labels, smoothing, dlogits, correct);
}
