/* net.c: the float instance of the network executor (net.h; the walk is
 * net_impl.h). Device-neutral: it goes into the commands (with the CPU table) and
 * into libcifar-cuda.so (with the CUDA table). */
#include "model/net.h"

#define NET_REAL float
#define NET_T(name) name
#define NET_OPS_DECLARED
#include "model/net_impl.h"
