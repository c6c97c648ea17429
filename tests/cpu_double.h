/* cpu_double.h: the CPU op table (backend-cpu/ops_cpu_impl.h) and the network
 * executor (net_impl.h), both in double, for the gradient and reference tests: the
 * very code the commands run, in float64. Names: the table net_cpu_opsD (its entries
 * cpu_<entry>, callable directly: cpu_conv_forward, cpu_bn_train, ...), its conv plan
 * CpuConvPlan, the executor net_<fn>D and struct NetD. Include once, in one test
 * file. */
#ifndef CIFAR_TESTS_CPU_DOUBLE_H
#define CIFAR_TESTS_CPU_DOUBLE_H

#include "backend-cpu/ops_cpu.h" /* the float instance first (net.h) */

#define NET_REAL double
#define NET_T(name) name##D
#include "model/net_ops.h"
#define OPS_GEMM cblas_dgemm
#define OPS_CPU_TABLE net_cpu_opsD
#define OPS_CPU_NAME "cpu-double"
#include "backend-cpu/ops_cpu_impl.h"
#define NET_OPS_DECLARED
#include "model/net_impl.h"
#undef NET_OPS_DECLARED

#endif
