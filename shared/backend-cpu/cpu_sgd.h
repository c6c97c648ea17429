/* cpu_sgd.h: the optimizer entry (cpu_sgd).
 * Part of the CPU op table (ops_cpu_impl.h), instanced with it: no include guard,
 * included once per instance, after cpu_common.h. */

/* ------------------------------------------------------------- optimizer */
static void opsi_sgd_update(size_t n, real_t *param, const real_t *grad, real_t *momentum_buf,
                            const uint8_t *decay_mask, real_t lr, real_t momentum,
                            real_t weight_decay, int nesterov, int first_step) {
#pragma omp for schedule(static)
    for (size_t i = 0; i < n; i++) {
        real_t g = grad[i];
        if (decay_mask == NULL || decay_mask[i]) g = g + weight_decay * param[i];
        real_t buf = first_step ? g : momentum * momentum_buf[i] + g;
        momentum_buf[i] = buf;
        real_t step = nesterov ? g + momentum * buf : buf;
        param[i] = param[i] - lr * step;
    }
}

static void cpu_sgd(void *ctx, size_t count, real_t *param, const real_t *grad,
                    real_t *momentum_buf, const uint8_t *decay_mask, const float *lr,
                    float momentum, float weight_decay, int nesterov, const int32_t *first_step) {
    (void)ctx;
    OPSI_TEAM(opsi_sgd_update(count, param, grad, momentum_buf, decay_mask, *lr, momentum,
                              weight_decay, nesterov, *first_step));
}
