/* settings.c: the CIFAR_* tuning variables, read in one place (settings.h). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"
#include "core/settings.h"

const char *const settings_cpu_isa_names[3] = {"generic", "avx2", "avx512"};

/* CIFAR_CPU_ISA: the variant forced (tests and CI run every variant on one machine this
 * way), -1 when unset or empty. Whether this CPU runs it is the CPU backend's check
 * (net_cpu_ops_pick). */
static int settings_cpu_isa(void) {
    const char *want = getenv("CIFAR_CPU_ISA");
    if (!want || !want[0]) return -1;
    for (int isa = 0; isa < 3; isa++)
        if (strcmp(want, settings_cpu_isa_names[isa]) == 0) return isa;
    die_usage("CIFAR_CPU_ISA=%s: unknown variant (generic, avx2, avx512)", want);
}

/* CIFAR_CPU_CONV: unset, empty or "auto" (the AVX-512 variant's fp32 convolutions
 * through oneDNN, every layer, where it loads: backend-cpu/cpu_bf16.h), or "own" (the
 * table's own im2col + sgemm). 1 for own. */
int settings_cpu_conv_own(void) {
    const char *v = getenv("CIFAR_CPU_CONV");
    if (!v || !v[0] || strcmp(v, "auto") == 0) return 0;
    if (strcmp(v, "own") == 0) return 1;
    die_usage("CIFAR_CPU_CONV=%s: expected auto or own", v);
}

/* A flag: 1 when the variable is "1", 0 when "0", else the default. */
static int settings_flag(const char *name, int dflt) {
    const char *v = getenv(name);
    if (v && strcmp(v, "1") == 0) return 1;
    if (v && strcmp(v, "0") == 0) return 0;
    return dflt;
}

/* CIFAR_CUDA_DATA: unset or "auto" (the engine's rule), "resident", "stream", or
 * "stream:N" (streamed, the loader handing over N records at a time: tests use it to
 * interleave gathers and copies within small batches). */
static void settings_cuda_data(Settings *s) {
    const char *v = getenv("CIFAR_CUDA_DATA");
    s->cuda_data = SETTINGS_DATA_AUTO;
    s->cuda_data_chunk = 0;
    snprintf(s->cuda_data_text, sizeof s->cuda_data_text, "%s", v ? v : "");
    if (!v || !*v || strcmp(v, "auto") == 0) return;
    if (strcmp(v, "resident") == 0) {
        s->cuda_data = SETTINGS_DATA_RESIDENT;
        return;
    }
    s->cuda_data = SETTINGS_DATA_STREAM;
    if (strcmp(v, "stream") == 0) return;
    if (strncmp(v, "stream:", 7) == 0) {
        char *end = NULL;
        long n = strtol(v + 7, &end, 10);
        if (end != v + 7 && *end == '\0' && n >= 1 && n <= (1L << 20)) {
            s->cuda_data_chunk = (int)n;
            return;
        }
    }
    die("CIFAR_CUDA_DATA=%s: expected auto, resident, stream or stream:N (N records handed "
        "over at a time, 1 to 1048576)", v);
}

void settings_from_env(Settings *s) {
    memset(s, 0, sizeof *s);
    s->cpu_isa = settings_cpu_isa();
    s->cpu_conv_own = settings_cpu_conv_own();
    s->data_in_memory = settings_flag("CIFAR_DATA_IN_MEMORY", 0);
    settings_cuda_data(s);
    s->cuda_graph = settings_flag("CIFAR_CUDA_GRAPH", 1);
    s->cuda_phases = settings_flag("CIFAR_CUDA_PHASES", 0);
    s->cuda_bn_coop = settings_flag("CIFAR_CUDA_BN_COOP", 1);
}

/* CIFAR_COMM_TIMEOUT: a positive number of seconds. */
static double settings_comm_timeout(void) {
    const char *s = getenv("CIFAR_COMM_TIMEOUT");
    if (s == NULL || *s == '\0') return SETTINGS_COMM_DEFAULT_TIMEOUT;
    char *end = NULL;
    double t = strtod(s, &end);
    if (end == s || *end != '\0' || !(t > 0) || t > 1e7)
        die_usage("CIFAR_COMM_TIMEOUT=%s: expected a positive number of seconds (default 300)", s);
    return t;
}

/* CIFAR_COMM_SLOT_BYTES: 64 bytes to 1 GiB, rounded down to keep slots 64-byte aligned. */
static size_t settings_comm_slot_bytes(void) {
    const char *s = getenv("CIFAR_COMM_SLOT_BYTES");
    if (s == NULL || *s == '\0') return SETTINGS_COMM_DEFAULT_SLOT_BYTES;
    char *end = NULL;
    unsigned long long v = strtoull(s, &end, 10);
    if (end == s || *end != '\0' || v < 64 || v > ((size_t)1 << 30))
        die_usage("CIFAR_COMM_SLOT_BYTES=%s: expected 64 .. 1073741824 bytes", s);
    return (size_t)v & ~(size_t)63;
}

/* CIFAR_RENDEZVOUS_BIND: all | * (every interface) | an address of this machine. */
static void settings_rendezvous_bind(CommSettings *s) {
    const char *v = getenv("CIFAR_RENDEZVOUS_BIND");
    if (!v || !*v) return;
    if (strcmp(v, "all") == 0 || strcmp(v, "*") == 0) {
        s->bind_all = 1;
        return;
    }
    if (strlen(v) >= sizeof s->bind_addr)
        die_usage("CIFAR_RENDEZVOUS_BIND is longer than %zu characters", sizeof s->bind_addr - 1);
    snprintf(s->bind_addr, sizeof s->bind_addr, "%s", v);
}

void settings_comm_from_env(CommSettings *s) {
    memset(s, 0, sizeof *s);
    s->timeout_s = settings_comm_timeout();
    s->shm_slot_bytes = settings_comm_slot_bytes();
    settings_rendezvous_bind(s);
}
