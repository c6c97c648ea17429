/* unit.h: the check macro of the C unit tests.
 *   EXPECT(cond, "fmt", ...)  counts a check; on failure prints
 *   "FAIL file:line: cond: message" to stderr and counts a failure.
 * A test's main ends with `return unit_report("test_x");`. */
#ifndef CIFAR_TESTS_UNIT_H
#define CIFAR_TESTS_UNIT_H

#include <stdio.h>

static int g_failures, g_checks;

#define UNIT_EXPECT(cond, ...)                                                        \
    do {                                                                              \
        g_checks++;                                                                   \
        if (!(cond)) {                                                                \
            g_failures++;                                                             \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);           \
            fprintf(stderr, __VA_ARGS__);                                             \
            fputc('\n', stderr);                                                      \
        }                                                                             \
    } while (0)
#define EXPECT UNIT_EXPECT
#define CHECK UNIT_EXPECT

/* "name: N checks, M failures" on stdout; the exit status for main. */
static inline int unit_report(const char *name) {
    printf("%s: %d checks, %d failures\n", name, g_checks, g_failures);
    return g_failures ? 1 : 0;
}

#endif
