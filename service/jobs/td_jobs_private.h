/* Inside the jobs module (td_jobs.h): the table, shared by its files (the job record is
 * td_job.h). The files, lowest first; each calls only the ones listed before it
 * (tests/style/call_graph.py checks):
 *   the table
 *     td_job_tboard.c      a job's TensorBoard event files, from its metric events
 *     td_job_record.c      the table, rendering, state changes and events, waking the supervisor
 *     td_job_uid.c         a job's uid and limits (who a uid runs as is the node's), quota words
 *   rank 0's output
 *     td_job_output.c      rank 0's stdout: events, metrics and checkpoint lines
 *   attempts
 *     td_job_slots.c       the slots an attempt holds, here or as its placement's parts
 *     td_job_attempt.c     what a job runs, its attempts (run here) and the restart policy
 *   scheduling and placement
 *     td_job_resume.c      the cluster's master: the checkpoint an attempt across nodes resumes
 *                          from, and the thread that lists and places it
 *     td_job_place.c       the cluster's master: placing jobs on nodes
 *     td_job_queue.c       which waiting job starts next (this node alone, or the cluster's)
 *   the master's sync with its nodes
 *     td_job_sync.c        each node's orders, what its parts report (exits, rank 0's lines,
 *                          logs), lost nodes
 *   threads and entry points
 *     td_job_supervisor.c  the thread that waits on processes, pipes and deadlines
 *     td_job_quota.c       the thread that keeps jobs within their disk quota
 *     td_job_retention.c   the thread that removes finished jobs past their retention
 *     td_job_recover.c     loading the table at start, taking up jobs a daemon left running
 *     td_job_lifecycle.c   open, start, stop (the jobs too) and close; a reload's settings
 *     td_job_submit.c      submitting a job, with its token's quotas
 *     td_jobs.c            the API side (get, list, cancel, delete, wait, logs, files)
 *     td_job_figures.c     every job in figures: GPU users, slots used, Prometheus series
 *     td_job_agent.c       an agent's calls into the parts its node runs (service/node/), locked
 *     td_job_trials.c      the jobs that are an experiment's trials (service/exp/)
 *     td_job_exploit.c     PBT's exploit: a paused trial takes another's checkpoint and values
 * Every function here runs with j->mu held unless it says otherwise. */
#ifndef TD_JOBS_PRIVATE_H
#define TD_JOBS_PRIVATE_H

#include "base/td_clock.h"
#include "service/jobs/td_job.h"
#include "service/jobs/td_jobs.h"
#include "service/node/td_node.h"
#include "service/sched/td_scheduler.h"
#include "service/run/td_runner.h"
#include "service/run/td_launch.h"
#include "service/run/td_shepherd.h"

#include <jansson.h>
#include <limits.h>
#include <pthread.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdbool.h>

struct td_jobs {
    td_jobs_config cfg;
    td_db *db;
    td_log *log;
    /* the data roots cfg.rules points to, and the ones a reload replaced: a submission reads
     * its copy of the rules outside the mutex, so a replaced list lives until td_jobs_close */
    char **roots;
    char ***retired_roots;
    int n_retired_roots;
    char command_jobs[8192]; /* td_submit_rules.command_jobs, as a reload last set it */
    /* retention (td_job_retention.c): the janitor thread, woken by a finish or a reload */
    pthread_t janitor;
    bool janitor_started, janitor_poke, janitor_failing;
    pthread_cond_t janitor_wake;
    long long expired_total; /* finished jobs it removed since this daemon started */
    pthread_mutex_t mu;
    /* threads waiting for mu (td_jobs_lock): the supervisor, between two turns of reading a busy
     * job, lets them have it first (a mutex is not fair: a thread that lets it go and takes it
     * again at once keeps it from the ones waiting, for seconds) */
    atomic_int waiting;
    pthread_cond_t changed; /* any event, state change or stop */
    /* the streams wait here, job id modulo TD_JOBS_STREAM_CVS, so that an event wakes the
     * followers of its own job (and of few others), not every stream of every job */
    pthread_cond_t stream_cv[TD_JOBS_STREAM_CVS];
    job **jobs; /* by id, ascending */
    int n_jobs, cap_jobs;
    /* the jobs not finished (queued, running, restarting) and finished ones with something left
     * to do, by id: what the supervisor, the queue and placement walk on every turn, so that a
     * turn costs the live jobs and not the (up to 100,000) finished ones kept; finished ones go
     * at the supervisor's next turn (td_jobs_live_compact) */
    job **live;
    int n_live, cap_live;
    td_runner runner; /* this node's slots, GPUs, ended attempts' cgroups; what starts attempts */
    long long restarts_total; /* attempts restarted since this daemon started (GET /metrics) */
    int wake_fd, sig_fd;
    pthread_t thread;
    bool started, stopping;
    /* td_jobs_stop asked every shepherd to stop: their ends are left for the next start */
    bool stopping_jobs;
    pthread_t quota; /* td_jobs_quota_keeper */
    bool quota_started;
    pthread_cond_t quota_wake; /* stop (monotonic clock) */
    pthread_t resumer;         /* td_jobs_resumer */
    bool resumer_started;
    pthread_cond_t resume_wake; /* a job wants its checkpoint prepared, or stop */
    bool draining; /* this node is drained: nothing new starts (td_jobs_set_draining) */
    /* told of every change of a trial (td_jobs_set_observer): the experiments' */
    void (*observer)(void *ctx, long id);
    void *observer_ctx;
    /* the cluster */
    struct td_cluster *cluster; /* on the master: the registry placement reads; else NULL */
    /* the parts this node runs for its master (service/node/), its name, under this lock */
    td_node_parts node;
};

/* Takes the jobs' lock as any thread but the supervisor does (counted in j->waiting). */
static inline void td_jobs_lock(td_jobs *j) {
    atomic_fetch_add(&j->waiting, 1);
    pthread_mutex_lock(&j->mu);
    atomic_fetch_sub(&j->waiting, 1);
}

/* ======== the table ======== */

/* ---- td_job_record.c ---- */
json_t *td_jobs_code_json(int code);
json_t *td_jobs_reason_json(const char *r);
const char *td_jobs_render(job *jb); /* the job object as JSON, cached until stale */
void td_jobs_stale(job *jb);
/* What a queued job waits for, in words: its reason while queued (the scheduler says it). */
void td_jobs_waits(job *jb, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
job *td_jobs_find(td_jobs *j, long id);
void td_jobs_add(td_jobs *j, job *jb); /* and to the live list, unless it is finished */
void td_jobs_live_compact(td_jobs *j);
void td_jobs_live_remove(td_jobs *j, const job *jb); /* a job that goes (deleted) */
/* Events after `after` (at most limit) from the ring, to fn: how many; -1 when the ring does
 * not reach back to after + 1 (read the database). */
int td_jobs_recent_events(const job *jb, long after, int limit, td_db_event_fn fn, void *ctx);
/* Wakes the streams of job id: a stored event, its end, its removal. */
void td_jobs_wake_streams(td_jobs *j, long id);
job *td_jobs_new_job(td_jobs *j, const td_db_job *row);
void td_jobs_free_job(job *jb);
td_db_attempt *td_jobs_new_attempt(job *jb);
void td_jobs_set_state(job *jb, int state);
bool td_jobs_final_state(int s);
/* Appends an event (and the job row) to the database, then wakes the streams. raw: the event's
 * text as the worker wrote it (kept byte for byte), or NULL to encode data. */
/* Stores jb's pending events, oldest first; false when the database still refuses them. */
bool td_jobs_store_pending(td_jobs *j, job *jb);
void td_jobs_emit(td_jobs *j, job *jb, const char *type, json_t *data, const char *raw, long step,
                  bool metric, const char *checkpoint_path, long long checkpoint_size);
void td_jobs_emit_state(td_jobs *j, job *jb);
void td_jobs_save_attempt(td_jobs *j, job *jb, const td_db_attempt *a);
void td_jobs_finish(td_jobs *j, job *jb, int state, int code, const char *reason);
void td_jobs_resume_forget(job *jb); /* a new checkpoint: what was known of the last goes */
/* The placement in a job's JSON: each node, its node rank, global ranks and devices. */
json_t *td_jobs_placement_json(const job *jb);
/* One node of a placement: its ranks, all its GPUs ("devices"), and each process the node
 * starts with the ranks it stands for and its CUDA_VISIBLE_DEVICES (proc_devices: theirs
 * separated by ';'; "" where the node has no GPUs). */
json_t *td_jobs_placement_node(const job *jb, const char *node, const char *address, int node_rank,
                               const char *devices, const char *proc_devices);
/* Takes the job at index `at` out of the table and frees it (its rows already deleted): its
 * directory is moved to jobs/.deleted-ID, to be removed without the lock (true), or was not
 * there. The caller wakes its streams. */
bool td_jobs_forget_locked(td_jobs *j, int at);
double td_jobs_deadline(const job *jb); /* the time limit's end, or 0 */
void td_jobs_wake(td_jobs *j);          /* the supervisor; any thread, without the lock */
/* The slots (GPUs on a GPU node) a job holds on each of its nodes: every rank's GPUs, whether
 * the daemon starts the ranks or one launching process does. */
static inline int td_jobs_slots(const job *jb) {
    return jb->row.nproc * (jb->gpus_per_proc > 0 ? jb->gpus_per_proc : 1);
}
/* The processes the daemon starts on each node: the ranks, or one that starts them. */
static inline int td_jobs_procs(const job *jb) {
    return jb->launch_self ? 1 : jb->row.nproc;
}

/* ---- td_job_tboard.c ---- */
/* A metric event's numbers into the job's TensorBoard event file; closing it (durably) when the
 * job ends or goes. */
void td_jobs_tboard_event(td_jobs *j, job *jb, json_t *event, long step);
void td_jobs_tboard_close(td_jobs *j, job *jb);

/* ---- td_job_uid.c ---- */
#define TD_JOBS_QUOTA_MAX_ENTRIES 1000000L /* files a job's directory may hold, counted at most */
td_identity td_jobs_identity(const td_jobs *j, const job *jb); /* who jb runs as */
/* A uid of its own into *uid when jobs get one and it has none yet (-1: none is free). */
int td_jobs_allocate_uid(td_jobs *j, long *uid, td_err *err);
/* jb's limits: what it asked for (0: not given), else the daemon's defaults d. */
void td_jobs_limit_job(job *jb, const td_job_limits *d, double memory_gb, long pids, int cpu_weight,
                       double disk_gb);
/* "disk quota exceeded: ..." for used bytes over max (entries past the count it looks at). */
void td_jobs_quota_words(long long used, long long max, long entries, char *out, size_t len);

/* ======== rank 0's output ======== */

/* ---- td_job_output.c ---- */
/* Reads rank 0's output file on to what its shepherd said it holds; final: the attempt is over,
 * so up to `until` (the status file's output_bytes; < 0: the file's size) and its last partial
 * line too. Each event is stored with the offset after its line (row.out_offset). At most a
 * slice a call: true when more is left (read on at once; a final read is final only once it
 * returns false). */
bool td_jobs_read_output(td_jobs *j, job *jb, bool final, long long until);
/* Whether events of this type are the daemon's own (state, restart, placement, dropped): a job
 * printing one has it in its log, never in its events, where clients would believe it. */
bool td_jobs_event_is_daemons(const char *type);
/* A "dropped" event for the metric lines max_events_per_s refused since the last one. */
void td_jobs_say_dropped(td_jobs *j, job *jb);
void td_jobs_set_checkpoint(job *jb, long step, const char *path);
/* Lines of rank 0 read from its stdout: on_line's output handling, shared by both kinds */
/* true when the line became an event (stored with the job row) */
bool td_jobs_line_apply(td_jobs *j, job *jb, char *line, size_t n, bool remote, json_t *files);

/* ======== attempts ======== */

/* ---- td_job_slots.c ---- */
/* Take the slots before an attempt starts (false: not free now); give them back (its
 * placement's too) once it has ended. */
bool td_jobs_reserve_slots(td_jobs *j, job *jb);
void td_jobs_release_slots(td_jobs *j, job *jb);
void td_jobs_parts_release(td_jobs *j, job *jb);

/* ---- td_job_attempt.c ---- */
void td_jobs_set_worker_run(td_jobs *j, job *jb, const char *spec_path);
int td_jobs_prepare_run(td_jobs *j, job *jb, td_submission *s, td_err *err);
void td_jobs_start_attempt(td_jobs *j, job *jb); /* on slots already reserved */
void td_jobs_attempt_over(td_jobs *j, job *jb);  /* every process of it has ended */
/* Paused (its slots already given back): at its stop_at_step, or held by its experiment's
 * pause (hold_requested). It holds nothing until td_jobs_resume_trial or td_jobs_end_trial. */
void td_jobs_pause_job(td_jobs *j, job *jb);
/* The connection to a local attempt's shepherd ended (or none could be made at start): reads
 * the rest of rank 0's output, and ends the attempt as its status file says; without one the
 * shepherd died and what is left of its process group is killed. A shepherd that dropped a
 * slow daemon is connected to again instead. */
void td_jobs_shepherd_gone(td_jobs *j, job *jb);
void td_jobs_resume_note(const job *jb, char *out, size_t len);
json_t *td_jobs_resume_json(const job *jb);
/* The job's attempt ended because no daemon ran (why: in words): it restarts from its latest
 * checkpoint, not charged to its restart budget. Its slots are free. */
void td_jobs_recover(td_jobs *j, job *jb, const char *why);

/* ======== scheduling and placement ======== */

/* ---- td_job_resume.c ---- */
enum { TD_RESUME_READY, TD_RESUME_WAIT, TD_RESUME_FAILED };
/* Whether an attempt across nodes can start: its checkpoint listed and placed (else asked for,
 * WAIT), or FAILED with the job failed when it cannot be read, or cannot be placed where the
 * master's own ranks look for it and on_master (some of them run on the master's node). */
int td_jobs_resume_ready(td_jobs *j, job *jb, bool on_master);
/* The thread that lists and places the checkpoints asked for, with the lock released while it
 * reads and copies files, so that neither the supervisor nor the API waits for it; it wakes the
 * supervisor when one is ready. */
void *td_jobs_resumer(void *arg);
/* Where the job's ranks look for checkpoints, relative to the job's directory ("checkpoints")
 * or absolute (a train job's own checkpoint.dir). */
void td_jobs_resume_dir(const job *jb, char *out, size_t len);
/* {"step", "files", "dir", "base"} for the orders of an attempt's parts, or NULL. */
json_t *td_jobs_resume_order(const job *jb);
/* The file open at src into the job's tree (rel below root) as the job (who): with may_link a
 * hard link where both lie on one filesystem and the file is the job's user's (no bytes move;
 * through /proc/self/fd, which needs no privilege), else a clone of its blocks or a copy of its
 * `size` bytes (-1: to its end), synced before it takes the name. */
int td_jobs_copy_in(const td_identity *who, int src, int root, const char *rel, bool may_link,
                    long long size, td_err *err);

/* ---- td_job_place.c ---- */
/* A waiting job as the scheduler sees it (its nodes, slots, limit, pin); restart: it was
 * running. Points into jb (its pin). */
td_sched_job td_jobs_sched_job(const job *jb);
bool td_jobs_clustered(td_jobs *j);        /* a master with agents, or a job placed on them */
void td_jobs_schedule_cluster(td_jobs *j); /* td_jobs_schedule's policy over every node */
int td_jobs_check_fit(td_jobs *j, const td_submission *s, td_reply_error *e);

/* ---- td_job_queue.c ---- */
void td_jobs_schedule(td_jobs *j); /* this node alone: a cluster of one */

/* ======== the master's sync with its nodes ======== */

/* ---- td_job_sync.c ---- */
void td_jobs_parts_tick(td_jobs *j); /* the master's own node's sync, time limits */
/* The node rank of jb's running attempt on node, -1 when it runs no part there (now). */
int td_jobs_part_rank_on(job *jb, const char *node);
void td_jobs_node_sync_locked(td_jobs *j, const char *node, bool registered, json_t *report,
                              json_t *reply);

/* ======== threads and entry points ======== */

/* ---- td_job_supervisor.c ---- */
void *td_jobs_supervise(void *arg); /* the thread */

/* ---- td_job_quota.c ---- */
void *td_jobs_quota_keeper(void *arg); /* the thread */

/* ---- td_job_retention.c ---- */
void *td_jobs_janitor(void *arg); /* the thread */
/* Removes a directory tree (without the lock); false, with a log line, when some is left. */
bool td_jobs_remove_tree(td_jobs *j, long id, const char *path);

/* ---- td_job_recover.c ---- */
int td_jobs_load(td_jobs *j, td_err *err);

#endif
