/* signals.h: the signals that stop cifar-train with a snapshot (--signals-to-handle),
 * as a set, and their names for messages. Both the worker (trainer.c: finish the
 * step, snapshot, exit 128 + N) and the launcher (launcher.c: pass the same signal
 * to its workers) install handlers for the same set. */
#ifndef CIFAR_SIGNALS_H
#define CIFAR_SIGNALS_H

#include <stddef.h>
#include <stdint.h>

/* Bit N set: signal N is handled. */
typedef uint64_t SignalSet;

/* The default set: SIGINT, SIGTERM, SIGUSR1 (Slurm's --signal=B:USR1@T before a
 * preemption or the time limit), SIGHUP (the terminal or the session went away). */
#define SIGNALS_DEFAULT_TEXT "SIGINT,SIGTERM,SIGUSR1,SIGHUP"

/* "SIGINT,SIGUSR1" (names with or without SIG, or numbers) into *set. Only signals
 * a job scheduler or a user sends to ask for a stop are accepted (HUP INT QUIT USR1
 * USR2 TERM ALRM XCPU). 0, or -1 with a reason in err. */
int signal_set_parse(const char *text, SignalSet *set, char *err, size_t errlen);

/* "SIGTERM", or "signal N" for one without a name here. */
const char *signal_name(int sig);

/* sigaction(handler) for every signal of the set. */
void signal_set_install(SignalSet set, void (*handler)(int));

#endif
