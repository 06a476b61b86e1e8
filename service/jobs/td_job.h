/* A job as the jobs module keeps it (td_jobs_private.h has the table): the record the database
 * holds and what the daemon knows besides, its states, its events not yet stored, and the parts
 * of its running attempt when the master placed it across nodes. */
#ifndef TD_JOB_H
#define TD_JOB_H

#include "service/jobs/td_jobs.h"
#include "service/run/td_runner.h"
#include "service/run/td_shepherd.h"

#include <jansson.h>
#include <stdbool.h>

/* PAUSED: its attempt stopped after row.stop_at_step with a checkpoint there, its slots freed;
 * resumed from that checkpoint (td_jobs_resume_trial) or ended where it is (td_jobs_end_trial) */
enum { QUEUED, RUNNING, RESTARTING, PAUSED, SUCCEEDED, FAILED, CANCELLED, N_STATES };
enum { TD_JOBS_RECENT = 256, TD_JOBS_STREAM_CVS = 64 };

/* The daemon's own events in a job's stream (a worker's are train/td_metrics.h's TD_EVENT_*). */
#define TD_JOBS_EVENT_STATE     "state"
#define TD_JOBS_EVENT_RESTART   "restart"
#define TD_JOBS_EVENT_PLACEMENT "placement" /* where an attempt across nodes runs */
#define TD_JOBS_EVENT_DROPPED   "dropped"   /* metric lines over max_events_per_s, counted */
#define TD_JOBS_EVENT_EXPLOIT   "exploit"   /* PBT: another trial's checkpoint and values taken */
extern const char *const td_jobs_state_names[N_STATES];

/* An event the database could not take yet (a full disk): kept, in order, and stored again. */
typedef struct pending_event {
    long seq, step;
    char *type, *text, *checkpoint_path;
    bool metric;
    long long checkpoint_size, out_offset; /* out_offset: the row's when the event was made */
} pending_event;

typedef struct job {
    td_db_job row; /* what the database holds; row.state mirrors state */
    /* events made but not yet stored (oldest first), and the newest stored one: streams read
     * the database, so they are told of stored events only, and none is lost or skipped */
    pending_event *pending;
    int n_pending, cap_pending;
    long stored_seq;
    bool store_failing; /* said in the log once per outage */
    bool batching;      /* its reader stores what it emits once its burst is read */
    /* max_events_per_s: a token bucket of its metric lines, and one of its checkpoint lines
     * (each of which costs a walk of the checkpoint: charged one per line and one per hundred
     * files walked); what they refuse is counted, and said in a "dropped" event before the next
     * line taken (or at the attempt's end) */
    td_rate_bucket metric_rate, checkpoint_rate;
    int capped_taken;         /* output_capped lines taken past the buckets: one an attempt */
    long long events_dropped; /* in all */
    long dropped_unsaid;      /* since the last "dropped" event */
    bool out_behind;          /* its output has more than one turn reads: read on at once */
    /* the newest stored events, a ring of TD_JOBS_RECENT (oldest at recent_head), while the job
     * is live: a stream that keeps up reads them here, not from the database (a thousand
     * followers of running jobs would otherwise query it for every event each) */
    struct recent_event {
        long seq;
        char *type, *data;
    } * recent;
    int recent_head, n_recent;
    int state;
    td_db_attempt *attempts;
    int n_attempts, cap_attempts;
    json_t *latest_train, *latest_eval, *latest_done;
    int n_checkpoints;
    long last_step;        /* of rank 0's latest event with a step; given to events without one */
    double last_metric_at; /* wall clock of rank 0's latest metric in this daemon's life; 0: none */
    long checkpoint_step;  /* the latest registered checkpoint's step, -1: none */
    char *checkpoint_path; /* and where it is (NULL: none) */
    struct td_tboard *tboard; /* its TensorBoard event file, open from its first metric on */
    bool tboard_failed;       /* it could not be opened: said once, not tried again */
    bool tboard_warned;       /* a write failed and was logged; cleared by the next success */
    char *dir;                /* STATE_DIR/jobs/ID (allocated: most jobs are finished ones, and a
                                 job record's size is the daemon's memory per job kept) */
    char **argv, **env;       /* what an attempt runs */
    char waiting[320];        /* while queued: what it waits for, in words (its reason) */
    char *cwd;                /* a command's "cwd" (td_submission), or NULL: its work directory */
    json_t *metrics;          /* a command's metrics (patterns, tensorboard_dir), for rank 0's
                                 shepherd; NULL for a train job */
    char local_rank_arg[16];  /* a command's --local_rank option (td_launch_config); "": none */
    int gpus_per_proc;        /* resources.gpus_per_proc: the slots (GPUs) of each process */
    bool launch_self;         /* "launch": "self": one process per node starts the rest */
    bool see_all_gpus;        /* resources.visible_gpus "job": each process sees the node's share */
    char *json;               /* rendered job object; NULL when stale */

    bool cancel_requested;
    bool hold_requested; /* its experiment is paused: stopped, then paused (td_jobs_hold_trial) */
    bool timed_out;      /* stopped at resources.time_limit_s */
    bool active;         /* a group is running; holds td_jobs_slots slots */
    int *devices;   /* GPU slots while active: td_jobs_slots of them, gpus_per_proc a process */
    td_shepherd sh; /* the running attempt's shepherd, when it runs here (not placed) */
    td_shepherd_end end; /* how the attempt ended, for td_jobs_attempt_over */
    bool left;           /* its shepherd stopped it because this daemon stops: the next start
                            goes on with the job (keep_jobs_on_stop false) */
    int out_fd;          /* rank 0's output file (the shepherd's BASE.out); -1: not open */
    long long out_read;  /* its bytes read so far: row.out_offset plus what line holds */
    td_buf line;
    long long *log_start; /* each log's size when the attempt began: [processes] run
                             here, [world] by global rank across nodes */

    /* placement on the cluster (td_job_place.c) */
    int nnodes;         /* resources.nnodes */
    char **pin;         /* resources.nodes, or NULL */
    struct part *parts; /* the running attempt's nodes, or NULL (not placed, or run locally) */
    int n_parts;
    int master_port;          /* reserved on parts[0]'s node */
    bool parts_stopping;      /* every part told to stop */
    int parts_code;           /* the first failure's status; 0: none */
    char parts_reason[640];   /* its words, naming node and rank */
    long lines_in;            /* rank 0's lines of this attempt applied so far */
    json_t *last_placement;   /* the placement of its latest attempt, for the job's JSON */
    json_t *checkpoint_files; /* the latest checkpoint's files [{path, size, sha256}]; NULL: not
                           yet listed */
    bool checkpoint_placed;   /* and it is where the ranks look on the master's node */
    long checkpoint_gen;      /* counts registered checkpoints: which one the above are about */
    bool resume_busy;         /* the resumer works on its files now (a delete waits) */
    bool resume_wanted;       /* an attempt waits for that (td_jobs_resume_prepare) */
    char *resume_error;       /* why it cannot be read; NULL: none */
    char *place_error;        /* why the master's node cannot have it where its ranks look */
    json_t *resume_order;     /* what the running attempt's parts resume from; NULL: nothing */
    char *checkpoint_dir;     /* td_jobs_resume_dir, for the running attempt's parts; NULL */

    /* limits (resources.*, or the daemon's defaults) */
    td_cgroup_limits cg_limits; /* memory, pids, cpu weight of its attempts' cgroups */
    long long disk_bytes;       /* its files' limit (resources.disk_gb); 0: none */
    char *cgroup;               /* the running local attempt's cgroup (td_cgroup.h); NULL */
    long long disk_used;        /* its directory's size, as last measured (td_job_quota.c) */
    long long spec_bytes;       /* its spec's, as submitted (max_job_bytes_per_token) */
    bool over_quota;            /* over disk_bytes: stopped, and failed with quota_reason */
    char quota_reason[400];
} job;

/* One node's share of a distributed attempt, as the master tracks it. */
enum { PART_STARTING, PART_RUNNING, PART_ENDED };
typedef struct part {
    char node[64], address[64];
    int node_rank, state;
    bool local;         /* on the master's own node */
    int exit_code;      /* once ended */
    char reason[512];   /* a failure's words, once ended */
    double failed_at;   /* when its first failure happened (wall clock, as its node says); 0 */
    char devices[256];  /* the node's GPUs for the job, as the node reported them */
    char *proc_devices; /* each process's CUDA_VISIBLE_DEVICES, separated by ';'; NULL: none */
} part;

#endif
