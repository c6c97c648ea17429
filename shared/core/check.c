/* check.c: error reporting shared by every stage (see check.h). */
#include "core/check.h"

#include <fcntl.h>
#include <lmdb.h>
#include <stdarg.h>
#include <stdlib.h>
#include <sys/file.h>
#include <unistd.h>

static const char *g_program = "cifar";
static int g_quiet;
static int g_rank, g_world_size = 1; /* log_set_rank */
static void (*g_cleanup)(void);
static volatile int g_failing; /* set by check_fail/die on their way to exit */

/* LeakSanitizer's hook (make test-asan): a stage that stops on an error exits at once
 * and leaves its memory to the OS by design, so the leak check runs on clean exits
 * only. Without ASan this is an unused function. */
int __lsan_is_turned_off(void);
int __lsan_is_turned_off(void) { return g_failing; }

void log_set_program(const char *name) { g_program = name; }
const char *log_program(void) { return g_program; }
void log_set_quiet(int quiet) { g_quiet = quiet; }
int log_is_quiet(void) { return g_quiet; }
void log_set_rank(int rank, int world_size) {
    g_rank = rank;
    g_world_size = world_size;
}

/* One line "<program>: <kind><message>" on stderr. With `own_rank`, a line of this
 * rank alone: "rank R: " first in a job of several ranks, unless the message names
 * its rank already (the rendezvous' and NCCL's do). */
static void log_v(const char *kind, int own_rank, const char *fmt, va_list ap) {
    char line[4096];
    vsnprintf(line, sizeof line, fmt, ap);
    if (own_rank && g_world_size > 1 && strncmp(line, "rank ", 5) != 0)
        fprintf(stderr, "%s: rank %d: %s%s\n", g_program, g_rank, kind, line);
    else
        fprintf(stderr, "%s: %s%s\n", g_program, kind, line);
    fflush(stderr);
}

void log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_v("", 0, fmt, ap);
    va_end(ap);
}

void log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_v("warning: ", 1, fmt, ap);
    va_end(ap);
}

void log_info(const char *fmt, ...) {
    if (g_quiet) return;
    va_list ap;
    va_start(ap, fmt);
    log_v("", 1, fmt, ap);
    va_end(ap);
}

void log_warn_once(const char *fmt, ...) {
    if (g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    log_v("warning: ", 0, fmt, ap);
    va_end(ap);
}

void log_info_once(const char *fmt, ...) {
    if (g_quiet || g_rank != 0) return;
    va_list ap;
    va_start(ap, fmt);
    log_v("", 0, fmt, ap);
    va_end(ap);
}

void check_set_cleanup(void (*fn)(void)) { g_cleanup = fn; }

void check_run_cleanup(void) {
    void (*fn)(void) = g_cleanup;
    g_cleanup = NULL; /* never twice, even if cleanup itself fails */
    if (fn) fn();
}

void check_fail(const char *file, int line, const char *what, const char *reason,
                const char *hint) {
    fprintf(stderr, "%s: %s: %s (%s:%d)\n", g_program, what, reason, file, line);
    if (hint) fprintf(stderr, "---> HINT: %s\n", hint);
    fflush(stderr);
    g_failing = 1;
    check_run_cleanup();
    exit(1);
}

/* 1 when `line` is already in the launcher's notes file (another rank of the
 * job met the same permanent failure and printed it); otherwise it is added
 * and 0 returned. Any trouble with the file: 0 (print rather than lose it). */
static int already_noted(const char *line) {
    const char *path = getenv(FAILURE_NOTES_VAR);
    if (!path || !*path) return 0;
    int fd = open(path, O_RDWR | O_APPEND | O_CLOEXEC);
    if (fd < 0) return 0;
    int seen = 0;
    if (flock(fd, LOCK_EX) == 0) {
        static char notes[65536];
        ssize_t n = pread(fd, notes, sizeof notes - 1, 0);
        notes[n > 0 ? n : 0] = '\0';
        for (const char *p = notes; !seen && (p = strstr(p, line)) != NULL; p++)
            seen = (p == notes || p[-1] == '\n') && p[strlen(line)] == '\n';
        if (!seen) {
            ssize_t w = write(fd, line, strlen(line));
            w = write(fd, "\n", 1);
            (void)w;
        }
    }
    close(fd); /* drops the lock */
    return seen;
}

void die_status(int status, const char *fmt, ...) {
    char line[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    int permanent = status != EXIT_STATUS_FAILURE && status == exit_status_permanent();
    if (!permanent || !already_noted(line)) log_error("%s", line);
    g_failing = status != 0;
    check_run_cleanup();
    exit(status);
}

int exit_status_permanent(void) {
    const char *v = getenv(PERMANENT_STATUS_VAR);
    char *end = NULL;
    long status = v ? strtol(v, &end, 10) : 0;
    if (!v || end == v || *end != '\0' || status < 1 || status > 125) return EXIT_STATUS_FAILURE;
    return (int)status;
}

const char *check_hint_for_errno(int err) {
    switch (err) {
    case ENOSPC: return "the disk is full: free space or choose another output folder";
    case EACCES:
    case EPERM: return "check the permissions of the file and its folder";
    case ENOENT: return "check the path: the file or a folder on the way does not exist";
    case EROFS: return "the file system is read-only: choose another output folder";
    case EIO: return "the device reported an I/O error: check the disk";
    case EMFILE:
    case ENFILE: return "too many open files: raise `ulimit -n`";
    default: return NULL;
    }
}

const char *check_hint_for_lmdb(int rc) {
    switch (rc) {
    case MDB_MAP_FULL: return "the LMDB map is full: the writer grows it; report this if you see it";
    case MDB_INVALID: return "the file is not an LMDB environment (or is corrupt): rebuild it with cifar-prep";
    case MDB_CORRUPTED: return "the LMDB file is corrupt: rebuild it with cifar-prep";
    case MDB_VERSION_MISMATCH: return "the LMDB was written by another LMDB version: rebuild it with cifar-prep";
    case MDB_NOTFOUND: return "the LMDB lacks a record cifar-prep writes: rebuild it with cifar-prep";
    case ENOSPC: return "the disk is full: free space or choose another output folder";
    case ENOENT: return "check the path: the file does not exist";
    default: return NULL;
    }
}

const char *check_bytes_str(size_t bytes) {
    static char buf[64];
    snprintf(buf, sizeof buf, "could not allocate %.1f MiB", (double)bytes / (1024.0 * 1024.0));
    return buf;
}

void *xmalloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    CHECK_ALLOC(p, bytes);
    return p;
}

void *xcalloc(size_t count, size_t size) {
    void *p = calloc(count ? count : 1, size ? size : 1);
    CHECK_ALLOC(p, count * size);
    return p;
}

void *xrealloc(void *ptr, size_t bytes) {
    void *p = realloc(ptr, bytes ? bytes : 1);
    CHECK_ALLOC(p, bytes);
    return p;
}

char *xstrdup(const char *s) {
    size_t n = strlen(s) + 1;
    char *p = xmalloc(n);
    memcpy(p, s, n);
    return p;
}

void *xmalloc_aligned(size_t bytes) {
    size_t rounded = (bytes + 63) / 64 * 64;
    void *p = aligned_alloc(64, rounded ? rounded : 64);
    CHECK_ALLOC(p, bytes);
    memset(p, 0, rounded ? rounded : 64);
    return p;
}
