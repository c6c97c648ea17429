/* cuda_check.h: CHECK_CUDA / CHECK_CUDNN / CHECK_CUBLAS / CHECK_NCCL, the CUDA half
 * of check.h's family. Include only from CUDA code (the .cu files and the _cuda.c files in shared):
 * CPU-only code never sees a CUDA header.
 *
 * Each macro prints the failing call as text, the library's own reason, file:line and
 * a hint, then exits 1 through check_fail():
 *     cifar-train: cudaMalloc(&p, bytes): out of memory (cuda_context.cu:42)
 *     ---> HINT: lower --batch-size or use a GPU with more free memory
 * CHECK_CUDA_LAST() checks the launch of the kernel just started (cudaGetLastError). */
#ifndef CIFAR_CUDA_CHECK_H
#define CIFAR_CUDA_CHECK_H

#include "core/check.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#ifdef __cplusplus
extern "C" {
#endif

static inline const char *cuda_check_hint(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "the GPU is out of memory: lower --batch-size or free the GPU";
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return "no usable GPU: check nvidia-smi and the driver, or run with --device cpu";
    case cudaErrorInvalidDevice:
        return "the device index does not exist: check CUDA_VISIBLE_DEVICES and --nproc-per-node";
    case cudaErrorDevicesUnavailable:
        return "the GPU is busy or in exclusive mode: check what else runs on it (nvidia-smi)";
    case cudaErrorCooperativeLaunchTooLarge:
        return "a cooperative batch-norm grid does not fit on this GPU as it is shared or limited now "
               "(MPS, another context): run with CIFAR_CUDA_BN_COOP=0 (two kernels per batch norm)";
    case cudaErrorUnsupportedPtxVersion:
    case cudaErrorNoKernelImageForDevice:
        return "the binary was not built for this GPU: rebuild with CUDA_ARCHS for its compute capability";
    default:
        return "a CUDA call failed: check nvidia-smi, the driver and CUDA_VISIBLE_DEVICES";
    }
}

/* cuDNN 9 reports sub-codes (3001-3014 "not supported: shape", 4004 "device
 * allocation failed", ...): the hint is chosen by the thousands, the class. */
static inline const char *cudnn_check_hint(cudnnStatus_t s) {
    int code = (int)s;
    if (code == 4003 || code == 4004) /* host / device allocation failed */
        return "out of memory: lower --batch-size or free the GPU";
    switch (code / 1000) {
    case 1: return "cuDNN is not set up: check that its sub-libraries match the cuDNN version and CUDA";
    case 2: return "a cuDNN call got a bad parameter (internal error): report it with the command line";
    case 3: return "cuDNN does not support this configuration: try --precision fp32, without --deterministic, or another cuDNN version";
    case 4: return "cuDNN failed internally: check the driver and that cuDNN matches the CUDA version";
    case 5: return "a GPU kernel of cuDNN failed: check nvidia-smi and the driver";
    default: return "a cuDNN call failed: check that cuDNN matches the CUDA version";
    }
}

/* "<cuDNN's name> (status N): <cudnnGetLastErrorString>" then exit. */
static inline void cudnn_check_fail(const char *file, int line, const char *what, cudnnStatus_t s) {
    char last[256] = "", reason[512];
    cudnnGetLastErrorString(last, sizeof last);
    snprintf(reason, sizeof reason, "%s (status %d)%s%s", cudnnGetErrorString(s), (int)s,
             last[0] ? ": " : "", last);
    check_fail(file, line, what, reason, cudnn_check_hint(s));
}

static inline const char *nccl_check_hint(ncclResult_t r) {
    switch (r) {
    case ncclSystemError:
    case ncclRemoteError:
        return "a peer or the network failed: check that every rank is alive and NCCL_SOCKET_IFNAME (NCCL_DEBUG=INFO tells more)";
    case ncclInvalidUsage:
        return "NCCL refused the call: with \"Duplicate GPU detected\" (NCCL_DEBUG=WARN) two ranks share one GPU "
               "(more processes per node than GPUs: lower --nproc-per-node or check CUDA_VISIBLE_DEVICES); "
               "else check WORLD_SIZE and that every rank runs the same command";
    case ncclInvalidArgument:
        return "NCCL was called inconsistently across ranks: check WORLD_SIZE and that every rank runs the same command";
    default:
        return "run with NCCL_DEBUG=INFO for details";
    }
}

/* Runs fn(arg); a failing check or die() inside it (on this thread) returns here
 * instead of exiting: -1 with the message in why, else 0. For a CUDA graph
 * capture, which must be ended whatever happens inside (host_api.c). */
int cuda_guard_run(void (*fn)(void *), void *arg, char *why, size_t len);

#define CHECK_CUDA(call)                                                                 \
    do {                                                                                \
        cudaError_t check_cuda_e_ = (call);                                             \
        if (check_cuda_e_ != cudaSuccess)                                               \
            check_fail(__FILE__, __LINE__, #call, cudaGetErrorString(check_cuda_e_),    \
                       cuda_check_hint(check_cuda_e_));                                 \
    } while (0)

/* After a kernel launch <<<...>>>: launch errors surface only through this. */
#define CHECK_CUDA_LAST() CHECK_CUDA(cudaGetLastError())

#define CHECK_CUDNN(call)                                                                \
    do {                                                                                \
        cudnnStatus_t check_cudnn_s_ = (call);                                          \
        if (check_cudnn_s_ != CUDNN_STATUS_SUCCESS)                                     \
            cudnn_check_fail(__FILE__, __LINE__, #call, check_cudnn_s_);                \
    } while (0)

#define CHECK_CUBLAS(call)                                                               \
    do {                                                                                \
        cublasStatus_t check_cublas_s_ = (call);                                        \
        if (check_cublas_s_ != CUBLAS_STATUS_SUCCESS)                                   \
            check_fail(__FILE__, __LINE__, #call, cublasGetStatusString(check_cublas_s_), \
                       "a cuBLAS call failed: check GPU memory and the CUDA version");  \
    } while (0)

#define CHECK_NCCL(call)                                                                 \
    do {                                                                                \
        ncclResult_t check_nccl_r_ = (call);                                            \
        if (check_nccl_r_ != ncclSuccess)                                               \
            check_fail(__FILE__, __LINE__, #call, ncclGetErrorString(check_nccl_r_),    \
                       nccl_check_hint(check_nccl_r_));                                 \
    } while (0)

#ifdef __cplusplus
}
#endif
#endif
