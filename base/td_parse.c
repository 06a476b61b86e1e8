#include "base/td_parse.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

bool td_parse_long_n(const char *text, size_t n, long min, long max, long *out) {
    size_t i = 0;
    bool neg = false;
    if (n && (text[0] == '-' || text[0] == '+')) neg = text[i++] == '-';
    if (i == n) return false;
    /* accumulated as a negative number: LONG_MIN has no positive counterpart */
    long v = 0;
    for (; i < n; i++) {
        if (text[i] < '0' || text[i] > '9') return false;
        int d = text[i] - '0';
        if (v < (LONG_MIN + d) / 10) return false;
        v = v * 10 - d;
    }
    if (!neg && v == LONG_MIN) return false;
    v = neg ? v : -v;
    if (v < min || v > max) return false;
    *out = v;
    return true;
}

bool td_parse_long(const char *text, long min, long max, long *out) {
    return td_parse_long_n(text, strlen(text), min, max, out);
}

bool td_parse_double(const char *text, double min, double max, double *out) {
    /* strtod reads "nan", "inf" and hex floats too: a plain decimal number is all that is meant */
    for (const char *c = text; *c; c++)
        if (!strchr("0123456789+-.eE", *c)) return false;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (!text[0] || *end || errno != 0 || !(v >= min && v <= max)) return false;
    *out = v;
    return true;
}
