/* fsutil.c: see fsutil.h. */
#include "core/fsutil.h"

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

int fs_commit_rename(const char *tmp, const char *final_path) {
    if (rename(tmp, final_path) != 0) return -1;
    return fs_fsync_parent(final_path);
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
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    size_t cap = 4096, len = 0;
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
