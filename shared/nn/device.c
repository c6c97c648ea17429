/* device.c: see device.h. */
#include "nn/device.h"

#include <stdlib.h>
#include <string.h>

#include "util/check.h"

const char *const device_choice_names[3] = {"auto", "cpu", "cuda"};

/* The CUDA engine, or NULL with the reason in why. */
static Engine *try_cuda_engine(EngineConfig *cfg, int local_rank, char *why, size_t whylen) {
    int gpus = engine_cuda_device_count();
    if (gpus <= 0) {
        const char *lib = cuda_library_error();
        snprintf(why, whylen, "%s", lib ? lib : "no NVIDIA driver or no GPU visible");
        return NULL;
    }
    cfg->device = local_rank % gpus;
    return engine_create_cuda(cfg, why, whylen);
}

Engine *device_engine_create(DeviceChoice want, EngineConfig *cfg, int local_rank, int announce) {
    if (want != DEVICE_CPU) {
        char why[512];
        Engine *e = try_cuda_engine(cfg, local_rank, why, sizeof why);
        if (e) return e;
        if (want == DEVICE_CUDA)
            die_permanent("--device cuda: %s ---> HINT: use --device auto or cpu", why);
        if (announce)
            log_info("no usable GPU (%s): running on the CPU, %d thread%s per process", why,
                     cfg->threads, cfg->threads == 1 ? "" : "s");
    }
    return engine_create_cpu(cfg);
}

Comm *device_comm_create(Engine *e, const DistEnv *env) {
    CommKind kind = COMM_SINGLE;
    if (env->world_size > 1) kind = strcmp(e->ops->name, "cpu") == 0 ? COMM_SHM : COMM_NCCL;
    /* Refused here rather than in comm_create so that it counts as permanent:
     * no restart brings the other nodes' workers onto this machine. */
    if (kind == COMM_SHM && env->local_world_size != env->world_size)
        die_permanent("CPU workers on several nodes (world size %d, %d on this node): the CPU "
                      "communicator is shared memory on one machine ---> HINT: use GPUs (NCCL) "
                      "for several nodes, or one node",
                      env->world_size, env->local_world_size);
    Comm *c = comm_create(kind, env);
    e->cfg.comm = c;
    return c;
}

void host_split_load(Dataset *ds, const char *path, const char *name, int required, HostSplit *out) {
    const DatasetSplit *sp = dataset_split(ds, name);
    int64_t count = sp ? sp->count : 0;
    if (count == 0 && required)
        die_permanent("%s: the dataset has no \"%s\" split (or it is empty)", path, name);
    const DatasetInfo *info = dataset_info(ds);
    size_t record = (size_t)info->height * info->width * info->channels;
    uint8_t *pixels = xmalloc((size_t)count * record + 1);
    int32_t *labels = xmalloc((size_t)count * sizeof(int32_t) + 1);
    char err[512];
    if (count > 0 && dataset_load_split(ds, name, pixels, labels, err, sizeof err) != 0)
        die_permanent("%s: %s", path, err);
    *out = (HostSplit){pixels, labels, count};
}

void host_split_free(HostSplit *s) {
    free((void *)s->pixels);
    free((void *)s->labels);
    memset(s, 0, sizeof *s);
}
