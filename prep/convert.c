/* convert.c: see convert.h. */
#define _GNU_SOURCE /* sync_file_range */
#include "convert.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <linux/openat2.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "core/check.h"
#include "core/progress.h"

#define CONVERT_WINDOW_BYTES (64ull << 20)
#define CONVERT_MAX_WINDOW 4096

#define CONVERT_WRITEBACK_BYTES (1ull << 20)

#define CONVERT_CHUNK_BYTES (1ull << 20)
#define CONVERT_MAX_CHUNK 64

enum { SLOT_EMPTY = 0, SLOT_READY, SLOT_FAILED };

/* One chunk of consecutive records, decoded by one worker: claiming and handing
 * back chunks rather than single images keeps the locking off the profile. */
typedef struct {
    int state;
    int64_t n_ok;  /* records decoded before the first failure (all when READY) */
    char *err;     /* SLOT_FAILED: "<file>: <reason>" (allocated) */
    uint64_t sum[DATASET_MAX_CHANNELS], sumsq[DATASET_MAX_CHANNELS];
} Slot;

typedef struct {
    const ConvertJob *job;
    size_t rec;       /* bytes per image */
    int64_t count;    /* images */
    int64_t chunk;    /* images per chunk */
    int64_t n_chunks;
    int64_t window;   /* chunks in flight */
    int dirfd;        /* the split's image folder: names open relative to it */
    uint8_t *pixels;  /* window * chunk * rec */
    Slot *slots;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* a slot was freed */
    pthread_cond_t cv_done; /* the slot the writer waits for is filled */
    int64_t next_claim, written; /* in chunks */
    int waiting;      /* workers blocked on a full window */
} Convert;

void convert_image_path(const char *dir, const char *name, char *buf, size_t buflen) {
    int n = snprintf(buf, buflen, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= buflen) die("%s/%s: path too long", dir, name);
}

/* Add one image to the exact per-channel sums (integers: no rounding, any order).
 * The bytes go through in blocks of STATS_LANES (a multiple of 1, 2, 3 and 4, so
 * byte j of every block has channel j % c): one 32-bit sum and sum of squares
 * per lane, which the compiler vectorises, flushed to the channels' 64-bit sums
 * before they could overflow (65536 blocks x 255^2 < 2^32). */
#define STATS_LANES 96
#define STATS_FLUSH_BLOCKS 65536
static void slot_stats(Slot *s, const uint8_t *px, size_t pixels, int c) {
    size_t n = pixels * (size_t)c, i = 0;
    while (STATS_LANES % c == 0 && n - i >= STATS_LANES) {
        uint32_t sum[STATS_LANES] = {0}, sq[STATS_LANES] = {0};
        for (size_t b = 0; b < STATS_FLUSH_BLOCKS && n - i >= STATS_LANES; b++, i += STATS_LANES)
            for (int j = 0; j < STATS_LANES; j++) {
                uint32_t v = px[i + (size_t)j];
                sum[j] += v;
                sq[j] += v * v;
            }
        for (int j = 0; j < STATS_LANES; j++) {
            s->sum[j % c] += sum[j];
            s->sumsq[j % c] += sq[j];
        }
    }
    for (; i < n; i++) { /* the tail (and channel counts that do not divide the lanes) */
        uint32_t v = px[i];
        s->sum[i % (size_t)c] += v;
        s->sumsq[i % (size_t)c] += v * v;
    }
}

typedef struct {
    ImageDecoder *dec;
    uint8_t *file;
    size_t file_cap;
} WorkerState;

/* Record i failed: "<dir>/<name>: <why>" into s->err; returns -1. */
static int convert_fail(const Convert *cv, int64_t i, Slot *s, const char *why) {
    char path[PATH_MAX], msg[2 * PATH_MAX + 256];
    convert_image_path(cv->job->image_dir, cv->job->ann->files[i], path, sizeof path);
    snprintf(msg, sizeof msg, "%s: %s", path, why);
    s->err = xstrdup(msg);
    return -1;
}

/* Said once per run, for the first image met: the others are dropped the same way. */
static void alpha_note(const Convert *cv, int64_t i) {
    static atomic_int said;
    if (atomic_exchange(&said, 1)) return;
    char path[PATH_MAX];
    convert_image_path(cv->job->image_dir, cv->job->ann->files[i], path, sizeof path);
    log_warn("%s: has an alpha channel (transparency), dropped: the dataset keeps gray or RGB "
             "pixels only (said once; other such images are converted the same way)", path);
}

/* Decode record i into out and add it to the slot's sums; 0, or -1 with s->err. */
static int convert_one(Convert *cv, WorkerState *ws, int64_t i, Slot *s, uint8_t *out) {
    const ConvertJob *job = cv->job;
    char why[PATH_MAX + 256]; /* the mismatch message names shape_from */
    size_t len;
    ImageShape got;
    const char *name = job->ann->files[i];
    if (image_file_read(cv->dirfd, name, job->outside_ok, &ws->file, &ws->file_cap, &len, why, sizeof why))
        return convert_fail(cv, i, s, why);
    int rc = image_decode(ws->dec, ws->file, len, &job->shape, out, cv->rec, &got, why, sizeof why);
    if (rc == IMAGE_MISMATCH)
        snprintf(why, sizeof why, "image is %dx%dx%d (HxWxC), the others are %dx%dx%d (as %s)",
                 got.height, got.width, got.channels, job->shape.height, job->shape.width,
                 job->shape.channels, job->shape_from);
    if (rc != IMAGE_OK) return convert_fail(cv, i, s, why);
    if (image_decoder_dropped_alpha(ws->dec)) alpha_note(cv, i);
    slot_stats(s, out, (size_t)got.width * (size_t)got.height, got.channels);
    return 0;
}

static void convert_chunk(Convert *cv, WorkerState *ws, int64_t c, Slot *s) {
    memset(s, 0, sizeof *s);
    int64_t first = c * cv->chunk, end = first + cv->chunk < cv->count ? first + cv->chunk : cv->count;
    uint8_t *base = cv->pixels + (size_t)(c % cv->window) * (size_t)cv->chunk * cv->rec;
    for (int64_t i = first; i < end; i++) {
        if (convert_one(cv, ws, i, s, base + (size_t)(i - first) * cv->rec)) {
            s->state = SLOT_FAILED;
            return;
        }
        s->n_ok++;
    }
    s->state = SLOT_READY;
}

static void *convert_worker(void *arg) {
    Convert *cv = arg;
    WorkerState ws = {image_decoder_create(), NULL, 0};
    for (;;) {
        pthread_mutex_lock(&cv->mu);
        while (cv->next_claim < cv->n_chunks && cv->next_claim >= cv->written + cv->window) {
            cv->waiting++;
            pthread_cond_wait(&cv->cv_work, &cv->mu);
            cv->waiting--;
        }
        int64_t c = cv->next_claim;
        if (c < cv->n_chunks) cv->next_claim++;
        pthread_mutex_unlock(&cv->mu);
        if (c >= cv->n_chunks) break;
        Slot tmp;
        convert_chunk(cv, &ws, c, &tmp);
        pthread_mutex_lock(&cv->mu);
        cv->slots[c % cv->window] = tmp;
        if (c == cv->written) pthread_cond_signal(&cv->cv_done);
        pthread_mutex_unlock(&cv->mu);
    }
    image_decoder_free(ws.dec);
    free(ws.file);
    return NULL;
}

/* mean and std of pixel/255 from exact integer sums over n values. */
static void stats_finish(const __int128 *sum, const __int128 *sumsq, __int128 n, int c,
                         DatasetSplit *out) {
    for (int k = 0; k < c; k++) {
        long double mean = (long double)sum[k] / (long double)n;
        __int128 num = sumsq[k] * n - sum[k] * sum[k]; /* n^2 * variance, exact */
        long double var = (long double)num / ((long double)n * (long double)n);
        out->mean[k] = (float)(mean / 255.0L);
        out->std[k] = (float)(sqrtl(var > 0 ? var : 0) / 255.0L);
    }
}

static void convert_setup(Convert *cv, const ConvertJob *job) {
    memset(cv, 0, sizeof *cv);
    cv->job = job;
    cv->count = job->ann->count;
    cv->rec = (size_t)job->shape.width * (size_t)job->shape.height * (size_t)job->shape.channels;
    int64_t ch = (int64_t)(CONVERT_CHUNK_BYTES / cv->rec);
    ch = ch < 1 ? 1 : ch > CONVERT_MAX_CHUNK ? CONVERT_MAX_CHUNK : ch;
    /* small splits: still give every thread a share */
    while (ch > 1 && (cv->count + ch - 1) / ch < 4 * (int64_t)job->threads) ch /= 2;
    cv->chunk = ch;
    cv->n_chunks = (cv->count + ch - 1) / ch;
    /* 4 chunks per thread keep the workers busy while the writer drains; more
     * only touches more memory (page faults, cache misses). */
    int64_t w = 4 * (int64_t)job->threads;
    int64_t fit = (int64_t)(CONVERT_WINDOW_BYTES / ((size_t)ch * cv->rec));
    if (w > fit) w = fit;
    if (w < 2 * (int64_t)job->threads) w = 2 * (int64_t)job->threads;
    if (w > cv->n_chunks) w = cv->n_chunks;
    cv->window = w;
    cv->pixels = xmalloc((size_t)w * (size_t)ch * cv->rec);
    cv->slots = xcalloc((size_t)w, sizeof *cv->slots);
    cv->dirfd = open(job->image_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (cv->dirfd < 0) die("%s: cannot open the image folder (%s)", job->image_dir, strerror(errno));
    pthread_mutex_init(&cv->mu, NULL);
    pthread_cond_init(&cv->cv_work, NULL);
    pthread_cond_init(&cv->cv_done, NULL);
}

/* Hand a decoded chunk's records to the writer, in order; dies on the first failure. */
static void convert_drain(Convert *cv, int64_t c, const Slot *s) {
    const ConvertJob *job = cv->job;
    const uint8_t *base = cv->pixels + (size_t)(c % cv->window) * (size_t)cv->chunk * cv->rec;
    char err[1024];
    for (int64_t j = 0; j < s->n_ok; j++) {
        int64_t i = c * cv->chunk + j;
        if (dataset_writer_put(job->writer, job->split, i, job->ann->labels[i],
                               base + (size_t)j * cv->rec, cv->rec, err, sizeof err))
            die("%s: %s", job->out_path, err);
    }
    /* The first failure in file order is reported; exit stops the workers. */
    if (s->state == SLOT_FAILED) die("%s", s->err);
}

/* Start the disk writes of what the writer has handed to the kernel so far, while
 * decoding goes on, so the final fdatasync waits for the last megabytes only.
 * Advisory: if it fails, that sync does all the work, as without it. */
static void convert_start_writeback(const ConvertJob *job) {
    if (job->writeback_fd >= 0) (void)sync_file_range(job->writeback_fd, 0, 0, SYNC_FILE_RANGE_WRITE);
}

void convert_split(const ConvertJob *job, DatasetSplit *result) {
    Convert cv;
    convert_setup(&cv, job);
    int nthreads = job->threads < cv.n_chunks ? job->threads : (int)cv.n_chunks;
    pthread_t *tids = xcalloc((size_t)nthreads, sizeof *tids);
    for (int t = 0; t < nthreads; t++) {
        int rc = pthread_create(&tids[t], NULL, convert_worker, &cv);
        if (rc) die("cannot start a decoding thread (%s); try --threads 1", strerror(rc));
    }
    int nch = job->shape.channels;
    __int128 sum[DATASET_MAX_CHANNELS] = {0}, sumsq[DATASET_MAX_CHANNELS] = {0};
    Progress prog;
    size_t unflushed = 0; /* bytes handed to the writer since the last writeback start */
    progress_begin(&prog, job->split, cv.count, "img");
    for (int64_t c = 0; c < cv.n_chunks; c++) {
        Slot *s = &cv.slots[c % cv.window];
        pthread_mutex_lock(&cv.mu);
        while (s->state == SLOT_EMPTY) pthread_cond_wait(&cv.cv_done, &cv.mu);
        pthread_mutex_unlock(&cv.mu);
        convert_drain(&cv, c, s);
        unflushed += (size_t)s->n_ok * cv.rec;
        if (unflushed >= CONVERT_WRITEBACK_BYTES) {
            convert_start_writeback(job);
            unflushed = 0;
        }
        for (int k = 0; k < nch; k++) {
            sum[k] += s->sum[k];
            sumsq[k] += s->sumsq[k];
        }
        pthread_mutex_lock(&cv.mu);
        s->state = SLOT_EMPTY;
        cv.written = c + 1;
        if (cv.waiting) pthread_cond_broadcast(&cv.cv_work);
        pthread_mutex_unlock(&cv.mu);
        int64_t done = (c + 1) * cv.chunk;
        progress_update(&prog, done < cv.count ? done : cv.count, NULL);
    }
    for (int t = 0; t < nthreads; t++) pthread_join(tids[t], NULL);
    progress_end(&prog, NULL);
    memset(result, 0, sizeof *result);
    snprintf(result->name, sizeof result->name, "%s", job->split);
    result->count = cv.count;
    stats_finish(sum, sumsq, (__int128)cv.count * job->shape.width * job->shape.height, nch, result);
    free(tids);
    free(cv.pixels);
    free(cv.slots);
    close(cv.dirfd);
    pthread_mutex_destroy(&cv.mu);
    pthread_cond_destroy(&cv.cv_work);
    pthread_cond_destroy(&cv.cv_done);
}
