/* check.h: the one family of error checks every stage uses.
 *
 * Every failing call is reported as
 *     <program>: <what failed>: <reason> (file.c:123)
 *     ---> HINT: <what the user can do>
 * and the process exits with status 1 (2 for bad usage). Files are validated
 * with these checks, never with assert(): asserts vanish under NDEBUG.
 *
 * CHECK_STDIO / CHECK_ALLOC / CHECK_LMDB are here; CHECK_CUDA / CHECK_CUDNN /
 * CHECK_CUBLAS / CHECK_NCCL live in cuda_check.h so that CPU-only code never
 * includes a CUDA header. All of them end up in check_fail(). */
#ifndef CIFAR_CHECK_H
#define CIFAR_CHECK_H

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <string.h>

#ifdef __cplusplus
extern "C" {
#endif

/* The program name used as the prefix of every message ("cifar-prep"). */
void log_set_program(const char *name);
const char *log_program(void);

/* Print "<program>: <formatted message>" to stderr, newline added. */
void log_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* Informational line on stderr, suppressed by log_set_quiet(1). */
void log_info(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_set_quiet(int quiet);
int log_is_quiet(void);
/* This process is rank `rank` of a job of `world_size` (cifar-train's workers).
 * In a job of several ranks, log_info and log_warn lines say which rank they come
 * from ("cifar-train: rank 1: ..."), unless they already start with "rank ": a
 * line that differs between ranks is told apart. A line that is the same on every
 * rank goes through log_info_once / log_warn_once instead: printed once for the
 * job (by rank 0), unprefixed. Error lines are never prefixed: a permanent failure
 * every rank meets is printed once (FAILURE_NOTES_VAR). */
void log_set_rank(int rank, int world_size);
/* Set by the launcher for its workers when it writes a log file per rank
 * (--log-dir): each rank's file then holds its whole view, every line (the
 * launcher marks them with the rank), so log_set_rank is not applied. */
#define LOG_EVERY_RANK_VAR "CIFAR_LOG_EVERY_RANK"
void log_info_once(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void log_warn_once(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Report and exit(1). `hint` may be NULL. */
void check_fail(const char *file, int line, const char *what, const char *reason,
                const char *hint) __attribute__((noreturn));
/* "<program>: <message>" and exit(status). */
void die_status(int status, const char *fmt, ...) __attribute__((noreturn, format(printf, 2, 3)));
#define die(...) die_status(1, __VA_ARGS__)
/* Bad command-line usage: exit status 2. */
#define die_usage(...) die_status(EXIT_STATUS_USAGE, __VA_ARGS__)

/* Exit statuses (README "Exit statuses"). A failure is permanent when rerunning
 * the same command unchanged fails the same way: a bad configuration (--model,
 * --device cuda without a GPU, a diverging --lr), a refused snapshot (another
 * model or dataset, a newer format), bad data. The launcher restarts workers
 * after other failures, never after these. */
#define EXIT_STATUS_FAILURE 1   /* failed; a rerun may succeed (I/O, memory, a lost peer) */
#define EXIT_STATUS_USAGE 2     /* bad command line: permanent */
#define EXIT_STATUS_PERMANENT 3 /* a permanent failure, in a worker of a distributed job */
/* The variable that asks for EXIT_STATUS_PERMANENT (set by the launcher for its
 * workers, and by cifar-train for itself when it runs as a rank of a job);
 * without it a permanent failure exits 1 like any other. */
#define PERMANENT_STATUS_VAR "CIFAR_PERMANENT_EXIT_STATUS"
int exit_status_permanent(void);
/* A file the launcher shares with its workers: every rank that meets the same
 * permanent failure (bad data, a bad --model) would print the same line; the
 * first one prints it and notes it there, the others stay silent. */
#define FAILURE_NOTES_VAR "CIFAR_FAILURE_NOTES"
/* Report a permanent failure and exit with exit_status_permanent(). */
#define die_permanent(...) die_status(exit_status_permanent(), __VA_ARGS__)

/* An optional hook run once before check_fail/die exit: commands use it to remove
 * half-written output (a temporary LMDB, a temporary snapshot). */
void check_set_cleanup(void (*fn)(void));
void check_run_cleanup(void);

/* stdio and POSIX calls: `ok` is the success condition, `what` names the file. */
#define CHECK_STDIO(ok, what)                                                           \
    do {                                                                               \
        if (!(ok)) check_fail(__FILE__, __LINE__, (what), strerror(errno),             \
                              check_hint_for_errno(errno));                            \
    } while (0)
const char *check_hint_for_errno(int err);

#define CHECK_ALLOC(ptr, bytes)                                                         \
    do {                                                                               \
        if ((ptr) == NULL) check_fail(__FILE__, __LINE__, "out of memory",              \
                                      check_bytes_str((size_t)(bytes)),                 \
                                      "lower --batch-size or --threads, or free memory"); \
    } while (0)
const char *check_bytes_str(size_t bytes);

/* LMDB calls return 0 on success; `what` names the database file. */
#define CHECK_LMDB(call, what)                                                           \
    do {                                                                                \
        int check_lmdb_rc_ = (call);                                                    \
        if (check_lmdb_rc_ != 0) check_fail(__FILE__, __LINE__, (what),                 \
                                            mdb_strerror(check_lmdb_rc_),               \
                                            check_hint_for_lmdb(check_lmdb_rc_));       \
    } while (0)
const char *check_hint_for_lmdb(int rc);

/* Checked allocation helpers. */
void *xmalloc(size_t bytes);
void *xcalloc(size_t count, size_t size);
void *xrealloc(void *ptr, size_t bytes);
char *xstrdup(const char *s);
/* 64-byte aligned, zeroed; free with free(). */
void *xmalloc_aligned(size_t bytes);

#ifdef __cplusplus
}
#endif
#endif
