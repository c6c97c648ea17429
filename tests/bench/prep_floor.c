/* prep_floor: the least work any PNG converter must do, as the bench's yardstick.
 *
 *   prep_floor [--threads N] DIR...
 *
 * Reads every *.png in each DIR (the names are listed first) and inflates the
 * concatenated IDAT data of each file with zlib: no libpng, no filtering, no
 * output, no statistics. N threads (default 2) claim files from a shared
 * counter. The sum of the inflated sizes is checked against each file's IHDR
 * (height * (1 + rowbytes)), so the work cannot be skipped. Prints
 * "<files> files, <seconds> s" on stdout; exit 1 on any unreadable or corrupt
 * file (named). A bench tool, not part of the toolchain. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#define PATH_CAP 4096
#define FILE_CAP (64u << 20)

typedef struct {
    char **paths;
    size_t n, cap;
    atomic_size_t next;
} FileList;

static void fail(const char *path, const char *why) {
    fprintf(stderr, "prep_floor: %s: %s\n", path, why);
    exit(1);
}

static void *xrealloc_or_die(void *p, size_t n) {
    void *q = realloc(p, n);
    if (!q) fail("memory", "out of memory");
    return q;
}

static int is_png_name(const char *name) {
    size_t n = strlen(name);
    return n > 4 && strcmp(name + n - 4, ".png") == 0;
}

static void list_dir(FileList *fl, const char *dir) {
    DIR *d = opendir(dir);
    if (!d) fail(dir, strerror(errno));
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!is_png_name(e->d_name)) continue;
        if (fl->n == fl->cap) {
            fl->cap = fl->cap ? 2 * fl->cap : 1024;
            fl->paths = xrealloc_or_die(fl->paths, fl->cap * sizeof *fl->paths);
        }
        size_t len = strlen(dir) + strlen(e->d_name) + 2;
        if (len > PATH_CAP) fail(e->d_name, "path too long");
        fl->paths[fl->n] = xrealloc_or_die(NULL, len);
        snprintf(fl->paths[fl->n++], len, "%s/%s", dir, e->d_name);
    }
    closedir(d);
}

static size_t read_whole(const char *path, uint8_t *buf, size_t cap) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) fail(path, strerror(errno));
    size_t got = 0;
    for (;;) {
        ssize_t r = read(fd, buf + got, cap - got);
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) fail(path, strerror(errno));
        if (r == 0) break;
        got += (size_t)r;
        if (got == cap) fail(path, "file too large");
    }
    close(fd);
    return got;
}

static uint32_t be32(const uint8_t *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3];
}

/* Bytes per pixel row of a non-interlaced PNG, plus the filter byte. */
static size_t ihdr_row_bytes(const char *path, const uint8_t *ihdr) {
    static const int channels[7] = {1, 0, 3, 1, 2, 0, 4};
    unsigned depth = ihdr[8], ctype = ihdr[9];
    if (ctype > 6 || !channels[ctype] || ihdr[12] != 0) fail(path, "unsupported PNG layout");
    return 1 + ((size_t)be32(ihdr) * channels[ctype] * depth + 7) / 8;
}

/* Walk the chunks, inflating every IDAT into out; returns the inflated size. */
static size_t inflate_idat(const char *path, const uint8_t *buf, size_t len, z_stream *z,
                           uint8_t *out, size_t outcap, size_t *expect) {
    static const uint8_t sig[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1a, '\n'};
    if (len < 8 || memcmp(buf, sig, 8) != 0) fail(path, "not a PNG");
    if (inflateReset(z) != Z_OK) fail(path, "inflateReset failed");
    z->next_out = out;
    z->avail_out = (uInt)outcap;
    int zrc = Z_OK;
    for (size_t pos = 8; pos + 12 <= len;) {
        uint32_t n = be32(buf + pos);
        const uint8_t *type = buf + pos + 4, *data = buf + pos + 8;
        if (n > len - pos - 12) fail(path, "truncated chunk");
        if (memcmp(type, "IHDR", 4) == 0 && n == 13)
            *expect = ihdr_row_bytes(path, data) * be32(data + 4);
        if (memcmp(type, "IDAT", 4) == 0 && zrc == Z_OK) {
            z->next_in = (Bytef *)data;
            z->avail_in = n;
            zrc = inflate(z, Z_NO_FLUSH);
            if (zrc != Z_OK && zrc != Z_STREAM_END) fail(path, "corrupt IDAT");
        }
        if (memcmp(type, "IEND", 4) == 0) break;
        pos += 12 + (size_t)n;
    }
    if (zrc != Z_STREAM_END) fail(path, "IDAT stream does not end");
    return outcap - z->avail_out;
}

static void *worker(void *arg) {
    FileList *fl = arg;
    uint8_t *buf = xrealloc_or_die(NULL, FILE_CAP);
    size_t outcap = 1u << 20;
    uint8_t *out = xrealloc_or_die(NULL, outcap);
    z_stream z;
    memset(&z, 0, sizeof z);
    if (inflateInit(&z) != Z_OK) fail("zlib", "inflateInit failed");
    for (;;) {
        size_t i = atomic_fetch_add(&fl->next, 1);
        if (i >= fl->n) break;
        size_t len = read_whole(fl->paths[i], buf, FILE_CAP), expect = 0;
        size_t got = inflate_idat(fl->paths[i], buf, len, &z, out, outcap, &expect);
        if (got != expect) fail(fl->paths[i], "inflated size differs from IHDR");
    }
    inflateEnd(&z);
    free(out);
    free(buf);
    return NULL;
}

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

int main(int argc, char **argv) {
    int threads = 2, a = 1;
    if (argc > 2 && strcmp(argv[1], "--threads") == 0) {
        threads = atoi(argv[2]);
        a = 3;
    }
    if (threads < 1 || threads > 256 || a >= argc) {
        fprintf(stderr, "usage: prep_floor [--threads N (1..256)] DIR...\n");
        return 2;
    }
    double t0 = now();
    FileList fl = {0};
    for (; a < argc; a++) list_dir(&fl, argv[a]);
    pthread_t tid[256];
    for (int t = 0; t < threads; t++)
        if (pthread_create(&tid[t], NULL, worker, &fl)) fail("pthread_create", "failed");
    for (int t = 0; t < threads; t++) pthread_join(tid[t], NULL);
    printf("%zu files, %.3f s\n", fl.n, now() - t0);
    for (size_t i = 0; i < fl.n; i++) free(fl.paths[i]);
    free(fl.paths);
    return 0;
}
