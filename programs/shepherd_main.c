/* traind-shepherd: owns one attempt's processes on one node, so that they outlive the daemon
 * that asked for them (a crash, kill -9, a restart, a package upgrade) and no process of a job
 * outlives the job.
 *
 *   traind-shepherd SPEC.json
 *
 * The spec (written by the daemon) says what to run and where: the torchrun environment and
 * the processes as td_launch starts them (service/td_launch.h), each process's log file, the
 * file rank 0's stdout is appended to (durable: the daemon reads the job's metric lines from it
 * by offset, so a daemon that comes back neither misses nor repeats one), the control socket,
 * the status file, the job's deadline and how long the shepherd waits for a daemon that went
 * away. The shepherd:
 *   - starts the group in a process group of its own and reaps it (a child subreaper: what the
 *     ranks leave behind is reaped here too), with td_group's rules: the first failure stops
 *     the rest, SIGTERM then SIGKILL after the grace period;
 *   - answers one daemon at a time on its Unix socket (a line protocol, below), and stops the
 *     group when asked, when the deadline passes, or when no daemon has been connected for the
 *     orphan limit (a removed daemon leaves nothing running for ever);
 *   - is told by its daemon of a first connection already made ("daemon_fd": a socketpair's
 *     end) and of its control socket already listening ("listen_fd"), so that no daemon ever
 *     waits for a socket to appear; it ignores the spec's "daemon" member (the daemon's own
 *     notes about the attempt);
 *   - appends rank 0's stdout to its log (logs[0]) as well as to the output file: the log
 *     holds each line once, whatever daemons come and go; every process's stderr (and stdout)
 *     reaches its log through a pipe to the shepherd too, so that a full disk loses no line:
 *     what a file cannot take waits in memory, in order, and goes in once it can
 *     (service/td_appender.h);
 *   - when the group is over, writes the status file (JSON: exit code, failed rank, reason,
 *     why it was stopped) atomically, tells the connected daemon, and exits 0.
 *
 * The socket's lines, each ending in '\n'. A connection is the daemon's once its first line is
 * "hello TOKEN" with the spec's token (a job's processes run as the daemon's user, so the
 * socket's permissions alone cannot tell them apart); until then it is only read:
 *   daemon -> shepherd:  "hello TOKEN"                     become the daemon's connection
 *                        "stop SIGNAL GRACE_S REASON..."   stop the group (REASON: the words a
 *                                                           job record shows)
 *                        "status"                           answer with "pid ..." and "out ..."
 *   shepherd -> daemon:  "out BYTES"      rank 0's output file has grown to BYTES
 *                        "pid PGID N P1 P2 ..."  the group's process group and processes
 *                        "failed RANK CODE TIME REASON"  a process failed (the group's
 *                                         first failure; TIME: when it was reaped, wall clock),
 *                                         said as it happens and again to each daemon that
 *                                         connects: while the rest of the group stops (a
 *                                         stopped rank holds it for the grace period), the
 *                                         master can already tell which node failed first
 *                        "over"           the status file is written; the shepherd exits
 * Exit status: 0 once the status file is written, 2 for a spec it cannot use (said on stderr),
 * 1 when it could not start the group (the status file says so too). */
#define _GNU_SOURCE /* signalfd, pipe2, accept4 */
#include "programs/shepherd_errors.h"
#include "programs/shepherd_tboard.h"

#include "base/td_clock.h"
#include "base/td_json.h"
#include "service/td_appender.h"
#include "base/td_buf.h"
#include "service/td_cgroup.h"
#include "service/td_jobfs.h"
#include "service/td_launch.h"
#include "service/td_metric_patterns.h"
#include "service/td_shepherd.h"
#include "base/td_strv.h"

#include <errno.h>
#include <grp.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#define MAX_PROCS 1024

typedef struct spec {
    td_launch_config launch;
    char **argv, **env, **devices, **logs;
    char dir[PATH_MAX], output[PATH_MAX], socket_path[108], status_path[PATH_MAX];
    char local_rank_arg[32];
    char token[128]; /* what a daemon says first ("hello TOKEN"): jobs share its uid */
    int attempt;
    int daemon_fd;   /* a connection the starting daemon made (a socketpair); -1: none */
    int listen_fd;   /* the control socket, bound and listening, from the daemon; -1: bind it */
    double deadline; /* wall clock; 0: none */
    double orphan_s; /* how long without a daemon before the job stops */
    long long max_log_bytes; /* each log's bound (rotated past it), and the output file's */
    td_identity user;        /* "user": who the processes run as (a root daemon's run_as) */
    /* "cgroup": the attempt's (td_cgroup.h); its ranks' below it; "": none */
    char cgroup[PATH_MAX], ranks_cgroup[PATH_MAX + 8];
    /* "metrics" (a command job's): metrics from rank 0's text lines (or NULL), and the
     * directory below dir where its SummaryWriter writes ("": none) */
    td_metric_patterns *patterns;
    char tensorboard_dir[256];
    bool dir_as_job; /* "dir_as_job": dir is the job's choice, entered as the job */
    int dir_fd;      /* it, open (-1: dir entered by its name) */
} spec;

__attribute__((format(printf, 1, 2), noreturn)) static void fail_spec(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "traind-shepherd: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* A JSON array of strings into a NULL-terminated vector (NULL when the member is null or
 * absent and not required). */
static char **strings(json_t *o, const char *key, bool required, const char *path) {
    json_t *a = json_object_get(o, key);
    if (!a || json_is_null(a)) {
        if (required) fail_spec("%s: %s: missing", path, key);
        return NULL;
    }
    if (!json_is_array(a) || json_array_size(a) > MAX_PROCS * 16)
        fail_spec("%s: %s: expected an array of strings", path, key);
    char **v = td_strv_new((int)json_array_size(a));
    size_t i;
    json_t *s;
    json_array_foreach(a, i, s) {
        if (!json_is_string(s)) fail_spec("%s: %s[%zu]: expected a string", path, key, i);
        v[i] = td_str_dup(json_string_value(s));
    }
    return v;
}

static void text(json_t *o, const char *key, char *out, size_t len, bool required,
                 const char *path) {
    td_err err = {{0}};
    if (td_json_string(o, "", key, required, "", out, len, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
}

static long integer(json_t *o, const char *key, long def, long min, long max, bool required,
                    const char *path) {
    td_err err = {{0}};
    long v;
    if (td_json_int(o, "", key, required, def, min, max, &v, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
    return v;
}

static double number(json_t *o, const char *key, double def, double min, double max,
                     const char *path) {
    td_err err = {{0}};
    double v;
    if (td_json_number(o, "", key, false, def, min, max, &v, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
    return v;
}

static int count(char **v) {
    int n = 0;
    while (v && v[n]) n++;
    return n;
}

/* "user": {"name", "uid", "gid", "groups": [...], "lookup_groups"}: who the processes run as. */
static void read_user(spec *s, json_t *user, const char *path) {
    if (!json_is_object(user)) fail_spec("%s: user: expected {\"name\", \"uid\", \"gid\"}", path);
    text(user, "name", s->user.name, sizeof s->user.name, true, path);
    s->user.uid = (uid_t)integer(user, "uid", 0, 1, UINT_MAX - 1, true, path);
    s->user.gid = (gid_t)integer(user, "gid", 0, 0, UINT_MAX - 1, true, path);
    s->user.lookup_groups = json_is_true(json_object_get(user, "lookup_groups"));
    json_t *groups = json_object_get(user, "groups");
    if (groups && (!json_is_array(groups) || json_array_size(groups) > TD_IDENTITY_GROUPS))
        fail_spec("%s: user.groups: expected at most %d group ids", path, TD_IDENTITY_GROUPS);
    size_t i;
    json_t *g;
    json_array_foreach(groups, i, g) {
        if (!json_is_integer(g) || json_integer_value(g) < 0)
            fail_spec("%s: user.groups[%zu]: expected a group id", path, i);
        s->user.groups[s->user.n_groups++] = (gid_t)json_integer_value(g);
    }
    s->user.drop = true;
    s->launch.user = &s->user;
}

static void read_spec(spec *s, const char *path) {
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o) fail_spec("%s:%d:%d: %s", path, je.line, je.column, je.text);
    if (!json_is_object(o)) fail_spec("%s: expected a JSON object", path);
    memset(s, 0, sizeof *s);
    td_launch_config *c = &s->launch;
    s->argv = strings(o, "argv", true, path);
    if (!s->argv[0]) fail_spec("%s: argv: empty", path);
    s->env = strings(o, "env", false, path);
    s->devices = strings(o, "devices", false, path);
    s->logs = strings(o, "logs", true, path);
    text(o, "dir", s->dir, sizeof s->dir, true, path);
    /* absent or "": process 0's stdout goes to its log like the others' (a node that does not
     * run global rank 0) */
    text(o, "output", s->output, sizeof s->output, false, path);
    text(o, "socket", s->socket_path, sizeof s->socket_path, true, path);
    text(o, "status", s->status_path, sizeof s->status_path, true, path);
    text(o, "master_addr", c->master_addr, sizeof c->master_addr, true, path);
    text(o, "run_id", c->run_id, sizeof c->run_id, true, path);
    text(o, "local_rank_arg", s->local_rank_arg, sizeof s->local_rank_arg, false, path);
    text(o, "token", s->token, sizeof s->token, true, path);
    if (strlen(s->token) < 16) fail_spec("%s: token: expected at least 16 characters", path);
    c->nproc_per_node = (int)integer(o, "nproc", 1, 1, MAX_PROCS, true, path);
    c->nnodes = (int)integer(o, "nnodes", 1, 1, 1 << 16, false, path);
    c->node_rank = (int)integer(o, "node_rank", 0, 0, c->nnodes - 1, false, path);
    c->master_port = (int)integer(o, "master_port", 0, 1, 65535, true, path);
    c->max_restarts = (int)integer(o, "max_restarts", 0, 0, 1 << 20, false, path);
    s->attempt = (int)integer(o, "attempt", 0, 0, INT_MAX, false, path);
    s->daemon_fd = (int)integer(o, "daemon_fd", -1, -1, INT_MAX, false, path);
    s->listen_fd = (int)integer(o, "listen_fd", -1, -1, INT_MAX, false, path);
    c->grace_s = number(o, "grace_s", 10, 0, 3600, path);
    s->deadline = number(o, "deadline", 0, 0, 1e11, path);
    s->orphan_s = number(o, "orphan_timeout_s", 600, 0.1, 30 * 86400.0, path);
    td_err err = {{0}};
    bool launch_self = false, no_bind = false;
    if (td_json_bool(o, "", "launch_self", false, &launch_self, &err) != 0 ||
        td_json_bool(o, "", "no_cpu_bind", false, &no_bind, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
    c->launch_self = launch_self;
    c->no_cpu_bind = no_bind;
    int procs = launch_self ? 1 : c->nproc_per_node;
    if (count(s->logs) != procs)
        fail_spec("%s: logs: expected %d paths (one per process), found %d", path, procs,
                  count(s->logs));
    if (s->devices && count(s->devices) != procs)
        fail_spec("%s: devices: expected %d entries (one per process), found %d", path, procs,
                  count(s->devices));
    c->argv = s->argv;
    c->extra_env = s->env;
    c->devices = (const char *const *)s->devices;
    c->cwd = s->dir;
    c->local_rank_arg = s->local_rank_arg[0] ? s->local_rank_arg : NULL;
    json_t *user = json_object_get(o, "user");
    if (user && !json_is_null(user)) read_user(s, user, path);
    /* the attempt's cgroup: the shepherd moves into its "shepherd", the processes into "ranks" */
    text(o, "cgroup", s->cgroup, sizeof s->cgroup, false, path);
    if (s->cgroup[0]) {
        snprintf(s->ranks_cgroup, sizeof s->ranks_cgroup, "%s/ranks", s->cgroup);
        c->cgroup = s->ranks_cgroup;
    }
    c->max_file_bytes = integer(o, "max_file_bytes", 0, 0, LONG_MAX, false, path);
    bool as_job = false;
    if (td_json_bool(o, "", "dir_as_job", false, &as_job, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
    s->dir_as_job = as_job;
    s->dir_fd = -1;
    json_t *metrics = json_object_get(o, "metrics");
    json_t *patterns = json_object_get(metrics, "patterns");
    int bad;
    if (patterns && !(s->patterns = td_metric_patterns_new(patterns, &bad, &err)))
        fail_spec("%s: metrics.patterns[%d]: %s", path, bad, err.msg);
    text(metrics ? metrics : o, "tensorboard_dir", s->tensorboard_dir, sizeof s->tensorboard_dir,
         false, path);
    s->max_log_bytes = integer(o, "max_log_bytes", 0, 0, LONG_MAX, false, path);
    json_decref(o);
}

/* ---- the control socket -------------------------------------------------------------------- */

typedef struct shepherd {
    spec s;
    td_group g;
    int listen_fd, daemon_fd, pipe_fd, sig_fd;
    /* rank 0's output file (fd -1: this node runs no rank 0) and each process's log, through
     * appenders: what a full disk cannot take waits in memory and goes in first once it can,
     * so that no line is lost or reordered (up to OUT_WAIT_MAX, and LOGS_WAIT_MAX shared) */
    td_appender out;
    td_appender *logs; /* [procs] */
    int *log_pipes;    /* [procs] read ends: each process's stderr, and its stdout but rank 0's
                        * when there is an output file; -1: closed */
    int procs;
    /* rank 0's log has two writers, its stdout (also teed into the output file) and its stderr:
     * each goes in whole lines, so that neither splits a line of the other */
    td_buf tee_line, err_line; /* a line of each without its end yet */
    td_buf out_line;           /* rank 0's stdout's line without its end, for the output file */
    shepherd_tboard *tboard;   /* rank 0's SummaryWriter files, read every 2 s; or NULL */
    double tboard_next;        /* monotonic: the next read */
    int pending_fd;            /* a connection that has not said hello yet (the newest only) */
    char pending_in[256];
    size_t pending_len;
    char in[1024]; /* the daemon's partial line */
    size_t in_len;
    double orphan_since; /* monotonic time the daemon went; 0: one is connected */
    bool failure_said;   /* "failed ..." went to the connected daemon */
    double failed_at;    /* wall clock when the first failure was seen; 0: none yet */
    char stopped_by[32]; /* "request", "deadline", "orphaned", "signal"; "": not stopped */
    char stop_reason[512];
} shepherd;

static void say(shepherd *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(shepherd *h, const char *fmt, ...) {
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
static void say_pids(shepherd *h) {
    char line[480];
    int live = 0, k = 0;
    for (int i = 0; i < h->g.n; i++) live += h->g.pids && h->g.pids[i] > 0; /* 0: reaped */
    k = snprintf(line, sizeof line, "pid %d %d", (int)h->g.pgid, live);
    for (int i = 0; i < h->g.n && k < (int)sizeof line - 16; i++)
        if (h->g.pids[i] > 0)
            k += snprintf(line + k, sizeof line - (size_t)k, " %d", (int)h->g.pids[i]);
    say(h, "%s", line);
}

/* The group's first failure, once there is one and the connected daemon has not been told. */
static void say_failure(shepherd *h) {
    if (h->g.first_failure == 0) return;
    if (h->failed_at == 0) h->failed_at = td_clock_wall();
    if (h->failure_said || h->daemon_fd < 0) return;
    char reason[300];
    snprintf(reason, sizeof reason, "%s", h->g.reason);
    for (char *p = reason; *p; p++)
        if (*p == '\n' || *p == '\r') *p = ' ';
    h->failure_said = true;
    say(h, "failed %d %d %.3f %s", h->g.failed_rank, h->g.first_failure, h->failed_at, reason);
}

static void stop_group(shepherd *h, const char *by, int sig, double grace, const char *reason) {
    if (h->stopped_by[0]) return; /* the first reason stands */
    snprintf(h->stopped_by, sizeof h->stopped_by, "%s", by);
    snprintf(h->stop_reason, sizeof h->stop_reason, "%s", reason);
    fprintf(stderr, "traind-shepherd: stopping the group (%s): %s\n", by, reason);
    if (!h->g.terminating) td_group_terminate(&h->g, sig, grace);
}

static void handle_line(shepherd *h, char *line) {
    int sig;
    double grace;
    int used = 0;
    if (sscanf(line, "stop %d %lf %n", &sig, &grace, &used) == 2 && used > 0 && sig > 0 &&
        sig < NSIG && grace >= 0 && grace <= 3600) {
        stop_group(h, "request", sig, grace, line + used);
    } else if (strcmp(line, "status") == 0) {
        say_pids(h);
        say(h, "out %lld", h->out.size);
    } else {
        say(h, "error unknown request: %.200s", line);
    }
}

static void handle_input(shepherd *h);

static void read_daemon(shepherd *h) {
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
static void accept_daemon(shepherd *h) {
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
static void read_pending(shepherd *h) {
    ssize_t k = recv(h->pending_fd, h->pending_in + h->pending_len,
                     sizeof h->pending_in - 1 - h->pending_len, 0);
    if (k < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (k > 0) h->pending_len += (size_t)k;
    h->pending_in[h->pending_len] = 0;
    char *nl = strchr(h->pending_in, '\n');
    if (k > 0 && !nl && h->pending_len < sizeof h->pending_in - 1) return; /* more to come */
    bool ok = nl && (size_t)(nl - h->pending_in) == 6 + strlen(h->s.token) &&
              strncmp(h->pending_in, "hello ", 6) == 0 &&
              strncmp(h->pending_in + 6, h->s.token, strlen(h->s.token)) == 0;
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
    say(h, "out %lld", h->out.size);
    h->failure_said = false; /* a new daemon: told again */
    say_failure(h);
}

/* ---- rank 0's output, every process's log ---------------------------------------------------- */

#define OUT_WAIT_MAX  (64u << 20)
#define LOGS_WAIT_MAX (64u << 20) /* split among a node's processes, but at least 1 MiB each */
#define PUMP_READS    16 /* reads of one pipe a turn: a chatty rank cannot starve the rest */

/* The end of the last whole line in p[0, n): after its '\n', or its '\r' (a progress bar
 * redrawing its line); 0: none. */
static size_t whole_lines(const char *p, size_t n) {
    while (n > 0 && p[n - 1] != '\n' && p[n - 1] != '\r') n--;
    return n;
}

/* Whole lines of p into log (a line without its end waits in partial, up to 64 KiB: past that
 * it goes as it is); end: the pipe's end, the rest goes as it is. */
static void lines_to(td_appender *log, td_buf *partial, const char *p, size_t n, bool end) {
    if (n) td_buf_append(partial, p, n);
    size_t whole = end ? partial->len : whole_lines(partial->data, partial->len);
    if (!whole && partial->len > 65536) whole = partial->len;
    if (!whole) return;
    td_appender_write(log, partial->data, whole);
    memmove(partial->data, partial->data + whole, partial->len - whole);
    partial->len -= whole;
}

/* The lines of p that may be metric lines (a JSON object: '{' first, after blanks) into the
 * output file the daemon reads, and those a metric pattern matches as the metric lines they make;
 * the rest (a script's text, a progress bar) is in the log only, so a job printing text makes
 * the daemon read nothing. end: the stream's end (its last partial line is judged as it is). */
static void metric_lines(td_appender *out, td_metric_patterns *patterns, td_buf *partial,
                         const char *p, size_t n, bool end) {
    if (n) td_buf_append(partial, p, n);
    if (!partial->len) return; /* (nothing yet: no buffer either) */
    size_t from = 0;
    for (;;) {
        char *nl = memchr(partial->data + from, '\n', partial->len - from);
        size_t to = nl ? (size_t)(nl - partial->data) + 1 : end ? partial->len : from;
        if (to == from) break;
        size_t b = from;
        while (b < to && (partial->data[b] == ' ' || partial->data[b] == '\t')) b++;
        char *made;
        if (b < to && partial->data[b] == '{') {
            td_appender_write(out, partial->data + from, to - from);
        } else if (patterns &&
                   (made = td_metric_patterns_match(patterns, partial->data + from, to - from))) {
            td_appender_write(out, made, strlen(made));
            free(made);
        }
        from = to;
        if (!nl) break;
    }
    memmove(partial->data, partial->data + from, partial->len - from);
    partial->len -= from;
    if (partial->len > (1u << 20)) partial->len = 0; /* a runaway line: the log has it */
}

/* Whether rank 0's log takes its stdout too (teed by the shepherd): then it has two writers. */
static bool log0_teed(const shepherd *h) {
    return h->out.fd >= 0;
}

/* Moves what rank 0 wrote to its stdout into the output file (and its log); at its end closes
 * the pipe. True when more may wait (it stopped at PUMP_READS). */
static bool pump(shepherd *h) {
    char buf[65536];
    bool more = true;
    for (int reads = 0; reads < PUMP_READS && more; reads++) {
        ssize_t k = read(h->pipe_fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) more = false;
        if (k < 0 && errno == EAGAIN) break;
        if (k <= 0) {
            close(h->pipe_fd);
            h->pipe_fd = -1;
            lines_to(&h->logs[0], &h->tee_line, NULL, 0, true);
            metric_lines(&h->out, h->s.patterns, &h->out_line, NULL, 0, true);
            more = false;
            break;
        }
        /* the log first: a line in the output file is one the daemon may already have
         * handled, and it should be in the log by then (unless the log waits for disk space
         * while the output file still took it) */
        lines_to(&h->logs[0], &h->tee_line, buf, (size_t)k, false);
        /* a full disk does not stop the job (its own checkpoint writes will say so): the
         * lines wait and go in once there is room */
        metric_lines(&h->out, h->s.patterns, &h->out_line, buf, (size_t)k, false);
    }
    say(h, "out %lld", h->out.size);
    return more;
}

/* Moves what process i wrote to its log pipe into its log; at its end closes the pipe. True when
 * more may wait. */
static bool pump_log(shepherd *h, int i) {
    char buf[65536];
    bool teed = i == 0 && log0_teed(h);
    for (int reads = 0; reads < PUMP_READS; reads++) {
        ssize_t k = read(h->log_pipes[i], buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return false; /* EAGAIN: all read */
        if (k == 0) {
            close(h->log_pipes[i]);
            h->log_pipes[i] = -1;
            if (teed) lines_to(&h->logs[0], &h->err_line, NULL, 0, true);
            return false;
        }
        if (teed)
            lines_to(&h->logs[0], &h->err_line, buf, (size_t)k, false);
        else
            td_appender_write(&h->logs[i], buf, (size_t)k);
    }
    return true;
}

/* Everything the pipes hold now into the logs and the output file. */
static void drain_pipes(shepherd *h) {
    while (h->pipe_fd >= 0 && pump(h)) {
    }
    for (int i = 0; i < h->procs; i++)
        while (h->log_pipes[i] >= 0 && pump_log(h, i)) {
        }
}

/* What waits for disk space, tried again (every turn of the loop). */
static void flush_waiting(shepherd *h) {
    if (td_appender_pending(&h->out)) {
        long long before = h->out.size;
        td_appender_flush(&h->out);
        if (h->out.size != before) say(h, "out %lld", h->out.size);
    }
    for (int i = 0; i < h->procs; i++)
        if (td_appender_pending(&h->logs[i])) td_appender_flush(&h->logs[i]);
}

/* Whether output waits for disk space (not for a file that fails otherwise). */
static bool waits_for_space(const shepherd *h) {
    for (int i = -1; i < h->procs; i++) {
        const td_appender *a = i < 0 ? &h->out : &h->logs[i];
        if (td_appender_pending(a) && (a->error == ENOSPC || a->error == EDQUOT)) return true;
    }
    return false;
}

/* The directory the job chose to start in ("cwd"), opened as the job: beneath its directory
 * when it is below it (made there when missing), else as the job would open it. */
static void open_job_dir(spec *s, const char *jobdir, char *error, size_t len) {
    const td_identity *who = s->launch.user && s->launch.user->drop ? s->launch.user : NULL;
    td_identity with_groups; /* a run_as user's groups, as its processes will have them */
    if (who && who->lookup_groups) {
        with_groups = *who;
        int n = TD_IDENTITY_GROUPS;
        if (getgrouplist(who->name, who->gid, with_groups.groups, &n) < 0) n = 0;
        with_groups.n_groups = n;
        with_groups.lookup_groups = false;
        who = &with_groups;
    }
    td_err err = {{0}};
    size_t n = strlen(jobdir);
    if (strncmp(s->dir, jobdir, n) == 0 && s->dir[n] == '/') {
        int jfd = open(jobdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        s->dir_fd = jfd < 0 ? -1 : td_jobfs_mkdirs(who, jfd, s->dir + n + 1, 0700, &err);
        if (jfd >= 0) close(jfd);
    } else {
        s->dir_fd = td_jobfs_open_path(who, jobdir, s->dir, O_RDONLY | O_DIRECTORY, &err);
    }
    if (s->dir_fd < 0)
        snprintf(error, len, "cannot enter the job's cwd %.300s: %.600s", s->dir,
                 err.msg[0] ? err.msg : strerror(errno));
    else
        s->launch.cwd_fd = &s->dir_fd;
}

/* ---- the status file ------------------------------------------------------------------------ */

static void write_status(shepherd *h, const char *start_error) {
    flush_waiting(h); /* a last try for what waited (the status write below waits too) */
    json_t *o = json_object();
    json_object_set_new(o, "attempt", json_integer(h->s.attempt));
    int code = start_error ? 1 : h->g.first_failure;
    if (!start_error && code == 0 && h->g.terminating) code = h->g.stop_status;
    json_object_set_new(o, "exit_code", json_integer(code));
    json_object_set_new(o, "failed", json_boolean(start_error || h->g.first_failure != 0));
    json_object_set_new(o, "failed_rank", json_integer(start_error ? -1 : h->g.failed_rank));
    char reason[sizeof h->g.reason + PATH_MAX + 128];
    snprintf(reason, sizeof reason, "%s",
             start_error      ? start_error
             : h->g.reason[0] ? h->g.reason
                              : "");
    char jobdir[PATH_MAX];
    snprintf(jobdir, sizeof jobdir, "%s", h->s.status_path);
    if (strrchr(jobdir, '/')) *strrchr(jobdir, '/') = 0;
    struct statvfs vfs;
    bool full = h->out.ran_out || (statvfs(jobdir, &vfs) == 0 && vfs.f_bavail == 0);
    long long dropped = h->out.dropped_total;
    for (int i = 0; i < h->procs; i++) {
        full = full || h->logs[i].ran_out;
        dropped += h->logs[i].dropped_total;
    }
    if (!start_error)
        shepherd_errors_explain(&h->s.launch, h->s.attempt, &h->g, jobdir, reason, sizeof reason);
    if (full && reason[0]) /* what failed may be a write the job could not make */
        snprintf(reason + strlen(reason), sizeof reason - strlen(reason),
                 " (the filesystem of %s ran out of space while the job ran: No space left on "
                 "device%s)",
                 jobdir, dropped ? "; some output was dropped, see the logs" : "");
    json_object_set_new(o, "reason", json_string(reason));
    json_object_set_new(o, "stopped_by",
                        h->stopped_by[0] ? json_string(h->stopped_by) : json_null());
    json_object_set_new(o, "stop_reason", json_string(h->stop_reason));
    json_object_set_new(o, "grace_expired", json_boolean(h->g.grace_expired));
    json_object_set_new(o, "grace_note", json_string(h->g.grace_note));
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", h->s.status_path);
    /* whole or absent: written aside, synced, renamed over. A full disk is waited out (an hour
     * at most): without its status, the daemon could only say the shepherd vanished */
    for (int tries = 0;; tries++) {
        /* the output and the logs first: output_bytes counts what is on disk, and the logs
         * hold the last words of the job's processes */
        if (tries) flush_waiting(h);
        bool ok = false, waiting = waits_for_space(h) && tries < 3600;
        int e = ENOSPC;
        if (!waiting) {
            if (h->out.fd >= 0 && fsync(h->out.fd) != 0)
                fprintf(stderr, "traind-shepherd: fsync %s: %s\n", h->s.output, strerror(errno));
            json_object_set_new(o, "output_bytes", json_integer(h->out.size));
            FILE *f = fopen(tmp, "w");
            ok = f && json_dumpf(o, f, JSON_COMPACT) == 0 && fputc('\n', f) != EOF &&
                 fflush(f) == 0 && fsync(fileno(f)) == 0;
            e = errno;
            if (f) ok = fclose(f) == 0 && ok;
            if (!ok) e = errno ? errno : e;
        }
        if (ok && rename(tmp, h->s.status_path) == 0) break;
        if (!ok) unlink(tmp);
        bool no_space = e == ENOSPC || e == EDQUOT;
        if (tries == 0 || !no_space || tries == 3600)
            fprintf(stderr, "traind-shepherd: %s %s: %s%s\n",
                    waiting ? "the job's output waits for disk space before" : "cannot write",
                    h->s.status_path, strerror(e),
                    no_space && tries < 3600 ? " (tried again every second)" : "");
        if (!no_space || tries == 3600) break;
        sleep(1);
    }
    /* and the rename itself: the directory's entry */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", h->s.status_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    json_decref(o);
}

/* ---- the loop ------------------------------------------------------------------------------- */

/* The lines metrics.patterns had no time for, in rank 0's log where the job's owner looks. */
static void say_patterns_skipped(shepherd *h) {
    long n = td_metric_patterns_skipped(h->s.patterns);
    if (n <= 0 || h->procs < 1 || h->logs[0].fd < 0) return;
    char note[256];
    int k = snprintf(note, sizeof note,
                     "[traind] metrics.patterns: %ld lines were not matched: matching them took "
                     "more than a fifth of the time (simpler patterns, or fewer lines)\n",
                     n);
    td_appender_write(&h->logs[0], note, (size_t)k);
}

/* Starts the attempt's processes: in the directory the job chose (entered as the job), with
 * their error files' directories made, after noting the SummaryWriter files already there
 * (an earlier attempt's); the socket interface chosen goes first into rank 0's log. */
static void start_group(shepherd *h, char *start_error, size_t len) {
    static char jobdir[PATH_MAX], error_dir[PATH_MAX];
    snprintf(jobdir, sizeof jobdir, "%s", h->s.status_path);
    if (strrchr(jobdir, '/')) *strrchr(jobdir, '/') = 0;
    if (h->s.dir_as_job) open_job_dir(&h->s, jobdir, start_error, len);
    if (start_error[0]) return;
    shepherd_errors_prepare(&h->s.launch, h->s.attempt, jobdir, error_dir);
    if (h->out.fd >= 0) h->tboard = shepherd_tboard_new(&h->s.launch, h->s.tensorboard_dir);
    td_err err = {{0}};
    if (td_group_start(&h->g, &h->s.launch, h->s.attempt, &err) != 0) {
        snprintf(start_error, len, "%s", err.msg);
        return;
    }
    if (h->g.env_note[0] && h->logs[0].fd >= 0) {
        char note[sizeof h->g.env_note + 16];
        int k = snprintf(note, sizeof note, "[traind] %s\n", h->g.env_note);
        td_appender_write(&h->logs[0], note, (size_t)k);
    }
}

int main(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: traind-shepherd SPEC.json (started by traind, one per attempt "
                        "and node)\n");
        return 2;
    }
    static shepherd h;
    h.daemon_fd = h.pipe_fd = h.pending_fd = h.out.fd = -1;
    read_spec(&h.s, argv[1]);
    /* before any worker is started: none of them may hold the daemon's connection */
    if (h.s.daemon_fd >= 0) {
        if (fcntl(h.s.daemon_fd, F_SETFD, FD_CLOEXEC) != 0 ||
            fcntl(h.s.daemon_fd, F_SETFL, O_NONBLOCK) != 0)
            fprintf(stderr, "traind-shepherd: daemon_fd %d: %s (waiting for a daemon to connect)\n",
                    h.s.daemon_fd, strerror(errno));
        else
            h.daemon_fd = h.s.daemon_fd;
    }
    /* out of the daemon's process group: a terminal's ^C or the daemon's own group signals do
     * not reach the job. Not a session of its own: the kernel's autogroup scheduling gives each
     * session an equal share of the CPUs, so a job in its own would take as much as the daemon
     * and everything else in its session together, and its ranks would preempt the daemon's
     * API (the ranks' process group, td_launch's, is what signals go to) */
    if (setpgid(0, 0) != 0)
        fprintf(stderr, "traind-shepherd: setpgid: %s (still in its starter's process group)\n",
                strerror(errno));
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        fprintf(stderr, "traind-shepherd: prctl(PR_SET_CHILD_SUBREAPER): %s\n", strerror(errno));
    /* out of the daemon's cgroup, into the attempt's (the daemon's stays the daemon's, and a
     * stopped service's cgroup is not the job's to hold) */
    if (h.s.cgroup[0]) {
        char mine[PATH_MAX + 16];
        td_err cerr = {{0}};
        snprintf(mine, sizeof mine, "%s/shepherd", h.s.cgroup);
        if (td_cgroup_enter(mine, &cerr) != 0) fprintf(stderr, "traind-shepherd: %s\n", cerr.msg);
    }
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN); /* a daemon gone mid-send; the workers get SIG_DFL back */
    signal(SIGCHLD, SIG_DFL); /* an ignored SIGCHLD from a starter would hide exits */
    h.sig_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    /* the daemon's socket (bound before it wrote the spec: a daemon that comes back finds it
     * listening as long as this shepherd lives), or one of its own */
    td_err err = {{0}};
    h.listen_fd = h.s.listen_fd >= 0 && fcntl(h.s.listen_fd, F_SETFD, FD_CLOEXEC) == 0
                      ? h.s.listen_fd
                      : td_shepherd_listen(h.s.socket_path, &err);
    if (h.listen_fd < 0) fail_spec("%s", err.msg);
    fcntl(h.listen_fd, F_SETFL, O_NONBLOCK);
    if (h.sig_fd < 0 || h.listen_fd < 0)
        fail_spec("cannot set up (%s): %s", h.s.socket_path, strerror(errno));
    if (h.s.output[0] && td_appender_open(&h.out, h.s.output, OUT_WAIT_MAX, false, &err) != 0)
        fail_spec("%s", err.msg);
    /* the output file stops at max_log_bytes with a line the daemon shows as an event; the
     * logs rotate there (td_appender.h) */
    static char capped[256];
    snprintf(capped, sizeof capped,
             "{\"event\": \"" TD_EVENT_OUTPUT_CAPPED
             "\", \"reason\": \"rank 0's metric lines reached "
             "max_log_bytes (%lld bytes): the rest are in its log only\"}\n",
             h.s.max_log_bytes);
    if (h.s.output[0]) td_appender_limit(&h.out, h.s.max_log_bytes, false, capped);

    /* Every process's output reaches its log through a pipe to here, none through a file of
     * its own: on a full disk the shepherd keeps what the log cannot take and writes it once
     * it can, where a process writing the file itself would lose it. Rank 0's stdout has a
     * pipe of its own (the output file and its log); every other stdout shares its process's
     * stderr pipe, as it shared its log file, in the order written. One difference: writers
     * sharing a pipe (a rank and the children it started) keep a write whole only up to
     * PIPE_BUF (4 KiB), where O_APPEND on the file kept any write whole. */
    int procs = h.s.launch.launch_self ? 1 : h.s.launch.nproc_per_node;
    h.procs = procs;
    /* a log and a pipe's two ends a process while they start: room for them, as far as the
     * hard limit allows (a pipe that cannot be made says so below) */
    struct rlimit rl;
    rlim_t need = (rlim_t)procs * 3 + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    h.logs = td_calloc((size_t)procs, sizeof *h.logs);
    h.log_pipes = td_calloc((size_t)procs, sizeof(int));
    int *err_fds = td_calloc((size_t)procs, sizeof(int)), pipefd[2] = {-1, -1};
    int *out_fds = td_calloc((size_t)procs, sizeof(int));
    char start_error[1024] = "";
    if (h.out.fd >= 0 && pipe2(pipefd, O_CLOEXEC) != 0)
        snprintf(start_error, sizeof start_error, "pipe: %s", strerror(errno));
    for (int i = 0; i < procs; i++) h.logs[i].fd = h.log_pipes[i] = err_fds[i] = -1;
    size_t log_wait = LOGS_WAIT_MAX / (size_t)procs;
    if (log_wait < (1u << 20)) log_wait = 1u << 20;
    for (int i = 0; i < procs && !start_error[0]; i++) {
        int p[2];
        bool opened = td_appender_open(&h.logs[i], h.s.logs[i], log_wait, true, &err) == 0;
        if (opened) td_appender_limit(&h.logs[i], h.s.max_log_bytes, true, NULL);
        if (!opened) {
            snprintf(start_error, sizeof start_error, "%s", err.msg);
        } else if (pipe2(p, O_CLOEXEC) != 0) {
            snprintf(start_error, sizeof start_error, "pipe: %s", strerror(errno));
        } else {
            h.log_pipes[i] = p[0];
            err_fds[i] = p[1];
            fcntl(p[0], F_SETFL, O_NONBLOCK);
        }
        out_fds[i] = i == 0 && h.out.fd >= 0 ? pipefd[1] : err_fds[i];
    }
    h.s.launch.stdout_fds = out_fds;
    h.s.launch.stderr_fds = err_fds;
    if (!start_error[0]) start_group(&h, start_error, sizeof start_error);
    if (pipefd[1] >= 0) close(pipefd[1]);
    for (int i = 0; i < procs; i++)
        if (err_fds[i] >= 0) close(err_fds[i]);
    h.pipe_fd = pipefd[0];
    if (h.pipe_fd >= 0) fcntl(h.pipe_fd, F_SETFL, O_NONBLOCK);
    h.orphan_since = td_clock_now(); /* until the daemon connects */
    if (h.daemon_fd >= 0) {          /* the daemon that started it: already connected */
        h.orphan_since = 0;
        say_pids(&h);
        say(&h, "out %lld", h.out.size);
    }
    struct pollfd *fds = td_calloc((size_t)procs + 5, sizeof *fds);

    while (!start_error[0] || h.g.alive > 0) {
        int watched[5] = {h.sig_fd, h.listen_fd, h.daemon_fd, h.pipe_fd, h.pending_fd};
        for (int i = 0; i < 5 + procs; i++)
            fds[i] = (struct pollfd){i < 5 ? watched[i] : h.log_pipes[i - 5], POLLIN, 0};
        bool ticking = h.g.terminating || h.g.lingering || h.s.deadline > 0 || h.daemon_fd < 0;
        if (poll(fds, (nfds_t)procs + 5, ticking ? 100 : 1000) < 0 && errno != EINTR) {
            /* the group goes on; the loop must not end as if it were over */
            fprintf(stderr, "traind-shepherd: poll: %s\n", strerror(errno));
            continue;
        }
        flush_waiting(&h); /* tried again every turn, at least every second */
        if (fds[3].revents) pump(&h);
        for (int i = 0; i < procs; i++)
            if (fds[5 + i].revents && h.log_pipes[i] >= 0) pump_log(&h, i);
        if (fds[2].revents && h.daemon_fd >= 0) read_daemon(&h);
        if (fds[4].revents && h.pending_fd >= 0) read_pending(&h);
        if (fds[1].revents) accept_daemon(&h);
        if (fds[0].revents) {
            struct signalfd_siginfo si;
            while (read(h.sig_fd, &si, sizeof si) == (ssize_t)sizeof si)
                if (si.ssi_signo != SIGCHLD) {
                    char why[64];
                    snprintf(why, sizeof why, "the shepherd got signal %d (%s)", (int)si.ssi_signo,
                             strsignal((int)si.ssi_signo));
                    stop_group(&h, "signal", SIGTERM, h.s.launch.grace_s, why);
                }
        }
        for (;;) {
            int status;
            pid_t pid = waitpid(-1, &status, WNOHANG);
            if (pid <= 0) break;
            td_group_reaped(&h.g, pid, status, h.s.launch.grace_s);
        }
        /* the failed process's last words into its log before the failure is said: a master
         * reads them there for the job's reason (they were in the pipe when it was reaped) */
        if (h.g.first_failure != 0 && !h.failure_said) drain_pipes(&h);
        say_failure(&h);
        if (start_error[0]) continue;
        double now = td_clock_now();
        if (h.tboard && now >= h.tboard_next) {
            long long before = h.out.size;
            shepherd_tboard_poll(h.tboard, &h.out);
            if (h.out.size != before) say(&h, "out %lld", h.out.size);
            h.tboard_next = now + 2;
        }
        if (h.s.deadline > 0 && td_clock_wall() >= h.s.deadline) {
            char why[96];
            snprintf(why, sizeof why, "the job reached its time limit");
            stop_group(&h, "deadline", SIGTERM, h.s.launch.grace_s, why);
        }
        if (h.daemon_fd < 0 && h.orphan_since > 0 && now - h.orphan_since >= h.s.orphan_s) {
            char why[128];
            snprintf(why, sizeof why, "no traind was connected for %.0f s (orphan_timeout_s)",
                     h.s.orphan_s);
            stop_group(&h, "orphaned", SIGTERM, h.s.launch.grace_s, why);
        }
        td_group_tick(&h.g);
        if (td_group_over(&h.g)) break;
    }
    /* what is left in the pipe; then it is closed, even if a process that left the group
     * (setsid) still holds it: the job is over */
    drain_pipes(&h);
    for (int i = 0; i < procs; i++) {
        if (h.log_pipes[i] >= 0) close(h.log_pipes[i]);
        h.log_pipes[i] = -1;
    }
    if (h.pipe_fd >= 0) close(h.pipe_fd);
    h.pipe_fd = -1;
    /* rank 0's partial last lines, as they are, and its last scalars */
    if (procs > 0 && log0_teed(&h)) {
        lines_to(&h.logs[0], &h.tee_line, NULL, 0, true);
        lines_to(&h.logs[0], &h.err_line, NULL, 0, true);
    }
    say_patterns_skipped(&h);
    if (h.tboard) {
        shepherd_tboard_poll(h.tboard, &h.out);
        say(&h, "out %lld", h.out.size);
        shepherd_tboard_free(h.tboard);
    }
    write_status(&h, start_error[0] ? start_error : NULL);
    say(&h, "over");
    unlink(h.s.socket_path);
    td_appender_close(&h.out);
    for (int i = 0; i < procs; i++) td_appender_close(&h.logs[i]);
    free(h.logs);
    free(h.log_pipes);
    free(fds);
    free(err_fds);
    free(out_fds);
    return start_error[0] ? 1 : 0;
}
