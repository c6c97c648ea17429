/* unit_close.h: for the C unit tests that compare float results with a tolerance
 * (test_bn_nhwc, test_cpu_bf16): a seeded xorshift draw and expect_close. Include
 * after unit.h; a test includes it once. */
#ifndef CIFAR_TESTS_UNIT_CLOSE_H
#define CIFAR_TESTS_UNIT_CLOSE_H

#include <math.h>
#include <stdint.h>
#include <stdio.h>

#include "unit.h"

/* The draws' state: a test may set it for its own sequence. */
static uint64_t g_seed = 0x9E3779B97F4A7C15ull;

/* A uniform float in [lo, hi) (xorshift64, 53 bits). */
static float urand(float lo, float hi) {
    g_seed ^= g_seed << 13;
    g_seed ^= g_seed >> 7;
    g_seed ^= g_seed << 17;
    return lo + (hi - lo) * (float)((g_seed >> 11) * (1.0 / 9007199254740992.0));
}

/* |got - want| <= atol + rtol*|want| everywhere (NaN fails); "ok" with the largest
 * error when so. */
static void expect_close(const char *what, const float *got, const float *want, size_t n, double atol,
                         double rtol) {
    size_t bad = 0, at = 0;
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)got[i] - (double)want[i]);
        if (!(e <= atol + rtol * fabs((double)want[i]))) {
            if (!bad) at = i;
            bad++;
        }
        if (e > worst) worst = e;
    }
    EXPECT(bad == 0, "%s: %zu of %zu off, first [%zu] got %.8g want %.8g", what, bad, n, at,
           n ? got[at] : 0.0f, n ? want[at] : 0.0f);
    if (!bad) printf("ok   %s (max err %.3g over %zu)\n", what, worst, n);
}

#endif
