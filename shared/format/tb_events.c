/* tb_events.c: see tb_events.h. */
#include "format/tb_events.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fsutil.h"
#include "data/crc32c.h"
#include "format/tb_event.pb-c.h"

#define TB_PREFIX "events.out.tfevents."
#define TB_FILE_VERSION "brain.Event:2"
#define TB_MAX_RECORD (1u << 20) /* ours are under 100 bytes: larger is corruption */
#define TB_MAX_FILE ((size_t)1 << 31)

struct TbWriter {
    int fd;            /* -1 until the first scalar */
    int dirty;         /* written since the last fsync */
    char dir[4096];
    long long latest;  /* the latest seconds among the older files' names, or -1 */
    char path[4096];
};

static int create_file(TbWriter *w, char *err, size_t errlen);

uint32_t tb_masked_crc(const void *data, size_t len) {
    uint32_t c = crc32c_extend(0, data, len);
    return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

static void put_le(uint8_t *p, uint64_t v, int bytes) {
    for (int i = 0; i < bytes; i++) p[i] = (uint8_t)(v >> (8 * i));
}

static uint64_t get_le(const uint8_t *p, int bytes) {
    uint64_t v = 0;
    for (int i = 0; i < bytes; i++) v |= (uint64_t)p[i] << (8 * i);
    return v;
}

static double wall_time_now(void) {
    struct timeval tv;
    gettimeofday(&tv, NULL);
    return (double)tv.tv_sec + 1e-6 * (double)tv.tv_usec;
}

/* One event as one TFRecord record, written with one write(2). */
static int write_event(TbWriter *w, const Tensorboard__Event *ev, char *err, size_t errlen) {
    size_t len = tensorboard__event__get_packed_size(ev);
    uint8_t *rec = xmalloc(len + 16);
    put_le(rec, len, 8);
    put_le(rec + 8, tb_masked_crc(rec, 8), 4);
    tensorboard__event__pack(ev, rec + 12);
    put_le(rec + 12 + len, tb_masked_crc(rec + 12, len), 4);
    int rc = fs_write_all(w->fd, rec, len + 16);
    free(rec);
    if (rc != 0) snprintf(err, errlen, "%s: cannot write an event: %s", w->path, strerror(errno));
    w->dirty = 1;
    return rc;
}

int tb_scalar(TbWriter *w, const char *tag, int64_t step, double value, char *err, size_t errlen) {
    if (w->fd < 0 && create_file(w, err, errlen) != 0) return -1;
    Tensorboard__SummaryValue v = TENSORBOARD__SUMMARY_VALUE__INIT;
    v.tag = (char *)tag;
    v.value_case = TENSORBOARD__SUMMARY_VALUE__VALUE_SIMPLE_VALUE;
    v.simple_value = (float)value;
    Tensorboard__SummaryValue *values[1] = {&v};
    Tensorboard__Summary summary = TENSORBOARD__SUMMARY__INIT;
    summary.n_value = 1;
    summary.value = values;
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time_now();
    ev.step = step;
    ev.what_case = TENSORBOARD__EVENT__WHAT_SUMMARY;
    ev.summary = &summary;
    return write_event(w, &ev, err, errlen);
}

int tb_flush(TbWriter *w, char *err, size_t errlen) {
    if (w->fd < 0 || !w->dirty) return 0;
    if (fsync(w->fd) == 0) {
        w->dirty = 0;
        return 0;
    }
    snprintf(err, errlen, "%s: cannot flush the events: %s", w->path, strerror(errno));
    return -1;
}

void tb_close(TbWriter *w) {
    if (!w) return;
    if (w->fd >= 0) close(w->fd);
    free(w);
}

/* ------------------------------------------------------------ resume */

/* The length of the whole, valid record at p (n bytes left) and its event's step
 * in *step, or 0 when the record is torn or corrupt. */
static size_t record_check(const uint8_t *p, size_t n, int64_t *step) {
    if (n < 12 || get_le(p + 8, 4) != tb_masked_crc(p, 8)) return 0;
    uint64_t len = get_le(p, 8);
    if (len > TB_MAX_RECORD || n - 12 < len + 4) return 0;
    if (get_le(p + 12 + len, 4) != tb_masked_crc(p + 12, (size_t)len)) return 0;
    Tensorboard__Event *ev = tensorboard__event__unpack(NULL, (size_t)len, p + 12);
    if (!ev) return 0;
    *step = ev->step;
    tensorboard__event__free_unpacked(ev, NULL);
    return (size_t)len + 16;
}

/* Write the kept bytes in place of path (fs_write_atomic: an exclusive temporary,
 * fsync, rename over a regular file only, the folder fsynced). */
static int file_replace(const char *path, const uint8_t *data, size_t len, char *err, size_t errlen) {
    char why[4400];
    if (fs_write_atomic_buf(path, data, len, why, sizeof why) == 0) return 0;
    snprintf(err, errlen, "%s: cannot rewrite the event file: %s", path, why);
    return -1;
}

int tb_file_truncate(const char *path, int64_t max_step, int64_t *kept, int64_t *dropped, char *err,
                     size_t errlen) {
    size_t len;
    uint8_t *data = (uint8_t *)fs_read_file(path, TB_MAX_FILE, &len);
    *kept = *dropped = 0;
    if (!data) {
        snprintf(err, errlen, "%s: cannot read the event file: %s", path, strerror(errno));
        return -1;
    }
    uint8_t *out = xmalloc(len ? len : 1);
    size_t at = 0, out_len = 0;
    while (at < len) {
        int64_t step = 0;
        size_t n = record_check(data + at, len - at, &step);
        if (n == 0) { /* torn or corrupt: it and everything after it go */
            (*dropped)++;
            break;
        }
        if (step <= max_step) {
            memcpy(out + out_len, data + at, n);
            out_len += n;
            (*kept)++;
        } else {
            (*dropped)++;
        }
        at += n;
    }
    int rc = out_len == len ? 0 : file_replace(path, out, out_len, err, errlen);
    free(out);
    free(data);
    return rc;
}

/* The seconds field of an event file's name (events.out.tfevents.<seconds>.*), or -1. */
static long long file_seconds(const char *name) {
    if (strncmp(name, TB_PREFIX, strlen(TB_PREFIX)) != 0) return -1;
    char *end;
    long long s = strtoll(name + strlen(TB_PREFIX), &end, 10);
    return end != name + strlen(TB_PREFIX) && *end == '.' ? s : -1;
}

/* Truncate every event file of dir to max_step; the latest seconds in their names
 * into *latest (-1 when none). */
static int truncate_all(const char *dir, int64_t max_step, long long *latest, char *err, size_t errlen) {
    *latest = -1;
    DIR *d = opendir(dir);
    if (!d) {
        snprintf(err, errlen, "%s: cannot list the folder: %s", dir, strerror(errno));
        return -1;
    }
    int rc = 0;
    for (struct dirent *e; rc == 0 && (e = readdir(d)) != NULL;) {
        long long s = file_seconds(e->d_name);
        if (s < 0 || strstr(e->d_name, ".tmp-")) continue;
        if (s > *latest) *latest = s;
        char path[4096];
        int64_t kept, dropped;
        if (snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path) {
            snprintf(err, errlen, "%s: path too long", dir);
            rc = -1;
            break;
        }
        rc = tb_file_truncate(path, max_step, &kept, &dropped, err, errlen);
        if (rc == 0 && dropped > 0)
            log_info("%s: %" PRId64 " event(s) after step %" PRId64 " or torn dropped, %" PRId64 " kept",
                     path, dropped, max_step, kept);
    }
    closedir(d);
    return rc;
}

/* This process's new file, named after every older one, and its first event. */
static int create_file(TbWriter *w, char *err, size_t errlen) {
    const char *dir = w->dir;
    const long long latest = w->latest;
    char host[256] = "localhost";
    gethostname(host, sizeof host - 1);
    host[sizeof host - 1] = '\0';
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    long long now = (long long)time(NULL);
    if (snprintf(w->path, sizeof w->path, "%s/" TB_PREFIX "%lld.%s.%d", dir, now > latest ? now : latest + 1,
                 host, (int)getpid()) >= (int)sizeof w->path) {
        snprintf(err, errlen, "%s: path too long", dir);
        return -1;
    }
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        snprintf(err, errlen, "%s: cannot create the event file: %s", w->path, strerror(errno));
        return -1;
    }
    Tensorboard__Event ev = TENSORBOARD__EVENT__INIT;
    ev.wall_time = wall_time_now();
    ev.what_case = TENSORBOARD__EVENT__WHAT_FILE_VERSION;
    ev.file_version = (char *)TB_FILE_VERSION;
    int rc = write_event(w, &ev, err, errlen);
    if (rc == 0 && fs_fsync_parent(w->path) != 0) {
        snprintf(err, errlen, "%s: created, but cannot fsync its folder: %s", w->path, strerror(errno));
        rc = -1;
    }
    if (rc != 0) {
        close(w->fd);
        w->fd = -1;
    }
    return rc;
}

TbWriter *tb_open(const char *run_dir, int64_t resume_step, char *err, size_t errlen) {
    char dir[4096];
    snprintf(dir, sizeof dir, "%s/tb", run_dir);
    err[0] = '\0';
    if (fs_mkdirs(dir, 0755) != 0) {
        snprintf(err, errlen, "%s: cannot create the folder: %s", dir, strerror(errno));
        return NULL;
    }
    fs_remove_stale_temps(dir);
    long long latest;
    if (truncate_all(dir, resume_step, &latest, err, errlen) != 0) return NULL;
    TbWriter *w = xcalloc(1, sizeof *w);
    w->fd = -1;
    w->latest = latest;
    snprintf(w->dir, sizeof w->dir, "%s", dir);
    return w;
}
