/* test_snapshot.c: the safetensors snapshot format (shared/format/safetensors.c).
 *
 * Round trips, every kind of corruption refused with its own message, atomic
 * writes (no temporary left behind, the old file intact after a failed write),
 * and the run-folder helpers (list order, prune). Corrupt files are crafted by
 * hand with a correct checksum, so each is wrong in exactly one way; a crafted
 * file with nothing wrong is checked to be accepted first. */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "core/fsutil.h"
#include "format/safetensors.h"

#include "unit.h"

static char g_dir[256];


static void path_in(char *buf, size_t n, const char *name) {
    snprintf(buf, n, "%s/%s", g_dir, name);
}

/* Independent FNV-1a 64 (checked against a published vector in test_fnv). */
static uint64_t fnv1a(const void *data, size_t n) {
    const unsigned char *p = data;
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

static void write_bytes(const char *path, const void *buf, size_t n) {
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(buf, 1, n, f) != n || fclose(f) != 0) {
        perror(path);
        exit(1);
    }
}

static unsigned char *read_bytes(const char *path, size_t *n) {
    char *p = fs_read_file(path, (size_t)1 << 30, n);
    if (!p) {
        perror(path);
        exit(1);
    }
    return (unsigned char *)p;
}

/* A safetensors image from a header template: "%s" in it is replaced by the
 * checksum of data, the header padded to 8 and its length prefixed. */
static void craft(const char *path, const char *header_tmpl, const void *data, size_t n) {
    char sum[17], header[4096];
    snprintf(sum, sizeof sum, "%016" PRIx64, fnv1a(data, n));
    snprintf(header, sizeof header, header_tmpl, sum);
    size_t h = strlen(header), padded = (h + 7) / 8 * 8;
    unsigned char *buf = calloc(1, 8 + padded + n + 1);
    for (int b = 0; b < 8; b++) buf[b] = (unsigned char)((uint64_t)padded >> (8 * b));
    memcpy(buf + 8, header, h);
    memset(buf + 8 + h, ' ', padded - h);
    if (n) memcpy(buf + 8 + padded, data, n);
    write_bytes(path, buf, 8 + padded + n);
    free(buf);
}

/* Read must fail with `needle` in the reason. */
static void expect_refused(const char *path, const char *needle, const char *what) {
    char err[512] = "";
    Snapshot *s = snapshot_read(path, err, sizeof err);
    EXPECT(s == NULL, "%s: accepted", what);
    EXPECT(strstr(err, needle) != NULL, "%s: reason \"%s\" lacks \"%s\"", what, err, needle);
    EXPECT(strchr(err, '\n') == NULL, "%s: reason spans lines", what);
    snapshot_free(s);
}

/* 0 temporaries ("*.tmp-*") in dir. */
static int count_temps(const char *dir) {
    char cmd[512];
    snprintf(cmd, sizeof cmd, "ls -a '%s' | grep -c '\\.tmp-'", dir);
    FILE *p = popen(cmd, "r");
    int n = -1;
    if (!p || fscanf(p, "%d", &n) != 1) n = -1;
    if (p) pclose(p);
    return n;
}

static void test_fnv(void) {
    EXPECT(fnv1a("a", 1) == 0xaf63dc4c8601ec8cull, "FNV-1a 64 of \"a\"");
    EXPECT(fnv1a("", 0) == 0xcbf29ce484222325ull, "FNV-1a 64 of \"\"");
}

static const float k_w[6] = {1.5f, -2.0f, 3.25f, 0.0f, -0.5f, 1e-7f};
static const float k_b[3] = {0.1f, 0.2f, 0.3f};
static const int64_t k_count = 12345678901ll;
static const int64_t k_vec[3] = {-1, 0, INT64_MAX};

static int write_sample(const char *path, char *err, size_t errlen) {
    SnapTensorIn t[5] = {
        {.name = "0.conv.weight", .dtype = SNAP_F32, .ndim = 2, .shape = {2, 3}, .data = k_w},
        {.name = "0.bn.num_batches_tracked", .dtype = SNAP_I64, .ndim = 0, .data = &k_count},
        {.name = "1.bias", .dtype = SNAP_F32, .ndim = 1, .shape = {3}, .data = k_b},
        /* after an odd number of floats: not 8-byte aligned in the file */
        {.name = "optimizer.step", .dtype = SNAP_I64, .ndim = 1, .shape = {3}, .data = k_vec},
        {.name = "empty", .dtype = SNAP_F32, .ndim = 2, .shape = {0, 5}, .data = NULL},
    };
    SnapMeta m[2] = {{"epochs", "7"}, {"model", "{\"n_channels\":[16,32,64]}"}};
    return snapshot_write(path, t, 5, m, 2, err, errlen);
}

static void test_round_trip(void) {
    char path[512], err[512] = "";
    path_in(path, sizeof path, "rt.safetensors");
    EXPECT(write_sample(path, err, sizeof err) == 0, "write: %s", err);
    EXPECT(count_temps(g_dir) == 0, "temporary left after a good write");
    Snapshot *s = snapshot_read(path, err, sizeof err);
    EXPECT(s != NULL, "read back: %s", err);
    if (!s) return;
    EXPECT(s->n_tensors == 5, "%d tensors", s->n_tensors);
    const char *order[5] = {"0.conv.weight", "0.bn.num_batches_tracked", "1.bias",
                            "optimizer.step", "empty"};
    for (int i = 0; i < 5 && i < s->n_tensors; i++)
        EXPECT(strcmp(s->tensors[i].name, order[i]) == 0, "order %d: %s", i, s->tensors[i].name);
    const SnapTensor *w = snapshot_tensor(s, "0.conv.weight");
    EXPECT(w && w->dtype == SNAP_F32 && w->ndim == 2 && w->shape[0] == 2 && w->shape[1] == 3 &&
               w->numel == 6 && memcmp(w->data, k_w, sizeof k_w) == 0, "F32 [2,3] differs");
    const SnapTensor *c = snapshot_tensor(s, "0.bn.num_batches_tracked");
    EXPECT(c && c->dtype == SNAP_I64 && c->ndim == 0 && c->numel == 1 &&
               snapshot_i64(c, 0) == k_count, "I64 scalar differs");
    const SnapTensor *v = snapshot_tensor(s, "optimizer.step");
    EXPECT(v && v->dtype == SNAP_I64 && v->numel == 3 && snapshot_i64(v, 0) == -1 &&
               snapshot_i64(v, 1) == 0 && snapshot_i64(v, 2) == INT64_MAX, "I64 [3] differs");
    const SnapTensor *e = snapshot_tensor(s, "empty");
    EXPECT(e && e->numel == 0 && e->shape[0] == 0 && e->shape[1] == 5, "empty tensor");
    EXPECT(snapshot_tensor(s, "missing") == NULL, "lookup of a missing name");
    const char *ep = snapshot_meta(s, "epochs");
    EXPECT(ep && strcmp(ep, "7") == 0, "meta epochs");
    const char *mo = snapshot_meta(s, "model");
    EXPECT(mo && strcmp(mo, "{\"n_channels\":[16,32,64]}") == 0, "meta model");
    EXPECT(snapshot_meta(s, "format") && !strcmp(snapshot_meta(s, "format"), SNAPSHOT_FORMAT),
           "format key");
    EXPECT(snapshot_meta(s, "format_version") && !strcmp(snapshot_meta(s, "format_version"), "1"),
           "format_version key");
    snapshot_free(s);

    /* The layout safetensors readers expect: LE length, JSON padded to 8, data
     * contiguous in the given order, checksum of the data section. */
    size_t n = 0;
    unsigned char *raw = read_bytes(path, &n);
    uint64_t h = 0;
    for (int b = 7; b >= 0; b--) h = (h << 8) | raw[b];
    size_t data = sizeof k_w + sizeof k_count + sizeof k_b + sizeof k_vec;
    EXPECT(h % 8 == 0 && 8 + h + data == n, "header length %" PRIu64 ", file %zu", h, n);
    EXPECT(raw[8] == '{', "header starts with '{'");
    EXPECT(n >= data && memcmp(raw + n - data, k_w, sizeof k_w) == 0, "first tensor first");
    char want[64];
    snprintf(want, sizeof want, "\"data_checksum\":\"%016" PRIx64 "\"", fnv1a(raw + 8 + h, data));
    raw[8 + h - 1] = '\0';
    EXPECT(strstr((char *)raw + 8, want) != NULL, "checksum %s not in header", want);
    free(raw);
}

static void test_no_tensors(void) {
    char path[512], err[512] = "";
    path_in(path, sizeof path, "none.safetensors");
    EXPECT(snapshot_write(path, NULL, 0, NULL, 0, err, sizeof err) == 0, "empty write: %s", err);
    Snapshot *s = snapshot_read(path, err, sizeof err);
    EXPECT(s && s->n_tensors == 0 && s->n_meta == 3, "empty read: %s", err);
    snapshot_free(s);
}

static void test_writer_refuses_bad_input(void) {
    char path[512], err[512] = "";
    path_in(path, sizeof path, "bad-input.safetensors");
    float x[2] = {1, 2};
    SnapTensorIn dup[2] = {{.name = "a", .ndim = 1, .shape = {1}, .data = x},
                           {.name = "a", .ndim = 1, .shape = {1}, .data = x + 1}};
    EXPECT(snapshot_write(path, dup, 2, NULL, 0, err, sizeof err) == -1 &&
               strstr(err, "twice"), "duplicate names: %s", err);
    SnapMeta reserved = {"data_checksum", "0"};
    EXPECT(snapshot_write(path, dup, 1, &reserved, 1, err, sizeof err) == -1 &&
               strstr(err, "reserved"), "reserved key: %s", err);
    SnapTensorIn neg = {.name = "n", .ndim = 1, .shape = {-1}, .data = x};
    EXPECT(snapshot_write(path, &neg, 1, NULL, 0, err, sizeof err) == -1, "negative dim");
    SnapTensorIn five = {.name = "f", .ndim = 5, .shape = {1, 1, 1, 1}, .data = x};
    EXPECT(snapshot_write(path, &five, 1, NULL, 0, err, sizeof err) == -1, "5 dims");
    EXPECT(!fs_exists(path), "a refused write created the file");
    EXPECT(count_temps(g_dir) == 0, "temporary left after refused input");
}

/* Corruptions of a file snapshot_write made. */
static void test_corrupt_written(void) {
    char good[512], bad[512], err[512] = "";
    path_in(good, sizeof good, "good.safetensors");
    path_in(bad, sizeof bad, "bad.safetensors");
    EXPECT(write_sample(good, err, sizeof err) == 0, "write: %s", err);
    size_t n = 0;
    unsigned char *raw = read_bytes(good, &n);
    uint64_t h = 0;
    for (int b = 7; b >= 0; b--) h = (h << 8) | raw[b];

    raw[n - 30] ^= 0x01; /* one data bit */
    write_bytes(bad, raw, n);
    expect_refused(bad, "checksum mismatch: the file is corrupt", "flipped data bit");
    raw[n - 30] ^= 0x01;

    write_bytes(bad, raw, 8 + h / 2);
    expect_refused(bad, "truncated header", "truncated header");
    write_bytes(bad, raw, n - 4);
    expect_refused(bad, "truncated data", "truncated data");
    write_bytes(bad, raw, 5);
    expect_refused(bad, "too short", "5-byte file");
    write_bytes(bad, raw, 0);
    expect_refused(bad, "too short", "empty file");

    unsigned char save[8];
    memcpy(save, raw, 8);
    memset(raw, 0xff, 8);
    write_bytes(bad, raw, n);
    expect_refused(bad, "over the", "header length 2^64-1");
    uint64_t big = (uint64_t)SNAPSHOT_MAX_HEADER + 1;
    for (int b = 0; b < 8; b++) raw[b] = (unsigned char)(big >> (8 * b));
    write_bytes(bad, raw, n);
    expect_refused(bad, "over the", "header length just over the limit");
    memcpy(raw, save, 8);

    raw[8] = '['; /* JSON no longer parses */
    write_bytes(bad, raw, n);
    expect_refused(bad, "not valid JSON", "bad JSON");
    free(raw);

    char missing[512];
    path_in(missing, sizeof missing, "no-such.safetensors");
    expect_refused(missing, "cannot open", "missing file");
    expect_refused(g_dir, "not a regular file", "a folder");
}

#define META "\"__metadata__\":{\"format\":\"cifar-snapshot\",\"format_version\":\"1\"," \
             "\"data_checksum\":\"%s\"}"

/* Hand-made headers, each wrong in one way, with a correct checksum. */
static void test_corrupt_crafted(void) {
    char p[512];
    path_in(p, sizeof p, "crafted.safetensors");
    float d[4] = {1, 2, 3, 4};
    char err[512] = "";

    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2,1],\"data_offsets\":[8,16]}}", d, 16);
    Snapshot *s = snapshot_read(p, err, sizeof err);
    EXPECT(s && s->n_tensors == 2, "the well-formed crafted file: %s", err);
    snapshot_free(s);

    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[4,16]}}", d, 16);
    expect_refused(p, "overlap", "overlapping offsets");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
             "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}", d, 16);
    expect_refused(p, "gap", "gap between tensors");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", d, 16);
    expect_refused(p, "follow the last tensor", "data not covered");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F16\",\"shape\":[8],\"data_offsets\":[0,16]}}", d, 16);
    expect_refused(p, "unsupported dtype \"F16\"", "wrong dtype");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,16]}}", d, 16);
    expect_refused(p, "do not match data_offsets", "shape/bytes mismatch");
    craft(p, "{" META ",\"a\":{\"dtype\":\"I64\",\"shape\":[4],\"data_offsets\":[0,16]}}", d, 16);
    expect_refused(p, "do not match data_offsets", "dtype/bytes mismatch");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[4,-1],\"data_offsets\":[0,16]}}", d, 16);
    expect_refused(p, "not a size", "negative dim");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,16]}}", d, 16);
    expect_refused(p, "not a size", "fractional dim");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,4],\"data_offsets\":[0,16]}}",
          d, 16);
    expect_refused(p, "at most 4", "5 dims");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296,4294967296],"
             "\"data_offsets\":[0,16]}}", d, 16);
    expect_refused(p, "do not match", "numel overflow");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[16,0]}}", d, 16);
    expect_refused(p, "begin <= end", "reversed offsets");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[16,16]}}", d, 16);
    expect_refused(p, "appears twice", "duplicate names");
    craft(p, "{" META ",\"a\":[1,2]}", d, 0);
    expect_refused(p, "not an object", "entry not an object");
    craft(p, "{" META ",\"a\":{\"dtype\":\"F32\",\"shape\":[4]}}", d, 16);
    expect_refused(p, "needs", "missing data_offsets");

    /* metadata */
    craft(p, "{\"__metadata__\":{\"format\":\"cifar-snapshot\",\"format_version\":\"2\","
             "\"data_checksum\":\"%s\"},\"a\":{\"dtype\":\"F32\",\"shape\":[4],"
             "\"data_offsets\":[0,16]}}", d, 16);
    expect_refused(p, "written by a newer version", "newer version");
    craft(p, "{\"__metadata__\":{\"format\":\"pt\",\"data_checksum\":\"%s\"},"
             "\"a\":{\"dtype\":\"F32\",\"shape\":[4],\"data_offsets\":[0,16]}}", d, 16);
    expect_refused(p, "not a cifar snapshot", "plain safetensors (format pt)");
    craft(p, "{\"a\":{\"dtype\":\"BF16\",\"shape\":[8],\"data_offsets\":[0,16]}}%.0s", d, 16);
    expect_refused(p, "not a cifar snapshot", "no __metadata__ at all");
    craft(p, "{\"__metadata__\":{\"format\":\"cifar-snapshot\",\"format_version\":1,"
             "\"data_checksum\":\"%s\"}}", d, 0);
    expect_refused(p, "not a string", "number in metadata");
    craft(p, "{\"__metadata__\":{\"format\":\"cifar-snapshot\",\"format_version\":\"one\","
             "\"data_checksum\":\"%s\"}}", d, 0);
    expect_refused(p, "bad format_version", "non-numeric version");
    /* found by the fuzzer: a quoted value with a newline split the reason */
    craft(p, "{\"__metadata__\":{\"format\":\"cifar-snapshot\",\"format_version\":\"1\\n\","
             "\"data_checksum\":\"%s\"}}", d, 0);
    expect_refused(p, "bad format_version", "newline in a quoted value");
    craft(p, "{\"__metadata__\":{\"format\":\"cifar-snapshot\",\"format_version\":\"1\","
             "\"data_checksum\":\"%.15s\"}}", d, 0);
    expect_refused(p, "data_checksum", "short checksum");
    craft(p, "{\"__metadata__\":{\"format\":\"cifar-snapshot\",\"format_version\":\"1\","
             "\"data_checksum\":\"%s\",\"format\":\"x\"}}", d, 0);
    expect_refused(p, "appears twice", "duplicate metadata key");
    craft(p, "{" META "} x", d, 0);
    expect_refused(p, "not valid JSON", "garbage after the JSON");
}

/* Child process: try to write into a folder we may not write, report via exit code. */
static int try_write_readonly(const char *dir) {
    if (geteuid() == 0 && (setgid(65534) != 0 || setuid(65534) != 0)) return 3;
    char path[1024], err[512] = "";
    snprintf(path, sizeof path, "%s/x.safetensors", dir);
    if (write_sample(path, err, sizeof err) != -1) return 1;
    if (!strstr(err, "ermission denied")) {
        fprintf(stderr, "read-only folder reason: %s\n", err);
        return 2;
    }
    return 0;
}

static void test_atomic(void) {
    char path[512], err[512] = "";
    path_in(path, sizeof path, "nope/sub/x.safetensors");
    EXPECT(write_sample(path, err, sizeof err) == -1 && strstr(err, "No such file"),
           "nonexistent folder: %s", err);

    char ro[512];
    path_in(ro, sizeof ro, "readonly");
    mkdir(ro, 0755);
    chmod(g_dir, 0755); /* the child (maybe nobody) must reach it */
    chmod(ro, 0555);
    pid_t pid = fork();
    if (pid == 0) _exit(try_write_readonly(ro));
    int st = 0;
    waitpid(pid, &st, 0);
    EXPECT(WIFEXITED(st) && WEXITSTATUS(st) == 0, "read-only folder: child status %d",
           WIFEXITED(st) ? WEXITSTATUS(st) : -1);
    EXPECT(count_temps(ro) == 0, "temporary left in the read-only folder");
    chmod(ro, 0755);

    /* A write that fails half way (file size limit: EFBIG, as ENOSPC would) must
     * remove its temporary and leave the previous snapshot untouched. */
    path_in(path, sizeof path, "keep.safetensors");
    EXPECT(write_sample(path, err, sizeof err) == 0, "first write: %s", err);
    size_t n0 = 0;
    unsigned char *before = read_bytes(path, &n0);
    static float big[100000];
    SnapTensorIn t = {.name = "big", .dtype = SNAP_F32, .ndim = 1, .shape = {100000},
                      .data = big};
    struct rlimit old, lim;
    getrlimit(RLIMIT_FSIZE, &old);
    lim = old;
    lim.rlim_cur = 4096;
    signal(SIGXFSZ, SIG_IGN);
    setrlimit(RLIMIT_FSIZE, &lim);
    int rc = snapshot_write(path, &t, 1, NULL, 0, err, sizeof err);
    setrlimit(RLIMIT_FSIZE, &old);
    signal(SIGXFSZ, SIG_DFL);
    EXPECT(rc == -1 && strstr(err, "cannot write") && strstr(err, "too large"),
           "write past the size limit: rc %d, %s", rc, err);
    EXPECT(count_temps(g_dir) == 0, "temporary left after a failed write");
    size_t n1 = 0;
    unsigned char *after = read_bytes(path, &n1);
    EXPECT(n0 == n1 && memcmp(before, after, n0) == 0, "old snapshot changed by a failed write");
    free(before);
    free(after);
}

/* Issue 20 item 2: the temporary's name is predictable ("<path>.tmp-<pid>", the pid
 * published in the run folder's lock); a symlink planted there must never receive
 * the snapshot, and the final name is replaced only when it is a regular file. */
static void test_planted_names(void) {
    char path[512], tmp[600], victim[512], err[512] = "";
    path_in(victim, sizeof victim, "victim");
    write_bytes(victim, "precious", 8);
    path_in(path, sizeof path, "planted.safetensors");
    fs_temp_name(path, tmp, sizeof tmp);
    EXPECT(symlink(victim, tmp) == 0, "symlink: %s", strerror(errno));
    EXPECT(write_sample(path, err, sizeof err) == 0, "write beside a planted temporary: %s", err);
    size_t n = 0;
    unsigned char *v = read_bytes(victim, &n);
    EXPECT(n == 8 && memcmp(v, "precious", 8) == 0, "the symlink's target was written (%zu bytes)", n);
    free(v);
    struct stat st;
    EXPECT(lstat(path, &st) == 0 && S_ISREG(st.st_mode), "the snapshot is not a regular file");
    EXPECT(lstat(tmp, &st) != 0, "the planted temporary is still there");

    /* A symlink, a FIFO or a folder under the final name: refused, never replaced. */
    const char *kinds[] = {"a symlink", "a FIFO", "a folder"};
    for (int k = 0; k < 3; k++) {
        char target[512];
        snprintf(target, sizeof target, "%s/final-%d.safetensors", g_dir, k);
        int made = k == 0 ? symlink(victim, target) : k == 1 ? mkfifo(target, 0644) : mkdir(target, 0755);
        EXPECT(made == 0, "make %s: %s", kinds[k], strerror(errno));
        EXPECT(write_sample(target, err, sizeof err) == -1 && strstr(err, kinds[k]) &&
                   strstr(err, "not replaced"),
               "%s as the final name: %s", kinds[k], err);
        EXPECT(lstat(target, &st) == 0 && !S_ISREG(st.st_mode), "%s was replaced", kinds[k]);
    }
    v = read_bytes(victim, &n);
    EXPECT(n == 8 && memcmp(v, "precious", 8) == 0, "the victim changed");
    free(v);
    EXPECT(count_temps(g_dir) == 0, "a temporary left after a refusal");
}

static void touch(const char *dir, const char *name) {
    char p[1024];
    snprintf(p, sizeof p, "%s/%s", dir, name);
    write_bytes(p, "x", 1);
}

static void test_list_prune(void) {
    char dir[300], want[1024];
    path_in(dir, sizeof dir, "run");
    mkdir(dir, 0755);
    int n = -1;
    char **l = snapshot_list(dir, &n);
    EXPECT(l == NULL && n == 0, "empty folder lists %d", n);

    char p[1024];
    snapshot_path_for(dir, 7, p, sizeof p);
    snprintf(want, sizeof want, "%s/snapshot-000007.safetensors", dir);
    EXPECT(strcmp(p, want) == 0, "path_for gave %s", p);

    const char *names[] = {"snapshot-000002.safetensors", "snapshot-000010.safetensors",
                           "snapshot-000001.safetensors", "snapshot-1000000.safetensors",
                           "snapshot-000005.safetensors.tmp-123", "snapshot-abc.safetensors",
                           "snapshot-.safetensors", "notes.txt", "snapshot-000003.safetensors~"};
    for (size_t i = 0; i < sizeof names / sizeof *names; i++) touch(dir, names[i]);
    l = snapshot_list(dir, &n);
    const char *order[] = {"snapshot-1000000.safetensors", "snapshot-000010.safetensors",
                           "snapshot-000002.safetensors", "snapshot-000001.safetensors"};
    EXPECT(n == 4, "listed %d", n);
    for (int i = 0; i < 4 && i < n; i++) {
        snprintf(want, sizeof want, "%s/%s", dir, order[i]);
        EXPECT(strcmp(l[i], want) == 0, "list[%d] = %s", i, l[i]);
    }
    snapshot_list_free(l, n);

    snapshot_prune(dir, 0, INT64_MAX);
    l = snapshot_list(dir, &n);
    EXPECT(n == 4, "prune keep=0 removed files (%d left)", n);
    snapshot_list_free(l, n);

    /* A run at step 10 never deletes a name beyond it (a copied snapshot-1000000
     * once made --keep delete the real newest ones): it keeps 10 and 2, removes 1. */
    snapshot_prune(dir, 2, 10);
    l = snapshot_list(dir, &n);
    EXPECT(n == 3 && strstr(l[0], order[0]) && strstr(l[1], order[1]) && strstr(l[2], order[2]),
           "prune up to step 10 kept the wrong ones (%d left)", n);
    snapshot_list_free(l, n);
    touch(dir, "snapshot-000001.safetensors");

    snapshot_prune(dir, 2, INT64_MAX);
    l = snapshot_list(dir, &n);
    EXPECT(n == 2 && strstr(l[0], order[0]) && strstr(l[1], order[1]), "prune kept the wrong ones");
    snapshot_list_free(l, n);
    for (size_t i = 4; i < sizeof names / sizeof *names; i++) {
        snprintf(p, sizeof p, "%s/%s", dir, names[i]);
        EXPECT(fs_exists(p), "prune removed %s", names[i]);
    }
    snprintf(p, sizeof p, "%s/%s", dir, "snapshot-000002.safetensors");
    EXPECT(!fs_exists(p), "prune left an old snapshot");
    path_in(p, sizeof p, "absent-run");
    l = snapshot_list(p, &n);
    EXPECT(l == NULL && n == 0, "missing folder");
    snapshot_prune(p, 1, INT64_MAX);
}

int main(void) {
    snprintf(g_dir, sizeof g_dir, "/tmp/test_snapshot.XXXXXX");
    if (!mkdtemp(g_dir)) {
        perror("mkdtemp");
        return 1;
    }
    test_fnv();
    test_round_trip();
    test_no_tensors();
    test_writer_refuses_bad_input();
    test_corrupt_written();
    test_corrupt_crafted();
    test_atomic();
    test_planted_names();
    test_list_prune();
    char cmd[512];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", g_dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", g_dir);
    return unit_report("test_snapshot");
}
