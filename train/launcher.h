/* launcher.h: cifar-train's torchrun equivalent. It starts the workers of this
 * node as fresh processes (fork + exec of this binary, never a fork that keeps
 * running: BLAS/OpenMP pools, CUDA contexts and LMDB environments do not survive
 * fork), watches them, and when one fails stops the rest and restarts the group.
 *
 * cifar-train's main does:
 *     LaunchOptions lo;
 *     launch_options_init(&lo);
 *     if (launcher_parse_args(&lo, &argc, argv, err, sizeof err) != 0) die_usage("%s", err);
 *     if (launcher_wanted(&lo, &env)) return launcher_run(&lo, argc, argv);
 *     ... parse the remaining argv and train as a worker ...
 *
 * Each worker gets RANK = node_rank * N + local_rank, LOCAL_RANK, WORLD_SIZE =
 * nnodes * N, LOCAL_WORLD_SIZE = N, MASTER_ADDR, MASTER_PORT, CIFAR_RUN_ID (new
 * for every attempt: "<launcher pid>-<random>-a<attempt>"), CIFAR_RESTART_COUNT
 * and TORCHELASTIC_RESTART_COUNT, CIFAR_PERMANENT_EXIT_STATUS (check.h: a failure
 * no restart can fix exits with it, and the launcher then gives up at once) and
 * CIFAR_RUN_DIR_LOCKED_BY when run_dir_locked, CIFAR_FAILURE_NOTES (check.h: a
 * permanent failure met by every rank is printed once); it runs in its own process group and gets
 * SIGTERM if the launcher dies (PR_SET_PDEATHSIG; launcher_run must then run on
 * the main thread, which it does in cifar-train).
 *
 * Static jobs (--master-addr/--master-port, --node-rank): every node runs its own
 * launcher; a failure restarts the local group, whose peers on other nodes fail
 * in their next collective (NCCL error or CIFAR_COMM_TIMEOUT) and are restarted
 * by their own launchers.
 *
 * Rendezvous jobs (--rdzv-endpoint HOST:PORT, torchrun's c10d): the launchers are
 * node agents that meet in rounds decided by the store one of them serves
 * (agent_store.h): round R has a membership, node ranks and a world size; every
 * worker of the round gets CIFAR_RDZV_ROUND = TORCHELASTIC_RESTART_COUNT =
 * CIFAR_RESTART_COUNT = R, CIFAR_JOB_ID (the job), GROUP_RANK/GROUP_WORLD_SIZE
 * (the node's rank, the nodes), MASTER_ADDR = HOST, MASTER_PORT (chosen for the
 * round) and CIFAR_RUN_ID "<hash of the job id>-r<R>" (the same on every node). A
 * worker failure or a lost agent anywhere stops every node's workers and a new
 * round starts; a permanent failure, restarts exhausted or a signal end the job
 * on every node with the reason. */
#ifndef CIFAR_LAUNCHER_H
#define CIFAR_LAUNCHER_H

#include <stddef.h>

#include "comm/comm.h"
#include "signals.h"
#include "worker_logs.h"

#define LAUNCH_NPROC_GPU (-1) /* --nproc-per-node gpu|auto: one per visible GPU */

typedef struct {
    int nproc_per_node;      /* N >= 1, or LAUNCH_NPROC_GPU (at least 1 process) */
    int nnodes, node_rank;   /* default 1, 0 */
    char master_addr[256];   /* default 127.0.0.1 */
    int master_port;         /* 0: a free port on 127.0.0.1 (single node only) */
    int max_restarts;        /* default 3 */
    double grace_seconds;    /* SIGTERM -> SIGKILL delay when stopping workers (10) */
    int given;               /* a launcher option was on the command line */
    const char *exe;         /* program the workers exec; NULL: /proc/self/exe */
    int (*count_gpus)(void); /* NULL: launcher_count_gpus */
    int run_dir_locked;      /* the caller holds the run folder's lock: tell the workers */
    char failure_notes[256]; /* set by launcher_run: the workers' CIFAR_FAILURE_NOTES file */
    SignalSet signals;       /* handled and passed on to the workers (0: SIGINT, SIGTERM) */
    WorkerLogOptions logs;   /* --log-dir, --redirects, --tee, --local-ranks-filter */
    /* rendezvous jobs */
    int nnodes_min;          /* --nnodes MIN:MAX (nnodes holds MAX); MIN = MAX for --nnodes N */
    char rdzv_host[256];     /* --rdzv-endpoint HOST[:PORT]; empty: a static job */
    int rdzv_port;           /* default 29400 (torchrun's) */
    char rdzv_id[128];       /* --rdzv-id; else CIFAR_JOB_ID */
    double rdzv_timeout;     /* --rdzv-timeout: wait for more than MIN nodes (30 s) */
    int standalone;          /* --standalone: one node */
    int node_rank_given, master_given; /* static-only options seen */
    const char *run_dir;     /* rendezvous jobs: the store's agent (node 0) takes its lock */
} LaunchOptions;

/* Set in the workers' environment to the launcher's pid when it holds the run
 * folder's lock (run_dir_lock): their rank 0 must not take it again. */
#define RUN_DIR_LOCKED_VAR "CIFAR_RUN_DIR_LOCKED_BY"

void launch_options_init(LaunchOptions *o);

/* Remove the launcher options from argv in place ("--x V" and "--x=V", dashes or
 * underscores: --nproc-per-node, --nnodes, --node-rank, --master-addr,
 * --master-port, --max-restarts, --log-dir, --redirects, --tee, --local-ranks-filter,
 * --rdzv-endpoint, --rdzv-id, --rdzv-backend, --rdzv-timeout, and the flag
 * --standalone) and store them in *o; everything else keeps its order;
 * argv[*argc] stays NULL. Stops at "--". Other torchrun options (--rdzv-conf,
 * --monitor-interval, --role, ...) are refused naming them. 0, or -1 with a
 * reason in err. */
int launcher_parse_args(LaunchOptions *o, int *argc, char **argv, char *err, size_t errlen);

/* 1 when this process should launch workers: launcher options were given and the
 * environment does not already make it a worker (torchrun, srun, mpirun, or our
 * own launcher). Warns when the options are ignored for that reason. */
int launcher_wanted(const LaunchOptions *o, const DistEnv *env);

/* GPUs this process may use: CUDA_VISIBLE_DEVICES entries, else the driver's
 * /proc/driver/nvidia/gpus; 0 in a build without CUDA. */
int launcher_count_gpus(void);

/* 1 for a rendezvous job (--rdzv-endpoint): node ranks come from the rounds. */
int launcher_is_rendezvous(const LaunchOptions *o);

/* Run argv (launcher options already removed; argv[0] is kept as the workers'
 * argv[0]) as this node's workers until they all exit 0 (returns 0), restarts
 * run out or a worker fails permanently (exit status 2 or EXIT_STATUS_PERMANENT:
 * no restart; logs the first failed rank and its exit code or signal, returns 1), or
 * the launcher gets a signal of o->signals (passed on to the workers, which write a
 * snapshot and stop; returns 128 + signal).
 * Bad options return 2 with a message. No worker outlives the call. */
int launcher_run(const LaunchOptions *opt, int argc, char **argv);

#endif
