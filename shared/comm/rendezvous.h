/* rendezvous.h: rank 0 hands a small blob (the NCCL unique id) to the other ranks
 * over TCP, and only to ranks of this job.
 *
 * Rank 0 listens on MASTER_PORT at the address MASTER_ADDR names, which must be
 * local (every interface only with CIFAR_RENDEZVOUS_BIND=all; another local
 * address with CIFAR_RENDEZVOUS_BIND=ADDR). Each other rank connects and sends a
 * hello (RENDEZVOUS_HELLO_BYTES, big-endian fields):
 *     "CFRV" | version 1 | rank | world size | blob length |
 *     SHA-256("cifar-job-id/v1\n" job_id) | job token (DistEnv, 32 bytes)
 * Rank 0 answers "CFRV" | status, then the blob when the status is OK. A hello
 * of another job or with another token gets RV_WRONG_JOB / RV_WRONG_TOKEN, a world
 * size, rank or blob length that does not fit RV_BAD_RANK, a rank already served
 * RV_DUPLICATE; anything else (wrong magic, too short, silent for
 * RENDEZVOUS_HELLO_SECONDS) is closed without an answer. Rank 0 never dies of a
 * bad connection: it logs one line per dropped connection (the first 20) and
 * serves the others, many at a time (poll), until every rank has its blob or the
 * timeout passes.
 *
 * A rank refused as another job or token keeps retrying (a stale rank 0 may hold
 * the port for a moment) and fails at the timeout with the reason; one refused as
 * RV_BAD_RANK or RV_DUPLICATE fails at once (its own job is misconfigured).
 * The shm and MPI communicators do not need it; tests/test_comm.c runs it
 * between real processes (test_comm rendezvous-rank) with stray connections.
 *
 * rendezvous_exchange (the Gloo communicator's addresses, comm_gloo.cc): every
 * rank gives one entry per rank and gets the entry each rank gave for it, through
 * the same server on rank 0, the same checks and the same refusals. The hello is
 * the one above with magic "CFRX" and blob length W * entry; rank 0 answers
 * "CFRX" | status at once; after RV_OK the rank sends its W entries (checked for
 * length within RENDEZVOUS_HELLO_SECONDS) and waits; once every rank has sent its
 * own, rank 0 sends each rank its W entries (rank i's entry for it, in rank order)
 * and closes. A registered rank whose connection closes before that is forgotten
 * (it may come again). */
#ifndef CIFAR_RENDEZVOUS_H
#define CIFAR_RENDEZVOUS_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define RENDEZVOUS_MAGIC 0x43465256u /* "CFRV" */
#define RENDEZVOUS_VERSION 1u
#define RENDEZVOUS_HELLO_BYTES 84
#define RENDEZVOUS_REPLY_BYTES 8
#define RENDEZVOUS_MAX_BLOB 4096
#define RENDEZVOUS_HELLO_SECONDS 5.0
#define RENDEZVOUS_EXCHANGE_MAGIC 0x43465258u /* "CFRX" */
#define RENDEZVOUS_MAX_ENTRY 1024
/* What rank 0 holds for an exchange (W * W * entry): bounds the world size. */
#define RENDEZVOUS_MAX_TABLE ((size_t)256 << 20)

typedef enum {
    RV_OK = 0,
    RV_WRONG_JOB = 1,
    RV_WRONG_TOKEN = 2,
    RV_BAD_RANK = 3,
    RV_DUPLICATE = 4,
} RendezvousStatus;

/* Rank 0: serves blob[0..len) to ranks 1..W-1. Other ranks: fill blob from rank 0.
 * len <= RENDEZVOUS_MAX_BLOB. Dies with a clear message on failure or timeout. */
void rendezvous_share(const DistEnv *env, void *blob, size_t len, double timeout_s);

/* Every rank: mine holds W entries of `entry` bytes (entry r for rank r); on return
 * theirs holds W entries, entry i the one rank i gave for this rank (entry `rank`
 * is this rank's own). entry <= RENDEZVOUS_MAX_ENTRY. Dies with a clear message on
 * failure or timeout. */
void rendezvous_exchange(const DistEnv *env, const void *mine, void *theirs, size_t entry,
                         double timeout_s);

/* The local address (numeric) this machine reaches MASTER_ADDR from: where the
 * Gloo communicator listens for its peers, so that a node with several networks
 * offers the one that leads to rank 0. 0, or -1 with a reason in buf. */
int rendezvous_route_address(const DistEnv *env, char *buf, size_t len);

/* The hello a rank of `env` sends (tests build wrong ones from it; an exchange's
 * hello is the same with RENDEZVOUS_EXCHANGE_MAGIC in its first 4 bytes). */
void rendezvous_hello_encode(const DistEnv *env, uint32_t blob_len,
                             unsigned char out[RENDEZVOUS_HELLO_BYTES]);

#ifdef __cplusplus
}
#endif
#endif
