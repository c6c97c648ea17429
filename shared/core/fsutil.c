/* fsutil.c: see fsutil.h. */
#define _GNU_SOURCE /* syncfs */
#include "core/fsutil.h"

#include "core/check.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/check.h"

void fs_temp_name(const char *final_path, char *buf, size_t buflen) {
    snprintf(buf, buflen, "%s.tmp-%ld", final_path, (long)getpid());
}

void fs_dirname(const char *path, char *buf, size_t buflen) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(buf, buflen, ".");
    } else if (slash == path) {
        snprintf(buf, buflen, "/");
    } else {
        snprintf(buf, buflen, "%.*s", (int)(slash - path), path);
    }
}

int fs_fsync_parent(const char *path) {
    char dir[4096];
    fs_dirname(path, dir, sizeof dir);
    int fd = open(dir, O_RDONLY | O_DIRECTORY);
    if (fd < 0) return -1;
    int rc = fsync(fd);
    int saved = errno;
    close(fd);
    errno = saved;
    return rc;
}

static const char *fs_kind(mode_t mode) {
    if (S_ISREG(mode)) return NULL;
    if (S_ISLNK(mode)) return "a symlink";
    if (S_ISFIFO(mode)) return "a FIFO";
    if (S_ISDIR(mode)) return "a folder";
    if (S_ISCHR(mode) || S_ISBLK(mode)) return "a device";
    if (S_ISSOCK(mode)) return "a socket";
    return "not a regular file";
}

const char *fs_not_regular(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return NULL;
    return fs_kind(st.st_mode);
}

static __thread const char *fs_refused_kind;

const char *fs_open_regular_why(void) { return fs_refused_kind ? fs_refused_kind : "not a regular file"; }

int fs_open_regular(const char *path, int flags) {
    int fd = open(path, flags | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) return -1;
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int saved = errno;
        close(fd);
        errno = saved;
        return -1;
    }
    fs_refused_kind = fs_kind(st.st_mode);
    if (fs_refused_kind) {
        close(fd);
        errno = EINVAL;
        return -1;
    }
    /* Regular files ignore O_NONBLOCK for reads; clear it for clarity. */
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    return fd;
}

/* The temporary, created exclusively; a planted file or symlink under its name is
 * unlinked (unlink never follows a symlink) and the creation tried once more. */
static int fs_temp_create(const char *tmp) {
    for (int attempt = 0; attempt < 2; attempt++) {
        int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
        if (fd >= 0 || errno != EEXIST) return fd;
        if (unlink(tmp) != 0 && errno != ENOENT) return -1;
    }
    errno = EEXIST;
    return -1;
}

/* "<verb> <path>: <reason> (<hint>)"; -1 with errno e. */
static int fs_err(char *err, size_t errlen, const char *verb, const char *path, int e) {
    const char *hint = check_hint_for_errno(e);
    snprintf(err, errlen, "%s %s: %s%s%s%s", verb, path, strerror(e), hint ? " (" : "",
             hint ? hint : "", hint ? ")" : "");
    errno = e;
    return -1;
}

static int fs_refuse_kind(const char *path, const char *kind, char *err, size_t errlen) {
    snprintf(err, errlen, "%s is %s, not a regular file: not replaced", path, kind);
    errno = EINVAL;
    return -1;
}

/* The temporaries being written, for fs_unlink_temps_now: a slot is 0 (free), 1 (being
 * filled or emptied) or 2 (its path complete). A process writes a few at a time (the
 * snapshot writer's, the metrics'); one begun when every slot is taken is not listed. */
#define FS_TEMP_SLOTS 8
static char fs_temp_paths[FS_TEMP_SLOTS][4160];
static int fs_temp_state[FS_TEMP_SLOTS];

static int fs_temp_register(const char *tmp) {
    for (int i = 0; i < FS_TEMP_SLOTS; i++) {
        int free_slot = 0;
        if (__atomic_compare_exchange_n(&fs_temp_state[i], &free_slot, 1, 0, __ATOMIC_ACQ_REL,
                                        __ATOMIC_RELAXED)) {
            snprintf(fs_temp_paths[i], sizeof fs_temp_paths[i], "%s", tmp);
            __atomic_store_n(&fs_temp_state[i], 2, __ATOMIC_RELEASE);
            return i;
        }
    }
    return -1;
}

static void fs_temp_unregister(FsAtomic *a) {
    if (a->slot >= 0) __atomic_store_n(&fs_temp_state[a->slot], 0, __ATOMIC_RELEASE);
    a->slot = -1;
}

void fs_unlink_temps_now(void) {
    for (int i = 0; i < FS_TEMP_SLOTS; i++)
        if (__atomic_load_n(&fs_temp_state[i], __ATOMIC_ACQUIRE) == 2) unlink(fs_temp_paths[i]);
}

int fs_atomic_begin(FsAtomic *a, const char *path, char *err, size_t errlen) {
    a->fd = -1;
    a->flags = 0;
    a->slot = -1;
    if (snprintf(a->path, sizeof a->path, "%s", path) >= (int)sizeof a->path)
        return fs_err(err, errlen, "cannot create", path, ENAMETOOLONG);
    fs_temp_name(path, a->tmp, sizeof a->tmp);
    const char *kind = fs_not_regular(path);
    if (kind) return fs_refuse_kind(path, kind, err, errlen);
    a->fd = fs_temp_create(a->tmp);
    if (a->fd < 0) return fs_err(err, errlen, "cannot create", a->tmp, errno);
    a->slot = fs_temp_register(a->tmp);
    /* The name a library can reopen without trusting the folder's entry. */
    snprintf(a->reopen, sizeof a->reopen, "/proc/self/fd/%d", a->fd);
    if (access(a->reopen, F_OK) != 0) snprintf(a->reopen, sizeof a->reopen, "%s", a->tmp);
    return 0;
}

void fs_atomic_abort(FsAtomic *a) {
    if (a->fd >= 0) {
        close(a->fd);
        unlink(a->tmp);
    }
    a->fd = -1;
    fs_temp_unregister(a);
}

int fs_atomic_commit(FsAtomic *a, char *err, size_t errlen) {
    int rc = 0;
    if (!(a->flags & FS_ATOMIC_DEFER_SYNC) && fsync(a->fd) != 0) rc = fs_err(err, errlen, "cannot write", a->tmp, errno);
    if (close(a->fd) != 0 && rc == 0) rc = fs_err(err, errlen, "cannot write", a->tmp, errno);
    a->fd = -1;
    /* Checked again just before the rename: the path may have appeared meanwhile. */
    const char *kind = rc == 0 ? fs_not_regular(a->path) : NULL;
    if (kind) rc = fs_refuse_kind(a->path, kind, err, errlen);
    if (rc == 0 && rename(a->tmp, a->path) != 0)
        rc = fs_err(err, errlen, "cannot rename into place", a->tmp, errno);
    if (rc != 0) {
        int saved = errno;
        unlink(a->tmp);
        fs_temp_unregister(a);
        errno = saved;
        return -1;
    }
    fs_temp_unregister(a);
    if (!(a->flags & FS_ATOMIC_DEFER_SYNC) && fs_fsync_parent(a->path) != 0)
        return fs_err(err, errlen, "renamed, but cannot fsync the folder of", a->path, errno);
    return 0;
}

int fs_write_atomic_flags(const char *path, FsWriteFn write, void *ctx, int flags, char *err,
                          size_t errlen) {
    FsAtomic a;
    if (fs_atomic_begin(&a, path, err, errlen) != 0) return -1;
    a.flags = flags;
    err[0] = '\0';
    if (write(a.fd, a.tmp, ctx, err, errlen) != 0) {
        int saved = errno;
        if (!err[0]) fs_err(err, errlen, "cannot write", a.tmp, saved);
        fs_atomic_abort(&a);
        errno = saved;
        return -1;
    }
    return fs_atomic_commit(&a, err, errlen);
}

int fs_write_atomic(const char *path, FsWriteFn write, void *ctx, char *err, size_t errlen) {
    return fs_write_atomic_flags(path, write, ctx, 0, err, errlen);
}

typedef struct {
    const void *buf;
    size_t len;
} FsBuf;

static int fs_write_buf_cb(int fd, const char *tmp_path, void *ctx, char *err, size_t errlen) {
    (void)tmp_path, (void)err, (void)errlen;
    const FsBuf *b = ctx;
    return fs_write_all(fd, b->buf, b->len);
}

int fs_write_atomic_buf(const char *path, const void *buf, size_t len, char *err, size_t errlen) {
    FsBuf b = {buf, len};
    return fs_write_atomic(path, fs_write_buf_cb, &b, err, errlen);
}

typedef struct {
    FsStdioFn fn;
    void *ctx;
} FsStdio;

static int fs_write_stdio_cb(int fd, const char *tmp_path, void *ctx, char *err, size_t errlen) {
    (void)tmp_path, (void)err, (void)errlen;
    const FsStdio *s = ctx;
    int dupfd = dup(fd);
    FILE *f = dupfd >= 0 ? fdopen(dupfd, "wb") : NULL;
    if (!f) {
        int saved = errno;
        if (dupfd >= 0) close(dupfd);
        errno = saved;
        return -1;
    }
    int rc = s->fn(f, s->ctx);
    int saved = errno;
    if (fclose(f) != 0 && rc == 0) return -1;
    errno = saved;
    return rc;
}

int fs_write_atomic_stdio(const char *path, FsStdioFn fn, void *ctx, int flags, char *err,
                          size_t errlen) {
    FsStdio s = {fn, ctx};
    return fs_write_atomic_flags(path, fs_write_stdio_cb, &s, flags, err, errlen);
}

int fs_mkdirs(const char *path, int mode) {
    char buf[4096];
    size_t n = strlen(path);
    if (n == 0 || n >= sizeof buf) {
        errno = ENAMETOOLONG;
        return -1;
    }
    memcpy(buf, path, n + 1);
    for (size_t i = 1; i <= n; i++) {
        if (buf[i] == '/' || buf[i] == '\0') {
            char saved = buf[i];
            buf[i] = '\0';
            if (mkdir(buf, (mode_t)mode) != 0 && errno != EEXIST) return -1;
            buf[i] = saved;
        }
    }
    return fs_is_dir(path) ? 0 : (errno = ENOTDIR, -1);
}

int fs_exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

int fs_is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

int fs_remove_stale_temps(const char *dir) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int removed = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        const char *tag = strstr(e->d_name, ".tmp-");
        if (!tag) continue;
        char *end;
        long pid = strtol(tag + 5, &end, 10);
        if (*end != '\0' || pid <= 0) continue;
        if (pid != (long)getpid() && kill((pid_t)pid, 0) == 0) continue; /* owner alive */
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", dir, e->d_name);
        if (unlink(full) == 0) removed++;
    }
    closedir(d);
    return removed;
}

int fs_write_all(int fd, const void *buf, size_t len) {
    const char *p = buf;
    while (len > 0) {
        ssize_t w = write(fd, p, len);
        if (w < 0) {
            if (errno == EINTR) continue;
            return -1;
        }
        p += w;
        len -= (size_t)w;
    }
    return 0;
}

char *fs_read_file(const char *path, size_t max_bytes, size_t *len_out) {
    int fd = fs_open_regular(path, O_RDONLY);
    FILE *f = fd >= 0 ? fdopen(fd, "rb") : NULL;
    if (!f) {
        if (fd >= 0) close(fd);
        return NULL;
    }
    /* Sized by fstat (a regular file), so the text is read into one buffer without
     * growing it; the loop still copes with a file that grows while read. */
    struct stat st;
    size_t cap = fstat(fd, &st) == 0 && st.st_size > 0 ? (size_t)st.st_size + 2 : 4096, len = 0;
    if (cap > max_bytes + 2) {
        fclose(f);
        errno = EFBIG;
        return NULL;
    }
    char *buf = malloc(cap);
    if (!buf) {
        fclose(f);
        errno = ENOMEM;
        return NULL;
    }
    for (;;) {
        if (len + 1 >= cap) {
            if (cap > max_bytes) {
                free(buf);
                fclose(f);
                errno = EFBIG;
                return NULL;
            }
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                fclose(f);
                errno = ENOMEM;
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
        size_t r = fread(buf + len, 1, cap - 1 - len, f);
        len += r;
        if (r == 0) break;
    }
    int err = ferror(f);
    fclose(f);
    if (err || len > max_bytes) {
        free(buf);
        errno = err ? EIO : EFBIG;
        return NULL;
    }
    buf[len] = '\0';
    if (len_out) *len_out = len;
    return buf;
}

int fs_last_line(FILE *f, char *out, size_t outlen) {
    char line[4096];
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        size_t n = strcspn(line, "\r\n");
        line[n] = '\0';
        if (n > 0) snprintf(out, outlen, "%s", line);
    }
    return out[0] ? 0 : -1;
}

void fs_input_path_from_stdin(const char *what, char *out, size_t outlen) {
    if (fs_last_line(stdin, out, outlen) == 0) return;
    struct stat st;
    if (fstat(STDIN_FILENO, &st) == 0 && S_ISFIFO(st.st_mode))
        die("no %s given, and the previous stage of the pipeline printed none on stdin: it "
            "failed or was stopped before it finished (see its messages above) ---> HINT: "
            "rerun the pipeline once that stage succeeds (a stopped cifar-train resumes)",
            what);
    die_usage("no %s given and none on stdin (see --help)", what);
}

void fs_companion_library(const char *env_var, const char *name, char *buf, size_t buflen) {
    const char *env = getenv(env_var);
    if (env && *env) {
        snprintf(buf, buflen, "%s", env);
        return;
    }
    char exe[4096];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(buf, buflen, "%s", name);
        return;
    }
    exe[n] = '\0';
    char dir[4096];
    fs_dirname(exe, dir, sizeof dir);
    snprintf(buf, buflen, "%s/%s", dir, name);
    if (access(buf, F_OK) != 0) snprintf(buf, buflen, "%s/../lib/cifar/%s", dir, name);
}

void fs_write_buf_or_die(const char *path, const void *buf, size_t len, int flags) {
    FsBuf b = {buf, len};
    char err[4400];
    if (fs_write_atomic_flags(path, fs_write_buf_cb, &b, flags, err, sizeof err) != 0)
        check_fail(__FILE__, __LINE__, path, err, check_hint_for_errno(errno));
}

void fs_syncfs_or_die(const char *dir) {
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    CHECK_STDIO(fd >= 0 && syncfs(fd) == 0, dir);
    close(fd);
}
