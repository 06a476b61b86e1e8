/* metrics.patterns: PCRE2 for the regular expressions (Debian's libpcre2: named groups and
 * bounded matching, which POSIX regex has neither of). */
#define PCRE2_CODE_UNIT_WIDTH 8
#include "service/run/td_metric_patterns.h"

#include "base/td_strv.h"

#include <errno.h>
#include <math.h>
#include <pcre2.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* PCRE2's match limit counts again at each start position in the line, so one match may take
 * about MAX_LINE × MATCH_LIMIT steps (some 0.3 s at worst); over time, matching may take at most
 * BUDGET_SHARE of the shepherd's time (bursts of BUDGET_BURST_S): lines beyond it are not matched,
 * and the shepherd stays free to supervise the job. */
enum { MAX_LINE = 1024, MATCH_LIMIT = 10000, DEPTH_LIMIT = 2000, HEAP_LIMIT_KIB = 4096 };
#define BUDGET_SHARE   0.2
#define BUDGET_BURST_S 0.5

typedef struct pattern {
    pcre2_code *code;
    pcre2_match_data *data;
    const char *event;
    long matches;
} pattern;

struct td_metric_patterns {
    pattern p[TD_METRIC_PATTERNS_MAX];
    int n;
    pcre2_match_context *limits;
    double budget_s, refilled_at; /* matching time left, and when it was last topped up */
    long skipped;                 /* lines not matched for want of it */
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + t.tv_nsec * 1e-9;
}

/* The regex and event of entry v. */
static int entry_parts(const json_t *v, const char **regex, const char **event, td_err *err) {
    *event = "train";
    if (json_is_string(v)) {
        *regex = json_string_value(v);
        return 0;
    }
    if (!json_is_object(v) || !json_is_string(json_object_get(v, "regex")))
        return td_fail(err, "expected a regular expression, or {\"regex\": ..., \"event\": "
                            "\"train\" or \"eval\"}");
    *regex = json_string_value(json_object_get(v, "regex"));
    const char *key;
    json_t *member;
    json_object_foreach((json_t *)v, key, member) {
        if (strcmp(key, "regex") != 0 && strcmp(key, "event") != 0)
            return td_fail(err, "unknown key \"%.64s\" (expected regex and event)", key);
    }
    json_t *e = json_object_get(v, "event");
    if (e) {
        const char *s = json_string_value(e);
        if (!s || (strcmp(s, "train") != 0 && strcmp(s, "eval") != 0))
            return td_fail(err, "event: expected \"train\" or \"eval\"");
        *event = strcmp(s, "train") == 0 ? "train" : "eval";
    }
    return 0;
}

static int compile(pattern *p, const char *regex, td_err *err) {
    if (strlen(regex) > TD_METRIC_PATTERN_MAX_LEN)
        return td_fail(err, "longer than %d characters", TD_METRIC_PATTERN_MAX_LEN);
    int code;
    PCRE2_SIZE at;
    p->code = pcre2_compile((PCRE2_SPTR)regex, PCRE2_ZERO_TERMINATED, PCRE2_UTF, &code, &at, NULL);
    if (!p->code) {
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(code, msg, sizeof msg);
        return td_fail(err, "not a regular expression: %s at offset %zu", (char *)msg, (size_t)at);
    }
    uint32_t names = 0;
    pcre2_pattern_info(p->code, PCRE2_INFO_NAMECOUNT, &names);
    if (names == 0)
        return td_fail(err, "no named group: name what a group captures, as (?<loss>[0-9.]+)");
    p->data = pcre2_match_data_create_from_pattern(p->code, NULL);
    return 0;
}

td_metric_patterns *td_metric_patterns_new(const json_t *list, int *bad, td_err *err) {
    *bad = -1;
    if (!json_is_array(list) || json_array_size(list) == 0 ||
        json_array_size(list) > TD_METRIC_PATTERNS_MAX) {
        td_fail(err, "expected an array of 1 to %d patterns", TD_METRIC_PATTERNS_MAX);
        return NULL;
    }
    td_metric_patterns *m = td_calloc(1, sizeof *m);
    m->limits = pcre2_match_context_create(NULL);
    pcre2_set_match_limit(m->limits, MATCH_LIMIT);
    pcre2_set_depth_limit(m->limits, DEPTH_LIMIT);
    pcre2_set_heap_limit(m->limits, HEAP_LIMIT_KIB);
    m->budget_s = BUDGET_BURST_S;
    m->refilled_at = now_s();
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *regex = NULL;
        pattern *p = &m->p[m->n++];
        if (entry_parts(json_array_get(list, i), &regex, &p->event, err) != 0 ||
            compile(p, regex, err) != 0) {
            *bad = (int)i;
            td_metric_patterns_free(m);
            return NULL;
        }
    }
    return m;
}

/* The text of a group as a JSON value: an integer or a finite number when it is one (an epoch
 * stays 3, not 3.0), else the string. */
static json_t *value_of(const char *s, size_t n) {
    char buf[64];
    if (n > 0 && n < sizeof buf) {
        memcpy(buf, s, n);
        buf[n] = 0;
        char *end;
        errno = 0;
        long long i = strtoll(buf, &end, 10);
        if (*end == 0 && errno == 0) return json_integer((json_int_t)i);
        double v = strtod(buf, &end);
        if (*end == 0 && isfinite(v)) return json_real(v);
    }
    /* a NUL would be \u0000, which the daemon's parser (as most) refuses: no such field */
    return memchr(s, 0, n) ? NULL : json_stringn_nocheck(s, n);
}

/* The metric line of p's match on line. */
static char *metric_line(pattern *p, const char *line) {
    PCRE2_SIZE *ov = pcre2_get_ovector_pointer(p->data);
    uint32_t count, entry_size;
    PCRE2_SPTR table;
    pcre2_pattern_info(p->code, PCRE2_INFO_NAMECOUNT, &count);
    pcre2_pattern_info(p->code, PCRE2_INFO_NAMEENTRYSIZE, &entry_size);
    pcre2_pattern_info(p->code, PCRE2_INFO_NAMETABLE, &table);
    json_t *o = json_object();
    json_object_set_new(o, "event", json_string(p->event));
    p->matches++;
    json_int_t step = p->matches;
    for (uint32_t i = 0; i < count; i++, table += entry_size) {
        int group = (table[0] << 8) | table[1];
        const char *name = (const char *)table + 2;
        if (ov[2 * group] == PCRE2_UNSET) continue;
        const char *s = line + ov[2 * group];
        size_t n = ov[2 * group + 1] - ov[2 * group];
        json_t *v = value_of(s, n);
        if (!v) continue;
        if (strcmp(name, "step") == 0) { /* a whole number of at least 0, or counted */
            if (json_is_integer(v) && json_integer_value(v) >= 0) step = json_integer_value(v);
            json_decref(v);
        } else if (strcmp(name, "event") != 0) {
            json_object_set_new(o, name, v);
        } else {
            json_decref(v);
        }
    }
    json_object_set_new(o, "step", json_integer(step));
    char *text = json_dumps(o, JSON_COMPACT | JSON_ENSURE_ASCII);
    json_decref(o);
    if (!text) return NULL;
    size_t len = strlen(text);
    char *out = td_malloc(len + 2);
    memcpy(out, text, len);
    out[len] = '\n', out[len + 1] = 0;
    free(text);
    return out;
}

char *td_metric_patterns_match(td_metric_patterns *m, const char *line, size_t len) {
    while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) len--;
    if (!m || len == 0 || len > MAX_LINE) return NULL;
    double t = now_s();
    m->budget_s += (t - m->refilled_at) * BUDGET_SHARE;
    if (m->budget_s > BUDGET_BURST_S) m->budget_s = BUDGET_BURST_S;
    m->refilled_at = t;
    /* a line of any bytes: checked as UTF-8 by PCRE2, which refuses a bad one (no match) */
    for (int i = 0; i < m->n; i++) {
        if (m->budget_s <= 0) {
            m->skipped++;
            return NULL;
        }
        pattern *p = &m->p[i];
        int rc = pcre2_match(p->code, (PCRE2_SPTR)line, len, 0, 0, p->data, m->limits);
        double after = now_s();
        m->budget_s -= after - t;
        t = after;
        if (rc > 0) return metric_line(p, line);
    }
    return NULL;
}

long td_metric_patterns_skipped(const td_metric_patterns *m) {
    return m ? m->skipped : 0;
}

void td_metric_patterns_free(td_metric_patterns *m) {
    if (!m) return;
    for (int i = 0; i < m->n; i++) {
        pcre2_match_data_free(m->p[i].data);
        pcre2_code_free(m->p[i].code);
    }
    pcre2_match_context_free(m->limits);
    free(m);
}
