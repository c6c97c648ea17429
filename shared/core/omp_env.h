/* omp_env.h: the process environment the CPU ops need, settled at start-up.
 *
 * OpenMP (libgomp) and OpenBLAS read their settings once, when they are loaded,
 * so they must be in the environment before the process starts. */
#ifndef CIFAR_OMP_ENV_H
#define CIFAR_OMP_ENV_H

#include <stddef.h>

/* Unless the user chose them, set OPENBLAS_NUM_THREADS=1 and the OpenMP wait: when
 * other work already keeps half of the cores busy (/proc/stat, sampled at start),
 * OMP_WAIT_POLICY=passive, else GOMP_SPINCOUNT=2000 (spin about 20 us, then sleep;
 * neither is set when the user set either); then re-execute this program with the
 * same arguments (stdin and signals are untouched: call it first thing in main).
 *  - the wait: a training step waits at a few hundred barriers (one parallel region
 *    per forward or backward, ops sharing out their work inside it). On an idle
 *    machine spinning waits are fastest (seed model, batch 256, 2 threads,
 *    2026-12-01: 4,720 to 4,870 img/s spinning 20 us or 3 ms, 4,080 to 4,150
 *    passive); beside one busy process a spinning thread that the OS deschedules
 *    stalls every barrier (1,550 to 1,800 img/s with libgomp's default 3 ms spin,
 *    2,430 to 2,450 with 20 us, 2,930 to 3,040 passive). The short spin bounds the
 *    loss when load comes after the start;
 *  - one BLAS thread: the ops call BLAS from inside their own OpenMP threads
 *    (ops_set_threads), so OpenBLAS's own pool would only spin and reserve memory.
 * Returns only when no re-execution was needed (or it failed). */
void omp_env_prefer_passive(int argc, char **argv);

/* Under an address-space limit (ulimit -v) below min_bytes, exit with a clear
 * message instead of letting OpenBLAS retry a failed allocation forever (it does,
 * inside cblas_sgemm, when its 128 MiB buffer cannot be mapped); under a larger
 * limit, make OpenBLAS take its buffers first, before the data is loaded. */
void memory_limit_check(size_t min_bytes);

/* One warning when `processes` (on this machine) x `threads` (each) is more than
 * the online cores: every barrier of a step then waits for a descheduled thread.
 * Call it from one process of the machine only (local rank 0). */
void threads_warn_oversubscribed(int processes, int threads);

#endif
