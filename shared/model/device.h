/* device.h: what a command needs to set an engine up (engine.h): the device
 * policy behind --device, one communicator choice, and a dataset split loaded
 * into host memory. cifar-train and cifar-eval both use it, so that --device
 * means the same in both.
 *
 * The policy: cpu is the CPU engine; cuda is the CUDA engine or a permanent
 * failure naming why not; auto is the CUDA engine when one can be created, else
 * the CPU engine with one line naming why (logged when `announce`, e.g. rank 0). */
#ifndef CIFAR_DEVICE_H
#define CIFAR_DEVICE_H

#include "data/dataset.h"
#include "comm/comm.h"
#include "model/engine.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { DEVICE_AUTO, DEVICE_CPU, DEVICE_CUDA } DeviceChoice;

/* "auto", "cpu", "cuda", indexed by DeviceChoice. */
extern const char *const device_choice_names[3];

/* The engine for `want` (policy above). cfg->device is overwritten with the GPU
 * of this process: local_rank modulo the visible GPUs. cfg->comm is left as
 * given: attach the communicator with device_comm_create afterwards (NCCL needs
 * the device the CUDA engine selected). */
Engine *device_engine_create(DeviceChoice want, EngineConfig *cfg, int local_rank,
                             int local_world_size, int announce);

/* The communicator for an engine: NCCL between CUDA engines; between CPU engines
 * MPI when mpirun or srun --mpi=pmix started the ranks, else shared memory; none
 * for one process. `requested` (a CommKind, or -1) is --comm. Sets e->cfg.comm. */
Comm *device_comm_create(Engine *e, const DistEnv *env, int requested);

/* An engine that only runs inference, in one process (cifar-eval, cifar-predict):
 * fp32, the `test` split, max_batch images a pass, the normalisation given, the
 * weights (params, BN buffers: host flat buffers) loaded; threads 0 = all cores;
 * settings: the command's (core/settings.h). *comm gets its communicator (destroy it
 * after the engine). */
Engine *device_inference_engine(DeviceChoice want, const Model *m, HostSplit test, const float *mean,
                                const float *std, int max_batch, int threads, const float *params,
                                const float *buffers, const Settings *settings, Comm **comm);

/* Split `name` of an open dataset, read in place from its map (arrays owned by
 * the dataset, valid until dataset_close) or with in_memory copied to memory
 * (Settings.data_in_memory), every record's checksum verified. An absent split gives
 * count 0, or with `required` a permanent failure naming `path` (the dataset, for
 * messages); bad records are a permanent failure too. */
void host_split_load(Dataset *ds, const char *path, const char *name, int required, int in_memory,
                     HostSplit *out);

#ifdef __cplusplus
}
#endif
#endif
