/* test_dist_env.c: dist_env_read (comm.h: ranks from torchrun's, Open MPI's and
 * Slurm's variables, the run id, the restart count), the job identity and token,
 * CIFAR_COMM_TIMEOUT's parse, and the CPU communicator chosen by default
 * (comm_kind_default_cpu). Moved out of test_comm.c, which keeps the collectives
 * between real processes and the rendezvous. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm.h"
#include "core/check.h"

#include "comm_env_vars.h"
#include "unit.h"

static void test_dist_env(void) {
    DistEnv e;
    char err[256];
    env_clear();
    CHECK(dist_env_read(&e, err, sizeof err) == 0 && e.rank == 0 && e.world_size == 1 &&
              e.from_env == 0 && e.local_world_size == 1 && e.master_port == 29500 &&
              strcmp(e.master_addr, "127.0.0.1") == 0,
          "defaults: %s", err);

    setenv("RANK", "3", 1);
    setenv("WORLD_SIZE", "8", 1);
    setenv("LOCAL_RANK", "1", 1);
    setenv("LOCAL_WORLD_SIZE", "2", 1);
    setenv("MASTER_ADDR", "node7", 1);
    setenv("MASTER_PORT", "1234", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == 0 && e.rank == 3 && e.world_size == 8 &&
              e.local_rank == 1 && e.local_world_size == 2 && e.from_env == 1 &&
              e.master_port == 1234 && strcmp(e.master_addr, "node7") == 0 &&
              e.restart_count == 2 && strcmp(e.run_id, "p1234-r2") == 0,
          "torchrun vars: %s run_id %s", err, e.run_id);
    setenv("CIFAR_RUN_ID", "77-ab/c", 1);
    setenv("CIFAR_RESTART_COUNT", "1", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == 0 && strcmp(e.run_id, "77-ab_c") == 0 &&
              e.restart_count == 1,
          "CIFAR_RUN_ID sanitized: %s", e.run_id);

    setenv("RANK", "8", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == -1 && strstr(err, "rank 8") != NULL,
          "rank >= world: %s", err);
    setenv("RANK", "x1", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == -1 && strstr(err, "RANK=x1") != NULL,
          "bad integer: %s", err);
    setenv("RANK", "1", 1);
    setenv("MASTER_PORT", "70000", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == -1 && strstr(err, "MASTER_PORT") != NULL,
          "bad port: %s", err);
    env_clear();
    setenv("RANK", "0", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == -1 && strstr(err, "WORLD_SIZE") != NULL,
          "RANK without WORLD_SIZE: %s", err);

    env_clear();
    setenv("SLURM_PROCID", "5", 1);
    setenv("SLURM_NTASKS", "8", 1);
    setenv("SLURM_LOCALID", "1", 1);
    setenv("SLURM_TASKS_PER_NODE", "4(x2)", 1);
    setenv("SLURM_JOB_ID", "991", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == 0 && e.rank == 5 && e.world_size == 8 &&
              e.local_rank == 1 && e.local_world_size == 4 && e.from_env &&
              strncmp(e.run_id, "slurm-991.", 10) == 0,
          "slurm: %s %s", err, e.run_id);

    env_clear();
    setenv("OMPI_COMM_WORLD_RANK", "2", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "3", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == 0 && e.rank == 2 && e.world_size == 3 &&
              e.local_rank == 2 && e.local_world_size == 3 && e.from_env,
          "open mpi: %s", err);
    env_clear();

    /* world size 1: every kind but NCCL is a no-op single communicator */
    DistEnv one;
    CHECK(dist_env_read(&one, err, sizeof err) == 0, "%s", err);
    Comm *c = comm_create(COMM_SHM, &one);
    float x[3] = {1.5f, -2.0f, 3.25f};
    double d[2] = {4.0, 5.0};
    comm_allreduce_mean(c, x, 3);
    comm_allreduce_sum_f64(c, d, 2);
    comm_barrier(c);
    comm_broadcast_host(c, x, sizeof x, 0);
    CHECK(comm_kind(c) == COMM_SINGLE && x[0] == 1.5f && x[2] == 3.25f && d[1] == 5.0,
          "single communicator is the identity");
    comm_destroy(c);
}

static int job_id_is(const char *want, int weak) {
    DistEnv e;
    char err[256];
    if (dist_env_read(&e, err, sizeof err) != 0) {
        fprintf(stderr, "dist_env_read: %s\n", err);
        return 0;
    }
    if (strcmp(e.job_id, want) != 0 || e.job_id_weak != weak)
        fprintf(stderr, "job id '%s' (weak %d), expected '%s' (weak %d)\n", e.job_id, e.job_id_weak,
                want, weak);
    return strcmp(e.job_id, want) == 0 && e.job_id_weak == weak;
}

static void token_of(unsigned char out[32], int *from_user) {
    DistEnv e;
    char err[256];
    CHECK(dist_env_read(&e, err, sizeof err) == 0, "%s", err);
    memcpy(out, e.job_token, 32);
    *from_user = e.token_from_user;
}

/* Job identity: the first of CIFAR_JOB_ID, TORCHELASTIC_RUN_ID, SLURM_JOB_ID.STEP,
 * PMIX_NAMESPACE, the single-node launcher's run id, else address:port (weak). */
static void test_job_identity(void) {
    env_clear();
    setenv("RANK", "0", 1);
    setenv("WORLD_SIZE", "2", 1);
    CHECK(job_id_is("addr:127.0.0.1:29500", 1), "nothing set: weak address identity");
    setenv("CIFAR_RUN_ID", "123-abc-a0", 1);
    CHECK(job_id_is("launcher:123-abc-a0", 0), "the launcher's run id on one node");
    setenv("LOCAL_WORLD_SIZE", "1", 1);
    CHECK(job_id_is("addr:127.0.0.1:29500", 1), "several launchers: their run ids differ");
    setenv("PMIX_NAMESPACE", "4242", 1);
    CHECK(job_id_is("pmix:4242", 0), "mpirun's namespace");
    setenv("SLURM_JOB_ID", "77", 1);
    setenv("SLURM_STEP_ID", "3", 1);
    CHECK(job_id_is("slurm:77.3", 0), "Slurm job and step");
    setenv("TORCHELASTIC_RUN_ID", "te1", 1);
    setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
    CHECK(job_id_is("torchelastic:te1-r2", 0), "torchrun's run id and restart");
    setenv("CIFAR_JOB_ID", "mine", 1);
    CHECK(job_id_is("user:mine", 0), "CIFAR_JOB_ID first");

    unsigned char a[32], b[32];
    int user_a = 0, user_b = 0;
    token_of(a, &user_a);
    static const unsigned char want[8] = {0xeb, 0x7e, 0x68, 0x45, 0x17, 0xb8, 0x39, 0x45};
    CHECK(memcmp(a, want, 8) == 0 && !user_a, "derived token = SHA-256(prefix, job id)");
    setenv("CIFAR_JOB_ID", "theirs", 1);
    token_of(b, &user_b);
    CHECK(memcmp(a, b, 32) != 0, "another job, another token");
    setenv("CIFAR_JOB_TOKEN", "s3cret", 1);
    token_of(b, &user_b);
    CHECK(user_b && memcmp(a, b, 32) != 0, "CIFAR_JOB_TOKEN replaces the derived token");

    env_clear();
    DistEnv e;
    char err[256];
    setenv("SLURM_PROCID", "0", 1); /* the batch step's, inherited by mpirun's ranks */
    setenv("SLURM_NTASKS", "1", 1);
    setenv("OMPI_COMM_WORLD_RANK", "1", 1);
    setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == 0 && e.rank == 1 && e.world_size == 2 &&
              e.mpi_launched,
          "mpirun inside sbatch: Open MPI's variables win (%s rank %d)", err, e.rank);
    env_clear();
    setenv("SLURM_PROCID", "1", 1);
    setenv("SLURM_NTASKS", "2", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == 0 && !e.mpi_launched, "plain srun: not MPI");
    setenv("PMIX_RANK", "1", 1);
    CHECK(dist_env_read(&e, err, sizeof err) == 0 && e.mpi_launched, "srun --mpi=pmix: MPI");
    env_clear();
}

static void test_timeout_parse(void) {
    CommSettings s;
    unsetenv("CIFAR_COMM_TIMEOUT");
    settings_comm_from_env(&s);
    CHECK(s.timeout_s == 300.0, "default timeout");
    setenv("CIFAR_COMM_TIMEOUT", "2.5", 1);
    settings_comm_from_env(&s);
    CHECK(s.timeout_s == 2.5, "CIFAR_COMM_TIMEOUT=2.5");
    unsetenv("CIFAR_COMM_TIMEOUT");
}

/* The CPU communicator without --comm, for the environment set_ranks leaves. */
static CommKind default_comm(const char *rank, const char *world, const char *local_world) {
    setenv("RANK", rank, 1);
    setenv("WORLD_SIZE", world, 1);
    setenv("LOCAL_RANK", rank, 1);
    setenv("LOCAL_WORLD_SIZE", local_world, 1);
    DistEnv e;
    char err[256];
    if (dist_env_read(&e, err, sizeof err) != 0) {
        fprintf(stderr, "default_comm: %s\n", err);
        return (CommKind)-1;
    }
    return comm_kind_default_cpu(&e);
}

static void test_default_comm(void) {
    env_clear();
    EXPECT(default_comm("0", "1", "1") == COMM_SINGLE, "one rank");
    EXPECT(default_comm("1", "2", "2") == COMM_SHM, "one node: shared memory");
    EXPECT(default_comm("0", "4", "2") == COMM_GLOO, "two nodes (the launcher's --nnodes 2): Gloo");
    setenv("TORCHELASTIC_RUN_ID", "job7", 1);
    EXPECT(default_comm("1", "2", "2") == COMM_GLOO, "torchrun, even on one node: Gloo");
    setenv("CIFAR_RUN_ID", "run-r0", 1);
    EXPECT(default_comm("1", "2", "2") == COMM_SHM, "the launcher's workers on one node keep shm");
    EXPECT(default_comm("1", "4", "2") == COMM_GLOO, "the launcher's workers on two nodes: Gloo");
    env_clear();
    setenv("OMPI_COMM_WORLD_RANK", "0", 1);
    EXPECT(default_comm("0", "4", "2") == COMM_MPI, "mpirun on two nodes: MPI");
    setenv("TORCHELASTIC_RUN_ID", "job7", 1);
    EXPECT(default_comm("0", "4", "2") == COMM_MPI, "mpirun first, whatever else is set");
    env_clear();
    CommKind k;
    EXPECT(comm_kind_parse("gloo", &k) == 0 && k == COMM_GLOO && strcmp(comm_kind_name(k), "gloo") == 0,
           "--comm gloo");
}

int main(void) {
    log_set_program("test_dist_env");
    test_dist_env();
    test_timeout_parse();
    test_job_identity();
    test_default_comm();
    return unit_report("test_dist_env");
}
