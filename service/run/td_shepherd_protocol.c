/* The daemon-shepherd protocol's encoding and decoding, both halves side by side
 * (td_shepherd_protocol.h documents it): the spec's own members, the socket's lines each way and
 * the status file. Apart from td_shepherd.c (the daemon's process handling) and the shepherd
 * program so that a line is written and read in one place. */
#include "service/run/td_shepherd_protocol.h"

#include "service/run/td_shepherd.h"

#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

/* ---- the spec ---------------------------------------------------------------------------- */

void td_shepherd_spec_fill(json_t *spec, const char *base, const char *token, const char *boot) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.%s", base, "status");
    json_object_set_new(spec, "status", json_string(path));
    snprintf(path, sizeof path, "%s.%s", base, "out");
    if (!json_is_null(json_object_get(spec, "output"))) /* null: no rank 0 here */
        json_object_set_new(spec, "output", json_string(path));
    else
        json_object_del(spec, "output");
    snprintf(path, sizeof path, "%s.%s", base, "sock");
    json_object_set_new(spec, "socket", json_string(path));
    json_object_set_new(spec, "token", json_string(token));
    json_object_set_new(spec, "boot_id", json_string(boot));
    json_object_set_new(spec, "daemon_fd", json_integer(TD_SHEPHERD_DAEMON_FD));
    json_object_set_new(spec, "listen_fd", json_integer(TD_SHEPHERD_LISTEN_FD));
}

/* ---- daemon -> shepherd ------------------------------------------------------------------ */

int td_shepherd_hello_line(char *line, size_t len, const char *token) {
    return snprintf(line, len, "hello %s\n", token);
}

bool td_shepherd_hello_ok(const char *line, size_t line_len, const char *token) {
    return line_len == 6 + strlen(token) && strncmp(line, "hello ", 6) == 0 &&
           strncmp(line + 6, token, strlen(token)) == 0;
}

int td_shepherd_stop_line(char *line, size_t len, int sig, double grace_s, const char *reason) {
    int n = snprintf(line, len, "stop %d %.3f %.600s", sig, grace_s, reason);
    for (char *p = line; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    line[n++] = '\n';
    return n;
}

td_shepherd_request td_shepherd_request_parse(const char *line, int *sig, double *grace_s,
                                              const char **reason) {
    int used = 0;
    if (sscanf(line, "stop %d %lf %n", sig, grace_s, &used) == 2 && used > 0 && *sig > 0 &&
        *sig < NSIG && *grace_s >= 0 && *grace_s <= 3600) {
        *reason = line + used;
        return TD_SHEPHERD_STOP;
    }
    if (strcmp(line, "status") == 0) return TD_SHEPHERD_STATUS;
    return TD_SHEPHERD_UNKNOWN;
}

/* ---- shepherd -> daemon ------------------------------------------------------------------ */

void td_shepherd_out_line(char *line, size_t len, long long bytes) {
    snprintf(line, len, "out %lld", bytes);
}

void td_shepherd_pid_line(char *line, size_t len, pid_t pgid, const pid_t *pids, int n) {
    int live = 0, k = 0;
    for (int i = 0; i < n; i++) live += pids && pids[i] > 0; /* 0: reaped */
    k = snprintf(line, len, "pid %d %d", (int)pgid, live);
    for (int i = 0; i < n && k < (int)len - 16; i++)
        if (pids[i] > 0) k += snprintf(line + k, len - (size_t)k, " %d", (int)pids[i]);
}

void td_shepherd_failed_line(char *line, size_t len, int rank, int code, double at,
                             const char *reason) {
    char words[300];
    snprintf(words, sizeof words, "%s", reason);
    for (char *p = words; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    snprintf(line, len, "failed %d %d %.3f %s", rank, code, at, words);
}

void td_shepherd_unknown_line(char *line, size_t len, const char *request) {
    snprintf(line, len, "error unknown request: %.200s", request);
}

void td_shepherd_said(struct td_shepherd *s, const char *line) {
    long long size;
    int pgid, live, rank, code, used = 0;
    double at;
    if (sscanf(line, "out %lld", &size) == 1 && size >= s->out_size) s->out_size = size;
    /* the group is killed with killpg(pgid) once the shepherd is gone: 1 would be every process
     * the daemon may signal, 0 or less no group at all; such a line is not the shepherd's
     * (found by fuzzing: "pid -1 0" was taken) */
    else if (sscanf(line, "pid %d %d", &pgid, &live) == 2 && pgid > 1 && live >= 0)
        s->pgid = (pid_t)pgid, s->live = live;
    else if (strcmp(line, TD_SHEPHERD_OVER) == 0)
        s->over = true;
    else if (sscanf(line, "failed %d %d %lf %n", &rank, &code, &at, &used) == 3 && used > 0) {
        s->failed = true;
        s->failed_rank = rank;
        s->failed_code = code;
        s->failed_at = at;
        snprintf(s->failed_reason, sizeof s->failed_reason, "%s", line + used);
    }
}

/* ---- the status file ----------------------------------------------------------------------- */

json_t *td_shepherd_status_json(const td_shepherd_status *st) {
    json_t *o = json_object();
    json_object_set_new(o, "attempt", json_integer(st->attempt));
    json_object_set_new(o, "exit_code", json_integer(st->exit_code));
    json_object_set_new(o, "failed", json_boolean(st->failed));
    json_object_set_new(o, "failed_rank", json_integer(st->failed_rank));
    json_object_set_new(o, "reason", json_string(st->reason));
    json_object_set_new(o, "stopped_by",
                        st->stopped_by[0] ? json_string(st->stopped_by) : json_null());
    json_object_set_new(o, "stop_reason", json_string(st->stop_reason));
    json_object_set_new(o, "grace_expired", json_boolean(st->grace_expired));
    json_object_set_new(o, "grace_note", json_string(st->grace_note));
    return o;
}

void td_shepherd_status_output(json_t *status, long long output_bytes) {
    json_object_set_new(status, "output_bytes", json_integer(output_bytes));
}

int td_shepherd_end_read(const char *base, td_shepherd_end *end, td_err *err) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.status", base);
    memset(end, 0, sizeof *end);
    end->failed_rank = -1;
    json_error_t je;
    json_t *o = json_load_file(path, 0, &je);
    if (!o) {
        if (access(path, F_OK) != 0 && errno == ENOENT) return 0;
        return td_fail(err, "%s:%d: %s", path, je.line, je.text);
    }
    end->exit_code = (int)json_integer_value(json_object_get(o, "exit_code"));
    end->failed = json_is_true(json_object_get(o, "failed"));
    json_t *rank = json_object_get(o, "failed_rank");
    end->failed_rank = json_is_integer(rank) ? (int)json_integer_value(rank) : -1;
    const char *t;
    if ((t = json_string_value(json_object_get(o, "reason"))))
        snprintf(end->reason, sizeof end->reason, "%s", t);
    if ((t = json_string_value(json_object_get(o, "stopped_by"))))
        snprintf(end->stopped_by, sizeof end->stopped_by, "%s", t);
    if ((t = json_string_value(json_object_get(o, "stop_reason"))))
        snprintf(end->stop_reason, sizeof end->stop_reason, "%s", t);
    if ((t = json_string_value(json_object_get(o, "grace_note"))))
        snprintf(end->grace_note, sizeof end->grace_note, "%s", t);
    end->output_bytes = (long long)json_integer_value(json_object_get(o, "output_bytes"));
    json_decref(o);
    return 1;
}
