/* snapshot_writer.c: see snapshot_writer.h. A mutex, a condition variable and
 * one job slot: the training thread fills the slot and signals; the writer runs
 * the job, stores its result and signals back. */
#include "snapshot_writer.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

struct SnapshotWriter {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    SnapshotJobFn fn;   /* the job to run, NULL when none is pending */
    void *arg;
    int running;        /* a job was started and has not finished */
    int quit;
    int status;         /* the last finished job's result, 0 ok */
    char err[1024];
};

static void *writer_main(void *p) {
    SnapshotWriter *w = p;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (!w->fn && !w->quit) pthread_cond_wait(&w->cv, &w->mu);
        if (!w->fn) break; /* quit with nothing pending */
        SnapshotJobFn fn = w->fn;
        void *arg = w->arg;
        w->fn = NULL;
        pthread_mutex_unlock(&w->mu);
        char err[sizeof w->err] = "";
        int status = fn(arg, err, sizeof err);
        pthread_mutex_lock(&w->mu);
        w->status = status;
        memcpy(w->err, err, sizeof err);
        w->running = 0;
        pthread_cond_broadcast(&w->cv);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

SnapshotWriter *snapshot_writer_create(void) {
    SnapshotWriter *w = xcalloc(1, sizeof *w);
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int rc = pthread_create(&w->thread, NULL, writer_main, w);
    if (rc != 0)
        check_fail(__FILE__, __LINE__, "starting the snapshot writer thread", strerror(rc),
                   "the process may be at its thread limit (ulimit -u)");
    return w;
}

int snapshot_writer_busy(SnapshotWriter *w) {
    pthread_mutex_lock(&w->mu);
    int busy = w->running;
    pthread_mutex_unlock(&w->mu);
    return busy;
}

void snapshot_writer_start(SnapshotWriter *w, SnapshotJobFn fn, void *arg) {
    pthread_mutex_lock(&w->mu);
    if (w->running) die("internal error: a snapshot write started while another is in flight");
    w->fn = fn;
    w->arg = arg;
    w->running = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
}

/* Called with the mutex held and no job running. */
static void writer_report(SnapshotWriter *w) {
    if (w->status == 0) return;
    int status = w->status;
    pthread_mutex_unlock(&w->mu);
    if (status == SNAPSHOT_JOB_PERMANENT) die_permanent("%s", w->err);
    die("%s", w->err);
}

void snapshot_writer_wait(SnapshotWriter *w) {
    pthread_mutex_lock(&w->mu);
    while (w->running) pthread_cond_wait(&w->cv, &w->mu);
    writer_report(w);
    pthread_mutex_unlock(&w->mu);
}

void snapshot_writer_poll(SnapshotWriter *w) {
    pthread_mutex_lock(&w->mu);
    if (!w->running) writer_report(w);
    pthread_mutex_unlock(&w->mu);
}

void snapshot_writer_free(SnapshotWriter *w) {
    if (!w) return;
    snapshot_writer_wait(w);
    pthread_mutex_lock(&w->mu);
    w->quit = 1;
    pthread_cond_broadcast(&w->cv);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}
