/* Experiments: a hyperparameter search over the cluster. An experiment is a base job (a train
 * spec or a command job, with its resources), a search space over JSON paths of it, and a
 * searcher that says which trials to run: "grid" (every point of the grids and choices),
 * "random" (max_trials points drawn from the space with the experiment's seed), "asha" (those
 * draws, paused at rungs, only the best resumed) or "pbt" (a population trained in generations,
 * the worst taking the best's checkpoints and perturbed values). Each trial is a
 * job (service/jobs/: its own id, placement, restarts, checkpoints, logs and metrics) whose body
 * is the base job with the trial's hyperparameters set at their paths; a command job's trials
 * also get them as JSON in TRAIND_HPARAMS and in the file TRAIND_HPARAMS_FILE names. The
 * searcher's metric is read from each trial's metric lines (the last value of that name in any
 * metric event); the best trial is the one whose best value is best (mode "min" or "max").
 *
 * At most max_concurrent trials are unfinished at a time, so an experiment never holds more
 * than that many trials' slots; trials take the experiment's priority and queue with every
 * other job. A trial and its number are stored with the job in one insert, and a trial's
 * hyperparameters follow from the experiment's body and that number alone, so a daemon that
 * comes back (after kill -9 too) makes exactly the trials that were not made: none is lost or
 * run twice.
 *
 * The API side calls the functions below (thread-safe); a thread of its own makes trials and
 * follows them, woken by the jobs module when a trial changes. Above the jobs module: it knows
 * jobs only through td_jobs.h. */
#ifndef TD_EXPERIMENTS_H
#define TD_EXPERIMENTS_H

#include "base/td_buf.h"
#include "base/td_error.h"
#include "base/td_log.h"
#include "service/jobs/td_jobs.h"
#include "service/store/td_db.h"
#include "service/store/td_tokens.h"
#include "service/submit/td_submit.h"

typedef struct td_experiments td_experiments;

enum { TD_EXPERIMENTS_PER_TOKEN = 64 }; /* running experiments of one token, at most */

/* Loads the experiments from db and their trials from jobs. tokens: who may still make trials
 * (an experiment whose token is revoked is cancelled) and their limits, read at each trial. */
int td_experiments_open(td_experiments **out, td_jobs *jobs, td_db *db, td_tokens *tokens,
                        td_log *log, td_err *err);
/* Starts the thread that makes and follows trials. */
int td_experiments_start(td_experiments *x, td_err *err);
/* Stops the thread (before td_jobs_stop: it submits jobs). Running trials go on as jobs do. */
void td_experiments_stop(td_experiments *x);
void td_experiments_close(td_experiments *x); /* after td_experiments_stop (NULL: nothing) */

/* POST /v1/experiments: 201 with the experiment's JSON in out and its id in *id; a 400 names the
 * JSON path at fault (the base job's own errors under "job."), a 429 when who already runs
 * TD_EXPERIMENTS_PER_TOKEN experiments. who owns it and its trials, which count in its limits
 * (queued jobs, bytes of specs) as its jobs do. */
int td_experiments_create(td_experiments *x, const char *body, size_t len, const td_principal *who,
                          const td_tokens_limits *limits, td_buf *out, long *id, td_reply_error *e);
void td_experiments_list(td_experiments *x, td_buf *out);
/* The experiment with its trials (hyperparameters, state, steps, latest and best metric) and
 * the best trial; 404 for no such experiment. */
int td_experiments_get(td_experiments *x, long id, td_buf *out, td_reply_error *e);
/* Stops making trials and stops the unfinished ones; the experiment is cancelled once they have
 * ended. 403 unless who owns it or is an admin; 409 when it has ended. */
int td_experiments_cancel(td_experiments *x, long id, const td_principal *who, td_buf *out,
                          td_reply_error *e);
/* Pauses a running experiment (pause true): no trial is made or promoted, and its unfinished
 * trials are paused (td_jobs_hold_trial: a running one resumes from its latest checkpoint); or
 * resumes it: its trials paused so go on, then the searcher. Stored (a daemon that restarts
 * keeps it); asking for what already is, is a 200. 403 as for a cancel; 409 when it has ended
 * or is being cancelled. */
int td_experiments_pause(td_experiments *x, long id, bool pause, const td_principal *who,
                         td_buf *out, td_reply_error *e);
/* Removes an ended experiment and its trials (their jobs). 409 while it runs. */
int td_experiments_delete(td_experiments *x, long id, const td_principal *who, td_reply_error *e);
/* GET /v1/experiments/ID/events: its events after `after` (at most limit) to fn, called under
 * the table's lock (copy what is kept; call nothing of this module). 404 for no experiment. */
int td_experiments_events(td_experiments *x, long id, long after, int limit, td_db_event_fn fn,
                          void *ctx, td_reply_error *e);
/* Waits until experiment id has an event after `after`, has ended, goes, the daemon stops, or
 * timeout_s passes. -1 when there is no such experiment; *last: its newest event's id; *ended:
 * it has ended and *last is its last event (or the daemon is stopping). */
int td_experiments_wait(td_experiments *x, long id, long after, double timeout_s, long *last,
                        bool *ended);
/* Experiments by state, in Prometheus's text format. */
void td_experiments_prometheus(td_experiments *x, td_buf *out);

#endif
