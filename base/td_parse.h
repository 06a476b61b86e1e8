/* Numbers from text, read one way everywhere (command-line options, environment variables, the
 * config file's strings, HTTP query parameters and path segments): the whole text must be a
 * decimal integer in range; no spaces, no trailing characters, no silent wrap-around. */
#ifndef TD_PARSE_H
#define TD_PARSE_H

#include <stdbool.h>
#include <stddef.h>

/* A decimal integer (optional sign) in [min, max] filling the whole of text. */
bool td_parse_long(const char *text, long min, long max, long *out);
/* The same over the n characters at text (which need not end there). */
bool td_parse_long_n(const char *text, size_t n, long min, long max, long *out);
/* A decimal number (digits, sign, point, exponent; no nan, inf or hex) in [min, max]. */
bool td_parse_double(const char *text, double min, double max, double *out);

#endif
