/* lmdb_poke.c: damage or downgrade a cifar-lmdb file for the bats tests (data.bats),
 * built by the test itself with `cc tests/lmdb_poke.c -llmdb`.
 *
 *   lmdb_poke flip FILE SPLIT INDEX   XOR 0x01 into the middle pixel byte of record
 *                                     INDEX of SPLIT, in the file itself (pwrite at
 *                                     the record's offset in the file); prints the offset
 *   lmdb_poke v1 IN OUT               write OUT as a format-version-1 copy of the
 *                                     version-3 IN (records without their checksum)
 *   lmdb_poke v2 IN OUT               ... a version-2 copy (checksums of label and pixels
 *                                     only, no metadata checksum)
 *   lmdb_poke copy FILE SPLIT FROM TO  store record FROM's value under key TO as well
 *                                     (what a flipped overflow-page pointer does: record
 *                                     TO reads as an exact copy of FROM)
 * Exit 1 with a message on any failure. */
#include <fcntl.h>
#include <lmdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static void fail(const char *what, const char *why) {
    fprintf(stderr, "lmdb_poke: %s: %s\n", what, why);
    exit(1);
}

#define LMDB_OK(call, what)                    \
    do {                                       \
        int rc_ = (call);                      \
        if (rc_) fail((what), mdb_strerror(rc_)); \
    } while (0)

static MDB_env *env_open(const char *path, unsigned flags) {
    MDB_env *env;
    LMDB_OK(mdb_env_create(&env), path);
    LMDB_OK(mdb_env_set_maxdbs(env, 16), path);
    LMDB_OK(mdb_env_set_mapsize(env, 1ull << 36), path);
    LMDB_OK(mdb_env_open(env, path, MDB_NOSUBDIR | MDB_NOLOCK | flags, 0644), path);
    return env;
}

/* The record's value (label, checksum, pixels: unique in the file) is found in the
 * file's bytes, and its middle pixel flipped there. */
static int flip(const char *path, const char *split, long index) {
    MDB_env *env = env_open(path, MDB_RDONLY);
    MDB_txn *txn;
    MDB_dbi dbi;
    LMDB_OK(mdb_txn_begin(env, NULL, MDB_RDONLY, &txn), path);
    LMDB_OK(mdb_dbi_open(txn, split, 0, &dbi), split);
    char key[16];
    snprintf(key, sizeof key, "%08ld", index);
    MDB_val k = {8, key}, v;
    LMDB_OK(mdb_get(txn, dbi, &k, &v), key);
    FILE *f = fopen(path, "rb");
    if (!f || fseek(f, 0, SEEK_END) != 0) fail(path, "cannot open");
    long size = ftell(f);
    char *file = malloc((size_t)size);
    rewind(f);
    if (!file || fread(file, 1, (size_t)size, f) != (size_t)size) fail(path, "cannot read");
    fclose(f);
    char *at = memmem(file, (size_t)size, v.mv_data, v.mv_size);
    if (!at) fail(path, "the record's bytes are not in the file");
    long off = (long)(at - file) + 8 + (long)(v.mv_size - 8) / 2;
    mdb_txn_abort(txn);
    mdb_env_close(env);
    free(file);
    int fd = open(path, O_RDWR);
    unsigned char b;
    if (fd < 0 || pread(fd, &b, 1, off) != 1) fail(path, "cannot read the byte");
    b ^= 0x01;
    if (pwrite(fd, &b, 1, off) != 1 || close(fd) != 0) fail(path, "cannot write the byte");
    printf("%ld\n", off);
    return 0;
}

/* CRC-32C (Castagnoli), bit by bit: the tests' own, independent of the project's. */
static uint32_t crc32c(const unsigned char *p, size_t n) {
    uint32_t c = 0xffffffffu;
    for (size_t i = 0; i < n; i++) {
        c ^= p[i];
        for (int b = 0; b < 8; b++) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
    }
    return c ^ 0xffffffffu;
}

/* A record as version `to` stores it: version 1 drops bytes [4, 8), version 2 keeps
 * them as the CRC-32C of label and pixels. */
static size_t record_downgrade(const MDB_val *v, int to, char *buf) {
    memcpy(buf, v->mv_data, 4);
    if (to == 1) {
        memcpy(buf + 4, (char *)v->mv_data + 8, v->mv_size - 8);
        return v->mv_size - 4;
    }
    memcpy(buf, v->mv_data, v->mv_size);
    unsigned char *body = malloc(v->mv_size);
    memcpy(body, v->mv_data, 4);
    memcpy(body + 4, (char *)v->mv_data + 8, v->mv_size - 8);
    uint32_t c = crc32c(body, v->mv_size - 4);
    free(body);
    for (int b = 0; b < 4; b++) buf[4 + b] = (char)(c >> (8 * b));
    return v->mv_size;
}

/* Copy every table as format version `to` (1 or 2). */
static int downgrade(const char *in, const char *out, int to) {
    MDB_env *src = env_open(in, MDB_RDONLY), *dst;
    unlink(out);
    dst = env_open(out, 0);
    MDB_txn *rt, *wt;
    MDB_dbi root;
    LMDB_OK(mdb_txn_begin(src, NULL, MDB_RDONLY, &rt), in);
    LMDB_OK(mdb_txn_begin(dst, NULL, 0, &wt), out);
    LMDB_OK(mdb_dbi_open(rt, NULL, 0, &root), in);
    MDB_cursor *names;
    MDB_val name, unused;
    LMDB_OK(mdb_cursor_open(rt, root, &names), in);
    while (mdb_cursor_get(names, &name, &unused, MDB_NEXT) == 0) {
        char table[64];
        snprintf(table, sizeof table, "%.*s", (int)name.mv_size, (char *)name.mv_data);
        MDB_dbi a, b;
        LMDB_OK(mdb_dbi_open(rt, table, 0, &a), table);
        LMDB_OK(mdb_dbi_open(wt, table, MDB_CREATE, &b), table);
        MDB_cursor *c;
        MDB_val k, v;
        LMDB_OK(mdb_cursor_open(rt, a, &c), table);
        while (mdb_cursor_get(c, &k, &v, MDB_NEXT) == 0) {
            char *buf = malloc(v.mv_size + 16);
            size_t len = v.mv_size;
            int is_meta = strcmp(table, "meta") == 0;
            if (is_meta && (k.mv_size != 7 || memcmp(k.mv_data, "dataset", 7) != 0)) {
                free(buf); /* the metadata checksum came with version 3 */
                continue;
            }
            if (is_meta) {
                char *at = memmem(v.mv_data, v.mv_size, "\"version\":3", 11);
                if (!at) fail(in, "metadata is not version 3");
                memcpy(buf, v.mv_data, v.mv_size);
                buf[at - (char *)v.mv_data + 10] = (char)('0' + to);
            } else {
                len = record_downgrade(&v, to, buf);
            }
            MDB_val nv = {len, buf};
            LMDB_OK(mdb_put(wt, b, &k, &nv, MDB_APPEND), table);
            free(buf);
        }
        mdb_cursor_close(c);
    }
    mdb_cursor_close(names);
    LMDB_OK(mdb_txn_commit(wt), out);
    mdb_txn_abort(rt);
    mdb_env_close(dst);
    mdb_env_close(src);
    return 0;
}

static int copy_record(const char *path, const char *split, long from, long to) {
    MDB_env *env = env_open(path, 0);
    MDB_txn *txn;
    MDB_dbi dbi;
    LMDB_OK(mdb_txn_begin(env, NULL, 0, &txn), path);
    LMDB_OK(mdb_dbi_open(txn, split, 0, &dbi), split);
    char kf[16], kt[16];
    snprintf(kf, sizeof kf, "%08ld", from);
    snprintf(kt, sizeof kt, "%08ld", to);
    MDB_val k = {8, kf}, v;
    LMDB_OK(mdb_get(txn, dbi, &k, &v), kf);
    char *copy = malloc(v.mv_size);
    memcpy(copy, v.mv_data, v.mv_size);
    MDB_val k2 = {8, kt}, v2 = {v.mv_size, copy};
    LMDB_OK(mdb_put(txn, dbi, &k2, &v2, 0), kt);
    LMDB_OK(mdb_txn_commit(txn), path);
    mdb_env_close(env);
    free(copy);
    return 0;
}

int main(int argc, char **argv) {
    if (argc == 5 && strcmp(argv[1], "flip") == 0) return flip(argv[2], argv[3], atol(argv[4]));
    if (argc == 4 && strcmp(argv[1], "v1") == 0) return downgrade(argv[2], argv[3], 1);
    if (argc == 4 && strcmp(argv[1], "v2") == 0) return downgrade(argv[2], argv[3], 2);
    if (argc == 6 && strcmp(argv[1], "copy") == 0)
        return copy_record(argv[2], argv[3], atol(argv[4]), atol(argv[5]));
    fprintf(stderr, "usage: lmdb_poke flip FILE SPLIT INDEX | lmdb_poke v1|v2 IN OUT | "
                    "lmdb_poke copy FILE SPLIT FROM TO\n");
    return 2;
}
