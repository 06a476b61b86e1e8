/* Attempts and the restart policy: what a job runs (a worker spec or a command), starting an
 * attempt's process group, and deciding what comes after it: success, a restart from the latest
 * checkpoint, or the end, recorded with the failing rank's own words. */
#define _GNU_SOURCE /* pipe2, signalfd */
#include "service/jobs/td_jobs_private.h"

#include "base/td_buf.h"
#include "service/run/td_launch.h"
#include "base/td_strv.h"

#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A train job runs traind-worker on the spec in its directory, with no extra environment. */
void td_jobs_set_worker_run(td_jobs *j, job *jb, const char *spec_path) {
    jb->argv = td_strv_new(2);
    jb->argv[0] = td_str_dup(j->cfg.runner.worker);
    jb->argv[1] = td_str_dup(spec_path);
    jb->env = td_strv_new(0);
}

/* Writes the worker spec (with the daemon's checkpoint defaults) into the job directory and
 * sets argv/env. A train job's checkpoints go to its directory unless it names a place, and
 * one is taken every epoch unless it says when: a restart needs something to resume from. */
int td_jobs_prepare_run(td_jobs *j, job *jb, td_submission *s, td_err *err) {
    if (mkdir(jb->dir, 0750) != 0 && errno != EEXIST)
        return td_fail(err, "cannot create %s: %s", jb->dir, strerror(errno));
    if (s->command) {
        jb->argv = s->argv;
        jb->env = s->env;
        snprintf(jb->local_rank_arg, sizeof jb->local_rank_arg, "%s", s->local_rank_arg);
        jb->launch_self = s->launch_self;
        jb->metrics = s->metrics;
        s->metrics = NULL;
        jb->cwd = s->cwd[0] ? td_str_dup(s->cwd) : NULL;
        s->argv = s->env = NULL;
        return 0;
    }
    json_t *ck = json_object_get(s->spec, "checkpoint");
    if (!ck) {
        ck = json_object();
        json_object_set_new(s->spec, "checkpoint", ck);
    }
    if (!json_object_get(ck, "dir")) {
        char dir[PATH_MAX + 16];
        snprintf(dir, sizeof dir, "%s/checkpoints", jb->dir);
        json_object_set_new(ck, "dir", json_string(dir));
    }
    if (!json_object_get(ck, "every_steps") && !json_object_get(ck, "every_epochs"))
        json_object_set_new(ck, "every_epochs", json_integer(1));
    /* whole or not at all (PBT rewrites a paused job's: a failure keeps the one it had) */
    char path[PATH_MAX + 16], tmp[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/spec.json", jb->dir);
    snprintf(tmp, sizeof tmp, "%s/.spec.json.tmp", jb->dir);
    if (json_dump_file(s->spec, tmp, JSON_INDENT(2)) != 0 || rename(tmp, path) != 0) {
        int e = errno;
        unlink(tmp);
        return td_fail(err, "cannot write %s: %s", path, strerror(e));
    }
    td_jobs_set_worker_run(j, jb, path);
    return 0;
}

/* Where a one-node attempt runs, as a placement across nodes shows it: which GPUs each of its n
 * processes has (devices: their CUDA_VISIBLE_DEVICES). */
static void set_local_placement(td_jobs *j, job *jb, char **devices, int n, int master_port) {
    td_buf all = {0}, each = {0};
    for (int i = 0; jb->devices && i < td_jobs_slots(jb); i++)
        td_buf_printf(&all, "%s%d", i ? "," : "", td_runner_gpu_id(&j->runner, jb->devices[i]));
    for (int r = 0; devices && r < n; r++) td_buf_printf(&each, "%s%s", r ? ";" : "", devices[r]);
    json_t *node = td_jobs_placement_node(jb, j->node.name, "127.0.0.1", 0,
                                          all.data ? all.data : "", each.data ? each.data : "");
    json_decref(jb->last_placement);
    jb->last_placement = json_pack("{s:[o], s:s, s:i}", "nodes", node, "master_addr", "127.0.0.1",
                                   "master_port", master_port);
    td_buf_free(&all);
    td_buf_free(&each);
}

/* What the job's attempt runs here, as the runner takes it (service/run/td_runner_start.c): node
 * rank 0 of 1. */
static td_runner_attempt local_run(const job *jb, const td_db_attempt *a) {
    bool command = strcmp(jb->row.kind, "command") == 0;
    return (td_runner_attempt){.job = jb->row.id,
                               .uid = jb->row.uid,
                               .kind = jb->row.kind,
                               .attempt = a->attempt,
                               .node_rank = 0,
                               .nnodes = 1,
                               .nproc = jb->row.nproc,
                               .procs = td_jobs_procs(jb),
                               .dir = jb->dir,
                               .argv = jb->argv,
                               .env = jb->env,
                               .latest_checkpoint = command ? jb->checkpoint_path : NULL,
                               .stop_at_step = jb->row.stop_at_step,
                               .spec_cwd = jb->cwd,
                               .local_rank_arg = jb->local_rank_arg,
                               .launch_self = jb->launch_self,
                               .see_all_gpus = jb->see_all_gpus,
                               .slots = jb->devices,
                               .n_slots = td_jobs_slots(jb),
                               .master_addr = "127.0.0.1",
                               .max_restarts = jb->row.max_restarts,
                               .limits = jb->cg_limits,
                               .disk_bytes = jb->disk_bytes,
                               .metrics = jb->metrics,
                               .deadline = td_jobs_deadline(jb)};
}

/* A new attempt's record: rank 0's output read from its start, no end yet. */
static void attempt_begins(job *jb) {
    jb->row.out_offset = 0;
    jb->out_read = 0;
    jb->line.len = 0;
    if (jb->out_fd >= 0) close(jb->out_fd);
    jb->out_fd = -1;
    jb->left = false;
    memset(&jb->end, 0, sizeof jb->end);
    jb->row.pgid = 0; /* the previous attempt's; the shepherd says the new one */
}

/* Starts the job's next attempt on slots already reserved, through the runner. */
void td_jobs_start_attempt(td_jobs *j, job *jb) {
    td_db_attempt *a = td_jobs_new_attempt(jb);
    a->started_at = td_clock_wall();
    td_err err = {{0}};
    int ok = td_jobs_allocate_uid(j, &jb->row.uid, &err) == 0;
    td_runner_attempt r = local_run(jb, a);
    if (ok && td_launch_free_port(&r.master_port, &err) != 0) ok = 0;
    free(jb->log_start);
    jb->log_start = td_calloc((size_t)r.procs, sizeof *jb->log_start);
    char **logs = td_runner_logs(&r, jb->log_start);
    if (jb->row.started_at <= 0) jb->row.started_at = a->started_at;
    /* recorded before the shepherd starts: a daemon that dies in between finds the attempt
     * without its file and restarts it; one that dies after finds the file and re-attaches */
    attempt_begins(jb);
    td_jobs_save_attempt(j, jb, a);
    if (td_db_update_job(j->db, &jb->row, &err) != 0) ok = 0; /* out_offset 0 */
    char cgroup[PATH_MAX] = "";
    if (ok) {
        char **devices = r.slots ? td_runner_devices_strv(&j->runner, r.slots, r.n_slots, r.procs,
                                                          r.see_all_gpus)
                                 : NULL;
        set_local_placement(j, jb, devices, r.procs, r.master_port);
        td_strv_free(devices);
        json_t *notes =
            json_pack("{s:O}", "placement", jb->last_placement ? jb->last_placement : json_null());
        ok = td_runner_start(&j->runner, &r, jb->log_start, logs, notes, &jb->sh, cgroup,
                             sizeof cgroup, &err) == 0;
        json_decref(notes);
    } else {
        td_shepherd_base(jb->sh.base, sizeof jb->sh.base, jb->dir, a->attempt, 0);
    }
    free(jb->cgroup);
    jb->cgroup = cgroup[0] ? td_str_dup(cgroup) : NULL;
    td_strv_free(logs);
    if (!ok) {
        a->finished_at = td_clock_wall();
        snprintf(a->reason, sizeof a->reason, "could not start: %.480s", err.msg);
        td_jobs_save_attempt(j, jb, a);
        td_jobs_release_slots(j, jb);
        td_jobs_finish(j, jb, FAILED, -1, a->reason);
        return;
    }
    td_jobs_set_state(jb, RUNNING);
    td_jobs_emit_state(j, jb);
    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
              "job %ld attempt %d started: %d process%s, shepherd pid %d", jb->row.id, a->attempt,
              r.procs, r.procs == 1 ? "" : "es", (int)jb->sh.pid);
}

/* What a restarted attempt starts from, in words, for the restart event and the job's reason:
 * traind-worker resumes from its newest checkpoint by itself; a command starts from its beginning
 * and gets its latest registered checkpoint in TRAIND_LATEST_CHECKPOINT. */
void td_jobs_resume_note(const job *jb, char *out, size_t len) {
    bool command = strcmp(jb->row.kind, "command") == 0;
    if (!jb->checkpoint_path)
        snprintf(out, len, "%s",
                 command ? "the command starts again from its beginning in the same working "
                           "directory (it registered no checkpoint with traind; whatever it "
                           "saved there itself is still there)"
                         : "starting from scratch (no checkpoint had been written)");
    else if (command)
        snprintf(out, len,
                 "the command starts again from its beginning; its latest checkpoint (step %ld) "
                 "is given to it as TRAIND_LATEST_CHECKPOINT",
                 jb->checkpoint_step);
    else
        snprintf(out, len, "resuming from its newest checkpoint (the latest registered: step %ld)",
                 jb->checkpoint_step);
}

json_t *td_jobs_resume_json(const job *jb) {
    return jb->checkpoint_path ? json_pack("{s:I, s:s}", "step", (json_int_t)jb->checkpoint_step,
                                           "path", jb->checkpoint_path)
                               : json_null();
}

/* The failing rank's own words, from its log lines of this attempt (from `from` on):
 * traind-worker's first "error:" line, or else (any program, e.g. Python's exception line) the
 * last line that is not a metric. Empty when there is none (a process killed by a signal). */

static void worker_message(const job *jb, int rank, char *out, size_t len) {
    out[0] = 0;
    if (!jb->log_start || rank < 0 || rank >= td_jobs_procs(jb)) return;
    td_runner_rank_message(jb->dir, rank, jb->log_start[rank], strcmp(jb->row.kind, "command") == 0,
                           out, len);
}

/* Whether an attempt that ended well stopped where it was asked to (TRAIND_STOP_AT_STEP) and
 * left a checkpoint there to resume from; one that ended before that step finished its run. */
static bool reached_stop(const job *jb) {
    return jb->row.stop_at_step > 0 && jb->checkpoint_step == jb->row.stop_at_step;
}

/* An attempt that ended well at its stop step without a checkpoint there (one refused, or its
 * line dropped over max_events_per_s): it cannot be resumed, and did not run its course. */
static bool stopped_bare(const job *jb) {
    return jb->row.stop_at_step > 0 && jb->last_step == jb->row.stop_at_step && !reached_stop(jb);
}

/* Whether the attempt ended because its experiment's pause stopped it (not on its own: one that
 * finished or failed just then ends as it would have). */
static bool held_here(const job *jb, const td_shepherd_end *g, int code) {
    if (!jb->hold_requested || (code == 0 && !reached_stop(jb))) return false;
    return code == 0 || jb->parts != NULL || strcmp(g->stopped_by, "request") == 0;
}

void td_jobs_pause_job(td_jobs *j, job *jb) {
    td_jobs_set_state(jb, PAUSED);
    td_jobs_tboard_close(j, jb); /* a thousand paused trials hold no descriptor (reopened after) */
    jb->row.pgid = 0;
    if (!jb->hold_requested)
        snprintf(jb->row.reason, sizeof jb->row.reason,
                 "paused after step %ld as asked (stop_at_step); its checkpoint there is what it "
                 "resumes from",
                 jb->row.stop_at_step);
    else if (jb->checkpoint_path)
        snprintf(jb->row.reason, sizeof jb->row.reason,
                 "paused with its experiment: it resumes from its latest checkpoint (step %ld), "
                 "and trains the steps after it again",
                 jb->checkpoint_step);
    else
        snprintf(jb->row.reason, sizeof jb->row.reason,
                 "paused with its experiment: it had no checkpoint yet, and starts again from "
                 "its beginning");
    jb->hold_requested = false;
    td_jobs_emit_state(j, jb);
    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id), "job %ld: %s", jb->row.id,
              jb->row.reason);
}

/* The attempt's processes are all gone (jb->end says how): decide what comes next. */
void td_jobs_attempt_over(td_jobs *j, job *jb) {
    td_db_attempt *a = &jb->attempts[jb->n_attempts - 1];
    td_shepherd_end *g = &jb->end;
    bool placed = jb->parts != NULL;
    if (placed) { /* the parts' first failure, already in words naming node and rank */
        memset(g, 0, sizeof *g);
        g->failed = jb->parts_code != 0;
        g->exit_code = jb->parts_code;
        g->failed_rank = -1;
        snprintf(g->reason, sizeof g->reason, "%.250s", jb->parts_reason);
    }
    a->finished_at = td_clock_wall();
    /* a file that reached RLIMIT_FSIZE (the quota) killed its writer with SIGXFSZ */
    if (g->failed && g->exit_code == 128 + SIGXFSZ && !jb->over_quota && jb->disk_bytes > 0) {
        jb->over_quota = true;
        char words[300];
        td_jobs_quota_words(jb->disk_bytes, jb->disk_bytes, 0, words, sizeof words);
        snprintf(jb->quota_reason, sizeof jb->quota_reason,
                 "disk quota exceeded: a file reached resources.disk_gb %.3f GiB (%lld bytes) "
                 "and its writer was stopped (%.200s)",
                 (double)jb->disk_bytes / 1073741824.0, jb->disk_bytes, g->reason);
    }
    /* a failure's own status, else (stopped on request or at the time limit) the status the
     * processes ended with: 137 for one that needed SIGKILL after the grace period */
    int code = g->exit_code;
    if (g->failed && code == 0) code = -1;
    char reason[1024], own[320];
    if (jb->over_quota) { /* its processes stopped, or one killed by SIGXFSZ: the cause */
        snprintf(reason, sizeof reason, "%s", jb->quota_reason);
    } else if (placed && g->failed) {
        snprintf(reason, sizeof reason, "%s", jb->parts_reason);
    } else if (g->failed) {
        worker_message(jb, g->failed_rank, own, sizeof own);
        if (own[0] && strstr(g->reason, own)) own[0] = 0; /* its error file said it already */
        snprintf(reason, sizeof reason, "%.500s%s%s", g->reason, own[0] ? ": " : "", own);
    } else if (jb->cancel_requested) {
        snprintf(reason, sizeof reason, "cancelled by request");
    } else if (jb->timed_out) {
        snprintf(reason, sizeof reason,
                 "stopped at its time limit of %g s (resources.time_limit_s)",
                 jb->row.time_limit_s);
    } else {
        reason[0] = 0;
    }
    if (g->grace_note[0])
        snprintf(reason + strlen(reason), sizeof reason - strlen(reason), "%s%.250s",
                 reason[0] ? "; " : "", g->grace_note);
    a->exit_code = code;
    snprintf(a->reason, sizeof a->reason, "%s", reason);
    td_jobs_save_attempt(j, jb, a);
    if (jb->out_fd >= 0) close(jb->out_fd);
    jb->out_fd = -1;
    /* the attempt's file goes once what follows it is stored (a daemon that dies before reads
     * the status again, td_job_recover.c) */
    char base[sizeof jb->sh.base];
    snprintf(base, sizeof base, "%s", placed ? "" : jb->sh.base);
    if (!placed) td_runner_cgroup_ended(&j->runner, jb->cgroup);
    if (jb->cancel_requested) {
        td_jobs_release_slots(j, jb);
        td_jobs_finish(j, jb, CANCELLED, code, reason);
    } else if (jb->over_quota) { /* not restarted: it would only fill its quota again */
        td_jobs_release_slots(j, jb);
        td_jobs_finish(j, jb, FAILED, code ? code : -1, reason);
    } else if (jb->timed_out) {
        td_jobs_release_slots(j, jb);
        td_jobs_finish(j, jb, FAILED, code, reason);
    } else if (held_here(jb, g, code) || (code == 0 && reached_stop(jb))) {
        td_jobs_release_slots(j, jb);
        td_jobs_pause_job(j, jb);
    } else if (code == 0 && stopped_bare(jb)) {
        td_jobs_release_slots(j, jb);
        char why[300];
        snprintf(why, sizeof why,
                 "it stopped after step %ld as asked (stop_at_step) but registered no checkpoint "
                 "at that step: it cannot be resumed",
                 jb->row.stop_at_step);
        td_jobs_finish(j, jb, FAILED, -1, why);
    } else if (code == 0) {
        td_jobs_release_slots(j, jb);
        td_jobs_finish(j, jb, SUCCEEDED, 0, "");
    } else if (jb->row.restarts < jb->row.max_restarts) {
        jb->row.restarts++;
        j->restarts_total++;
        td_jobs_set_state(jb, RESTARTING);
        char note[256];
        td_jobs_resume_note(jb, note, sizeof note);
        snprintf(jb->row.reason, sizeof jb->row.reason, "%.300s; restart %d of %d, %s", reason,
                 jb->row.restarts, jb->row.max_restarts, note);
        json_t *d = json_pack("{s:i, s:i, s:o, s:i, s:o}", "attempt", jb->n_attempts, "restarts",
                              jb->row.restarts, "reason", td_jobs_reason_json(jb->row.reason),
                              "exit_code", code, "resume_from", td_jobs_resume_json(jb));
        td_jobs_emit(j, jb, TD_JOBS_EVENT_RESTART, d, NULL, -1, false, NULL, 0);
        json_decref(d);
        td_jobs_emit_state(j, jb);
        td_shepherd_forget(base);
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id), "job %ld: %s", jb->row.id,
                  jb->row.reason);
        if (placed) /* placed again, on whichever nodes have room then */
            td_jobs_release_slots(j, jb);
        else
            td_jobs_start_attempt(j, jb); /* keeps its slots */
    } else {
        char why[1200];
        snprintf(why, sizeof why, "%s (attempt %d; %d restart%s allowed)", reason, jb->n_attempts,
                 jb->row.max_restarts, jb->row.max_restarts == 1 ? "" : "s");
        td_jobs_release_slots(j, jb);
        td_jobs_finish(j, jb, FAILED, code, why);
    }
    td_shepherd_forget(base);
}

static bool starts_with(const char *s, const char *prefix) {
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

void td_jobs_shepherd_gone(td_jobs *j, job *jb) {
    td_shepherd *sh = &jb->sh;
    td_err err = {{0}};
    if (!sh->over) { /* dropped (a daemon that read too slowly), or ended: which? */
        td_shepherd again;
        if (td_shepherd_attach(&again, sh->base, &err) == 0) {
            /* a stop it was sent may be among what it dropped: the supervisor sends it again
             * (the shepherd keeps the first reason it got) */
            again.pid = sh->pid;
            *sh = again;
            return;
        }
    }
    td_shepherd_end *e = &jb->end;
    int rc = td_shepherd_end_read(sh->base, e, &err);
    /* the rest of its output first, a slice a turn (the supervisor comes back at once) */
    if (td_jobs_read_output(j, jb, true, rc == 1 ? e->output_bytes : -1)) return;
    /* no status: the machine went down with it, or a daemon died before starting it (neither
     * is the job's failure), or it was killed */
    const char *gone_with = NULL;
    if (rc == 0 && sh->pid <= 0 && !td_shepherd_ran(sh->base)) /* (one this daemon started ran) */
        gone_with = "the daemon that was starting it stopped first";
    else if (rc == 0 && td_shepherd_other_boot(sh->base))
        gone_with = "the machine restarted while it ran";
    if (rc != 1) {
        /* its processes die with it (their parent death signal); what they left in their
         * group (and cgroup) goes now */
        if (sh->pgid > 0 && !gone_with && td_runner_group_of(sh->pgid, jb->dir))
            killpg(sh->pgid, SIGKILL);
        td_runner_cgroup_ended(&j->runner, jb->cgroup);
        char words[300];
        td_shepherd_last_words(sh->base, words, sizeof words);
        memset(e, 0, sizeof *e);
        e->failed = !gone_with;
        e->exit_code = -1;
        e->failed_rank = -1;
        snprintf(e->stopped_by, sizeof e->stopped_by, "%s", gone_with ? "machine" : "");
        snprintf(e->stop_reason, sizeof e->stop_reason, "%s", gone_with ? gone_with : "");
        snprintf(e->reason, sizeof e->reason,
                 "its traind-shepherd (attempt %d) was killed or crashed without writing how the "
                 "processes ended (its status file %s); they were stopped with it%s%.300s",
                 jb->attempts[jb->n_attempts - 1].attempt, rc == 0 ? "is missing" : "is unreadable",
                 words[0] ? "; its last words: " : "", words);
    }
    const char *why = e->stop_reason;
    bool left = j->stopping_jobs; /* this daemon stops: the next one goes on with the job */
    if (rc == 1 && !e->failed && strcmp(e->stopped_by, "deadline") == 0) jb->timed_out = true;
    if (rc == 1 && !e->failed && strcmp(e->stopped_by, "request") == 0) {
        if (starts_with(why, TD_RUNNER_STOP_CANCEL)) jb->cancel_requested = true;
        if (starts_with(why, TD_RUNNER_STOP_HOLD)) jb->hold_requested = true;
        if (starts_with(why, TD_RUNNER_STOP_TIME_LIMIT)) jb->timed_out = true;
        if (starts_with(why, TD_RUNNER_STOP_QUOTA)) { /* (a daemon since restarted) */
            jb->over_quota = true;
            snprintf(jb->quota_reason, sizeof jb->quota_reason, "%.390s",
                     why + strlen(TD_RUNNER_STOP_QUOTA));
        }
        if (starts_with(why, TD_RUNNER_STOP_DAEMON)) left = true;
    }
    /* stopped while no daemon was there (orphan_timeout_s), or by a signal to the shepherd
     * itself (a service manager stopping everything): not the job's failure */
    bool absent =
        !e->failed && !jb->cancel_requested && !jb->hold_requested && !jb->timed_out &&
        !jb->over_quota &&
        (strcmp(e->stopped_by, "orphaned") == 0 || strcmp(e->stopped_by, "signal") == 0 ||
         strcmp(e->stopped_by, "machine") == 0 || starts_with(why, TD_RUNNER_STOP_DAEMON));
    sh->fd = -1;
    if (j->stopping_jobs) {
        jb->left = left;
        pthread_cond_broadcast(&j->changed);
        return;
    }
    if (absent) {
        td_shepherd_forget(sh->base);
        td_runner_cgroup_ended(&j->runner, jb->cgroup);
        if (jb->out_fd >= 0) close(jb->out_fd);
        jb->out_fd = -1;
        td_jobs_release_slots(j, jb);
        char note[600];
        const char *words = e->stop_reason[0] ? e->stop_reason : e->stopped_by;
        if (starts_with(words, TD_RUNNER_STOP_DAEMON)) /* the daemon's own words */
            snprintf(note, sizeof note, "%.500s", words + strlen(TD_RUNNER_STOP_DAEMON));
        else
            snprintf(note, sizeof note, "its processes were stopped: %.500s", words);
        td_jobs_recover(j, jb, note);
        return;
    }
    td_jobs_attempt_over(j, jb);
}

void td_jobs_recover(td_jobs *j, job *jb, const char *why) {
    if (jb->n_attempts > 0 && jb->attempts[jb->n_attempts - 1].finished_at <= 0) {
        td_db_attempt *a = &jb->attempts[jb->n_attempts - 1];
        a->finished_at = td_clock_wall();
        snprintf(a->reason, sizeof a->reason, "%s", why);
        td_jobs_save_attempt(j, jb, a);
    }
    jb->row.pgid = 0;
    td_jobs_set_state(jb, RESTARTING);
    char note[256];
    td_jobs_resume_note(jb, note, sizeof note);
    snprintf(jb->row.reason, sizeof jb->row.reason, "%.600s; %s (not counted against max_restarts)",
             why, note);
    json_t *d = json_pack("{s:i, s:i, s:o, s:o}", "attempt", jb->n_attempts, "restarts",
                          jb->row.restarts, "reason", td_jobs_reason_json(jb->row.reason),
                          "resume_from", td_jobs_resume_json(jb));
    td_jobs_emit(j, jb, TD_JOBS_EVENT_RESTART, d, NULL, -1, false, NULL, 0);
    json_decref(d);
    td_jobs_emit_state(j, jb);
    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id), "job %ld: %s: restarting it", jb->row.id,
              why);
}
