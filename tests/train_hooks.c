/* train_hooks.c: the test suite's fault injection in cifar-train, linked into the
 * test build only ($(OBJ)/test-bin/cifar-train; the shipped one links
 * train/test_hooks_none.c: train/test_hooks.h). Read from the environment once per
 * worker and off unless a variable is set:
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
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "../train/test_hooks.h"

struct TestHooks {
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
};

static int64_t env_i64(const char *var, int64_t fallback) {
    const char *v = getenv(var);
    return v && *v ? strtoll(v, NULL, 10) : fallback;
}

const TestHooks *test_hooks_from_env(void) {
    static TestHooks h; /* one worker per process */
    h.die_after_steps = env_i64("CIFAR_TEST_DIE_AFTER_STEPS", 0);
    h.die_rank = (int)env_i64("CIFAR_TEST_DIE_RANK", -1);
    h.die_attempts = (int)env_i64("CIFAR_TEST_DIE_ATTEMPTS", 1);
    h.nan_after_steps = env_i64("CIFAR_TEST_NAN_AFTER_STEPS", 0);
    h.sigint_after_steps = env_i64("CIFAR_TEST_SIGINT_AFTER_STEPS", 0);
    h.signal = (int)env_i64("CIFAR_TEST_SIGNAL", SIGINT);
    h.hash_dir = getenv("CIFAR_TEST_PARAM_HASH_DIR");
    h.step_log = getenv("CIFAR_TEST_STEP_LOG");
    h.slow_rank = (int)env_i64("CIFAR_TEST_SLOW_RANK", -1);
    h.slow_ms = (int)env_i64("CIFAR_TEST_SLOW_MS", 100);
    const char *sec = getenv("CIFAR_TEST_STEP_SECONDS");
    h.step_seconds = sec && *sec ? strtod(sec, NULL) : 0;
    return &h;
}

double test_hooks_step_seconds(const TestHooks *h) { return h->step_seconds; }

/* A NaN weight, so the next forward pass really produces a NaN loss. */
static void poison_weights(const TestHookPoint *at) {
    TrainState *st = at->state;
    at->engine->ops->state_to_host(at->engine, st->params, st->buffers, st->momentum);
    st->params[0] = NAN;
    at->engine->ops->state_from_host(at->engine, st->params, st->buffers, st->momentum);
}

/* FNV-1a of the parameters, appended as "step hash" to DIR/rank-R.txt. */
static void record_param_hash(const char *dir, const TestHookPoint *at) {
    TrainState *st = at->state;
    at->engine->ops->state_to_host(at->engine, st->params, st->buffers, NULL);
    uint64_t h = 1469598103934665603ull;
    const unsigned char *p = (const unsigned char *)st->params;
    for (size_t i = 0; i < at->num_params * sizeof(float); i++) h = (h ^ p[i]) * 1099511628211ull;
    char path[4096];
    snprintf(path, sizeof path, "%s/rank-%d.txt", dir, at->rank);
    FILE *f = fopen(path, "a");
    CHECK_STDIO(f != NULL, path);
    fprintf(f, "%" PRId64 " %016" PRIx64 "\n", at->step, h);
    CHECK_STDIO(fclose(f) == 0, path);
}

/* "step seconds-since-1970" appended to path. */
static void record_step_time(const char *path, int64_t step) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    FILE *f = fopen(path, "a");
    CHECK_STDIO(f != NULL, path);
    fprintf(f, "%" PRId64 " %lld.%09ld\n", step, (long long)ts.tv_sec, ts.tv_nsec);
    CHECK_STDIO(fclose(f) == 0, path);
}

void test_hooks_after_step(const TestHooks *h, const TestHookPoint *at) {
    if (h->step_log && at->rank == 0) record_step_time(h->step_log, at->step);
    if (h->die_after_steps && at->step >= h->die_after_steps &&
        (h->die_rank < 0 || h->die_rank == at->rank) && at->restart_count < h->die_attempts)
        raise(SIGKILL);
    if (h->nan_after_steps && at->step == h->nan_after_steps) poison_weights(at);
    if (h->sigint_after_steps && at->step == h->sigint_after_steps) raise(h->signal);
    if (h->hash_dir) record_param_hash(h->hash_dir, at);
    if (h->slow_rank == at->rank) usleep((useconds_t)h->slow_ms * 1000);
}
