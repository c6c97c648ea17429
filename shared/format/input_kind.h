/* input_kind.h: what kind of file or folder a path is, among the ones the
 * commands exchange, so that a command given the wrong one names what it got
 * and what it expected ("data.lmdb is a cifar-prep dataset (LMDB), not a
 * snapshot") instead of failing on the first bytes it cannot parse.
 *
 * Told apart by their first bytes and their entries, never by their names:
 *   a snapshot      8-byte little-endian header length, then '{' (safetensors.h)
 *   a dataset       an LMDB file: the meta page's magic 0xBEEFC0DE at byte 16
 *   the seed layout a folder with annotations/ (cifar-prep's input)
 *   a run folder    a folder with snapshot-*.safetensors, metrics.jsonl or a lock */
#ifndef CIFAR_INPUT_KIND_H
#define CIFAR_INPUT_KIND_H

#ifdef __cplusplus
extern "C" {
#endif

typedef enum {
    INPUT_MISSING,     /* nothing there (or not readable) */
    INPUT_SNAPSHOT,
    INPUT_DATASET,
    INPUT_SEED_LAYOUT,
    INPUT_RUN_DIR,
    INPUT_FOLDER,      /* another folder */
    INPUT_FILE,        /* another file */
} InputKind;

InputKind input_kind_of(const char *path);
/* "a cifar-prep dataset (LMDB)", "a snapshot (safetensors)", ... */
const char *input_kind_name(InputKind kind);

/* A command that expects `want` (INPUT_DATASET, INPUT_SNAPSHOT or INPUT_SEED_LAYOUT) and was given
 * another kind it knows: one line naming the path, what it is and what was
 * expected, with a hint, and exit (a permanent failure). Returns when the path is
 * of the kind wanted, missing, a file of no known kind or a folder of none (but
 * a folder holding cifar10.lmdb, given for a dataset, is named with it): the
 * reader's own checks then say what is wrong with it. */
void input_kind_expect(const char *path, InputKind want);

#ifdef __cplusplus
}
#endif
#endif
