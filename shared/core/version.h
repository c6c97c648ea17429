/* version.h: the version every command prints for --version (the Makefile's
 * VERSION, `git describe` of the tree it was built from). */
#ifndef CIFAR_VERSION_H
#define CIFAR_VERSION_H

#ifdef __cplusplus
extern "C" {
#endif

const char *cifar_version(void);
/* "<program> (cifar) <version>" on stdout, as help2man and GNU tools expect; exit 0. */
void version_print_and_exit(void) __attribute__((noreturn));

#ifdef __cplusplus
}
#endif
#endif
