/* The daemon's side of traind-shepherd (programs/shepherd_main.c): the process that owns one
 * attempt's processes on one node, so that they outlive a daemon that crashes, is killed or is
 * restarted, and that a daemon started later finds again. Starting one, connecting to one
 * again, reading what it says; what the two exchange (the attempt's files, the spec, the
 * socket's lines, the status file) is td_shepherd_protocol.h's. */
#ifndef TD_SHEPHERD_H
#define TD_SHEPHERD_H

#include "base/td_error.h"
#include "service/run/td_shepherd_protocol.h"

#include <jansson.h>
#include <limits.h>
#include <stdbool.h>
#include <sys/types.h>

typedef struct td_shepherd {
    char base[PATH_MAX - 16];
    int fd;             /* the connection; -1: none (not made, or it ended) */
    pid_t pid;          /* the shepherd, when this daemon started it (its child); else 0 */
    pid_t pgid;         /* the attempt's process group, once the shepherd said it; else 0 */
    int live;           /* the group's processes still running, as last said */
    long long out_size; /* BASE.out's size, as last said */
    bool over;          /* it said "over": BASE.status is written */
    /* it said "failed": a process failed (at failed_at, wall clock) while the rest of the
     * group may still be stopping */
    bool failed;
    int failed_rank, failed_code;
    double failed_at;
    char failed_reason[320];
    bool stop_sent; /* a stop was asked for */
    char in[512];   /* a partial line from it */
    size_t in_len;
} td_shepherd;

/* Writes spec (an object in the spec's format, td_shepherd_protocol.h; the paths, the token and
 * the connection are filled in here (td_shepherd_spec_fill), and "output": null means process 0's
 * stdout goes to its log, for a node without global rank 0) to BASE.json and starts program on it,
 * connected. -1 when it could not be started (nothing runs then). */
int td_shepherd_start(td_shepherd *s, const char *program, const char *base, json_t *spec,
                      td_err *err);
/* The control socket at path, bound (mode 0600) and listening: the daemon makes it before the
 * shepherd starts, and a shepherd started by hand makes its own. -1 with the message in err. */
int td_shepherd_listen(const char *path, td_err *err);
/* Connects to the shepherd of BASE (its token read from BASE.json): 0 connected; 1 when none
 * runs any more (then BASE.status says how the attempt ended, or the shepherd died); -1 when
 * BASE.json cannot be read. */
int td_shepherd_attach(td_shepherd *s, const char *base, td_err *err);
/* BASE.json's "daemon" member (a new reference; NULL: none or unreadable). */
json_t *td_shepherd_notes(const char *base);
/* Reads what the shepherd said (call when its fd is readable): pid, out, failed and over
 * lines; at the connection's end, fd becomes -1. */
void td_shepherd_read(td_shepherd *s);
/* Asks it to stop the group: sig now, SIGKILL after grace_s; reason is what BASE.status will
 * say. Once per attempt; false when there is no connection. */
bool td_shepherd_stop(td_shepherd *s, int sig, double grace_s, const char *reason);
/* Whether a shepherd was ever started on BASE (BASE.log is made as it starts): a daemon that
 * died between writing BASE.json and starting it left nothing running. */
bool td_shepherd_ran(const char *base);
/* Whether BASE's shepherd was started before this machine's last boot: its processes went with
 * the machine, not through a kill. */
bool td_shepherd_other_boot(const char *base);
/* The last line of BASE.log (why a shepherd could not run), or "". */
void td_shepherd_last_words(const char *base, char *out, size_t len);
/* Closes the connection (the shepherd goes on, waiting for a daemon). */
void td_shepherd_close(td_shepherd *s);
/* The attempt is handled: BASE.json and BASE.sock go (BASE.out, .status and .log stay). */
void td_shepherd_forget(const char *base);
/* "DIR/attempt-A.node-R" */
void td_shepherd_base(char *out, size_t len, const char *dir, int attempt, int node_rank);
/* Where traind-shepherd is: beside the program at self (a build tree), else in
 * PREFIX/lib/traind beside PREFIX/bin (an installed one). */
void td_shepherd_program(char *out, size_t len, const char *self);

#endif
