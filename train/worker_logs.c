/* worker_logs.c: see worker_logs.h. The launcher's watch loop calls
 * worker_logs_pump instead of sleeping: one poll() over every worker's pipes. */
#include "worker_logs.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fsutil.h"

#define LINE_MAX_BYTES 65536 /* a longer line without a newline is cut there */

typedef struct {
    int rfd, wfd;   /* the pipe; -1 once closed */
    int rank;       /* local */
    int kind;       /* WORKER_STDOUT or WORKER_STDERR */
    char *buf;
    size_t len;
} Stream;

struct WorkerLogs {
    int n, node_rank;
    Stream *streams;  /* 2 per rank: stdout, stderr */
    int *file_fd;     /* per rank, -1 none */
    int *redirected;  /* per rank: stream bits kept off the terminal */
    int *shown;       /* per rank: on the terminal at all (--local-ranks-filter) */
    char dir[4096];
};

int worker_logs_wanted(const WorkerLogOptions *o) {
    return o->log_dir || o->redirects || o->tee || o->ranks_filter;
}

/* "3" (every rank) or "0:1,1:2" (per local rank) into bits[0..n): 0 or -1 + err. */
static int stream_spec_parse(const char *opt, const char *text, int n, int *bits, char *err,
                             size_t errlen) {
    for (int r = 0; r < n; r++) bits[r] = 0;
    if (!text) return 0;
    char *end;
    long all = strtol(text, &end, 10);
    if (end != text && *end == '\0') {
        if (all < 0 || all > 3) goto bad;
        for (int r = 0; r < n; r++) bits[r] = (int)all;
        return 0;
    }
    for (const char *p = text; *p;) {
        long rank = strtol(p, &end, 10);
        if (end == p || *end != ':') goto bad;
        p = end + 1;
        long v = strtol(p, &end, 10);
        if (end == p || v < 0 || v > 3 || (*end != ',' && *end != '\0')) goto bad;
        if (rank < 0 || rank >= n) {
            snprintf(err, errlen, "--%s %s: local rank %ld, but this node has ranks 0..%d", opt, text,
                     rank, n - 1);
            return -1;
        }
        bits[rank] = (int)v;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
bad:
    snprintf(err, errlen, "--%s '%s': expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), for "
             "every rank or per local rank as 0:3,1:2", opt, text);
    return -1;
}

/* "0,2" into shown[0..n) (NULL: every rank). */
static int ranks_filter_parse(const char *text, int n, int *shown, char *err, size_t errlen) {
    for (int r = 0; r < n; r++) shown[r] = text == NULL;
    if (!text) return 0;
    for (const char *p = text; *p;) {
        char *end;
        long rank = strtol(p, &end, 10);
        if (end == p || (*end != ',' && *end != '\0') || rank < 0 || rank >= n) {
            snprintf(err, errlen, "--local-ranks-filter '%s': expected local ranks in 0..%d, "
                     "separated by commas", text, n - 1);
            return -1;
        }
        shown[rank] = 1;
        p = *end == ',' ? end + 1 : end;
    }
    return 0;
}

/* The per-rank tables of the options; 0 or -1 + err. */
static int worker_logs_tables(const WorkerLogOptions *o, int n, int *redirected, int *shown,
                              char *err, size_t errlen) {
    if ((o->redirects || o->tee) && !o->log_dir) {
        snprintf(err, errlen, "--%s needs --log-dir (where the streams go)",
                 o->redirects ? "redirects" : "tee");
        return -1;
    }
    int *tee = xcalloc((size_t)n, sizeof *tee);
    int rc = stream_spec_parse("redirects", o->redirects, n, redirected, err, errlen);
    if (rc == 0) rc = stream_spec_parse("tee", o->tee, n, tee, err, errlen);
    if (rc == 0) rc = ranks_filter_parse(o->ranks_filter, n, shown, err, errlen);
    for (int r = 0; rc == 0 && r < n; r++) redirected[r] &= ~tee[r]; /* --tee wins */
    free(tee);
    return rc;
}

int worker_logs_check(const WorkerLogOptions *o, int nproc, char *err, size_t errlen) {
    if (nproc > WORKER_LOGS_MAX_RANKS) {
        snprintf(err, errlen, "per-rank logs: at most %d workers per node", WORKER_LOGS_MAX_RANKS);
        return -1;
    }
    int *a = xcalloc((size_t)nproc, sizeof *a), *b = xcalloc((size_t)nproc, sizeof *b);
    int rc = worker_logs_tables(o, nproc, a, b, err, errlen);
    free(a);
    free(b);
    return rc;
}

static void stream_open(Stream *s, int rank, int kind) {
    int fds[2];
    CHECK_STDIO(pipe(fds) == 0, "pipe (a worker's log)");
    /* no worker keeps another's pipe open past its exec (dup2 clears it on 1 and 2) */
    CHECK_STDIO(fcntl(fds[0], F_SETFD, FD_CLOEXEC) == 0 && fcntl(fds[1], F_SETFD, FD_CLOEXEC) == 0,
                "fcntl (a worker's log)");
    CHECK_STDIO(fcntl(fds[0], F_SETFL, O_NONBLOCK) == 0, "fcntl (a worker's log)");
    s->rfd = fds[0];
    s->wfd = fds[1];
    s->rank = rank;
    s->kind = kind;
    s->buf = xmalloc(LINE_MAX_BYTES);
    s->len = 0;
}

WorkerLogs *worker_logs_start(const WorkerLogOptions *o, int nproc, int node_rank, int attempt) {
    WorkerLogs *l = xcalloc(1, sizeof *l);
    l->n = nproc;
    l->node_rank = node_rank;
    l->streams = xcalloc((size_t)nproc * 2, sizeof *l->streams);
    l->file_fd = xcalloc((size_t)nproc, sizeof *l->file_fd);
    l->redirected = xcalloc((size_t)nproc, sizeof *l->redirected);
    l->shown = xcalloc((size_t)nproc, sizeof *l->shown);
    char err[256];
    if (worker_logs_tables(o, nproc, l->redirected, l->shown, err, sizeof err) != 0) die_usage("%s", err);
    if (o->log_dir) {
        snprintf(l->dir, sizeof l->dir, "%s/attempt_%d", o->log_dir, attempt);
        if (fs_mkdirs(l->dir, 0755) != 0) die("%s: cannot create the log folder: %s", l->dir, strerror(errno));
    }
    for (int r = 0; r < nproc; r++) {
        l->file_fd[r] = -1;
        if (o->log_dir) {
            char path[4200];
            snprintf(path, sizeof path, "%s/rank_%d.log", l->dir, node_rank * nproc + r);
            /* appended: a rerun of the same job in the same folder adds to it */
            l->file_fd[r] = open(path, O_WRONLY | O_CREAT | O_APPEND | O_NOFOLLOW | O_CLOEXEC, 0644);
            CHECK_STDIO(l->file_fd[r] >= 0, path);
        }
        stream_open(&l->streams[2 * r], r, WORKER_STDOUT);
        stream_open(&l->streams[2 * r + 1], r, WORKER_STDERR);
    }
    return l;
}

void worker_logs_child_fds(const WorkerLogs *l, int r, int *out_fd, int *err_fd) {
    *out_fd = l->streams[2 * r].wfd;
    *err_fd = l->streams[2 * r + 1].wfd;
}

void worker_logs_forked(WorkerLogs *l) {
    for (int i = 0; i < 2 * l->n; i++) {
        close(l->streams[i].wfd);
        l->streams[i].wfd = -1;
    }
}

/* "2026-12-01T21:50:00.123Z" */
static void timestamp_now(char *buf, size_t len) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    struct tm tm;
    gmtime_r(&ts.tv_sec, &tm);
    size_t n = strftime(buf, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, len - n, ".%03ldZ", ts.tv_nsec / 1000000);
}

/* A write to the terminal or a log file that fails (a closed terminal, a full disk)
 * must not stop training: the file is given up with one warning. */
static void log_file_write(WorkerLogs *l, int r, const char *text, size_t len) {
    if (l->file_fd[r] < 0 || fs_write_all(l->file_fd[r], text, len) == 0) return;
    log_warn("%s/rank_%d.log: %s: no more lines of this rank are logged", l->dir,
             l->node_rank * l->n + r, strerror(errno));
    close(l->file_fd[r]);
    l->file_fd[r] = -1;
}

static void line_emit(WorkerLogs *l, const Stream *s, const char *line, size_t len) {
    int rank = l->node_rank * l->n + s->rank;
    char prefix[96];
    if (l->file_fd[s->rank] >= 0) {
        char ts[40];
        timestamp_now(ts, sizeof ts);
        int n = snprintf(prefix, sizeof prefix, "[%s rank %d %s] ", ts, rank,
                         s->kind == WORKER_STDOUT ? "out" : "err");
        log_file_write(l, s->rank, prefix, (size_t)n);
        log_file_write(l, s->rank, line, len);
        log_file_write(l, s->rank, "\n", 1);
    }
    int path_line = rank == 0 && s->kind == WORKER_STDOUT; /* the pipeline contract */
    if (!path_line && (!l->shown[s->rank] || (l->redirected[s->rank] & s->kind))) return;
    int fd = s->kind == WORKER_STDOUT ? STDOUT_FILENO : STDERR_FILENO;
    int n = s->kind == WORKER_STDOUT ? 0 : snprintf(prefix, sizeof prefix, "[rank %d] ", rank);
    /* the terminal's errors (EPIPE of a closed reader) are the reader's business */
    if (fs_write_all(fd, prefix, (size_t)n) == 0 && fs_write_all(fd, line, len) == 0)
        (void)fs_write_all(fd, "\n", 1);
}

/* Emit the complete lines of s->buf (and all of it when `flush`). */
static void stream_lines(WorkerLogs *l, Stream *s, int flush) {
    size_t start = 0;
    for (size_t i = 0; i < s->len; i++)
        if (s->buf[i] == '\n') {
            line_emit(l, s, s->buf + start, i - start);
            start = i + 1;
        }
    if ((flush || s->len == LINE_MAX_BYTES) && start < s->len) {
        line_emit(l, s, s->buf + start, s->len - start);
        start = s->len;
    }
    memmove(s->buf, s->buf + start, s->len - start);
    s->len -= start;
}

/* Read what s has; closes it at end of file. */
static void stream_read(WorkerLogs *l, Stream *s) {
    for (;;) {
        ssize_t got = read(s->rfd, s->buf + s->len, LINE_MAX_BYTES - s->len);
        if (got < 0 && errno == EINTR) continue;
        if (got < 0 && errno == EAGAIN) return;
        if (got <= 0) { /* end of file, or an error: nothing more will come */
            stream_lines(l, s, 1);
            close(s->rfd);
            s->rfd = -1;
            return;
        }
        s->len += (size_t)got;
        stream_lines(l, s, 0);
    }
}

/* 1 while a pipe is open. */
static int pump_once(WorkerLogs *l, int timeout_ms) {
    struct pollfd *p = xcalloc((size_t)l->n * 2, sizeof *p);
    int k = 0;
    for (int i = 0; i < 2 * l->n; i++)
        if (l->streams[i].rfd >= 0) {
            p[k].fd = l->streams[i].rfd;
            p[k].events = POLLIN;
            k++;
        }
    if (k == 0) {
        free(p);
        return 0;
    }
    int rc = poll(p, (nfds_t)k, timeout_ms);
    if (rc < 0 && errno != EINTR) CHECK_STDIO(0, "poll (the workers' logs)");
    for (int i = 0; rc > 0 && i < 2 * l->n; i++)
        if (l->streams[i].rfd >= 0) stream_read(l, &l->streams[i]);
    free(p);
    return 1;
}

void worker_logs_pump(WorkerLogs *l, int timeout_ms) {
    if (!pump_once(l, timeout_ms)) {
        struct timespec ts = {0, (long)timeout_ms * 1000000L};
        nanosleep(&ts, NULL);
    }
}

void worker_logs_finish(WorkerLogs *l) {
    if (!l) return;
    struct timespec t0, t;
    clock_gettime(CLOCK_MONOTONIC, &t0);
    for (;;) {
        if (!pump_once(l, 10)) break;
        clock_gettime(CLOCK_MONOTONIC, &t);
        if ((double)(t.tv_sec - t0.tv_sec) + (double)(t.tv_nsec - t0.tv_nsec) * 1e-9 > 1.0) break;
    }
    for (int i = 0; i < 2 * l->n; i++) {
        Stream *s = &l->streams[i];
        if (s->rfd >= 0) {
            stream_lines(l, s, 1);
            close(s->rfd);
        }
        free(s->buf);
    }
    for (int r = 0; r < l->n; r++)
        if (l->file_fd[r] >= 0) close(l->file_fd[r]);
    free(l->streams);
    free(l->file_fd);
    free(l->redirected);
    free(l->shown);
    free(l);
}
