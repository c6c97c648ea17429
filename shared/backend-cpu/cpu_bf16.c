/* cpu_bf16.c: see cpu_bf16.h. The feature checks follow Intel's SDM (vol. 1, 13.2 and
 * 18.2): an instruction set is usable when cpuid lists it AND the OS saves its
 * register state (XCR0, read by xgetbv, OSXSAVE set); AMX's tile data also needs the
 * process's permission from Linux (arch_prctl ARCH_REQ_XCOMP_PERM, Linux 5.16+). */
#include "backend-cpu/cpu_bf16.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <sys/syscall.h>

#include "backend-cpu/ops_cpu.h"
#include "core/check.h"
#include "core/settings.h"

#if OPS_HAVE_VARIANTS
#include <cpuid.h>

#define XCR0_AVX512 0xe6u  /* SSE, AVX, opmask, ZMM_Hi256, Hi16_ZMM (bits 1, 2, 5, 6, 7) */
#define XCR0_AMX 0x60000u  /* XTILECFG, XTILEDATA (bits 17, 18) */
#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

static uint64_t xcr0(void) {
    uint32_t lo, hi;
    __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
    return ((uint64_t)hi << 32) | lo;
}

static int cpu_bf16_probe(void) {
    unsigned a, b, c, d;
    if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_OSXSAVE)) return 0;
    if (__get_cpuid_max(0, NULL) < 7) return 0;
    __cpuid_count(7, 0, a, b, c, d);
    const int avx512f = (b >> 16) & 1, amx_bf16 = (d >> 22) & 1, amx_tile = (d >> 24) & 1;
    const int subleaves = (int)a;
    int avx512_bf16 = 0;
    if (subleaves >= 1) {
        __cpuid_count(7, 1, a, b, c, d);
        avx512_bf16 = (a >> 5) & 1;
    }
    const uint64_t x = xcr0();
    int mask = 0;
    if (avx512f && avx512_bf16 && (x & XCR0_AVX512) == XCR0_AVX512) mask |= CPU_BF16_AVX512;
    if (amx_bf16 && amx_tile && (x & XCR0_AMX) == XCR0_AMX &&
        syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0)
        mask |= CPU_BF16_AMX;
    return mask;
}
#else
static int cpu_bf16_probe(void) { return 0; }
#endif

int cpu_bf16_features(void) {
    static int mask = -1; /* asked once: cpuid and the permission do not change */
    int m = __atomic_load_n(&mask, __ATOMIC_ACQUIRE);
    if (m < 0) {
        m = cpu_bf16_probe();
        __atomic_store_n(&mask, m, __ATOMIC_RELEASE);
    }
    return m;
}

/* The bf16 table: ops_cpu_bf16.c's (bf16 activations), its convolutions conv_dnnl.c's. */
extern const NetOps net_cpu_ops_avx512_bf16act;
void cpu_dnnl_conv_entries(NetOps *t);
void cpu_dnnl_conv_entries_f32(NetOps *t);
const char *cpu_dnnl_conv_backend(void);
const char *cpu_dnnl_load_error(void); /* NULL once oneDNN is loaded (dlopen) */

/* The reasons that do not depend on the CPU first (CIFAR_CPU_ISA, the build), so the
 * refusal names the same reason on every machine (train.bats, .ci/run's DNNL=0 check). */
const char *cpu_bf16_why_not(int isa) {
    if (isa >= 0 && isa < CPU_ISA_AVX512)
        return isa == CPU_ISA_AVX2 ? "CIFAR_CPU_ISA=avx2 turns AVX-512 off"
                                   : "CIFAR_CPU_ISA=generic turns AVX-512 off";
#ifndef CIFAR_DNNL
    return "this build has no oneDNN (install libdnnl-dev and rebuild)";
#endif
    if (!cpu_bf16_features())
        return "this CPU lacks AVX512-BF16 and AMX-BF16 (or the OS has not enabled them)";
    if (cpu_isa_best() < CPU_ISA_AVX512) return "this CPU (or build) lacks the AVX-512 variant of the CPU ops";
#ifdef CIFAR_DNNL
    return cpu_dnnl_load_error(); /* last: the library is loaded only where it can serve */
#else
    return NULL;
#endif
}

#ifdef CIFAR_DNNL
/* *table, made once from base with its convs replaced by with_convs (on one thread,
 * before any team: the picks run at start). */
static const NetOps *table_once(NetOps *table, int *made, const NetOps *base, void (*with_convs)(NetOps *)) {
    if (!__atomic_load_n(made, __ATOMIC_ACQUIRE)) {
        *table = *base;
        with_convs(table);
        __atomic_store_n(made, 1, __ATOMIC_RELEASE);
    }
    return table;
}
#endif

const NetOps *net_cpu_ops_bf16(void) {
#ifdef CIFAR_DNNL
    static NetOps table;
    static int made;
    if (cpu_bf16_why_not(-1)) return NULL;
    return table_once(&table, &made, &net_cpu_ops_avx512_bf16act, cpu_dnnl_conv_entries);
#else
    return NULL;
#endif
}

const NetOps *net_cpu_ops_dnnl(void) {
#ifdef CIFAR_DNNL
    static NetOps table;
    static int made;
    if (cpu_isa_best() < CPU_ISA_AVX512 || cpu_dnnl_load_error()) return NULL;
    return table_once(&table, &made, net_cpu_ops_isa(CPU_ISA_AVX512), cpu_dnnl_conv_entries_f32);
#else
    return NULL;
#endif
}

const NetOps *net_cpu_ops_pick_bf16(int isa) {
    const char *why = cpu_bf16_why_not(isa);
    if (why)
        die_usage("--precision bf16 on the CPU: %s ---> HINT: use --precision fp32 (or tf32, "
                  "the same on the CPU), or a CPU with AVX512-BF16 or AMX",
                  why);
    net_cpu_ops_pick_conv(CPU_ISA_AVX512, 1); /* the AVX-512 variant; its convs are replaced */
    const NetOps *t = net_cpu_ops_bf16();
    net_cpu_ops_use(t);
    return t;
}

const char *cpu_bf16_backend(void) {
#ifdef CIFAR_DNNL
    return cpu_dnnl_conv_backend();
#else
    return "none";
#endif
}

void cpu_bf16_pack(size_t count, const float *src, float *dst) {
#ifdef CIFAR_DNNL
    cpu_dnnl_pack_bf16(count, src, (uint16_t *)dst);
#else
    (void)count, (void)src, (void)dst;
    die("cpu_bf16_pack: this build has no oneDNN, so no bf16 table (internal error)");
#endif
}
