/* The runner: what one node runs of attempts, whoever asked for them, a job of this daemon's own
 * (node rank 0 of 1) or a part its master orders. A node is a cluster of one: both start, and are
 * found again after a restart, the same way. The runner holds the node's slots and GPUs, says who
 * a job runs as and makes the directories it may write, makes the attempt's cgroup, and starts
 * traind-shepherd on a spec whose notes a restarted daemon reads (td_runner_start.c). It knows a
 * job by its id, uid and directory, never the job table: the jobs module (service/jobs/) sits
 * above it, and its caller's lock guards a td_runner (td_jobs' mutex). */
#ifndef TD_RUNNER_H
#define TD_RUNNER_H

#include "base/td_buf.h"
#include "base/td_error.h"
#include "base/td_log.h"
#include "service/run/td_cgroup.h"
#include "service/run/td_identity.h"
#include "service/run/td_jobfs.h"
#include "service/run/td_launch.h"
#include "service/run/td_shepherd.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/* Who jobs run as (td_identity.h says why each job gets a uid of its own). */
typedef enum td_run_as {
    TD_RUN_AS_SELF,    /* the daemon's own identity (a daemon that is not root) */
    TD_RUN_AS_USER,    /* one configured user for every job */
    TD_RUN_AS_DYNAMIC, /* each job its own uid from job_uids */
} td_run_as;

/* The node's settings (td_jobs_config.runner); a reload changes grace_s and orphan_timeout_s. */
typedef struct td_runner_config {
    const char *state_dir; /* jobs/ID lives here */
    const char *shepherd;  /* traind-shepherd's path: it runs each attempt (td_shepherd.h) */
    const char *worker;    /* traind-worker's path: what a train job's processes run */
    /* how long a shepherd waits for a daemon that went away before it stops its job */
    double orphan_timeout_s;
    double grace_s;     /* SIGTERM to SIGKILL */
    int slots;          /* GPUs, or CPU slots when there are none */
    int gpus;           /* > 0: slot i is GPU gpu_ids[i] (CUDA_VISIBLE_DEVICES) */
    const int *gpu_ids; /* the gpus CUDA ordinals (NULL: 0 to gpus - 1); kept, not copied */
    /* who jobs run as: run_as_user for TD_RUN_AS_USER; each its own uid of job_uid_first to
     * job_uid_last - 1 for TD_RUN_AS_DYNAMIC (job_uid_last, never a job's, is the identity the
     * data probes run as at submit); supplementary groups job_groups */
    td_run_as run_as;
    td_identity run_as_user;
    uid_t job_uid_first, job_uid_last;
    gid_t job_groups[TD_IDENTITY_GROUPS];
    int n_job_groups;
    td_cgroups cgroups;       /* where attempts' cgroups go (subtree "": none) */
    int max_checkpoint_files; /* files one checkpoint may hold */
    long long max_log_bytes;  /* a rank's log before it is rotated (td_appender.h) */
    double max_events_per_s;  /* rank 0's metric lines taken per second of a job (0: no limit) */
} td_runner_config;

typedef struct td_runner {
    const td_runner_config *cfg; /* its owner's, read at every use (a reload changes it) */
    int used_slots;              /* held by what runs here, of cfg->slots */
    bool *gpu_used;              /* [cfg->gpus] */
    /* cgroups of attempts that ended, removed once their shepherds have gone (td_cgroup.h) */
    char **cg_ended;
    int n_cg_ended;
    double cg_tried; /* the last try (monotonic) */
} td_runner;

void td_runner_init(td_runner *n, const td_runner_config *cfg);
void td_runner_free(td_runner *n);

/* ---- slots and GPUs (td_runner.c) ---- */
/* The CUDA ordinal of GPU slot `slot`. */
static inline int td_runner_gpu_id(const td_runner *n, int slot) {
    return n->cfg->gpu_ids ? n->cfg->gpu_ids[slot] : slot;
}
/* Each started process's CUDA_VISIBLE_DEVICES: devices (slots, n_slots of them) shared out in
 * order, n_slots / procs each, or all of them to every process (all: "visible_gpus": "job"); a
 * NULL-terminated list for td_launch_config.devices. */
char **td_runner_devices_strv(const td_runner *n, const int *devices, int n_slots, int procs,
                              bool all);
/* The first n free GPU slots, marked used: NULL (nothing taken) when fewer are free. */
int *td_runner_take_gpus(td_runner *n, int count);
/* The GPU slots a list names (n of them), marked used again (an attempt found after a restart);
 * NULL without GPUs (a node without them, or no list). */
int *td_runner_hold_gpus(td_runner *n, json_t *slots, int count);
/* Frees count GPU slots (devices NULL: none). */
void td_runner_give_back_gpus(td_runner *n, const int *devices, int count);
int td_runner_gpus_free(const td_runner *n); /* GPUs no attempt holds */
/* An attempt's cgroup (path; NULL or "": none) whose attempt is over: its processes are killed
 * (what its shepherd did not end, a shepherd that died) and it goes once it is empty. */
void td_runner_cgroup_ended(td_runner *n, const char *path);
/* Removes what can go of those (every second at most): the supervisor's turn. */
void td_runner_cgroups_tidy(td_runner *n);

/* ---- who a job runs as, its directories (td_runner_identity.c) ---- */
/* Who job id (of uid, when it has one of its own) runs as. */
td_identity td_runner_identity_of(const td_runner *n, long id, long uid);
/* Who a submission's data probes run as: a job's rights, none of any job's files. */
td_identity td_runner_probe_identity(const td_runner *n);
/* Whether uid may be a job's here (in job_uids, when jobs get their own). */
bool td_runner_uid_ok(const td_runner *n, long uid);
/* Job id's files (td_jobfs.h), for a job of uid. */
void td_runner_files_for(const td_runner *n, long id, long uid, td_job_files *out);
/* The directory an attempt's processes run in, made ready for who (cwd: dir, or dir/work when
 * they run as another user than the daemon). */
int td_runner_work_dir(const td_identity *who, const char *dir, char *cwd, size_t len, td_err *err);
/* Where the processes start: spec_cwd (a command's "cwd") when absolute, DIR/work/spec_cwd when
 * relative, else the work directory `work`. */
void td_runner_start_dir(const char *dir, const char *work, const char *spec_cwd, char *out,
                         size_t len);
/* That directory's name alone (what a relative path a job prints is relative to). */
void td_runner_cwd_of(const td_identity *who, const char *dir, char *cwd, size_t len);
/* Makes the cgroup of attempt `attempt` of job id on node rank node_rank with lim (td_cgroup.h):
 * its path in out, "" when there are no cgroups here. */
int td_runner_attempt_cgroup(const td_runner *n, long id, int attempt, int node_rank,
                             const td_cgroup_limits *lim, char *out, size_t len, td_err *err);
/* USER, LOGNAME, HOME and TMPDIR for a job of its own identity, appended to env at *count (4
 * at most). */
void td_runner_identity_env(const td_identity *who, const char *cwd, char **env, size_t *count);

/* ---- the runner (td_runner_attempt.c) ---- */
/* What this node runs of one attempt: a job's own (node rank 0 of 1) or a part its master orders.
 * The pointers are the caller's, for the call. */
typedef struct td_runner_attempt {
    long job, uid;
    const char *kind;                      /* "train" or "command" */
    int attempt, node_rank, nnodes, nproc; /* nproc: ranks on this node */
    int procs;                             /* processes started: nproc, or 1 (launch "self") */
    const char *dir;                       /* the job's directory here */
    char **argv, **env;                    /* what the processes run, the job's environment */
    const char *latest_checkpoint;         /* a command's TRAIND_LATEST_CHECKPOINT, or NULL */
    long stop_at_step;                     /* TRAIND_STOP_AT_STEP (a paused trial's); 0: none */
    const char *spec_cwd;                  /* a command's "cwd" (NULL or "": its work dir) */
    const char *local_rank_arg;            /* a command's --local_rank option, or NULL */
    bool launch_self, see_all_gpus;
    const int *slots; /* its GPU slots here, n_slots of them (NULL: no GPUs) */
    int n_slots;      /* slots held, GPUs or not: nproc x gpus_per_proc */
    const char *master_addr;
    int master_port, max_restarts;
    td_cgroup_limits limits;
    long long disk_bytes;
    json_t *metrics; /* a command's metric patterns for rank 0's shepherd, or NULL */
    double deadline; /* the time limit's end, kept by the shepherd; 0: none, or the master's */
} td_runner_attempt;
/* Each started process's log (DIR/rank-R.log by global rank), and its size now into
 * log_start[procs]: where the attempt's lines start. */
char **td_runner_logs(const td_runner_attempt *r, long long *log_start);
/* Starts r's processes under a new shepherd (sh): the work directory made ready for who the job
 * runs as, its environment and cgroup (its path into cgroup, "" for none), and the shepherd's
 * spec with the notes (the caller's, completed by td_runner_notes). -1 (err) when it cannot:
 * nothing runs then. */
int td_runner_start(td_runner *n, const td_runner_attempt *r, const long long *log_start,
                    char **logs, json_t *notes, td_shepherd *sh, char *cgroup, size_t len,
                    td_err *err);
/* What a restarted daemon reads of an attempt it finds (td_shepherd_notes), added to notes: the
 * job, attempt, node rank, processes, slots ("n_slots", "gpu_slots"), log offsets, uid, cgroup. */
void td_runner_notes(const td_runner_attempt *r, const char *cgroup, const long long *log_start,
                     json_t *notes);
/* An attempt a previous daemon started here (BASE, its notes), found again: its procs processes'
 * log offsets, its n_slots slots held again (and the very GPUs, into *devices: NULL without
 * them), its cgroup, and its shepherd attached (td_shepherd_attach: 0 it still runs, 1 it ended,
 * -1 its file cannot be read). */
int td_runner_attach(td_runner *n, const char *base, json_t *notes, int procs, int n_slots,
                     int **devices, long long *log_start, char *cgroup, size_t len, td_shepherd *sh,
                     td_err *err);
/* Whether the notes are a part's a master ordered ("part"; an older traind's "guest"). */
bool td_runner_notes_of_part(json_t *notes);
/* How many slots the notes say the attempt holds (otherwise: when they do not say). */
int td_runner_notes_n_slots(json_t *notes, int otherwise);
/* The shepherd's spec for td_launch_config c (td_shepherd.h; its "daemon" notes are the
 * caller's). */
json_t *td_runner_shepherd_spec(const td_runner *n, const td_launch_config *c, int attempt,
                                char **logs, char **devices, double deadline);

/* ---- following an attempt (td_runner_follow.c) ---- */
/* The words a stop request to a shepherd starts with: what a daemon that reads the status file
 * later (after a restart) makes of the stop. */
#define TD_RUNNER_STOP_CANCEL     "cancel: "
#define TD_RUNNER_STOP_HOLD       "hold: "
#define TD_RUNNER_STOP_TIME_LIMIT "time_limit: "
#define TD_RUNNER_STOP_QUOTA      "quota: "
#define TD_RUNNER_STOP_DAEMON     "daemon_stop: "
#define TD_RUNNER_STOP_DAEMON_WORDS                                                                \
    TD_RUNNER_STOP_DAEMON "traind stopped and stopped its jobs (keep_jobs_on_stop is false)"
/* A token bucket of rank 0's lines (max_events_per_s): `tokens` left as of `at` (0: never used,
 * starts full). */
typedef struct td_rate_bucket {
    double tokens, at;
} td_rate_bucket;
/* Whether a line may be taken now from bucket b (max_events_per_s, bursts of ten seconds'); one
 * refused is counted by the caller, never silently lost. */
bool td_runner_rate_admit(const td_runner *n, td_rate_bucket *b);
/* Opens rank 0's output file path for td_runner_read_lines (-1 and a log line when it cannot;
 * absent is no error: nothing written yet). */
int td_runner_open_output(td_log *log, long job_id, const char *path);
/* Reads fd from *read_to up to `until` into line and hands each whole line to fn
 * (NUL-terminated in place) with the file offset just after it; final: the last partial line
 * too, once everything is read. budget > 0: at most that many bytes this call (true: more is
 * left); fn returning false stops it too (true: what follows is read at the next call). A line
 * over 1 MiB is skipped (the shepherd wrote it to rank 0's log, where every line of rank 0's
 * stdout is). Rank 0's output is read so for a job's own attempt and a node's part alike. */
typedef bool (*td_runner_line_fn)(void *ctx, char *line, size_t n, long long end);
bool td_runner_read_lines(int fd, long long *read_to, long long until, bool final, long long budget,
                          td_buf *line, td_runner_line_fn fn, void *ctx);
/* The failing rank's own words from its log (traind-worker's "error:" line, or a command's last
 * line that is not a metric), from offset `from` of dir/rank-R.log. */
void td_runner_rank_message(const char *dir, int rank, long long from, bool command, char *out,
                            size_t len);
/* Whether process group pgid is still an attempt's: its leader runs in the job's directory dir
 * (an id saved before a restart may be another process's by now). */
bool td_runner_group_of(pid_t pgid, const char *dir);

#endif
