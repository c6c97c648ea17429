/* net_cpu.c: the CPU's op table (net.h's net_cpu_ops): ops.h's float ops, each
 * dispatching to the best instruction-set variant (ops_cpu.c). The table's body is
 * net_cpu_impl.h, shared with the double instance of the gradient tests. */
#include "model/net.h"

#define NET_REAL float
#define NET_T(name) name
#define NET_CPU_OP(name) name
#include "backend-cpu/net_cpu_impl.h"
