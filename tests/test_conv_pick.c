/* test_conv_pick.c: the host-side decisions of a cuDNN convolution plan
 * (shared/backend-cuda/conv_pick.h), on any machine, with a fake workspace query:
 *   - conv_plan_passes: inference plans only the forward; a training conv without
 *     need_dx (the stem) no backward data; every other training conv all three;
 *   - conv_pick: the first candidate whose workspace, queried with the math it will
 *     run with, is supported and within the limit; a refused query (cuDNN's
 *     NOT_SUPPORTED after forcing FMA math for fp32) or an over-limit size moves on
 *     to the next; failed, math-forbidden and (when asked) non-deterministic ones are
 *     never queried; none fitting gives -1 with a verdict for every candidate;
 *   - conv_list_capacity / conv_list_got: the list is as long as cuDNN's MaxCount
 *     (an entry per algorithm and math type), so a deterministic candidate ranked
 *     past the enum's *_ALGO_COUNT is still reached. */
#include <string.h>

#include "backend-cuda/conv_pick.h"
#include "unit.h"

static void test_passes(void) {
    EXPECT(conv_plan_passes(0, 0) == CONV_PASS_FWD, "inference: passes %u", conv_plan_passes(0, 0));
    EXPECT(conv_plan_passes(0, 1) == CONV_PASS_FWD, "inference with need_dx: passes %u",
           conv_plan_passes(0, 1));
    EXPECT(conv_plan_passes(1, 0) == (CONV_PASS_FWD | CONV_PASS_BWD_FILTER),
           "the stem (backward, no dx): passes %u", conv_plan_passes(1, 0));
    EXPECT(conv_plan_passes(1, 1) == (CONV_PASS_FWD | CONV_PASS_BWD_FILTER | CONV_PASS_BWD_DATA),
           "a training conv: passes %u", conv_plan_passes(1, 1));
}

/* The fake cuDNN: per algorithm, the workspace by math (math 0 and 1), or
 * (size_t)-1 where the query is refused; every query is counted. */
typedef struct {
    size_t ws[8][2];
    int queries, queried[8];
} FakeCudnn;

static int fake_query(void *user, int algo, int math, size_t *bytes) {
    FakeCudnn *f = user;
    f->queries++;
    f->queried[algo]++;
    *bytes = f->ws[algo][math];
    return *bytes == (size_t)-1;
}

static ConvCandidate cand(int algo, int math, int ok, int math_allowed, int det) {
    ConvCandidate c = {algo, ok ? 0 : 3, math, ok, math_allowed, det};
    return c;
}

static void test_pick(void) {
    enum { FMA = 1, TENSOR = 0 };
    const size_t limit = 1000;
    FakeCudnn f;
    memset(&f, 0, sizeof f);
    /* algo 0: cuDNN listed it, but with FMA math its workspace query is refused
     * (listed with tensor-op math, which fp32 replaces by FMA); algo 1: over the
     * limit; algo 2: fits with FMA. */
    f.ws[0][TENSOR] = 10;
    f.ws[0][FMA] = (size_t)-1;
    f.ws[1][FMA] = 5000;
    f.ws[2][FMA] = 600;
    f.ws[3][FMA] = 1;
    ConvCandidate c[] = {cand(0, FMA, 1, 1, 1), cand(1, FMA, 1, 1, 1), cand(2, FMA, 1, 1, 1),
                         cand(3, FMA, 1, 1, 1)};
    ConvTried t[4];
    int at = conv_pick(c, 4, 0, limit, fake_query, &f, t);
    EXPECT(at == 2, "picked %d, want 2 (0 refused with the math to be used, 1 over the limit)", at);
    EXPECT(t[0].verdict == CONV_TRY_WS_UNSUPPORTED, "algo 0: %s", conv_try_name(t[0].verdict));
    EXPECT(t[1].verdict == CONV_TRY_WS_OVER_LIMIT && t[1].ws == 5000, "algo 1: %s, ws %zu",
           conv_try_name(t[1].verdict), t[1].ws);
    EXPECT(t[2].verdict == CONV_TRY_PICKED && t[2].ws == 600, "algo 2: %s, ws %zu",
           conv_try_name(t[2].verdict), t[2].ws);
    EXPECT(t[3].verdict == CONV_TRY_UNTRIED && f.queried[3] == 0, "algo 3 after the pick: %s, %d queries",
           conv_try_name(t[3].verdict), f.queried[3]);

    /* Failed, math-forbidden and (deterministic) non-deterministic candidates are
     * passed over without a query. */
    memset(&f, 0, sizeof f);
    f.ws[4][FMA] = 8;
    ConvCandidate d[] = {cand(0, FMA, 0, 1, 1), cand(1, FMA, 1, 0, 1), cand(2, FMA, 1, 1, 0),
                         cand(4, FMA, 1, 1, 1)};
    at = conv_pick(d, 4, 1, limit, fake_query, &f, t);
    EXPECT(at == 3 && f.queries == 1, "deterministic: picked %d after %d queries, want 3 after 1", at,
           f.queries);
    EXPECT(t[0].verdict == CONV_TRY_FAILED && t[1].verdict == CONV_TRY_MATH &&
               t[2].verdict == CONV_TRY_NONDETERMINISTIC,
           "verdicts %s / %s / %s", conv_try_name(t[0].verdict), conv_try_name(t[1].verdict),
           conv_try_name(t[2].verdict));
    /* the same list without determinism asked: the non-deterministic one is taken */
    f.ws[2][FMA] = 8;
    at = conv_pick(d, 4, 0, limit, fake_query, &f, t);
    EXPECT(at == 2, "any determinism: picked %d, want 2", at);

    /* None fits: -1, every candidate with its reason (the table printed then). */
    memset(&f, 0, sizeof f);
    f.ws[0][FMA] = (size_t)-1;
    f.ws[1][FMA] = limit + 1;
    ConvCandidate e[] = {cand(0, FMA, 1, 1, 1), cand(1, FMA, 1, 1, 1), cand(2, FMA, 0, 1, 1)};
    at = conv_pick(e, 3, 0, limit, fake_query, &f, t);
    EXPECT(at == -1, "nothing fits, yet picked %d", at);
    EXPECT(t[0].verdict == CONV_TRY_WS_UNSUPPORTED && t[1].verdict == CONV_TRY_WS_OVER_LIMIT &&
               t[2].verdict == CONV_TRY_FAILED,
           "verdicts %s / %s / %s", conv_try_name(t[0].verdict), conv_try_name(t[1].verdict),
           conv_try_name(t[2].verdict));
    EXPECT(conv_pick(e, 0, 0, limit, fake_query, &f, t) == -1, "an empty list picks nothing");
}

/* The list's length: cuDNN's MaxCount (an entry per algorithm and math type) when it
 * exceeds the enum's count; a deterministic candidate ranked past the enum's count
 * (7 backward-filter algorithms, each listed twice) is reached only with it. */
static void test_list_capacity(void) {
    enum { ENUM_COUNT = 7, MAX_COUNT = 14, FMA = 1 };
    EXPECT(conv_list_capacity(MAX_COUNT, ENUM_COUNT) == MAX_COUNT, "capacity %d, want %d",
           conv_list_capacity(MAX_COUNT, ENUM_COUNT), MAX_COUNT);
    EXPECT(conv_list_capacity(0, ENUM_COUNT) == ENUM_COUNT, "capacity with MaxCount 0: %d",
           conv_list_capacity(0, ENUM_COUNT));
    EXPECT(conv_list_got(-1, 14) == 0 && conv_list_got(20, 14) == 14 && conv_list_got(9, 14) == 9,
           "returned counts clamped: %d %d %d", conv_list_got(-1, 14), conv_list_got(20, 14), conv_list_got(9, 14));
    FakeCudnn f;
    memset(&f, 0, sizeof f);
    ConvCandidate c[MAX_COUNT];
    for (int i = 0; i < MAX_COUNT; i++) c[i] = cand(i % 7, FMA, 1, 1, 0); /* non-deterministic */
    c[9] = cand(1, FMA, 1, 1, 1);                                         /* the deterministic one */
    f.ws[1][FMA] = 64;
    ConvTried t[MAX_COUNT];
    EXPECT(conv_pick(c, ENUM_COUNT, 1, 1000, fake_query, &f, t) == -1,
           "a list cut at the enum's count still found a deterministic candidate (the test shows nothing)");
    int got = conv_list_got(MAX_COUNT, conv_list_capacity(MAX_COUNT, ENUM_COUNT));
    int at = conv_pick(c, got, 1, 1000, fake_query, &f, t);
    EXPECT(at == 9, "the full list (%d entries): picked %d, want the deterministic entry 9", got, at);
}

int main(void) {
    test_passes();
    test_pick();
    test_list_capacity();
    return unit_report("test_conv_pick");
}
