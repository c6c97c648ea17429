/* gloo_loader.c: the Gloo communicator is loaded on demand, like the MPI one
 * (mpi_loader.c).
 *
 * comm_gloo.cc is built into libcifar-gloo.so (C++, linked with libgloo) next to
 * the executables when the Makefile finds Gloo's headers; the commands link no C++
 * or Gloo library. The functions below dlopen it the first time a Gloo
 * communicator is created, hand it the host table (comm_gloo.h: die, the laggard
 * report, the rendezvous exchange) and forward to the same-named functions inside
 * it. So cifar-train starts and trains where libgloo is missing; only `--comm gloo`
 * (or its default: CPU ranks on several nodes, or under torchrun) needs it, and
 * then says in one line why it cannot have it.
 *
 * $CIFAR_GLOO_LIB names another library file (tests). */
#include <stdio.h>
#include <string.h>

#include "comm/comm_gloo.h"
#include "comm/rendezvous.h"
#include "core/check.h"

#define GLOO_LIBRARY_NAME "libcifar-gloo.so"

#define GLOO_HINT "---> HINT: install libgloo-dev (make deps) and rebuild (make), or use --comm mpi " \
                  "(mpirun) on several machines, --comm shm on one"

#ifndef CIFAR_GLOO

static const char g_no_gloo[] =
    GLOO_LIBRARY_NAME " was not built: the build found no Gloo (Debian's libgloo-dev) or no C++ compiler";

const char *comm_gloo_library_error(void) { return g_no_gloo; }

CommGloo *comm_gloo_create(const DistEnv *env, double timeout_s, const char *iface,
                           const char *address) {
    (void)env, (void)timeout_s, (void)iface, (void)address;
    die("the Gloo communicator is not available: %s\n" GLOO_HINT, g_no_gloo);
}
void comm_gloo_destroy(CommGloo *g) { (void)g; }
void comm_gloo_allreduce_mean(CommGloo *g, float *buf, size_t n) { (void)g, (void)buf, (void)n; }
void comm_gloo_allreduce_sum_f64(CommGloo *g, double *buf, size_t n) { (void)g, (void)buf, (void)n; }
void comm_gloo_broadcast(CommGloo *g, void *buf, size_t bytes, int root) {
    (void)g, (void)buf, (void)bytes, (void)root;
}
void comm_gloo_barrier(CommGloo *g) { (void)g; }

#else

#include <dlfcn.h>
#include <pthread.h>

#include "core/fsutil.h"

static void *g_gloo_lib;
static char g_gloo_error[768];
static pthread_once_t g_gloo_once = PTHREAD_ONCE_INIT;

static void gloo_host_die(int status, const char *message) { die_status(status, "%s", message); }

static const CommGlooHost g_gloo_host = {
    COMM_GLOO_HOST_VERSION, sizeof(CommGlooHost), gloo_host_die, comm_blame_laggard, rendezvous_exchange,
};

static void gloo_library_open(void) {
    char path[8192];
    fs_companion_library("CIFAR_GLOO_LIB", GLOO_LIBRARY_NAME, path, sizeof path);
    g_gloo_lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!g_gloo_lib) {
        snprintf(g_gloo_error, sizeof g_gloo_error, "cannot load %s: %s", GLOO_LIBRARY_NAME, dlerror());
        return;
    }
    int (*set_host)(const CommGlooHost *) =
        (int (*)(const CommGlooHost *))dlsym(g_gloo_lib, "comm_gloo_set_host");
    if (!set_host || set_host(&g_gloo_host) != 0) {
        snprintf(g_gloo_error, sizeof g_gloo_error,
                 "%.600s is from another build (no comm_gloo_set_host of version %u): rebuild with make",
                 path, COMM_GLOO_HOST_VERSION);
        dlclose(g_gloo_lib);
        g_gloo_lib = NULL;
    }
}

const char *comm_gloo_library_error(void) {
    pthread_once(&g_gloo_once, gloo_library_open);
    return g_gloo_lib ? NULL : g_gloo_error;
}

static void *gloo_symbol(const char *name) {
    const char *why = comm_gloo_library_error();
    if (why) die("the Gloo communicator is not available: %s\n" GLOO_HINT, why);
    void *fn = dlsym(g_gloo_lib, name);
    if (!fn) die("%s has no %s: it is from another build (rebuild with make)", GLOO_LIBRARY_NAME, name);
    return fn;
}

#define GLOO_FORWARD(ret, name, params, args)                        \
    ret name params {                                                \
        ret(*fn) params = (ret(*) params)gloo_symbol(#name);         \
        return fn args;                                              \
    }

GLOO_FORWARD(CommGloo *, comm_gloo_create,
             (const DistEnv *env, double timeout_s, const char *iface, const char *address),
             (env, timeout_s, iface, address))
GLOO_FORWARD(void, comm_gloo_destroy, (CommGloo *g), (g))
GLOO_FORWARD(void, comm_gloo_allreduce_mean, (CommGloo *g, float *buf, size_t n), (g, buf, n))
GLOO_FORWARD(void, comm_gloo_allreduce_sum_f64, (CommGloo *g, double *buf, size_t n), (g, buf, n))
GLOO_FORWARD(void, comm_gloo_broadcast, (CommGloo *g, void *buf, size_t bytes, int root),
             (g, buf, bytes, root))
GLOO_FORWARD(void, comm_gloo_barrier, (CommGloo *g), (g))

#endif
