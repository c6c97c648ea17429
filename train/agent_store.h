/* agent_store.h: the rendezvous store of cifar-train's node agents (the launchers of
 * a job started with --rdzv-endpoint HOST:PORT; torchrun's c10d store).
 *
 * Against issue 22's contract between its engineers (h22b): --max-restarts counts the
 * failed rounds of the whole job, not the rounds a joining node starts (as torchrun);
 * a permanent failure ends every agent with the worker's status (2 or 3); the store's
 * agent is always node 0 (MASTER_ADDR = HOST); --log-dir, --redirects and --tee stay
 * accepted (the launcher implements them), not refused as other torchrun options are.
 *
 * One agent serves it: the one on the machine that owns HOST's address (it binds
 * HOST:PORT; an agent that cannot, because the address is not its machine's or the
 * port is taken on it, connects instead). It runs in a thread of that agent and
 * decides every round of the job; the agents (that one included, over TCP like
 * the others) only report and obey.
 *
 * Wire format: every message is a 16-byte header, big-endian u32 fields,
 *     "CFAG" | version 1 | type | payload length (<= AGENT_MAX_PAYLOAD)
 * then the payload (u32 fields big-endian, text without a terminating NUL):
 *   agent -> store
 *     HELLO     job hash[32] (SHA-256 of "cifar-agent-job/v1\n" job id) | token[32]
 *               (SHA-256 of "cifar-agent-token/v1\n" CIFAR_JOB_TOKEN, else of the job
 *               id) | agent nonce[16] (random per agent process) | store nonce[16]
 *               (the store's own, from its agent; zeros from the others) | nproc u32
 *               | host name (text, <= 64)
 *     JOIN      (empty): put me in the next round that forms
 *     BEAT      round u32 (every AGENT_BEAT_SECONDS)
 *     FAILED    round u32 | reason: a worker failed (a restart may help)
 *     PERMANENT round u32 | exit status u32 | reason: no restart can help
 *     DONE      round u32: every worker of this node exited 0
 *     LEAVING   round u32 | signal u32: this agent was stopped by a signal
 *   store -> agent
 *     WELCOME   order u32 (this agent's place in the job's join order)
 *     REFUSED   reason (then the store closes)
 *     ROUND     round u32 | node rank u32 | nodes u32 | world size u32 | failed
 *               rounds so far u32 | master port u32 | master address (text)
 *     STOP      round u32 | reason: stop the workers and JOIN again
 *     END       exit status u32 | reason: the job is over, everywhere
 *     ALIVE     (empty): the answer to BEAT
 * A connection must send a complete, valid HELLO within AGENT_HELLO_SECONDS; an
 * agent silent for AGENT_DEAD_SECONDS is dropped (a member of the running round:
 * the round fails). Anything else (wrong magic, version or size, an unknown type,
 * another job, a wrong token) closes the connection with one log line (the first
 * AGENT_MAX_DROP_LOGS); at most AGENT_MAX_PENDING connections may be waiting for
 * their hello (the oldest is dropped for a new one), so strangers never keep an
 * agent out and never stop the store.
 *
 * Rounds: round R forms from the agents that JOIN; it closes when --nnodes MAX
 * have joined, or MIN and --rdzv-timeout seconds passed without a new one (the
 * store's own agent must be among them). Node ranks: the store's agent is node 0
 * (it holds the run folder's lock and rank 0 runs beside the store), the others
 * in the order they first joined the job. MASTER_ADDR is HOST; MASTER_PORT a port
 * free on HOST when the round closes; the workers' CIFAR_JOB_ID is the job id and the
 * round (ID-rR: a worker of an earlier round is another job to this round's rank 0). A worker failure (FAILED) or a member lost
 * makes the round fail: STOP to every member, round R + 1 forms; more failed
 * rounds than --max-restarts, a PERMANENT report or a LEAVING agent END the job.
 * An agent that joins while a round of fewer than MAX nodes runs (a new node, or
 * one that came back) makes that round stop for a new one, as torchrun does; such
 * a round is not a failure and does not count against --max-restarts. */
#ifndef CIFAR_AGENT_STORE_H
#define CIFAR_AGENT_STORE_H

#include <stddef.h>
#include <stdint.h>

#define AGENT_MAGIC 0x43464147u /* "CFAG" */
#define AGENT_VERSION 1u
#define AGENT_HEADER_BYTES 16
#define AGENT_MAX_PAYLOAD 1024
#define AGENT_HELLO_BYTES 100 /* without the host name */
#define AGENT_MAX_NAME 64
#define AGENT_HELLO_SECONDS 5.0
#define AGENT_BEAT_SECONDS 1.0
#define AGENT_DEAD_SECONDS 5.0
#define AGENT_MAX_PENDING 64
#define AGENT_MAX_AGENTS 1024
#define AGENT_MAX_DROP_LOGS 20

typedef enum {
    AGENT_HELLO = 1,
    AGENT_JOIN,
    AGENT_BEAT,
    AGENT_FAILED,
    AGENT_PERMANENT,
    AGENT_DONE,
    AGENT_LEAVING,
    STORE_WELCOME = 101,
    STORE_REFUSED,
    STORE_ROUND,
    STORE_STOP,
    STORE_END,
    STORE_ALIVE,
} AgentMsgType;

/* The job's identity as the agents present it (HELLO). */
typedef struct {
    unsigned char job_hash[32];
    unsigned char token[32];
} AgentIdentity;

/* job_id: --rdzv-id, else CIFAR_JOB_ID; token: CIFAR_JOB_TOKEN or NULL. */
void agent_identity(AgentIdentity *id, const char *job_id, const char *token);

typedef struct {
    char host[256];        /* --rdzv-endpoint's HOST (MASTER_ADDR of every round) */
    int port;
    int nnodes_min, nnodes_max;
    double rdzv_timeout;   /* seconds without a new agent before a round of >= MIN closes */
    double join_timeout;   /* a round that has not closed after this long ends the job */
    int max_restarts;      /* failed rounds allowed */
    int nproc;             /* workers per node: every agent must have the same */
    AgentIdentity id;
    unsigned char nonce[16]; /* the store's: its own agent sends it back (node 0) */
} AgentStoreConfig;

typedef struct AgentStore AgentStore;

/* Binds cfg->host:cfg->port and starts serving in a thread. NULL when this
 * machine does not own the address or the port is taken here (*why says which:
 * the agent then connects as a client); dies on other errors. */
AgentStore *agent_store_start(const AgentStoreConfig *cfg, char *why, size_t whylen);
/* Waits until every agent got the END (at most a few seconds), stops the thread. */
void agent_store_stop(AgentStore *s);

/* ---- message helpers shared by the store and the agents */
void agent_put_u32(unsigned char *p, uint32_t v);
uint32_t agent_get_u32(const unsigned char *p);
/* Header + payload into out (AGENT_HEADER_BYTES + len bytes); returns the size. */
size_t agent_frame(unsigned char *out, uint32_t type, const void *payload, size_t len);
/* Checks a received header: 0 and *type, *len set, or -1 with why. */
int agent_header_check(const unsigned char *h, uint32_t *type, uint32_t *len, char *why,
                       size_t whylen);
/* Sends a whole frame without blocking: 0, or -1 (the peer is gone or stuck). */
int agent_send(int fd, uint32_t type, const void *payload, size_t len);
double agent_now(void);
struct addrinfo;
/* getaddrinfo of host:port for TCP (passive: to bind); its status. */
int agent_resolve(const char *host, int port, int passive, struct addrinfo **res);

#endif
