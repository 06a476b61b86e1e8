/* The jobs module's public side (td_jobs.h): what the HTTP API asks of a job: get, list, cancel,
 * delete, wait for events, its logs, metrics, checkpoints and files. Submitting one is
 * td_job_submit.c's, opening and closing the module td_job_lifecycle.c's, figures over all jobs
 * td_job_figures.c's; td_jobs_private.h lists the other files. */
#include "service/jobs/td_jobs_private.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static int not_found(td_reply_error *e, long id) {
    return td_reply_fail(e, 404, "not_found", NULL, "there is no job %ld", id);
}

/* 403 unless who may act on jb: an admin, or the token that submitted it. */
static int owner_check(const job *jb, const td_principal *who, const char *what,
                       td_reply_error *e) {
    if (who->scope >= TD_SCOPE_ADMIN || (who->id != 0 && jb->row.owner == who->id)) return 0;
    return td_reply_fail(e, 403, "forbidden", NULL,
                         "job %ld was submitted by %s%s%s: token \"%s\" (scope %s) may %s only "
                         "the jobs it submitted",
                         jb->row.id, jb->row.owner_name[0] ? "token \"" : "another token",
                         jb->row.owner_name, jb->row.owner_name[0] ? "\"" : "", who->name,
                         td_scope_name(who->scope), what);
}

int td_jobs_get(td_jobs *j, long id, td_buf *out, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    if (jb) td_buf_puts(out, td_jobs_render(jb));
    pthread_mutex_unlock(&j->mu);
    return jb ? 0 : not_found(e, id);
}

int td_jobs_spec(td_jobs *j, long id, const td_principal *who, td_buf *out, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = !jb ? not_found(e, id) : owner_check(jb, who, "read the spec of", e);
    if (rc == 0) td_buf_puts(out, jb->row.spec);
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int td_jobs_exists(td_jobs *j, long id, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    pthread_mutex_unlock(&j->mu);
    return jb ? 0 : not_found(e, id);
}

unsigned td_jobs_state_bit(const char *state) {
    for (int s = 0; s < N_STATES; s++)
        if (strcmp(state, td_jobs_state_names[s]) == 0) return 1u << s;
    return 0;
}

void td_jobs_state_list(char *out, size_t len) {
    out[0] = 0;
    for (int s = 0; s < N_STATES; s++)
        snprintf(out + strlen(out), len - strlen(out), "%s%s", s == 0 ? "" : ", ",
                 td_jobs_state_names[s]);
}

void td_jobs_list(td_jobs *j, unsigned states, int limit, int offset, td_buf *out) {
    td_jobs_lock(j);
    td_buf_puts(out, "{\"jobs\":[");
    int seen = 0, shown = 0;
    bool more = false;
    for (int i = j->n_jobs - 1; i >= 0; i--) { /* newest first */
        job *jb = j->jobs[i];
        if (states && !(states & (1u << jb->state))) continue;
        if (seen++ < offset) continue;
        if (shown == limit) {
            more = true;
            break;
        }
        if (shown++) td_buf_puts(out, ",");
        td_buf_puts(out, td_jobs_render(jb));
    }
    if (more)
        td_buf_printf(out, "],\"next_offset\":%d}\n", offset + limit);
    else
        td_buf_puts(out, "],\"next_offset\":null}\n");
    pthread_mutex_unlock(&j->mu);
}

int td_jobs_cancel(td_jobs *j, long id, const td_principal *who, td_buf *out, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = 0;
    if (!jb) {
        rc = not_found(e, id);
    } else if (owner_check(jb, who, "cancel", e) != 0) {
        rc = -1;
    } else if (td_jobs_final_state(jb->state)) {
        rc = td_reply_fail(e, 409, "conflict", NULL,
                           "job %ld has already ended (%s): there is nothing to cancel", id,
                           td_jobs_state_names[jb->state]);
    } else if (j->stopping_jobs) { /* its stop says "daemon_stop": the next start resumes it */
        rc = td_reply_fail(e, 503, "unavailable", NULL,
                           "traind is stopping and stopping its jobs (job %ld resumes when it "
                           "is back): cancel it again then",
                           id);
    } else if (!jb->active) { /* queued, or waiting to be restarted */
        jb->cancel_requested = true;
        td_jobs_finish(j, jb, CANCELLED, -1, "cancelled by request");
    } else {
        jb->cancel_requested = true;
        td_jobs_wake(j);
        struct timespec until;
        td_clock_deadline(&until, j->cfg.runner.grace_s + 30.0);
        while (!td_jobs_final_state(jb->state) && !j->stopping &&
               pthread_cond_timedwait(&j->changed, &j->mu, &until) != ETIMEDOUT) {
        }
        if (!td_jobs_final_state(jb->state))
            rc = td_reply_fail(e, 503, "unavailable", NULL, "job %ld is still stopping; ask again",
                               id);
    }
    if (rc == 0) td_buf_puts(out, td_jobs_render(jb));
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int td_jobs_wait(td_jobs *j, long id, long after, double timeout_s, long *last_seq, bool *ended) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    if (!jb) {
        pthread_mutex_unlock(&j->mu);
        return -1;
    }
    struct timespec until;
    td_clock_deadline(&until, timeout_s);
    pthread_cond_t *cv = &j->stream_cv[(unsigned long)id % TD_JOBS_STREAM_CVS];
    /* stored events only (the stream reads what is stored); the job is found again after each
     * wait: it may have been deleted meanwhile, which ends the stream */
    while (jb && jb->stored_seq <= after &&
           !(td_jobs_final_state(jb->state) && jb->n_pending == 0) && !j->stopping &&
           pthread_cond_timedwait(cv, &j->mu, &until) != ETIMEDOUT)
        jb = td_jobs_find(j, id);
    if (jb) jb = td_jobs_find(j, id); /* (a timeout returns without looking) */
    *last_seq = jb ? jb->stored_seq : after;
    *ended = !jb || (td_jobs_final_state(jb->state) && jb->n_pending == 0) || j->stopping;
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int td_jobs_log_path(td_jobs *j, long id, int rank, char *path, size_t len, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int nproc = jb ? jb->row.nproc * (jb->nnodes > 1 ? jb->nnodes : 1) : 0; /* the world */
    int per_node = jb ? jb->row.nproc : 1;
    bool self = jb && jb->launch_self;
    if (jb) snprintf(path, len, "%s/rank-%d.log", jb->dir, rank);
    pthread_mutex_unlock(&j->mu);
    if (!jb) return not_found(e, id);
    if (rank < 0 || rank >= nproc)
        return td_reply_fail(e, 404, "not_found", "rank", "job %ld has ranks 0 to %d, not %d", id,
                             nproc - 1, rank);
    /* one log a node: its launching process's, where whatever it started writes too */
    if (self && rank % per_node != 0)
        return td_reply_fail(e, 404, "not_found", "rank",
                             "job %ld starts one process a node (launch \"self\"), whose log "
                             "holds what its ranks wrote: ask for rank %d (ranks 0, %d, ...)",
                             id, rank - rank % per_node, per_node);
    return 0;
}

int td_jobs_events(td_jobs *j, long id, long after, int limit, td_db_event_fn fn, void *ctx,
                   td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int served = jb ? td_jobs_recent_events(jb, after, limit, fn, ctx) : -1;
    pthread_mutex_unlock(&j->mu);
    if (!jb) return not_found(e, id);
    if (served >= 0) return 0;
    td_err err = {{0}};
    if (td_db_events(j->db, id, after, limit, fn, ctx, &err) != 0)
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    return 0;
}

static void append_metric(void *ctx, const char *data) {
    td_buf *out = ctx;
    if (out->len > 1) td_buf_puts(out, ",\n");
    td_buf_puts(out, data);
}

int td_jobs_metrics(td_jobs *j, long id, long since, td_buf *out, td_reply_error *e) {
    if (td_jobs_exists(j, id, e) != 0) return -1;
    td_err err = {{0}};
    td_buf_puts(out, "[");
    if (td_db_metrics(j->db, id, since, append_metric, out, &err) != 0)
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    td_buf_puts(out, "]\n");
    return 0;
}

int td_jobs_checkpoints(td_jobs *j, long id, long step, td_db_checkpoint_fn fn, void *ctx,
                        td_reply_error *e) {
    if (td_jobs_exists(j, id, e) != 0) return -1;
    td_err err = {{0}};
    if (td_db_checkpoints(j->db, id, step, fn, ctx, &err) != 0)
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    return 0;
}

int td_jobs_checkpoint_path(td_jobs *j, long id, long step, char *path, size_t len,
                            td_reply_error *e) {
    if (td_jobs_exists(j, id, e) != 0) return -1;
    td_err err = {{0}};
    int found = td_db_checkpoint_path(j->db, id, step, path, len, &err);
    if (found < 0) return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    if (found == 0)
        return td_reply_fail(e, 404, "not_found", NULL, "job %ld has no checkpoint at step %ld", id,
                             step);
    return 0;
}

int td_jobs_tensorboard_dir(td_jobs *j, long id, char *path, size_t len, td_reply_error *e) {
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    if (jb) snprintf(path, len, "%s/tensorboard", jb->dir);
    pthread_mutex_unlock(&j->mu);
    if (!jb) return not_found(e, id);
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISDIR(st.st_mode))
        return td_reply_fail(e, 404, "not_found", NULL,
                             "job %ld has no TensorBoard events yet: they are written from its "
                             "first metric on",
                             id);
    return 0;
}

int td_jobs_delete(td_jobs *j, long id, const td_principal *who, td_reply_error *e) {
    td_jobs_lock(j);
    int at = -1;
    for (;;) { /* not while its checkpoint is being copied (into its directory, maybe) */
        at = -1;
        for (int i = 0; i < j->n_jobs; i++)
            if (j->jobs[i]->row.id == id) at = i;
        if (at < 0 || !j->jobs[at]->resume_busy || j->stopping) break;
        pthread_cond_wait(&j->changed, &j->mu);
    }
    if (at < 0) {
        pthread_mutex_unlock(&j->mu);
        return not_found(e, id);
    }
    job *jb = j->jobs[at];
    if (owner_check(jb, who, "delete", e) != 0) {
        pthread_mutex_unlock(&j->mu);
        return -1;
    }
    if (jb->row.experiment > 0) {
        int rc = td_reply_fail(e, 409, "conflict", NULL,
                               "job %ld is trial %d of experiment %ld: it goes with its "
                               "experiment (DELETE /v1/experiments/%ld)",
                               id, jb->row.trial, jb->row.experiment, jb->row.experiment);
        pthread_mutex_unlock(&j->mu);
        return rc;
    }
    if (!td_jobs_final_state(jb->state)) {
        int rc = td_reply_fail(e, 409, "conflict", NULL,
                               "job %ld is %s: only a finished job can be deleted (cancel it "
                               "first: POST /v1/jobs/%ld/cancel)",
                               id, td_jobs_state_names[jb->state], id);
        pthread_mutex_unlock(&j->mu);
        return rc;
    }
    td_err err = {{0}};
    if (td_db_delete_jobs(j->db, &id, 1, &err) != 0) {
        pthread_mutex_unlock(&j->mu);
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    }
    bool moved = td_jobs_forget_locked(j, at);
    pthread_cond_broadcast(&j->changed); /* its streams end */
    pthread_mutex_unlock(&j->mu);
    char doomed[PATH_MAX + 32];
    snprintf(doomed, sizeof doomed, "%s/jobs/.deleted-%ld", j->cfg.runner.state_dir, id);
    if (moved) td_jobs_remove_tree(j, id, doomed);
    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(id), "job %ld deleted", id);
    return 0;
}

/* A node-to-node file name: segments of [A-Za-z0-9._-], none empty or starting with '.', so it
 * can only name something inside the job's directory. */
static bool relative_ok(const char *rel) {
    if (!*rel || strlen(rel) > 1024) return false;
    for (const char *seg = rel; *seg;) {
        size_t n = strcspn(seg, "/");
        if (n == 0 || seg[0] == '.') return false;
        for (size_t i = 0; i < n; i++) {
            char c = seg[i];
            if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                  c == '.' || c == '_' || c == '-'))
                return false;
        }
        seg += n;
        if (*seg == '/') seg++;
    }
    return true;
}

int td_jobs_file_path(td_jobs *j, long id, const char *rel, bool writing, const char *node,
                      char *path, size_t len, td_job_files *files, td_reply_error *e) {
    static const char CHECKPOINTS[] = "checkpoints/";
    if (!relative_ok(rel))
        return td_reply_fail(e, 400, "bad_request", NULL,
                             "\"%s\": expected a path inside the job's directory (segments of "
                             "letters, digits, '.', '_' and '-', none starting with '.')",
                             rel);
    if (strncmp(rel, CHECKPOINTS, strlen(CHECKPOINTS)) != 0 || !rel[strlen(CHECKPOINTS)])
        return td_reply_fail(e, 403, "forbidden", NULL,
                             "\"%s\": nodes exchange a job's checkpoints only (checkpoints/...)",
                             rel);
    td_jobs_lock(j);
    job *jb = td_jobs_find(j, id);
    int rc = 0;
    /* the node sends what its part's rank 0 wrote (node rank 0), and fetches only what its part
     * resumes from: a job it runs no part of is none of its business */
    int node_rank = jb && node ? td_jobs_part_rank_on(jb, node) : 0;
    if (jb && node && (node_rank < 0 || (writing && node_rank != 0)))
        rc = td_reply_fail(e, 403, "forbidden", NULL,
                           "node %s %s of job %ld's attempt: it may not %s its files", node,
                           node_rank < 0 ? "runs no part" : "does not run node rank 0", id,
                           writing ? "send" : "fetch");
    if (jb) {
        snprintf(path, len, "%s/%s", jb->dir, rel);
        td_runner_files_for(&j->runner, id, jb->row.uid, files);
    }
    /* the latest checkpoint, listed as checkpoints/BASE/... (td_job_resume.c), may lie where the
     * master's own rank 0 wrote it: a train job's checkpoint.dir outside the job's directory */
    const char *base = jb && jb->checkpoint_path ? strrchr(jb->checkpoint_path, '/') : NULL;
    size_t n = base ? strlen(base + 1) : 0;
    char ours[PATH_MAX + 16];
    if (jb) snprintf(ours, sizeof ours, "%s/checkpoints/", jb->dir);
    if (!writing && base && strncmp(jb->checkpoint_path, ours, strlen(ours)) != 0 &&
        strncmp(rel + 12, base + 1, n) == 0 && (rel[12 + n] == '/' || rel[12 + n] == 0))
        snprintf(path, len, "%s%s", jb->checkpoint_path, rel + 12 + n);
    if (jb && rc == 0 && writing) { /* its checkpoints/ is the job's, as an attempt here makes it */
        td_err err = {{0}};
        char cwd[PATH_MAX + 16];
        if (td_runner_work_dir(&files->who, jb->dir, cwd, sizeof cwd, &err) != 0)
            rc = td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    }
    pthread_mutex_unlock(&j->mu);
    return !jb ? not_found(e, id) : rc;
}
