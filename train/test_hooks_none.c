/* test_hooks_none.c: the shipped cifar-train's test hooks: none (test_hooks.h; the
 * test build links tests/train_hooks.c instead). */
#include "test_hooks.h"

const TestHooks *test_hooks_from_env(void) { return NULL; }

void test_hooks_after_step(const TestHooks *h, const TestHookPoint *at) {
    (void)h;
    (void)at;
}

double test_hooks_step_seconds(const TestHooks *h) {
    (void)h;
    return 0;
}
