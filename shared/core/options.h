/* options.h: the numeric command-line option parsers every command uses, so
 * that "--batch-size 0" is refused the same way (and with the same message)
 * by cifar-train, cifar-eval and the launcher. */
#ifndef CIFAR_OPTIONS_H
#define CIFAR_OPTIONS_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

/* A decimal integer in [lo, hi], the whole text: 0 and *out, or -1 with
 * "--opt: expected an integer in [lo, hi], got 'text'" in err. `opt` is the
 * option's name without its dashes. */
int option_parse_int(const char *opt, const char *text, long long lo, long long hi, long long *out,
                     char *err, size_t errlen);

/* The same, exiting with status 2 (bad usage) and the message on failure. */
long long option_int(const char *opt, const char *text, long long lo, long long hi);

/* A finite number in [lo, hi]; exits 2 with a message otherwise. */
double option_real(const char *opt, const char *text, double lo, double hi);

/* A duration: a number of seconds with an optional unit s, m or h ("90s", "10m",
 * "1.5h", "30" = 30 s), in [0, hi] seconds; exits 2 with a message otherwise. */
double option_duration(const char *opt, const char *text, double hi);

/* The index of `text` in names[0..n); exits 2 naming the choices otherwise. */
int option_choice(const char *opt, const char *text, const char *const *names, int n);

#ifdef __cplusplus
}
#endif
#endif
