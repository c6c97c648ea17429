/* sampler.c: see sampler.h. */
#include "data/sampler.h"

#include "core/rng.h"

int64_t sampler_per_rank(int64_t n, int world) { return (n + world - 1) / world; }

void sampler_epoch(uint64_t seed, int64_t epoch, int64_t n, int rank, int world, int64_t *perm,
                   int64_t *mine) {
    for (int64_t i = 0; i < n; i++) perm[i] = i;
    for (int64_t i = n - 1; i > 0; i--) {
        int64_t j = rng_below(seed, RNG_STREAM_SHUFFLE, ((uint64_t)epoch << 32) ^ (uint64_t)i,
                              (uint32_t)(i + 1));
        int64_t t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    int64_t per_rank = sampler_per_rank(n, world);
    for (int64_t j = 0; j < per_rank; j++) mine[j] = perm[(rank + j * world) % n];
}
