/* A failed rank's story as torchrun tells it: the error file PyTorch's @record writes
 * (TORCHELASTIC_ERROR_FILE: {"message": {"message": "Type: text", "extraInfo": {"py_callstack":
 * "Traceback ...", "timestamp": "1700000000"}}}) and the "Root Cause (first observed failure)"
 * summary torchrun prints from it. The file is the job's: any bytes at all, read within a size. */
#include "service/run/td_launch_private.h"
#include "base/td_buf.h"
#include "base/td_strv.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

enum { MAX_ERROR_FILE = 1 << 20 };

static const char *string_at(json_t *o, const char *key) {
    return json_string_value(json_object_get(o, key));
}

int td_rank_error_read(int fd, td_rank_error *e, td_err *err) {
    memset(e, 0, sizeof *e);
    char *buf = td_malloc(MAX_ERROR_FILE + 1);
    size_t n = 0;
    for (;;) {
        ssize_t k = read(fd, buf + n, MAX_ERROR_FILE + 1 - n);
        if (k <= 0) break;
        n += (size_t)k;
        if (n > MAX_ERROR_FILE) break;
    }
    if (n > MAX_ERROR_FILE) {
        free(buf);
        return td_fail(err, "larger than %d bytes", MAX_ERROR_FILE);
    }
    json_error_t je;
    json_t *root = json_loadb(buf, n, 0, &je);
    free(buf);
    if (!root) return td_fail(err, "not JSON (line %d: %s)", je.line, je.text);
    json_t *m = json_object_get(root, "message");
    const char *text = json_is_string(m) ? json_string_value(m) : string_at(m, "message");
    json_t *extra = json_object_get(m, "extraInfo");
    const char *stack = string_at(extra, "py_callstack");
    const char *when = string_at(extra, "timestamp");
    if (!when) when = string_at(root, "timestamp");
    int rc = 0;
    if (!text && !stack) {
        rc = td_fail(err, "no \"message\" in it (torchrun's error file format)");
    } else {
        snprintf(e->message, sizeof e->message, "%s", text ? text : "");
        td_str_utf8_repair(e->message);
        if (stack) {
            e->traceback = td_str_dup(stack);
            td_str_utf8_repair(e->traceback);
        }
        e->timestamp = when ? strtoll(when, NULL, 10) : 0;
    }
    json_decref(root);
    return rc;
}

void td_rank_error_free(td_rank_error *e) {
    free(e->traceback);
    e->traceback = NULL;
}

/* text with every line after the first indented by two spaces, as torchrun shows a traceback */
static void indented(td_buf *out, const char *text) {
    for (const char *p = text; *p; p++) {
        if (*p == '\n' && p[1] == 0) break; /* the last line's newline: the block adds its own */
        td_buf_append(out, p, 1);
        if (*p == '\n') td_buf_append(out, "  ", 2);
    }
}

char *td_launch_root_cause(const char *name, const td_group *g, const char *error_file,
                           const td_rank_error *e) {
    char host[256] = "";
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "unknown");
    time_t when = e && e->timestamp > 0 ? (time_t)e->timestamp : (time_t)g->failed_at;
    struct tm tm;
    char stamp[64] = "unknown";
    if (localtime_r(&when, &tm)) strftime(stamp, sizeof stamp, "%Y-%m-%d_%H:%M:%S", &tm);
    char title[300];
    snprintf(title, sizeof title, "%.256s FAILED", name);
    /* torchrun's rules are as wide as the widest line, at most 60: a traceback's reach it */
    const int width = 60;
    td_buf out = {0};
    char line[512];
    for (int i = 0; i < width; i++) td_buf_append(&out, "=", 1);
    snprintf(line, sizeof line, "\n%s\n", title);
    td_buf_append(&out, line, strlen(line));
    for (int i = 0; i < width; i++) td_buf_append(&out, "-", 1);
    td_buf_puts(&out, "\nFailures:\n  <NO_OTHER_FAILURES>\n");
    for (int i = 0; i < width; i++) td_buf_append(&out, "-", 1);
    snprintf(line, sizeof line,
             "\nRoot Cause (first observed failure):\n[0]:\n  time      : %s\n  host      : %s\n"
             "  rank      : %d (local_rank: %d)\n  exitcode  : %d (pid: %d)\n"
             "  error_file: %.300s\n  traceback : ",
             stamp, host, g->failed_rank, g->failed_local, g->first_failure, (int)g->failed_pid,
             e && error_file && error_file[0] ? error_file : "<N/A>");
    td_buf_append(&out, line, strlen(line));
    if (e && e->traceback)
        indented(&out, e->traceback);
    else if (e)
        indented(&out, e->message);
    else if (g->first_failure > 128)
        td_buf_printf(&out, "Signal %d (%s) received by PID %d", g->first_failure - 128,
                      strsignal(g->first_failure - 128), (int)g->failed_pid);
    else
        td_buf_puts(&out, "<N/A> (the rank wrote no error file: decorate its entry point "
                          "with torch.distributed.elastic.multiprocessing.errors.record to "
                          "see its exception here)");
    td_buf_append(&out, "\n", 1);
    for (int i = 0; i < width; i++) td_buf_append(&out, "=", 1);
    td_buf_append(&out, "\n", 1);
    return td_buf_take(&out);
}
