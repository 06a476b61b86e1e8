/* Metrics from a script that prints text: a command job's metrics.patterns, regular expressions
 * (PCRE2, Perl's syntax) with named groups, matched against each line rank 0 prints that is not
 * a JSON metric line. The first pattern that matches a line makes it a metric line: each named
 * group a field (a number when its text is one), "step" the step (else the count of that
 * pattern's matches so far, from 1), and the event "train" unless the pattern says "eval":
 *   "metrics": {"patterns": ["Epoch (?<epoch>\\d+) .* loss (?<loss>[\\d.]+)",
 *                            {"regex": "val loss (?<val_loss>[\\d.]+)", "event": "eval"}]}
 * A job's own regex runs in traind-shepherd on what the job prints: each match is bounded
 * (PCRE2's match, depth and heap limits; a line over 1 KiB is not matched), and matching as a
 * whole may take at most a fifth of the shepherd's time (lines beyond are not matched, and
 * counted), so no pattern can keep the shepherd from supervising the job. */
#ifndef TD_METRIC_PATTERNS_H
#define TD_METRIC_PATTERNS_H

#include "base/td_error.h"

#include <jansson.h>
#include <stddef.h>

enum { TD_METRIC_PATTERNS_MAX = 16, TD_METRIC_PATTERN_MAX_LEN = 1024 };

typedef struct td_metric_patterns td_metric_patterns;

/* Compiles list (metrics.patterns: an array of regex strings or {"regex", "event"} objects).
 * NULL with err and *bad (the index of the entry at fault, or -1 for the list) when one is not a
 * pattern this accepts: PCRE2's own message and offset, or what is missing (a named group). */
td_metric_patterns *td_metric_patterns_new(const json_t *list, int *bad, td_err *err);
/* The metric line (JSON and a newline, allocated) that line[0..len) makes, or NULL. */
char *td_metric_patterns_match(td_metric_patterns *p, const char *line, size_t len);
/* How many lines were not matched because matching had used its share of the time. */
long td_metric_patterns_skipped(const td_metric_patterns *p);
void td_metric_patterns_free(td_metric_patterns *p);

#endif
