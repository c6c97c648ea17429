/* engine_stub.c: in CPU-only builds (no CIFAR_CUDA) the CUDA engine reports
 * that it is absent, so `--device auto` falls back to the CPU and `--device cuda`
 * fails with a clear message. CUDA builds get engine_cuda.cu instead. */
#ifndef CIFAR_CUDA
#include <stdio.h>

#include "engine.h"

Engine *engine_create_cuda(const EngineConfig *cfg, char *err, size_t errlen) {
    (void)cfg;
    snprintf(err, errlen, "this cifar-train was built without CUDA (rebuild with `make CUDA=1`)");
    return NULL;
}

int engine_cuda_device_count(void) { return 0; }
#else
/* ISO C forbids an empty translation unit. */
typedef int engine_stub_unused;
#endif
