/* sha256.h: SHA-256 (FIPS 180-4), for the rendezvous' job token and job hash
 * (rendezvous.h). Small and dependency-free; not constant-time for secret keys. */
#ifndef CIFAR_SHA256_H
#define CIFAR_SHA256_H

#include <stddef.h>
#include <stdint.h>

#define SHA256_BYTES 32

/* out = SHA-256 of the concatenation of a (alen bytes) and b (blen bytes). */
void sha256_two(const void *a, size_t alen, const void *b, size_t blen,
                unsigned char out[SHA256_BYTES]);

#endif
