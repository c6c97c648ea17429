/* convert.c: see convert.h. */
#include "convert.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "check.h"
#include "progress.h"

#define CONVERT_MAX_FILE (256ll << 20)   /* a PNG of 4096x4096x3 is well under this */
#define CONVERT_WINDOW_BYTES (64ull << 20)
#define CONVERT_MAX_WINDOW 4096

enum { SLOT_EMPTY = 0, SLOT_READY, SLOT_FAILED };

typedef struct {
    int state;
    char *err; /* SLOT_FAILED: "<file>: <reason>" (allocated) */
    uint64_t sum[DATASET_MAX_CHANNELS], sumsq[DATASET_MAX_CHANNELS];
} Slot;

typedef struct {
    const ConvertJob *job;
    size_t rec;       /* bytes per image */
    int64_t count;
    int64_t window;
    uint8_t *pixels;  /* window * rec */
    Slot *slots;
    pthread_mutex_t mu;
    pthread_cond_t cv_work; /* a slot was freed */
    pthread_cond_t cv_done; /* the slot the writer waits for is filled */
    int64_t next_claim, written;
    int waiting;      /* workers blocked on a full window */
} Convert;

void convert_image_path(const char *dir, const char *name, char *buf, size_t buflen) {
    int n = snprintf(buf, buflen, "%s/%s", dir, name);
    if (n < 0 || (size_t)n >= buflen) die("%s/%s: path too long", dir, name);
}

int convert_read_file(const char *path, uint8_t **buf, size_t *cap, size_t *len, char *err,
                      size_t errlen) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        snprintf(err, errlen, "cannot read the image (%s)", strerror(errno));
        if (fd >= 0) close(fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > CONVERT_MAX_FILE) {
        snprintf(err, errlen, S_ISREG(st.st_mode) ? "file too large for an image (%lld bytes)"
                                                   : "not a regular file",
                 (long long)st.st_size);
        close(fd);
        return -1;
    }
    size_t want = (size_t)st.st_size;
    if (*cap < want + 1) {
        *cap = want + 1;
        *buf = xrealloc(*buf, *cap);
    }
    size_t got = 0;
    while (got < want) {
        ssize_t r = read(fd, *buf + got, want - got);
        if (r < 0 && errno == EINTR) continue;
        if (r <= 0) {
            snprintf(err, errlen, "cannot read the image (%s)", r < 0 ? strerror(errno)
                                                                    : "file shrank while read");
            close(fd);
            return -1;
        }
        got += (size_t)r;
    }
    close(fd);
    *len = got;
    return 0;
}

/* Exact per-channel sums of one image (integers: no rounding, any order). */
static void slot_stats(Slot *s, const uint8_t *px, size_t pixels, int c) {
    for (int k = 0; k < c; k++) {
        uint64_t sum = 0, sq = 0;
        for (size_t p = 0; p < pixels; p++) {
            uint32_t v = px[p * (size_t)c + (size_t)k];
            sum += v;
            sq += v * v;
        }
        s->sum[k] = sum;
        s->sumsq[k] = sq;
    }
}

typedef struct {
    ImageDecoder *dec;
    uint8_t *file;
    size_t file_cap;
} WorkerState;

static void convert_one(Convert *cv, WorkerState *ws, int64_t i, Slot *s, uint8_t *out) {
    const ConvertJob *job = cv->job;
    char path[4096], why[768], msg[4096 + 1024];
    size_t len;
    ImageShape got;
    convert_image_path(job->image_dir, job->ann->files[i], path, sizeof path);
    s->state = SLOT_FAILED;
    s->err = NULL;
    if (convert_read_file(path, &ws->file, &ws->file_cap, &len, why, sizeof why)) {
        snprintf(msg, sizeof msg, "%s: %s", path, why);
        s->err = xstrdup(msg);
        return;
    }
    int rc = image_decode(ws->dec, ws->file, len, &job->shape, out, cv->rec, &got, why, sizeof why);
    if (rc == IMAGE_MISMATCH) {
        snprintf(msg, sizeof msg, "%s: image is %dx%dx%d (HxWxC), the others are %dx%dx%d (as %s)",
                 path, got.height, got.width, got.channels, job->shape.height, job->shape.width,
                 job->shape.channels, job->shape_from);
        s->err = xstrdup(msg);
        return;
    }
    if (rc != IMAGE_OK) {
        snprintf(msg, sizeof msg, "%s: %s", path, why);
        s->err = xstrdup(msg);
        return;
    }
    slot_stats(s, out, (size_t)got.width * (size_t)got.height, got.channels);
    s->state = SLOT_READY;
}

static void *convert_worker(void *arg) {
    Convert *cv = arg;
    WorkerState ws = {image_decoder_create(), NULL, 0};
    for (;;) {
        pthread_mutex_lock(&cv->mu);
        while (cv->next_claim < cv->count && cv->next_claim >= cv->written + cv->window) {
            cv->waiting++;
            pthread_cond_wait(&cv->cv_work, &cv->mu);
            cv->waiting--;
        }
        int64_t i = cv->next_claim;
        if (i < cv->count) cv->next_claim++;
        pthread_mutex_unlock(&cv->mu);
        if (i >= cv->count) break;
        Slot tmp;
        int64_t k = i % cv->window;
        convert_one(cv, &ws, i, &tmp, cv->pixels + (size_t)k * cv->rec);
        pthread_mutex_lock(&cv->mu);
        cv->slots[k] = tmp;
        if (i == cv->written) pthread_cond_signal(&cv->cv_done);
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
    int64_t w = (int64_t)(CONVERT_WINDOW_BYTES / cv->rec);
    if (w > CONVERT_MAX_WINDOW) w = CONVERT_MAX_WINDOW;
    if (w < 2 * (int64_t)job->threads) w = 2 * (int64_t)job->threads;
    if (w > cv->count) w = cv->count;
    cv->window = w;
    cv->pixels = xmalloc((size_t)w * cv->rec);
    cv->slots = xcalloc((size_t)w, sizeof *cv->slots);
    pthread_mutex_init(&cv->mu, NULL);
    pthread_cond_init(&cv->cv_work, NULL);
    pthread_cond_init(&cv->cv_done, NULL);
}

void convert_split(const ConvertJob *job, DatasetSplit *result) {
    Convert cv;
    convert_setup(&cv, job);
    int nthreads = job->threads < cv.count ? job->threads : (int)cv.count;
    pthread_t *tids = xcalloc((size_t)nthreads, sizeof *tids);
    for (int t = 0; t < nthreads; t++) {
        int rc = pthread_create(&tids[t], NULL, convert_worker, &cv);
        if (rc) die("cannot start a decoding thread (%s); try --threads 1", strerror(rc));
    }
    int c = job->shape.channels;
    __int128 sum[DATASET_MAX_CHANNELS] = {0}, sumsq[DATASET_MAX_CHANNELS] = {0};
    Progress prog;
    progress_begin(&prog, job->split, cv.count, "img");
    char err[1024];
    for (int64_t i = 0; i < cv.count; i++) {
        int64_t k = i % cv.window;
        Slot *s = &cv.slots[k];
        pthread_mutex_lock(&cv.mu);
        while (s->state == SLOT_EMPTY) pthread_cond_wait(&cv.cv_done, &cv.mu);
        pthread_mutex_unlock(&cv.mu);
        /* The first failure in file order is reported; exit stops the workers. */
        if (s->state == SLOT_FAILED) die("%s", s->err);
        for (int ch = 0; ch < c; ch++) {
            sum[ch] += s->sum[ch];
            sumsq[ch] += s->sumsq[ch];
        }
        if (dataset_writer_put(job->writer, job->split, i, job->ann->labels[i],
                               cv.pixels + (size_t)k * cv.rec, cv.rec, err, sizeof err))
            die("%s: %s", job->out_path, err);
        pthread_mutex_lock(&cv.mu);
        s->state = SLOT_EMPTY;
        cv.written = i + 1;
        if (cv.waiting) pthread_cond_broadcast(&cv.cv_work);
        pthread_mutex_unlock(&cv.mu);
        progress_update(&prog, i + 1, NULL);
    }
    for (int t = 0; t < nthreads; t++) pthread_join(tids[t], NULL);
    progress_end(&prog, NULL);
    memset(result, 0, sizeof *result);
    snprintf(result->name, sizeof result->name, "%s", job->split);
    result->count = cv.count;
    stats_finish(sum, sumsq, (__int128)cv.count * job->shape.width * job->shape.height, c, result);
    free(tids);
    free(cv.pixels);
    free(cv.slots);
    pthread_mutex_destroy(&cv.mu);
    pthread_cond_destroy(&cv.cv_work);
    pthread_cond_destroy(&cv.cv_done);
}
