/* version.c: see version.h. CIFAR_VERSION comes from the Makefile (only this file
 * is rebuilt when it changes). */
#include "core/version.h"

#include <stdio.h>
#include <stdlib.h>

#include "core/check.h"

#ifndef CIFAR_VERSION
#define CIFAR_VERSION "unversioned"
#endif

const char *cifar_version(void) { return CIFAR_VERSION; }

void version_print_and_exit(void) {
    printf("%s (cifar) %s\n", log_program(), CIFAR_VERSION);
    exit(fflush(stdout) == 0 ? 0 : 1);
}
