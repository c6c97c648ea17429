/* loader_cuda.h: a batch's records from host memory (the dataset's map) to device
 * memory, for a split that does not stay resident on the GPU (engine_cuda.cu).
 *
 * Two pinned slots of one whole batch each (max_batch records and their labels).
 * A loader thread gathers a batch's records (host_split_gather: uint8 HWC and
 * their labels) into a slot, chunk_records at a time; the calling thread copies
 * what is gathered to the device with cudaMemcpyAsync on the engine's stream and
 * records the slot's event after the copies. A slot is gathered into again only
 * once that event has completed (waited for on the calling thread, so the loader
 * thread makes no CUDA call).
 *
 * batch_loader_prefetch says which batch comes next: the loader gathers it into
 * the free slot while the GPU runs the current step, and the stage of that batch
 * then only copies. A stage of a batch that was not prefetched (or of other
 * indices than those prefetched) has it gathered on demand, the copy of each
 * gathered chunk overlapping the gather of the next. Include only from CUDA code. */
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

/* Two pinned slots of max_batch records of rec_bytes bytes (and their labels), two
 * events, and the loader thread, which publishes chunk_records records at a time
 * (1 <= chunk_records <= max_batch). A failure ends the process (CHECK_CUDA /
 * CHECK_PTHREAD). */
BatchLoader *batch_loader_create(size_t rec_bytes, int max_batch, int chunk_records);

/* A hint: a coming batch_loader_stage (the next, or the one after it) takes
 * records idx[0..n) of split s (1 <= n <= max_batch, indices checked by the
 * caller). The indices are copied: the caller may reuse idx at once. When a slot
 * is free, the loader starts gathering them; else the hint is dropped. A batch
 * already prefetched is not gathered twice. s must stay valid until the batch is
 * staged or the loader destroyed. */
void batch_loader_prefetch(BatchLoader *l, const HostSplit *s, const int64_t *idx, int n);

/* Records idx[0..n) of split s and their labels into dev_px (n*rec_bytes) and
 * dev_lab (n int32), device memory, in that order: every copy is enqueued on
 * `stream` when this returns; work queued on the stream after it sees the batch.
 * From the slot prefetched with the same split and indices when there is one
 * (prefetches older than it are dropped), else gathered now. */
void batch_loader_stage(BatchLoader *l, const HostSplit *s, const int64_t *idx, int n,
                        uint8_t *dev_px, int32_t *dev_lab, cudaStream_t stream);

/* Batches staged so far: gathered ahead and ready, prefetched but still being
 * gathered when staged, and gathered on demand (not prefetched, or other indices). */
typedef struct {
    int64_t ready, late, demand;
} BatchLoaderStats;
BatchLoaderStats batch_loader_stats(const BatchLoader *l);

/* Stop and join the thread, wait for the last copies, free the pinned slots and
 * events. NULL is a no-op. */
void batch_loader_destroy(BatchLoader *l);

/* Records per published chunk: chunk_bytes worth of records, at least 1, at most
 * max_batch. */
int batch_loader_chunk_records(size_t rec_bytes, size_t chunk_bytes, int max_batch);

#ifdef __cplusplus
}
#endif
#endif
