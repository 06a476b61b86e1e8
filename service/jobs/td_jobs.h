/* The daemon's jobs: the queue (priority, then age; backfilling that never delays the head), the
 * slots, and the supervisor thread that starts attempts
 * (td_launch's groups), reads rank 0's metric lines, records every change in the database
 * before announcing it, restarts failed attempts from their checkpoints and cancels on request.
 *
 * The HTTP side only calls the functions below; all of them are thread-safe. Job JSON is kept
 * rendered in memory so GET /v1/jobs/{id} costs no database access. */
#ifndef TD_JOBS_H
#define TD_JOBS_H

#include "base/td_buf.h"
#include "service/run/td_cgroup.h"
#include "service/run/td_checkpoint_files.h"
#include "service/run/td_identity.h"
#include "service/store/td_db.h"
#include "service/run/td_launch.h"
#include "base/td_log.h"
#include "service/submit/td_submit.h"
#include "service/store/td_tokens.h"
#include "service/run/td_runner.h"

#include <jansson.h>
#include <stdbool.h>
#include <stdio.h>

typedef struct td_jobs td_jobs;

typedef struct td_jobs_config {
    td_runner_config runner; /* the node's: slots, GPUs, who jobs run as, cgroups, shepherds */
    /* a stopping daemon leaves its jobs running for the next one to re-attach to (else it
     * stops them, with the grace period, and the next start resumes them from checkpoints) */
    bool keep_jobs_on_stop;
    td_submit_rules rules; /* its data roots are copied */
    td_job_limits limits;  /* resources' defaults and ceilings */
    /* retention: a finished job is removed (rows and directory) this long after it finished,
     * and beyond the newest keep_finished_jobs finished ones (0: no limit of that kind) */
    double keep_finished_for_s;
    long keep_finished_jobs;
    /* Called by the supervisor thread (without the jobs' mutex) on every turn of its loop, at
     * least every turn_every_s (when > 0): the daemon's watchdog ping, so a stuck supervisor
     * stops the pings. */
    void (*on_turn)(void *ctx);
    void *turn_ctx;
    double turn_every_s;
} td_jobs_config;

/* Loads the jobs from db and takes up the ones a previous daemon left running: re-attached to
 * their shepherds when these still run, ended as their status files say when they ended
 * meanwhile, and otherwise restarted from their latest checkpoints, not charged to their restart
 * budget. */
int td_jobs_open(td_jobs **out, const td_jobs_config *cfg, td_db *db, td_log *log, td_err *err);
/* Starts the supervisor thread. SIGCHLD must be blocked in every thread of the process. */
int td_jobs_start(td_jobs *j, td_err *err);
/* A reload's new data roots (resolved directories, copied) and grace period: submissions and
 * stops from now on use them; running jobs keep the paths they were given. */
void td_jobs_set_limits(td_jobs *j, const char *const *roots, int n_roots, double grace_s);
/* A reload's command_jobs policy (td_submit_rules.command_jobs), for submissions from now on. */
void td_jobs_set_command_jobs(td_jobs *j, const char *policy);
/* A reload's keep_jobs_on_stop and orphan_timeout_s (the latter for attempts started from now
 * on). */
void td_jobs_set_stop_policy(td_jobs *j, bool keep_jobs_on_stop, double orphan_timeout_s);
/* A reload's keep_finished_for_s and keep_finished_jobs (td_jobs_config), applied at once. */
void td_jobs_set_retention(td_jobs *j, double keep_for_s, long keep_jobs);
/* Stops the supervisor and ends every waiting stream. Running jobs stay "running" in the
 * database: with keep_jobs_on_stop their processes run on and the next start re-attaches to
 * them; without, they are stopped first (SIGTERM, SIGKILL after the grace period) and the next
 * start resumes them from their checkpoints. Call it before stopping the HTTP server. */
void td_jobs_stop(td_jobs *j);
/* Stops (if not yet) and frees; what still runs is its shepherds' (td_shepherd.h). */
void td_jobs_close(td_jobs *j);

/* 201: the new job's JSON in out, its id in *id. who: the token submitting it, recorded as the
 * job's owner; 429 when it already has limits->queued jobs queued, or its jobs (in any state,
 * until deleted or expired) hold more than limits->job_bytes of specs (0: no limit). */
int td_jobs_submit(td_jobs *j, const char *body, size_t len, const td_principal *who,
                   const td_tokens_limits *limits, td_buf *out, long *id, td_reply_error *e);
/* ---- an experiment's trials (service/exp/ makes them) ----
 * A trial is a job like any other (placement, restarts, checkpoints, logs, metrics), stored with
 * the experiment it belongs to and its number there in the same insert: a daemon that comes back
 * finds exactly the trials that were made. A trial goes with its experiment (td_jobs_delete
 * refuses it alone), and retention leaves it to its experiment. */
typedef struct td_job_trial {
    long experiment;
    int trial;
    long stop_at_step; /* pause after this step (ASHA's first rung); 0: run to the end */
} td_job_trial;
/* td_jobs_submit for a trial: its id in *id (no JSON). */
int td_jobs_submit_trial(td_jobs *j, const char *body, size_t len, const td_principal *who,
                         const td_tokens_limits *limits, const td_job_trial *trial, long *id,
                         td_reply_error *e);
/* Whether body would be taken as a job now (its spec, its files as the job would read them, and
 * whether it fits the nodes), without making one. */
int td_jobs_check(td_jobs *j, const char *body, size_t len, const td_principal *who,
                  const td_tokens_limits *limits, td_reply_error *e);
/* What a trial's experiment follows of it. */
typedef struct td_job_status {
    char state[16]; /* queued, running, restarting, paused, succeeded, failed, cancelled */
    bool final;     /* it ended */
    bool paused;    /* held by nothing: after stop_at_step, or by td_jobs_hold_trial */
    bool at_stop;   /* paused where it was asked to stop (its checkpoint is at stop_at_step) */
    long step;      /* rank 0's latest step (0: none yet) */
    long stop_at_step;
    char reason[512];
} td_job_status;
/* -1 when there is no such job. */
int td_jobs_status(td_jobs *j, long id, td_job_status *out);
/* The trials of experiment `experiment` there are: fn(ctx, job id, trial number) each. */
void td_jobs_trials(td_jobs *j, long experiment, void (*fn)(void *ctx, long id, int trial),
                    void *ctx);
/* Stops the job without waiting for its processes to end (td_jobs_cancel waits); 0 when it was
 * running or queued, 1 when it had already ended. */
int td_jobs_stop_job(td_jobs *j, long id, const char *why);
/* Pauses a trial now (its experiment is paused): one queued or waiting is paused at once, a
 * running one is stopped (as a cancel stops it) and paused, to resume from its latest checkpoint
 * (the steps after it are trained again). 0 when it is paused or being paused, -1 when it has
 * ended or there is no such job. */
int td_jobs_hold_trial(td_jobs *j, long id);
/* A paused trial goes on: queued again, its next attempt resuming from the checkpoint it paused
 * at and stopping after stop_at_step (0: at its end). 0, or -1 when it is not paused. */
int td_jobs_resume_trial(td_jobs *j, long id, long stop_at_step);
/* A paused trial ends where it is: succeeded, with reason (its experiment's searcher stopped it
 * early). 0, or -1 when it is not paused. */
int td_jobs_end_trial(td_jobs *j, long id, const char *reason);
/* PBT's exploit (service/exp/): paused trial `target` takes the checkpoint of paused trial
 * `source` at the step both are paused at, and runs `body` from then on (its trial's body with
 * other hyperparameters: the same kind and resources). The source's files are read as the
 * source's job, written as the target's beside the target's checkpoint, and swapped in whole
 * (a crash leaves the one or the other); the body is stored before the job's spec is rewritten.
 * Across nodes this is a copy on the master, where agents upload every checkpoint; the
 * target's next attempt ships it as any resumed checkpoint. The target stays paused
 * (td_jobs_resume_trial goes on). The jobs' lock is let go during the copy; call it without
 * other locks. 0, or -1 with err (the target then runs on as it was, or with the source's
 * checkpoint and its own values when only its body could not be replaced). */
int td_jobs_exploit_trial(td_jobs *j, long target, long source, const char *body, td_err *err);
/* A job's body as stored (allocated), or NULL when there is no such job. */
char *td_jobs_body(td_jobs *j, long id);
/* Removes every trial of the experiment, as td_jobs_delete removes a job: 409 while one has not
 * ended. */
int td_jobs_delete_trials(td_jobs *j, long experiment, td_reply_error *e);
/* Called (with the jobs' lock held: it must only take note and wake its own thread) when a
 * trial's state changes or it records an event. */
void td_jobs_set_observer(td_jobs *j, void (*fn)(void *ctx, long id), void *ctx);

/* The job's JSON; -1 with 404 when there is no such job. */
int td_jobs_get(td_jobs *j, long id, td_buf *out, td_reply_error *e);
/* GET /v1/jobs/{id}/spec: the job as it was submitted (its env may hold what only its owner
 * should read: for the token that submitted it, and admins). */
int td_jobs_spec(td_jobs *j, long id, const td_principal *who, td_buf *out, td_reply_error *e);
/* states: a bit per td_jobs_state_bit (0: all). */
void td_jobs_list(td_jobs *j, unsigned states, int limit, int offset, td_buf *out);
unsigned td_jobs_state_bit(const char *state);  /* 0: not a state */
void td_jobs_state_list(char *out, size_t len); /* "queued, running, ..." for messages */
/* Stops the job and waits until none of its processes is left; then the job's JSON. who: 403
 * unless it is an admin token or the job's owner. */
int td_jobs_cancel(td_jobs *j, long id, const td_principal *who, td_buf *out, td_reply_error *e);

/* Removes a finished job: its records and its directory (checkpoints it wrote elsewhere, in a
 * checkpoint.dir of its own, stay). 404 for no such job, 409 for one not finished. */
int td_jobs_delete(td_jobs *j, long id, const td_principal *who, td_reply_error *e);

/* For streams: waits until the job has an event after `after`, has ended, the daemon stops, or
 * timeout_s passes. -1 when there is no such job; *last_seq: its newest event; *ended: it is
 * final and *last_seq is its last event (or the daemon is stopping). */
int td_jobs_wait(td_jobs *j, long id, long after, double timeout_s, long *last_seq, bool *ended);
/* Rank r's log file; -1 with 404 for no such job or rank. */
int td_jobs_log_path(td_jobs *j, long id, int rank, char *path, size_t len, td_reply_error *e);
/* What the job has recorded, for the API; each 404s for no such job. Events after `after` (at
 * most limit) go to fn under the database's lock; metrics with step > since as a JSON array;
 * checkpoints (step < 0: all) to fn; a checkpoint's path (404 when the step has none). */
int td_jobs_events(td_jobs *j, long id, long after, int limit, td_db_event_fn fn, void *ctx,
                   td_reply_error *e);
int td_jobs_metrics(td_jobs *j, long id, long since, td_buf *out, td_reply_error *e);
int td_jobs_checkpoints(td_jobs *j, long id, long step, td_db_checkpoint_fn fn, void *ctx,
                        td_reply_error *e);
int td_jobs_checkpoint_path(td_jobs *j, long id, long step, char *path, size_t len,
                            td_reply_error *e);
/* The job's TensorBoard log directory (404 when the job has none: no metric yet). */
int td_jobs_tensorboard_dir(td_jobs *j, long id, char *path, size_t len, td_reply_error *e);
/* Drained: no job starts on this node (queued ones wait, running ones go on); undrained, the
 * queue moves again. */
void td_jobs_set_draining(td_jobs *j, bool draining);

/* The slots this node's running jobs hold now (for the cluster's node listing and heartbeats). */
/* Which process of which running job holds each GPU: {node: {"<CUDA ordinal>": {"job": id,
 * "ranks": [the global ranks that process stands for]}}}, from the jobs' placements. */
json_t *td_jobs_gpu_users(td_jobs *j);
/* The jobs' part of GET /metrics in Prometheus's text format: jobs by state, the queue (length,
 * longest wait), restarts since the daemon started, and for each running job its step, loss,
 * samples/s and the age of its latest metric (now: wall-clock seconds). */
void td_jobs_prometheus(td_jobs *j, double now, td_buf *out);
int td_jobs_slots_used(td_jobs *j);

/* ---- the cluster ----
 * On a master: placement reads cluster's registry, nodes' heartbeats carry their parts' reports
 * and orders (td_cluster_on_jobs is set here). On an agent (cluster NULL) and on the master, the
 * node's own name, for its parts' reasons. */
struct td_cluster;
void td_jobs_set_cluster(td_jobs *j, struct td_cluster *cluster, const char *node_name);
/* An agent's side of the exchange with its master (td_agent.c): the report of the parts this
 * node runs (a JSON array), applying the master's orders (the reply's "parts"), the checkpoint
 * files rank 0 wrote here that still have to be uploaded (then td_jobs_node_parts_uploaded with
 * their manifest), whether a part is known, whether any runs, and stopping them all (cut off
 * from the master). */
json_t *td_jobs_node_parts_report_locked(td_jobs *j);
void td_jobs_node_parts_apply_locked(td_jobs *j, json_t *orders);
bool td_jobs_node_parts_next_upload(td_jobs *j, long *job_id, int *attempt, long *seq, char *path,
                                    size_t len, td_job_files *files);
void td_jobs_node_parts_uploaded(td_jobs *j, long job_id, int attempt, long seq, json_t *files);
bool td_jobs_node_part_known(td_jobs *j, long job_id, int attempt);
/* The files of job id as a master's order gives it (its uid): the job's directory made ready
 * for it here (the job's checkpoints/ and work/), so that a checkpoint can be fetched into it
 * before its part starts. -1 with err for a uid this node does not give jobs. */
int td_jobs_order_files(td_jobs *j, long id, long uid, td_job_files *out, td_err *err);
bool td_jobs_node_parts_running(td_jobs *j);
void td_jobs_node_parts_stop_all(td_jobs *j, const char *why);
/* A file of job id's checkpoints for a node (going up or coming down): rel is checked (under
 * checkpoints/, segments of [A-Za-z0-9._-], none starting with '.'); 400 or 404 in e otherwise.
 * writing: the job's checkpoints/ is made ready for it (the job's own); reading: the latest
 * checkpoint's files are found where they are when that is outside the directory. files: how
 * to reach them (td_jobfs.h). node: the node asking (NULL: no node, a test), which must run a
 * part of the job's current attempt, node rank 0's to write (403 otherwise). */
int td_jobs_file_path(td_jobs *j, long id, const char *rel, bool writing, const char *node,
                      char *path, size_t len, td_job_files *files, td_reply_error *e);

/* Job id's files (td_jobfs.h: its directory, its identity, whose files count): for opening what
 * it wrote. 404 in e for no such job. */
int td_jobs_files_of(td_jobs *j, long id, td_job_files *out, td_reply_error *e);
/* Whether job id exists (404 otherwise). */
int td_jobs_exists(td_jobs *j, long id, td_reply_error *e);

#endif
