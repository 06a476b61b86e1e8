/* Rank 0's stdout, read from the file its shepherd appends it to: JSON objects with an "event"
 * become the job's events and metrics (api/README.md, "Metric lines") and a checkpoint line
 * registers a checkpoint. (Every line is in rank 0's log too: the shepherd writes it there.) */
#include "service/jobs/td_jobs_private.h"

#include "base/td_clock.h"

#include "train/td_metrics.h"

#include "service/run/td_checkpoint_files.h"
#include "base/td_strv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void td_jobs_set_checkpoint(job *jb, long step, const char *path) {
    free(jb->checkpoint_path);
    jb->checkpoint_path = td_str_dup(path);
    jb->checkpoint_step = step;
    td_jobs_resume_forget(jb); /* listed when a node needs it (td_job_resume.c) */
    jb->checkpoint_gen++;
}

/* Whether every file a node uploaded for a checkpoint is in the job's directory with its size
 * (its SHA-256 was checked as it arrived). */
static bool uploaded(td_jobs *j, const job *jb, json_t *files) {
    if (!json_is_array(files) || json_array_size(files) == 0) return false;
    td_job_files f;
    td_runner_files_for(&j->runner, jb->row.id, jb->row.uid, &f);
    size_t i;
    json_t *file;
    json_array_foreach(files, i, file) {
        const char *rel = json_string_value(json_object_get(file, "path"));
        char path[2 * PATH_MAX];
        td_err err = {{0}};
        struct stat st;
        if (!rel) return false;
        snprintf(path, sizeof path, "%s/%s", jb->dir, rel);
        int fd = td_jobfs_open_path(&f.who, f.dir, path, O_RDONLY, &err);
        bool whole =
            fd >= 0 && td_jobfs_check(fd, rel, false, f.owner, 0, &st, &err) == 0 &&
            (long long)st.st_size == (long long)json_integer_value(json_object_get(file, "size"));
        if (fd >= 0) close(fd);
        if (!whole) return false;
    }
    return true;
}

/* A checkpoint event's path: a directory (traind-worker's step-N/, or any a command writes) or
 * one file (a command's torch.save), through links as the job resolves them (a "latest" link
 * names its target: resolved with the job's own rights, td_jobfs.h). Registered with its total
 * size, under that real path, when it exists and holds only the job's own files, at most
 * max_checkpoint_files of them (td_checkpoint_files.h); one refused is said in the log. */
static bool measure_checkpoint(td_jobs *j, const job *jb, char *path, long long *size,
                               int *walked) {
    td_job_files f;
    *walked = 0;
    td_runner_files_for(&j->runner, jb->row.id, jb->row.uid, &f);
    char real[PATH_MAX];
    td_err err = {{0}};
    if (!path || !*path) return false;
    if (td_jobfs_realpath(&f.who, path, real, &err) != 0) {
        td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                  "job %ld: checkpoint not registered: %s", jb->row.id, err.msg);
        return false;
    }
    snprintf(path, PATH_MAX, "%s", real);
    td_checkpoint_file *files = NULL;
    int n = 0;
    if (td_checkpoint_list(&f, path, &files, &n, &err) != 0) {
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id),
                  "job %ld: checkpoint %s not registered: %s", jb->row.id, path, err.msg);
        *walked = f.max_files; /* as many as it may have walked before it gave up */
        return false;
    }
    *walked = n;
    *size = 0;
    for (int i = 0; i < n; i++) *size += files[i].size;
    td_checkpoint_files_free(files, n);
    return true;
}

void td_jobs_say_dropped(td_jobs *j, job *jb) {
    if (jb->dropped_unsaid <= 0) return;
    char why[200];
    snprintf(why, sizeof why,
             "over max_events_per_s (%g per second, in bursts of %g), or more than a node "
             "holds for its master: the lines are in rank 0's log",
             j->cfg.runner.max_events_per_s, 10 * j->cfg.runner.max_events_per_s);
    json_t *d = json_pack("{s:s, s:I, s:I, s:I, s:s}", "event", TD_JOBS_EVENT_DROPPED, "step",
                          (json_int_t)jb->last_step, "lines", (json_int_t)jb->dropped_unsaid,
                          "total", (json_int_t)jb->events_dropped, "reason", why);
    jb->dropped_unsaid = 0;
    td_jobs_emit(j, jb, TD_JOBS_EVENT_DROPPED, d, NULL, jb->last_step, false, NULL, 0);
    json_decref(d);
}

bool td_jobs_event_is_daemons(const char *type) {
    return !strcmp(type, TD_JOBS_EVENT_STATE) || !strcmp(type, TD_JOBS_EVENT_RESTART) ||
           !strcmp(type, TD_JOBS_EVENT_PLACEMENT) || !strcmp(type, TD_JOBS_EVENT_DROPPED) ||
           !strcmp(type, TD_JOBS_EVENT_EXPLOIT);
}

/* A line of rank 0's stdout: a JSON object with a string "event" is an event, and a metric
 * unless it is a checkpoint. An event without an integer "step" gets the step of the latest one
 * that had one (0 before any), so every metric has a place on the step axis. */
bool td_jobs_line_apply(td_jobs *j, job *jb, char *line, size_t n, bool remote, json_t *files) {
    json_error_t jerr;
    json_t *o = json_loadb(line, n, 0, &jerr);
    const char *type = o ? json_string_value(json_object_get(o, "event")) : NULL;
    if (!o || !json_is_object(o) || !type || !*type || strlen(type) > 64 ||
        strpbrk(type, "\r\n:") || td_jobs_event_is_daemons(type)) {
        json_decref(o);
        return false;
    }
    json_t *step_v = json_object_get(o, "step");
    bool changed = false;
    long step;
    if (json_is_integer(step_v) && json_integer_value(step_v) >= 0) {
        step = (long)json_integer_value(step_v);
        jb->last_step = step;
    } else {
        step = jb->last_step;
        json_object_set_new(o, "step", json_integer(step));
        changed = true;
    }
    /* a flood of metric lines is cut to max_events_per_s, and so is one of checkpoint lines,
     * on a bucket of their own: a chatty job's metrics never cost it a checkpoint (the end is
     * never cut) */
    bool is_checkpoint = strcmp(type, TD_EVENT_CHECKPOINT) == 0;
    td_rate_bucket *bucket = is_checkpoint ? &jb->checkpoint_rate : &jb->metric_rate;
    /* the shepherd's last line when the output file is full: said, once an attempt (a job can
     * print the same, but not past the buckets more often than that) */
    bool capped_line =
        strcmp(type, TD_EVENT_OUTPUT_CAPPED) == 0 && jb->capped_taken < jb->n_attempts;
    if (capped_line) jb->capped_taken++;
    if (strcmp(type, TD_EVENT_DONE) != 0 && !capped_line &&
        !td_runner_rate_admit(&j->runner, bucket)) {
        jb->events_dropped++;
        jb->dropped_unsaid++;
        td_jobs_stale(jb);
        json_decref(o);
        return false;
    }
    td_jobs_say_dropped(j, jb); /* before the line it precedes */
    const char *checkpoint = NULL;
    long long size = 0;
    char full[2 * PATH_MAX];
    if (strcmp(type, TD_EVENT_CHECKPOINT) == 0) {
        const char *path = json_string_value(json_object_get(o, "path"));
        /* relative to the job's directory, where its processes run; copied, as "path" is
         * replaced in o below */
        if (path && remote) { /* uploaded into the job's checkpoints/ under its own name */
            const char *base = strrchr(path, '/');
            snprintf(full, sizeof full, "%s/checkpoints/%s", jb->dir, base ? base + 1 : path);
            path = uploaded(j, jb, files) ? full : NULL;
            if (!path)
                td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                          "job %ld: checkpoint of step %ld did not arrive whole "
                          "from its node; not registered",
                          jb->row.id, step);
        } else if (path) {
            char cwd[PATH_MAX];
            td_identity who = td_jobs_identity(j, jb);
            td_runner_cwd_of(&who, jb->dir, cwd, sizeof cwd);
            snprintf(full, sizeof full, "%s%s%s", path[0] == '/' ? "" : cwd,
                     path[0] == '/' ? "" : "/", path);
            path = full;
        }
        if (path != full && path) { /* (full is where the path is made, and may be changed) */
            snprintf(full, sizeof full, "%s", path);
            path = full;
        }
        int walked = 0;
        bool registered = measure_checkpoint(j, jb, full, &size, &walked);
        /* the walk's cost: a hundred files are a line's worth (never below -burst, so a job
         * is held back, not locked out) */
        if (j->cfg.runner.max_events_per_s > 0) {
            td_rate_bucket *b = &jb->checkpoint_rate;
            b->tokens -= walked / 100.0;
            if (b->tokens < -10 * j->cfg.runner.max_events_per_s)
                b->tokens = -10 * j->cfg.runner.max_events_per_s;
        }
        if (registered) {
            path = full;
            checkpoint = path;
            json_object_set_new(o, "path", json_string(path));
            json_object_set_new(o, "size", json_integer(size));
            changed = true;
            jb->n_checkpoints++;
            td_jobs_set_checkpoint(jb, step, path);
            if (remote) jb->checkpoint_files = json_incref(files);
        }
    }
    if (strcmp(type, TD_EVENT_TRAIN) == 0) {
        json_decref(jb->latest_train);
        jb->latest_train = json_incref(o);
    } else if (strcmp(type, TD_EVENT_EVAL) == 0) {
        json_decref(jb->latest_eval);
        jb->latest_eval = json_incref(o);
    } else if (strcmp(type, TD_EVENT_DONE) == 0) {
        json_decref(jb->latest_done);
        jb->latest_done = json_incref(o);
    }
    bool metric = strcmp(type, TD_EVENT_CHECKPOINT) != 0;
    if (metric) jb->last_metric_at = td_clock_wall();
    /* kept as written unless it changed or holds a CR (which would break an SSE record) */
    bool raw = !changed && !memchr(line, '\r', n);
    td_jobs_emit(j, jb, type, o, raw ? line : NULL, step, metric, checkpoint, size);
    /* done repeats the last values as a summary: not a point of its own */
    if (metric && strcmp(type, TD_EVENT_DONE) != 0) td_jobs_tboard_event(j, jb, o, step);
    json_decref(o);
    return true;
}

typedef struct output_ctx {
    td_jobs *j;
    job *jb;
    bool unsaved;    /* a line moved the offset without an event to store it with */
    double deadline; /* monotonic: the turn's time for this job is up (a checkpoint's walk of
                        thousands of files costs what a thousand lines do) */
} output_ctx;

static bool output_line(void *ctx, char *line, size_t n, long long end) {
    output_ctx *o = ctx;
    o->jb->row.out_offset = end; /* stored with the line's event, in its transaction */
    /* (rank 0's log has the line already: its shepherd writes it there) */
    o->unsaved = !td_jobs_line_apply(o->j, o->jb, line, n, false, NULL);
    return td_clock_now() < o->deadline;
}

/* What one turn of the supervisor reads of a job's output at most, with the jobs' lock held:
 * a job printing as fast as it can is read a bounded slice at a time, and the API's requests
 * and the other jobs get the lock in between (its events go to the database in one
 * transaction a slice). */
enum { READ_BUDGET = 256 * 1024 };
#define READ_TIME_S 0.02 /* and at most this long */

bool td_jobs_read_output(td_jobs *j, job *jb, bool final, long long until) {
    /* while its events cannot be stored, the lines wait in the output file (the supervisor
     * reads on once they are) */
    if (jb->n_pending > 0 && !td_jobs_store_pending(j, jb)) return false;
    if (jb->out_fd < 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s.out", jb->sh.base);
        jb->out_fd = td_runner_open_output(j->log, jb->row.id, path);
    }
    output_ctx ctx = {j, jb, false, td_clock_now() + READ_TIME_S};
    jb->batching = true;
    bool more = td_runner_read_lines(jb->out_fd, &jb->out_read, final ? until : jb->sh.out_size,
                                     final, READ_BUDGET, &jb->line, output_line, &ctx);
    if (final && !more) td_jobs_say_dropped(j, jb); /* what the attempt's end leaves unsaid */
    jb->batching = false;
    td_jobs_store_pending(j, jb);
    if (ctx.unsaved && jb->n_pending == 0) { /* lines that were no events: not read again */
        td_err err = {{0}};
        if (td_db_update_job(j->db, &jb->row, &err) != 0)
            td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id), "job %ld: %s", jb->row.id,
                      err.msg);
    }
    jb->out_behind = more;
    return more;
}
