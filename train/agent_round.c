/* agent_round.c: a node agent's part in the rounds of a rendezvous job (agent_round.h). */
#include "agent_round.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <unistd.h>

#include "comm/sha256.h"
#include "core/check.h"
#include "format/checkpoint.h"

/* How long a round may take to form before the job gives up: torchrun's join
 * timeout is 600 s; ours scales with --rdzv-timeout, at least a minute. */
static double join_timeout(const LaunchOptions *o) {
    double t = 10 * o->rdzv_timeout;
    return t < 60 ? 60 : t;
}

static void job_identity(AgentRound *a, const LaunchOptions *o) {
    const char *env = getenv("CIFAR_JOB_ID");
    if (o->rdzv_id[0])
        snprintf(a->job_id, sizeof a->job_id, "%s", o->rdzv_id);
    else if (env && *env)
        snprintf(a->job_id, sizeof a->job_id, "%.100s", env);
    else {
        snprintf(a->job_id, sizeof a->job_id, "rdzv-%.100s-%d", o->rdzv_host, o->rdzv_port);
        log_warn("this job has no identity beyond its --rdzv-endpoint: give every node the same "
                 "--rdzv-id (or CIFAR_JOB_ID), and CIFAR_JOB_TOKEN, to shut out other jobs");
    }
}

/* "<12 hex digits of the job id's hash>-r<round>": the same on every node of the
 * round, another for every round (the shared-memory segment, the rank board). */
static void run_id_for(AgentRound *a) {
    static const char prefix[] = "cifar-run-id/v1\n";
    unsigned char h[SHA256_BYTES];
    sha256_two(prefix, sizeof prefix - 1, a->job_id, strlen(a->job_id), h);
    snprintf(a->run_id, sizeof a->run_id, "%02x%02x%02x%02x%02x%02x-r%d", h[0], h[1], h[2], h[3],
             h[4], h[5], a->round);
}

/* Node 0's agent holds the run folder's lock for the whole job, as in a static job;
 * its workers inherit the descriptor (main.c's launcher_lock_run_dir). */
static void lock_run_dir(LaunchOptions *o) {
    if (!o->run_dir) return;
    int fd = run_dir_lock(o->run_dir);
    CHECK_STDIO(fcntl(fd, F_SETFD, 0) == 0, o->run_dir);
    o->run_dir_locked = 1;
}

static void set_end(AgentRound *a, int status, const char *reason);

int agent_round_begin(AgentRound *a, LaunchOptions *o, const volatile sig_atomic_t *signal) {
    memset(a, 0, sizeof *a);
    a->o = o;
    a->signal = signal;
    job_identity(a, o);
    AgentStoreConfig cfg;
    memset(&cfg, 0, sizeof cfg);
    snprintf(cfg.host, sizeof cfg.host, "%s", o->rdzv_host);
    cfg.port = o->rdzv_port;
    cfg.nnodes_min = o->nnodes_min;
    cfg.nnodes_max = o->nnodes;
    cfg.rdzv_timeout = o->rdzv_timeout;
    cfg.join_timeout = join_timeout(o);
    cfg.max_restarts = o->max_restarts;
    cfg.nproc = o->nproc_per_node;
    agent_identity(&cfg.id, a->job_id, getenv("CIFAR_JOB_TOKEN"));
    if (getrandom(cfg.nonce, sizeof cfg.nonce, 0) != (ssize_t)sizeof cfg.nonce)
        die("getrandom: cannot draw the rendezvous store's nonce");
    char why[200];
    a->store = agent_store_start(&cfg, why, sizeof why);
    agent_client_init(&a->client, o->rdzv_host, o->rdzv_port, &cfg.id, o->nproc_per_node);
    a->client.stop = signal;
    if (a->store) {
        memcpy(a->client.store_nonce, cfg.nonce, sizeof cfg.nonce);
        log_info("serving the rendezvous store at %s:%d: this node is node 0 of every round",
                 o->rdzv_host, o->rdzv_port);
        lock_run_dir(o);
    } else {
        log_info("joining the rendezvous store at %s:%d (%s here)", o->rdzv_host, o->rdzv_port, why);
    }
    int rc = agent_client_connect(&a->client, agent_now() + cfg.join_timeout, why, sizeof why);
    if (rc == 0) return 0;
    if (*signal) {
        set_end(a, 128 + *signal, "");
        agent_round_end(a);
        return -1;
    }
    if (rc == -2)
        log_error("the rendezvous store at %s:%d refused this node: %s", o->rdzv_host,
                  o->rdzv_port, why);
    else
        log_error("no rendezvous store answered at %s:%d within %g s\n---> HINT: start the node that "
                  "owns %s with the same --rdzv-endpoint (it serves the store), and check the "
                  "address and the port", o->rdzv_host, o->rdzv_port, cfg.join_timeout, o->rdzv_host);
    agent_round_end(a);
    return -1;
}

static void set_end(AgentRound *a, int status, const char *reason) {
    a->ended = 1;
    a->end_status = status;
    snprintf(a->reason, sizeof a->reason, "%s", reason);
}

static void handle(AgentRound *a, const AgentMsg *m) {
    const char *text = m->len > 4 ? (const char *)m->payload + 4 : "";
    uint32_t first = m->len >= 4 ? agent_get_u32(m->payload) : 0;
    if (m->type == STORE_END) {
        set_end(a, (int)first, text);
    } else if (m->type == STORE_STOP && (int)first == a->round && !a->stop) {
        a->stop = 1;
        snprintf(a->reason, sizeof a->reason, "%s", text);
    }
}

void agent_round_poll(AgentRound *a) {
    AgentMsg m;
    char why[200];
    while (!a->lost && !a->ended) {
        int rc = agent_client_poll(&a->client, 0, &m, why, sizeof why);
        if (rc == 0) return;
        if (rc < 0) {
            a->lost = 1;
            snprintf(a->reason, sizeof a->reason, "%s", why);
            return;
        }
        handle(a, &m);
    }
}

/* The store went silent or closed: try to reach it again for --rdzv-timeout.
 * 1 back (join again), 0 gone (the job ends here with the line). */
static int reconnect(AgentRound *a) {
    const LaunchOptions *o = a->o;
    log_warn("the rendezvous store at %s:%d: %s; trying to reach it again for %g s", o->rdzv_host,
             o->rdzv_port, a->reason, o->rdzv_timeout);
    char why[200];
    int rc = agent_client_connect(&a->client, agent_now() + o->rdzv_timeout, why, sizeof why);
    if (rc == 0) {
        a->lost = 0;
        return 1;
    }
    if (*a->signal) {
        set_end(a, 128 + *a->signal, "");
        return 0;
    }
    char line[AGENT_MAX_PAYLOAD];
    if (rc == -2)
        snprintf(line, sizeof line, "the rendezvous store at %s:%d refused this node again: %.300s",
                 o->rdzv_host, o->rdzv_port, why);
    else
        snprintf(line, sizeof line, "the rendezvous store at %s:%d is gone (%.200s, and no answer for "
                 "%g s more; it lived on that host's agent): rerun every node to resume from the "
                 "last snapshot", o->rdzv_host, o->rdzv_port, a->reason, o->rdzv_timeout);
    set_end(a, 1, line);
    return 0;
}

/* Waits for the store's word (STOP, END) or its loss, or the launcher's signal. */
static void wait_word(AgentRound *a) {
    AgentMsg m;
    char why[200];
    while (!a->stop && !a->ended && !a->lost && !*a->signal) {
        int rc = agent_client_poll(&a->client, 100, &m, why, sizeof why);
        if (rc < 0) {
            a->lost = 1;
            snprintf(a->reason, sizeof a->reason, "%s", why);
        } else if (rc == 1) {
            handle(a, &m);
        }
    }
}

static void leave(AgentRound *a, int sig) {
    agent_client_report(&a->client, AGENT_LEAVING, (uint32_t)a->round, 1, (uint32_t)sig, "");
    set_end(a, 128 + sig, "");
    /* the store tells the others; this agent goes (the store's own lingers in agent_round_end) */
}

static int round_from(AgentRound *a, const AgentMsg *m) {
    if (m->len < 24 || m->len - 24 >= 256) return -1;
    uint32_t v[6];
    for (int f = 0; f < 6; f++) v[f] = agent_get_u32(m->payload + 4 * f);
    if (v[2] < 1 || v[1] >= v[2] || v[3] != v[2] * (uint32_t)a->o->nproc_per_node ||
        v[5] < 1 || v[5] > 65535)
        return -1;
    a->round = (int)v[0];
    a->node_rank = (int)v[1];
    a->nnodes = (int)v[2];
    a->world_size = (int)v[3];
    a->failures = (int)v[4];
    a->master_port = (int)v[5];
    a->client.round = a->round;
    a->stop = a->reported = 0;
    run_id_for(a);
    return 0;
}

int agent_round_next(AgentRound *a) {
    for (;;) {
        if (a->ended) return 0;
        if (a->lost && !reconnect(a)) return 0;
        a->stop = 0;
        if (agent_client_report(&a->client, AGENT_JOIN, 0, 0, 0, NULL) != 0) {
            a->lost = 1;
            snprintf(a->reason, sizeof a->reason, "its connection broke");
            continue;
        }
        AgentMsg m;
        char why[200];
        while (!a->ended && !a->lost) {
            if (*a->signal) {
                leave(a, *a->signal);
                return 0;
            }
            int rc = agent_client_poll(&a->client, 100, &m, why, sizeof why);
            if (rc < 0) {
                a->lost = 1;
                snprintf(a->reason, sizeof a->reason, "%s", why);
            } else if (rc == 1 && m.type == STORE_ROUND) {
                if (round_from(a, &m) == 0) return 1;
                set_end(a, 1, "the rendezvous store sent a malformed round");
            } else if (rc == 1) {
                handle(a, &m); /* a STOP of a round already left: ignored */
            }
        }
    }
}

void agent_round_report(AgentRound *a, int permanent, int status, const char *reason) {
    if (a->reported) return;
    a->reported = 1;
    if (permanent)
        agent_client_report(&a->client, AGENT_PERMANENT, (uint32_t)a->round, 1, (uint32_t)status, reason);
    else
        agent_client_report(&a->client, AGENT_FAILED, (uint32_t)a->round, 0, 0, reason);
}

int agent_round_settle(AgentRound *a, int signal, int all_ok) {
    if (a->ended) return 0;
    if (signal) {
        leave(a, signal);
        return 0;
    }
    if (!a->stop && !a->lost && all_ok &&
        agent_client_report(&a->client, AGENT_DONE, (uint32_t)a->round, 0, 0, NULL) != 0) {
        a->lost = 1;
        snprintf(a->reason, sizeof a->reason, "its connection broke");
    }
    wait_word(a);
    if (!a->ended && !a->stop && !a->lost && *a->signal) {
        leave(a, *a->signal);
        return 0;
    }
    if (a->stop) log_warn("round %d stops: %s", a->round, a->reason);
    return !a->ended;
}

int agent_round_end(AgentRound *a) {
    if (a->ended && a->end_status != 0 && a->reason[0]) log_error("%s", a->reason);
    agent_client_close(&a->client);
    agent_store_stop(a->store);
    a->store = NULL;
    return a->ended ? a->end_status : 1;
}
