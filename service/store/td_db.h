/* The daemon's durable state: one SQLite database (WAL) in the state directory holding jobs,
 * their attempts, their event log (what SSE replays), metrics, checkpoints and drained nodes. Every
 * change is committed before the caller announces it, so what a client has seen survives a crash.
 *
 * One connection, serialised by a mutex: the daemon's writes are small and few (a metric line
 * every log interval), and reads of hot data come from memory (td_jobs), not from here. */
#ifndef TD_DB_H
#define TD_DB_H

#include "base/td_error.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct td_db td_db;

/* The columns of a job row (strings owned by the row). */
typedef struct td_db_job {
    long id;
    char name[128];
    char kind[16]; /* "train" or "command" */
    char *spec;    /* the body as submitted */
    int nproc, max_restarts, restarts;
    char state[16];
    double created_at, started_at, finished_at; /* unix seconds; 0: not yet */
    int exit_code;                              /* -1: none */
    char reason[1024];
    long pgid;           /* the running attempt's process group, 0: none */
    long last_seq;       /* the newest event's id */
    int priority;        /* higher runs first */
    double time_limit_s; /* wall time from the first start; 0: none */
    /* the bytes of the running attempt's rank 0 output file the daemon has handled: saved with
     * each event of a line, so a daemon that comes back reads on from the line after */
    long long out_offset;
    long owner;          /* the id of the API token that submitted it (td_tokens); 0: unknown */
    char owner_name[64]; /* that token's name, kept when the token is revoked */
    long uid;            /* the uid (and gid) it runs as (run_as "dynamic"); 0: none given */
    long experiment;     /* the experiment it is a trial of (service/exp/); 0: none */
    int trial;           /* and which trial, from 0; -1: none */
    /* the step its attempts stop after, checkpointed, to be resumed (its experiment's ASHA
     * rung: TRAIND_STOP_AT_STEP); 0: none, it runs to its end */
    long stop_at_step;
} td_db_job;

typedef struct td_db_attempt {
    int attempt;
    double started_at, finished_at;
    int exit_code; /* -1: none */
    char reason[1024];
} td_db_attempt;

int td_db_open(td_db **out, const char *path, td_err *err);
/* Whether the last failed write failed for want of disk space (SQLITE_FULL). */
bool td_db_full(td_db *db);
void td_db_close(td_db *db);

/* Inserts the job (id assigned and stored in job->id). */
int td_db_insert_job(td_db *db, td_db_job *job, td_err *err);
/* Writes every column but spec. */
int td_db_update_job(td_db *db, const td_db_job *job, td_err *err);
/* Replaces a job's body (PBT gives a trial new hyperparameters between its attempts). */
int td_db_update_job_spec(td_db *db, long id, const char *spec, td_err *err);
int td_db_save_attempt(td_db *db, long job_id, const td_db_attempt *a, td_err *err);

/* Appends event seq of a job, and in the same transaction: a metric (when step >= 0 and the
 * event is a metric), a checkpoint (checkpoint_path non-NULL), and the job row (job non-NULL). */
typedef struct td_db_event {
    long job_id, seq;
    const char *type, *data;
    long step;                   /* -1: none */
    bool metric;                 /* also a row of /metrics */
    const char *checkpoint_path; /* also a checkpoint row */
    long long checkpoint_size;
} td_db_event;
int td_db_add_event(td_db *db, const td_db_event *ev, const td_db_job *job, td_err *err);
/* evs[0..n) and the job row, in one transaction: a burst of a job's lines costs one commit. */
int td_db_add_events(td_db *db, const td_db_event *evs, int n, const td_db_job *job, td_err *err);

/* Removes the jobs ids[0..n) and everything recorded of them, in one transaction. */
int td_db_delete_jobs(td_db *db, const long *ids, int n, td_err *err);

/* Calls back for each job, oldest first, with its attempts; the callback owns job->spec (free
 * it, or keep it). */
typedef void (*td_db_job_fn)(void *ctx, const td_db_job *job, const td_db_attempt *attempts,
                             int n_attempts);
int td_db_load_jobs(td_db *db, td_db_job_fn fn, void *ctx, td_err *err);

/* Events with seq > after, at most limit, in order, each given to fn (called under the
 * database's lock: copy what is kept, call nothing that takes it again). */
typedef void (*td_db_event_fn)(void *ctx, long seq, const char *type, const char *data);
int td_db_events(td_db *db, long job_id, long after, int limit, td_db_event_fn fn, void *ctx,
                 td_err *err);
/* The metric events with step > since, by step and then as they happened (fn as above). */
typedef void (*td_db_metric_fn)(void *ctx, const char *data);
int td_db_metrics(td_db *db, long job_id, long since, td_db_metric_fn fn, void *ctx, td_err *err);
/* The job's checkpoints (step < 0), or the one of a step, in step order. */
typedef struct td_db_checkpoint {
    long step;
    char path[4096]; /* a directory, or a command's single file */
    long long size;  /* every file's bytes when it was registered */
    double created_at;
} td_db_checkpoint;
typedef void (*td_db_checkpoint_fn)(void *ctx, const td_db_checkpoint *c);
int td_db_checkpoints(td_db *db, long job_id, long step, td_db_checkpoint_fn fn, void *ctx,
                      td_err *err);
/* Nodes drained by the API (the cluster's master keeps them across restarts). */
int td_db_set_drained(td_db *db, const char *name, bool drained, td_err *err);
typedef void (*td_db_name_fn)(void *ctx, const char *name);
int td_db_drained_nodes(td_db *db, td_db_name_fn fn, void *ctx, td_err *err);

/* API tokens (service/store/td_tokens.h): each one's hash, never the token itself. */
typedef struct td_db_token {
    long id;
    char name[64];
    char scope[16];
    char hash[65];                 /* SHA-256, lowercase hex */
    double created_at, revoked_at; /* revoked_at 0: live */
    long created_by;               /* the token that created it; 0: traind itself */
} td_db_token;
/* Stores t (id assigned into t->id). */
int td_db_insert_token(td_db *db, td_db_token *t, td_err *err);
/* Marks token id revoked at `at`; 1 when it was live, 0 when unknown or already revoked. */
int td_db_revoke_token(td_db *db, long id, double at, td_err *err);
typedef void (*td_db_token_fn)(void *ctx, const td_db_token *t);
int td_db_load_tokens(td_db *db, td_db_token_fn fn, void *ctx, td_err *err);

/* Experiments (service/exp/td_experiments.h): a row each; their trials are jobs. */
typedef struct td_db_experiment {
    long id;
    char name[128];
    char *spec; /* the body as submitted (owned by the row) */
    char state[16];
    double created_at, finished_at; /* finished_at 0: not yet */
    char reason[1024];
    long owner;
    char owner_name[64];
} td_db_experiment;
/* Inserts e (id assigned into e->id). */
int td_db_insert_experiment(td_db *db, td_db_experiment *e, td_err *err);
/* Writes its state, finished_at and reason. */
int td_db_update_experiment(td_db *db, const td_db_experiment *e, td_err *err);
int td_db_delete_experiment(td_db *db, long id, td_err *err);
/* Each experiment, oldest first; the callback owns e->spec. */
typedef void (*td_db_experiment_fn)(void *ctx, td_db_experiment *e);
int td_db_load_experiments(td_db *db, td_db_experiment_fn fn, void *ctx, td_err *err);
/* One checkpoint's path. */
/* 1 when found (path filled), 0 when not. */
int td_db_checkpoint_path(td_db *db, long job_id, long step, char *path, size_t len, td_err *err);

#endif
