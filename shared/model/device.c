/* device.c: see device.h. */
#include "model/device.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend-cpu/cpu_bf16.h"
#include "core/check.h"
#include "core/omp_env.h"
#include "core/progress.h"

const char *const device_choice_names[3] = {"auto", "cpu", "cuda"};

/* The CUDA engine, or NULL with the reason in why. NCCL refuses two ranks on one
 * GPU ("Duplicate GPU detected"), so more ranks on this node than GPUs is a reason
 * too, given before any engine exists. */
static Engine *try_cuda_engine(EngineConfig *cfg, int local_rank, int local_world_size, char *why,
                               size_t whylen) {
    int gpus = engine_cuda_device_count();
    if (gpus <= 0) {
        const char *lib = cuda_library_error();
        snprintf(why, whylen, "%s", lib ? lib : "no NVIDIA driver or no GPU visible");
        return NULL;
    }
    if (local_world_size > gpus) {
        snprintf(why, whylen,
                 "%d processes on this node but %d GPU%s: NCCL needs one GPU per process "
                 "(--nproc-per-node gpu starts one per GPU)",
                 local_world_size, gpus, gpus == 1 ? "" : "s");
        return NULL;
    }
    cfg->device = local_rank % gpus;
    return engine_create_cuda(cfg, why, whylen);
}

/* --precision bf16 on the CPU needs AVX512-BF16 or AMX and oneDNN (cpu_bf16.h):
 * refused where they are missing, rather than training in another precision than
 * asked (tf32, the default, is fp32 on the CPU: no refusal). */
static void bf16_refuse_cpu(const EngineConfig *cfg, const char *why_cpu) {
    if (cfg->precision != PRECISION_BF16) return;
    const char *why = cpu_bf16_why_not(cfg->settings.cpu_isa);
    if (!why) return;
    die_usage("--precision bf16: this run would use the CPU (%s), and %s ---> HINT: use "
              "--precision fp32 on the CPU, or a GPU of compute capability 8.0 or newer",
              why_cpu, why);
}

Engine *device_engine_create(DeviceChoice want, EngineConfig *cfg, int local_rank,
                             int local_world_size, int announce) {
    if (want != DEVICE_CPU) {
        char why[512];
        Engine *e = try_cuda_engine(cfg, local_rank, local_world_size, why, sizeof why);
        if (e) return e;
        if (want == DEVICE_CUDA)
            die_permanent("--device cuda: %s ---> HINT: use --device auto or cpu", why);
        bf16_refuse_cpu(cfg, why);
        if (announce)
            log_info_once("no usable GPU (%s): running on the CPU, %d thread%s per process", why,
                          cfg->threads, cfg->threads == 1 ? "" : "s");
    }
    bf16_refuse_cpu(cfg, "--device cpu");
    return engine_create_cpu(cfg);
}

/* The engine's communicator unless --comm chose one: NCCL for CUDA engines; for CPU
 * engines comm_kind_default_cpu (MPI under mpirun/srun, Gloo under torchrun or on
 * several nodes, else shared memory). A GPU engine all-reduces device memory (NCCL
 * only), a CPU engine host memory (shm, mpi, gloo). */
static CommKind comm_kind_for(const Engine *e, const DistEnv *env, int requested) {
    if (env->world_size == 1) return COMM_SINGLE;
    int gpu = strcmp(e->ops->name, "cpu") != 0;
    CommKind fallback = gpu ? COMM_NCCL : comm_kind_default_cpu(env);
    CommKind k = requested >= 0 ? (CommKind)requested : fallback;
    if (gpu != (k == COMM_NCCL))
        die_usage("--comm %s: %s trains with %s", comm_kind_name(k), gpu ? "the GPU" : "the CPU",
                  gpu ? "--comm nccl (or --device cpu for shm/mpi/gloo)" : "--comm shm, mpi or gloo");
    return k;
}

Comm *device_comm_create(Engine *e, const DistEnv *env, int requested) {
    Comm *c = comm_create(comm_kind_for(e, env, requested), env);
    e->cfg.comm = c;
    return c;
}

Engine *device_inference_engine(DeviceChoice want, const Model *m, HostSplit test, const float *mean,
                                const float *std, int max_batch, int threads, const float *params,
                                const float *buffers, const Settings *settings, Comm **comm) {
    EngineConfig ec;
    memset(&ec, 0, sizeof ec);
    ec.settings = *settings;
    ec.model = m;
    ec.test = test;
    memcpy(ec.mean, mean, sizeof ec.mean);
    memcpy(ec.std, std, sizeof ec.std);
    ec.max_batch = max_batch;
    ec.threads = threads ? threads : (int)sysconf(_SC_NPROCESSORS_ONLN);
    ec.precision = PRECISION_FP32;
    Engine *e = device_engine_create(want, &ec, 0, 1, 1);
    if (strcmp(e->ops->name, "cpu") == 0) threads_warn_oversubscribed(1, ec.threads);
    DistEnv alone = {.world_size = 1, .local_world_size = 1};
    *comm = device_comm_create(e, &alone, -1);
    e->ops->state_from_host(e, params, buffers, NULL);
    return e;
}

/* In place in the dataset's map unless in_memory (CIFAR_DATA_IN_MEMORY=1: a private
 * copy, as before in-place reading); every record's checksum is verified once here. */
void host_split_load(Dataset *ds, const char *path, const char *name, int required, int in_memory,
                     HostSplit *out) {
    memset(out, 0, sizeof *out);
    const DatasetSplit *sp = dataset_split(ds, name);
    if ((!sp || sp->count == 0) && required)
        die_permanent("%s: the dataset has no \"%s\" split (or it is empty)", path, name);
    if (!sp) return;
    DatasetAccess how = in_memory ? DATASET_COPY : DATASET_IN_PLACE;
    const DatasetInfo *info = dataset_info(ds);
    char err[512];
    double t0 = now_seconds();
    if (dataset_map_split(ds, name, how, out, err, sizeof err) != 0)
        die_permanent("%s: %s", path, err);
    log_info_once("%s: split \"%s\": %lld records %s (%.1f MB of pixels, %s) in %.3f s", path, name,
                  (long long)out->count, how == DATASET_COPY ? "copied to memory" : "read in place",
                  (double)out->count * info->height * info->width * info->channels / 1e6,
                  dataset_has_checksums(ds) ? "checksums verified" : "no checksums",
                  now_seconds() - t0);
}
