/* comm.h: the communicator the training loop talks to (all-reduce average,
 * broadcast, barrier), whichever transport sits behind it:
 *   - COMM_SINGLE: world size 1, every call is a no-op;
 *   - COMM_SHM: CPU worker processes on one machine, a POSIX shared-memory
 *     segment named after the run id, sums in rank order (deterministic);
 *   - COMM_NCCL: GPU workers (comm_nccl.h, CUDA builds only); the unique id is
 *     sent from rank 0 to the others over TCP (rendezvous.h: MASTER_ADDR:MASTER_PORT,
 *     only to ranks that present the job's identity and token);
 *   - COMM_MPI: CPU ranks started by mpirun or srun --mpi=pmix, on any number of
 *     machines (comm_mpi.c in libcifar-mpi.so, dlopened: built when Open MPI is
 *     found); sums in rank order like COMM_SHM, so both give the same bits;
 *   - COMM_GLOO: CPU ranks on any number of machines over TCP (comm_gloo.cc in
 *     libcifar-gloo.so, dlopened: built when Gloo's headers are found); the pairs'
 *     addresses go through rank 0 like NCCL's id (rendezvous.h); sums in rank order
 *     like COMM_SHM and COMM_MPI, same bits.
 * Every blocking call gives up after the timeout (a peer stopped or died) and
 * fails with a clear message, so the launcher can restart the group. */
#ifndef CIFAR_COMM_H
#define CIFAR_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/settings.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { COMM_SINGLE, COMM_SHM, COMM_NCCL, COMM_MPI, COMM_GLOO } CommKind;

/* "single", "shm", "nccl", "mpi", "gloo" (metrics lines and logs). */
const char *comm_kind_name(CommKind kind);
/* The inverse for --comm: 0 and *kind set, -1 for an unknown name. */
int comm_kind_parse(const char *name, CommKind *kind);

/* Where this process sits in the job (torchrun's variables, or Slurm's/Open MPI's). */
typedef struct {
    int rank, world_size;
    int local_rank, local_world_size;
    int restart_count;        /* TORCHELASTIC_RESTART_COUNT / CIFAR_RESTART_COUNT */
    char master_addr[256];
    int master_port;
    char run_id[64];          /* CIFAR_RUN_ID (set by the launcher), else derived from the port */
    int from_env;             /* 1 when the variables were found */
    int mpi_launched;         /* started by mpirun (OMPI_COMM_WORLD_RANK) or a PMI/PMIx
                                 launcher such as srun --mpi=pmix (PMIX_RANK, PMI_RANK) */
    /* The job's identity, the same on every rank: CIFAR_JOB_ID, else
     * TORCHELASTIC_RUN_ID and its restart count, else SLURM_JOB_ID.SLURM_STEP_ID
     * (each srun is a new step), else PMIX_NAMESPACE
     * (mpirun), else the launcher's CIFAR_RUN_ID on one node, else
     * "MASTER_ADDR:MASTER_PORT" (job_id_weak = 1: nothing tells two jobs apart). */
    char job_id[128];
    int job_id_weak;
    /* SHA-256 of CIFAR_JOB_TOKEN when the user set one (token_from_user = 1), else
     * SHA-256 of a fixed prefix and job_id. Rendezvous hellos must carry it. */
    unsigned char job_token[32];
    int token_from_user;
    /* A signal handler's stop flag (0, or the signal that asked to stop; cifar-train's
     * SIGTERM/SIGINT), NULL when none: every wait for a peer checks it (comm_stop_due). */
    const volatile int *stop_signal;
    CommSettings comm;        /* CIFAR_COMM_TIMEOUT, CIFAR_COMM_SLOT_BYTES, CIFAR_RENDEZVOUS_BIND */
} DistEnv;

/* How long a wait for a peer goes on after a stop signal: a healthy collective ends
 * well within it (the rank then snapshots as usual at its next step); one waiting
 * for a lost or stopped peer never does, and Slurm sends SIGKILL ~30 s after SIGTERM. */
#define COMM_STOP_GRACE_SECONDS 0.5
/* Called by every wait loop at least every 100 ms with the clock (seconds) and a
 * per-wait `since` (0 at the start of the wait): the signal number once a stop
 * signal has been pending for COMM_STOP_GRACE_SECONDS, else 0. The caller then
 * gives up the wait and exits 128 + that number. */
static inline int comm_stop_due(const volatile int *stop, double now, double *since) {
    if (!stop || !*stop) return 0;
    if (*since == 0) *since = now;
    return now - *since >= COMM_STOP_GRACE_SECONDS ? *stop : 0;
}

/* Read RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/MASTER_ADDR/MASTER_PORT,
 * else OMPI_COMM_WORLD_* (mpirun), else SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID
 * (Open MPI's variables come first: mpirun inside an sbatch script inherits the
 * batch step's SLURM_PROCID=0). With none set: rank 0 of 1, from_env = 0.
 * Also the job identity and token (see DistEnv). Returns -1 with a reason on
 * inconsistent values. */
int dist_env_read(DistEnv *env, char *err, size_t errlen);

/* The communicator of a CPU rank when --comm does not say (comm_env.c): COMM_MPI when
 * mpirun or srun --mpi=pmix started it; COMM_GLOO when torchrun did (TORCHELASTIC_RUN_ID
 * without the launcher's CIFAR_RUN_ID) or the job spans several nodes (LOCAL_WORLD_SIZE <
 * WORLD_SIZE: the launcher's --nnodes); else COMM_SHM (one machine). */
CommKind comm_kind_default_cpu(const DistEnv *env);

typedef struct Comm Comm;

/* Create the communicator: COMM_SINGLE when world_size == 1; COMM_SHM for CPU
 * workers (all ranks must be on this machine); COMM_MPI for CPU ranks of an MPI
 * job (MPI build; libcifar-mpi.so is loaded here); COMM_GLOO for CPU ranks
 * anywhere (libcifar-gloo.so is loaded here); COMM_NCCL needs a CUDA build
 * and the device already selected. Dies with a clear message on failure. */
Comm *comm_create(CommKind kind, const DistEnv *env);
void comm_destroy(Comm *c);
CommKind comm_kind(const Comm *c);
int comm_rank(const Comm *c);
int comm_world_size(const Comm *c);

/* In place: buf = mean over ranks of buf (float32, host memory for SHM, MPI and GLOO,
 * device memory for NCCL: on the legacy default stream; comm_allreduce_mean_on_stream
 * takes the caller's). SHM, MPI and GLOO: sum in rank order 0..W-1, then divide by W,
 * so all three give every rank the same bits. */
void comm_allreduce_mean(Comm *c, float *buf, size_t n);
/* NCCL, device memory: comm_allreduce_mean and comm_broadcast enqueued on the CUDA
 * stream `cuda_stream` (a cudaStream_t), after the work already in it; they return
 * once done. The CUDA engine passes its own stream. A no-op on COMM_SINGLE; dies on
 * COMM_SHM (host memory only). */
void comm_allreduce_mean_on_stream(Comm *c, float *dev_buf, size_t n, void *cuda_stream);
void comm_broadcast_on_stream(Comm *c, void *dev_buf, size_t bytes, int root, void *cuda_stream);
/* In place sum of doubles in HOST memory on every transport (metrics, counts). */
void comm_allreduce_sum_f64(Comm *c, double *buf, size_t n);
/* In place: every rank gets root's bytes (host memory for SHM, device for NCCL). */
void comm_broadcast(Comm *c, void *buf, size_t bytes, int root);
/* Host-memory broadcast on every transport (small control data). */
void comm_broadcast_host(Comm *c, void *buf, size_t bytes, int root);
void comm_barrier(Comm *c);

/* Seconds this process spent inside collectives (waiting for the others included;
 * on NCCL the host's view, from the enqueue to the end of the collective: the CUDA
 * engine drains its stream before it calls the gradient all-reduce, so its own
 * forward and backward are not in it). The epoch loop subtracts it from a step's
 * time: its compute time. */
double comm_seconds_in_collectives(const Comm *c);

/* The progress board (RUN_DIR/ranks/rank-R, comm.c): every rank records its pid,
 * host, last step and the collectives it entered, so that a rank whose collective
 * times out names the one that has not entered it. comm_board_open starts it
 * (nothing with world size 1; a board that cannot be written only warns);
 * comm_board_step records the step. */
void comm_board_open(Comm *c, const char *run_dir, const char *run_id);
void comm_board_step(Comm *c, int64_t step);
/* For a timeout message of any transport: "\nwaiting for rank R (pid P on host H,
 * last step S): it has not entered this collective ..." from the board of this
 * process's communicator, or "" when there is none or every rank entered. */
void comm_blame_laggard(char *buf, size_t len);

/* Remove the shared-memory segment of a run ("/cifar-<run_id>") if it is still
 * there (a rank died before rank 0 unlinked it). The launcher calls it after
 * reaping a group; harmless when the segment is gone. */
void comm_shm_cleanup(const char *run_id);

#ifdef __cplusplus
}
#endif
#endif
