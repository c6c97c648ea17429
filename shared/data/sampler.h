/* sampler.h: PyTorch's DistributedSampler(shuffle=True, drop_last=False), with
 * a counter-based permutation so every rank computes the same one alone:
 * a Fisher-Yates shuffle keyed by (seed, epoch) (set_epoch done right: a fresh
 * order every epoch), padded to a multiple of the world size with the start of
 * the permutation, rank r taking positions r, r+W, r+2W, ... */
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

#ifdef __cplusplus
}
#endif
#endif
