/* epoch_position.h: where the epoch in progress stands, across world sizes (a
 * resharded resume: README "Resume with another world size", docs/DESIGN.md
 * "Resharded resume").
 *
 * The sampler deals the epoch's permutation so that what the ranks have consumed is
 * always a prefix of it (data/sampler.h): the position, one count. A process deals
 * the rest of the epoch from the position it started at (a segment: 0 for a fresh
 * epoch, the snapshot's position on resume) to its own world size. A resume with
 * another world size therefore continues the epoch, every image of it once, instead
 * of redoing it; the weights are a function of the snapshot and the sequence of world
 * sizes. The per-process batch stays --batch-size (torchrun's semantics): the global
 * batch becomes --batch-size x the new world size.
 *
 * The partial epoch's sums (loss, correct, images) are each rank's own while the
 * epoch runs at one world size, and a snapshot holds rank 0's, as they always were
 * (a resume at the same world size gives every rank rank 0's: the image count is
 * exact, the loss and accuracy of the part before the resume an estimate). Once an
 * epoch is resharded, what came before is carried by rank 0 as the job's sums, and a
 * snapshot holds the job's (rank 0's carried sums plus its own since, x the world
 * size: exact for the images, since every rank of a segment trains as many). */
#ifndef CIFAR_TRAIN_EPOCH_POSITION_H
#define CIFAR_TRAIN_EPOCH_POSITION_H

#include <stdint.h>

#include "format/checkpoint.h"

/* This process's part of the epoch in progress. */
typedef struct {
    int64_t start;      /* the position its dealing began at */
    int64_t step0;      /* the epoch's step count then */
    double carried[3];  /* rank 0, in a resharded epoch: the job's (loss, correct, images) before */
} EpochSegment;

/* What a resume of a partial epoch does with it. */
typedef enum {
    EPOCH_RESUME_NONE,     /* at an epoch boundary: nothing to continue */
    EPOCH_RESUME_SAME,     /* the same world size, as the snapshot's epoch ran: continue */
    EPOCH_RESUME_RESHARD,  /* another world size (or an epoch resharded before): continue
                              from the position, the rest dealt to this world size */
    EPOCH_RESUME_RESTART,  /* the order changed (seed, batch size, data): redo the epoch */
} EpochResume;

/* After loading a snapshot's progress p: decides and sets up the segment (rank of
 * world, --batch-size batch, n training images); order_changed: the options that
 * define the epoch's order differ from the snapshot's. A restart zeroes the partial
 * epoch (p->step goes back to the epoch's start). */
EpochResume epoch_position_resume(TrainProgress *p, EpochSegment *seg, int rank, int world,
                                  int batch, int64_t n, int order_changed);

/* At the start of an epoch (p->step_in_epoch 0): a segment from position 0 at world. */
void epoch_position_begin(TrainProgress *p, EpochSegment *seg, int world);

/* The position after this segment's steps so far. */
int64_t epoch_position_now(const TrainProgress *p, const EpochSegment *seg, int world, int batch,
                           int64_t n);

/* What a snapshot of this step records (rank 0): *out = *p with the position and, for
 * a resharded epoch, the job's partial sums. */
void epoch_position_snapshot(const TrainProgress *p, const EpochSegment *seg, int world, int batch,
                             int64_t n, TrainProgress *out);

/* The partial sums (loss, correct, images) of this rank with what the segment carries,
 * for the epoch's all-reduce. */
void epoch_position_sums(const TrainProgress *p, const EpochSegment *seg, double sums[3]);

/* At the end of an epoch: no position, no world sizes, no sums. */
void epoch_position_end(TrainProgress *p, EpochSegment *seg);

#endif
