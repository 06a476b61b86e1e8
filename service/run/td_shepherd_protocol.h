/* The protocol between the daemon and traind-shepherd, both halves: what each writes and how
 * the other reads it. The daemon's side is service/run/td_shepherd.c (starting a shepherd, finding
 * it again), the shepherd's is programs/shepherd_*.c; what they exchange is encoded and decoded
 * only here, so that neither half can change a line or a member without the other seeing it.
 *
 * A shepherd owns one attempt's processes on one node, so that they outlive a daemon that
 * crashes, is killed or is restarted (a package upgrade), that a daemon started later finds it
 * again, and that no process of a job outlives the job.
 *
 * The files. An attempt's files share one base path, DIR/attempt-A.node-R, in the job's
 * directory (td_shepherd_base):
 *   BASE.json    the spec: what the shepherd runs (0600: it holds the token); the daemon keeps
 *                its own notes about the attempt in its "daemon" member, which the shepherd
 *                ignores. Removed once the daemon has handled the attempt's end
 *                (td_shepherd_forget): one that is left is an attempt some daemon still has to
 *                look at
 *   BASE.sock    the shepherd's control socket (while it runs)
 *   BASE.out     rank 0's stdout, appended and synced by the shepherd: the daemon reads the
 *                job's metric lines from it by offset, so one that comes back neither misses
 *                nor repeats a line. Past max_log_bytes its last line is the event
 *                TD_EVENT_OUTPUT_CAPPED
 *   BASE.status  how the attempt ended (written atomically, once, as the shepherd exits)
 *   BASE.log     the shepherd's own messages (its stdout and stderr); its existence says a
 *                shepherd ran
 *
 * The spec (BASE.json, a JSON object) says what to run and where: the torchrun environment and
 * the processes as td_launch starts them (service/run/td_launch.h), each process's log file, the
 * output file, the control socket, the status file, the job's deadline and how long the
 * shepherd waits for a daemon that went away (orphan_timeout_s). The daemon's job code writes
 * the job's members; td_shepherd_spec_fill adds the protocol's own (the paths, the token, this
 * boot's id, the descriptors); the shepherd reads them all in programs/shepherd_spec.c.
 *
 * Starting and re-attaching. A daemon starts a shepherd with a first connection already made
 * (a socketpair's end, "daemon_fd": TD_SHEPHERD_DAEMON_FD) and BASE.sock already bound and
 * listening ("listen_fd": TD_SHEPHERD_LISTEN_FD), so that no daemon ever waits for a socket to
 * appear. A later daemon connects to BASE.sock and proves it is the daemon with the token
 * ("hello TOKEN": a job's processes run as the daemon's user, so the socket's permissions
 * alone cannot tell them apart); the newest daemon is the one. The connection ending is the
 * attempt's end: BASE.status says how, and without one the shepherd died (kill -9) and the
 * daemon kills what is left of the process group itself.
 *
 * The socket's lines, each ending in '\n'. A connection is the daemon's once its first line is
 * "hello TOKEN" with the spec's token; until then it is only read:
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
 *                        "error unknown request: ..."  a line it did not understand
 *                        "over"           the status file is written; the shepherd exits
 *
 * The status file (BASE.status, one JSON object): attempt, exit_code, failed, failed_rank,
 * reason, stopped_by, stop_reason, grace_expired, grace_note, output_bytes
 * (td_shepherd_status_json writes them, td_shepherd_end_read reads them back). */
#ifndef TD_SHEPHERD_PROTOCOL_H
#define TD_SHEPHERD_PROTOCOL_H

#include "base/td_error.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* The event of the output file's last line once it reached max_log_bytes (the shepherd writes
 * it; the daemon takes it past max_events_per_s, once an attempt). */
#define TD_EVENT_OUTPUT_CAPPED "output_capped"

/* The descriptors a shepherd is started with: the daemon's connection and the listening
 * control socket (the spec's "daemon_fd" and "listen_fd"). */
#define TD_SHEPHERD_DAEMON_FD 3
#define TD_SHEPHERD_LISTEN_FD 4

/* ---- the spec ---------------------------------------------------------------------------- */

/* The protocol's members of a spec for base: "status", "output" (a null one is removed:
 * process 0's stdout goes to its log, for a node without global rank 0), "socket", "token",
 * "boot_id", "daemon_fd" and "listen_fd". */
void td_shepherd_spec_fill(json_t *spec, const char *base, const char *token, const char *boot);

/* ---- daemon -> shepherd ------------------------------------------------------------------ */

/* "hello TOKEN\n" into line; its length. */
int td_shepherd_hello_line(char *line, size_t len, const char *token);
/* Whether line (line_len bytes before its '\n') is the hello with token. */
bool td_shepherd_hello_ok(const char *line, size_t line_len, const char *token);
/* "stop SIGNAL GRACE_S REASON\n" into line (len: 700 bytes or more), reason's own line ends
 * made blanks; its length. */
int td_shepherd_stop_line(char *line, size_t len, int sig, double grace_s, const char *reason);

typedef enum td_shepherd_request {
    TD_SHEPHERD_STOP,   /* *sig, *grace_s and *reason are set */
    TD_SHEPHERD_STATUS, /* "status" */
    TD_SHEPHERD_UNKNOWN,
} td_shepherd_request;
/* What a daemon's line (without its '\n') asks for. */
td_shepherd_request td_shepherd_request_parse(const char *line, int *sig, double *grace_s,
                                              const char **reason);

/* ---- shepherd -> daemon (lines without their '\n': the sender ends them) ------------------ */

#define TD_SHEPHERD_OVER "over"

/* "out BYTES" */
void td_shepherd_out_line(char *line, size_t len, long long bytes);
/* "pid PGID N P1 .. PN": the processes of pids[0, n) still running (0: reaped). */
void td_shepherd_pid_line(char *line, size_t len, pid_t pgid, const pid_t *pids, int n);
/* "failed RANK CODE TIME REASON", reason's line ends made blanks. */
void td_shepherd_failed_line(char *line, size_t len, int rank, int code, double at,
                             const char *reason);
/* "error unknown request: LINE" */
void td_shepherd_unknown_line(char *line, size_t len, const char *request);

struct td_shepherd;
/* One of the shepherd's lines (without its '\n') into what the daemon knows of it
 * (td_shepherd.h): pid, out, failed and over lines; anything else is ignored. */
void td_shepherd_said(struct td_shepherd *s, const char *line);

/* ---- the status file ----------------------------------------------------------------------- */

/* What the shepherd writes into BASE.status (output_bytes goes in as it is written). */
typedef struct td_shepherd_status {
    int attempt, exit_code;
    bool failed;
    int failed_rank;
    const char *reason;
    const char *stopped_by; /* "": not stopped (written as null) */
    const char *stop_reason;
    bool grace_expired;
    const char *grace_note;
} td_shepherd_status;
/* A new object with st's members. */
json_t *td_shepherd_status_json(const td_shepherd_status *st);
/* Its "output_bytes": the output file's size once synced. */
void td_shepherd_status_output(json_t *status, long long output_bytes);

/* How an attempt's processes ended, from BASE.status (the daemon's reading of it). */
typedef struct td_shepherd_end {
    int exit_code;          /* the first failure's status, else what stopped processes ended with */
    bool failed;            /* a process failed (exited non-zero or was killed) before any stop */
    int failed_rank;        /* its global rank; -1: none */
    char reason[512];       /* the failure (or why it could not start) in words */
    char stopped_by[32];    /* "request", "deadline", "orphaned", "signal"; "": not stopped */
    char stop_reason[512];  /* the words of the stop request, or the shepherd's own */
    char grace_note[256];   /* which process needed SIGKILL after the grace period */
    long long output_bytes; /* BASE.out's size at the end */
} td_shepherd_end;
/* 1 with *end filled from BASE.status, 0 when there is none, -1 when it is unreadable. */
int td_shepherd_end_read(const char *base, td_shepherd_end *end, td_err *err);

#endif
