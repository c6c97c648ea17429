/* loader_cuda.cu: loader_cuda.h's streaming of batches through two pinned slots.
 *
 * The hand-over, all under one mutex. A slot is FREE, QUEUED (a batch posted,
 * its indices copied into the slot), GATHERING (the loader thread at work;
 * `filled` records done so far) or DONE (every record gathered, not yet staged).
 * Only the calling thread posts and frees slots; the loader thread only takes a
 * QUEUED slot (the one stage waits for first, else the oldest), gathers it chunk
 * by chunk (pausing a prefetch, QUEUED again with its filled records kept, when
 * stage starts waiting for the other slot) and sets it DONE with its last chunk,
 * in one critical section, so a slot whose filled == n is never touched by the loader again. Stage copies the
 * gathered records [copied, filled) as they come, records the slot's event after
 * the copies and sets the slot FREE. Before a FREE slot is posted again, the
 * calling thread waits for that event (cudaEventSynchronize: the copy has read
 * the slot; it is done already when the previous engine call synchronised its
 * stream, and an event never recorded returns at once), so the loader thread
 * makes no CUDA call and nothing it does meets a CUDA graph capture.
 *
 * Prefetches are consumed in order: staging a prefetched batch drops the
 * prefetches posted before it (QUEUED or DONE ones are freed at once, a GATHERING
 * one when the chunk being gathered ends). A stage with no matching prefetch
 * keeps them (the epoch loop prefetches batch i+1 before it runs batch i) and
 * gathers its batch into a free slot, else into the oldest one (waiting for the
 * chunk being gathered into it). */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "backend-cuda/cuda_check.h"
#include "backend-cuda/loader_cuda.h"

/* pthread calls return an error number (they do not set errno). */
#define CHECK_PTHREAD(call)                                                                \
    do {                                                                                   \
        int check_pthread_rc_ = (call);                                                    \
        if (check_pthread_rc_ != 0)                                                        \
            check_fail(__FILE__, __LINE__, #call, strerror(check_pthread_rc_),             \
                       "a thread call failed: check the limits on threads and memory "     \
                       "(ulimit -u, ulimit -v)");                                          \
    } while (0)

typedef enum { SLOT_FREE, SLOT_QUEUED, SLOT_GATHERING, SLOT_DONE } SlotState;

typedef struct {
    uint8_t *px;         /* pinned: max_batch records */
    int32_t *lab;        /* pinned: their labels */
    int64_t *idx;        /* the posted batch's sample indices (a copy) */
    cudaEvent_t copied;  /* recorded after the copies that read this slot */
    /* guarded by mu */
    const HostSplit *split;
    int n;
    SlotState state;
    int filled;          /* records gathered */
    int wanted;          /* stage waits for it: the loader takes it first */
    int dropped;         /* a stale prefetch: FREE instead of DONE when gathered */
    int64_t seq;         /* post order */
} Slot;

struct BatchLoader {
    size_t rec_bytes;
    int max_batch, chunk;
    Slot slot[2];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* any change of the guarded fields */
    /* guarded by mu */
    int64_t posted;      /* batches posted so far: the next seq */
    int quit;
    /* the calling thread's own */
    BatchLoaderStats stats;
};

static void loader_lock(BatchLoader *l) { CHECK_PTHREAD(pthread_mutex_lock(&l->mu)); }
static void loader_unlock(BatchLoader *l) { CHECK_PTHREAD(pthread_mutex_unlock(&l->mu)); }
static void loader_wait(BatchLoader *l) { CHECK_PTHREAD(pthread_cond_wait(&l->cv, &l->mu)); }
static void loader_wake(BatchLoader *l) { CHECK_PTHREAD(pthread_cond_broadcast(&l->cv)); }

/* ---------------------------------------------------------------- loader thread */

/* mu held: the QUEUED slot to gather next (the wanted one first, else the oldest),
 * or NULL. */
static Slot *loader_next_job(BatchLoader *l) {
    Slot *pick = NULL;
    for (int i = 0; i < 2; i++) {
        Slot *b = &l->slot[i];
        if (b->state != SLOT_QUEUED) continue;
        if (!pick || b->wanted > pick->wanted || (b->wanted == pick->wanted && b->seq < pick->seq))
            pick = b;
    }
    return pick;
}

/* mu held: stage waits for another slot than b, which the loader has not started
 * or has paused (b itself not wanted). */
static int loader_wanted_elsewhere(const BatchLoader *l, const Slot *b) {
    if (b->wanted) return 0;
    for (int i = 0; i < 2; i++) {
        const Slot *o = &l->slot[i];
        if (o != b && o->state == SLOT_QUEUED && o->wanted) return 1;
    }
    return 0;
}

/* Gather slot b chunk by chunk, from where it was left (filled). Called and returns
 * with mu held; between chunks the caller may copy what is filled. Ends early when
 * the loader is told to quit, or when the slot is dropped (a stale prefetch: no
 * stage copies from it, and slot_evict may be waiting for it to become FREE, so the
 * rest of its gather would only delay the batch that stage waits for), and pauses
 * (QUEUED again, filled kept) when stage now waits for the other slot: a prefetch
 * never delays a wanted batch by more than one chunk. */
static void loader_gather(BatchLoader *l, Slot *b) {
    b->state = SLOT_GATHERING;
    for (int first = b->filled; first < b->n && !l->quit && !b->dropped;) {
        const int m = b->n - first < l->chunk ? b->n - first : l->chunk;
        loader_unlock(l);
        host_split_gather(b->split, l->rec_bytes, b->idx + first, 0, m, b->px + (size_t)first * l->rec_bytes,
                          b->lab + first);
        loader_lock(l);
        first += m;
        b->filled = first;
        loader_wake(l);
        /* A slot dropped during this chunk is not paused: the loop ends and sets it
         * FREE now (QUEUED, it would stay taken until the wanted batch is gathered:
         * "a GATHERING one [is freed] when the chunk being gathered ends"). */
        if (first < b->n && !b->dropped && loader_wanted_elsewhere(l, b)) {
            b->state = SLOT_QUEUED; /* resumed by loader_main once the wanted one is done */
            return;
        }
    }
    b->state = b->dropped ? SLOT_FREE : SLOT_DONE; /* with the last filled, in one critical section */
    loader_wake(l);
}

static void *loader_main(void *arg) {
    BatchLoader *l = (BatchLoader *)arg;
    loader_lock(l);
    for (;;) {
        Slot *b = NULL;
        while (!l->quit && !(b = loader_next_job(l))) loader_wait(l);
        if (l->quit) break;
        loader_gather(l, b);
    }
    loader_unlock(l);
    return NULL;
}

/* The loader thread takes no asynchronous signal (SIGINT, SIGTERM, ...: the
 * commands' handlers expect them on the main thread); faults stay unblocked (a
 * SIGBUS from a truncated dataset file is reported by dataset.c's handler). */
static void loader_start_thread(BatchLoader *l) {
    sigset_t all, old;
    sigfillset(&all);
    sigdelset(&all, SIGBUS);
    sigdelset(&all, SIGSEGV);
    sigdelset(&all, SIGFPE);
    sigdelset(&all, SIGILL);
    CHECK_PTHREAD(pthread_sigmask(SIG_SETMASK, &all, &old));
    CHECK_PTHREAD(pthread_create(&l->thread, NULL, loader_main, l));
    CHECK_PTHREAD(pthread_sigmask(SIG_SETMASK, &old, NULL));
}

/* ---------------------------------------------------------------- calling thread */

extern "C" int batch_loader_chunk_records(size_t rec_bytes, size_t chunk_bytes, int max_batch) {
    size_t k = rec_bytes ? chunk_bytes / rec_bytes : 1;
    if (k < 1) k = 1;
    if (k > (size_t)max_batch) k = (size_t)max_batch;
    return (int)k;
}

extern "C" BatchLoader *batch_loader_create(size_t rec_bytes, int max_batch, int chunk_records) {
    if (max_batch < 1 || chunk_records < 1 || chunk_records > max_batch || rec_bytes == 0)
        die("cuda loader: slots of %d records of %zu bytes, published %d at a time (internal error)",
            max_batch, rec_bytes, chunk_records);
    BatchLoader *l = (BatchLoader *)xcalloc(1, sizeof *l);
    l->rec_bytes = rec_bytes;
    l->max_batch = max_batch;
    l->chunk = chunk_records;
    for (int i = 0; i < 2; i++) {
        Slot *b = &l->slot[i];
        CHECK_CUDA(cudaHostAlloc((void **)&b->px, (size_t)max_batch * rec_bytes, cudaHostAllocDefault));
        CHECK_CUDA(cudaHostAlloc((void **)&b->lab, (size_t)max_batch * sizeof(int32_t), cudaHostAllocDefault));
        b->idx = (int64_t *)xmalloc((size_t)max_batch * sizeof(int64_t));
        /* blocking: a wait for the slot's copy sleeps instead of spinning */
        CHECK_CUDA(cudaEventCreateWithFlags(&b->copied, cudaEventDisableTiming | cudaEventBlockingSync));
        b->state = SLOT_FREE;
    }
    CHECK_PTHREAD(pthread_mutex_init(&l->mu, NULL));
    CHECK_PTHREAD(pthread_cond_init(&l->cv, NULL));
    loader_start_thread(l);
    return l;
}

static void batch_check(const BatchLoader *l, int n) {
    if (n < 1 || n > l->max_batch)
        die("cuda loader: a batch of %d records, slots of %d (internal error)", n, l->max_batch);
}

/* mu held: the slot posted with split s and indices idx[0..n), or NULL. */
static Slot *slot_find(BatchLoader *l, const HostSplit *s, const int64_t *idx, int n) {
    for (int i = 0; i < 2; i++) {
        Slot *b = &l->slot[i];
        if (b->state != SLOT_FREE && !b->dropped && b->split == s && b->n == n &&
            memcmp(b->idx, idx, (size_t)n * sizeof *idx) == 0)
            return b;
    }
    return NULL;
}

/* mu held: a FREE slot (the least recently posted when both are), or NULL. */
static Slot *slot_free(BatchLoader *l) {
    Slot *pick = NULL;
    for (int i = 0; i < 2; i++) {
        Slot *b = &l->slot[i];
        if (b->state == SLOT_FREE && (!pick || b->seq < pick->seq)) pick = b;
    }
    return pick;
}

/* mu held: a stale prefetch is let go: FREE at once unless the loader is
 * gathering it (then FREE once the chunk being gathered is done). */
static void slot_drop(Slot *b) {
    if (b->state == SLOT_GATHERING)
        b->dropped = 1;
    else
        b->state = SLOT_FREE;
}

/* mu held: a FREE slot, the oldest posted one let go when none is (waiting for the
 * chunk being gathered into it). */
static Slot *slot_evict(BatchLoader *l) {
    Slot *b = slot_free(l);
    if (b) return b;
    b = l->slot[0].seq < l->slot[1].seq ? &l->slot[0] : &l->slot[1];
    slot_drop(b);
    while (b->state != SLOT_FREE) loader_wait(l);
    return b;
}

/* mu held: post batch (s, idx[0..n)) on FREE slot b for the loader. The copy that
 * last read b is waited for first (without mu: only the calling thread posts, and
 * the loader takes no FREE slot). */
static void slot_post(BatchLoader *l, Slot *b, const HostSplit *s, const int64_t *idx, int n, int wanted) {
    loader_unlock(l);
    CHECK_CUDA(cudaEventSynchronize(b->copied));
    loader_lock(l);
    memcpy(b->idx, idx, (size_t)n * sizeof *idx);
    b->split = s;
    b->n = n;
    b->filled = 0;
    b->wanted = wanted;
    b->dropped = 0;
    b->seq = l->posted++;
    b->state = SLOT_QUEUED;
    loader_wake(l);
}

extern "C" void batch_loader_prefetch(BatchLoader *l, const HostSplit *s, const int64_t *idx, int n) {
    batch_check(l, n);
    loader_lock(l);
    Slot *b = slot_find(l, s, idx, n) ? NULL : slot_free(l);
    if (b) slot_post(l, b, s, idx, n, 0);
    loader_unlock(l);
}

/* mu held: the prefetches posted before the batch staged from b are stale. */
static void drop_older(BatchLoader *l, const Slot *b) {
    for (int i = 0; i < 2; i++) {
        Slot *o = &l->slot[i];
        if (o != b && o->state != SLOT_FREE && o->seq < b->seq) slot_drop(o);
    }
}

/* mu held: the slot holding (or about to hold) the batch to stage; counts how. */
static Slot *slot_for_stage(BatchLoader *l, const HostSplit *s, const int64_t *idx, int n) {
    Slot *b = slot_find(l, s, idx, n);
    if (b) {
        if (b->state == SLOT_DONE)
            l->stats.ready++;
        else
            l->stats.late++;
        drop_older(l, b);
    } else {
        b = slot_evict(l);
        slot_post(l, b, s, idx, n, 1);
        l->stats.demand++;
    }
    b->wanted = 1;
    loader_wake(l);
    return b;
}

extern "C" void batch_loader_stage(BatchLoader *l, const HostSplit *s, const int64_t *idx, int n,
                                   uint8_t *dev_px, int32_t *dev_lab, cudaStream_t stream) {
    batch_check(l, n);
    loader_lock(l);
    Slot *b = slot_for_stage(l, s, idx, n);
    for (int copied = 0; copied < n;) {
        while (b->filled <= copied) loader_wait(l);
        const int upto = b->filled;
        loader_unlock(l);
        const size_t m = (size_t)(upto - copied);
        CHECK_CUDA(cudaMemcpyAsync(dev_px + (size_t)copied * l->rec_bytes, b->px + (size_t)copied * l->rec_bytes,
                                   m * l->rec_bytes, cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(dev_lab + copied, b->lab + copied, m * sizeof(int32_t),
                                   cudaMemcpyHostToDevice, stream));
        loader_lock(l);
        copied = upto;
    }
    loader_unlock(l);
    /* filled == n: the loader set the slot DONE with it and never touches it again */
    CHECK_CUDA(cudaEventRecord(b->copied, stream));
    loader_lock(l);
    b->state = SLOT_FREE;
    loader_unlock(l);
}

extern "C" BatchLoaderStats batch_loader_stats(const BatchLoader *l) { return l->stats; }

extern "C" void batch_loader_destroy(BatchLoader *l) {
    if (!l) return;
    loader_lock(l);
    l->quit = 1;
    loader_wake(l);
    loader_unlock(l);
    CHECK_PTHREAD(pthread_join(l->thread, NULL));
    for (int i = 0; i < 2; i++) {
        Slot *b = &l->slot[i];
        CHECK_CUDA(cudaEventSynchronize(b->copied)); /* no copy still reads the slot */
        CHECK_CUDA(cudaEventDestroy(b->copied));
        CHECK_CUDA(cudaFreeHost(b->px));
        CHECK_CUDA(cudaFreeHost(b->lab));
        free(b->idx);
    }
    CHECK_PTHREAD(pthread_cond_destroy(&l->cv));
    CHECK_PTHREAD(pthread_mutex_destroy(&l->mu));
    free(l);
}
