/* fsutil.h: durable, atomic file operations.
 *
 * Everything a stage produces appears under its final name only when complete:
 * it is written to "<final>.tmp-<pid>" in the same folder, fsynced, renamed,
 * and the folder fsynced. A crash at any point leaves the old file or the new
 * one, never half of either; stale temporaries are recognised by the ".tmp-"
 * infix and removed by the next run. */
#ifndef CIFAR_FSUTIL_H
#define CIFAR_FSUTIL_H

#include <stddef.h>
#include <stdio.h>

#ifdef __cplusplus
extern "C" {
#endif

/* "<path>.tmp-<pid>" into buf. */
void fs_temp_name(const char *final_path, char *buf, size_t buflen);
/* fsync the folder holding `path` (so a rename in it is durable). 0 or -1/errno. */
int fs_fsync_parent(const char *path);
/* rename(tmp, final) then fsync the folder. 0 or -1/errno. */
int fs_commit_rename(const char *tmp, const char *final_path);
/* mkdir -p. 0 or -1/errno. */
int fs_mkdirs(const char *path, int mode);
int fs_exists(const char *path);
int fs_is_dir(const char *path);
/* Folder part of path into buf ("." when none). */
void fs_dirname(const char *path, char *buf, size_t buflen);
/* Where a command finds one of its own shared libraries (libcifar-cuda.so,
 * libcifar-mpi.so): $env_var when set, else next to the executable (a build
 * tree), else ../lib/cifar/ beside it (an install), never LD_LIBRARY_PATH. */
void fs_companion_library(const char *env_var, const char *name, char *buf, size_t buflen);
/* Remove "<prefix>*.tmp-<pid>" files in `dir` whose pid is not alive. Returns count. */
int fs_remove_stale_temps(const char *dir);
/* Write all of buf to fd, retrying short writes. 0 or -1/errno. */
int fs_write_all(int fd, const void *buf, size_t len);
/* Read a whole file (NUL-terminated) up to max_bytes. NULL with errno on failure
 * (EFBIG when larger than max_bytes). */
char *fs_read_file(const char *path, size_t max_bytes, size_t *len_out);

/* The last non-empty line of a stream (how each stage reads the previous one's
 * output path: it is printed last), without its line ending, into out.
 * 0, or -1 when there is none. */
int fs_last_line(FILE *f, char *out, size_t outlen);
/* A stage's input path from stdin (the last line the previous stage printed) into
 * out. None: exit 2 (bad usage) when stdin is not a pipe; exit 1 when it is one,
 * saying that the previous stage printed no path (it failed or was stopped), so
 * that a pipeline stops at the stage that did not finish. `what` names the input
 * ("SNAPSHOT"). */
void fs_input_path_from_stdin(const char *what, char *out, size_t outlen);

#ifdef __cplusplus
}
#endif
#endif
