/* test_loader_cuda.c: the CUDA loader's hand-over (shared/backend-cuda/loader_cuda.cu,
 * compiled as host C++) on the CPU, against a fake CUDA runtime defined here: one
 * "device" thread runs a FIFO of asynchronous copies, each after a random delay
 * and reading its source only when it runs (as DMA does), and event records. No
 * GPU needed; CUDA builds only (the loader includes the CUDA headers).
 *
 * Checked: every staged batch lands in "device" memory as host_split_gather gives
 * it, whatever the prefetch hints (the next batch, the one after, other indices,
 * the other split, repeated, none) and whatever the chunk size, with batches staged
 * back to back without waiting for the stream (the slot events must hold refills
 * back); the caller may overwrite its index arrays at once; the epoch loop's
 * pattern (batch i+1 named before batch i is staged) gathers every batch but the
 * first ahead; no CUDA call comes from the loader thread. */
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "unit.h"

#ifndef CIFAR_CUDA
int main(void) {
    printf("test_loader_cuda: SKIP: CPU-only build (the loader is CUDA code)\n");
    return 0;
}
#else
#include <pthread.h>
#include <unistd.h>

#include "backend-cuda/loader_cuda.h"
#include "core/check.h"

/* ---------------------------------------------------------------- fake runtime */

typedef struct FakeOp {
    int is_copy;
    void *dst;
    const void *src;
    size_t n;
    long *event_done; /* event records: set to seq when reached */
    long seq;
    struct FakeOp *next;
} FakeOp;

typedef struct {
    long recorded, done;
} FakeEvent;

static pthread_mutex_t fake_mu = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t fake_cv = PTHREAD_COND_INITIALIZER;
static FakeOp *fake_head, *fake_tail;
static long fake_pending;
static int fake_started;
static unsigned fake_seed = 1;
/* The loader thread must make no CUDA call (it would meet a graph capture of the
 * engine's thread, and it has no device set): every fake entry point counts the
 * calls made from another thread than the test's. */
static pthread_t fake_caller;
static long fake_foreign_calls;

static void fake_called(void) {
    if (!pthread_equal(pthread_self(), fake_caller)) __atomic_add_fetch(&fake_foreign_calls, 1, __ATOMIC_RELAXED);
}

static void *fake_device_main(void *arg) {
    (void)arg;
    pthread_mutex_lock(&fake_mu);
    for (;;) {
        while (!fake_head) pthread_cond_wait(&fake_cv, &fake_mu);
        FakeOp *op = fake_head;
        pthread_mutex_unlock(&fake_mu);
        usleep(rand_r(&fake_seed) % 200);
        if (op->is_copy) memcpy(op->dst, op->src, op->n);
        pthread_mutex_lock(&fake_mu);
        if (!op->is_copy) *op->event_done = op->seq;
        fake_head = op->next;
        if (!fake_head) fake_tail = NULL;
        fake_pending--;
        free(op);
        pthread_cond_broadcast(&fake_cv);
    }
    return NULL;
}

/* fake_mu held */
static void fake_push(FakeOp *op) {
    if (!fake_started) {
        pthread_t t;
        if (pthread_create(&t, NULL, fake_device_main, NULL) != 0) die("test_loader_cuda: pthread_create");
        pthread_detach(t);
        fake_started = 1;
    }
    op->next = NULL;
    if (fake_tail)
        fake_tail->next = op;
    else
        fake_head = op;
    fake_tail = op;
    fake_pending++;
    pthread_cond_broadcast(&fake_cv);
}

/* cudaStreamSynchronize of the one fake stream. */
static void fake_stream_sync(void) {
    pthread_mutex_lock(&fake_mu);
    while (fake_pending) pthread_cond_wait(&fake_cv, &fake_mu);
    pthread_mutex_unlock(&fake_mu);
}

cudaError_t cudaHostAlloc(void **p, size_t n, unsigned int flags) {
    fake_called();
    (void)flags;
    *p = xmalloc(n);
    memset(*p, 0xAB, n);
    return cudaSuccess;
}
cudaError_t cudaFreeHost(void *p) {
    fake_called();
    free(p);
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t *e, unsigned int flags) {
    fake_called();
    (void)flags;
    *e = (cudaEvent_t)xcalloc(1, sizeof(FakeEvent));
    return cudaSuccess;
}
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    fake_called();
    free(e);
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    fake_called();
    (void)s;
    FakeEvent *fe = (FakeEvent *)e;
    FakeOp *op = xcalloc(1, sizeof *op);
    pthread_mutex_lock(&fake_mu);
    op->seq = ++fe->recorded;
    op->event_done = &fe->done;
    fake_push(op);
    pthread_mutex_unlock(&fake_mu);
    return cudaSuccess;
}
/* Waits for the most recent record (at once when never recorded). */
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    fake_called();
    FakeEvent *fe = (FakeEvent *)e;
    pthread_mutex_lock(&fake_mu);
    long want = fe->recorded;
    while (fe->done < want) pthread_cond_wait(&fake_cv, &fake_mu);
    pthread_mutex_unlock(&fake_mu);
    return cudaSuccess;
}
cudaError_t cudaMemcpyAsync(void *dst, const void *src, size_t n, enum cudaMemcpyKind kind, cudaStream_t s) {
    fake_called();
    (void)kind;
    (void)s;
    FakeOp *op = xcalloc(1, sizeof *op);
    op->is_copy = 1;
    op->dst = dst;
    op->src = src;
    op->n = n;
    pthread_mutex_lock(&fake_mu);
    fake_push(op);
    pthread_mutex_unlock(&fake_mu);
    return cudaSuccess;
}
const char *cudaGetErrorString(cudaError_t e) {
    (void)e;
    return "fake CUDA runtime error";
}

/* ---------------------------------------------------------------- the test */

enum { COUNT = 200, MAX_BATCH = 64, INFLIGHT = 3, REC = 37 };
static const size_t rec = REC;

/* Two splits over one pool of records, in other orders (the loader must tell
 * them apart by split, not by indices). */
typedef struct {
    uint8_t *px;
    int32_t *lab[2];
    const uint8_t **recs[2];
    HostSplit split[2];
} Splits;

static void splits_make(Splits *d) {
    d->px = xmalloc(COUNT * rec);
    for (size_t i = 0; i < COUNT * rec; i++) d->px[i] = (uint8_t)(rand() & 255);
    for (int s = 0; s < 2; s++) {
        d->lab[s] = xmalloc(COUNT * sizeof(int32_t));
        d->recs[s] = xmalloc(COUNT * sizeof(uint8_t *));
        for (int i = 0; i < COUNT; i++) {
            int r = s == 0 ? COUNT - 1 - i : (i * 7 + 3) % COUNT; /* 7 is prime to 200 */
            d->recs[s][i] = d->px + (size_t)r * rec;
            d->lab[s][i] = r * 3 + s;
        }
        d->split[s] = (HostSplit){.labels = d->lab[s], .count = COUNT, .records = d->recs[s]};
    }
}

static void splits_free(Splits *d) {
    for (int s = 0; s < 2; s++) {
        free(d->lab[s]);
        free(d->recs[s]);
    }
    free(d->px);
}

/* A batch: its split, size and indices. */
typedef struct {
    int split, n;
    int64_t idx[MAX_BATCH];
} Batch;

static Batch batch_random(void) {
    Batch b;
    b.split = rand() % 2;
    b.n = 1 + rand() % MAX_BATCH;
    for (int i = 0; i < b.n; i++) b.idx[i] = rand() % COUNT;
    return b;
}

/* The "device" memory of one staged batch, checked once the stream is synced. */
typedef struct {
    Batch want;
    uint8_t px[MAX_BATCH * REC];
    int32_t lab[MAX_BATCH];
} Staged;

static int staged_wrong(const Splits *d, const Staged *st) {
    static uint8_t px[MAX_BATCH * REC];
    static int32_t lab[MAX_BATCH];
    host_split_gather(&d->split[st->want.split], rec, st->want.idx, 0, st->want.n, px, lab);
    return memcmp(px, st->px, (size_t)st->want.n * rec) != 0 ||
           memcmp(lab, st->lab, (size_t)st->want.n * sizeof(int32_t)) != 0;
}

/* The hint given before a batch is staged: mode 0 none, 1 the batch itself,
 * 2 the batch after it, 3 other indices, 4 the batch in the other split, 5 the
 * batch after it twice. The caller's copy of the indices is scribbled over at
 * once (the loader must have copied them). */
static void hint(BatchLoader *l, const Splits *d, int mode, const Batch *cur, const Batch *next) {
    Batch h;
    switch (mode) {
    case 1: h = *cur; break;
    case 2: case 5: h = *next; break;
    case 3: h = batch_random(); break;
    case 4: h = *cur; h.split ^= 1; break;
    default: return;
    }
    batch_loader_prefetch(l, &d->split[h.split], h.idx, h.n);
    if (mode == 5) batch_loader_prefetch(l, &d->split[h.split], h.idx, h.n);
    for (int i = 0; i < h.n; i++) h.idx[i] = -1;
}

/* Random hints, INFLIGHT batches staged back to back before the stream is synced. */
static void test_random_hints(const Splits *d, int chunk) {
    BatchLoader *l = batch_loader_create(rec, MAX_BATCH, chunk);
    static Staged st[INFLIGHT];
    int wrong = 0, staged = 0;
    Batch next = batch_random();
    for (int it = 0; it < 40; it++) {
        for (int k = 0; k < INFLIGHT; k++, staged++) {
            Batch cur = next;
            next = batch_random();
            hint(l, d, rand() % 6, &cur, &next);
            st[k].want = cur;
            memset(st[k].px, 0, sizeof st[k].px);
            batch_loader_stage(l, &d->split[cur.split], cur.idx, cur.n, st[k].px, st[k].lab, 0);
            for (int i = 0; i < cur.n; i++) cur.idx[i] = -1; /* the caller's to reuse now */
        }
        fake_stream_sync();
        for (int k = 0; k < INFLIGHT; k++) wrong += staged_wrong(d, &st[k]);
    }
    BatchLoaderStats s = batch_loader_stats(l);
    EXPECT(wrong == 0, "chunk %d, random hints: %d of %d batches staged wrong", chunk, wrong, staged);
    EXPECT(s.ready + s.late + s.demand == staged, "chunk %d: stats %lld + %lld + %lld != %d batches staged",
           chunk, (long long)s.ready, (long long)s.late, (long long)s.demand, staged);
    batch_loader_destroy(l);
}

/* The epoch loop: batch i+1 named before batch i is staged, the stream synced
 * after each (as every engine call does): every batch but the first gathered ahead.
 * With named_first, a hint that no batch takes and then batch 0 are named before
 * the loop: batch 0 is gathered ahead, batch 1's hint finds both slots taken and
 * is dropped (batch 1 gathered on demand), and from then on every batch is
 * gathered ahead again: one batch on demand either way. */
static void test_epoch_pattern(const Splits *d, int chunk, int named_first) {
    enum { STEPS = 30 };
    BatchLoader *l = batch_loader_create(rec, MAX_BATCH, chunk);
    static Batch b[STEPS];
    static Staged st;
    int wrong = 0;
    for (int i = 0; i < STEPS; i++) {
        b[i] = batch_random();
        b[i].split = 0;
    }
    if (named_first) {
        Batch stale = batch_random();
        batch_loader_prefetch(l, &d->split[stale.split], stale.idx, stale.n);
        batch_loader_prefetch(l, &d->split[0], b[0].idx, b[0].n);
    }
    for (int i = 0; i < STEPS; i++) {
        if (i + 1 < STEPS) batch_loader_prefetch(l, &d->split[0], b[i + 1].idx, b[i + 1].n);
        st.want = b[i];
        batch_loader_stage(l, &d->split[0], b[i].idx, b[i].n, st.px, st.lab, 0);
        usleep(300); /* the step's GPU work */
        fake_stream_sync();
        wrong += staged_wrong(d, &st);
    }
    BatchLoaderStats s = batch_loader_stats(l);
    EXPECT(wrong == 0, "chunk %d, epoch pattern: %d of %d batches staged wrong", chunk, wrong, STEPS);
    EXPECT(s.demand == 1 && s.ready + s.late == STEPS - 1,
           "chunk %d, epoch pattern%s: %lld ready, %lld late, %lld on demand; want 1 on demand", chunk,
           named_first ? " after a stale hint" : "", (long long)s.ready, (long long)s.late, (long long)s.demand);
    batch_loader_destroy(l);
}

int main(void) {
    log_set_program("test_loader_cuda");
    fake_caller = pthread_self();
    srand(7);
    Splits d;
    splits_make(&d);
    const int chunks[] = {1, 3, 7, 20, MAX_BATCH};
    for (size_t c = 0; c < sizeof chunks / sizeof *chunks; c++) {
        test_random_hints(&d, chunks[c]);
        test_epoch_pattern(&d, chunks[c], 0);
        test_epoch_pattern(&d, chunks[c], 1);
    }
    EXPECT(batch_loader_chunk_records(100, 1000, 64) == 10 && batch_loader_chunk_records(100, 50, 64) == 1 &&
               batch_loader_chunk_records(1, 1 << 20, 64) == 64,
           "batch_loader_chunk_records: chunk_bytes worth of records, within [1, max_batch]");
    EXPECT(__atomic_load_n(&fake_foreign_calls, __ATOMIC_RELAXED) == 0,
           "the loader thread made %ld CUDA calls (only the calling thread may)", fake_foreign_calls);
    splits_free(&d);
    return unit_report("test_loader_cuda");
}
#endif
