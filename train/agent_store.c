/* agent_store.c: the node agents' rendezvous store, served in a thread of one
 * agent (agent_store.h: the wire format and the rounds). Poll-based and
 * non-blocking: a connection that is silent, slow, garbled or of another job is
 * dropped without delaying the others; nothing a peer sends can stop it. */
#define _GNU_SOURCE /* accept4 */
#include "agent_store.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/listen.h"
#include "comm/sha256.h"
#include "core/check.h"
#include "signals.h"

#define STORE_LINGER_SECONDS 3.0 /* after the END: time for the agents to read it */
#define STORE_MAX_CONNS (AGENT_MAX_PENDING + AGENT_MAX_AGENTS + 1)

/* ------------------------------------------------------------ helpers */

double agent_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int agent_resolve(const char *host, int port, int passive, struct addrinfo **res) {
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = passive ? AI_PASSIVE : 0;
    return getaddrinfo(host, service, &hints, res);
}

void agent_put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

uint32_t agent_get_u32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

size_t agent_frame(unsigned char *out, uint32_t type, const void *payload, size_t len) {
    agent_put_u32(out, AGENT_MAGIC);
    agent_put_u32(out + 4, AGENT_VERSION);
    agent_put_u32(out + 8, type);
    agent_put_u32(out + 12, (uint32_t)len);
    if (len) memcpy(out + AGENT_HEADER_BYTES, payload, len);
    return AGENT_HEADER_BYTES + len;
}

static int type_known(uint32_t t) {
    return (t >= AGENT_HELLO && t <= AGENT_LEAVING) || (t >= STORE_WELCOME && t <= STORE_ALIVE);
}

int agent_header_check(const unsigned char *h, uint32_t *type, uint32_t *len, char *why,
                       size_t whylen) {
    if (agent_get_u32(h) != AGENT_MAGIC)
        return snprintf(why, whylen, "wrong magic (not a cifar-train agent)"), -1;
    if (agent_get_u32(h + 4) != AGENT_VERSION)
        return snprintf(why, whylen, "protocol version %u (this build speaks %u)",
                        agent_get_u32(h + 4), AGENT_VERSION), -1;
    *type = agent_get_u32(h + 8);
    *len = agent_get_u32(h + 12);
    if (!type_known(*type)) return snprintf(why, whylen, "unknown message type %u", *type), -1;
    if (*len > AGENT_MAX_PAYLOAD)
        return snprintf(why, whylen, "a message of %u bytes (at most %d)", *len, AGENT_MAX_PAYLOAD), -1;
    return 0;
}

int agent_send(int fd, uint32_t type, const void *payload, size_t len) {
    unsigned char buf[AGENT_HEADER_BYTES + AGENT_MAX_PAYLOAD];
    if (len > AGENT_MAX_PAYLOAD) len = AGENT_MAX_PAYLOAD;
    size_t n = agent_frame(buf, type, payload, len);
    ssize_t w;
    do w = send(fd, buf, n, MSG_NOSIGNAL | MSG_DONTWAIT);
    while (w < 0 && errno == EINTR);
    return w == (ssize_t)n ? 0 : -1; /* a short send: the peer stopped reading */
}

void agent_identity(AgentIdentity *id, const char *job_id, const char *token) {
    static const char job_prefix[] = "cifar-agent-job/v1\n";
    static const char token_prefix[] = "cifar-agent-token/v1\n";
    sha256_two(job_prefix, sizeof job_prefix - 1, job_id, strlen(job_id), id->job_hash);
    const char *secret = token && *token ? token : job_id;
    sha256_two(token_prefix, sizeof token_prefix - 1, secret, strlen(secret), id->token);
}

/* Constant-time comparison (the token is a secret). */
static int same_bytes(const unsigned char *a, const unsigned char *b, size_t n) {
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

/* ------------------------------------------------------------ state */

typedef struct {
    int fd;               /* -1: closed, removed at the end of the poll pass */
    int authed;
    double deadline;      /* the hello's, then the heartbeat's */
    unsigned char in[AGENT_HEADER_BYTES + AGENT_MAX_PAYLOAD];
    size_t got;
    char peer[96];
    char name[AGENT_MAX_NAME + 1];
    unsigned char nonce[16];
    int local;            /* the store's own agent: node 0 */
    int order;            /* place in the job's join order */
    int joined;           /* wants the next round */
    int member, node_rank, done;
} Conn;

struct AgentStore {
    AgentStoreConfig cfg;
    int lfd;
    pthread_t thread;
    pthread_mutex_t lock;
    int quit;             /* set by agent_store_stop (under lock) */
    double quit_at;
    Conn *conn;
    int nconn, next_order;
    int round, running, ended;
    double round_opened, last_join;
    int failures;
    int logged, drops;
};

static double store_deadline_hello(void) { return agent_now() + AGENT_HELLO_SECONDS; }

/* One line per dropped connection, the first AGENT_MAX_DROP_LOGS (a scanner must
 * not flood the log). */
static void store_log_drop(AgentStore *s, const Conn *c, const char *reason) {
    s->drops++;
    s->logged++;
    if (s->logged <= AGENT_MAX_DROP_LOGS)
        log_warn("rendezvous store: dropped a connection from %s: %s", c->peer, reason);
    if (s->logged == AGENT_MAX_DROP_LOGS)
        log_warn("rendezvous store: further dropped connections are not logged");
}

static void conn_close(AgentStore *s, Conn *c, const char *reason) {
    if (c->fd < 0) return;
    if (reason) store_log_drop(s, c, reason);
    close(c->fd);
    c->fd = -1;
}

static void conn_send(AgentStore *s, Conn *c, uint32_t type, const void *p, size_t len);

static void send_text(AgentStore *s, Conn *c, uint32_t type, uint32_t a, const char *text) {
    unsigned char p[AGENT_MAX_PAYLOAD];
    agent_put_u32(p, a);
    size_t n = strlen(text);
    if (n > sizeof p - 4) n = sizeof p - 4;
    memcpy(p + 4, text, n);
    conn_send(s, c, type, p, 4 + n);
}

/* ------------------------------------------------------------ rounds */

/* The job is over: every agent is told (and told again if it asks to join). */
static void store_end(AgentStore *s, int status, const char *reason) {
    s->ended = status + 1; /* 0 means not ended */
    for (int i = 0; i < s->nconn; i++)
        if (s->conn[i].fd >= 0 && s->conn[i].authed) send_text(s, &s->conn[i], STORE_END, (uint32_t)status, reason);
}

static void store_end_again(AgentStore *s, Conn *c) {
    send_text(s, c, STORE_END, (uint32_t)(s->ended - 1), "the job is over");
}

/* The running round stops; round + 1 forms. counted: a failure (--max-restarts). */
static void store_round_fail(AgentStore *s, const char *why, int counted) {
    if (counted && ++s->failures > s->cfg.max_restarts) {
        char line[AGENT_MAX_PAYLOAD];
        snprintf(line, sizeof line, "giving up after %d failed round%s (--max-restarts %d); the last: %.900s",
                 s->failures, s->failures == 1 ? "" : "s", s->cfg.max_restarts, why);
        store_end(s, 1, line);
        return;
    }
    /* the state first, then the messages: a send that fails loses that agent,
     * which must not fail the round a second time */
    int stopped = s->round;
    char *was = xcalloc((size_t)s->nconn + 1, 1);
    for (int i = 0; i < s->nconn; i++) {
        was[i] = s->conn[i].fd >= 0 && s->conn[i].member;
        s->conn[i].member = 0;
        s->conn[i].done = 0;
    }
    s->round++;
    s->running = 0;
    s->round_opened = s->last_join = agent_now();
    int n = s->nconn;
    for (int i = 0; i < n; i++)
        if (was[i]) send_text(s, &s->conn[i], STORE_STOP, (uint32_t)stopped, why);
    free(was);
}

/* A connection that ended or went silent; a member of the running round fails it. */
static void store_lose(AgentStore *s, Conn *c, const char *how) {
    int member = c->member && s->running && !s->ended;
    char why[AGENT_MAX_PAYLOAD];
    snprintf(why, sizeof why, "node %d (%s, %s) lost: %s", c->node_rank, c->name, c->peer, how);
    c->member = 0;
    conn_close(s, c, c->authed ? NULL : how);
    if (member) store_round_fail(s, why, 1);
}

static void conn_send(AgentStore *s, Conn *c, uint32_t type, const void *p, size_t len) {
    if (c->fd < 0) return;
    if (agent_send(c->fd, type, p, len) != 0) store_lose(s, c, "its connection broke");
}

/* A port free on HOST now; rank 0's worker binds it moments later (as torchrun's). */
static int store_free_port(const AgentStore *s) {
    struct addrinfo *res = NULL;
    if (agent_resolve(s->cfg.host, 0, 1, &res) != 0) return -1;
    int port = -1;
    for (struct addrinfo *a = res; a && port < 0; a = a->ai_next) {
        int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        struct sockaddr_storage ss;
        socklen_t sl = sizeof ss;
        if (bind(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&ss, &sl) == 0)
            port = ntohs(ss.ss_family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                                  : ((struct sockaddr_in *)&ss)->sin_port);
        close(fd);
    }
    freeaddrinfo(res);
    return port;
}

/* The joined agents in node order: the store's own first, then by join order. */
static int store_pick_members(AgentStore *s, Conn **out) {
    int n = 0;
    for (int i = 0; i < s->nconn; i++)
        if (s->conn[i].fd >= 0 && s->conn[i].joined && s->conn[i].local) out[n++] = &s->conn[i];
    for (;;) {
        Conn *next = NULL;
        for (int i = 0; i < s->nconn; i++) {
            Conn *c = &s->conn[i];
            int taken = 0;
            for (int k = 0; k < n; k++) taken |= out[k] == c;
            if (c->fd >= 0 && c->joined && !taken && (!next || c->order < next->order)) next = c;
        }
        if (!next || n == s->cfg.nnodes_max) return n;
        out[n++] = next;
    }
}

static void store_round_close(AgentStore *s, Conn **m, int n) {
    int port = store_free_port(s);
    if (port < 0) {
        store_end(s, 1, "the rendezvous store found no free port for rank 0 on its host");
        return;
    }
    s->running = 1;
    int round = s->round;
    for (int k = 0; k < n; k++) {
        m[k]->joined = 0;
        m[k]->member = 1;
        m[k]->node_rank = k;
        m[k]->done = 0;
    }
    for (int k = 0; k < n; k++) {
        if (s->round != round) { /* a send failed and lost a member: the round failed */
            m[k]->joined = 1;       /* those not told yet are in the next one */
            continue;
        }
        unsigned char p[AGENT_MAX_PAYLOAD];
        uint32_t v[6] = {(uint32_t)s->round, (uint32_t)k, (uint32_t)n,
                         (uint32_t)(n * s->cfg.nproc), (uint32_t)s->failures, (uint32_t)port};
        for (int f = 0; f < 6; f++) agent_put_u32(p + 4 * f, v[f]);
        size_t hl = strlen(s->cfg.host);
        memcpy(p + 24, s->cfg.host, hl);
        conn_send(s, m[k], STORE_ROUND, p, 24 + hl);
    }
}

/* Forming: close the round when it is full, or has MIN and nobody new came for
 * --rdzv-timeout; give up after the join timeout. Running: an agent waiting for a
 * place makes a round of fewer than MAX nodes stop (torchrun's membership change). */
static void store_rounds_tick(AgentStore *s) {
    if (s->ended) return;
    double now = agent_now();
    int joined = 0, local = 0, members = 0, waiting = 0, done = 0;
    for (int i = 0; i < s->nconn; i++) {
        Conn *c = &s->conn[i];
        if (c->fd < 0 || !c->authed) continue;
        joined += c->joined;
        local |= c->joined && c->local;
        members += c->member;
        waiting += c->joined && !c->member;
        done += c->member && c->done;
    }
    if (s->running) {
        if (waiting > 0 && members < s->cfg.nnodes_max && done == 0) {
            char why[200];
            snprintf(why, sizeof why, "%d more node%s asking to join: a new round", waiting,
                     waiting == 1 ? "" : "s");
            store_round_fail(s, why, 0);
        }
        return;
    }
    if (local && (joined >= s->cfg.nnodes_max ||
                  (joined >= s->cfg.nnodes_min && now - s->last_join >= s->cfg.rdzv_timeout))) {
        Conn *m[AGENT_MAX_AGENTS];
        int n = store_pick_members(s, m);
        store_round_close(s, m, n);
        return;
    }
    if (now - s->round_opened > s->cfg.join_timeout) {
        char why[300];
        snprintf(why, sizeof why, "round %d: %d node%s joined within %g s, %d needed (--nnodes %d:%d)",
                 s->round, joined, joined == 1 ? "" : "s", s->cfg.join_timeout, s->cfg.nnodes_min,
                 s->cfg.nnodes_min, s->cfg.nnodes_max);
        store_end(s, 1, why);
    }
}

/* ------------------------------------------------------------ messages */

static void store_hello(AgentStore *s, Conn *c, const unsigned char *p, uint32_t len) {
    if (len < AGENT_HELLO_BYTES || len > AGENT_HELLO_BYTES + AGENT_MAX_NAME) {
        conn_close(s, c, "a hello of the wrong size");
        return;
    }
    char why[200] = "";
    uint32_t nproc = agent_get_u32(p + 96);
    int authed_agents = 0;
    for (int i = 0; i < s->nconn; i++) authed_agents += s->conn[i].fd >= 0 && s->conn[i].authed;
    if (!same_bytes(p, s->cfg.id.job_hash, 32))
        snprintf(why, sizeof why, "an agent of another job (another --rdzv-id or CIFAR_JOB_ID)");
    else if (!same_bytes(p + 32, s->cfg.id.token, 32))
        snprintf(why, sizeof why, "an agent of this job with a wrong token (CIFAR_JOB_TOKEN)");
    else if (nproc != (uint32_t)s->cfg.nproc)
        snprintf(why, sizeof why, "an agent with %u workers per node (this job: --nproc-per-node %d "
                 "on every node)", nproc, s->cfg.nproc);
    else if (authed_agents >= AGENT_MAX_AGENTS)
        snprintf(why, sizeof why, "too many agents (%d)", AGENT_MAX_AGENTS);
    if (why[0]) {
        store_log_drop(s, c, why);
        send_text(s, c, STORE_REFUSED, 0, why);
        conn_close(s, c, NULL);
        return;
    }
    for (int i = 0; i < s->nconn; i++) /* the same agent again: its old connection is dead */
        if (&s->conn[i] != c && s->conn[i].fd >= 0 && s->conn[i].authed &&
            memcmp(s->conn[i].nonce, p + 64, 16) == 0)
            store_lose(s, &s->conn[i], "it connected again");
    c->authed = 1;
    memcpy(c->nonce, p + 64, 16);
    c->local = same_bytes(p + 80, s->cfg.nonce, 16);
    size_t nl = len - AGENT_HELLO_BYTES;
    memcpy(c->name, p + AGENT_HELLO_BYTES, nl);
    c->name[nl] = '\0';
    for (char *q = c->name; *q; q++)
        if ((unsigned char)*q < 32 || (unsigned char)*q > 126) *q = '?';
    c->order = s->next_order++;
    if (s->ended) {
        store_end_again(s, c);
        return;
    }
    send_text(s, c, STORE_WELCOME, (uint32_t)c->order, "");
}

/* Text after a u32 (or two), NUL-terminated into out. */
static void payload_text(const unsigned char *p, uint32_t len, uint32_t skip, char *out, size_t outlen) {
    size_t n = len > skip ? len - skip : 0;
    if (n >= outlen) n = outlen - 1;
    memcpy(out, p + skip, n);
    out[n] = '\0';
    for (size_t i = 0; i < n; i++)
        if ((unsigned char)out[i] < 32) out[i] = ' ';
}

static void store_message(AgentStore *s, Conn *c, uint32_t type, const unsigned char *p, uint32_t len) {
    if (!c->authed) {
        if (type == AGENT_HELLO) store_hello(s, c, p, len);
        else conn_close(s, c, "a message before its hello");
        return;
    }
    c->deadline = agent_now() + AGENT_DEAD_SECONDS;
    uint32_t need = type == AGENT_PERMANENT || type == AGENT_LEAVING ? 8 : type == AGENT_JOIN ? 0 : 4;
    if (type == AGENT_HELLO || type >= STORE_WELCOME || len < need) {
        store_lose(s, c, "a malformed message");
        return;
    }
    int this_round = need >= 4 && agent_get_u32(p) == (uint32_t)s->round && c->member && s->running;
    char text[AGENT_MAX_PAYLOAD];
    payload_text(p, len, need, text, sizeof text);
    if (type == AGENT_BEAT) {
        conn_send(s, c, STORE_ALIVE, NULL, 0);
    } else if (s->ended) {
        if (type == AGENT_JOIN) store_end_again(s, c);
    } else if (type == AGENT_JOIN) {
        c->joined = 1;
        c->done = 0;
        if (!s->running) s->last_join = agent_now();
    } else if (type == AGENT_FAILED && this_round) {
        store_round_fail(s, text, 1);
    } else if (type == AGENT_PERMANENT) { /* whatever the round: a rerun fails alike */
        store_end(s, (int)agent_get_u32(p + 4), text);
    } else if (type == AGENT_LEAVING) {
        char line[AGENT_MAX_PAYLOAD];
        char who[AGENT_MAX_NAME + 32];
        if (c->member) snprintf(who, sizeof who, "node %d (%s)", c->node_rank, c->name);
        else snprintf(who, sizeof who, "the agent on %s", c->name);
        snprintf(line, sizeof line, "%s was stopped by %s: every node stops (rerun every node to "
                 "resume)", who, signal_name((int)agent_get_u32(p + 4)));
        store_end(s, 128 + (int)agent_get_u32(p + 4), line);
    } else if (type == AGENT_DONE && this_round) {
        c->done = 1;
        int all = 1;
        for (int i = 0; i < s->nconn; i++)
            if (s->conn[i].fd >= 0 && s->conn[i].member && !s->conn[i].done) all = 0;
        if (all) store_end(s, 0, "");
    }
}

/* Reads what c sent; handles every complete message. */
static void store_read(AgentStore *s, Conn *c) {
    while (c->fd >= 0) {
        uint32_t type = 0, len = 0;
        size_t want = AGENT_HEADER_BYTES;
        if (c->got >= AGENT_HEADER_BYTES) {
            char why[160];
            if (agent_header_check(c->in, &type, &len, why, sizeof why) != 0) {
                if (c->authed) store_lose(s, c, why);
                else conn_close(s, c, why);
                return;
            }
            want += len;
        }
        if (c->got == want) {
            c->got = 0;
            store_message(s, c, type, c->in + AGENT_HEADER_BYTES, len);
            continue;
        }
        ssize_t n = recv(c->fd, c->in + c->got, want - c->got, MSG_DONTWAIT);
        if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
        if (n <= 0) {
            const char *how = c->got ? "closed in the middle of a message" : "closed its connection";
            if (c->authed) store_lose(s, c, how);
            else conn_close(s, c, c->got ? how : "closed without a word");
            return;
        }
        c->got += (size_t)n;
    }
}

/* ------------------------------------------------------------ connections */

static void store_accept(AgentStore *s) {
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        /* close-on-exec from the start: the agent's main thread forks and execs workers
         * meanwhile, and a worker holding this socket would keep it open after the
         * store closes it (the peer would not see its connection end) */
        int fd = accept4(s->lfd, (struct sockaddr *)&sa, &sl, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) return; /* EAGAIN, or the peer left */
        int pending = 0, oldest = -1;
        for (int i = 0; i < s->nconn; i++)
            if (s->conn[i].fd >= 0 && !s->conn[i].authed) {
                pending++;
                if (oldest < 0 || s->conn[i].deadline < s->conn[oldest].deadline) oldest = i;
            }
        if (pending >= AGENT_MAX_PENDING)
            conn_close(s, &s->conn[oldest], "too many connections without a hello at once");
        if (s->nconn == STORE_MAX_CONNS) { /* only closed slots are left to reuse */
            close(fd);
            return;
        }
        Conn *c = &s->conn[s->nconn++];
        memset(c, 0, sizeof *c);
        c->fd = fd;
        c->deadline = store_deadline_hello();
        char host[64], port[16];
        if (getnameinfo((struct sockaddr *)&sa, sl, host, sizeof host, port, sizeof port,
                        NI_NUMERICHOST | NI_NUMERICSERV) != 0)
            snprintf(host, sizeof host, "an unknown address"), snprintf(port, sizeof port, "?");
        snprintf(c->peer, sizeof c->peer, "%s port %s", host, port);
    }
}

static void store_expire(AgentStore *s) {
    double now = agent_now();
    for (int i = 0; i < s->nconn; i++) {
        Conn *c = &s->conn[i];
        if (c->fd < 0 || now <= c->deadline) continue;
        if (c->authed) {
            char how[64];
            snprintf(how, sizeof how, "no heartbeat for %g s", AGENT_DEAD_SECONDS);
            store_lose(s, c, how);
        } else {
            conn_close(s, c, "no complete hello within 5 s");
        }
    }
}

static void store_compact(AgentStore *s) {
    int k = 0;
    for (int i = 0; i < s->nconn; i++)
        if (s->conn[i].fd >= 0) {
            if (k != i) s->conn[k] = s->conn[i];
            k++;
        }
    s->nconn = k;
}

static int store_should_exit(AgentStore *s) {
    pthread_mutex_lock(&s->lock);
    int quit = s->quit;
    double at = s->quit_at;
    pthread_mutex_unlock(&s->lock);
    if (!quit) return 0;
    int left = 0;
    for (int i = 0; i < s->nconn; i++) left += s->conn[i].fd >= 0 && s->conn[i].authed;
    return left == 0 || agent_now() > at + STORE_LINGER_SECONDS;
}

static void *store_main(void *arg) {
    AgentStore *s = arg;
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_BLOCK, &all, NULL); /* the agent's main thread takes the signals */
    struct pollfd *fds = xcalloc(STORE_MAX_CONNS + 1, sizeof *fds);
    while (!store_should_exit(s)) {
        fds[0] = (struct pollfd){s->lfd, POLLIN, 0};
        for (int i = 0; i < s->nconn; i++) fds[i + 1] = (struct pollfd){s->conn[i].fd, POLLIN, 0};
        int n = s->nconn;
        int rc = poll(fds, (nfds_t)n + 1, 100);
        if (rc < 0 && errno != EINTR) CHECK_STDIO(0, "poll(rendezvous store)");
        for (int i = 0; rc > 0 && i < n; i++)
            if (fds[i + 1].revents) store_read(s, &s->conn[i]);
        if (rc > 0 && (fds[0].revents & POLLIN)) store_accept(s);
        store_expire(s);
        store_rounds_tick(s);
        store_compact(s);
    }
    for (int i = 0; i < s->nconn; i++) conn_close(s, &s->conn[i], NULL);
    free(fds);
    return NULL;
}

/* ------------------------------------------------------------ start / stop */

/* The listening socket on HOST:PORT, or -1 with why when this machine does not
 * own HOST or the port is taken on it. Dies on anything else. */
static int store_listen(const AgentStoreConfig *cfg, char *why, size_t whylen) {
    struct addrinfo *res = NULL;
    int rc = agent_resolve(cfg->host, cfg->port, 1, &res);
    if (rc != 0)
        die("--rdzv-endpoint %s:%d: %s\n---> HINT: name the host of the agent that serves the "
            "store (the same on every node)", cfg->host, cfg->port, gai_strerror(rc));
    int err = 0;
    int fd = listen_first(res, 0, &err);
    freeaddrinfo(res);
    if (fd >= 0) return fd;
    if (err == EADDRNOTAVAIL) {
        snprintf(why, whylen, "%s is not an address of this machine", cfg->host);
        return -1;
    }
    if (err == EADDRINUSE) {
        snprintf(why, whylen, "port %d is already served on this machine", cfg->port);
        return -1;
    }
    die("cannot serve the rendezvous store on %s:%d: %s", cfg->host, cfg->port, strerror(err));
}

AgentStore *agent_store_start(const AgentStoreConfig *cfg, char *why, size_t whylen) {
    int lfd = store_listen(cfg, why, whylen);
    if (lfd < 0) return NULL;
    AgentStore *s = xcalloc(1, sizeof *s);
    s->cfg = *cfg;
    s->lfd = lfd;
    s->conn = xcalloc(STORE_MAX_CONNS, sizeof *s->conn);
    s->round_opened = s->last_join = agent_now();
    pthread_mutex_init(&s->lock, NULL);
    int rc = pthread_create(&s->thread, NULL, store_main, s);
    if (rc != 0) die("cannot start the rendezvous store's thread: %s", strerror(rc));
    return s;
}

void agent_store_stop(AgentStore *s) {
    if (!s) return;
    pthread_mutex_lock(&s->lock);
    s->quit = 1;
    s->quit_at = agent_now();
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->thread, NULL);
    close(s->lfd);
    pthread_mutex_destroy(&s->lock);
    free(s->conn);
    free(s);
}
