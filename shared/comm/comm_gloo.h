/* comm_gloo.h: the Gloo transport behind comm.h (comm_gloo.cc, C++ over Debian's
 * libgloo-dev, TCP; built into libcifar-gloo.so when the Makefile finds Gloo's
 * headers). comm.c dispatches to these functions when the Comm is COMM_GLOO;
 * gloo_loader.c dlopens the library on the first call, so the commands link no
 * C++ or Gloo library and run where it is absent. All buffers are host memory.
 *
 * The library imports nothing from the command: the command hands it a table
 * (CommGlooHost: its die, the progress board's laggard report, the rendezvous
 * exchange of rendezvous.h) right after dlopen; comm_gloo_set_host refuses a table
 * of another version. Every call dies through the host's die on failure. */
#ifndef CIFAR_COMM_GLOO_H
#define CIFAR_COMM_GLOO_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CommGloo CommGloo;

#define COMM_GLOO_HOST_VERSION 1u

typedef struct {
    uint32_t version; /* COMM_GLOO_HOST_VERSION */
    uint32_t size;    /* sizeof(CommGlooHost) */
    /* check.h's die_status with the message already formatted: never returns */
    void (*die)(int status, const char *message);
    /* comm.h's comm_blame_laggard, appended to a timeout's message */
    void (*blame)(char *buf, size_t len);
    /* rendezvous.h's rendezvous_exchange: each rank's pair addresses */
    void (*exchange)(const DistEnv *env, const void *mine, void *theirs, size_t entry,
                     double timeout_s);
} CommGlooHost;

/* 0, or -1 when the table is of another version or size (the library is from
 * another build). */
int comm_gloo_set_host(const CommGlooHost *host);

/* A Gloo context of env's world: a TCP device on `iface` (a network interface,
 * GLOO_SOCKET_IFNAME) when not empty, else on the local `address` (the one this
 * machine reaches MASTER_ADDR from: rendezvous_route_address); one pair per peer,
 * the pairs' addresses exchanged through rank 0 (rendezvous_exchange). Every wait
 * gives up after timeout_s, and after COMM_STOP_GRACE_SECONDS once env's stop flag
 * is set. SIGPIPE is ignored from here on if it was not already (Gloo's writes to a
 * dead peer's socket would otherwise kill the process without a word). */
CommGloo *comm_gloo_create(const DistEnv *env, double timeout_s, const char *iface,
                           const char *address);
void comm_gloo_destroy(CommGloo *g);
/* In place: sum over ranks in rank order 0..W-1, then divide by W (float). */
void comm_gloo_allreduce_mean(CommGloo *g, float *buf, size_t n);
/* In place: sum over ranks in rank order. */
void comm_gloo_allreduce_sum_f64(CommGloo *g, double *buf, size_t n);
void comm_gloo_broadcast(CommGloo *g, void *buf, size_t bytes, int root);
void comm_gloo_barrier(CommGloo *g);

/* Whether libcifar-gloo.so can be loaded: NULL, or why not (gloo_loader.c). */
const char *comm_gloo_library_error(void);

#ifdef __cplusplus
}
#endif
#endif
