/* cpu_elementwise.h: the element-wise and pooling entries (cpu_relu_forward, cpu_relu_backward,
 * cpu_add, cpu_add_relu, cpu_meanpool_forward, cpu_meanpool_backward).
 * Part of the CPU op table (ops_cpu_impl.h), instanced with it: no include guard,
 * included once per instance, after cpu_common.h. Activations through opsi_ld/opsi_st
 * (cpu_common.h); the mean pool's output and its gradient are real_t (the head's). */

/* ---------------------------------------------------------- elementwise */

static void opsi_relu_forward(size_t n, const real_t *x, real_t *y) {
#pragma omp for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        real_t v = opsi_ld(x, i);
        opsi_st(y, i, v <= 0 ? 0 : v); /* NaN passes, as in PyTorch */
    }
}

static void opsi_relu_backward(size_t n, const real_t *y, const real_t *dy, real_t *dx) {
#pragma omp for simd schedule(static)
    for (size_t i = 0; i < n; i++) opsi_st(dx, i, opsi_ld(y, i) > 0 ? opsi_ld(dy, i) : 0);
}

static void opsi_add_forward(size_t n, const real_t *a, const real_t *b, real_t *y) {
#pragma omp for simd schedule(static)
    for (size_t i = 0; i < n; i++) opsi_st(y, i, opsi_ld(a, i) + opsi_ld(b, i));
}

static void opsi_add_relu_forward(size_t n, const real_t *a, const real_t *b, real_t *y) {
#pragma omp for simd schedule(static)
    for (size_t i = 0; i < n; i++) {
        real_t s = opsi_ld(a, i) + opsi_ld(b, i);
        opsi_st(y, i, s <= 0 ? 0 : s); /* NaN passes, as in PyTorch */
    }
}

static void cpu_relu_forward(void *ctx, size_t count, const real_t *x, real_t *y) {
    (void)ctx;
    OPSI_TEAM(opsi_relu_forward(count, x, y));
}

static void cpu_relu_backward(void *ctx, size_t count, const real_t *y, const real_t *dy,
                              real_t *dx) {
    (void)ctx;
    OPSI_TEAM(opsi_relu_backward(count, y, dy, dx));
}

static void cpu_add(void *ctx, size_t count, const real_t *a, const real_t *b, real_t *y) {
    (void)ctx;
    OPSI_TEAM(opsi_add_forward(count, a, b, y));
}

static void cpu_add_relu(void *ctx, size_t count, const real_t *a, const real_t *b, real_t *y) {
    (void)ctx;
    OPSI_TEAM(opsi_add_relu_forward(count, a, b, y));
}

/* --------------------------------------------------------------- pooling */

static void opsi_meanpool_forward(int n, int hw, int c, const real_t *x, real_t *y) {
#pragma omp for schedule(static)
    for (int i = 0; i < n; i++) {
        real_t *yi = y + (size_t)i * c;
        const int64_t xi = (int64_t)i * hw * c;
        for (int ch = 0; ch < c; ch++) yi[ch] = 0;
        for (int j = 0; j < hw; j++)
            for (int ch = 0; ch < c; ch++) yi[ch] += opsi_ld(x, xi + (int64_t)j * c + ch);
        for (int ch = 0; ch < c; ch++) yi[ch] /= (real_t)hw;
    }
}

static void opsi_meanpool_backward(int n, int hw, int c, const real_t *dy, real_t *dx) {
    const real_t inv = (real_t)1 / (real_t)hw;
#pragma omp for schedule(static)
    for (int i = 0; i < n; i++)
        for (int j = 0; j < hw; j++)
            for (int ch = 0; ch < c; ch++)
                opsi_st(dx, ((int64_t)i * hw + j) * c + ch, dy[(size_t)i * c + ch] * inv);
}

static void cpu_meanpool_forward(void *ctx, int n, int hw, int c, const real_t *x, real_t *y) {
    (void)ctx;
    OPSI_TEAM(opsi_meanpool_forward(n, hw, c, x, y));
}

static void cpu_meanpool_backward(void *ctx, int n, int hw, int c, const real_t *dy, real_t *dx) {
    (void)ctx;
    OPSI_TEAM(opsi_meanpool_backward(n, hw, c, dy, dx));
}
