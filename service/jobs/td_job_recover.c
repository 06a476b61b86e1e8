/* Opening: the jobs of the database are loaded, their metrics and checkpoints read back from the
 * event log, and the ones a previous daemon left running taken up: re-attached to their
 * shepherds, ended as their shepherds' status files say, or (without a shepherd) restarted from
 * their latest checkpoints, not charged to their restart budget. */
#include "service/jobs/td_jobs_private.h"

#include "train/td_metrics.h"

#include "base/td_strv.h"

#include <dirent.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct load_ctx {
    td_jobs *j;
} load_ctx;

static void load_one(void *ctx, const td_db_job *row, const td_db_attempt *attempts, int n) {
    td_jobs *j = ((load_ctx *)ctx)->j;
    job *jb = td_jobs_new_job(j, row);
    jb->spec_bytes = row->spec ? (long long)strlen(row->spec) : 0;
    td_submission_placement(row->spec ? row->spec : "{}", &jb->nnodes, &jb->pin, &jb->gpus_per_proc,
                            &jb->launch_self, &jb->see_all_gpus);
    double memory_gb, disk_gb;
    long pids;
    int cpu_weight;
    td_submission_limits(row->spec ? row->spec : "{}", &memory_gb, &pids, &cpu_weight, &disk_gb);
    td_jobs_limit_job(jb, &j->cfg.limits, memory_gb, pids, cpu_weight, disk_gb);
    for (int i = 0; i < n; i++) *td_jobs_new_attempt(jb) = attempts[i];
    td_jobs_add(j, jb);
}

/* One event of the log, as it was when the daemon stopped: what the job's JSON shows of it. */
static void replay_event(void *ctx, long seq, const char *type, const char *data) {
    (void)seq;
    job *jb = ctx;
    json_t *o = json_loads(data, 0, NULL);
    json_t *step = json_object_get(o, "step");
    bool ours = !strcmp(type, TD_JOBS_EVENT_STATE) || !strcmp(type, TD_JOBS_EVENT_RESTART) ||
                !strcmp(type, TD_JOBS_EVENT_PLACEMENT); /* the daemon's */
    if (!strcmp(type, TD_JOBS_EVENT_PLACEMENT) && json_is_object(o)) {
        json_decref(jb->last_placement); /* the latest attempt's, for the job's JSON */
        jb->last_placement = json_incref(o);
    }
    if (!ours && json_is_integer(step)) jb->last_step = (long)json_integer_value(step);
    if (!strcmp(type, TD_JOBS_EVENT_DROPPED)) /* metric lines max_events_per_s refused */
        jb->events_dropped += (long long)json_integer_value(json_object_get(o, "lines"));
    if (strcmp(type, TD_EVENT_TRAIN) == 0) {
        json_decref(jb->latest_train), jb->latest_train = o, o = NULL;
    } else if (strcmp(type, TD_EVENT_EVAL) == 0) {
        json_decref(jb->latest_eval), jb->latest_eval = o, o = NULL;
    } else if (strcmp(type, TD_EVENT_DONE) == 0) {
        json_decref(jb->latest_done), jb->latest_done = o, o = NULL;
    } else if (strcmp(type, TD_EVENT_CHECKPOINT) == 0 && json_object_get(o, "size")) {
        jb->n_checkpoints++;
        const char *path = json_string_value(json_object_get(o, "path"));
        if (path) td_jobs_set_checkpoint(jb, (long)json_integer_value(step), path);
    }
    json_decref(o);
}

/* Metrics and checkpoints a job had, for its JSON: read back from the event log. */
static void load_latest(td_jobs *j, job *jb) {
    td_err err = {{0}};
    if (td_db_events(j->db, jb->row.id, 0, INT_MAX, replay_event, jb, &err) != 0)
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id), "job %ld: %s", jb->row.id,
                  err.msg);
}

/* Whether the latest attempt's file is still there: a local attempt not yet handled. */
static bool attempt_file(const job *jb) {
    char base[PATH_MAX - 16], path[PATH_MAX];
    td_shepherd_base(base, sizeof base, jb->dir, jb->attempts[jb->n_attempts - 1].attempt, 0);
    snprintf(path, sizeof path, "%s.json", base);
    return access(path, F_OK) == 0;
}

/* A job whose latest attempt had not ended when the previous daemon stopped: its shepherd
 * still runs it (re-attached: nothing is restarted, no event added), or ended it meanwhile (the
 * supervisor reads the rest of its output and its status at once); an attempt without a
 * shepherd (the daemon died before starting it, or an older traind ran it) starts again. */
static void take_up(td_jobs *j, job *jb) {
    td_db_attempt *a = &jb->attempts[jb->n_attempts - 1];
    char base[PATH_MAX - 16];
    td_shepherd_base(base, sizeof base, jb->dir, a->attempt, 0);
    json_t *notes = td_shepherd_notes(base);
    if (!notes || td_runner_notes_of_part(notes)) {
        /* placed across nodes (its parts run as node parts, service/node/), or never started */
        if (!notes && jb->row.pgid > 0 && td_runner_group_of((pid_t)jb->row.pgid, jb->dir))
            killpg((pid_t)jb->row.pgid, SIGKILL); /* an older traind's group, without a shepherd */
        json_decref(notes);
        td_jobs_recover(j, jb, "the daemon restarted while the job ran");
        return;
    }
    int n = td_jobs_procs(jb);
    free(jb->log_start);
    jb->log_start = td_calloc((size_t)n, sizeof *jb->log_start);
    char cgroup[PATH_MAX];
    td_err err = {{0}};
    jb->active = true;
    int rc = td_runner_attach(&j->runner, base, notes, n, td_jobs_slots(jb), &jb->devices,
                              jb->log_start, cgroup, sizeof cgroup, &jb->sh, &err);
    free(jb->cgroup);
    jb->cgroup = cgroup[0] ? td_str_dup(cgroup) : NULL;
    json_t *placement = json_object_get(notes, "placement");
    if (json_is_object(placement)) {
        json_decref(jb->last_placement);
        jb->last_placement = json_incref(placement);
    }
    json_decref(notes);
    jb->out_read = jb->row.out_offset;
    jb->line.len = 0;
    if (rc == 1) jb->sh.pgid = (pid_t)jb->row.pgid; /* what its processes left, if any */
    if (rc < 0) {
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id), "job %ld: %s", jb->row.id,
                  err.msg);
        td_jobs_release_slots(j, jb);
        td_jobs_recover(j, jb, "the daemon restarted while the job ran");
        return;
    }
    if (jb->state != RUNNING) { /* it died between starting the shepherd and saying so */
        td_jobs_set_state(jb, RUNNING);
        td_jobs_emit_state(j, jb);
    }
    if (rc == 0)
        td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                  "job %ld: re-attached to attempt %d, still running (its rank 0 output read on "
                  "from byte %lld)",
                  jb->row.id, a->attempt, jb->row.out_offset);
    else
        td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                  "job %ld: attempt %d ended while no daemon ran: reading how", jb->row.id,
                  a->attempt);
}

/* A job that cannot go on (its spec is unusable now): whatever its latest attempt's shepherd
 * still runs is stopped, with the grace period, before the job is failed. */
static void stop_what_runs(td_jobs *j, job *jb, const char *why) {
    if (jb->n_attempts == 0) return;
    char base[PATH_MAX - 16];
    td_shepherd_base(base, sizeof base, jb->dir, jb->attempts[jb->n_attempts - 1].attempt, 0);
    td_shepherd sh;
    td_err err = {{0}};
    if (td_shepherd_attach(&sh, base, &err) == 0) {
        td_shepherd_stop(&sh, SIGTERM, j->cfg.runner.grace_s, why);
        td_shepherd_close(&sh);
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id),
                  "job %ld: its running processes are told to stop: %s", jb->row.id, why);
    }
    td_shepherd_forget(base);
}

/* Whether name is an upload's temporary file: PUT /v1/cluster/files streams into NAME.up-XXXXXX
 * (mkostemp's six characters) beside the file and renames it only once it is whole. */
static bool upload_leftover(const char *name) {
    const char *up = NULL;
    for (const char *p = name; (p = strstr(p, ".up-")); p++) up = p;
    return up && up != name && strlen(up) == 4 + 6;
}

/* Removes under dir (depth levels of subdirectories) what uploads cut short by the daemon's death
 * left: the temporary files sat among the checkpoint's own, so they were listed, put in its .tar
 * and sent with it to resuming nodes (chaos.py found one after a kill -9 of the master
 * mid-upload). Nothing uploads yet: the API starts after the jobs are loaded. */
static void sweep_uploads(td_jobs *j, long id, const char *dir, int depth) {
    DIR *d = opendir(dir);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char path[PATH_MAX];
        struct stat st;
        if (e->d_name[0] == '.' ||
            snprintf(path, sizeof path, "%s/%s", dir, e->d_name) >= (int)sizeof path ||
            lstat(path, &st) != 0)
            continue;
        if (S_ISDIR(st.st_mode) && depth > 0)
            sweep_uploads(j, id, path, depth - 1);
        else if (S_ISREG(st.st_mode) && upload_leftover(e->d_name) && unlink(path) == 0)
            td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(id),
                      "job %ld: removed %s, an upload cut short when the daemon stopped", id, path);
    }
    if (d) closedir(d);
}

/* Re-reads what a stored job runs (its spec is in the database, its worker spec on disk). */
static int rebuild_run(td_jobs *j, job *jb, td_err *err) {
    if (strcmp(jb->row.kind, "command") != 0) {
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/spec.json", jb->dir);
        td_jobs_set_worker_run(j, jb, path);
        return access(path, R_OK) == 0 ? 0 : td_fail(err, "%s is gone", path);
    }
    td_submission s;
    td_reply_error e;
    td_submit_rules rules = j->cfg.rules;
    rules.slots = INT_MAX; /* it was accepted: where it fits is for the queue to say */
    rules.cluster = true;  /* and a job across nodes was accepted by a master */
    if (td_submission_parse(&s, jb->row.spec, strlen(jb->row.spec), &rules, &e) != 0)
        return td_fail(err, "its stored spec no longer parses: %s", e.message);
    jb->argv = s.argv;
    jb->env = s.env;
    jb->metrics = s.metrics;
    s.metrics = NULL;
    jb->cwd = s.cwd[0] ? td_str_dup(s.cwd) : NULL;
    snprintf(jb->local_rank_arg, sizeof jb->local_rank_arg, "%s", s.local_rank_arg);
    s.argv = s.env = NULL;
    td_submission_free(&s);
    return 0;
}

int td_jobs_load(td_jobs *j, td_err *err) {
    load_ctx ctx = {j};
    if (td_db_load_jobs(j->db, load_one, &ctx, err) != 0) return -1;
    for (int i = 0; i < j->n_jobs; i++) {
        job *jb = j->jobs[i];
        load_latest(j, jb);
        if (jb->last_placement) { /* it ran across nodes: agents uploaded its checkpoints */
            char dir[PATH_MAX];
            snprintf(dir, sizeof dir, "%.*s/checkpoints", PATH_MAX - 16, jb->dir);
            sweep_uploads(j, jb->row.id, dir, 8);
        }
        if (td_jobs_final_state(jb->state)) continue;
        td_err why = {{0}};
        if (rebuild_run(j, jb, &why) != 0) {
            char reason[TD_ERR_MAX + 64];
            snprintf(reason, sizeof reason, "cannot run after a daemon restart: %s", why.msg);
            stop_what_runs(j, jb, reason);
            td_jobs_finish(j, jb, FAILED, -1, reason);
            continue;
        }
        if (jb->n_attempts > 0 && (jb->attempts[jb->n_attempts - 1].finished_at <= 0 ||
                                   (jb->state == RUNNING && attempt_file(jb))))
            take_up(j, jb); /* (an ended attempt whose end was not yet acted on: again) */
        else if (jb->state == RUNNING || jb->state == RESTARTING)
            td_jobs_recover(j, jb, "the daemon restarted while the job ran");
    }
    return 0;
}
