/* traind-shepherd's end of the control socket: who may talk to it (the daemon's user, with the
 * token), what the daemon asks and what the shepherd tells it. The lines themselves are
 * service/run/td_shepherd_protocol.c's; this is the program's transport (one daemon at a time, one
 * that does not read is dropped, never waited for). */
#define _GNU_SOURCE /* accept4, struct ucred */
#include "programs/shepherd.h"

#include "base/td_clock.h"
#include "service/run/td_shepherd_protocol.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void say(shepherd *h, const char *fmt, ...) {
    if (h->daemon_fd < 0) return;
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    if ((size_t)n > sizeof line - 2) n = (int)sizeof line - 2;
    line[n++] = '\n';
    /* the daemon reads as it goes; a daemon that does not is dropped, never waited for */
    if (send(h->daemon_fd, line, (size_t)n, MSG_NOSIGNAL | MSG_DONTWAIT) != n) {
        close(h->daemon_fd);
        h->daemon_fd = -1;
        h->orphan_since = td_clock_now();
    }
}

/* "pid PGID N P1 .. PN": the group's processes still running (N of them). */
void say_pids(shepherd *h) {
    char line[480];
    td_shepherd_pid_line(line, sizeof line, h->g.pgid, h->g.pids, h->g.n);
    say(h, "%s", line);
}

/* "out BYTES": the output file's size now. */
void say_out(shepherd *h) {
    char line[64];
    td_shepherd_out_line(line, sizeof line, h->out.size);
    say(h, "%s", line);
}

/* The group's first failure, once there is one and the connected daemon has not been told. */
void say_failure(shepherd *h) {
    if (h->g.first_failure == 0) return;
    if (h->failed_at == 0) h->failed_at = td_clock_wall();
    if (h->failure_said || h->daemon_fd < 0) return;
    char line[512];
    td_shepherd_failed_line(line, sizeof line, h->g.failed_rank, h->g.first_failure, h->failed_at,
                            h->g.reason);
    h->failure_said = true;
    say(h, "%s", line);
}

static void handle_line(shepherd *h, char *line) {
    int sig;
    double grace;
    const char *reason;
    switch (td_shepherd_request_parse(line, &sig, &grace, &reason)) {
    case TD_SHEPHERD_STOP:
        stop_group(h, "request", sig, grace, reason);
        break;
    case TD_SHEPHERD_STATUS:
        say_pids(h);
        say_out(h);
        break;
    case TD_SHEPHERD_UNKNOWN: {
        char answer[256];
        td_shepherd_unknown_line(answer, sizeof answer, line);
        say(h, "%s", answer);
        break;
    }
    }
}

static void handle_input(shepherd *h);

void read_daemon(shepherd *h) {
    ssize_t k = recv(h->daemon_fd, h->in + h->in_len, sizeof h->in - 1 - h->in_len, 0);
    if (k <= 0) {
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
        close(h->daemon_fd);
        h->daemon_fd = -1;
        h->in_len = 0;
        h->orphan_since = td_clock_now();
        return;
    }
    h->in_len += (size_t)k;
    handle_input(h);
}

/* The whole lines in h->in, each handled; a partial one waits for the rest. */
static void handle_input(shepherd *h) {
    char *start = h->in, *nl;
    while ((nl = memchr(start, '\n', h->in_len - (size_t)(start - h->in)))) {
        *nl = 0;
        handle_line(h, start);
        start = nl + 1;
    }
    size_t rest = h->in_len - (size_t)(start - h->in);
    if (rest == sizeof h->in - 1) rest = 0; /* a runaway line: dropped */
    memmove(h->in, start, rest);
    h->in_len = rest;
}

/* A new connection waits to say hello; only processes of the daemon's user get that far. */
void accept_daemon(shepherd *h) {
    int fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    struct ucred cred;
    socklen_t len = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &len) != 0 || cred.uid != geteuid()) {
        close(fd);
        return;
    }
    if (h->pending_fd >= 0) close(h->pending_fd); /* one at a time: the newest */
    h->pending_fd = fd;
    h->pending_len = 0;
}

/* The pending connection's first line: the token makes it the daemon's connection (the newest
 * daemon is the one); anything else closes it. */
void read_pending(shepherd *h) {
    ssize_t k = recv(h->pending_fd, h->pending_in + h->pending_len,
                     sizeof h->pending_in - 1 - h->pending_len, 0);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (k > 0) h->pending_len += (size_t)k;
    h->pending_in[h->pending_len] = 0;
    char *nl = strchr(h->pending_in, '\n');
    if (k > 0 && !nl && h->pending_len < sizeof h->pending_in - 1) return; /* more to come */
    bool ok = nl && td_shepherd_hello_ok(h->pending_in, (size_t)(nl - h->pending_in), h->s.token);
    int fd = h->pending_fd;
    h->pending_fd = -1;
    if (!ok) {
        close(fd);
        return;
    }
    if (h->daemon_fd >= 0) close(h->daemon_fd);
    h->daemon_fd = fd;
    /* what followed the hello line is the daemon's first request(s) */
    size_t rest = h->pending_len - (size_t)(nl + 1 - h->pending_in);
    memcpy(h->in, nl + 1, rest);
    h->in_len = rest;
    h->orphan_since = 0;
    /* what came with the hello first (a stop from a daemon that closes at once), then the
     * state: a reply that fails must not lose the request */
    handle_input(h);
    say_pids(h);
    say_out(h);
    h->failure_said = false; /* a new daemon: told again */
    say_failure(h);
}
