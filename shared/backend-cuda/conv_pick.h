/* conv_pick.h: the host-side decisions of a cuDNN convolution plan (cuda_conv.cu's
 * conv_cuda_create), in plain C with no cuDNN type, so that tests/test_conv_pick.c
 * checks them on any machine:
 *   conv_plan_passes: which passes a plan searches and sizes (a conv that never
 *     computes its input's gradient, the stem, gets no backward-data pass: cuDNN may
 *     have no such algorithm for 3 input channels, and the run must not die picking
 *     one it never runs);
 *   conv_pick: the first usable candidate of a ranked list (cudnnFind*'s, sorted by
 *     time, or cudnnGet*_v7's, ranked by heuristics), its workspace sized with the
 *     math it will run with, moving on to the next when the size query fails
 *     (NOT_SUPPORTED) or is over the limit; a verdict for every candidate, for the
 *     table printed when none fits. */
#ifndef CIFAR_CONV_PICK_H
#define CIFAR_CONV_PICK_H

#include <stddef.h>

enum { CONV_PASS_FWD = 1, CONV_PASS_BWD_DATA = 2, CONV_PASS_BWD_FILTER = 4 };

/* backward: the plan trains (weight gradient); need_dx: and computes the input's. */
static inline unsigned conv_plan_passes(int backward, int need_dx) {
    unsigned passes = CONV_PASS_FWD;
    if (backward) passes |= CONV_PASS_BWD_FILTER;
    if (backward && need_dx) passes |= CONV_PASS_BWD_DATA;
    return passes;
}

/* How many results to ask cudnnFind* / cudnnGet*_v7 for: what
 * cudnnGetConvolution*AlgorithmMaxCount says they can return (an entry per
 * algorithm and math type), at least the enum's *_ALGO_COUNT. */
static inline int conv_list_capacity(int max_count, int enum_count) {
    return max_count > enum_count ? max_count : enum_count;
}

/* The returned count, kept within [0, capacity]. */
static inline int conv_list_got(int returned, int capacity) {
    return returned < 0 ? 0 : returned > capacity ? capacity : returned;
}

/* One entry of cuDNN's list, as the precision sees it. */
typedef struct {
    int algo;          /* cudnnConvolution*Algo_t */
    int status;        /* cudnnStatus_t cuDNN listed it with (for the table) */
    int math;          /* cudnnMathType_t it would run with (fp32: FMA, whatever cuDNN measured) */
    int succeeded;     /* cuDNN's status for it was CUDNN_STATUS_SUCCESS */
    int math_allowed;  /* the precision allows the math cuDNN listed it with */
    int deterministic; /* CUDNN_DETERMINISTIC */
} ConvCandidate;

typedef enum {
    CONV_TRY_UNTRIED, /* after the picked one */
    CONV_TRY_FAILED,  /* cuDNN's status was not SUCCESS */
    CONV_TRY_MATH,    /* math the precision forbids */
    CONV_TRY_NONDETERMINISTIC,
    CONV_TRY_WS_UNSUPPORTED, /* the workspace query with the math to be used failed */
    CONV_TRY_WS_OVER_LIMIT,
    CONV_TRY_PICKED,
} ConvTry;

typedef struct {
    ConvTry verdict;
    size_t ws; /* the queried workspace (CONV_TRY_WS_OVER_LIMIT, CONV_TRY_PICKED) */
} ConvTried;

/* Sizes algo's workspace with math into *bytes: 0, or nonzero when cuDNN refuses. */
typedef int (*ConvWsQuery)(void *user, int algo, int math, size_t *bytes);

static inline const char *conv_try_name(ConvTry t) {
    switch (t) {
    case CONV_TRY_UNTRIED: return "not tried";
    case CONV_TRY_FAILED: return "failed in cuDNN's list";
    case CONV_TRY_MATH: return "math not allowed";
    case CONV_TRY_NONDETERMINISTIC: return "not deterministic";
    case CONV_TRY_WS_UNSUPPORTED: return "workspace query refused";
    case CONV_TRY_WS_OVER_LIMIT: return "workspace over the limit";
    case CONV_TRY_PICKED: return "picked";
    }
    return "?";
}

static inline ConvTry conv_try_one(const ConvCandidate *c, int deterministic, size_t limit,
                                   ConvWsQuery query, void *user, size_t *ws) {
    if (!c->succeeded) return CONV_TRY_FAILED;
    if (!c->math_allowed) return CONV_TRY_MATH;
    if (deterministic && !c->deterministic) return CONV_TRY_NONDETERMINISTIC;
    if (query(user, c->algo, c->math, ws) != 0) return CONV_TRY_WS_UNSUPPORTED;
    return *ws > limit ? CONV_TRY_WS_OVER_LIMIT : CONV_TRY_PICKED;
}

/* The index of the first candidate that passes every check, or -1; tried[i] says
 * what became of candidate i (n entries). */
static inline int conv_pick(const ConvCandidate *cands, int n, int deterministic, size_t limit,
                            ConvWsQuery query, void *user, ConvTried *tried) {
    int picked = -1;
    for (int i = 0; i < n; i++) {
        tried[i].verdict = CONV_TRY_UNTRIED;
        tried[i].ws = 0;
        if (picked >= 0) continue;
        tried[i].verdict = conv_try_one(&cands[i], deterministic, limit, query, user, &tried[i].ws);
        if (tried[i].verdict == CONV_TRY_PICKED) picked = i;
    }
    return picked;
}

#endif
