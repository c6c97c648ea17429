/* crc32c.h: CRC-32C (Castagnoli, as in iSCSI, ext4 and TFRecord), the checksum of
 * each dataset record (dataset.h). The SSE4.2 crc32 instruction when the CPU has
 * it (about 8 bytes per cycle with three interleaved streams), a table otherwise;
 * both give the same value. crc32c("123456789") = 0xe3069283. */
#ifndef CIFAR_CRC32C_H
#define CIFAR_CRC32C_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Continue a checksum: crc32c_extend(0, a) then crc32c_extend(that, b) equals the
 * checksum of a followed by b. Start with 0. */
uint32_t crc32c_extend(uint32_t crc, const void *data, size_t len);
/* The portable table version (for tests: must equal crc32c_extend). */
uint32_t crc32c_extend_table(uint32_t crc, const void *data, size_t len);

#ifdef __cplusplus
}
#endif
#endif
