/* faultinject.c: an LD_PRELOAD shim that makes file writes fail or the process die
 * at a chosen point, for the hardening tests (tests/hardening.bats).
 *
 *   LD_PRELOAD=build/cpu/tests/libfaultinject.so FI_PATH=.safetensors FI_FAIL_AT=3 \
 *       FI_ERRNO=ENOSPC cifar-train ...
 *
 * Counted calls: write, pwrite, writev, pwritev (and their 64-bit names), fsync,
 * fdatasync, ftruncate on a file descriptor whose path matched when it was opened,
 * and rename whose source or target matches. A path matches when it contains one of
 * the colon-separated substrings of FI_PATH (all paths when FI_PATH is unset).
 *   FI_OPS       comma list of the kinds counted: write,sync,rename,truncate (default all)
 *   FI_FAIL_AT   the Nth counted call (1-based) fails with FI_ERRNO instead of running
 *   FI_FAIL_COUNT how many calls fail from there (default 1; 0 = every later one)
 *   FI_ERRNO     ENOSPC (default), EIO, EDQUOT, EROFS, or a number
 *   FI_KILL_AT   the process sends itself SIGKILL before the Nth counted call
 *   FI_DELAY_MS  every counted call first waits this many milliseconds (a slow disk)
 *   FI_LOG       append "pid n kind path" for every counted call to this file
 * Counters are per process: a restarted worker (a fresh exec) counts from 1 again.
 * libc's own internal writes (stdio buffers) bypass the shim; the project's
 * write()/fsync()/rename() calls and LMDB's pwrite()/writev()/fdatasync() do not. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <sys/types.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#define FI_MAX_FD 65536

enum { FI_WRITE = 1, FI_SYNC = 2, FI_RENAME = 4, FI_TRUNCATE = 8 };

static unsigned char fi_fd_match[FI_MAX_FD];
static long fi_counter;

static long fi_env_long(const char *name, long dflt) {
    const char *v = getenv(name);
    return v && *v ? strtol(v, NULL, 10) : dflt;
}

static int fi_ops_mask(void) {
    const char *v = getenv("FI_OPS");
    if (!v || !*v) return FI_WRITE | FI_SYNC | FI_RENAME | FI_TRUNCATE;
    int m = 0;
    if (strstr(v, "write")) m |= FI_WRITE;
    if (strstr(v, "sync")) m |= FI_SYNC;
    if (strstr(v, "rename")) m |= FI_RENAME;
    if (strstr(v, "truncate")) m |= FI_TRUNCATE;
    return m;
}

static int fi_errno(void) {
    const char *v = getenv("FI_ERRNO");
    if (!v || !*v || strcmp(v, "ENOSPC") == 0) return ENOSPC;
    if (strcmp(v, "EIO") == 0) return EIO;
    if (strcmp(v, "EDQUOT") == 0) return EDQUOT;
    if (strcmp(v, "EROFS") == 0) return EROFS;
    return (int)strtol(v, NULL, 10);
}

/* Does `path` contain one of FI_PATH's colon-separated substrings? */
static int fi_path_matches(const char *path) {
    const char *pat = getenv("FI_PATH");
    if (!pat || !*pat) return 1;
    if (!path) return 0;
    while (*pat) {
        const char *end = strchr(pat, ':');
        size_t n = end ? (size_t)(end - pat) : strlen(pat);
        if (n > 0 && n < 1024) {
            char sub[1024];
            memcpy(sub, pat, n);
            sub[n] = '\0';
            if (strstr(path, sub)) return 1;
        }
        if (!end) break;
        pat = end + 1;
    }
    return 0;
}

/* One line to FI_LOG with raw syscalls (no stdio, no recursion into the shim). */
static void fi_log(long n, const char *kind, const char *path) {
    const char *log = getenv("FI_LOG");
    if (!log || !*log) return;
    int fd = (int)syscall(SYS_openat, AT_FDCWD, log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) return;
    char line[1200];
    int len = snprintf(line, sizeof line, "%ld %ld %s %s\n", (long)getpid(), n, kind,
                       path ? path : "-");
    if (len > (int)sizeof line - 1) len = (int)sizeof line - 1;
    if (len > 0) syscall(SYS_write, fd, line, (size_t)len);
    syscall(SYS_close, fd);
}

/* FI_DELAY_MS of sleep, through signals (a handler's return resumes the wait). */
static void fi_delay(void) {
    long ms = fi_env_long("FI_DELAY_MS", 0);
    struct timespec left = {ms / 1000, (ms % 1000) * 1000000L};
    while (ms > 0 && nanosleep(&left, &left) != 0 && errno == EINTR) {}
}

/* Called before each interposed call that matched: 0 to run it, -1 (errno set)
 * to fail it; may not return (SIGKILL). */
static int fi_point(int kind, const char *kind_name, const char *path) {
    if (!(fi_ops_mask() & kind)) return 0;
    long n = __atomic_add_fetch(&fi_counter, 1, __ATOMIC_SEQ_CST);
    fi_log(n, kind_name, path);
    int saved = errno;
    fi_delay();
    errno = saved;
    if (fi_env_long("FI_KILL_AT", 0) == n) {
        syscall(SYS_kill, getpid(), SIGKILL);
        for (;;) pause();
    }
    long at = fi_env_long("FI_FAIL_AT", 0), count = fi_env_long("FI_FAIL_COUNT", 1);
    if (at > 0 && n >= at && (count <= 0 || n < at + count)) {
        errno = fi_errno();
        return -1;
    }
    return 0;
}

static int fi_fd_point(int fd, int kind, const char *kind_name) {
    if (fd < 0 || fd >= FI_MAX_FD || !fi_fd_match[fd]) return 0;
    char proc[64], path[1024];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(proc, path, sizeof path - 1);
    path[n > 0 ? n : 0] = '\0';
    return fi_point(kind, kind_name, path);
}

/* A file reopened through /proc/self/fd/N (how the dataset writer hands LMDB its
 * exclusive temporary) is matched by the path it resolves to. */
static void fi_fd_opened(int fd, const char *path) {
    if (fd < 0 || fd >= FI_MAX_FD) return;
    char real[1024];
    ssize_t n = strncmp(path, "/proc/self/fd/", 14) == 0 ? readlink(path, real, sizeof real - 1) : -1;
    if (n > 0) real[n] = '\0';
    fi_fd_match[fd] = (unsigned char)fi_path_matches(n > 0 ? real : path);
}

#define FI_REAL(ret, name, ...)                                    \
    static ret (*real_fn)(__VA_ARGS__);                            \
    if (!real_fn) real_fn = (ret(*)(__VA_ARGS__))dlsym(RTLD_NEXT, name)

/* ---- opening and closing: remember which descriptors are watched ---- */

static mode_t fi_mode(int flags, va_list ap) {
    return (flags & (O_CREAT | O_TMPFILE)) ? (mode_t)va_arg(ap, int) : 0;
}

#define FI_OPEN(fname, sym)                                        \
    int fname(const char *path, int flags, ...) {                  \
        va_list ap;                                                \
        va_start(ap, flags);                                       \
        mode_t mode = fi_mode(flags, ap);                          \
        va_end(ap);                                                \
        FI_REAL(int, sym, const char *, int, ...);                 \
        int fd = real_fn(path, flags, mode);                       \
        fi_fd_opened(fd, path);                                    \
        return fd;                                                 \
    }
FI_OPEN(open, "open")
FI_OPEN(open64, "open64")

#define FI_OPENAT(fname, sym)                                      \
    int fname(int dirfd, const char *path, int flags, ...) {       \
        va_list ap;                                                \
        va_start(ap, flags);                                       \
        mode_t mode = fi_mode(flags, ap);                          \
        va_end(ap);                                                \
        FI_REAL(int, sym, int, const char *, int, ...);            \
        int fd = real_fn(dirfd, path, flags, mode);                \
        fi_fd_opened(fd, path);                                    \
        return fd;                                                 \
    }
FI_OPENAT(openat, "openat")
FI_OPENAT(openat64, "openat64")

int __open_2(const char *path, int flags) {
    FI_REAL(int, "__open_2", const char *, int);
    int fd = real_fn(path, flags);
    fi_fd_opened(fd, path);
    return fd;
}

int __open64_2(const char *path, int flags) {
    FI_REAL(int, "__open64_2", const char *, int);
    int fd = real_fn(path, flags);
    fi_fd_opened(fd, path);
    return fd;
}

int close(int fd) {
    FI_REAL(int, "close", int);
    if (fd >= 0 && fd < FI_MAX_FD) fi_fd_match[fd] = 0;
    return real_fn(fd);
}

/* ---- the counted calls ---- */

ssize_t write(int fd, const void *buf, size_t n) {
    FI_REAL(ssize_t, "write", int, const void *, size_t);
    if (fi_fd_point(fd, FI_WRITE, "write")) return -1;
    return real_fn(fd, buf, n);
}

#define FI_PWRITE(fname, sym)                                                   \
    ssize_t fname(int fd, const void *buf, size_t n, off_t off) {               \
        FI_REAL(ssize_t, sym, int, const void *, size_t, off_t);                \
        if (fi_fd_point(fd, FI_WRITE, "pwrite")) return -1;                     \
        return real_fn(fd, buf, n, off);                                        \
    }
FI_PWRITE(pwrite, "pwrite")
FI_PWRITE(pwrite64, "pwrite64")

ssize_t writev(int fd, const struct iovec *iov, int cnt) {
    FI_REAL(ssize_t, "writev", int, const struct iovec *, int);
    if (fi_fd_point(fd, FI_WRITE, "writev")) return -1;
    return real_fn(fd, iov, cnt);
}

#define FI_PWRITEV(fname, sym)                                                  \
    ssize_t fname(int fd, const struct iovec *iov, int cnt, off_t off) {        \
        FI_REAL(ssize_t, sym, int, const struct iovec *, int, off_t);           \
        if (fi_fd_point(fd, FI_WRITE, "pwritev")) return -1;                    \
        return real_fn(fd, iov, cnt, off);                                      \
    }
FI_PWRITEV(pwritev, "pwritev")
FI_PWRITEV(pwritev64, "pwritev64")

int fsync(int fd) {
    FI_REAL(int, "fsync", int);
    if (fi_fd_point(fd, FI_SYNC, "fsync")) return -1;
    return real_fn(fd);
}

int fdatasync(int fd) {
    FI_REAL(int, "fdatasync", int);
    if (fi_fd_point(fd, FI_SYNC, "fdatasync")) return -1;
    return real_fn(fd);
}

#define FI_FTRUNCATE(fname, sym)                                                \
    int fname(int fd, off_t len) {                                              \
        FI_REAL(int, sym, int, off_t);                                          \
        if (fi_fd_point(fd, FI_TRUNCATE, "ftruncate")) return -1;               \
        return real_fn(fd, len);                                                \
    }
FI_FTRUNCATE(ftruncate, "ftruncate")
FI_FTRUNCATE(ftruncate64, "ftruncate64")

int rename(const char *from, const char *to) {
    FI_REAL(int, "rename", const char *, const char *);
    if ((fi_path_matches(from) || fi_path_matches(to)) && fi_point(FI_RENAME, "rename", to))
        return -1;
    return real_fn(from, to);
}

int renameat(int fromfd, const char *from, int tofd, const char *to) {
    FI_REAL(int, "renameat", int, const char *, int, const char *);
    if ((fi_path_matches(from) || fi_path_matches(to)) && fi_point(FI_RENAME, "rename", to))
        return -1;
    return real_fn(fromfd, from, tofd, to);
}
