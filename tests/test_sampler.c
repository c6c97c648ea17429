/* test_sampler: the DistributedSampler contract. For several dataset sizes and
 * world sizes: each rank gets ceil(n/W) indices, the shards together are the
 * padded permutation (every index at least once, only the first
 * ceil(n/W)*W - n repeated), the shards are disjoint when W divides n, the order
 * changes from epoch to epoch and with the seed, and is the same whoever computes it.
 * The validation hold-out: round(f * n_c) records of every class c (a class keeps one),
 * the same set for the same seed, another for another seed, spread over the classes'
 * records rather than their first ones. */
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

int main(void) {
    const int64_t sizes[] = {1, 2, 7, 64, 1000, 1001};
    const int worlds[] = {1, 2, 3, 8};
    for (size_t i = 0; i < sizeof sizes / sizeof *sizes; i++)
        for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++)
            for (int64_t e = 0; e < 3; e++) check_cover(sizes[i], worlds[w], e);
    check_epochs_differ();
    check_holdout();
    return unit_report("test_sampler");
}
