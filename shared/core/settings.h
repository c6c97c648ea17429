/* settings.h: the CIFAR_* tuning variables of the commands, read and checked in one
 * place (settings_from_env, once, at the start of a worker or of cifar-eval) into a
 * Settings that the commands hand on: the engines get it in EngineConfig.settings,
 * the data loading its one field. Nothing below the commands reads these variables
 * (but net_cpu_ops()'s lazy pick, for tests and benchmarks that make no engine).
 *
 *   CIFAR_CPU_ISA=V          the CPU ops' variant: generic | avx2 | avx512 (default: the best)
 *   CIFAR_CPU_CONV=own       the AVX-512 variant's fp32 convs without oneDNN (default auto)
 *   CIFAR_DATA_IN_MEMORY=1   copy each split to memory (default: read in place from the map)
 *   CIFAR_CUDA_DATA=M        auto (default) | resident | stream | stream:N (N records at a time)
 *   CIFAR_CUDA_GRAPH=0       no CUDA graph: every GPU step eager
 *   CIFAR_CUDA_PHASES=1      time an eager step's phases (implies CIFAR_CUDA_GRAPH=0)
 *   CIFAR_CUDA_BN_COOP=0     two kernels per training batch norm, not one cooperative
 *
 * The communicators' own, read here too (settings_comm_from_env, by dist_env_read into
 * DistEnv.comm, which every communicator receives):
 *   CIFAR_COMM_TIMEOUT=S     seconds a collective waits for a peer (default 300)
 *   CIFAR_COMM_SLOT_BYTES=N  the shm communicator's slot (default 4 MiB; tests use small)
 *   CIFAR_RENDEZVOUS_BIND=A  where rank 0 listens: all | * | an address (default MASTER_ADDR)
 *
 * Not here: the launch protocol between the launcher and its workers (RANK, MASTER_ADDR,
 * CIFAR_RUN_ID, CIFAR_JOB_TOKEN, ...: comm.h's DistEnv), the libraries' paths
 * (CIFAR_CUDA_LIB, CIFAR_MPI_LIB, CIFAR_GLOO_LIB, CIFAR_DNNL_LIB). The test suite's fault injection is
 * not in the shipped commands at all: only the test build of cifar-train reads it
 * (tests/train_hooks.c, train/test_hooks.h). */
#ifndef CIFAR_SETTINGS_H
#define CIFAR_SETTINGS_H

#include <stddef.h>

typedef enum { SETTINGS_DATA_AUTO, SETTINGS_DATA_RESIDENT, SETTINGS_DATA_STREAM } SettingsDataMode;

typedef struct {
    int cpu_isa;                    /* CIFAR_CPU_ISA: -1 unset, else 0 generic, 1 avx2, 2 avx512 */
    int cpu_conv_own;               /* CIFAR_CPU_CONV=own: the fp32 convs never through oneDNN */
    int data_in_memory;             /* CIFAR_DATA_IN_MEMORY */
    SettingsDataMode cuda_data;     /* CIFAR_CUDA_DATA */
    int cuda_data_chunk;            /* its N (stream:N), else 0 */
    char cuda_data_text[32];        /* its value as given, for messages ("" when unset) */
    int cuda_graph;                 /* CIFAR_CUDA_GRAPH (default 1) */
    int cuda_phases;                /* CIFAR_CUDA_PHASES (default 0) */
    int cuda_bn_coop;               /* CIFAR_CUDA_BN_COOP (default 1) */
} Settings;

#define SETTINGS_COMM_DEFAULT_TIMEOUT 300.0
#define SETTINGS_COMM_DEFAULT_SLOT_BYTES ((size_t)4 << 20)

typedef struct {
    double timeout_s;          /* CIFAR_COMM_TIMEOUT */
    size_t shm_slot_bytes;     /* CIFAR_COMM_SLOT_BYTES, a multiple of 64 */
    int bind_all;              /* CIFAR_RENDEZVOUS_BIND=all or * */
    char bind_addr[256];       /* CIFAR_RENDEZVOUS_BIND=ADDR, "" when unset */
} CommSettings;

/* The communicators' variables, checked (a malformed value stops with exit status 2, as
 * bad usage: the launcher does not restart a group for it). */
void settings_comm_from_env(CommSettings *s);

/* The names of CIFAR_CPU_ISA's variants, by level. */
extern const char *const settings_cpu_isa_names[3];

/* The variables above, checked (a malformed value stops with a message naming it; an
 * unknown CIFAR_CPU_ISA with exit status 2, as bad usage). */
void settings_from_env(Settings *s);
/* CIFAR_CPU_CONV alone (1 for own; malformed: exit 2), for the CPU backend's lazy pick. */
int settings_cpu_conv_own(void);

/* The variables for the commands' --help (and so their man pages). */
#define SETTINGS_HELP                                                                       \
    "Environment (read once at start; a malformed value stops the command):\n"              \
    "  CIFAR_CPU_ISA=V        the CPU ops' instruction-set variant: generic | avx2 | avx512\n" \
    "                         (default: the best this CPU runs; one it lacks exits 2;\n"    \
    "                         generic and avx2 refuse cifar-train --precision bf16)\n"     \
    "  CIFAR_CPU_CONV=own     the AVX-512 variant's fp32 convs without oneDNN (default\n"  \
    "                         auto: through oneDNN where libdnnl.so.2, or CIFAR_DNNL_LIB,\n" \
    "                         loads)\n"                                                       \
    "  CIFAR_DATA_IN_MEMORY=1 copy each split to memory instead of reading it in place\n"   \
    "  CIFAR_CUDA_DATA=M      GPU data: auto (default) | resident | stream | stream:N\n"     \
    "  CIFAR_CUDA_GRAPH=0     no CUDA graph: every GPU step eager\n"                         \
    "  CIFAR_CUDA_PHASES=1    time an eager GPU step's phases (no CUDA graph)\n"             \
    "  CIFAR_CUDA_BN_COOP=0   two kernels per training batch norm, not one cooperative\n"

#endif
