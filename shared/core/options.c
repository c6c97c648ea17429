/* options.c: see options.h. */
#include "core/options.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

int option_parse_int(const char *opt, const char *text, long long lo, long long hi, long long *out,
                     char *err, size_t errlen) {
    char *end = NULL;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || v < lo || v > hi) {
        snprintf(err, errlen, "--%s: expected an integer in [%lld, %lld], got '%s'", opt, lo, hi,
                 text);
        return -1;
    }
    *out = v;
    return 0;
}

long long option_int(const char *opt, const char *text, long long lo, long long hi) {
    char err[256];
    long long v = 0;
    if (option_parse_int(opt, text, lo, hi, &v, err, sizeof err) != 0) die_usage("%s", err);
    return v;
}

double option_real(const char *opt, const char *text, double lo, double hi) {
    char *end;
    double v = strtod(text, &end);
    /* Decimal only: strtod also reads hexadecimal ("0x10" is 16), "inf" and "nan". */
    int decimal = text[strspn(text, "0123456789.eE+-")] == '\0';
    if (!decimal || end == text || *end != '\0' || !isfinite(v) || v < lo || v > hi)
        die_usage("--%s: expected a number in [%g, %g], got '%s'", opt, lo, hi, text);
    return v;
}

double option_duration(const char *opt, const char *text, double hi) {
    char *end;
    double v = strtod(text, &end);
    double unit = *end == 's' ? 1 : *end == 'm' ? 60 : *end == 'h' ? 3600 : *end == '\0' ? 1 : 0;
    int ok = end != text && unit > 0 && (*end == '\0' || end[1] == '\0') && isfinite(v) && v >= 0 &&
             v * unit <= hi;
    if (!ok)
        die_usage("--%s: expected a duration such as 90s, 10m or 1h (0 = off, at most %gh), got '%s'",
                  opt, hi / 3600, text);
    return v * unit;
}

int option_choice(const char *opt, const char *text, const char *const *names, int n) {
    for (int i = 0; i < n; i++)
        if (strcmp(text, names[i]) == 0) return i;
    char list[256] = "";
    size_t off = 0;
    for (int i = 0; i < n && off < sizeof list; i++)
        off += (size_t)snprintf(list + off, sizeof list - off, "%s%s", i ? ", " : "", names[i]);
    die_usage("--%s: unknown value '%s' (%s)", opt, text, list);
}
