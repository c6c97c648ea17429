/* host_api.c: the library's side of cuda_host.h. libcifar-cuda.so imports nothing
 * from the executable that loads it: the check.h, comm.h and engine.h functions
 * its code calls are defined here and forward to the table the executable hands
 * to cifar_cuda_init (cuda_loader.c does so right after dlopen).
 *
 * It also holds the capture guard (cuda_check.h's cuda_guard_run): while a CUDA
 * graph is captured, a failing check or die() inside the capture returns to the
 * engine with the message instead of exiting, so the engine can end the capture
 * and run eagerly.
 *
 * Why the longjmp is safe: it crosses only frames of this project's C code and of
 * its nvcc-compiled C++ (engine_cuda.cu, net_cuda.cu, the cuda_*.cu op files), never a frame of
 * cuDNN, cuBLAS, NCCL or the CUDA runtime (a check runs after the library call has
 * returned). C++ allows a longjmp over frames whose automatic objects all have
 * trivial destructors ([csetjmp.syn]); the .cu files hold only such objects (plain
 * structs, dim3, pointers: keep it so, no RAII on the host side of a .cu file). What
 * a failed capture leaves behind is discarded by the engine: the captured graph and
 * the sticky-free capture error. */
#include <setjmp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "comm/rendezvous.h"
#include "backend-cuda/cuda_host.h"
#include "core/check.h"

static const CudaHostApi *g_host;

/* The guard of the running thread: armed while cuda_guard_run runs its function. */
static __thread jmp_buf *g_guard;
static __thread char *g_guard_why;
static __thread size_t g_guard_len;

int cifar_cuda_init(const CudaHostApi *api) {
    if (api && api->version == CUDA_HOST_API_VERSION) g_host = api;
    return CUDA_HOST_API_VERSION;
}

/* Called before anything of the host is used: a library that was not initialised
 * has no way to report, so it says so on stderr and exits. */
static const CudaHostApi *host(void) {
    if (!g_host) {
        fputs("libcifar-cuda.so: used before cifar_cuda_init (load it through cuda_loader.c)\n",
              stderr);
        exit(1);
    }
    return g_host;
}

int cuda_guard_run(void (*fn)(void *), void *arg, char *why, size_t len) {
    jmp_buf here;
    jmp_buf *outer = g_guard;
    char *outer_why = g_guard_why;
    size_t outer_len = g_guard_len;
    why[0] = '\0';
    g_guard_why = why;
    g_guard_len = len;
    if (setjmp(here) == 0) {
        g_guard = &here;
        fn(arg);
        g_guard = outer;
        g_guard_why = outer_why;
        g_guard_len = outer_len;
        return 0;
    }
    g_guard = outer;
    g_guard_why = outer_why;
    g_guard_len = outer_len;
    return -1;
}

/* A failure while the guard is armed: keep the message, return to the guard. */
static void guard_escape(const char *message) {
    if (!g_guard) return;
    snprintf(g_guard_why, g_guard_len, "%s", message);
    longjmp(*g_guard, 1);
}

static const char *base_name(const char *path) {
    const char *s = strrchr(path, '/');
    return s ? s + 1 : path;
}

void check_fail(const char *file, int line, const char *what, const char *reason, const char *hint) {
    char message[1024];
    snprintf(message, sizeof message, "%s: %s (%s:%d)", what, reason, base_name(file), line);
    guard_escape(message);
    host()->check_fail(file, line, what, reason, hint);
    exit(1); /* not reached: the host's check_fail exits */
}

void die_status(int status, const char *fmt, ...) {
    char message[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    guard_escape(message);
    host()->die_message(status, message);
    exit(status); /* not reached */
}

const char *check_hint_for_errno(int err) { return host()->hint_for_errno(err); }

static void log_forward(CudaHostLogLevel level, const char *fmt, va_list ap) {
    char message[2048];
    vsnprintf(message, sizeof message, fmt, ap);
    host()->log_line(level, message);
}

void log_info(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_forward(CUDA_HOST_LOG_INFO, fmt, ap);
    va_end(ap);
}

void log_warn(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_forward(CUDA_HOST_LOG_WARN, fmt, ap);
    va_end(ap);
}

void log_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    log_forward(CUDA_HOST_LOG_ERROR, fmt, ap);
    va_end(ap);
}

void *xmalloc(size_t bytes) { return host()->xmalloc(bytes); }
void *xcalloc(size_t count, size_t size) { return host()->xcalloc(count, size); }

CommKind comm_kind(const Comm *c) { return host()->comm_kind(c); }
int comm_world_size(const Comm *c) { return host()->comm_world_size(c); }
void comm_allreduce_mean(Comm *c, float *buf, size_t n) { host()->comm_allreduce_mean(c, buf, n); }
void comm_broadcast(Comm *c, void *buf, size_t bytes, int root) {
    host()->comm_broadcast(c, buf, bytes, root);
}
void comm_allreduce_mean_on_stream(Comm *c, float *dev_buf, size_t n, void *cuda_stream) {
    host()->comm_allreduce_mean_on_stream(c, dev_buf, n, cuda_stream);
}
void comm_broadcast_on_stream(Comm *c, void *dev_buf, size_t bytes, int root, void *cuda_stream) {
    host()->comm_broadcast_on_stream(c, dev_buf, bytes, root, cuda_stream);
}
void comm_blame_laggard(char *buf, size_t len) { host()->comm_blame_laggard(buf, len); }
int dist_env_read(DistEnv *env, char *err, size_t errlen) {
    return host()->dist_env_read(env, err, errlen);
}

void rendezvous_share(const DistEnv *env, void *blob, size_t len, double timeout_s) {
    host()->rendezvous_share(env, blob, len, timeout_s);
}

float engine_ema_decay(const Engine *e, int64_t step) { return host()->engine_ema_decay(e, step); }

AugmentSpec engine_augment_spec(const Engine *e, int64_t epoch, int train) {
    return host()->engine_augment_spec(e, epoch, train);
}
