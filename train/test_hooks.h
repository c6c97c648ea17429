/* test_hooks.h: fault injection for the test suite, read from the environment
 * once per worker and off unless a variable is set:
 *   CIFAR_TEST_DIE_AFTER_STEPS=N   SIGKILL self once N steps are done
 *   CIFAR_TEST_DIE_RANK=R          ... only on this rank (default: any)
 *   CIFAR_TEST_DIE_ATTEMPTS=A      ... only while the restart count is below A (1)
 *   CIFAR_TEST_NAN_AFTER_STEPS=N   a NaN weight after step N (the next loss is NaN)
 *   CIFAR_TEST_SIGINT_AFTER_STEPS=N  SIGINT self after step N
 *   CIFAR_TEST_SIGNAL=S            ... signal number S instead of SIGINT
 *   CIFAR_TEST_PARAM_HASH_DIR=DIR  append "step hash" of the params to DIR/rank-R.txt
 *   CIFAR_TEST_STEP_LOG=FILE       rank 0 appends "step unix-time" to FILE after each step
 *                                  (make bench: how old the newest snapshot is at a kill)
 *   CIFAR_TEST_SLOW_RANK=R         this rank sleeps CIFAR_TEST_SLOW_MS (100) after each step
 *   CIFAR_TEST_STEP_SECONDS=X      rank 0's --save-interval clock reads X seconds per step
 *                                  done (the same snapshot steps on any machine; the
 *                                  other ranks keep the real clock, which they never read) */
#ifndef CIFAR_TEST_HOOKS_H
#define CIFAR_TEST_HOOKS_H

#include <stdint.h>

#include "format/checkpoint.h"
#include "model/engine.h"

typedef struct {
    int64_t die_after_steps;
    int die_rank;
    int die_attempts;
    int64_t nan_after_steps;
    int64_t sigint_after_steps;
    int signal;
    const char *hash_dir;
    const char *step_log;
    double step_seconds;
    int slow_rank, slow_ms;
} TestHooks;

/* What a hook may look at or change after a step. */
typedef struct {
    Engine *engine;
    TrainState *state; /* host copy, scratch for the hooks */
    size_t num_params;
    int64_t step;      /* steps done */
    int rank, restart_count;
} TestHookPoint;

TestHooks test_hooks_from_env(void);
void test_hooks_after_step(const TestHooks *h, const TestHookPoint *at);

#endif
