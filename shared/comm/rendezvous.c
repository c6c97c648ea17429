/* rendezvous.c: rank 0 hands a blob to the ranks of its job over TCP, or serves an
 * exchange of one entry per pair of ranks (rendezvous.h). */
#define _GNU_SOURCE /* accept4 */
#include "comm/rendezvous.h"

#include <errno.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "comm/listen.h"
#include "comm/sha256.h"
#include "core/check.h"

#define RV_MAX_PENDING 64   /* connections that have not finished their hello */
#define RV_MAX_DROP_LOGS 20 /* a scanner must not flood the log */

static double rv_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void put_u32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)(v >> 24), p[1] = (unsigned char)(v >> 16);
    p[2] = (unsigned char)(v >> 8), p[3] = (unsigned char)v;
}

static uint32_t get_u32(const unsigned char *p) {
    return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | (uint32_t)p[3];
}

/* A stop signal pending past the grace (comm_stop_due) ends the rendezvous, and the
 * process: exit 128 + the signal. */
static void rv_stop_check(const DistEnv *env, double *since) {
    int sig = comm_stop_due(env->stop_signal, rv_now(), since);
    if (sig)
        die_status(128 + sig, "rank %d: stopped by signal %d during the rendezvous at %s:%d",
                   env->rank, sig, env->master_addr, env->master_port);
}

/* Waits until fd is readable/writable or the deadline passes, in slices of at most
 * 100 ms (a stop signal ends the wait): 1 ready, 0 timeout. */
static int rv_poll(const DistEnv *env, int fd, short events, double deadline) {
    double stop_since = 0;
    for (;;) {
        double left = deadline - rv_now();
        if (left <= 0) return 0;
        rv_stop_check(env, &stop_since);
        struct pollfd p = {fd, events, 0};
        int rc = poll(&p, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) CHECK_STDIO(0, "poll(rendezvous socket)");
    }
}

/* Reads or writes exactly len bytes before the deadline: 0 done, -1 failed/timeout. */
static int rv_io_all(const DistEnv *env, int fd, void *buf, size_t len, int writing,
                     double deadline) {
    unsigned char *p = buf;
    while (len > 0) {
        if (!rv_poll(env, fd, writing ? POLLOUT : POLLIN, deadline)) return -1;
        ssize_t n = writing ? send(fd, p, len, MSG_NOSIGNAL) : recv(fd, p, len, 0);
        if (n < 0 && (errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK)) continue;
        if (n <= 0) return -1;
        p += n;
        len -= (size_t)n;
    }
    return 0;
}

static void rv_job_hash(const DistEnv *env, unsigned char out[SHA256_BYTES]) {
    static const char prefix[] = "cifar-job-id/v1\n";
    sha256_two(prefix, sizeof prefix - 1, env->job_id, strlen(env->job_id), out);
}

void rendezvous_hello_encode(const DistEnv *env, uint32_t blob_len,
                             unsigned char out[RENDEZVOUS_HELLO_BYTES]) {
    put_u32(out, RENDEZVOUS_MAGIC);
    put_u32(out + 4, RENDEZVOUS_VERSION);
    put_u32(out + 8, (uint32_t)env->rank);
    put_u32(out + 12, (uint32_t)env->world_size);
    put_u32(out + 16, blob_len);
    rv_job_hash(env, out + 20);
    memcpy(out + 52, env->job_token, 32);
}

/* Constant-time comparison (the token is a secret). */
static int same_bytes(const unsigned char *a, const unsigned char *b, size_t n) {
    unsigned char diff = 0;
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

/* ------------------------------------------------------------------ listening */

/* The address to listen on: CIFAR_RENDEZVOUS_BIND (all | * | an address), else
 * MASTER_ADDR. NULL means every interface. */
static const char *rv_bind_host(const DistEnv *env) {
    if (env->comm.bind_all) return NULL;
    return env->comm.bind_addr[0] ? env->comm.bind_addr : env->master_addr;
}

static int rv_listen(const DistEnv *env) {
    const char *host = rv_bind_host(env);
    char port[16];
    snprintf(port, sizeof port, "%d", env->master_port);
    struct addrinfo hints, *res = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = host ? AF_UNSPEC : AF_INET6;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    int rc = getaddrinfo(host, port, &hints, &res);
    if (rc != 0 && host == NULL) { /* no IPv6: every IPv4 interface */
        hints.ai_family = AF_INET;
        rc = getaddrinfo(NULL, port, &hints, &res);
    }
    if (rc != 0)
        die("rank 0: cannot listen on %s port %d: %s\n---> HINT: MASTER_ADDR (or CIFAR_RENDEZVOUS_BIND) "
            "must name this machine", host ? host : "every interface", env->master_port, gai_strerror(rc));
    int err = 0;
    int fd = listen_first(res, host == NULL /* every interface: IPv4 too */, &err);
    freeaddrinfo(res);
    if (fd >= 0) return fd;
    if (err == EADDRNOTAVAIL)
        die("rank 0: MASTER_ADDR %s is not an address of this machine (rank 0 runs here), port %d\n"
            "---> HINT: set MASTER_ADDR to rank 0's host, or CIFAR_RENDEZVOUS_BIND=all to listen on "
            "every interface", host, env->master_port);
    die("rank 0: cannot listen on %s port %d: %s\n"
        "---> HINT: another job uses this port: choose another --master-port (MASTER_PORT)",
        host ? host : "every interface", env->master_port, strerror(err));
}

/* ------------------------------------------------------------------ rank 0 */

typedef struct {
    int fd;
    unsigned char buf[RENDEZVOUS_HELLO_BYTES];
    size_t got;
    double deadline;
    char host[64], port[16];
    /* an exchange's rank past its hello: its entries, until they are all here */
    unsigned char *body;
    size_t body_got;
    int rank;
} Pending;

typedef struct {
    const DistEnv *env;
    uint32_t magic;            /* RENDEZVOUS_MAGIC, or RENDEZVOUS_EXCHANGE_MAGIC */
    const unsigned char *blob; /* share: what every rank gets */
    size_t len;                /* the hellos' blob length (an exchange: W * entry) */
    size_t entry;              /* exchange: bytes per entry */
    unsigned char *table;      /* exchange: row r (len bytes) from rank r; NULL: share */
    int *parked;               /* exchange: rank r's connection waiting for its entries, -1 */
    unsigned char job_hash[SHA256_BYTES];
    unsigned char *served; /* per rank */
    int left;              /* ranks still to serve */
    int drops, logged;     /* connections dropped, lines logged */
    char last_drop[320];   /* host and reason of the last logged drop */
    int repeats;           /* drops since, with the same host and reason */
    Pending pend[RV_MAX_PENDING];
    int npend;
} Server;

static void rv_peer_name(const struct sockaddr_storage *sa, socklen_t len, Pending *p) {
    if (getnameinfo((const struct sockaddr *)sa, len, p->host, sizeof p->host, p->port,
                    sizeof p->port, NI_NUMERICHOST | NI_NUMERICSERV) != 0) {
        snprintf(p->host, sizeof p->host, "an unknown address");
        snprintf(p->port, sizeof p->port, "?");
    }
}

static void rv_log_repeats(Server *s) {
    if (s->repeats > 0)
        log_warn("rank 0: rendezvous: ... and %d more connection%s like the last one", s->repeats,
                 s->repeats == 1 ? "" : "s");
    s->repeats = 0;
}

/* One line per dropped connection; a peer that retries for the same reason (a
 * stale rank) is counted, not logged again, and no more than RV_MAX_DROP_LOGS
 * lines in all (a scanner must not flood the log). */
static void rv_log_drop(Server *s, const Pending *p, const char *reason) {
    char key[sizeof s->last_drop];
    snprintf(key, sizeof key, "%s: %s", p->host, reason);
    s->drops++;
    if (strcmp(key, s->last_drop) == 0) {
        s->repeats++;
        return;
    }
    rv_log_repeats(s);
    snprintf(s->last_drop, sizeof s->last_drop, "%s", key);
    s->logged++;
    if (s->logged <= RV_MAX_DROP_LOGS)
        log_warn("rank 0: rendezvous: dropped a connection from %s port %s: %s", p->host, p->port, reason);
    if (s->logged == RV_MAX_DROP_LOGS)
        log_warn("rank 0: rendezvous: further dropped connections are not logged");
}

/* Closes pending connection i (logging why, when `reason` is given). */
static void rv_close_pending(Server *s, int i, const char *reason) {
    if (reason) rv_log_drop(s, &s->pend[i], reason);
    close(s->pend[i].fd);
    free(s->pend[i].body);
    s->pend[i] = s->pend[--s->npend];
}

static void rv_accept_new(Server *s, int lfd) {
    for (;;) {
        struct sockaddr_storage sa;
        socklen_t sl = sizeof sa;
        int fd = accept4(lfd, (struct sockaddr *)&sa, &sl, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) return; /* EAGAIN: no more for now; other errors: the peer left */
        if (s->npend == RV_MAX_PENDING) rv_close_pending(s, 0, "too many silent connections at once");
        Pending *p = &s->pend[s->npend++];
        memset(p, 0, sizeof *p);
        p->fd = fd;
        p->deadline = rv_now() + RENDEZVOUS_HELLO_SECONDS;
        rv_peer_name(&sa, sl, p);
    }
}

/* The status for a complete hello, or -1 when it is not a cifar hello at all. */
static int rv_judge_hello(const Server *s, const unsigned char *h, char *why, size_t n) {
    const DistEnv *env = s->env;
    if (get_u32(h) == (s->table ? RENDEZVOUS_MAGIC : RENDEZVOUS_EXCHANGE_MAGIC))
        return snprintf(why, n, "a rank of another kind of rendezvous (another communicator: "
                        "every rank of a job must use the same --comm)"), -1;
    if (get_u32(h) != s->magic) return snprintf(why, n, "wrong magic (not a cifar rank)"), -1;
    if (get_u32(h + 4) != RENDEZVOUS_VERSION)
        return snprintf(why, n, "hello version %u (this build speaks %u)", get_u32(h + 4), RENDEZVOUS_VERSION), -1;
    uint32_t rank = get_u32(h + 8), world = get_u32(h + 12), len = get_u32(h + 16);
    if (!same_bytes(h + 20, s->job_hash, SHA256_BYTES))
        return snprintf(why, n, "rank %u of another job (not %s)", rank, env->job_id), RV_WRONG_JOB;
    if (!same_bytes(h + 52, env->job_token, 32))
        return snprintf(why, n, "rank %u of this job with a wrong token (CIFAR_JOB_TOKEN)", rank), RV_WRONG_TOKEN;
    if (world != (uint32_t)env->world_size)
        return snprintf(why, n, "rank %u of world size %u (this job: world size %d)", rank, world,
                        env->world_size), RV_BAD_RANK;
    if (rank == 0) return snprintf(why, n, "a second rank 0 (this process is rank 0)"), RV_BAD_RANK;
    if (rank >= world || len != s->len)
        return snprintf(why, n, "rank %u asking for %u bytes (this job: ranks 1..%d, %zu bytes)",
                        rank, len, env->world_size - 1, s->len), RV_BAD_RANK;
    if (s->served[rank]) return snprintf(why, n, "rank %u again (already served)", rank), RV_DUPLICATE;
    why[0] = '\0';
    return RV_OK;
}

/* An exchange's rank whose hello passed: the go-ahead, then it sends its entries. */
static void rv_await_entries(Server *s, int i) {
    Pending *p = &s->pend[i];
    unsigned char reply[RENDEZVOUS_REPLY_BYTES];
    put_u32(reply, s->magic);
    put_u32(reply + 4, RV_OK);
    if (rv_io_all(s->env, p->fd, reply, sizeof reply, 1, rv_now() + RENDEZVOUS_HELLO_SECONDS) != 0) {
        rv_close_pending(s, i, "the rank left before it got its answer");
        return;
    }
    p->rank = (int)get_u32(p->buf + 8);
    p->body = xmalloc(s->len);
    p->body_got = 0;
    p->deadline = rv_now() + RENDEZVOUS_HELLO_SECONDS;
}

/* Every entry of rank p->rank is here: it waits for the others' (parked). */
static void rv_park(Server *s, int i) {
    Pending *p = &s->pend[i];
    if (s->served[p->rank]) { /* two connections of one rank passed their hellos at once */
        rv_close_pending(s, i, "a rank again (already registered)");
        return;
    }
    memcpy(s->table + (size_t)p->rank * s->len, p->body, s->len);
    s->parked[p->rank] = p->fd;
    s->served[p->rank] = 1;
    s->left--;
    free(p->body);
    s->pend[i] = s->pend[--s->npend];
}

/* A parked rank's connection said something or closed: that rank left (died, or
 * gave up); it is forgotten, and may register again. */
static void rv_unpark(Server *s, int r) {
    log_warn("rank 0: rendezvous: rank %d left before every rank had come; waiting for it again", r);
    close(s->parked[r]);
    s->parked[r] = -1;
    s->served[r] = 0;
    s->left++;
}

/* Every rank is here: entry r of every row to rank r, in rank order. */
static void rv_send_entries(Server *s, unsigned char *theirs) {
    const int w = s->env->world_size;
    unsigned char *column = xmalloc(s->len);
    for (int r = 0; r < w; r++) {
        for (int i = 0; i < w; i++)
            memcpy(column + (size_t)i * s->entry, s->table + (size_t)i * s->len + (size_t)r * s->entry,
                   s->entry);
        if (r == 0) {
            memcpy(theirs, column, s->len);
            continue;
        }
        if (rv_io_all(s->env, s->parked[r], column, s->len, 1, rv_now() + RENDEZVOUS_HELLO_SECONDS) != 0)
            log_warn("rank 0: rendezvous: rank %d left before it got its entries", r);
        close(s->parked[r]);
        s->parked[r] = -1;
    }
    free(column);
}

static void rv_answer(Server *s, int i) {
    Pending *p = &s->pend[i];
    char why[200];
    int status = rv_judge_hello(s, p->buf, why, sizeof why);
    if (status < 0) {
        rv_close_pending(s, i, why);
        return;
    }
    if (status == RV_OK && s->table) {
        rv_await_entries(s, i);
        return;
    }
    unsigned char reply[RENDEZVOUS_REPLY_BYTES + RENDEZVOUS_MAX_BLOB];
    put_u32(reply, s->magic);
    put_u32(reply + 4, (uint32_t)status);
    size_t n = RENDEZVOUS_REPLY_BYTES;
    if (status == RV_OK) {
        memcpy(reply + n, s->blob, s->len);
        n += s->len;
    }
    int sent = rv_io_all(s->env, p->fd, reply, n, 1, rv_now() + RENDEZVOUS_HELLO_SECONDS) == 0;
    if (status == RV_OK && sent) {
        s->served[get_u32(p->buf + 8)] = 1;
        s->left--;
        rv_close_pending(s, i, NULL);
        return;
    }
    rv_close_pending(s, i, status == RV_OK ? "the rank left before it got its answer" : why);
}

/* Reads what pending connection i has sent; answers a complete hello. */
static void rv_read_pending(Server *s, int i) {
    Pending *p = &s->pend[i];
    unsigned char *to = p->body ? p->body + p->body_got : p->buf + p->got;
    size_t want = p->body ? s->len - p->body_got : sizeof p->buf - p->got;
    ssize_t n = recv(p->fd, to, want, 0);
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) return;
    if (n <= 0) {
        rv_close_pending(s, i, p->body ? "closed before all its entries came"
                               : p->got ? "closed in the middle of a hello" : "closed without a word");
        return;
    }
    if (p->body) {
        p->body_got += (size_t)n;
        if (p->body_got == s->len) rv_park(s, i);
        return;
    }
    p->got += (size_t)n;
    if (p->got == sizeof p->buf) rv_answer(s, i);
}

static void rv_die_waiting(const Server *s, double timeout_s) {
    int missing = 1;
    while (missing < s->env->world_size && s->served[missing]) missing++;
    die("rank 0: timed out after %g s waiting for rank %d to connect to port %d (%d of %d ranks "
        "came, %d connection%s dropped)\n"
        "---> HINT: start every rank with the same MASTER_ADDR/MASTER_PORT, WORLD_SIZE and job "
        "identity (CIFAR_JOB_ID, CIFAR_JOB_TOKEN)",
        timeout_s, missing, s->env->master_port, s->env->world_size - 1 - s->left,
        s->env->world_size - 1, s->drops, s->drops == 1 ? "" : "s");
}

static Server *rv_server_new(const DistEnv *env, uint32_t magic, size_t len) {
    Server *s = xcalloc(1, sizeof *s);
    s->env = env;
    s->magic = magic;
    s->len = len;
    rv_job_hash(env, s->job_hash);
    s->served = xcalloc((size_t)env->world_size, 1);
    s->left = env->world_size - 1;
    if (env->job_id_weak)
        log_warn("rank 0: rendezvous: this job has no identity beyond %s: set CIFAR_JOB_ID (and "
                 "CIFAR_JOB_TOKEN) on every rank to shut out other jobs", env->job_id);
    return s;
}

static void rv_server_free(Server *s) {
    for (int i = s->npend - 1; i >= 0; i--) rv_close_pending(s, i, NULL);
    for (int r = 0; s->parked && r < s->env->world_size; r++)
        if (s->parked[r] >= 0) close(s->parked[r]);
    if (s->logged <= RV_MAX_DROP_LOGS) rv_log_repeats(s);
    free(s->parked);
    free(s->table);
    free(s->served);
    free(s);
}

/* Until every rank is served (share) or registered (exchange), or the timeout. */
static void rv_serve(Server *s, double timeout_s) {
    const DistEnv *env = s->env;
    const int w = env->world_size;
    int lfd = rv_listen(env);
    double deadline = rv_now() + timeout_s, stop_since = 0;
    struct pollfd *fds = xcalloc((size_t)(RV_MAX_PENDING + 1 + w), sizeof *fds);
    while (s->left > 0) {
        double now = rv_now();
        if (now > deadline) rv_die_waiting(s, timeout_s);
        rv_stop_check(env, &stop_since);
        for (int i = s->npend - 1; i >= 0; i--)
            if (now > s->pend[i].deadline)
                rv_close_pending(s, i, "no complete hello within 5 s");
        fds[0] = (struct pollfd){lfd, POLLIN, 0};
        for (int i = 0; i < s->npend; i++) fds[i + 1] = (struct pollfd){s->pend[i].fd, POLLIN, 0};
        int npend = s->npend, npoll = npend + 1;
        for (int r = 0; s->parked && r < w; r++)
            fds[npoll++] = (struct pollfd){s->parked[r], POLLIN, 0}; /* -1: ignored by poll */
        int rc = poll(fds, (nfds_t)npoll, 100);
        if (rc < 0 && errno != EINTR) CHECK_STDIO(0, "poll(rendezvous)");
        if (rc <= 0) continue;
        for (int r = 0; s->parked && r < w; r++)
            if (fds[npend + 1 + r].fd >= 0 && fds[npend + 1 + r].revents) rv_unpark(s, r);
        /* pending connections first, from the last (closing one moves the last into its place) */
        for (int i = npend - 1; i >= 0; i--)
            if (fds[i + 1].revents) rv_read_pending(s, i);
        if (fds[0].revents & POLLIN) rv_accept_new(s, lfd);
    }
    free(fds);
    close(lfd);
}

/* ------------------------------------------------------------------ other ranks */

/* getaddrinfo of MASTER_ADDR:MASTER_PORT for sockets of `socktype`. */
static int rv_resolve_master(const DistEnv *env, int socktype, struct addrinfo **res) {
    char port[16];
    snprintf(port, sizeof port, "%d", env->master_port);
    struct addrinfo hints;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = socktype;
    return getaddrinfo(env->master_addr, port, &hints, res);
}

/* One connection attempt to MASTER_ADDR:MASTER_PORT: the fd or -1. */
static int rv_connect_once(const DistEnv *env) {
    struct addrinfo *res = NULL;
    int rc = rv_resolve_master(env, SOCK_STREAM, &res);
    if (rc != 0) {
        if (rc == EAI_AGAIN) return -1;
        die("MASTER_ADDR %s: %s\n---> HINT: check the host name of rank 0's machine",
            env->master_addr, gai_strerror(rc));
    }
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

static const char *rv_status_text(uint32_t status) {
    switch (status) {
    case RV_WRONG_JOB: return "it serves another job (another CIFAR_JOB_ID, Slurm job or launcher)";
    case RV_WRONG_TOKEN: return "this rank's CIFAR_JOB_TOKEN differs from rank 0's";
    case RV_BAD_RANK: return "rank 0 expects another WORLD_SIZE (or this RANK is out of range)";
    case RV_DUPLICATE: return "rank 0 already served this rank: two processes got the same RANK";
    default: return "rank 0 closed the connection without answering";
    }
}

/* What a rank asks rank 0: the shared blob (send_len 0), or an exchange. */
typedef struct {
    uint32_t magic;
    const void *send; /* sent after rank 0's RV_OK */
    size_t send_len;
    void *recv;       /* received last */
    size_t recv_len;
} RvAsk;

/* One exchange on a connected socket: RV_OK with q->recv filled, another status,
 * or -1 when rank 0 closed without answering. */
static int rv_ask(const DistEnv *env, int fd, const RvAsk *q, double deadline) {
    unsigned char hello[RENDEZVOUS_HELLO_BYTES], reply[RENDEZVOUS_REPLY_BYTES];
    rendezvous_hello_encode(env, (uint32_t)q->recv_len, hello);
    put_u32(hello, q->magic);
    if (rv_io_all(env, fd, hello, sizeof hello, 1, deadline) != 0 ||
        rv_io_all(env, fd, reply, sizeof reply, 0, deadline) != 0 || get_u32(reply) != q->magic)
        return -1;
    uint32_t status = get_u32(reply + 4);
    if (status != RV_OK) return (int)status;
    if (q->send_len && rv_io_all(env, fd, (void *)q->send, q->send_len, 1, deadline) != 0) return -1;
    return rv_io_all(env, fd, q->recv, q->recv_len, 0, deadline) == 0 ? RV_OK : -1;
}

static void rv_fetch(const DistEnv *env, const RvAsk *q, double timeout_s) {
    double deadline = rv_now() + timeout_s, stop_since = 0;
    int last = -2; /* nothing answered yet */
    for (;;) {
        rv_stop_check(env, &stop_since);
        if (rv_now() > deadline)
            die("rank %d: timed out after %g s connecting to rank 0 at %s:%d%s%s\n"
                "---> HINT: check MASTER_ADDR/MASTER_PORT, the job identity (CIFAR_JOB_ID, "
                "CIFAR_JOB_TOKEN) and that rank 0 is running",
                env->rank, timeout_s, env->master_addr, env->master_port,
                last == -2 ? "" : ": the last answer: ", last == -2 ? "" : rv_status_text((uint32_t)last));
        int fd = rv_connect_once(env);
        if (fd >= 0) {
            int status = rv_ask(env, fd, q, deadline);
            close(fd);
            if (status == RV_OK) return;
            if (status == RV_BAD_RANK || status == RV_DUPLICATE)
                die("rank %d: rank 0 at %s:%d refused this rank: %s", env->rank, env->master_addr,
                    env->master_port, rv_status_text((uint32_t)status));
            /* Our job's identity but another token: no wait makes it ours (an impostor
             * that knows CIFAR_JOB_ID holds the port, or the tokens differ). */
            if (status == RV_WRONG_TOKEN)
                die("rank %d: the rendezvous at %s:%d refused this rank: %s ---> HINT: give every "
                    "rank the same CIFAR_JOB_TOKEN; if this rank's is right, what listens there "
                    "knows the job's CIFAR_JOB_ID but is not its rank 0",
                    env->rank, env->master_addr, env->master_port,
                    rv_status_text((uint32_t)status));
            if (status != last && (status >= 0 || last == -2))
                log_warn("rank %d: rendezvous at %s:%d refused: %s; retrying until the timeout",
                         env->rank, env->master_addr, env->master_port, rv_status_text((uint32_t)status));
            if (status >= 0 || last == -2) last = status; /* a refusal says more than a close */
        }
        usleep(100 * 1000);
    }
}

int rendezvous_route_address(const DistEnv *env, char *buf, size_t len) {
    struct addrinfo *res = NULL;
    int rc = rv_resolve_master(env, SOCK_DGRAM, &res);
    if (rc != 0) {
        snprintf(buf, len, "MASTER_ADDR %s: %s", env->master_addr, gai_strerror(rc));
        return -1;
    }
    int ok = -1, err = 0;
    for (struct addrinfo *a = res; a && ok != 0; a = a->ai_next) {
        /* a UDP socket's connect sends nothing: the kernel only picks the route */
        int fd = socket(a->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
        struct sockaddr_storage self;
        socklen_t sl = sizeof self;
        if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) == 0 &&
            getsockname(fd, (struct sockaddr *)&self, &sl) == 0 &&
            getnameinfo((struct sockaddr *)&self, sl, buf, (socklen_t)len, NULL, 0, NI_NUMERICHOST) == 0)
            ok = 0;
        else
            err = errno;
        if (fd >= 0) close(fd);
    }
    freeaddrinfo(res);
    if (ok != 0) snprintf(buf, len, "no route to MASTER_ADDR %s: %s", env->master_addr, strerror(err));
    return ok;
}

void rendezvous_share(const DistEnv *env, void *blob, size_t len, double timeout_s) {
    if (len > RENDEZVOUS_MAX_BLOB)
        die("rendezvous: a blob of %zu bytes (at most %d)", len, RENDEZVOUS_MAX_BLOB);
    if (env->world_size == 1) return;
    if (env->rank != 0) {
        RvAsk q = {RENDEZVOUS_MAGIC, NULL, 0, blob, len};
        rv_fetch(env, &q, timeout_s);
        return;
    }
    Server *s = rv_server_new(env, RENDEZVOUS_MAGIC, len);
    s->blob = blob;
    rv_serve(s, timeout_s);
    rv_server_free(s);
}

void rendezvous_exchange(const DistEnv *env, const void *mine, void *theirs, size_t entry,
                         double timeout_s) {
    const size_t w = (size_t)env->world_size, len = w * entry;
    if (entry == 0 || entry > RENDEZVOUS_MAX_ENTRY || w > RENDEZVOUS_MAX_TABLE / len) /* W * len bytes */
        die("rendezvous: an exchange of %zu-byte entries between %zu ranks (at most %d bytes, "
            "%zu MiB in all at rank 0)", entry, w, RENDEZVOUS_MAX_ENTRY, RENDEZVOUS_MAX_TABLE >> 20);
    if (w == 1) {
        memcpy(theirs, mine, entry);
        return;
    }
    if (env->rank != 0) {
        RvAsk q = {RENDEZVOUS_EXCHANGE_MAGIC, mine, len, theirs, len};
        rv_fetch(env, &q, timeout_s);
        return;
    }
    Server *s = rv_server_new(env, RENDEZVOUS_EXCHANGE_MAGIC, len);
    s->entry = entry;
    s->table = xmalloc(w * len);
    memcpy(s->table, mine, len); /* row 0: rank 0's own */
    s->parked = xmalloc(w * sizeof *s->parked);
    for (size_t r = 0; r < w; r++) s->parked[r] = -1;
    rv_serve(s, timeout_s);
    rv_send_entries(s, theirs);
    rv_server_free(s);
}
