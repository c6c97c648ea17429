/* test_comm_nccl: the NCCL transport (shared/comm/comm_nccl_cuda.c) with a one-rank
 * communicator, the only NCCL a single GPU can run: world size 1 otherwise never
 * touches NCCL (comm_create makes a COMM_SINGLE). Built in CUDA builds only; run by
 * make test-gpu and tests/gpu/run.sh.
 *
 * Checked, on the device's own stream as the CUDA engine does it: creation (the id
 * served on an ephemeral port, ncclCommInitRankConfig non-blocking), the all-reduce
 * mean (unchanged over one rank), the host all-reduce of doubles, device and host
 * broadcasts over 1 MiB (the host one in several scratch-sized pieces), the barrier,
 * and destruction (ncclCommFinalize, ncclCommDestroy).
 *
 * Exit status 77 with one line when no GPU is usable; 1 when a check fails. Like
 * test_ops_cuda it links libcifar-cuda.so and points cuda_loader.c at it. */
#define _GNU_SOURCE /* dladdr */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend-cuda/ops_cuda.h"
#include "comm/comm.h"
#include "comm/comm_nccl.h"
#include "backend-cuda/cuda_host.h"
#include "model/engine.h"
#include "core/check.h"
#include "unit.h"

int cifar_cuda_init(const CudaHostApi *api);

/* One more than the communicator's 1 MiB scratch, so the host broadcast takes two pieces. */
#define BIG_BYTES (((size_t)1 << 20) + 4099)

static void expect_true(const char *what, int ok) {
    EXPECT(ok, "%s", what);
    printf("%s %s\n", ok ? "ok  " : "FAIL", what);
}

static unsigned char pattern(size_t i) { return (unsigned char)(i * 131 + 7); }

static void test_device_collectives(CudaCtx *ctx, CommNccl *nc) {
    const size_t n = 100003;
    float *h = xmalloc(n * sizeof(float)), *back = xmalloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) h[i] = (float)i * 0.25f - 7.0f;
    float *d = cuda_alloc(n * sizeof(float));
    cuda_upload(ctx, d, h, n * sizeof(float));
    comm_nccl_allreduce_mean(nc, d, n, cuda_ctx_stream(ctx));
    cuda_download(ctx, back, d, n * sizeof(float));
    expect_true("all-reduce mean over one rank leaves the buffer unchanged (engine stream)",
                memcmp(back, h, n * sizeof(float)) == 0);

    unsigned char *hb = xmalloc(BIG_BYTES), *bb = xmalloc(BIG_BYTES);
    for (size_t i = 0; i < BIG_BYTES; i++) hb[i] = pattern(i);
    unsigned char *db = cuda_alloc(BIG_BYTES);
    cuda_upload(ctx, db, hb, BIG_BYTES);
    comm_nccl_broadcast(nc, db, BIG_BYTES, 0, cuda_ctx_stream(ctx));
    cuda_download(ctx, bb, db, BIG_BYTES);
    expect_true("device broadcast of 1 MiB + 4099 bytes from root 0",
                memcmp(bb, hb, BIG_BYTES) == 0);
    cuda_free(d);
    cuda_free(db);
    free(h); free(back); free(hb); free(bb);
}

static void test_host_collectives(CommNccl *nc) {
    double sums[5] = {1.5, -2.25, 1e300, 0.0, 3.0}, want[5];
    memcpy(want, sums, sizeof sums);
    comm_nccl_allreduce_sum_f64(nc, sums, 5);
    expect_true("host all-reduce of doubles over one rank", memcmp(sums, want, sizeof sums) == 0);
    unsigned char *hb = xmalloc(BIG_BYTES);
    for (size_t i = 0; i < BIG_BYTES; i++) hb[i] = pattern(i);
    comm_nccl_broadcast_host(nc, hb, BIG_BYTES, 0);
    int same = 1;
    for (size_t i = 0; i < BIG_BYTES; i++) same &= hb[i] == pattern(i);
    expect_true("host broadcast of 1 MiB + 4099 bytes (two scratch pieces)", same);
    free(hb);
    comm_nccl_barrier(nc);
    expect_true("barrier returns", 1);
}

/* cuda_loader.c's forwarders (in libcifar.a) must find the library this test links. */
static void loader_use_linked_library(void) {
    Dl_info info;
    if (!dladdr((void *)cuda_ctx_create, &info) || !info.dli_fname)
        die("test_comm_nccl: cannot find the path of the linked libcifar-cuda.so");
    setenv("CIFAR_CUDA_LIB", info.dli_fname, 1);
}

int main(void) {
    log_set_program("test_comm_nccl");
    cifar_cuda_init(cuda_host_api());
    loader_use_linked_library();
    if (engine_cuda_device_count() == 0 && cuda_library_error())
        die("test_comm_nccl: the loader cannot use the linked library: %s", cuda_library_error());
    if (engine_cuda_device_count() == 0) {
        printf("test_comm_nccl: SKIP: no usable CUDA device (no driver or no GPU)\n");
        return 77;
    }
    CudaCtx *ctx = cuda_ctx_create(0, 0, 1, 1); /* selects device 0, as the engine does */
    DistEnv env;
    memset(&env, 0, sizeof env);
    env.world_size = env.local_world_size = 1;
    snprintf(env.master_addr, sizeof env.master_addr, "127.0.0.1");
    env.master_port = 0; /* an ephemeral port: nobody connects with one rank */
    CommNccl *nc = comm_nccl_create(&env, 60.0);
    expect_true("one-rank NCCL communicator created", nc != NULL);
    test_device_collectives(ctx, nc);
    test_host_collectives(nc);
    comm_nccl_destroy(nc);
    expect_true("communicator destroyed", 1);
    cuda_ctx_free(ctx);
    return unit_report("test_comm_nccl");
}
