/* test_hooks.h: where the test suite's fault injection plugs into the trainer, and
 * nothing more. The shipped cifar-train links train/test_hooks_none.c: there are no
 * hooks (test_hooks_from_env returns NULL, the trainer calls nothing else). The test
 * build of cifar-train ($(OBJ)/test-bin/cifar-train, made by `make test-build` and
 * used by the bats tests that call tests/helpers.bash's use_test_build, and by the
 * benchmarks) links tests/train_hooks.c instead: the CIFAR_TEST_* variables listed
 * there (a SIGKILL or a signal after a step, a NaN weight, a hash of the parameters
 * or the time after each step, a slow rank, a step clock for --save-interval). */
#ifndef CIFAR_TEST_HOOKS_H
#define CIFAR_TEST_HOOKS_H

#include <stddef.h>
#include <stdint.h>

#include "format/checkpoint.h"
#include "model/engine.h"

typedef struct TestHooks TestHooks;

/* What a hook may look at or change after a step. */
typedef struct {
    Engine *engine;
    TrainState *state; /* host copy, scratch for the hooks */
    size_t num_params;
    int64_t step;      /* steps done */
    int rank, restart_count;
} TestHookPoint;

/* The hooks of this process, read once from the environment; NULL: none (always in
 * the shipped cifar-train). The two below take a non-NULL h. */
const TestHooks *test_hooks_from_env(void);
/* Runs the hooks due after step at->step. */
void test_hooks_after_step(const TestHooks *h, const TestHookPoint *at);
/* Seconds per step that rank 0's --save-interval clock reads instead of the real
 * clock (the same snapshot steps on any machine); 0: the real clock. */
double test_hooks_step_seconds(const TestHooks *h);

#endif
