/* test_sampler: the DistributedSampler contract. For several dataset sizes and
 * world sizes: each rank gets ceil(n/W) indices, the shards together are the
 * padded permutation (every index at least once, only the first
 * ceil(n/W)*W - n repeated), the shards are disjoint when W divides n, the order
 * changes from epoch to epoch and with the seed, and is the same whoever computes it.
 * The validation hold-out: round(f * n_c) records of every class c (a class keeps one),
 * the same set for the same seed, another for another seed, spread over the classes'
 * records rather than their first ones.
 * Resharding: an epoch dealt in segments, each at a random world size (1..8) and
 * stopped after a random number of steps, then continued from its position
 * (sampler_epoch_from): every image of the epoch is dealt exactly once, only the
 * last segment's padding (fewer than its world size, from the start of the
 * permutation) comes again; the batches consumed so far are always a prefix of the
 * permutation; and at an unchanged world size the continuation is the
 * uninterrupted dealing itself. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "data/sampler.h"
#include "unit.h"


static void check_cover(int64_t n, int world, int64_t epoch) {
    int64_t per = sampler_per_rank(n, world);
    int64_t *perm = malloc((size_t)n * sizeof *perm), *mine = malloc((size_t)per * sizeof *mine);
    int *seen = calloc((size_t)n, sizeof *seen);
    for (int r = 0; r < world; r++) {
        sampler_epoch(7, epoch, n, r, world, perm, mine);
        for (int64_t j = 0; j < per; j++) {
            EXPECT(mine[j] >= 0 && mine[j] < n, "index %lld out of range", (long long)mine[j]);
            if (mine[j] >= 0 && mine[j] < n) seen[mine[j]]++;
        }
    }
    /* Padding repeats the permutation from its start (several times over when
     * the world is larger than the dataset, as PyTorch does). */
    int64_t pad = per * world - n, total = 0, max_seen = 1 + (pad + n - 1) / n, twice = 0;
    for (int64_t i = 0; i < n; i++) {
        EXPECT(seen[i] >= 1, "n=%lld W=%d: index %lld never sampled", (long long)n, world, (long long)i);
        EXPECT(seen[i] <= max_seen, "index %lld sampled %d times", (long long)i, seen[i]);
        total += seen[i];
        if (seen[i] == 2) twice++;
    }
    EXPECT(total == per * world, "n=%lld W=%d: %lld samples, want %lld", (long long)n, world,
           (long long)total, (long long)(per * world));
    if (pad < n)
        EXPECT(twice == pad, "n=%lld W=%d: %lld repeats, want the padding %lld", (long long)n, world,
               (long long)twice, (long long)pad);
    free(perm);
    free(mine);
    free(seen);
}

static void check_epochs_differ(void) {
    const int64_t n = 1000;
    int64_t *perm = malloc(n * sizeof *perm), *a = malloc(n * sizeof *a), *b = malloc(n * sizeof *b);
    sampler_epoch(7, 0, n, 0, 1, perm, a);
    sampler_epoch(7, 1, n, 0, 1, perm, b);
    EXPECT(memcmp(a, b, n * sizeof *a) != 0, "epochs 0 and 1 have the same order");
    sampler_epoch(8, 0, n, 0, 1, perm, b);
    EXPECT(memcmp(a, b, n * sizeof *a) != 0, "seeds 7 and 8 give the same order");
    sampler_epoch(7, 0, n, 0, 1, perm, b);
    EXPECT(memcmp(a, b, n * sizeof *a) == 0, "the same (seed, epoch) gives two orders");
    int fixed = 0;
    for (int64_t i = 0; i < n; i++) fixed += a[i] == i;
    EXPECT(fixed < 20, "%d of 1000 indices stay in place: not shuffled", fixed);
    free(perm);
    free(a);
    free(b);
}

/* Labels 0..k-1 with class c holding 10 * (c + 1) + c records, interleaved. */
static int64_t holdout_labels(int32_t *labels, int k) {
    int64_t n = 0;
    int left[8];
    for (int c = 0; c < k; c++) left[c] = 10 * (c + 1) + c;
    for (int more = 1; more;) {
        more = 0;
        for (int c = 0; c < k; c++)
            if (left[c] > 0) labels[n++] = c, left[c]--, more = 1;
    }
    return n;
}

static void check_holdout(void) {
    enum { K = 5 };
    int32_t labels[400];
    const int64_t n = holdout_labels(labels, K);
    uint8_t a[400], b[400];
    const double fractions[] = {0.1, 0.25, 0.5, 0.999};
    for (size_t f = 0; f < sizeof fractions / sizeof *fractions; f++) {
        int64_t held = sampler_holdout(3, labels, n, K, fractions[f], a), total = 0;
        for (int c = 0; c < K; c++) {
            int64_t n_c = 0, v_c = 0;
            for (int64_t i = 0; i < n; i++)
                if (labels[i] == c) n_c++, v_c += a[i];
            int64_t want = (int64_t)(fractions[f] * (double)n_c + 0.5);
            if (want >= n_c) want = n_c - 1;
            EXPECT(v_c == want, "f=%g class %d: %lld of %lld held out, want %lld", fractions[f], c,
                   (long long)v_c, (long long)n_c, (long long)want);
            total += v_c;
        }
        EXPECT(held == total, "f=%g: returns %lld, %lld are marked", fractions[f], (long long)held,
               (long long)total);
        for (int64_t i = 0; i < n; i++) EXPECT(a[i] <= 1, "is_val[%lld] = %d", (long long)i, a[i]);
    }
    sampler_holdout(3, labels, n, K, 0.25, a);
    sampler_holdout(3, labels, n, K, 0.25, b);
    EXPECT(memcmp(a, b, (size_t)n) == 0, "the same seed holds out another set");
    sampler_holdout(4, labels, n, K, 0.25, b);
    EXPECT(memcmp(a, b, (size_t)n) != 0, "seeds 3 and 4 hold out the same set");
    /* not the class's first records: some held-out record lies in the second half */
    int64_t late = 0;
    for (int64_t i = n / 2; i < n; i++) late += a[i];
    EXPECT(late > 0, "every held-out record is in the first half");
    EXPECT(sampler_holdout(3, labels, n, K, 0.001, a) == 0, "a fraction below half a record holds out none");
}

/* A small deterministic generator for the random cases (splitmix64). */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = (*state += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* How often position-p entries land on each image for p in [from, to) of the padded
 * permutation (perm[p % n]), added into count[]. */
static void count_positions(const int64_t *perm, int64_t n, int64_t from, int64_t to, int *count) {
    for (int64_t p = from; p < to; p++) count[perm[p % n]]++;
}

/* One segment from position c at world W, k steps of b: every rank's first
 * min(k * b, per) samples, added into seen[], must be positions [c, next) of the
 * padded permutation, each once (the consumed set stays a prefix). Returns next. */
static int64_t deal_segment(int64_t n, int64_t c, int world, int b, int64_t k, int64_t epoch,
                            int64_t *perm, int64_t *mine, int *seen) {
    int64_t per = sampler_per_rank_from(n, c, world), take = k * b < per ? k * b : per;
    int64_t next = sampler_position_after(n, c, k, b, world);
    EXPECT(next == c + take * world, "position after %lld steps: %lld, want %lld", (long long)k,
           (long long)next, (long long)(c + take * world));
    int *dealt = calloc((size_t)n, sizeof *dealt), *want = calloc((size_t)n, sizeof *want);
    for (int r = 0; r < world; r++) {
        sampler_epoch_from(7, epoch, n, c, r, world, perm, mine);
        for (int64_t j = 0; j < take; j++) {
            EXPECT(mine[j] >= 0 && mine[j] < n, "index %lld out of range", (long long)mine[j]);
            if (mine[j] < 0 || mine[j] >= n) continue;
            dealt[mine[j]]++;
            seen[mine[j]]++;
        }
    }
    count_positions(perm, n, c, next, want);
    for (int64_t i = 0; i < n; i++)
        EXPECT(dealt[i] == want[i], "n=%lld W=%d from %lld, %lld steps of %d: image %lld dealt %d "
               "times, positions [%lld, %lld) hold it %d times", (long long)n, world, (long long)c,
               (long long)k, b, (long long)i, dealt[i], (long long)c, (long long)next, want[i]);
    free(dealt);
    free(want);
    return next;
}

/* An epoch in random segments (world sizes 1..8, random stop points) until it is
 * consumed: each image exactly once, but the last segment's padding (fewer than
 * its world size, the start of the permutation again). */
static void check_resharded_epoch(int64_t n, int b, uint64_t *rnd) {
    int64_t *perm = malloc((size_t)n * sizeof *perm), *mine = malloc((size_t)n * sizeof *mine);
    int *seen = calloc((size_t)n, sizeof *seen), *want = calloc((size_t)n, sizeof *want);
    int64_t c = 0, epoch = (int64_t)(next_random(rnd) % 5);
    int world = 1;
    char trace[512] = "";
    size_t off = 0;
    while (c < n) {
        world = 1 + (int)(next_random(rnd) % 8);
        int64_t steps = (sampler_per_rank_from(n, c, world) + b - 1) / b;
        int64_t k = 1 + (int64_t)(next_random(rnd) % (uint64_t)steps);
        if (off < sizeof trace)
            off += (size_t)snprintf(trace + off, sizeof trace - off, " %lldx%d", (long long)k, world);
        c = deal_segment(n, c, world, b, k, epoch, perm, mine, seen);
    }
    int64_t pad = c - n;
    EXPECT(pad >= 0 && pad < world, "n=%lld b=%d steps x world:%s: %lld padded, the last world is %d",
           (long long)n, b, trace, (long long)pad, world);
    count_positions(perm, n, 0, c, want);
    int64_t extra = 0;
    for (int64_t i = 0; i < n; i++) {
        EXPECT(seen[i] == want[i] && seen[i] >= 1, "n=%lld b=%d steps x world:%s: image %lld dealt "
               "%d times, want %d", (long long)n, b, trace, (long long)i, seen[i], want[i]);
        extra += seen[i] - 1;
    }
    EXPECT(extra == pad, "n=%lld: %lld repeats, want the padding %lld", (long long)n, (long long)extra,
           (long long)pad);
    free(perm);
    free(mine);
    free(seen);
    free(want);
}

/* At one world size, the epoch continued from k batches in is the uninterrupted dealing. */
static void check_same_world_continues(int64_t n, int world, int b) {
    int64_t per = sampler_per_rank(n, world);
    int64_t *perm = malloc((size_t)n * sizeof *perm), *all = malloc((size_t)per * sizeof *all);
    int64_t *rest = malloc((size_t)per * sizeof *rest);
    for (int64_t k = 0; k * b < per; k++)
        for (int r = 0; r < world; r++) {
            sampler_epoch(7, 2, n, r, world, perm, all);
            int64_t c = sampler_position_after(n, 0, k, b, world);
            EXPECT(sampler_per_rank_from(n, c, world) == per - k * b, "n=%lld W=%d k=%lld: %lld left",
                   (long long)n, world, (long long)k, (long long)sampler_per_rank_from(n, c, world));
            sampler_epoch_from(7, 2, n, c, r, world, perm, rest);
            EXPECT(memcmp(rest, all + k * b, (size_t)(per - k * b) * sizeof *rest) == 0,
                   "n=%lld W=%d rank %d: continued after %lld steps, another order", (long long)n,
                   world, r, (long long)k);
        }
    free(perm);
    free(all);
    free(rest);
}

int main(void) {
    const int64_t sizes[] = {1, 2, 7, 64, 1000, 1001};
    const int worlds[] = {1, 2, 3, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++)
            for (int64_t e = 0; e < 3; e++) check_cover(sizes[i], worlds[w], e);
    check_epochs_differ();
    check_holdout();
    uint64_t rnd = 2026;
    const int64_t reshard_sizes[] = {1, 5, 64, 97, 1000};
    for (size_t i = 0; i < sizeof reshard_sizes / sizeof *reshard_sizes; i++)
        for (int trial = 0; trial < 40; trial++)
            check_resharded_epoch(reshard_sizes[i], 1 + (int)(next_random(&rnd) % 16), &rnd);
    for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++) {
        check_same_world_continues(1000, worlds[w], 32);
        check_same_world_continues(1001, worlds[w], 7);
    }
    return unit_report("test_sampler");
}
