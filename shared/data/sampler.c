/* sampler.c: see sampler.h. */
#include "data/sampler.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/rng.h"

int64_t sampler_per_rank(int64_t n, int world) { return (n + world - 1) / world; }

/* A Fisher-Yates shuffle of v[0..n) keyed by (seed, stream, key): the draw for
 * position i is rng_below(seed, stream, key << 32 ^ i, i + 1). */
static void shuffle(uint64_t seed, uint64_t stream, uint64_t key, int64_t *v, int64_t n) {
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = rng_below(seed, stream, (key << 32) ^ (uint64_t)i, (uint32_t)(i + 1));
        int64_t t = v[i];
        v[i] = v[j];
        v[j] = t;
    }
}

int64_t sampler_per_rank_from(int64_t n, int64_t consumed, int world) {
    return sampler_per_rank(n - consumed, world);
}

void sampler_epoch_from(uint64_t seed, int64_t epoch, int64_t n, int64_t consumed, int rank,
                        int world, int64_t *perm, int64_t *mine) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    shuffle(seed, RNG_STREAM_SHUFFLE, (uint64_t)epoch, perm, n);
    int64_t per_rank = sampler_per_rank_from(n, consumed, world);
    for (int64_t j = 0; j < per_rank; j++) mine[j] = perm[(consumed + rank + j * world) % n];
}

void sampler_epoch(uint64_t seed, int64_t epoch, int64_t n, int rank, int world, int64_t *perm,
                   int64_t *mine) {
    sampler_epoch_from(seed, epoch, n, 0, rank, world, perm, mine);
}

int64_t sampler_position_after(int64_t n, int64_t consumed, int64_t steps, int batch, int world) {
    int64_t per_rank = sampler_per_rank_from(n, consumed, world);
    int64_t taken = steps * batch < per_rank ? steps * batch : per_rank;
    return consumed + taken * world;
}

/* The records of class c: held out, the first `take` of a shuffle keyed by (seed, c). */
static void holdout_class(uint64_t seed, int c, int64_t *members, int64_t n_c, int64_t take,
                          uint8_t *is_val) {
    shuffle(seed, RNG_STREAM_HOLDOUT, (uint64_t)c, members, n_c);
    for (int64_t i = 0; i < take; i++) is_val[members[i]] = 1;
}

int64_t sampler_holdout(uint64_t seed, const int32_t *labels, int64_t n, int num_classes,
                        double fraction, uint8_t *is_val) {
    memset(is_val, 0, (size_t)n);
    /* the records grouped by class, in record order within a class (a counting sort) */
    int64_t *start = xcalloc((size_t)num_classes + 1, sizeof *start);
    for (int64_t i = 0; i < n; i++) start[labels[i] + 1]++;
    for (int c = 0; c < num_classes; c++) start[c + 1] += start[c];
    int64_t *members = xmalloc((size_t)(n ? n : 1) * sizeof *members);
    int64_t *fill = xmalloc((size_t)num_classes * sizeof *fill);
    memcpy(fill, start, (size_t)num_classes * sizeof *fill);
    for (int64_t i = 0; i < n; i++) members[fill[labels[i]]++] = i;
    int64_t held = 0;
    for (int c = 0; c < num_classes; c++) {
        int64_t n_c = start[c + 1] - start[c];
        int64_t take = (int64_t)floor(fraction * (double)n_c + 0.5);
        if (n_c > 1 && take >= n_c) take = n_c - 1;
        holdout_class(seed, c, members + start[c], n_c, take, is_val);
        held += take;
    }
    free(start);
    free(members);
    free(fill);
    return held;
}
