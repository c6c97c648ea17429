/* dataset_record.h: the record layout shared by the reader (dataset.c) and the
 * writer (dataset_writer.c) of the LMDB dataset format (dataset.h). Private to
 * shared/data. */
#ifndef CIFAR_DATASET_RECORD_H
#define CIFAR_DATASET_RECORD_H

#include <stdint.h>
#include <string.h>

#include "data/dataset.h"

#define DATASET_KEY_DIGITS 8
#define DATASET_MAX_RECORDS 100000000LL /* keys are 8 decimal digits */
#define RECORD_LABEL_BYTES 4
#define RECORD_CRC_BYTES 4
/* Version 3: the CRC-32C of the "dataset" metadata JSON, as 8 hex digits. */
#define META_CRC_KEY "dataset.crc32c"

/* Bytes before the pixels in a record of this format version. */
static inline size_t record_header_bytes(int version) {
    return version >= 2 ? RECORD_LABEL_BYTES + RECORD_CRC_BYTES : RECORD_LABEL_BYTES;
}

static inline uint32_t le32_read(const uint8_t *b) {
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

static inline void le32_write(uint8_t *b, uint32_t u) {
    b[0] = (uint8_t)u;
    b[1] = (uint8_t)(u >> 8);
    b[2] = (uint8_t)(u >> 16);
    b[3] = (uint8_t)(u >> 24);
}

/* The checksum a record of this version stores. */
static inline uint32_t record_crc(int version, const char *split, int64_t index, const uint8_t *label_le,
                           const uint8_t *pixels, size_t nbytes) {
    return version >= 3 ? dataset_record_crc_v3(split, index, label_le, pixels, nbytes)
                        : dataset_record_crc(label_le, pixels, nbytes);
}

static inline void key_format(int64_t index, char out[DATASET_KEY_DIGITS + 1]) {
    /* index is in [0, DATASET_MAX_RECORDS): exactly 8 digits, zero padded */
    uint64_t v = (uint64_t)index;
    for (int i = DATASET_KEY_DIGITS - 1; i >= 0; i--) {
        out[i] = (char)('0' + v % 10);
        v /= 10;
    }
    out[DATASET_KEY_DIGITS] = '\0';
}

/* A split name a dataset may hold: 1..31 of [A-Za-z0-9_.-], not "meta". */
int dataset_split_name_valid(const char *name);

#endif
