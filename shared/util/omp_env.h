/* omp_env.h: the process environment the CPU ops need, settled at start-up.
 *
 * OpenMP (libgomp) and OpenBLAS read their settings once, when they are loaded,
 * so they must be in the environment before the process starts. */
#ifndef CIFAR_OMP_ENV_H
#define CIFAR_OMP_ENV_H

#include <stddef.h>

/* Unless the user chose them, set OPENBLAS_NUM_THREADS=1 and, when other work
 * already keeps half of the cores busy (/proc/stat, sampled at start), OMP_WAIT_POLICY=passive;
 * then re-execute this program with the same arguments (stdin and signals are
 * untouched: call it first thing in main).
 *  - the wait policy: the CPU ops run many short parallel regions. On an idle
 *    machine spinning waits are fastest (seed model, 2 threads: 3,720 img/s
 *    against 2,206 passive); with other load, a spinning thread that the OS
 *    deschedules stalls every barrier (970 against 2,161 with one busy process
 *    beside it, and 5 to 50 times slower than passive at load 3 to 7);
 *  - one BLAS thread: the ops call BLAS from inside their own OpenMP threads
 *    (ops_set_threads), so OpenBLAS's own pool would only spin and reserve memory.
 * Returns only when no re-execution was needed (or it failed). */
void omp_env_prefer_passive(int argc, char **argv);

/* Under an address-space limit (ulimit -v) below min_bytes, exit with a clear
 * message instead of letting OpenBLAS retry a failed allocation forever (it does,
 * inside cblas_sgemm, when its 128 MiB buffer cannot be mapped); under a larger
 * limit, make OpenBLAS take its buffers first, before the data is loaded. */
void memory_limit_check(size_t min_bytes);

#endif
