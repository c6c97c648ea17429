/* progress.c: see progress.h. */
#include "core/progress.h"

#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"

double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

void progress_begin(Progress *p, const char *label, int64_t total, const char *unit) {
    memset(p, 0, sizeof *p);
    snprintf(p->label, sizeof p->label, "%s", label);
    snprintf(p->unit, sizeof p->unit, "%s", unit ? unit : "");
    p->total = total;
    p->start = now_seconds();
    p->last_draw = 0;
    p->interval = 10.0;
    p->tty = isatty(STDERR_FILENO);
}

double progress_rate(const Progress *p) {
    double dt = now_seconds() - p->start;
    return dt > 0 ? (double)p->done / dt : 0.0;
}

void progress_format_duration(double s, char *buf, size_t n) {
    if (s < 0 || s > 1e7) {
        snprintf(buf, n, "--:--");
        return;
    }
    long t = (long)(s + 0.5);
    if (t >= 3600)
        snprintf(buf, n, "%ld:%02ld:%02ld", t / 3600, (t / 60) % 60, t % 60);
    else
        snprintf(buf, n, "%ld:%02ld", t / 60, t % 60);
}

static void format_rate(double r, char *buf, size_t n) {
    if (r >= 1e6)
        snprintf(buf, n, "%.2fM", r / 1e6);
    else if (r >= 1e4)
        snprintf(buf, n, "%.1fk", r / 1e3);
    else
        snprintf(buf, n, "%.1f", r);
}

static void progress_draw(Progress *p, const char *extra, int final) {
    double elapsed = now_seconds() - p->start;
    double rate = elapsed > 0 ? (double)p->done / elapsed : 0.0;
    char rate_s[32], eta_s[32], el_s[32];
    format_rate(rate, rate_s, sizeof rate_s);
    progress_format_duration(rate > 0 ? (double)(p->total - p->done) / rate : -1, eta_s, sizeof eta_s);
    progress_format_duration(elapsed, el_s, sizeof el_s);
    double frac = p->total > 0 ? (double)p->done / (double)p->total : 1.0;
    if (frac > 1) frac = 1;
    if (p->tty) {
        char bar[25];
        int fill = (int)(frac * 24);
        for (int i = 0; i < 24; i++) bar[i] = i < fill ? '#' : '.';
        bar[24] = '\0';
        fprintf(stderr, "\r\033[K%s [%s] %3d%% %lld/%lld %s %s/s %s %s%s%s", p->label, bar,
                (int)(frac * 100), (long long)p->done, (long long)p->total, p->unit, rate_s,
                final ? el_s : "ETA", final ? "" : eta_s, extra ? "  " : "", extra ? extra : "");
        if (final) fputc('\n', stderr);
    } else {
        fprintf(stderr, "%s: %s %3d%% %lld/%lld %s, %s %s/s, %s %s%s%s\n", log_program(), p->label,
                (int)(frac * 100), (long long)p->done, (long long)p->total, p->unit, rate_s,
                p->unit, final ? "took" : "ETA", final ? el_s : eta_s, extra ? ", " : "",
                extra ? extra : "");
    }
    fflush(stderr);
    p->drawn = 1;
}

void progress_update(Progress *p, int64_t done, const char *extra) {
    p->done = done;
    if (log_is_quiet()) return;
    double t = now_seconds();
    double every = p->tty ? 0.1 : p->interval;
    if (p->last_draw == 0) p->last_draw = p->start;
    if (t - p->last_draw < every) return;
    p->last_draw = t;
    progress_draw(p, extra, 0);
}

void progress_end(Progress *p, const char *extra) {
    if (log_is_quiet()) return;
    progress_draw(p, extra, 1);
}
