/* crc32c.c: see crc32c.h. */
#include "data/crc32c.h"

#include <pthread.h>
#include <string.h>

#define CRC32C_POLY 0x82f63b78u /* reflected Castagnoli polynomial */

static uint32_t g_table[8][256];
static pthread_once_t g_table_once = PTHREAD_ONCE_INIT;

static void table_init(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = c & 1 ? (c >> 1) ^ CRC32C_POLY : c >> 1;
        g_table[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++)
        for (int t = 1; t < 8; t++)
            g_table[t][i] = (g_table[t - 1][i] >> 8) ^ g_table[0][g_table[t - 1][i] & 0xff];
}

/* Slicing-by-8 on the raw (not inverted) register. */
static uint32_t table_update(uint32_t c, const uint8_t *p, size_t len) {
    pthread_once(&g_table_once, table_init);
    while (len >= 8) {
        uint32_t lo, hi;
        memcpy(&lo, p, 4);
        memcpy(&hi, p + 4, 4);
        lo ^= c; /* little-endian hosts only, as the whole format */
        c = g_table[7][lo & 0xff] ^ g_table[6][(lo >> 8) & 0xff] ^ g_table[5][(lo >> 16) & 0xff] ^
            g_table[4][lo >> 24] ^ g_table[3][hi & 0xff] ^ g_table[2][(hi >> 8) & 0xff] ^
            g_table[1][(hi >> 16) & 0xff] ^ g_table[0][hi >> 24];
        p += 8;
        len -= 8;
    }
    while (len--) c = (c >> 8) ^ g_table[0][(c ^ *p++) & 0xff];
    return c;
}

uint32_t crc32c_extend_table(uint32_t crc, const void *data, size_t len) {
    return ~table_update(~crc, data, len);
}

#if defined(__x86_64__)
#include <nmmintrin.h>

/* crc(A || zeros(n)) from crc(A), as a linear map applied through the table:
 * shifting by n zero bytes is multiplying by x^(8n) mod P. Used to join the three
 * interleaved streams; the n here is fixed, so the operator is precomputed. */
typedef struct {
    uint32_t t[4][256];
} ShiftOp;

static uint32_t shift_apply(const ShiftOp *op, uint32_t c) {
    return op->t[0][c & 0xff] ^ op->t[1][(c >> 8) & 0xff] ^ op->t[2][(c >> 16) & 0xff] ^
           op->t[3][c >> 24];
}

/* The register after feeding n zero bytes to register value v (raw, no inversion). */
__attribute__((target("sse4.2"))) static uint32_t zeros_hw(uint32_t v, size_t n) {
    uint64_t c = v;
    for (size_t i = 0; i < n / 8; i++) c = _mm_crc32_u64(c, 0);
    for (size_t i = 0; i < n % 8; i++) c = _mm_crc32_u8((uint32_t)c, 0);
    return (uint32_t)c;
}

#define STRIPE 1024 /* bytes per stream per round: three streams hide the latency */
static ShiftOp g_shift1, g_shift2; /* by STRIPE and 2*STRIPE zero bytes */
static pthread_once_t g_shift_once = PTHREAD_ONCE_INIT;

__attribute__((target("sse4.2"))) static void shift_init(void) {
    for (int b = 0; b < 4; b++)
        for (uint32_t i = 0; i < 256; i++) {
            g_shift1.t[b][i] = zeros_hw(i << (8 * b), STRIPE);
            g_shift2.t[b][i] = zeros_hw(i << (8 * b), 2 * STRIPE);
        }
}

__attribute__((target("sse4.2"))) static uint32_t hw_update(uint32_t c32, const uint8_t *p,
                                                          size_t len) {
    uint64_t c = c32;
    if (len >= 3 * STRIPE) {
        pthread_once(&g_shift_once, shift_init);
        while (len >= 3 * STRIPE) {
            uint64_t a = c, b = 0, d = 0;
            for (size_t i = 0; i < STRIPE; i += 8) {
                uint64_t x, y, z;
                memcpy(&x, p + i, 8);
                memcpy(&y, p + STRIPE + i, 8);
                memcpy(&z, p + 2 * STRIPE + i, 8);
                a = _mm_crc32_u64(a, x);
                b = _mm_crc32_u64(b, y);
                d = _mm_crc32_u64(d, z);
            }
            /* The register is linear over GF(2): the three streams combine by
             * shifting the earlier ones past the later ones' bytes. */
            c = shift_apply(&g_shift2, (uint32_t)a) ^ shift_apply(&g_shift1, (uint32_t)b) ^ (uint32_t)d;
            p += 3 * STRIPE;
            len -= 3 * STRIPE;
        }
    }
    while (len >= 8) {
        uint64_t x;
        memcpy(&x, p, 8);
        c = _mm_crc32_u64(c, x);
        p += 8;
        len -= 8;
    }
    while (len--) c = _mm_crc32_u8((uint32_t)c, *p++);
    return (uint32_t)c;
}

uint32_t crc32c_extend(uint32_t crc, const void *data, size_t len) {
    return __builtin_cpu_supports("sse4.2") ? ~hw_update(~crc, data, len)
                                            : crc32c_extend_table(crc, data, len);
}
#else
uint32_t crc32c_extend(uint32_t crc, const void *data, size_t len) {
    return crc32c_extend_table(crc, data, len);
}
#endif
