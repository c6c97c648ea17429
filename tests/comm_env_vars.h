/* comm_env_vars.h: the environment variables dist_env_read looks at, and
 * env_clear to start a test from none of them (test_comm.c, test_dist_env.c). */
#ifndef CIFAR_TESTS_COMM_ENV_VARS_H
#define CIFAR_TESTS_COMM_ENV_VARS_H

#include <stdlib.h>

static const char *all_vars[] = {
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "CIFAR_RUN_ID", "CIFAR_RESTART_COUNT", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID",
    "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_TASKS_PER_NODE", "SLURM_JOB_ID",
    "SLURM_STEP_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "CIFAR_JOB_ID", "CIFAR_JOB_TOKEN",
    "PMIX_NAMESPACE", "PMIX_RANK", "PMI_RANK", "CIFAR_RENDEZVOUS_BIND", "CIFAR_COMM_TIMEOUT", NULL};

static void env_clear(void) {
    for (int i = 0; all_vars[i]; i++) unsetenv(all_vars[i]);
}

#endif
