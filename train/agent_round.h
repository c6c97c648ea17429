/* agent_round.h: one node agent's part in the rounds of a rendezvous job
 * (--rdzv-endpoint; the store and the rules are in agent_store.h). The launcher
 * (launcher.c) drives it:
 *
 *     AgentRound a;
 *     if (agent_round_begin(&a, &o, &signal) != 0) return 1;   // serve or join the store
 *     while (agent_round_next(&a)) {                          // JOIN, wait for a ROUND
 *         ... start the workers with a.round, a.node_rank, a.nnodes, a.master_port ...
 *         ... while they run: agent_round_poll(&a) (stop when a.stop/a.ended/a.lost),
 *             agent_round_report(&a, ...) on the first failure ...
 *         if (!agent_round_settle(&a, signal_or_0, all_exited_0)) break;
 *     }
 *     return agent_round_end(&a);                             // the job's exit status
 *
 * Every line the job's end needs is printed here: the reason of the END, or that
 * the store at HOST:PORT is gone (after AGENT_DEAD_SECONDS without an answer, or
 * its connection closed, and --rdzv-timeout more seconds of trying to reconnect). */
#ifndef CIFAR_AGENT_ROUND_H
#define CIFAR_AGENT_ROUND_H

#include <signal.h>

#include "agent_client.h"
#include "agent_store.h"
#include "launcher.h"

typedef struct {
    AgentClient client;
    AgentStore *store;        /* served by this agent, else NULL */
    const LaunchOptions *o;
    const volatile sig_atomic_t *signal; /* the launcher's signal flag */
    char job_id[128];
    char run_id[64];          /* "<hash of the job id>-r<round>" */
    /* the round being run (ROUND) */
    int round, node_rank, nnodes, world_size, failures, master_port;
    /* what the store said since (or the connection) */
    int stop, ended, end_status, lost, reported;
    char reason[AGENT_MAX_PAYLOAD + 1];
} AgentRound;

/* Serves the store when this machine owns --rdzv-endpoint's address (then also
 * takes the run folder's lock, o->run_dir, as node 0's agent: o->run_dir_locked),
 * and connects to it. 0, or -1 after printing why (or after the launcher's signal:
 * agent_round_end then gave 128 + N, which the caller returns). */
int agent_round_begin(AgentRound *a, LaunchOptions *o, const volatile sig_atomic_t *signal);

/* Joins the next round and waits for it to close: 1 with the round's fields set,
 * 0 when the job is over (agent_round_end gives the status). */
int agent_round_next(AgentRound *a);

/* Reads the store's messages without waiting (beats when due). */
void agent_round_poll(AgentRound *a);

/* The first failure of this node's workers in the round, once: a permanent one
 * (exit status 2 or 3: status) ends the job, another makes a new round. */
void agent_round_report(AgentRound *a, int permanent, int status, const char *reason);

/* After the round's workers are all reaped: signal (the launcher's, or 0) ends
 * the job everywhere; all_ok reports this node done and waits for the others.
 * 1: another round follows; 0: the job is over. */
int agent_round_settle(AgentRound *a, int signal, int all_ok);

/* Closes the connection and stops the store (after its agents had the END);
 * returns the job's exit status. */
int agent_round_end(AgentRound *a);

#endif
