/* cpu_common.h: what every family of the CPU op table shares: the team an entry runs
 * on (OPSI_TEAM), the fixed reduction blocks, column sums and bias rows, and the
 * per-thread scratch buffers. Part of ops_cpu_impl.h, instanced with it: no include
 * guard, included once per instance before the families. */

/* Activations (what passes between ops: conv inputs and outputs, batch-norm, ReLU
 * and add results, and their gradients) are read with opsi_ld and written with
 * opsi_st, by element index: real_t, or, in the instance of the CPU's bf16 table
 * (OPS_ACT_BF16, ops_cpu_bf16.c), bfloat16 in the first half of their fp32-sized
 * buffers, as the CUDA engine's bf16 keeps them (backend-cuda/bn_nhwc.h's act_load
 * and act_store). Widening is exact; narrowing rounds to nearest even with
 * backend-cuda/bf16.h's bits, written without its branch so that the loops
 * vectorise. Parameters, statistics and the head stay real_t. */
#ifdef OPS_ACT_BF16

static inline __attribute__((always_inline)) real_t opsi_ld(const real_t *p, int64_t i) {
    uint32_t u = (uint32_t)((const uint16_t *)p)[i] << 16;
    real_t f;
    memcpy(&f, &u, sizeof f);
    return f;
}

static inline __attribute__((always_inline)) void opsi_st(real_t *p, int64_t i, real_t v) {
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    uint32_t rounded = (u + 0x7fffu + ((u >> 16) & 1u)) >> 16;
    uint32_t quiet_nan = (u >> 16) | 0x0040u;
    ((uint16_t *)p)[i] = (uint16_t)((u & 0x7fffffffu) > 0x7f800000u ? quiet_nan : rounded);
}
#else
#define opsi_ld(p, i) ((p)[i])
#define opsi_st(p, i, v) ((p)[i] = (v))
#endif

/* Runs `call` with C_ the channel count c, a compile-time constant for the network's
 * widths (8, 16, 32, 64), in the bf16 table: the row loops of batch norm are written
 * over C_, so GCC vectorises each row whole (with bf16 activations and a run-time c of
 * 8 or 16 it ran them on their scalar tails, 2 to 3 times slower; the fp32 loops ran
 * slower with the constants: both measured). */
#ifdef OPS_ACT_BF16
#define OPSI_WITH_C(c, call)                     \
    do {                                         \
        switch (c) {                             \
        case 8: { const int C_ = 8; call; break; }   \
        case 16: { const int C_ = 16; call; break; } \
        case 32: { const int C_ = 32; call; break; } \
        case 64: { const int C_ = 64; call; break; } \
        default: { const int C_ = (c); call; break; } \
        }                                        \
    } while (0)
#else /* fp32 and double: as fast without (measured), so one loop */
#define OPSI_WITH_C(c, call)   \
    do {                       \
        const int C_ = (c);    \
        call;                  \
    } while (0)
#endif

/* Rows per reduction block and the cap on blocks: fixed, so the partition of a
 * reduction depends only on its size. */
#define OPSI_BLOCK_ROWS 512
#define OPSI_MAX_BLOCKS 64
/* Target size of the im2col buffer per chunk, in elements. */
#define OPSI_COL_TARGET (96 * 1024)

/* Runs `call` (an op body) on the caller's team, or on a parallel region of its own. */
#define OPSI_TEAM(call)                              \
    do {                                             \
        if (ops_in_team()) {                         \
            call;                                    \
        } else {                                     \
            void *opsi_lead_ = ops_team_lead();      \
            _Pragma("omp parallel")                  \
            {                                        \
                ops_team_join(opsi_lead_);           \
                call;                                \
                ops_team_join(NULL);                 \
            }                                        \
        }                                            \
    } while (0)

static int opsi_block_count(int64_t rows) {
    int64_t nb = (rows + OPSI_BLOCK_ROWS - 1) / OPSI_BLOCK_ROWS;
    if (nb > OPSI_MAX_BLOCKS) nb = OPSI_MAX_BLOCKS;
    if (nb < 1) nb = 1;
    return (int)nb;
}

static int64_t opsi_block_start(int64_t rows, int nb, int b) {
    return rows * b / nb;
}

/* Column sums of x[rows][c] into out (overwritten), in the fixed block order. Team.
 * It and opsi_add_bias index real_t rows: the convs' and the head's (fp32 in every
 * table), never an activation of the bf16 table. */
static void opsi_colsums(int64_t rows, int c, const real_t *x, real_t *out) {
    int nb = opsi_block_count(rows);
    double *part = ops_team_scratch((size_t)nb * (size_t)c * sizeof(double));
#pragma omp for schedule(static)
    for (int b = 0; b < nb; b++) {
        double *acc = part + (size_t)b * (size_t)c;
        for (int ch = 0; ch < c; ch++) acc[ch] = 0.0;
        for (int64_t r = opsi_block_start(rows, nb, b); r < opsi_block_start(rows, nb, b + 1); r++) {
            const real_t *xr = x + r * c;
            for (int ch = 0; ch < c; ch++) acc[ch] += xr[ch];
        }
    }
#pragma omp single
    for (int ch = 0; ch < c; ch++) {
        double s = 0.0;
        for (int b = 0; b < nb; b++) s += part[(size_t)b * (size_t)c + ch];
        out[ch] = (real_t)s;
    }
}

/* y[rows][c] += bias[c]. Team. */
static void opsi_add_bias(int64_t rows, int c, const real_t *bias, real_t *y) {
    if (bias == NULL) return;
#pragma omp for schedule(static)
    for (int64_t r = 0; r < rows; r++) {
        real_t *yr = y + r * c;
        for (int ch = 0; ch < c; ch++) yr[ch] += bias[ch];
    }
}

/* Per-thread im2col buffer, grown on demand and kept for the thread's lifetime
 * (OpenMP threads persist), so no op allocates in its hot loop. */
enum { OPSI_TLS_COL, OPSI_TLS_WEIGHT, OPSI_TLS_STATS, OPSI_TLS_SLOTS };
static __thread real_t *opsi_tls_buf[OPSI_TLS_SLOTS];
static __thread size_t opsi_tls_cap[OPSI_TLS_SLOTS];

static real_t *opsi_tls_buffer(int slot, size_t elems) {
    if (elems > opsi_tls_cap[slot]) {
        free(opsi_tls_buf[slot]);
        opsi_tls_buf[slot] = xmalloc_aligned(elems * sizeof(real_t));
        opsi_tls_cap[slot] = elems;
    }
    return opsi_tls_buf[slot];
}

#ifndef OPS_ACT_BF16 /* the bf16 table's convolutions are conv_dnnl.c's */
/* im2col columns, padded tiles: one tile at a time. */
static real_t *opsi_col_buffer(size_t elems) { return opsi_tls_buffer(OPSI_TLS_COL, elems); }
#endif

/* A conv weight permuted for the kernels, or a BN's per-channel coefficients: every
 * thread of a team makes its own copy (a few thousand values) rather than wait at a
 * barrier for one shared copy. */
static real_t *opsi_thread_copy(int slot, size_t elems) { return opsi_tls_buffer(slot, elems); }
