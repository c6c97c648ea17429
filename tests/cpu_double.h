/* cpu_double.h: the CPU ops (ops_cpu_impl.h), their op table (net_cpu_impl.h) and the
 * network executor (net_impl.h), all in double, for the gradient and reference
 * tests: the very code the commands run, in float64. Names: ops_d_<op>,
 * net_<fn>D, struct NetD, net_cpu_opsD. Include once, in one test file. */
#ifndef CIFAR_TESTS_CPU_DOUBLE_H
#define CIFAR_TESTS_CPU_DOUBLE_H

#define OPS_REAL double
#define OPS_FN(name) ops_d_##name
#define OPS_GEMM cblas_dgemm
#include "backend-cpu/ops_cpu_impl.h"

#define NET_REAL double
#define NET_T(name) name##D
#include "model/net_ops.h"
#define NET_OPS_DECLARED
#define NET_CPU_OP(name) ops_d_##name
#include "backend-cpu/net_cpu_impl.h"
#include "model/net_impl.h"
#undef NET_OPS_DECLARED

#endif
