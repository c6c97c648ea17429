/* loader_cuda.cu: loader_cuda.h's streaming of a batch through two pinned buffers.
 *
 * The hand-over, all under one mutex: the caller posts a batch (job = 1, filled =
 * queued = 0); the loader gathers chunk k into buffer k % 2 and sets filled = k+1;
 * the caller, once filled > k, enqueues the copies of chunk k, records the
 * buffer's event after them and sets queued = k+1. Buffer k % 2 last held chunk
 * k-2: the loader refills it once queued >= k-1 (its event was recorded for that
 * copy, not an older one) and cudaEventSynchronize on it returned (the copy has
 * read it). Between batches the events keep their last record, so the first two
 * chunks of a batch wait for the previous batch's copies the same way (an event
 * never recorded returns at once). The last chunk's filled and job = 0 are set in
 * one critical section: when stage returns the loader is idle again. */
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>

#include "cuda/cuda_check.h"
#include "cuda/loader_cuda.h"

/* pthread calls return an error number (they do not set errno). */
#define CHECK_PTHREAD(call)                                                                \
    do {                                                                                   \
        int check_pthread_rc_ = (call);                                                    \
        if (check_pthread_rc_ != 0)                                                        \
            check_fail(__FILE__, __LINE__, #call, strerror(check_pthread_rc_),             \
                       "a thread call failed: check the limits on threads and memory "     \
                       "(ulimit -u, ulimit -v)");                                          \
    } while (0)

typedef struct {
    uint8_t *px;         /* pinned: chunk records */
    int32_t *lab;        /* pinned: their labels */
    cudaEvent_t copied;  /* recorded after the copies that read this buffer */
} PinnedBuffer;

struct BatchLoader {
    int device;
    size_t rec_bytes;
    int chunk;           /* records per buffer */
    PinnedBuffer buf[2];
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;   /* any change of the fields below */
    /* guarded by mu */
    const HostSplit *split;
    const int64_t *idx;
    int n;
    int job;             /* 1 from the post of a batch until its last chunk is gathered */
    int filled, queued;  /* chunks of the batch gathered / copied (copies enqueued) */
    int quit;
    cudaError_t err;     /* a failure of the loader thread, reported by the caller */
    const char *err_what;
    int err_line;
};

static int chunks_of(int n, int chunk) { return (n + chunk - 1) / chunk; }

static int chunk_size(const BatchLoader *l, int k) {
    int left = l->n - k * l->chunk;
    return left < l->chunk ? left : l->chunk;
}

static void loader_lock(BatchLoader *l) { CHECK_PTHREAD(pthread_mutex_lock(&l->mu)); }
static void loader_unlock(BatchLoader *l) { CHECK_PTHREAD(pthread_mutex_unlock(&l->mu)); }
static void loader_wait(BatchLoader *l) { CHECK_PTHREAD(pthread_cond_wait(&l->cv, &l->mu)); }
static void loader_wake(BatchLoader *l) { CHECK_PTHREAD(pthread_cond_broadcast(&l->cv)); }

/* On the caller's thread, mu held: a failure of the loader thread ends the process
 * here, with the loader's call and line (as CHECK_CUDA would have said there). */
static void loader_raise(const BatchLoader *l) {
    if (l->err != cudaSuccess)
        check_fail(__FILE__, l->err_line, l->err_what, cudaGetErrorString(l->err),
                   cuda_check_hint(l->err));
}

/* A CUDA call of the loader thread, made without mu: its result, text and line. */
typedef struct {
    cudaError_t rc;
    const char *what;
    int line;
} LoaderCall;
static LoaderCall loader_call_result(cudaError_t rc, const char *what, int line) {
    LoaderCall c = {rc, what, line};
    return c;
}
#define LOADER_CALL(call) loader_call_result((call), #call, __LINE__)

/* On the loader thread, mu held: 0 when the call succeeded, else note the failure
 * for the caller, wake it and return -1. */
static int loader_check(BatchLoader *l, LoaderCall c) {
    if (c.rc == cudaSuccess) return 0;
    l->err = c.rc;
    l->err_what = c.what;
    l->err_line = c.line;
    loader_wake(l);
    return -1;
}

/* Gather chunk k of the posted batch into buffer k % 2 once the copy that last read
 * it is done. Called and returns with mu held. 0, or -1 after noting a failure. */
static int loader_fill(BatchLoader *l, int k) {
    PinnedBuffer *b = &l->buf[k % 2];
    const HostSplit *s = l->split;
    const int64_t *idx = l->idx + (size_t)k * l->chunk;
    const int n = chunk_size(l, k);
    loader_unlock(l);
    LoaderCall done = LOADER_CALL(cudaEventSynchronize(b->copied));
    if (done.rc == cudaSuccess) host_split_gather(s, l->rec_bytes, idx, 0, n, b->px, b->lab);
    loader_lock(l);
    if (loader_check(l, done) != 0) return -1;
    l->filled = k + 1;
    loader_wake(l);
    return 0;
}

static void *loader_main(void *arg) {
    BatchLoader *l = (BatchLoader *)arg;
    /* the events belong to this device */
    LoaderCall set = LOADER_CALL(cudaSetDevice(l->device));
    loader_lock(l);
    if (loader_check(l, set) != 0) {
        loader_unlock(l);
        return NULL;
    }
    for (;;) {
        while (!l->quit && !l->job) loader_wait(l);
        if (l->quit) break;
        const int chunks = chunks_of(l->n, l->chunk);
        for (int k = 0; k < chunks; k++) {
            while (!l->quit && l->queued < k - 1) loader_wait(l); /* chunk k-2 enqueued */
            if (l->quit || loader_fill(l, k) != 0) {
                loader_unlock(l);
                return NULL;
            }
        }
        l->job = 0; /* with the last filled, in one critical section */
    }
    loader_unlock(l);
    return NULL;
}

extern "C" int batch_loader_chunk_records(size_t rec_bytes, size_t chunk_bytes, int max_batch) {
    size_t k = rec_bytes ? chunk_bytes / rec_bytes : 1;
    if (k < 1) k = 1;
    if (k > (size_t)max_batch) k = (size_t)max_batch;
    return (int)k;
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

extern "C" BatchLoader *batch_loader_create(int device, size_t rec_bytes, int chunk_records) {
    if (chunk_records < 1 || rec_bytes == 0)
        die("cuda loader: %d records of %zu bytes per buffer (internal error)", chunk_records, rec_bytes);
    BatchLoader *l = (BatchLoader *)xcalloc(1, sizeof *l);
    l->device = device;
    l->rec_bytes = rec_bytes;
    l->chunk = chunk_records;
    l->err = cudaSuccess;
    for (int i = 0; i < 2; i++) {
        PinnedBuffer *b = &l->buf[i];
        CHECK_CUDA(cudaHostAlloc((void **)&b->px, (size_t)chunk_records * rec_bytes, cudaHostAllocDefault));
        CHECK_CUDA(cudaHostAlloc((void **)&b->lab, (size_t)chunk_records * sizeof(int32_t),
                                 cudaHostAllocDefault));
        /* blocking: the loader sleeps in cudaEventSynchronize instead of spinning */
        CHECK_CUDA(cudaEventCreateWithFlags(&b->copied, cudaEventDisableTiming | cudaEventBlockingSync));
    }
    CHECK_PTHREAD(pthread_mutex_init(&l->mu, NULL));
    CHECK_PTHREAD(pthread_cond_init(&l->cv, NULL));
    loader_start_thread(l);
    return l;
}

extern "C" void batch_loader_stage(BatchLoader *l, const HostSplit *s, const int64_t *idx, int n,
                                   uint8_t *dev_px, int32_t *dev_lab, cudaStream_t stream) {
    if (n < 1) return;
    loader_lock(l);
    loader_raise(l);
    l->split = s;
    l->idx = idx;
    l->n = n;
    l->filled = l->queued = 0;
    l->job = 1;
    loader_wake(l);
    const int chunks = chunks_of(n, l->chunk);
    for (int k = 0; k < chunks; k++) {
        while (l->filled <= k && l->err == cudaSuccess) loader_wait(l);
        loader_raise(l);
        loader_unlock(l);
        const PinnedBuffer *b = &l->buf[k % 2];
        const size_t first = (size_t)k * l->chunk, m = (size_t)chunk_size(l, k);
        CHECK_CUDA(cudaMemcpyAsync(dev_px + first * l->rec_bytes, b->px, m * l->rec_bytes,
                                   cudaMemcpyHostToDevice, stream));
        CHECK_CUDA(cudaMemcpyAsync(dev_lab + first, b->lab, m * sizeof(int32_t), cudaMemcpyHostToDevice,
                                   stream));
        CHECK_CUDA(cudaEventRecord(b->copied, stream));
        loader_lock(l);
        l->queued = k + 1;
        loader_wake(l);
    }
    loader_unlock(l);
}

extern "C" void batch_loader_destroy(BatchLoader *l) {
    if (!l) return;
    loader_lock(l);
    l->quit = 1;
    loader_wake(l);
    loader_unlock(l);
    CHECK_PTHREAD(pthread_join(l->thread, NULL));
    for (int i = 0; i < 2; i++) {
        PinnedBuffer *b = &l->buf[i];
        CHECK_CUDA(cudaEventSynchronize(b->copied)); /* no copy still reads the buffer */
        CHECK_CUDA(cudaEventDestroy(b->copied));
        CHECK_CUDA(cudaFreeHost(b->px));
        CHECK_CUDA(cudaFreeHost(b->lab));
    }
    CHECK_PTHREAD(pthread_cond_destroy(&l->cv));
    CHECK_PTHREAD(pthread_mutex_destroy(&l->mu));
    free(l);
}
