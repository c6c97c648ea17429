/* comm_env.c: where this process sits in the job (comm.h's DistEnv): ranks from
 * torchrun's, Open MPI's or Slurm's variables, the rendezvous address, the restart
 * count, the run id, the job identity and token, and the communicators' settings
 * (core/settings.c). */
#include "comm/comm.h"

#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/sha256.h"
#include "core/check.h"


/* Strict integer parse of an environment variable: 1 found, 0 absent, -1 bad. */
static int env_int(const char *name, long *out, char *err, size_t errlen) {
    const char *s = getenv(name);
    if (s == NULL || *s == '\0') return 0;
    char *end = NULL;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || v < INT_MIN || v > INT_MAX) {
        snprintf(err, errlen, "%s=%s is not an integer", name, s);
        return -1;
    }
    *out = v;
    return 1;
}

/* Slurm's SLURM_TASKS_PER_NODE looks like "4(x2),3": the first count is ours
 * on a homogeneous allocation, which is what data-parallel jobs use. */
static int env_leading_int(const char *name, long *out) {
    const char *s = getenv(name);
    if (s == NULL || !isdigit((unsigned char)*s)) return 0;
    *out = strtol(s, NULL, 10);
    return 1;
}

/* Keep [A-Za-z0-9._-] so the run id is a valid shm name component. */
static void run_id_sanitize(char *id) {
    for (char *p = id; *p; p++)
        if (!isalnum((unsigned char)*p) && *p != '.' && *p != '_' && *p != '-') *p = '_';
}

static void dist_env_run_id(DistEnv *env) {
    const char *cifar = getenv("CIFAR_RUN_ID");
    const char *elastic = getenv("TORCHELASTIC_RUN_ID");
    const char *job = getenv("SLURM_JOB_ID");
    const char *step = getenv("SLURM_STEP_ID");
    if (cifar && *cifar) {
        snprintf(env->run_id, sizeof env->run_id, "%s", cifar);
    } else if (elastic && *elastic && strcmp(elastic, "none") != 0) {
        /* a restarted torchrun group must not meet the previous one's segment */
        snprintf(env->run_id, sizeof env->run_id, "te-%.40s-r%d", elastic, env->restart_count);
    } else if (job && *job) {
        snprintf(env->run_id, sizeof env->run_id, "slurm-%.20s.%.10s-p%d-r%d", job,
                 step ? step : "0", env->master_port, env->restart_count);
    } else {
        snprintf(env->run_id, sizeof env->run_id, "p%d-r%d", env->master_port,
                 env->restart_count);
    }
    run_id_sanitize(env->run_id);
}

static int env_set(const char *name) {
    const char *s = getenv(name);
    return s != NULL && *s != '\0';
}

/* Fills rank/world/local from the first family of variables that is present. */
static int dist_env_read_ranks(DistEnv *env, char *err, size_t errlen) {
    static const char *families[3][4] = {
        {"RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"},
        {"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
         "OMPI_COMM_WORLD_LOCAL_SIZE"},
        {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL},
    };
    for (int f = 0; f < 3; f++) {
        long rank = 0, world = 0, lrank = 0, lworld = 0;
        int has_rank = env_int(families[f][0], &rank, err, errlen);
        if (has_rank < 0) return -1;
        /* WORLD_SIZE=2 alone would train alone, silently; Slurm's batch shell and
         * salloc set SLURM_NTASKS without SLURM_PROCID, which is fine. */
        if (has_rank == 0 && families[f][3] && env_set(families[f][1])) {
            snprintf(err, errlen, "%s is set but %s is not: this process does not know its rank "
                     "---> HINT: set both (the launcher, torchrun and mpirun do), or neither to "
                     "train alone", families[f][1], families[f][0]);
            return -1;
        }
        if (has_rank == 0) continue;
        int has_world = env_int(families[f][1], &world, err, errlen);
        if (has_world < 0) return -1;
        if (has_world == 0) {
            snprintf(err, errlen, "%s is set but %s is not", families[f][0], families[f][1]);
            return -1;
        }
        int has_lrank = env_int(families[f][2], &lrank, err, errlen);
        if (has_lrank < 0) return -1;
        int has_lworld = families[f][3] ? env_int(families[f][3], &lworld, err, errlen)
                                        : env_leading_int("SLURM_TASKS_PER_NODE", &lworld);
        if (has_lworld < 0) return -1;
        /* without the local variables, assume one node */
        env->rank = (int)rank;
        env->world_size = (int)world;
        env->local_rank = has_lrank ? (int)lrank : (int)rank;
        env->local_world_size = has_lworld ? (int)lworld : (int)world;
        env->from_env = 1;
        return 0;
    }
    return 0;
}

static void dist_env_job_id(DistEnv *env) {
    const char *job = getenv("CIFAR_JOB_ID");
    const char *elastic = getenv("TORCHELASTIC_RUN_ID");
    const char *slurm = getenv("SLURM_JOB_ID");
    const char *step = getenv("SLURM_STEP_ID");
    const char *pmix = getenv("PMIX_NAMESPACE");
    const char *launcher = getenv("CIFAR_RUN_ID");
    size_t len = sizeof env->job_id;
    if (job && *job)
        snprintf(env->job_id, len, "user:%.120s", job);
    else if (elastic && *elastic && strcmp(elastic, "none") != 0)
        /* torchrun restarts every node's group together: a rank left over from the
         * previous round is another job */
        snprintf(env->job_id, len, "torchelastic:%.100s-r%d", elastic, env->restart_count);
    else if (slurm && *slurm)
        snprintf(env->job_id, len, "slurm:%.40s.%.40s", slurm, step ? step : "");
    else if (pmix && *pmix)
        snprintf(env->job_id, len, "pmix:%.100s", pmix);
    else if (launcher && *launcher && env->local_world_size == env->world_size)
        snprintf(env->job_id, len, "launcher:%.100s", launcher); /* one node: one launcher */
    else {
        snprintf(env->job_id, len, "addr:%.100s:%d", env->master_addr, env->master_port);
        env->job_id_weak = 1;
    }
}

/* The job's identity, and the token its rendezvous hellos carry (comm.h). */
static void dist_env_job_identity(DistEnv *env) {
    static const char prefix[] = "cifar-job-token/v1\n";
    dist_env_job_id(env);
    const char *token = getenv("CIFAR_JOB_TOKEN");
    env->token_from_user = token != NULL && *token != '\0';
    if (env->token_from_user)
        sha256_two(prefix, sizeof prefix - 1, token, strlen(token), env->job_token);
    else
        sha256_two(prefix, sizeof prefix - 1, env->job_id, strlen(env->job_id), env->job_token);
}

static int dist_env_validate(const DistEnv *env, char *err, size_t errlen) {
    if (env->world_size < 1) {
        snprintf(err, errlen, "world size %d: must be at least 1", env->world_size);
        return -1;
    }
    if (env->rank < 0 || env->rank >= env->world_size) {
        snprintf(err, errlen, "rank %d is outside 0..%d (world size %d)", env->rank,
                 env->world_size - 1, env->world_size);
        return -1;
    }
    if (env->local_world_size < 1 || env->local_world_size > env->world_size) {
        snprintf(err, errlen, "local world size %d: must be in 1..%d (the world size)",
                 env->local_world_size, env->world_size);
        return -1;
    }
    if (env->local_rank < 0 || env->local_rank >= env->local_world_size) {
        snprintf(err, errlen, "local rank %d is outside 0..%d (local world size %d)",
                 env->local_rank, env->local_world_size - 1, env->local_world_size);
        return -1;
    }
    if (env->master_port < 1 || env->master_port > 65535) {
        snprintf(err, errlen, "MASTER_PORT=%d: must be in 1..65535", env->master_port);
        return -1;
    }
    return 0;
}

CommKind comm_kind_default_cpu(const DistEnv *env) {
    if (env->world_size == 1) return COMM_SINGLE;
    if (env->mpi_launched) return COMM_MPI;
    /* torchrun sets TORCHELASTIC_RUN_ID; the launcher's workers (CIFAR_RUN_ID) may carry
     * torchrun's variables too, and keep shm on one node */
    int torchrun = env_set("TORCHELASTIC_RUN_ID") && !env_set("CIFAR_RUN_ID");
    if (torchrun || env->local_world_size < env->world_size) return COMM_GLOO;
    return COMM_SHM;
}

int dist_env_read(DistEnv *env, char *err, size_t errlen) {
    memset(env, 0, sizeof *env);
    env->world_size = 1;
    env->local_world_size = 1;
    env->master_port = 29500; /* torchrun's default */
    snprintf(env->master_addr, sizeof env->master_addr, "127.0.0.1");
    if (dist_env_read_ranks(env, err, errlen) < 0) return -1;

    const char *addr = getenv("MASTER_ADDR");
    if (addr && *addr) {
        if (strlen(addr) >= sizeof env->master_addr) {
            snprintf(err, errlen, "MASTER_ADDR is longer than %zu characters",
                     sizeof env->master_addr - 1);
            return -1;
        }
        snprintf(env->master_addr, sizeof env->master_addr, "%s", addr);
    }
    long v = 0;
    int rc = env_int("MASTER_PORT", &v, err, errlen);
    if (rc < 0) return -1;
    if (rc > 0) env->master_port = (int)v;
    rc = env_int("CIFAR_RESTART_COUNT", &v, err, errlen);
    if (rc == 0) rc = env_int("TORCHELASTIC_RESTART_COUNT", &v, err, errlen);
    if (rc < 0) return -1;
    env->restart_count = rc > 0 ? (int)v : 0;
    if (env->restart_count < 0) {
        snprintf(err, errlen, "restart count %d is negative", env->restart_count);
        return -1;
    }
    dist_env_run_id(env);
    if (dist_env_validate(env, err, errlen) != 0) return -1;
    env->mpi_launched = env_set("OMPI_COMM_WORLD_RANK") || env_set("PMIX_RANK") || env_set("PMI_RANK");
    dist_env_job_identity(env);
    settings_comm_from_env(&env->comm);
    return 0;
}

