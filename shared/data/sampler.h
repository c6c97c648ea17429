/* sampler.h: PyTorch's DistributedSampler(shuffle=True, drop_last=False), with
 * a counter-based permutation so every rank computes the same one alone:
 * a Fisher-Yates shuffle keyed by (seed, epoch) (set_epoch done right: a fresh
 * order every epoch), padded to a multiple of the world size with the start of
 * the permutation, rank r taking positions r, r+W, r+2W, ...
 *
 * Dealt that way, the samples W ranks consume in their first k batches of b are
 * positions [0, k*b*W) of the permutation: a prefix, whatever W. So where an epoch
 * stands is one count, its position (entries consumed, all ranks together), and
 * the rest of the epoch can be dealt to another world size from there: rank r of
 * W' takes positions c + r, c + r + W', ... (a resharded resume, docs/DESIGN.md
 * "Resharded resume"). From c = 0 that is the dealing above; from c = k*b*W at
 * the same W it is rank r's dealing from its (k*b)-th sample on, so a resume at
 * the same world size sees the same samples as a run that never stopped. */
#ifndef CIFAR_SAMPLER_H
#define CIFAR_SAMPLER_H

#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Samples per rank: ceil(n / world). */
int64_t sampler_per_rank(int64_t n, int world);

/* perm[n] (scratch) and mine[sampler_per_rank(n, world)]: this rank's indices
 * for the epoch, in order. */
void sampler_epoch(uint64_t seed, int64_t epoch, int64_t n, int rank, int world, int64_t *perm,
                   int64_t *mine);

/* The rest of an epoch from position `consumed` (0 <= consumed < n): samples per
 * rank, ceil((n - consumed) / world) (the remainder padded to a multiple of the
 * world size with the start of the permutation, as above). */
int64_t sampler_per_rank_from(int64_t n, int64_t consumed, int world);

/* perm[n] (scratch: the epoch's permutation on return) and
 * mine[sampler_per_rank_from(n, consumed, world)]: this rank's indices for the
 * rest of the epoch, in order: perm[(consumed + rank + j * world) % n]. */
void sampler_epoch_from(uint64_t seed, int64_t epoch, int64_t n, int64_t consumed, int rank,
                        int world, int64_t *perm, int64_t *mine);

/* The position after `steps` batches of `batch` per rank dealt from `consumed`
 * at `world`: consumed + steps * batch * world, at most the padded end of the
 * epoch (consumed + sampler_per_rank_from(...) * world). */
int64_t sampler_position_after(int64_t n, int64_t consumed, int64_t steps, int batch, int world);

/* The validation hold-out of a split (cifar-train --val-fraction): a fixed,
 * class-stratified part of its records, a pure function of (seed, labels,
 * fraction), so every rank and every resume holds out the same records. Of the
 * n_c records of class c, round(fraction * n_c) are held out, but never all of
 * a class's records when it has more than one (each class keeps a training
 * image); which ones: the first of a Fisher-Yates shuffle of the class's records
 * keyed by (seed, c). is_val[i] is set to 1 for a held-out record, 0 otherwise.
 * labels are in [0, num_classes). Returns how many are held out. */
int64_t sampler_holdout(uint64_t seed, const int32_t *labels, int64_t n, int num_classes,
                        double fraction, uint8_t *is_val);

#ifdef __cplusplus
}
#endif
#endif
