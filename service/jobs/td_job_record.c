/* The job table and what it says: lookup by id, rendering a job as the API's JSON, state changes
 * and events, each committed to the database before it is announced to the streams. Everything
 * here runs under the jobs' mutex. */
#include "service/jobs/td_jobs_private.h"

#include "service/run/td_tboard.h"

#include "base/td_strv.h"

#include <errno.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

const char *const td_jobs_state_names[N_STATES] = {"queued",    "running", "restarting", "paused",
                                                   "succeeded", "failed",  "cancelled"};

static json_t *time_json(double t) {
    if (t <= 0) return json_null();
    char buf[64];
    td_clock_format(t, buf, sizeof buf);
    return json_string(buf);
}

json_t *td_jobs_code_json(int code) {
    return code >= 0 ? json_integer(code) : json_null();
}

json_t *td_jobs_reason_json(const char *r) {
    if (!r[0]) return json_null();
    json_t *s = json_string(r);
    if (s) return s;
    char *fixed = td_str_dup(r); /* a rank's own words cut at a byte count, or not UTF-8 */
    td_str_utf8_repair(fixed);
    s = json_string(fixed);
    free(fixed);
    return s;
}

const char *td_jobs_render(job *jb) {
    if (jb->json) return jb->json;
    json_t *attempts = json_array();
    for (int i = 0; i < jb->n_attempts; i++) {
        const td_db_attempt *a = &jb->attempts[i];
        json_array_append_new(
            attempts, json_pack("{s:i, s:o, s:o, s:o, s:o}", "attempt", a->attempt, "started_at",
                                time_json(a->started_at), "finished_at", time_json(a->finished_at),
                                "exit_code", td_jobs_code_json(a->exit_code), "reason",
                                td_jobs_reason_json(a->reason)));
    }
    json_t *o = json_pack(
        "{s:I, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:{s:O, s:O},"
        " s:i}",
        "id", (json_int_t)jb->row.id, "name", jb->row.name, "kind", jb->row.kind, "state",
        td_jobs_state_names[jb->state], "nproc", jb->row.nproc, "priority", jb->row.priority,
        "max_restarts", jb->row.max_restarts, "restarts", jb->row.restarts, "time_limit_s",
        jb->row.time_limit_s > 0 ? json_real(jb->row.time_limit_s) : json_null(), "created_at",
        time_json(jb->row.created_at), "started_at", time_json(jb->row.started_at), "finished_at",
        time_json(jb->row.finished_at), "exit_code", td_jobs_code_json(jb->row.exit_code), "reason",
        td_jobs_reason_json(jb->state == QUEUED && !jb->row.reason[0] ? jb->waiting
                                                                      : jb->row.reason),
        "attempts", attempts, "latest", "train", jb->latest_train ? jb->latest_train : json_null(),
        "eval", jb->latest_eval ? jb->latest_eval : json_null(), "checkpoints", jb->n_checkpoints);
    /* the run's summary line, when it printed one (its final val_acc may be there alone) */
    if (o)
        json_object_set(json_object_get(o, "latest"), "done",
                        jb->latest_done ? jb->latest_done : json_null());
    if (o) {
        json_object_set_new(o, "nnodes", json_integer(jb->nnodes > 0 ? jb->nnodes : 1));
        json_object_set_new(o, "gpus_per_proc",
                            json_integer(jb->gpus_per_proc > 0 ? jb->gpus_per_proc : 1));
        json_object_set_new(o, "launch", json_string(jb->launch_self ? "self" : "torchrun"));
        json_object_set_new(o, "visible_gpus", json_string(jb->see_all_gpus ? "job" : "own"));
        json_object_set_new(o, "placement", td_jobs_placement_json(jb));
        if (jb->row.experiment > 0) { /* a trial: GET /v1/experiments/ID has its hparams */
            json_object_set_new(o, "experiment", json_integer((json_int_t)jb->row.experiment));
            json_object_set_new(o, "trial", json_integer(jb->row.trial));
        }
        /* who submitted it: the token's name and id (0 and "": before tokens had scopes) */
        json_object_set_new(o, "owner",
                            json_pack("{s:I, s:s}", "token", (json_int_t)jb->row.owner, "name",
                                      jb->row.owner_name));
        /* who its processes are (a uid of its own: td_identity.h), and what they may use */
        char user[64];
        snprintf(user, sizeof user, "traind-job-%ld", jb->row.id);
        json_object_set_new(o, "events_dropped", json_integer((json_int_t)jb->events_dropped));
        json_object_set_new(o, "disk_used_bytes", json_integer((json_int_t)jb->disk_used));
        json_object_set_new(o, "identity",
                            jb->row.uid > 0
                                ? json_pack("{s:I, s:I, s:s}", "uid", (json_int_t)jb->row.uid,
                                            "gid", (json_int_t)jb->row.uid, "user", user)
                                : json_null());
        double gib = 1073741824.0;
        json_object_set_new(
            o, "limits",
            json_pack("{s:f, s:I, s:i, s:f}", "memory_gb", (double)jb->cg_limits.memory_bytes / gib,
                      "pids", (json_int_t)jb->cg_limits.pids, "cpu_weight",
                      jb->cg_limits.cpu_weight, "disk_gb", (double)jb->disk_bytes / gib));
    }
    TD_ASSERT(o, "json_pack of a job failed (a bad UTF-8 name?)");
    /* the metrics as the worker printed them (%.9g), not as 17 digits */
    jb->json = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(o);
    TD_CHECK_ALLOC(jb->json, "rendering a job");
    return jb->json;
}

void td_jobs_stale(job *jb) {
    free(jb->json);
    jb->json = NULL;
}

void td_jobs_waits(job *jb, const char *fmt, ...) {
    char text[sizeof jb->waiting];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    if (strcmp(text, jb->waiting) == 0) return;
    memcpy(jb->waiting, text, sizeof text);
    td_jobs_stale(jb);
}

job *td_jobs_find(td_jobs *j, long id) {
    int lo = 0, hi = j->n_jobs - 1;
    while (lo <= hi) {
        int mid = (lo + hi) / 2;
        if (j->jobs[mid]->row.id == id) return j->jobs[mid];
        if (j->jobs[mid]->row.id < id)
            lo = mid + 1;
        else
            hi = mid - 1;
    }
    return NULL;
}

void td_jobs_add(td_jobs *j, job *jb) {
    if (j->n_jobs == j->cap_jobs) {
        j->cap_jobs = j->cap_jobs ? 2 * j->cap_jobs : 64;
        j->jobs = td_realloc(j->jobs, (size_t)j->cap_jobs * sizeof *j->jobs);
    }
    j->jobs[j->n_jobs++] = jb;
    if (td_jobs_final_state(jb->state)) return;
    if (j->n_live == j->cap_live) {
        j->cap_live = j->cap_live ? 2 * j->cap_live : 64;
        j->live = td_realloc(j->live, (size_t)j->cap_live * sizeof *j->live);
    }
    j->live[j->n_live++] = jb;
}

/* A finished job leaves the live list once nothing of it is left to do: no process, no
 * placement, no event waiting for the database (the supervisor retries those from the list). */
static bool done_with(const job *jb) {
    return td_jobs_final_state(jb->state) && !jb->active && !jb->parts && jb->n_pending == 0;
}

static void forget_recent(job *jb) {
    for (int k = 0; k < jb->n_recent; k++) {
        struct recent_event *r = &jb->recent[(jb->recent_head + k) % TD_JOBS_RECENT];
        free(r->type);
        free(r->data);
    }
    free(jb->recent);
    jb->recent = NULL;
    jb->recent_head = jb->n_recent = 0;
}

/* Takes a stored event's strings into the ring. */
static void remember(job *jb, long seq, char *type, char *data) {
    if (!jb->recent) jb->recent = td_calloc(TD_JOBS_RECENT, sizeof *jb->recent);
    struct recent_event *r;
    if (jb->n_recent < TD_JOBS_RECENT) {
        r = &jb->recent[(jb->recent_head + jb->n_recent++) % TD_JOBS_RECENT];
    } else {
        r = &jb->recent[jb->recent_head];
        jb->recent_head = (jb->recent_head + 1) % TD_JOBS_RECENT;
        free(r->type);
        free(r->data);
    }
    *r = (struct recent_event){seq, type, data};
}

int td_jobs_recent_events(const job *jb, long after, int limit, td_db_event_fn fn, void *ctx) {
    if (after >= jb->stored_seq) return 0; /* nothing newer */
    if (jb->n_recent == 0 || after + 1 < jb->recent[jb->recent_head].seq) return -1;
    int n = 0;
    for (int k = 0; k < jb->n_recent && n < limit; k++) {
        const struct recent_event *r = &jb->recent[(jb->recent_head + k) % TD_JOBS_RECENT];
        if (r->seq <= after) continue;
        fn(ctx, r->seq, r->type, r->data);
        n++;
    }
    return n;
}

void td_jobs_live_compact(td_jobs *j) {
    int n = 0;
    for (int i = 0; i < j->n_live; i++) {
        if (!done_with(j->live[i]))
            j->live[n++] = j->live[i];
        else /* its last events are in the database: a late follower reads them there */
            forget_recent(j->live[i]);
    }
    j->n_live = n;
}

void td_jobs_wake_streams(td_jobs *j, long id) {
    pthread_cond_broadcast(&j->stream_cv[(unsigned long)id % TD_JOBS_STREAM_CVS]);
    job *jb = j->observer ? td_jobs_find(j, id) : NULL;
    if (jb && jb->row.experiment > 0) j->observer(j->observer_ctx, id); /* a trial's news */
}

void td_jobs_live_remove(td_jobs *j, const job *jb) {
    int n = 0;
    for (int i = 0; i < j->n_live; i++)
        if (j->live[i] != jb) j->live[n++] = j->live[i];
    j->n_live = n;
}

job *td_jobs_new_job(td_jobs *j, const td_db_job *row) {
    job *jb = td_calloc(1, sizeof *jb);
    jb->row = *row;
    jb->out_fd = -1;
    jb->sh.fd = -1;
    jb->checkpoint_step = -1;
    jb->state = QUEUED;
    for (int s = 0; s < N_STATES; s++)
        if (strcmp(row->state, td_jobs_state_names[s]) == 0) jb->state = s;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s/jobs/%ld", j->cfg.runner.state_dir, row->id);
    jb->dir = td_str_dup(dir);
    jb->stored_seq = row->last_seq;
    return jb;
}

td_db_attempt *td_jobs_new_attempt(job *jb) {
    if (jb->n_attempts == jb->cap_attempts) {
        jb->cap_attempts = jb->cap_attempts ? 2 * jb->cap_attempts : 1; /* most have one */
        jb->attempts = td_realloc(jb->attempts, (size_t)jb->cap_attempts * sizeof *jb->attempts);
    }
    td_db_attempt *a = &jb->attempts[jb->n_attempts];
    *a = (td_db_attempt){.attempt = jb->n_attempts, .exit_code = -1};
    jb->n_attempts++;
    return a;
}

void td_jobs_set_state(job *jb, int state) {
    jb->state = state;
    snprintf(jb->row.state, sizeof jb->row.state, "%s", td_jobs_state_names[state]);
    td_jobs_stale(jb);
}

bool td_jobs_final_state(int s) {
    return s == SUCCEEDED || s == FAILED || s == CANCELLED;
}

/* Appends an event (and the job row) to the database, then wakes the streams. */
/* raw: the event's text as the worker wrote it (kept byte for byte), or NULL to encode data */
void td_jobs_emit(td_jobs *j, job *jb, const char *type, json_t *data, const char *raw, long step,
                  bool metric, const char *checkpoint_path, long long checkpoint_size) {
    char *text = raw ? td_strdup(raw) : data ? json_dumps(data, JSON_COMPACT) : NULL;
    if (!text) { /* a text that is not UTF-8 slipped into it: the event still happens */
        td_log_at(j->log, TD_LOG_ERROR, TD_LOG_JOB(jb->row.id),
                  "job %ld: its %s event could not be encoded as JSON; stored without its data",
                  jb->row.id, type);
        text = td_strdup("{\"error\":\"this event could not be encoded as JSON\"}");
    }
    jb->row.last_seq++;
    if (jb->n_pending == jb->cap_pending) {
        jb->cap_pending = jb->cap_pending ? 2 * jb->cap_pending : 4;
        jb->pending = td_realloc(jb->pending, (size_t)jb->cap_pending * sizeof *jb->pending);
    }
    jb->pending[jb->n_pending++] =
        (pending_event){.seq = jb->row.last_seq,
                        .step = step,
                        .type = td_strdup(type),
                        .text = text,
                        .checkpoint_path = checkpoint_path ? td_strdup(checkpoint_path) : NULL,
                        .metric = metric,
                        .checkpoint_size = checkpoint_size,
                        .out_offset = jb->row.out_offset};
    /* a burst of rank 0's lines is stored in one transaction by its reader (td_job_output.c) */
    if (!jb->batching) td_jobs_store_pending(j, jb);
    td_jobs_stale(jb);
    pthread_cond_broadcast(&j->changed);
}

static void free_pending(pending_event *p) {
    free(p->type);
    free(p->text);
    free(p->checkpoint_path);
}

enum { STORE_BATCH = 512 }; /* events in one transaction at most */

bool td_jobs_store_pending(td_jobs *j, job *jb) {
    int done = 0;
    td_err err = {{0}};
    while (done < jb->n_pending) {
        int n = jb->n_pending - done < STORE_BATCH ? jb->n_pending - done : STORE_BATCH;
        td_db_event evs[STORE_BATCH];
        for (int i = 0; i < n; i++) {
            pending_event *p = &jb->pending[done + i];
            evs[i] = (td_db_event){
                jb->row.id,        p->seq, p->type, p->text, p->step, p->metric, p->checkpoint_path,
                p->checkpoint_size};
        }
        /* the row as it was with the batch's last event: a daemon that dies before the next one
         * is stored reads the output on from that event's line, not from a later one */
        const pending_event *last = &jb->pending[done + n - 1];
        td_db_job row = jb->row;
        row.last_seq = last->seq;
        row.out_offset = last->out_offset;
        if (td_db_add_events(j->db, evs, n, &row, &err) != 0) break;
        for (int i = 0; i < n; i++) {
            pending_event *p = &jb->pending[done + i];
            jb->stored_seq = p->seq;
            remember(jb, p->seq, p->type, p->text);
            p->type = p->text = NULL;
            free_pending(p);
        }
        done += n;
    }
    if (done > 0) /* (pending is NULL before the first event) */
        memmove(jb->pending, jb->pending + done,
                (size_t)(jb->n_pending - done) * sizeof *jb->pending);
    jb->n_pending -= done;
    if (jb->n_pending > 0 && !jb->store_failing)
        td_log_at(j->log, TD_LOG_ERROR, TD_LOG_JOB(jb->row.id),
                  "job %ld: cannot store its events (%s): %d kept in memory and stored once the "
                  "database takes them; its output is read on then",
                  jb->row.id, err.msg, jb->n_pending);
    else if (jb->n_pending == 0 && jb->store_failing)
        td_log_at(j->log, TD_LOG_NOTICE, TD_LOG_JOB(jb->row.id),
                  "job %ld: its events are stored again (up to event %ld)", jb->row.id,
                  jb->stored_seq);
    jb->store_failing = jb->n_pending > 0;
    if (done > 0) {
        pthread_cond_broadcast(&j->changed);
        td_jobs_wake_streams(j, jb->row.id);
    }
    return jb->n_pending == 0;
}

void td_jobs_emit_state(td_jobs *j, job *jb) {
    json_t *d = json_pack("{s:s, s:o, s:o, s:i}", "state", td_jobs_state_names[jb->state], "reason",
                          td_jobs_reason_json(jb->row.reason), "exit_code",
                          td_jobs_code_json(jb->row.exit_code), "attempt",
                          jb->n_attempts > 0 ? jb->n_attempts - 1 : 0);
    td_jobs_emit(j, jb, TD_JOBS_EVENT_STATE, d, NULL, -1, false, NULL, 0);
    json_decref(d);
}

void td_jobs_save_attempt(td_jobs *j, job *jb, const td_db_attempt *a) {
    td_err err = {{0}};
    if (td_db_save_attempt(j->db, jb->row.id, a, &err) != 0)
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id), "job %ld: %s", jb->row.id,
                  err.msg);
}

/* A job finished: the janitor (td_job_retention.c) looks at the count of finished jobs soon (a
 * time limit it waits for by its deadline). */
static void wake_janitor(td_jobs *j) {
    if (j->cfg.keep_finished_jobs <= 0) return;
    j->janitor_poke = true;
    pthread_cond_signal(&j->janitor_wake);
}

void td_jobs_finish(td_jobs *j, job *jb, int state, int code, const char *reason) {
    td_jobs_set_state(jb, state);
    td_jobs_tboard_close(j, jb);
    jb->row.exit_code = code;
    snprintf(jb->row.reason, sizeof jb->row.reason, "%s", reason);
    jb->row.finished_at = td_clock_wall();
    jb->row.pgid = 0;
    td_jobs_emit_state(j, jb);
    wake_janitor(j);
    td_log_at(j->log, state == FAILED ? TD_LOG_WARNING : TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
              "job %ld %s%s%s", jb->row.id, td_jobs_state_names[state], reason[0] ? ": " : "",
              reason);
}

void td_jobs_free_job(job *jb) {
    for (int i = 0; i < jb->n_pending; i++) free_pending(&jb->pending[i]);
    forget_recent(jb);
    free(jb->pending);
    td_tboard_close(jb->tboard);
    free(jb->row.spec);
    free(jb->attempts);
    json_decref(jb->latest_train);
    json_decref(jb->latest_eval);
    json_decref(jb->latest_done);
    free(jb->checkpoint_path);
    free(jb->checkpoint_dir);
    free(jb->cgroup);
    free(jb->dir);
    td_jobs_resume_forget(jb);
    json_decref(jb->resume_order);
    json_decref(jb->last_placement);
    td_strv_free(jb->pin);
    for (int i = 0; i < jb->n_parts; i++) free(jb->parts[i].proc_devices);
    free(jb->parts);
    free(jb->log_start);
    td_strv_free(jb->argv);
    json_decref(jb->metrics);
    free(jb->cwd);
    td_strv_free(jb->env);
    free(jb->json);
    free(jb->devices);
    td_shepherd_close(&jb->sh);
    td_buf_free(&jb->line);
    if (jb->out_fd >= 0) close(jb->out_fd);
    free(jb);
}

/* ---- the checkpoint and the placement in the job's JSON ------------------------------------ */

void td_jobs_resume_forget(job *jb) {
    json_decref(jb->checkpoint_files);
    jb->checkpoint_files = NULL;
    jb->checkpoint_placed = false;
    free(jb->resume_error);
    jb->resume_error = NULL;
    free(jb->place_error);
    jb->place_error = NULL;
}

/* One node of a placement: its ranks, all its GPUs ("devices"), and each process the node
 * starts with the ranks it stands for and its CUDA_VISIBLE_DEVICES (proc_devices: theirs
 * separated by ';'; "" where the node has no GPUs). */
json_t *td_jobs_placement_node(const job *jb, const char *node, const char *address, int node_rank,
                               const char *devices, const char *proc_devices) {
    json_t *ranks = json_array(), *procs = json_array();
    for (int r = 0; r < jb->row.nproc; r++)
        json_array_append_new(ranks, json_integer(node_rank * jb->row.nproc + r));
    const char *d = proc_devices;
    for (int p = 0; p < td_jobs_procs(jb); p++) {
        json_t *mine = json_array();
        for (int r = 0; r < (jb->launch_self ? jb->row.nproc : 1); r++)
            json_array_append_new(mine, json_integer(node_rank * jb->row.nproc + p + r));
        size_t len = strcspn(d, ";");
        json_array_append_new(procs, json_pack("{s:o, s:s%}", "ranks", mine, "devices", d, len));
        d += len + (d[len] == ';');
    }
    return json_pack("{s:s, s:s, s:i, s:o, s:s, s:o}", "node", node, "address", address,
                     "node_rank", node_rank, "ranks", ranks, "devices", devices, "processes",
                     procs);
}

/* The placement in a job's JSON: each node, its node rank, global ranks and devices. */
json_t *td_jobs_placement_json(const job *jb) {
    if (!jb->parts) return jb->last_placement ? json_incref(jb->last_placement) : json_null();
    json_t *list = json_array();
    for (int i = 0; i < jb->n_parts; i++) {
        const part *p = &jb->parts[i];
        json_t *nd = td_jobs_placement_node(jb, p->node, p->address, p->node_rank, p->devices,
                                            p->proc_devices ? p->proc_devices : "");
        json_object_set_new(nd, "state",
                            json_string(p->state == PART_STARTING  ? "starting"
                                        : p->state == PART_RUNNING ? "running"
                                                                   : "ended"));
        json_array_append_new(list, nd);
    }
    return json_pack("{s:o, s:s, s:i}", "nodes", list, "master_addr", jb->parts[0].address,
                     "master_port", jb->master_port);
}

void td_jobs_wake(td_jobs *j) {
    uint64_t one = 1;
    (void)!write(j->wake_fd, &one, sizeof one);
}

bool td_jobs_forget_locked(td_jobs *j, int at) {
    job *jb = j->jobs[at];
    long id = jb->row.id;
    /* out of the way at once (a rename), removed after the lock is let go: a job's files can
     * be gigabytes of checkpoints */
    char doomed[PATH_MAX + 32];
    snprintf(doomed, sizeof doomed, "%s/jobs/.deleted-%ld", j->cfg.runner.state_dir, id);
    bool moved = rename(jb->dir, doomed) == 0;
    if (!moved && errno != ENOENT)
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(id), "job %ld: cannot move %s aside: %s", id,
                  jb->dir, strerror(errno));
    memmove(&j->jobs[at], &j->jobs[at + 1], (size_t)(j->n_jobs - at - 1) * sizeof *j->jobs);
    j->n_jobs--;
    td_jobs_live_remove(j, jb);
    td_jobs_wake_streams(j, id); /* they end */
    td_jobs_free_job(jb);
    return moved;
}

/* When the job's time limit ends (CLOCK_REALTIME seconds), or 0 without one. */
double td_jobs_deadline(const job *jb) {
    return jb->row.time_limit_s > 0 && jb->row.started_at > 0
               ? jb->row.started_at + jb->row.time_limit_s
               : 0;
}
