/* snapshot_writer.h: one background thread that writes snapshots while training
 * goes on (--save-interval, --save-every-steps, and the epoch snapshots).
 *
 * The caller stages the state at a step boundary (a host copy, or on the GPU an
 * asynchronous device-to-host copy, engine.h state_stage) and hands the thread a
 * job: a function that waits for the staged state, checks it and writes it with
 * checkpoint_write (the same atomic path as a snapshot written in the
 * foreground: temporary, fsync, rename, folder fsync), then prunes old ones. At
 * most one job is in flight: the caller asks snapshot_writer_busy() and skips an
 * optional snapshot, or waits for a required one (snapshot_writer_wait). A job's
 * failure is reported on the training thread, never from the writer thread, by
 * the next snapshot_writer_poll or snapshot_writer_wait. */
#ifndef CIFAR_SNAPSHOT_WRITER_H
#define CIFAR_SNAPSHOT_WRITER_H

#include <stddef.h>

/* A job's result: 0 written, else a message in err. */
enum { SNAPSHOT_JOB_FAILED = 1, SNAPSHOT_JOB_PERMANENT = 2 /* rerunning repeats it */ };
typedef int (*SnapshotJobFn)(void *arg, char *err, size_t errlen);

typedef struct SnapshotWriter SnapshotWriter;

SnapshotWriter *snapshot_writer_create(void);
/* Joins the thread (after waiting for a job in flight, whose failure is then
 * reported as by snapshot_writer_wait). */
void snapshot_writer_free(SnapshotWriter *w);

/* 1 while a job runs. */
int snapshot_writer_busy(SnapshotWriter *w);
/* Start fn(arg) on the writer thread; the writer must be idle (wait first). */
void snapshot_writer_start(SnapshotWriter *w, SnapshotJobFn fn, void *arg);
/* Wait for the job in flight, if any. A failed job ends the process here with its
 * message and status. */
void snapshot_writer_wait(SnapshotWriter *w);
/* A finished job's failure ends the process here; otherwise returns at once. */
void snapshot_writer_poll(SnapshotWriter *w);

#endif
