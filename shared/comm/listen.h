/* listen.h: a listening TCP socket on the first of getaddrinfo's addresses that binds,
 * shared by the servers of a job: rank 0's rendezvous (rendezvous.c) and the launcher
 * agents' store (train/agent_store.c). */
#ifndef CIFAR_LISTEN_H
#define CIFAR_LISTEN_H

#include <netdb.h>

/* A non-blocking, close-on-exec socket with SO_REUSEADDR, bound and listening (backlog
 * 128) on the first address of `res` that allows it; with `dual_stack`, an IPv6
 * address also takes IPv4 (IPV6_V6ONLY off). Returns it, or -1 with the last error in
 * *err (EADDRNOTAVAIL: not an address of this machine; EADDRINUSE: the port is taken). */
int listen_first(const struct addrinfo *res, int dual_stack, int *err);

#endif
