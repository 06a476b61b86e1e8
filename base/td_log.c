#include "base/td_log.h"

#include "base/td_strv.h"

#include <jansson.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

struct td_log {
    FILE *stream;
    atomic_bool json;
    atomic_int level;
};

static const char *const LEVELS[] = {"error", "warning", "notice", "info", "debug"};

td_log *td_log_open(FILE *stream, bool json, td_log_level level) {
    td_log *lg = calloc(1, sizeof *lg);
    if (!lg) return NULL;
    lg->stream = stream;
    atomic_init(&lg->json, json);
    atomic_init(&lg->level, (int)level);
    return lg;
}

void td_log_close(td_log *lg) {
    free(lg);
}

void td_log_configure(td_log *lg, bool json, td_log_level level) {
    if (!lg) return;
    atomic_store(&lg->json, json);
    atomic_store(&lg->level, (int)level);
}

bool td_log_level_parse(const char *name, td_log_level *out) {
    for (int i = 0; i < (int)(sizeof LEVELS / sizeof *LEVELS); i++)
        if (strcmp(name, LEVELS[i]) == 0) {
            *out = (td_log_level)i;
            return true;
        }
    return false;
}

/* "2026-11-24T21:20:39.123Z" */
static void now_text(char *out, size_t len) {
    struct timespec ts;
    struct tm tm;
    clock_gettime(CLOCK_REALTIME, &ts);
    gmtime_r(&ts.tv_sec, &tm);
    char base[24];
    strftime(base, sizeof base, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out, len, "%s.%03dZ", base, (int)(ts.tv_nsec / 1000000) % 1000);
}

void td_log_at(td_log *lg, td_log_level level, td_log_where where, const char *fmt, ...) {
    if (!lg || (level != TD_LOG_NOTICE && (int)level > atomic_load(&lg->level))) return;
    char raw[2048], msg[4 * 2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(raw, sizeof raw, fmt, ap);
    va_end(ap);
    /* every line is one line of the daemon's own: what a job or a client put in it (a name, a
     * URL, a reason) cannot start another, nor carry bytes that are not UTF-8 */
    td_str_escape(raw, msg, sizeof msg);
    char *line = NULL;
    if (atomic_load(&lg->json)) {
        char t[40];
        now_text(t, sizeof t);
        /* jansson escapes the message (a job's name, a path, a peer's words); a message that is
         * not UTF-8 is written as text rather than dropped */
        json_t *o = json_pack("{s:s, s:s}", "time", t, "level", LEVELS[level]);
        if (o && where.job > 0) json_object_set_new(o, "job", json_integer(where.job));
        if (o && where.node) json_object_set_new(o, "node", json_string(where.node));
        if (o && where.rank >= 0) json_object_set_new(o, "rank", json_integer(where.rank));
        json_t *m = json_string(msg);
        if (o && m) {
            json_object_set_new(o, "msg", m);
            line = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER);
        } else
            json_decref(m);
        json_decref(o);
    }
    flockfile(lg->stream); /* the stdio lock: the line goes out whole */
    if (line) {
        fputs(line, lg->stream);
    } else {
        fputs("traind: ", lg->stream); /* the level shows in the words ("warning: ...") */
        fputs(msg, lg->stream);
    }
    fputc('\n', lg->stream);
    fflush(lg->stream);
    funlockfile(lg->stream);
    free(line);
}
