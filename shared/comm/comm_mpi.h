/* comm_mpi.h: the MPI transport behind comm.h (comm_mpi.c, built into
 * libcifar-mpi.so when the Makefile finds MPI). comm.c dispatches to these
 * functions when the Comm is COMM_MPI; mpi_loader.c dlopens the library on the
 * first call, so the commands link no MPI library and run where Open MPI is not
 * installed. Every call dies with a clear message on failure; every collective
 * is non-blocking underneath and gives up after `timeout_s` (a stopped peer),
 * though mpirun usually ends the whole job first when a rank dies. All buffers
 * are host memory. */
#ifndef CIFAR_COMM_MPI_H
#define CIFAR_COMM_MPI_H

#include <stddef.h>

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct CommMpi CommMpi;

/* How the library reports a fatal error: the host's die (check.h), so its cleanup
 * and log prefix apply. mpi_loader.c hands it over right after dlopen. */
typedef void (*CommMpiDieFn)(int status, const char *message);
void comm_mpi_set_die(CommMpiDieFn fn);
/* The host's comm_blame_laggard (comm.h), appended to a timeout's message. */
typedef void (*CommMpiBlameFn)(char *buf, size_t len);
void comm_mpi_set_blame(CommMpiBlameFn fn);

/* MPI_Init (once) and a duplicate of MPI_COMM_WORLD; dies unless MPI's rank and
 * size are env's (ranks not started by mpirun/srun --mpi=pmix are singletons). */
CommMpi *comm_mpi_create(const DistEnv *env, double timeout_s);
/* Frees the communicator and calls MPI_Finalize. */
void comm_mpi_destroy(CommMpi *m);
/* In place: sum over ranks in rank order 0..W-1, then divide by W (float). */
void comm_mpi_allreduce_mean(CommMpi *m, float *buf, size_t n);
/* In place: sum over ranks in rank order. */
void comm_mpi_allreduce_sum_f64(CommMpi *m, double *buf, size_t n);
void comm_mpi_broadcast(CommMpi *m, void *buf, size_t bytes, int root);
void comm_mpi_barrier(CommMpi *m);

/* Whether libcifar-mpi.so can be loaded: NULL, or why not (mpi_loader.c). */
const char *comm_mpi_library_error(void);

#ifdef __cplusplus
}
#endif
#endif
