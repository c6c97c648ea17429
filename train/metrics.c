/* metrics.c: see metrics.h. */
#include "metrics.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/fsutil.h"

/* "[1.234,1.301]" into buf. */
static void format_seconds_list(const double *v, int n, char *buf, size_t len) {
    size_t off = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < n && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%.3f", i ? "," : "", v[i]);
    if (off < len) snprintf(buf + off, len - off, "]");
}

/* metrics.jsonl rewritten whole with `text` (fs_write_atomic: never appended to in
 * place, so a symlink planted under its name is refused, never written through). */
static void metrics_write(const char *path, const char *text, size_t len) {
    char err[4400];
    if (fs_write_atomic_buf(path, text, len, err, sizeof err) != 0)
        check_fail(__FILE__, __LINE__, path, err, NULL);
}

/* The metrics file's content, "" when there is none yet. */
static char *metrics_read(const char *path, size_t *len) {
    char *text = fs_read_file(path, (size_t)1 << 30, len);
    if (!text && errno != ENOENT) CHECK_STDIO(0, path);
    if (!text) {
        text = xstrdup("");
        *len = 0;
    }
    return text;
}

/* "[4,2]" into buf: the epoch's world sizes, or its one world size. */
static void format_worlds(const EpochMetrics *m, char *buf, size_t len) {
    if (m->n_world_sizes < 1) {
        snprintf(buf, len, "[%d]", m->world_size);
        return;
    }
    size_t off = (size_t)snprintf(buf, len, "[");
    for (int i = 0; i < m->n_world_sizes && off < len; i++)
        off += (size_t)snprintf(buf + off, len - off, "%s%d", i ? "," : "", m->world_sizes[i]);
    if (off < len) snprintf(buf + off, len - off, "]");
}

void metrics_append(const char *run_dir, const EpochMetrics *m) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    char worlds[256];
    size_t ranks_len = (size_t)m->world_size * 24 + 8, line_len = ranks_len + sizeof worlds + 1024;
    char *ranks = xmalloc(ranks_len), *line = xmalloc(line_len);
    format_seconds_list(m->rank_seconds, m->world_size, ranks, ranks_len);
    char val[96] = "";
    format_worlds(m, worlds, sizeof worlds);
    if (m->has_val) snprintf(val, sizeof val, "\"val_loss\":%.6f,\"val_acc\":%.6f,", m->val_loss, m->val_acc);
    int n = snprintf(line, line_len,
            "{\"epoch\":%" PRId64 ",\"train_loss\":%.6f,\"train_acc\":%.6f,\"test_loss\":%.6f,"
            "\"test_acc\":%.6f,%s\"lr\":%.6g,\"images_per_s\":%.1f,\"seconds\":%.3f,"
            "\"rank_seconds\":%s,\"slowest_rank\":%d,"
            "\"world_size\":%d,\"world_sizes\":%s,\"images\":%.0f,\"restarts\":%d,\"device\":\"%s\","
            "\"comm\":\"%s\"}\n",
            m->epoch, m->train_loss, m->train_acc, m->test_loss, m->test_acc, val, m->lr,
            m->images_per_s, m->seconds, ranks, m->slowest_rank, m->world_size, worlds, m->images,
            m->restarts, m->device, m->comm);
    free(ranks);
    size_t len;
    char *text = metrics_read(path, &len);
    text = xrealloc(text, len + (size_t)n + 1);
    memcpy(text + len, line, (size_t)n + 1);
    metrics_write(path, text, len + (size_t)n);
    free(text);
    free(line);
}

void metrics_truncate(const char *run_dir, int64_t epochs) {
    char path[4096];
    snprintf(path, sizeof path, "%s/metrics.jsonl", run_dir);
    size_t len;
    char *text = metrics_read(path, &len);
    char *kept = xmalloc(len + 1);
    size_t kept_len = 0;
    for (char *line = strtok(text, "\n"); line; line = strtok(NULL, "\n")) {
        long long e = -1;
        if (sscanf(line, "{\"epoch\":%lld", &e) != 1 || e > epochs) continue;
        size_t n = strlen(line);
        memcpy(kept + kept_len, line, n);
        kept[kept_len + n] = '\n';
        kept_len += n + 1;
    }
    if (kept_len != len) metrics_write(path, kept, kept_len);
    free(kept);
    free(text);
}
