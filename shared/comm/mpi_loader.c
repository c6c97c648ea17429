/* mpi_loader.c: the MPI communicator is loaded on demand.
 *
 * comm_mpi.c is built into libcifar-mpi.so (linked with libmpi) next to the
 * executables; the commands link no MPI library. The functions below dlopen it
 * the first time an MPI communicator is created and forward to the same-named
 * functions inside it (the library calls back into the command for die() and
 * xmalloc(), hence -rdynamic). So cifar-train starts, and trains with the
 * launcher or alone, on machines without Open MPI; only `--comm mpi` (or a start
 * by mpirun/srun --mpi=pmix on the CPU) needs it. RTLD_GLOBAL: Open MPI loads
 * its own plugins, which expect libmpi's symbols to be visible.
 *
 * $CIFAR_MPI_LIB names another library file (tests). Builds without MPI (the
 * Makefile found no mpicc) report that MPI is absent. */
#include <stdio.h>
#include <string.h>

#include "comm/comm_mpi.h"
#include "core/check.h"

#ifndef CIFAR_MPI

static const char g_no_mpi[] =
    "this program was built without MPI (install Open MPI with `make deps`, then rebuild)";

const char *comm_mpi_library_error(void) { return g_no_mpi; }

CommMpi *comm_mpi_create(const DistEnv *env, double timeout_s) {
    (void)env;
    (void)timeout_s;
    die("the MPI communicator is not available: %s\n"
        "---> HINT: on one machine, --comm shm (or the launcher: --nproc-per-node N) needs no MPI",
        g_no_mpi);
}
void comm_mpi_destroy(CommMpi *m) { (void)m; }
void comm_mpi_allreduce_mean(CommMpi *m, float *buf, size_t n) { (void)m, (void)buf, (void)n; }
void comm_mpi_allreduce_sum_f64(CommMpi *m, double *buf, size_t n) { (void)m, (void)buf, (void)n; }
void comm_mpi_broadcast(CommMpi *m, void *buf, size_t bytes, int root) {
    (void)m, (void)buf, (void)bytes, (void)root;
}
void comm_mpi_barrier(CommMpi *m) { (void)m; }

#else

#include <dlfcn.h>
#include <pthread.h>
#include <stdlib.h>
#include <unistd.h>

#include "core/fsutil.h"

#define MPI_LIBRARY_NAME "libcifar-mpi.so"

static void *g_mpi_lib;
static char g_mpi_error[768];
static pthread_once_t g_mpi_once = PTHREAD_ONCE_INIT;

static void mpi_host_die(int status, const char *message) { die_status(status, "%s", message); }

static void mpi_library_open(void) {
    char path[8192];
    fs_companion_library("CIFAR_MPI_LIB", MPI_LIBRARY_NAME, path, sizeof path);
    g_mpi_lib = dlopen(path, RTLD_NOW | RTLD_GLOBAL);
    if (!g_mpi_lib) {
        snprintf(g_mpi_error, sizeof g_mpi_error, "cannot load the MPI code: %s", dlerror());
        return;
    }
    void (*set_die)(CommMpiDieFn) = (void (*)(CommMpiDieFn))dlsym(g_mpi_lib, "comm_mpi_set_die");
    if (!set_die) {
        snprintf(g_mpi_error, sizeof g_mpi_error, "%.600s has no comm_mpi_set_die: it is from another build (rebuild with make)", path);
        dlclose(g_mpi_lib);
        g_mpi_lib = NULL;
        return;
    }
    set_die(mpi_host_die);
    void (*set_blame)(CommMpiBlameFn) = (void (*)(CommMpiBlameFn))dlsym(g_mpi_lib, "comm_mpi_set_blame");
    if (set_blame) set_blame(comm_blame_laggard); /* an older library only names no rank */
}

const char *comm_mpi_library_error(void) {
    pthread_once(&g_mpi_once, mpi_library_open);
    return g_mpi_lib ? NULL : g_mpi_error;
}

static void *mpi_symbol(const char *name) {
    const char *why = comm_mpi_library_error();
    if (why)
        die("the MPI communicator is not available: %s\n"
            "---> HINT: install Open MPI (make deps) and rebuild, or on one machine use --comm shm",
            why);
    void *fn = dlsym(g_mpi_lib, name);
    if (!fn) die("%s has no %s: it is from another build (rebuild with make)", MPI_LIBRARY_NAME, name);
    return fn;
}

#define MPI_FORWARD(ret, name, params, args)                         \
    ret name params {                                                \
        ret(*fn) params = (ret(*) params)mpi_symbol(#name);          \
        return fn args;                                              \
    }

MPI_FORWARD(CommMpi *, comm_mpi_create, (const DistEnv *env, double timeout_s), (env, timeout_s))
MPI_FORWARD(void, comm_mpi_destroy, (CommMpi *m), (m))
MPI_FORWARD(void, comm_mpi_allreduce_mean, (CommMpi *m, float *buf, size_t n), (m, buf, n))
MPI_FORWARD(void, comm_mpi_allreduce_sum_f64, (CommMpi *m, double *buf, size_t n), (m, buf, n))
MPI_FORWARD(void, comm_mpi_broadcast, (CommMpi *m, void *buf, size_t bytes, int root),
            (m, buf, bytes, root))
MPI_FORWARD(void, comm_mpi_barrier, (CommMpi *m), (m))

#endif
