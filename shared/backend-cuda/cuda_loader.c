/* cuda_loader.c: the GPU code is loaded on demand.
 *
 * In CUDA builds everything that touches CUDA, cuDNN, cuBLAS or NCCL (the CUDA
 * engine, the CUDA ops, the NCCL communicator) lives in libcifar-cuda.so next to
 * the executables, and the commands themselves link none of those libraries.
 * The functions below are the only way in: they dlopen the library the first
 * time a GPU is asked for and forward to the same-named functions inside it.
 * So a CUDA build starts as fast as a CPU build, runs on machines that have no
 * GPU and not even the CUDA libraries, and `--device auto` falls back to the
 * CPU with the reason the library could not be used.
 *
 * The library imports nothing from the executable: right after dlopen it gets
 * this program's callbacks (errors, logging, allocation, the communicator, the
 * augmentation spec) through cifar_cuda_init (cuda_host.h).
 *
 * In CPU-only builds the same functions report that CUDA is absent. */
#include <stdio.h>
#include <string.h>

#include "comm/comm_nccl.h"
#include "model/engine.h"

#ifndef CIFAR_CUDA

Engine *engine_create_cuda(const EngineConfig *cfg, char *err, size_t errlen) {
    (void)cfg;
    snprintf(err, errlen, "this program was built without CUDA (rebuild with `make CUDA=1`)");
    return NULL;
}

int engine_cuda_device_count(void) { return 0; }

const char *cuda_library_error(void) { return "built without CUDA"; }

#else

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/check.h"
#include "core/fsutil.h"
#include "comm/rendezvous.h"
#include "backend-cuda/cuda_host.h"

#define CUDA_LIBRARY_NAME "libcifar-cuda.so"

static void *g_cuda_lib;
static char g_cuda_error[512];
static pthread_once_t g_cuda_once = PTHREAD_ONCE_INIT;

/* $CIFAR_CUDA_LIB, else libcifar-cuda.so in the folder of this executable (a
 * build's bin/), else in ../lib/cifar/ from it (`make install`: PREFIX/bin and
 * PREFIX/lib/cifar). Never a search of LD_LIBRARY_PATH: the library must be
 * the one built with these commands. */
/* ---- the callback table handed to the library (cuda_host.h) ---- */

static void host_die_message(int status, const char *message) { die_status(status, "%s", message); }

static void host_log_line(CudaHostLogLevel level, const char *message) {
    switch (level) {
    case CUDA_HOST_LOG_ERROR: log_error("%s", message); break;
    case CUDA_HOST_LOG_WARN: log_warn("%s", message); break;
    default: log_info("%s", message); break;
    }
}

static const CudaHostApi g_host_api = {
    .version = CUDA_HOST_API_VERSION,
    .check_fail = check_fail,
    .die_message = host_die_message,
    .hint_for_errno = check_hint_for_errno,
    .log_line = host_log_line,
    .xmalloc = xmalloc,
    .xcalloc = xcalloc,
    .comm_kind = comm_kind,
    .comm_world_size = comm_world_size,
    .comm_allreduce_mean = comm_allreduce_mean,
    .comm_broadcast = comm_broadcast,
    .rendezvous_share = rendezvous_share,
    .comm_allreduce_mean_on_stream = comm_allreduce_mean_on_stream,
    .comm_broadcast_on_stream = comm_broadcast_on_stream,
    .dist_env_read = dist_env_read,
    .comm_blame_laggard = comm_blame_laggard,
    .engine_augment_spec = engine_augment_spec,
    .engine_ema_decay = engine_ema_decay,
};

const CudaHostApi *cuda_host_api(void) { return &g_host_api; }

/* dlopen, then hand the library this executable's callbacks. */
static void cuda_library_open(void) {
    char path[8192];
    fs_companion_library("CIFAR_CUDA_LIB", CUDA_LIBRARY_NAME, path, sizeof path);
    g_cuda_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g_cuda_lib) {
        snprintf(g_cuda_error, sizeof g_cuda_error, "cannot load the GPU code: %s", dlerror());
        return;
    }
    CudaInitFn init = (CudaInitFn)dlsym(g_cuda_lib, "cifar_cuda_init");
    int version = init ? init(&g_host_api) : -1;
    if (version != CUDA_HOST_API_VERSION) {
        snprintf(g_cuda_error, sizeof g_cuda_error,
                 "cannot use the GPU code: %.300s is from another build (interface %d, this program "
                 "needs %d): rebuild with make",
                 path, version, CUDA_HOST_API_VERSION);
        dlclose(g_cuda_lib);
        g_cuda_lib = NULL;
    }
}

static void *cuda_library(void) {
    pthread_once(&g_cuda_once, cuda_library_open);
    return g_cuda_lib;
}

const char *cuda_library_error(void) {
    cuda_library();
    return g_cuda_error[0] ? g_cuda_error : NULL;
}

/* The function `name` inside the library; dies if a loaded library lacks it
 * (a libcifar-cuda.so from another build). */
static void *cuda_symbol(const char *name) {
    void *lib = cuda_library();
    if (!lib) return NULL;
    void *fn = dlsym(lib, name);
    if (!fn) die("%s: %s has no %s: it is from another build (rebuild with make)", CUDA_LIBRARY_NAME,
                 CUDA_LIBRARY_NAME, name);
    return fn;
}

/* Forward a call to the library's function of the same name. */
#define CUDA_FORWARD(ret, name, params, args)                                         \
    ret name params {                                                                 \
        ret(*fn) params = (ret(*) params)cuda_symbol(#name);                          \
        if (!fn) die("%s", g_cuda_error);                                             \
        return fn args;                                                               \
    }

Engine *engine_create_cuda(const EngineConfig *cfg, char *err, size_t errlen) {
    Engine *(*fn)(const EngineConfig *, char *, size_t) =
        (Engine * (*)(const EngineConfig *, char *, size_t)) cuda_symbol("engine_create_cuda");
    if (!fn) {
        snprintf(err, errlen, "%s", g_cuda_error);
        return NULL;
    }
    return fn(cfg, err, errlen);
}

int engine_cuda_device_count(void) {
    int (*fn)(void) = (int (*)(void))cuda_symbol("engine_cuda_device_count");
    return fn ? fn() : 0;
}

CUDA_FORWARD(CommNccl *, comm_nccl_create, (const DistEnv *env, double timeout_s), (env, timeout_s))
CUDA_FORWARD(void, comm_nccl_destroy, (CommNccl *nc), (nc))
CUDA_FORWARD(void, comm_nccl_allreduce_mean, (CommNccl *nc, float *buf, size_t n, void *stream),
             (nc, buf, n, stream))
CUDA_FORWARD(void, comm_nccl_allreduce_sum_f64, (CommNccl *nc, double *buf, size_t n), (nc, buf, n))
CUDA_FORWARD(void, comm_nccl_broadcast, (CommNccl *nc, void *buf, size_t bytes, int root, void *stream),
             (nc, buf, bytes, root, stream))
CUDA_FORWARD(void, comm_nccl_broadcast_host, (CommNccl *nc, void *buf, size_t bytes, int root),
             (nc, buf, bytes, root))
CUDA_FORWARD(void, comm_nccl_barrier, (CommNccl *nc), (nc))

#endif
