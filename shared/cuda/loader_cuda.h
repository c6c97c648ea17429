/* loader_cuda.h: a batch's records from host memory (the dataset's map) to device
 * memory, for a split that does not stay resident on the GPU (engine_cuda.cu).
 *
 * A loader thread gathers the batch's records (host_split_gather: uint8 HWC and
 * their labels) chunk by chunk into two pinned buffers, alternately; the calling
 * thread copies each filled chunk to the device with cudaMemcpyAsync on the
 * engine's stream and records the buffer's event after the copy. The loader
 * refills a buffer only once that event has completed, so chunk k+1 is gathered
 * while chunk k crosses the bus. Include only from CUDA code. */
#ifndef CIFAR_LOADER_CUDA_H
#define CIFAR_LOADER_CUDA_H

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "data/dataset.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct BatchLoader BatchLoader;

/* Two pinned buffers of chunk_records records of rec_bytes bytes (and their
 * labels), two events, and the loader thread, which works on `device`. A failure
 * ends the process (CHECK_CUDA / CHECK_PTHREAD). */
BatchLoader *batch_loader_create(int device, size_t rec_bytes, int chunk_records);

/* Gather records idx[0..n) of split s and their labels into dev_px (n*rec_bytes)
 * and dev_lab (n int32), device memory, in that order: every copy is enqueued on
 * `stream` when this returns (the pinned buffers are not read yet); work queued on
 * the stream after it sees the batch. idx and s must stay valid until it returns.
 * An error of the loader thread is reported here, on the caller's thread. */
void batch_loader_stage(BatchLoader *l, const HostSplit *s, const int64_t *idx, int n,
                        uint8_t *dev_px, int32_t *dev_lab, cudaStream_t stream);

/* Stop and join the thread, wait for the last copies, free the pinned buffers and
 * events. NULL is a no-op. */
void batch_loader_destroy(BatchLoader *l);

/* Records per pinned buffer: chunk_bytes worth of records, at least 1, at most
 * max_batch. */
int batch_loader_chunk_records(size_t rec_bytes, size_t chunk_bytes, int max_batch);

#ifdef __cplusplus
}
#endif
#endif
