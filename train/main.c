/* cifar-train: data-parallel training from a cifar-prep LMDB.
 *
 * A process started with RANK/WORLD_SIZE/... in its environment (by our own
 * launcher, torchrun, srun or mpirun) is a worker and trains. Otherwise, with
 * launcher options (--nproc-per-node, --nnodes, ...) it becomes the launcher:
 * it starts the workers as fresh processes and restarts the group when one
 * fails. Alone and without them, it simply trains in this process. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include "core/check.h"
#include "core/omp_env.h"
#include "comm/comm.h"
#include "comm/comm_gloo.h"
#include "format/checkpoint.h"
#include "launcher.h"
#include "train.h"

/* The launcher of node 0 holds the run folder's lock for the whole job, across
 * restarts; its workers inherit the descriptor (so the lock outlives the
 * launcher until the last of them exits) and know not to take it again. */
static void launcher_lock_run_dir(LaunchOptions *lo, const TrainOptions *o) {
    lo->run_dir = o->run_dir; /* a rendezvous job: the store's agent, node 0, takes it */
    if (lo->node_rank != 0 || launcher_is_rendezvous(lo)) return;
    int fd = run_dir_lock(o->run_dir);
    CHECK_STDIO(fcntl(fd, F_SETFD, 0) == 0, o->run_dir); /* inherited by the workers */
    lo->run_dir_locked = 1;
}

/* A worker whose launcher (its parent) holds the run folder's lock. */
static int run_dir_locked_by_parent(void) {
    const char *v = getenv(RUN_DIR_LOCKED_VAR);
    return v && atoi(v) == (int)getppid();
}

/* A worker of a distributed job (our launcher, torchrun, srun, mpirun) tells a
 * permanent failure apart from one a restart may fix (README "Exit statuses");
 * a process training alone keeps exit 1 for both. */
static void worker_exit_statuses(const DistEnv *env) {
    char status[16];
    snprintf(status, sizeof status, "%d", EXIT_STATUS_PERMANENT);
    if (env->from_env) CHECK_STDIO(setenv(PERMANENT_STATUS_VAR, status, 0) == 0, PERMANENT_STATUS_VAR);
}

/* The workers get our argv, plus the data path when it came from stdin (they
 * have no stdin of their own to read it from). */
static int launch_workers(const LaunchOptions *lo, const TrainOptions *o, int argc, char **argv) {
    int has_path = 0;
    for (int i = 1; i < argc; i++)
        if (argv[i] == o->data_path) has_path = 1;
    if (has_path) return launcher_run(lo, argc, argv);
    char **args = xcalloc((size_t)argc + 2, sizeof *args);
    memcpy(args, argv, (size_t)argc * sizeof *args);
    args[argc] = (char *)o->data_path;
    int status = launcher_run(lo, argc + 1, args);
    free(args);
    return status;
}

/* CPU workers on several nodes use Gloo (their default): without libcifar-gloo.so,
 * say so before a worker starts, not once per worker and restart. */
static void refuse_cpu_nodes_without_gloo(const TrainOptions *o, int nnodes) {
    if (o->comm >= 0 && o->comm != COMM_GLOO) return; /* the worker judges --comm shm/mpi */
    const char *why = comm_gloo_library_error();
    if (why)
        die_usage("--nnodes %d on the CPU: the workers' Gloo communicator is not available: %s\n"
                  "---> HINT: install libgloo-dev (make deps) and rebuild, or start the CPU ranks "
                  "with mpirun -np N --hostfile H cifar-train ... (MPI)", nnodes, why);
}

int main(int argc, char **argv) {
    log_set_program("cifar-train");
    /* A closed log pipe (`cifar-train ... 2>&1 | head`) must not kill training: a
     * write to it then fails with EPIPE, the log goes silent and training goes
     * on to its snapshots. Inherited by the launcher's workers through exec. */
    signal(SIGPIPE, SIG_IGN);
    omp_env_prefer_passive(argc, argv);
    memory_limit_check((size_t)512 << 20);
    DistEnv env;
    char err[256];
    if (dist_env_read(&env, err, sizeof err) != 0) die_usage("%s", err);
    LaunchOptions lo;
    launch_options_init(&lo);
    if (launcher_parse_args(&lo, &argc, argv, err, sizeof err) != 0) die_usage("%s", err);
    TrainOptions o;
    train_options_parse(&o, argc, argv); /* --help and bad usage end here, before any launch */
    if (launcher_wanted(&lo, &env)) {
        if (lo.nnodes > 1 && (o.device == DEVICE_CPU || launcher_count_gpus() == 0))
            refuse_cpu_nodes_without_gloo(&o, lo.nnodes);
        launcher_lock_run_dir(&lo, &o);
        lo.signals = o.signals;
        return launch_workers(&lo, &o, argc, argv);
    }
    log_set_quiet(o.quiet);
    worker_exit_statuses(&env);
    train_install_signal_handlers(o.signals);
    env.stop_signal = &g_train_wait_stop; /* a stop signal ends every wait for a peer */
    return train_worker(&o, &env, run_dir_locked_by_parent());
}
