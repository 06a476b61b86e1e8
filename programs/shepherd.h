/* traind-shepherd's own state, shared by its parts (programs/shepherd_*.c): the spec it runs
 * and the shepherd's state while the group lives. Private to the program; what it exchanges
 * with the daemon is service/run/td_shepherd_protocol.h's. */
#ifndef SHEPHERD_H
#define SHEPHERD_H

#include "programs/shepherd_tboard.h"

#include "service/run/td_appender.h"
#include "base/td_buf.h"
#include "service/run/td_launch.h"
#include "service/run/td_metric_patterns.h"

#include <limits.h>
#include <stdbool.h>
#include <stddef.h>

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

#define OUT_WAIT_MAX  (64u << 20)
#define LOGS_WAIT_MAX (64u << 20) /* split among a node's processes, but at least 1 MiB each */
#define PUMP_READS    16 /* reads of one pipe a turn: a chatty rank cannot starve the rest */

/* ---- the spec (shepherd_spec.c) ---- */

/* "traind-shepherd: ...", and exit status 2: a spec it cannot use. */
__attribute__((format(printf, 1, 2), noreturn)) void fail_spec(const char *fmt, ...);
/* The spec at path into *s; a spec it cannot use ends the program (fail_spec). */
void read_spec(spec *s, const char *path);

/* ---- the control socket (shepherd_control.c) ---- */

/* A line to the connected daemon, if any; one that cannot take it is dropped. */
void say(shepherd *h, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* "pid ...", "failed ..." (once a daemon) and "out ..." to the connected daemon. */
void say_pids(shepherd *h);
void say_failure(shepherd *h);
void say_out(shepherd *h);
/* What the connected daemon sent; a new connection; what the pending one said. */
void read_daemon(shepherd *h);
void accept_daemon(shepherd *h);
void read_pending(shepherd *h);

/* ---- rank 0's output, every process's log (shepherd_output.c) ---- */

/* Whole lines of p into log (the rest waits in partial); end: all of it. */
void lines_to(td_appender *log, td_buf *partial, const char *p, size_t n, bool end);
/* Whether rank 0's log takes its stdout too. */
bool log0_teed(const shepherd *h);
/* Rank 0's stdout pipe, process i's log pipe: true when more may wait. */
bool pump(shepherd *h);
bool pump_log(shepherd *h, int i);
/* Everything the pipes hold now; what waits for disk space, tried again. */
void drain_pipes(shepherd *h);
void flush_waiting(shepherd *h);
/* The lines metrics.patterns had no time for, said in rank 0's log. */
void say_patterns_skipped(shepherd *h);
/* Opens each process's log and the pipes to it (and, in pipefd, to the output file) and sets
 * the launch's stdout_fds and stderr_fds to *err_fds and *out_fds (the caller's to free);
 * start_error says what failed. */
void open_logs(shepherd *h, int **err_fds, int **out_fds, int pipefd[2], char *start_error,
               size_t len);

/* ---- the group (shepherd_group.c) ---- */

/* Stops the group (sig, SIGKILL after grace) for the first reason given (by: "request",
 * "deadline", "orphaned", "signal"); later ones are ignored. */
void stop_group(shepherd *h, const char *by, int sig, double grace, const char *reason);
/* Starts the group; start_error says why it could not. */
void start_group(shepherd *h, char *start_error, size_t len);

/* ---- the loop (shepherd_supervise.c) ---- */

/* Supervises the group until it is over (or, when it could not start, until none is left). */
void supervise(shepherd *h, const char *start_error);

/* ---- the status file (shepherd_status.c) ---- */

/* BASE.status, whole; start_error: why the group could not start (NULL: it started). */
void write_status(shepherd *h, const char *start_error);

#endif
