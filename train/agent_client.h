/* agent_client.h: a node agent's connection to the rendezvous store
 * (agent_store.h has the wire format): connect and hello with a deadline, send
 * a report, read the store's messages while beating every AGENT_BEAT_SECONDS,
 * and notice a store that went silent for AGENT_DEAD_SECONDS. Never blocks for
 * longer than it is asked to: a store behind a cut link costs the deadline, not
 * the kernel's minutes of TCP retries. */
#ifndef CIFAR_AGENT_CLIENT_H
#define CIFAR_AGENT_CLIENT_H

#include <signal.h>
#include <stddef.h>
#include <stdint.h>

#include "agent_store.h"

typedef struct {
    int fd;                       /* -1: not connected */
    char host[256];
    int port;
    AgentIdentity id;
    unsigned char nonce[16];      /* this agent's, the same across reconnections */
    unsigned char store_nonce[16];/* the store's own when this agent serves it, else zeros */
    int nproc;
    int round;                    /* the round its beats name */
    const volatile sig_atomic_t *stop; /* a signal flag that ends agent_client_connect; NULL none */
    double last_heard, last_beat;
    unsigned char in[AGENT_HEADER_BYTES + AGENT_MAX_PAYLOAD];
    size_t got;
} AgentClient;

typedef struct {
    uint32_t type, len;
    unsigned char payload[AGENT_MAX_PAYLOAD + 1];
} AgentMsg;

/* A client of host:port (fd -1; nonce drawn here). */
void agent_client_init(AgentClient *c, const char *host, int port, const AgentIdentity *id,
                       int nproc);

/* Connects and says hello, retrying until the deadline (agent_now() clock):
 * 0 welcomed; -1 nothing answered in time (or c->stop was set); -2 refused (why:
 * the store's reason). */
int agent_client_connect(AgentClient *c, double deadline, char *why, size_t whylen);

void agent_client_close(AgentClient *c);

/* Sends a report: a u32 (the round), an optional second u32 (has_b) and text. */
int agent_client_report(AgentClient *c, uint32_t type, uint32_t a, int has_b, uint32_t b,
                        const char *text);

/* Waits up to timeout_ms for a message of the store, beating when due:
 * 1 and *m filled (ALIVE answers are consumed here), 0 nothing yet, -1 the store
 * is lost (closed, garbled, or silent for AGENT_DEAD_SECONDS; why says which). */
int agent_client_poll(AgentClient *c, int timeout_ms, AgentMsg *m, char *why, size_t whylen);

#endif
