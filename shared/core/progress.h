/* progress.h: progress on stderr for long work.
 * On a terminal: one line redrawn in place, "label [#####.....] 42% 1234/5000 3.1k/s ETA 0:12 extra".
 * Otherwise (a pipe, a log file, CI): a plain line every `interval` seconds and one at the end.
 * Quiet mode (log_set_quiet) prints nothing. */
#ifndef CIFAR_PROGRESS_H
#define CIFAR_PROGRESS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char label[48];
    char unit[16];      /* "img", "step" */
    int64_t total;
    int64_t done;
    double start, last_draw;
    double interval;    /* seconds between plain lines */
    int tty;
    int drawn;
} Progress;

/* Monotonic seconds. */
double now_seconds(void);

void progress_begin(Progress *p, const char *label, int64_t total, const char *unit);
/* Set the count done and redraw if due; `extra` (may be NULL) is appended ("loss 1.23"). */
void progress_update(Progress *p, int64_t done, const char *extra);
/* Final line (always printed unless quiet). */
void progress_end(Progress *p, const char *extra);
/* "m:ss" or "h:mm:ss" ("--:--" when negative or unknown), as the ETA is shown. */
void progress_format_duration(double seconds, char *buf, size_t n);
/* Rate in units per second so far. */
double progress_rate(const Progress *p);

#ifdef __cplusplus
}
#endif
#endif
