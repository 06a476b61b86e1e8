/* What traind's files share (daemon_main.c, daemon_state.c, daemon_identity.c,
 * daemon_reload.c): the program's own, not a library's. */
#ifndef DAEMON_PRIVATE_H
#define DAEMON_PRIVATE_H

#include "api/td_api.h"
#include "daemon_config.h"
#include "service/jobs/td_jobs.h"
#include "base/td_log.h"
#include "service/store/td_tokens.h"

#include <stdbool.h>
#include <stddef.h>

#define MAX_ROOTS DAEMON_MAX_ROOTS

/* daemon_main.c: a start-up error, as an error line in the log's format once it is open (else
 * on stderr), and exit status 2. */
__attribute__((format(printf, 1, 2), noreturn)) void daemon_die(const char *fmt, ...);

/* daemon_state.c */
/* mkdir -p with mode 0700 for the directories it creates. */
void daemon_make_dirs(const char *path);

/* STATE_DIR/NAME: read, or created on the first start as 32 random bytes in hex (mode 0600):
 * the API token, the node id. */
void daemon_load_random(const char *dir, const char *name, const char *what, char *token,
                        size_t len, td_log *log);

/* The cluster secret, from --cluster-secret-file. */
void daemon_load_cluster_secret(const char *path, char *out, size_t len, td_log *log);

/* One daemon per state directory: an exclusive flock on STATE_DIR/traind.pid, held for the
 * daemon's life. Two daemons on one directory would each recover the other's running jobs as
 * interrupted and kill its workers. The kernel drops the lock when the process ends, SIGKILL
 * included, so a crash never leaves a stale lock behind; the file's content (the PID) only
 * serves the message a second daemon prints. The descriptor is close-on-exec: workers never
 * inherit it. */
int daemon_lock_state_dir(const char *dir, td_log *log);

/* The data roots resolved after symlinks (a missing one is skipped with a warning), then the
 * state directory, which always is one. Returns how many. */
int daemon_resolve_roots(const daemon_options *o, const char *state, td_log *log,
                         char (*resolved)[PATH_MAX], const char **roots);

/* A PEM file's text (certificate or key), at most 1 MiB; what names it in messages. A private
 * key others may read is said so. */
char *daemon_read_pem(const char *path, const char *what, bool secret, td_log *log);

/* The state directory, for jobs run as other users: its directories let them through to their
 * job directories (o+x, not o+r: nothing is listed), and everything else in it is the
 * daemon's alone (the umask is 077; the database's -wal and -shm files take its mode). */
void daemon_open_for_jobs(const char *state, const char *db_path, bool others, td_log *log);

/* daemon_identity.c */
/* Who jobs run as (td_identity.h): a root daemon gives each its own uid unless run_as names a
 * user (or root); a daemon that is not root runs them as itself and says they are not
 * isolated. */
void daemon_resolve_run_as(const daemon_options *o, td_log *log, td_jobs_config *jc);

/* What a job may use unless it says, and the most (td_job_limits); memory 0: the node's less a
 * reserve (1 GiB, or a tenth of a small node's) for the daemon and the system. */
td_job_limits daemon_job_limits(const daemon_options *o);

/* daemon_reload.c */
/* The parts of a running daemon a reload hands new values to (daemon_settings.def names the
 * part of each live setting). */
typedef struct daemon_running {
    const char *state;
    td_log *log;
    td_jobs *jobs;
    td_api *api;
    td_tokens *tokens;
} daemon_running;

/* log_level as the log takes it. */
td_log_level daemon_log_level(const daemon_options *o);

/* Each token's limits, from the settings. */
td_tokens_limits daemon_token_limits(const daemon_options *o);

/* SIGHUP: the configuration again. What a running daemon can take (data roots, grace, body
 * limit, logging, ...: daemon_settings.def says) changes now; any other change is named and
 * waits for a restart. */
void daemon_reload(daemon_options *o, int argc, char **argv, const daemon_running *r);

#endif
