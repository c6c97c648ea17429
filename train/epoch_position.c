/* epoch_position.c: see epoch_position.h. */
#include "epoch_position.h"

#include <string.h>

#include "data/sampler.h"

/* The world size joins the epoch's list unless it is the last one already; a full
 * list has its last entry overwritten. */
static void worlds_append(TrainProgress *p, int world) {
    if (p->n_epoch_worlds > 0 && p->epoch_worlds[p->n_epoch_worlds - 1] == world) return;
    if (p->n_epoch_worlds == CHECKPOINT_MAX_EPOCH_WORLDS) p->n_epoch_worlds--;
    p->epoch_worlds[p->n_epoch_worlds++] = world;
}

static int resharded(const TrainProgress *p) { return p->n_epoch_worlds > 1; }

static void zero_sums(TrainProgress *p) {
    p->partial_loss_sum = p->partial_correct = p->partial_seen = 0;
}

/* The snapshot's position: recorded (a resharded epoch) or its step count's at one
 * world size and batch; -1 when that is no position of an epoch of n images. */
static int64_t snapshot_position(const TrainProgress *p, int batch, int64_t n) {
    if (p->epoch_position >= 0) return p->epoch_position < n ? p->epoch_position : -1;
    /* in doubles first: step_in_epoch and world_size come from a file */
    double at = (double)p->step_in_epoch * batch * p->world_size;
    return at < (double)n ? p->step_in_epoch * batch * p->world_size : -1;
}

EpochResume epoch_position_resume(TrainProgress *p, EpochSegment *seg, int rank, int world,
                                  int batch, int64_t n, int order_changed) {
    memset(seg, 0, sizeof *seg);
    if (p->step_in_epoch == 0) return EPOCH_RESUME_NONE;
    int64_t position = snapshot_position(p, batch, n);
    if (order_changed || position <= 0) { /* back to the epoch's start */
        p->step -= p->step_in_epoch;
        epoch_position_end(p, seg);
        return EPOCH_RESUME_RESTART;
    }
    seg->start = position;
    seg->step0 = p->step_in_epoch;
    p->epoch_position = position;
    if (world == p->world_size && !resharded(p)) return EPOCH_RESUME_SAME; /* sums as they were */
    /* The job's sums so far: recorded as such in a resharded epoch's snapshot, else
     * rank 0's share of as many ranks (each trained as many images) */
    double scale = resharded(p) ? 1.0 : (double)p->world_size;
    double job[3] = {p->partial_loss_sum * scale, p->partial_correct * scale, p->partial_seen * scale};
    if (rank == 0) memcpy(seg->carried, job, sizeof job);
    zero_sums(p);
    worlds_append(p, world);
    return EPOCH_RESUME_RESHARD;
}

void epoch_position_begin(TrainProgress *p, EpochSegment *seg, int world) {
    memset(seg, 0, sizeof *seg);
    p->epoch_position = 0;
    p->n_epoch_worlds = 0;
    worlds_append(p, world);
}

int64_t epoch_position_now(const TrainProgress *p, const EpochSegment *seg, int world, int batch,
                           int64_t n) {
    return sampler_position_after(n, seg->start, p->step_in_epoch - seg->step0, batch, world);
}

void epoch_position_snapshot(const TrainProgress *p, const EpochSegment *seg, int world, int batch,
                             int64_t n, TrainProgress *out) {
    *out = *p;
    out->world_size = world;
    out->epoch_position = epoch_position_now(p, seg, world, batch, n);
    if (!resharded(p)) return;
    out->partial_loss_sum = seg->carried[0] + p->partial_loss_sum * world;
    out->partial_correct = seg->carried[1] + p->partial_correct * world;
    out->partial_seen = seg->carried[2] + p->partial_seen * world;
}

void epoch_position_sums(const TrainProgress *p, const EpochSegment *seg, double sums[3]) {
    sums[0] = p->partial_loss_sum + seg->carried[0];
    sums[1] = p->partial_correct + seg->carried[1];
    sums[2] = p->partial_seen + seg->carried[2];
}

void epoch_position_end(TrainProgress *p, EpochSegment *seg) {
    p->step_in_epoch = 0;
    zero_sums(p);
    p->partial_seconds = 0;
    p->n_epoch_worlds = 0;
    p->epoch_position = 0;
    memset(seg, 0, sizeof *seg);
}
