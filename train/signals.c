/* signals.c: see signals.h. */
#include "signals.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
    int sig;
    const char *name;
    int stoppable; /* may be in --signals-to-handle */
} signal_table[] = {
    {SIGHUP, "SIGHUP", 1},   {SIGINT, "SIGINT", 1},   {SIGQUIT, "SIGQUIT", 1}, {SIGILL, "SIGILL", 0},
    {SIGTRAP, "SIGTRAP", 0}, {SIGABRT, "SIGABRT", 0}, {SIGBUS, "SIGBUS", 0},   {SIGFPE, "SIGFPE", 0},
    {SIGKILL, "SIGKILL", 0}, {SIGUSR1, "SIGUSR1", 1}, {SIGSEGV, "SIGSEGV", 0}, {SIGUSR2, "SIGUSR2", 1},
    {SIGPIPE, "SIGPIPE", 0}, {SIGALRM, "SIGALRM", 1}, {SIGTERM, "SIGTERM", 1}, {SIGXCPU, "SIGXCPU", 1},
    {SIGXFSZ, "SIGXFSZ", 0}, {SIGSYS, "SIGSYS", 0},
};
#define SIGNAL_TABLE_N (sizeof signal_table / sizeof *signal_table)

const char *signal_name(int sig) {
    for (size_t i = 0; i < SIGNAL_TABLE_N; i++)
        if (signal_table[i].sig == sig) return signal_table[i].name;
    static char other[32];
    snprintf(other, sizeof other, "signal %d", sig);
    return other;
}

/* One entry of the list: its table index, or -1. */
static int signal_lookup(const char *word) {
    char *end;
    long num = strtol(word, &end, 10);
    int numeric = end != word && *end == '\0';
    for (size_t i = 0; i < SIGNAL_TABLE_N; i++) {
        const char *name = signal_table[i].name;
        if (numeric ? num == signal_table[i].sig
                    : strcasecmp(word, name) == 0 || strcasecmp(word, name + 3) == 0)
            return (int)i;
    }
    return -1;
}

int signal_set_parse(const char *text, SignalSet *set, char *err, size_t errlen) {
    char buf[256];
    if (strlen(text) >= sizeof buf) {
        snprintf(err, errlen, "--signals-to-handle: the list is too long");
        return -1;
    }
    snprintf(buf, sizeof buf, "%s", text);
    SignalSet s = 0;
    char *save = NULL;
    for (char *w = strtok_r(buf, ", ", &save); w; w = strtok_r(NULL, ", ", &save)) {
        int i = signal_lookup(w);
        if (i < 0 || !signal_table[i].stoppable) {
            snprintf(err, errlen,
                     "--signals-to-handle: '%s' is not a signal that asks for a stop (choose among "
                     "SIGHUP SIGINT SIGQUIT SIGUSR1 SIGUSR2 SIGTERM SIGALRM SIGXCPU)", w);
            return -1;
        }
        s |= (SignalSet)1 << signal_table[i].sig;
    }
    if (s == 0) {
        snprintf(err, errlen, "--signals-to-handle: the list is empty");
        return -1;
    }
    *set = s;
    return 0;
}

void signal_set_install(SignalSet set, void (*handler)(int)) {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = handler;
    sigemptyset(&sa.sa_mask);
    for (int sig = 1; sig < 64; sig++)
        if (set & ((SignalSet)1 << sig)) sigaction(sig, &sa, NULL);
}
