/* agent_client.c: a node agent's side of the rendezvous store (agent_client.h). */
#include "agent_client.h"

#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/check.h"

void agent_client_init(AgentClient *c, const char *host, int port, const AgentIdentity *id,
                       int nproc) {
    memset(c, 0, sizeof *c);
    c->fd = -1;
    snprintf(c->host, sizeof c->host, "%s", host);
    c->port = port;
    c->id = *id;
    c->nproc = nproc;
    if (getrandom(c->nonce, sizeof c->nonce, GRND_NONBLOCK) != (ssize_t)sizeof c->nonce) {
        struct timespec ts;
        clock_gettime(CLOCK_REALTIME, &ts);
        long long mix[2] = {(long long)ts.tv_nsec ^ (long long)ts.tv_sec << 20, (long long)getpid()};
        memcpy(c->nonce, mix, sizeof c->nonce);
    }
}

void agent_client_close(AgentClient *c) {
    if (c->fd >= 0) close(c->fd);
    c->fd = -1;
    c->got = 0;
}

/* Waits for fd to be ready until the deadline: 1 ready, 0 not. */
static int wait_fd(int fd, short events, double deadline) {
    for (;;) {
        double left = deadline - agent_now();
        if (left <= 0) return 0;
        struct pollfd p = {fd, events, 0};
        int rc = poll(&p, 1, left > 0.1 ? 100 : (int)(left * 1000) + 1);
        if (rc > 0) return 1;
        if (rc < 0 && errno != EINTR) return 0;
    }
}

/* One non-blocking connection attempt, finished before the deadline: fd or -1. */
static int connect_once(const AgentClient *c, double deadline) {
    struct addrinfo *res = NULL;
    if (agent_resolve(c->host, c->port, 0, &res) != 0) return -1;
    int fd = -1;
    for (struct addrinfo *a = res; a && fd < 0; a = a->ai_next) {
        fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
        if (fd < 0) continue;
        int rc = connect(fd, a->ai_addr, a->ai_addrlen);
        int err = 0;
        socklen_t el = sizeof err;
        if (rc != 0 && !(errno == EINPROGRESS && wait_fd(fd, POLLOUT, deadline) &&
                         getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &el) == 0 && err == 0)) {
            close(fd);
            fd = -1;
        }
    }
    freeaddrinfo(res);
    return fd;
}

static int send_hello(AgentClient *c) {
    unsigned char p[AGENT_HELLO_BYTES + AGENT_MAX_NAME];
    memcpy(p, c->id.job_hash, 32);
    memcpy(p + 32, c->id.token, 32);
    memcpy(p + 64, c->nonce, 16);
    memcpy(p + 80, c->store_nonce, 16);
    agent_put_u32(p + 96, (uint32_t)c->nproc);
    char name[256] = "";
    if (gethostname(name, sizeof name) != 0) snprintf(name, sizeof name, "?");
    name[sizeof name - 1] = '\0';
    size_t nl = strlen(name) > AGENT_MAX_NAME ? AGENT_MAX_NAME : strlen(name);
    memcpy(p + AGENT_HELLO_BYTES, name, nl);
    return agent_send(c->fd, AGENT_HELLO, p, AGENT_HELLO_BYTES + nl);
}

int agent_client_connect(AgentClient *c, double deadline, char *why, size_t whylen) {
    snprintf(why, whylen, "nothing answered at %s:%d", c->host, c->port);
    while (agent_now() < deadline && !(c->stop && *c->stop)) {
        agent_client_close(c);
        double attempt_end = agent_now() + AGENT_HELLO_SECONDS;
        c->fd = connect_once(c, attempt_end < deadline ? attempt_end : deadline);
        if (c->fd >= 0 && send_hello(c) == 0) {
            c->last_heard = c->last_beat = agent_now();
            AgentMsg m;
            char lost[200];
            int rc = 0;
            while (rc == 0 && agent_now() < attempt_end && !(c->stop && *c->stop))
                rc = agent_client_poll(c, 100, &m, lost, sizeof lost);
            if (rc == 1 && m.type == STORE_WELCOME) return 0;
            if (rc == 1 && (m.type == STORE_REFUSED || m.type == STORE_END)) {
                snprintf(why, whylen, "%s", m.len > 4 ? (const char *)m.payload + 4 : "refused");
                if (m.type == STORE_END) snprintf(why, whylen, "the job is over");
                agent_client_close(c);
                return -2;
            }
        }
        agent_client_close(c);
        struct timespec ts = {0, 200 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
    return -1;
}

int agent_client_report(AgentClient *c, uint32_t type, uint32_t a, int has_b, uint32_t b,
                        const char *text) {
    if (c->fd < 0) return -1;
    unsigned char p[AGENT_MAX_PAYLOAD];
    agent_put_u32(p, a);
    size_t n = 4;
    if (has_b) agent_put_u32(p + 4, b), n = 8;
    size_t tl = text ? strlen(text) : 0;
    if (tl > sizeof p - n) tl = sizeof p - n;
    if (tl) memcpy(p + n, text, tl);
    return agent_send(c->fd, type, p, n + tl);
}

static int client_lost(AgentClient *c, char *why, size_t whylen, const char *how) {
    snprintf(why, whylen, "%s", how);
    agent_client_close(c);
    return -1;
}

int agent_client_poll(AgentClient *c, int timeout_ms, AgentMsg *m, char *why, size_t whylen) {
    if (c->fd < 0) return client_lost(c, why, whylen, "not connected");
    double end = agent_now() + timeout_ms / 1000.0;
    for (;;) {
        double now = agent_now();
        if (now - c->last_beat >= AGENT_BEAT_SECONDS) {
            unsigned char p[4];
            agent_put_u32(p, (uint32_t)c->round);
            if (agent_send(c->fd, AGENT_BEAT, p, 4) != 0)
                return client_lost(c, why, whylen, "its connection broke");
            c->last_beat = now;
        }
        if (now - c->last_heard > AGENT_DEAD_SECONDS) {
            char how[64];
            snprintf(how, sizeof how, "no answer for %g s", AGENT_DEAD_SECONDS);
            return client_lost(c, why, whylen, how);
        }
        uint32_t type = 0, len = 0;
        size_t want = AGENT_HEADER_BYTES;
        if (c->got >= AGENT_HEADER_BYTES) {
            char bad[160];
            if (agent_header_check(c->in, &type, &len, bad, sizeof bad) != 0)
                return client_lost(c, why, whylen, bad);
            want += len;
        }
        if (c->got == want) {
            c->got = 0;
            c->last_heard = now;
            if (type == STORE_ALIVE) continue;
            m->type = type;
            m->len = len;
            memcpy(m->payload, c->in + AGENT_HEADER_BYTES, len);
            m->payload[len] = '\0';
            return 1;
        }
        ssize_t n = recv(c->fd, c->in + c->got, want - c->got, MSG_DONTWAIT);
        if (n > 0) {
            c->got += (size_t)n;
            continue;
        }
        if (n == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR))
            return client_lost(c, why, whylen, n == 0 ? "it closed the connection" : strerror(errno));
        double left = end - agent_now();
        if (left <= 0) return 0;
        int slice = left > 0.1 ? 100 : (int)(left * 1000) + 1;
        struct pollfd p = {c->fd, POLLIN, 0};
        if (poll(&p, 1, slice) < 0 && errno != EINTR) return client_lost(c, why, whylen, strerror(errno));
    }
}
