/* worker_logs.h: the launcher's per-rank logs, as torchrun's --log-dir, --redirects,
 * --tee and --local-ranks-filter provide them.
 *
 * With any of those options the launcher gives each worker a pipe for its stdout and
 * one for its stderr and copies every line, as it comes:
 *   - to LOG_DIR/attempt_K/rank_R.log (K the restart count, R the global rank), both
 *     streams in one file, each line as "[2026-12-01T21:50:00.123Z rank R err] ..."
 *     ("out" for stdout); a rerun in the same folder appends;
 *   - to the launcher's own stdout or stderr, unless the stream is redirected
 *     (--redirects) or the rank is filtered out (--local-ranks-filter): stderr lines
 *     with "[rank R] " in front, stdout lines as they are. Rank 0's stdout always
 *     reaches the launcher's stdout: its last line is the snapshot's path (the
 *     pipeline contract).
 * Without those options the workers inherit the launcher's descriptors (nothing is
 * copied). */
#ifndef CIFAR_WORKER_LOGS_H
#define CIFAR_WORKER_LOGS_H

#include <stddef.h>

#define WORKER_LOGS_MAX_RANKS 4096

/* Stream bits of --redirects and --tee. */
enum { WORKER_STDOUT = 1, WORKER_STDERR = 2 };

typedef struct {
    const char *log_dir;     /* NULL: no files */
    const char *redirects;   /* "3", "0:1,1:2": streams to the files only */
    const char *tee;         /* the same syntax: streams to the files and the terminal */
    const char *ranks_filter; /* "0,2": local ranks shown on the terminal (NULL: all) */
} WorkerLogOptions;

/* 1 when an option asks for the copies. */
int worker_logs_wanted(const WorkerLogOptions *o);

/* Check the options' syntax for nproc local ranks: 0, or -1 with a reason in err. */
int worker_logs_check(const WorkerLogOptions *o, int nproc, char *err, size_t errlen);

typedef struct WorkerLogs WorkerLogs;

/* For one attempt: the folder, the files and the pipes. Dies on an error. */
WorkerLogs *worker_logs_start(const WorkerLogOptions *o, int nproc, int node_rank, int attempt);
/* The descriptors local rank r's stdout and stderr get (in the child, before exec). */
void worker_logs_child_fds(const WorkerLogs *l, int r, int *out_fd, int *err_fd);
/* In the parent after the fork of every worker: close the pipes' write ends. */
void worker_logs_forked(WorkerLogs *l);
/* Copy what the workers wrote, waiting up to timeout_ms for something to come. */
void worker_logs_pump(WorkerLogs *l, int timeout_ms);
/* After the workers are reaped: copy what is left (until every pipe is closed or
 * a second has passed: a worker's own child may hold one), then close all. */
void worker_logs_finish(WorkerLogs *l);

#endif
