/* ops_cpu.c: the CPU ops of ops.h in float32, on OpenBLAS and OpenMP.
 *
 * The op bodies live in ops_cpu_impl.h, written over a scalar type so that
 * tests/test_ops.c can run the same code in double for gradient checks. */
#include <cblas.h>
#include <omp.h>

#include "ops.h"

#define OPS_REAL float
#define OPS_FN(name) name
#define OPS_GEMM cblas_sgemm
#include "ops_cpu_impl.h"

void openblas_set_num_threads(int num_threads);

/* All parallelism is OpenMP at the op level (tiles of the batch, blocks of rows);
 * BLAS runs single-threaded inside those regions. Two thread pools spinning
 * against each other (OpenMP's and OpenBLAS's) cost more than the GEMMs on a
 * machine with few cores. */
/* 0 until ops_set_threads is called: then OpenMP's default applies. */
static int ops_thread_count;

void ops_set_threads(int threads) {
    if (threads < 1) threads = 1;
    ops_thread_count = threads;
    omp_set_num_threads(threads);
    openblas_set_num_threads(1);
}

int ops_threads(void) {
    return ops_thread_count > 0 ? ops_thread_count : omp_get_max_threads();
}
