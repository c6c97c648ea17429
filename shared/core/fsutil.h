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

/* Writes the temporary's content: fd is open for writing on the (empty) temporary,
 * tmp_path its name (for messages, or for a library that opens files by name: reopen
 * "/proc/self/fd/<fd>" rather than the name, which someone could replace). 0, or -1
 * with errno set, or with its own reason in err (then errno is ignored). */
typedef int (*FsWriteFn)(int fd, const char *tmp_path, void *ctx, char *err, size_t errlen);

/* The one way every command writes a file. The temporary "<path>.tmp-<pid>" is
 * created in path's folder with O_EXCL|O_NOFOLLOW (a file or symlink planted under
 * that predictable name is unlinked, never written through), filled by `write`,
 * fsynced, renamed over path only when path is absent or a regular file (never over
 * a device, FIFO, folder or symlink), and the folder fsynced. 0, or -1 with a
 * one-line reason naming the file in err: "cannot create", "cannot write",
 * "<path> is a <kind>, not a regular file: not replaced", "cannot rename into place",
 * or "renamed, but cannot fsync the folder of" (the file is complete under its name).
 * The temporary never survives a failure. */
int fs_write_atomic(const char *path, FsWriteFn write, void *ctx, char *err, size_t errlen);
/* FS_ATOMIC_DEFER_SYNC: no fsync of the file or folder, for many small files made
 * durable at once by a later syncfs() before the one file that commits them all
 * (cifar-unpack's images before their annotation file). */
#define FS_ATOMIC_DEFER_SYNC 1
int fs_write_atomic_flags(const char *path, FsWriteFn write, void *ctx, int flags, char *err,
                          size_t errlen);
/* fs_write_atomic in three calls, for a writer that fills its file over many calls
 * (the dataset writer): begin creates the temporary (fd; `reopen` is the name under
 * which a library that opens by name reaches that same file), commit fsyncs, closes
 * and renames it with the same checks and messages, abort closes and removes it. */
typedef struct {
    int fd, flags;
    int slot; /* its entry in the table fs_unlink_temps_now reads, or -1 */
    char path[4096], tmp[4160], reopen[4160];
} FsAtomic;
int fs_atomic_begin(FsAtomic *a, const char *path, char *err, size_t errlen);
int fs_atomic_commit(FsAtomic *a, char *err, size_t errlen);
void fs_atomic_abort(FsAtomic *a);
/* Unlinks every temporary an FsAtomic of this process is writing now (begun, neither
 * committed nor aborted): async-signal-safe, for a fatal handler that _exits (the
 * dataset's SIGBUS), so that no half-written temporary outlives the process. */
void fs_unlink_temps_now(void);
/* fs_write_atomic of one buffer. */
int fs_write_atomic_buf(const char *path, const void *buf, size_t len, char *err, size_t errlen);
/* fs_write_atomic_buf that reports a failure (check_fail) and exits. */
void fs_write_buf_or_die(const char *path, const void *buf, size_t len, int flags);
/* syncfs() of the filesystem holding `dir` (what FS_ATOMIC_DEFER_SYNC's files wait
 * for), or report and exit. */
void fs_syncfs_or_die(const char *dir);
/* fs_write_atomic through a stdio stream (libpng writes to a FILE *): fn writes
 * to f (flushed and closed after it), 0 or -1 with errno. */
typedef int (*FsStdioFn)(FILE *f, void *ctx);
int fs_write_atomic_stdio(const char *path, FsStdioFn fn, void *ctx, int flags, char *err,
                          size_t errlen);
/* What an existing path is when it is not a regular file ("a symlink", "a FIFO",
 * "a folder", "a device", "a socket"), else NULL (a regular file, or absent). lstat. */
const char *fs_not_regular(const char *path);
/* fsync the folder holding `path` (so a rename in it is durable). 0 or -1/errno. */
int fs_fsync_parent(const char *path);
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
/* Open a file for reading only if it is a regular file: O_NONBLOCK (a FIFO never
 * blocks the open) then fstat; a FIFO, device, folder or socket fails with errno
 * EINVAL (fs_open_regular_why says which kind). fd or -1. */
int fs_open_regular(const char *path, int flags);
/* The kind of file the last fs_open_regular refused ("a FIFO", ...), thread-local. */
const char *fs_open_regular_why(void);
/* Read a whole file (NUL-terminated) up to max_bytes, regular files only. NULL with errno on failure
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
