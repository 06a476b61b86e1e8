/* The audit log: one JSON line per mutating request, written once it is answered, so the line
 * holds the outcome as well as the request (who: the token's id, name and scope; what: method,
 * path and the job concerned; when; from where; the HTTP status).
 *
 * The file is opened for each line (O_APPEND): mutating requests are few, and a log that
 * logrotate moved away is followed without a signal. Each line is a single write(), which
 * O_APPEND keeps whole even when several requests end at once. The URL's path only: libmicrohttpd
 * gives it without the query, where a browser's CSRF token may travel. */
#include "api/td_api_private.h"

#include "base/td_clock.h"
#include "base/td_strv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

void td_api_audit(td_api *api, struct MHD_Connection *c, const td_principal *who,
                  const char *method, const char *url, unsigned status, long job) {
    if (!api->cfg.audit_log) return;
    double now = td_clock_wall();
    time_t secs = (time_t)now;
    struct tm tm;
    char when[40], stamp[48], from[64];
    gmtime_r(&secs, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(stamp, sizeof stamp, "%s.%03dZ", when, (int)((now - (double)secs) * 1000));
    td_api_peer(c, from, sizeof from);
    /* status 0: the client went away before the reply was sent; what it asked for may still
     * have happened, which is why it is logged. The path as the client sent it, escaped (its
     * control characters and bytes that are not UTF-8 as \xNN): the record is always written */
    char path[4 * 2048];
    td_str_escape(url, path, sizeof path);
    json_t *o = json_pack("{s:s, s:I, s:s, s:s, s:s, s:s, s:s, s:i, s:o}", "time", stamp, "token",
                          (json_int_t)who->id, "name", who->name, "scope",
                          who->id ? td_scope_name(who->scope) : "none", "from", from, "method",
                          method, "path", path, "status", (int)status, "job",
                          job > 0 ? json_integer(job) : json_null());
    char *line = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!line) {
        td_log_at(api->cfg.log, TD_LOG_ERROR, TD_LOG_NOWHERE,
                  "audit log: out of memory for the line of %s %s", method, url);
        return;
    }
    size_t n = strlen(line);
    line[n] = '\n'; /* over the NUL: the line and its end in one write */
    int fd = open(api->cfg.audit_log, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0 || write(fd, line, n + 1) != (ssize_t)(n + 1))
        /* the request has been answered: what is left is to say, loudly, that its record is
         * missing */
        td_log_at(api->cfg.log, TD_LOG_ERROR, TD_LOG_NOWHERE,
                  "audit log %s: cannot record %s %s (status %u, token %ld): %s",
                  api->cfg.audit_log, method, url, status, who->id, strerror(errno));
    if (fd >= 0) close(fd);
    free(line);
}
