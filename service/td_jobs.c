#define _GNU_SOURCE /* pipe2, signalfd */
#include "service/td_jobs.h"

#include "service/td_ckpt.h"
#include "service/td_launch.h"
#include "service/td_strv.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

enum { QUEUED, RUNNING, RESTARTING, SUCCEEDED, FAILED, CANCELLED, N_STATES };
static const char *const STATE_NAMES[N_STATES] = {"queued",    "running", "restarting",
                                                  "succeeded", "failed",  "cancelled"};

typedef struct job {
    td_db_job row; /* what the database holds; row.state mirrors state */
    int state;
    td_db_attempt *attempts;
    int n_attempts, cap_attempts;
    json_t *latest_train, *latest_eval;
    int n_checkpoints;
    long last_step;  /* of rank 0's latest event with a step; given to events without one */
    long ckpt_step;  /* the latest registered checkpoint's step, -1: none */
    char *ckpt_path; /* and where it is (NULL: none) */
    char dir[PATH_MAX];
    char **argv, **env; /* what an attempt runs */
    char *json;         /* rendered job object; NULL when stale */

    bool cancel_requested;
    bool timed_out; /* stopped at resources.time_limit_s */
    bool active;    /* a group is running; holds nproc slots */
    int *devices;   /* GPU ids while active */
    td_group group;
    int out_fd; /* rank 0's stdout, read end; -1 when closed */
    td_buf line;
    long long *log_start; /* [nproc] each rank's log size when the attempt began */
} job;

struct td_jobs {
    td_jobs_config cfg;
    char *const *roots;
    td_db *db;
    FILE *log;
    pthread_mutex_t mu;
    pthread_cond_t changed; /* any event, state change or stop */
    job **jobs;             /* by id, ascending */
    int n_jobs, cap_jobs;
    int used_slots;
    bool *gpu_used;
    int wake_fd, sig_fd;
    pthread_t thread;
    bool started, stopping;
};

/* ---- time and JSON ---------------------------------------------------------------------- */

static double wall_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_REALTIME, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static json_t *time_json(double t) {
    if (t <= 0) return json_null();
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    char buf[64];
    size_t n = strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(buf + n, sizeof buf - n, ".%03dZ", (int)((t - (double)s) * 1000.0));
    return json_string(buf);
}

static json_t *code_json(int code) {
    return code >= 0 ? json_integer(code) : json_null();
}

static json_t *reason_json(const char *r) {
    return r[0] ? json_string(r) : json_null();
}

static const char *render(job *jb) {
    if (jb->json) return jb->json;
    json_t *attempts = json_array();
    for (int i = 0; i < jb->n_attempts; i++) {
        const td_db_attempt *a = &jb->attempts[i];
        json_array_append_new(attempts,
                              json_pack("{s:i, s:o, s:o, s:o, s:o}", "attempt", a->attempt,
                                        "started_at", time_json(a->started_at), "finished_at",
                                        time_json(a->finished_at), "exit_code",
                                        code_json(a->exit_code), "reason", reason_json(a->reason)));
    }
    json_t *o = json_pack(
        "{s:I, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:o, s:o, s:o, s:o, s:o, s:o, s:o, s:{s:O, s:O},"
        " s:i}",
        "id", (json_int_t)jb->row.id, "name", jb->row.name, "kind", jb->row.kind, "state",
        STATE_NAMES[jb->state], "nproc", jb->row.nproc, "priority", jb->row.priority,
        "max_restarts", jb->row.max_restarts, "restarts", jb->row.restarts, "time_limit_s",
        jb->row.time_limit_s > 0 ? json_real(jb->row.time_limit_s) : json_null(), "created_at",
        time_json(jb->row.created_at), "started_at", time_json(jb->row.started_at), "finished_at",
        time_json(jb->row.finished_at), "exit_code", code_json(jb->row.exit_code), "reason",
        reason_json(jb->row.reason), "attempts", attempts, "latest", "train",
        jb->latest_train ? jb->latest_train : json_null(), "eval",
        jb->latest_eval ? jb->latest_eval : json_null(), "checkpoints", jb->n_checkpoints);
    TD_ASSERT(o, "json_pack of a job failed (a bad UTF-8 name?)");
    /* the metrics as the worker printed them (%.9g), not as 17 digits */
    jb->json = json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(10));
    json_decref(o);
    TD_ASSERT(jb->json, "out of memory rendering a job");
    return jb->json;
}

static void stale(job *jb) {
    free(jb->json);
    jb->json = NULL;
}

/* ---- lookup and persistence (under mu) ---------------------------------------------------- */

static job *find(td_jobs *j, long id) {
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

static void add_job(td_jobs *j, job *jb) {
    if (j->n_jobs == j->cap_jobs) {
        j->cap_jobs = j->cap_jobs ? 2 * j->cap_jobs : 64;
        j->jobs = realloc(j->jobs, (size_t)j->cap_jobs * sizeof *j->jobs);
        TD_ASSERT(j->jobs, "out of memory adding a job");
    }
    j->jobs[j->n_jobs++] = jb;
}

static td_db_attempt *new_attempt(job *jb) {
    if (jb->n_attempts == jb->cap_attempts) {
        jb->cap_attempts = jb->cap_attempts ? 2 * jb->cap_attempts : 4;
        jb->attempts = realloc(jb->attempts, (size_t)jb->cap_attempts * sizeof *jb->attempts);
        TD_ASSERT(jb->attempts, "out of memory adding an attempt");
    }
    td_db_attempt *a = &jb->attempts[jb->n_attempts];
    *a = (td_db_attempt){.attempt = jb->n_attempts, .exit_code = -1};
    jb->n_attempts++;
    return a;
}

static void set_state(job *jb, int state) {
    jb->state = state;
    snprintf(jb->row.state, sizeof jb->row.state, "%s", STATE_NAMES[state]);
    stale(jb);
}

static bool final_state(int s) {
    return s == SUCCEEDED || s == FAILED || s == CANCELLED;
}

/* Appends an event (and the job row) to the database, then wakes the streams. */
/* raw: the event's text as the worker wrote it (kept byte for byte), or NULL to encode data */
static void emit(td_jobs *j, job *jb, const char *type, json_t *data, const char *raw, long step,
                 bool metric, const char *ckpt_path, long long ckpt_size) {
    char *text = raw ? strdup(raw) : json_dumps(data, JSON_COMPACT);
    TD_ASSERT(text, "out of memory encoding an event");
    jb->row.last_seq++;
    td_db_event ev = {jb->row.id, jb->row.last_seq, type, text, step, metric, ckpt_path, ckpt_size};
    td_err err = {{0}};
    if (td_db_add_event(j->db, &ev, &jb->row, &err) != 0)
        fprintf(j->log, "traind: job %ld: %s\n", jb->row.id, err.msg);
    free(text);
    stale(jb);
    pthread_cond_broadcast(&j->changed);
}

static void emit_state(td_jobs *j, job *jb) {
    json_t *d = json_pack("{s:s, s:o, s:o, s:i}", "state", STATE_NAMES[jb->state], "reason",
                          reason_json(jb->row.reason), "exit_code", code_json(jb->row.exit_code),
                          "attempt", jb->n_attempts > 0 ? jb->n_attempts - 1 : 0);
    emit(j, jb, "state", d, NULL, -1, false, NULL, 0);
    json_decref(d);
}

static void save_attempt(td_jobs *j, job *jb, const td_db_attempt *a) {
    td_err err = {{0}};
    if (td_db_save_attempt(j->db, jb->row.id, a, &err) != 0)
        fprintf(j->log, "traind: job %ld: %s\n", jb->row.id, err.msg);
}

/* ---- preparing what an attempt runs -------------------------------------------------------- */

/* A train job runs traind-worker on the spec in its directory, with no extra environment. */
static void set_worker_run(td_jobs *j, job *jb, const char *spec_path) {
    jb->argv = td_strv_new(2);
    jb->argv[0] = td_str_dup(j->cfg.worker);
    jb->argv[1] = td_str_dup(spec_path);
    jb->env = td_strv_new(0);
}

/* Writes the worker spec (with the daemon's checkpoint defaults) into the job directory and
 * sets argv/env. A train job's checkpoints go to its directory unless it names a place, and
 * one is taken every epoch unless it says when: a restart needs something to resume from. */
static int prepare_run(td_jobs *j, job *jb, td_submission *s, td_err *err) {
    if (mkdir(jb->dir, 0750) != 0 && errno != EEXIST)
        return td_fail(err, "cannot create %s: %s", jb->dir, strerror(errno));
    if (s->command) {
        jb->argv = s->argv;
        jb->env = s->env;
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
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/spec.json", jb->dir);
    if (json_dump_file(s->spec, path, JSON_INDENT(2)) != 0)
        return td_fail(err, "cannot write %s: %s", path, strerror(errno));
    set_worker_run(j, jb, path);
    return 0;
}

/* ---- attempts ------------------------------------------------------------------------------- */

static void release_slots(td_jobs *j, job *jb) {
    j->used_slots -= jb->row.nproc;
    if (jb->devices)
        for (int i = 0; i < jb->row.nproc; i++) j->gpu_used[jb->devices[i]] = false;
    free(jb->devices);
    jb->devices = NULL;
    jb->active = false;
}

static void finish(td_jobs *j, job *jb, int state, int code, const char *reason) {
    set_state(jb, state);
    jb->row.exit_code = code;
    snprintf(jb->row.reason, sizeof jb->row.reason, "%s", reason);
    jb->row.finished_at = wall_now();
    jb->row.pgid = 0;
    emit_state(j, jb);
    fprintf(j->log, "traind: job %ld %s%s%s\n", jb->row.id, STATE_NAMES[state],
            reason[0] ? ": " : "", reason);
}

/* Starts the job's next attempt on slots already reserved. */
static void start_attempt(td_jobs *j, job *jb) {
    int n = jb->row.nproc;
    td_db_attempt *a = new_attempt(jb);
    a->started_at = wall_now();
    int out_pipe[2] = {-1, -1};
    int stdout_fds[n], stderr_fds[n];
    char devices_text[n][16];
    const char *devices[n];
    td_err err = {{0}};
    for (int r = 0; r < n; r++) stdout_fds[r] = stderr_fds[r] = -1;
    int ok = pipe2(out_pipe, O_CLOEXEC) == 0;
    if (!ok) td_fail(&err, "pipe: %s", strerror(errno));
    free(jb->log_start);
    jb->log_start = td_calloc((size_t)n, sizeof *jb->log_start);
    for (int r = 0; ok && r < n; r++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/rank-%d.log", jb->dir, r);
        stderr_fds[r] = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        struct stat st;
        if (stderr_fds[r] < 0) {
            td_fail(&err, "cannot open %s: %s", path, strerror(errno));
            ok = 0;
        } else if (fstat(stderr_fds[r], &st) == 0) {
            jb->log_start[r] = (long long)st.st_size; /* this attempt's lines start here */
        }
        stdout_fds[r] = r == 0 ? out_pipe[1] : stderr_fds[r];
        if (jb->devices) {
            snprintf(devices_text[r], sizeof devices_text[r], "%d", jb->devices[r]);
            devices[r] = devices_text[r];
        }
    }
    char run_id[64], job_var[64], ckpt_var[PATH_MAX + 32];
    snprintf(run_id, sizeof run_id, "traind-job-%ld", jb->row.id);
    snprintf(job_var, sizeof job_var, "TRAIND_JOB_ID=%ld", jb->row.id);
    size_t n_env = 0;
    while (jb->env[n_env]) n_env++;
    char *env[n_env + 3];
    for (size_t i = 0; i < n_env; i++) env[i] = jb->env[i];
    env[n_env++] = job_var;
    /* a command restarts from its beginning: where its own latest checkpoint is lets a script
     * resume (traind-worker finds its checkpoints in checkpoint.dir itself) */
    if (jb->ckpt_path && strcmp(jb->row.kind, "command") == 0) {
        snprintf(ckpt_var, sizeof ckpt_var, "TRAIND_LATEST_CHECKPOINT=%s", jb->ckpt_path);
        env[n_env++] = ckpt_var;
    }
    env[n_env] = NULL;
    td_launch_config cfg = {.nproc_per_node = n,
                            .nnodes = 1,
                            .max_restarts = jb->row.max_restarts,
                            .grace_s = j->cfg.grace_s,
                            .argv = jb->argv,
                            .cwd = jb->dir,
                            .stdout_fds = stdout_fds,
                            .stderr_fds = stderr_fds,
                            .extra_env = env,
                            .devices = jb->devices ? devices : NULL};
    snprintf(cfg.master_addr, sizeof cfg.master_addr, "127.0.0.1");
    snprintf(cfg.run_id, sizeof cfg.run_id, "%s", run_id);
    if (ok && td_launch_free_port(&cfg.master_port, &err) != 0) ok = 0;
    if (ok && td_group_start(&jb->group, &cfg, a->attempt, &err) != 0) {
        ok = 0;
        if (jb->group.alive > 0) killpg(jb->group.pgid, SIGKILL); /* reaped by the loop */
    }
    for (int r = 0; r < n; r++)
        if (stderr_fds[r] >= 0) close(stderr_fds[r]);
    if (out_pipe[1] >= 0) close(out_pipe[1]);
    if (!ok) {
        if (out_pipe[0] >= 0) close(out_pipe[0]);
        jb->out_fd = -1;
        a->finished_at = wall_now();
        snprintf(a->reason, sizeof a->reason, "could not start: %.480s", err.msg);
        save_attempt(j, jb, a);
        if (jb->group.alive == 0) {
            td_group_free(&jb->group);
            release_slots(j, jb);
        }
        finish(j, jb, FAILED, -1, a->reason);
        return;
    }
    fcntl(out_pipe[0], F_SETFL, O_NONBLOCK);
    jb->out_fd = out_pipe[0];
    jb->line.len = 0;
    if (jb->row.started_at <= 0) jb->row.started_at = a->started_at;
    jb->row.pgid = jb->group.pgid;
    set_state(jb, RUNNING);
    save_attempt(j, jb, a);
    emit_state(j, jb);
    fprintf(j->log, "traind: job %ld attempt %d started: %d process%s, process group %d\n",
            jb->row.id, a->attempt, n, n == 1 ? "" : "es", (int)jb->group.pgid);
}

static bool reserve_slots(td_jobs *j, job *jb) {
    if (j->cfg.slots - j->used_slots < jb->row.nproc) return false;
    j->used_slots += jb->row.nproc;
    jb->active = true;
    if (j->cfg.gpus > 0) {
        jb->devices = td_calloc((size_t)jb->row.nproc, sizeof(int));
        for (int i = 0, k = 0; i < j->cfg.gpus && k < jb->row.nproc; i++)
            if (!j->gpu_used[i]) j->gpu_used[i] = true, jb->devices[k++] = i;
    }
    return true;
}

/* When the job's time limit ends (CLOCK_REALTIME seconds), or 0 without one. */
static double deadline_of(const job *jb) {
    return jb->row.time_limit_s > 0 && jb->row.started_at > 0
               ? jb->row.started_at + jb->row.time_limit_s
               : 0;
}

/* Queue order: higher priority first, then submission order. */
static bool runs_before(const job *a, const job *b) {
    return a->row.priority != b->row.priority ? a->row.priority > b->row.priority
                                              : a->row.id < b->row.id;
}

/* The earliest time the blocked job `head` could start, assuming each running job ends at its
 * time limit or, without one, at any moment (now): its "shadow" time, and how many slots would
 * be left over then. Backfilling into those spare slots, or with a job whose own limit ends
 * before the shadow time, cannot delay the head (EASY backfilling, as Slurm's backfill). */
static void head_shadow(td_jobs *j, const job *head, double now, double *shadow, int *spare) {
    int n = 0;
    double ends[j->n_jobs + 1]; /* + 1: never a VLA of 0 */
    int slots[j->n_jobs + 1];
    for (int i = 0; i < j->n_jobs; i++) {
        const job *jb = j->jobs[i];
        if (!jb->active) continue;
        double end = deadline_of(jb);
        int k = n++;
        for (; k > 0 && ends[k - 1] > (end > 0 ? end : now); k--)
            ends[k] = ends[k - 1], slots[k] = slots[k - 1];
        ends[k] = end > 0 ? end : now;
        slots[k] = jb->row.nproc;
    }
    int free_slots = j->cfg.slots - j->used_slots;
    *shadow = now;
    for (int i = 0; i < n && free_slots < head->row.nproc; i++) {
        free_slots += slots[i];
        *shadow = ends[i];
    }
    *spare = free_slots - head->row.nproc;
}

/* Recovered jobs first (they were running), then the queue by priority and age. The first job
 * that does not fit holds its place: a later one starts only where it cannot delay it. */
static void schedule(td_jobs *j) {
    for (int i = 0; i < j->n_jobs; i++) {
        job *jb = j->jobs[i];
        if (jb->state != RESTARTING || jb->active) continue;
        if (!reserve_slots(j, jb)) return;
        start_attempt(j, jb);
    }
    int n = 0;
    job *queue[j->n_jobs + 1];
    for (int i = 0; i < j->n_jobs; i++) {
        job *jb = j->jobs[i];
        if (jb->state != QUEUED) continue;
        int k = n++;
        for (; k > 0 && runs_before(jb, queue[k - 1]); k--) queue[k] = queue[k - 1];
        queue[k] = jb;
    }
    const job *head = NULL;
    double shadow = 0, now = wall_now();
    int spare = 0;
    for (int i = 0; i < n; i++) {
        job *jb = queue[i];
        if (!head) {
            if (reserve_slots(j, jb)) {
                start_attempt(j, jb);
                continue;
            }
            head = jb;
            head_shadow(j, head, now, &shadow, &spare);
            continue;
        }
        if (j->cfg.slots - j->used_slots < jb->row.nproc) continue;
        bool ends_in_time =
            jb->row.time_limit_s > 0 && shadow > now && now + jb->row.time_limit_s <= shadow;
        if (!ends_in_time && jb->row.nproc > spare) continue;
        if (!ends_in_time) spare -= jb->row.nproc;
        reserve_slots(j, jb);
        fprintf(j->log, "traind: job %ld starts ahead of job %ld (backfill: %s)\n", jb->row.id,
                head->row.id,
                ends_in_time ? "its time limit ends before that job could start"
                             : "it uses slots that job would leave free");
        start_attempt(j, jb);
    }
}

/* What a restarted attempt starts from, in words, for the restart event and the job's reason:
 * traind-worker resumes from its newest checkpoint by itself; a command starts from its beginning
 * and gets its latest registered checkpoint in TRAIND_LATEST_CHECKPOINT. */
static void resume_note(const job *jb, char *out, size_t len) {
    bool command = strcmp(jb->row.kind, "command") == 0;
    if (!jb->ckpt_path)
        snprintf(out, len, "%s",
                 command ? "the command starts again from scratch (it registered no checkpoint)"
                         : "starting from scratch (no checkpoint had been written)");
    else if (command)
        snprintf(out, len,
                 "the command starts again from its beginning; its latest checkpoint (step %ld) "
                 "is given to it as TRAIND_LATEST_CHECKPOINT",
                 jb->ckpt_step);
    else
        snprintf(out, len, "resuming from its newest checkpoint (the latest registered: step %ld)",
                 jb->ckpt_step);
}

static json_t *resume_json(const job *jb) {
    return jb->ckpt_path
               ? json_pack("{s:I, s:s}", "step", (json_int_t)jb->ckpt_step, "path", jb->ckpt_path)
               : json_null();
}

/* The failing rank's own words for the job record, from its log lines of this attempt:
 * traind-worker's first "error:" line, or else (any program, e.g. Python's exception line) the
 * last line that is not a metric. Empty when there is none (a process killed by a signal). */
static void worker_message(const job *jb, int rank, char *out, size_t len) {
    static const char PREFIX[] = "traind-worker: error: ";
    out[0] = 0;
    if (!jb->log_start || rank < 0 || rank >= jb->row.nproc) return;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rank-%d.log", jb->dir, rank);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return;
    }
    const long long cap = 1 << 20; /* the attempt's last MiB holds its end */
    long long from = jb->log_start[rank], size = (long long)st.st_size;
    if (size - from > cap) from = size - cap;
    if (size <= from) {
        close(fd);
        return;
    }
    char *text = td_malloc((size_t)(size - from) + 1);
    ssize_t got = pread(fd, text, (size_t)(size - from), (off_t)from);
    close(fd);
    text[got > 0 ? got : 0] = 0;
    const char *last = NULL;
    size_t last_len = 0;
    for (char *line = text, *next; *line; line = next) {
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : line + strlen(line);
        size_t n = (size_t)(next - line) - (nl ? 1 : 0);
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
        if (n > sizeof PREFIX - 1 && strncmp(line, PREFIX, sizeof PREFIX - 1) == 0) {
            snprintf(out, len, "%.*s", (int)(n - (sizeof PREFIX - 1)), line + sizeof PREFIX - 1);
            free(text);
            return;
        }
        if (n && line[0] != '{') last = line, last_len = n;
    }
    if (last && strcmp(jb->row.kind, "command") == 0)
        snprintf(out, len, "%.*s", (int)last_len, last);
    free(text);
}

/* The attempt's processes are all gone: decide what comes next. */
static void attempt_over(td_jobs *j, job *jb) {
    td_db_attempt *a = &jb->attempts[jb->n_attempts - 1];
    td_group *g = &jb->group;
    a->finished_at = wall_now();
    /* a failure's own status, else (stopped on request or at the time limit) the status the
     * processes ended with: 137 for one that needed SIGKILL after the grace period */
    int code = g->first_failure ? g->first_failure : g->stop_status;
    char reason[1024], own[320];
    if (g->first_failure) {
        worker_message(jb, g->failed_rank, own, sizeof own);
        snprintf(reason, sizeof reason, "%s%s%s", g->reason, own[0] ? ": " : "", own);
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
        snprintf(reason + strlen(reason), sizeof reason - strlen(reason), "%s%s",
                 reason[0] ? "; " : "", g->grace_note);
    a->exit_code = code;
    snprintf(a->reason, sizeof a->reason, "%s", reason);
    save_attempt(j, jb, a);
    td_group_free(g);
    if (jb->cancel_requested) {
        release_slots(j, jb);
        finish(j, jb, CANCELLED, code, reason);
    } else if (jb->timed_out) {
        release_slots(j, jb);
        finish(j, jb, FAILED, code, reason);
    } else if (code == 0) {
        release_slots(j, jb);
        finish(j, jb, SUCCEEDED, 0, "");
    } else if (jb->row.restarts < jb->row.max_restarts) {
        jb->row.restarts++;
        set_state(jb, RESTARTING);
        char note[256];
        resume_note(jb, note, sizeof note);
        snprintf(jb->row.reason, sizeof jb->row.reason, "%.300s; restart %d of %d, %s", reason,
                 jb->row.restarts, jb->row.max_restarts, note);
        json_t *d = json_pack("{s:i, s:i, s:s, s:i, s:o}", "attempt", jb->n_attempts, "restarts",
                              jb->row.restarts, "reason", jb->row.reason, "exit_code", code,
                              "resume_from", resume_json(jb));
        emit(j, jb, "restart", d, NULL, -1, false, NULL, 0);
        json_decref(d);
        emit_state(j, jb);
        fprintf(j->log, "traind: job %ld: %s\n", jb->row.id, jb->row.reason);
        start_attempt(j, jb); /* keeps its slots */
    } else {
        char why[1200];
        snprintf(why, sizeof why, "%s (attempt %d; %d restart%s allowed)", reason, jb->n_attempts,
                 jb->row.max_restarts, jb->row.max_restarts == 1 ? "" : "s");
        release_slots(j, jb);
        finish(j, jb, FAILED, code, why);
    }
}

/* ---- rank 0's stdout ---------------------------------------------------------------------- */

static void append_rank0_log(job *jb, const char *line, size_t n) {
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rank-0.log", jb->dir);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) return;
    (void)!write(fd, line, n);
    (void)!write(fd, "\n", 1);
    close(fd);
}

static void set_latest_checkpoint(job *jb, long step, const char *path) {
    free(jb->ckpt_path);
    jb->ckpt_path = td_str_dup(path);
    jb->ckpt_step = step;
}

/* A checkpoint event's path: a directory (traind-worker's step-N/, or any a command writes) or
 * one file (a command's torch.save). Registered with its total size when it exists. */
static bool checkpoint_size(const char *path, long long *size) {
    struct stat st;
    if (!path || !*path || stat(path, &st) != 0) return false;
    if (S_ISREG(st.st_mode)) {
        *size = (long long)st.st_size;
        return true;
    }
    if (!S_ISDIR(st.st_mode)) return false;
    td_err err = {{0}};
    td_ckpt_file *files = NULL;
    int n = 0;
    if (td_ckpt_list(path, &files, &n, &err) != 0) return false;
    *size = 0;
    for (int i = 0; i < n; i++) *size += files[i].size;
    td_ckpt_files_free(files, n);
    return true;
}

/* A line of rank 0's stdout: a JSON object with a string "event" is an event, and a metric
 * unless it is a checkpoint. An event without an integer "step" gets the step of the latest one
 * that had one (0 before any), so every metric has a place on the step axis. */
static void on_line(td_jobs *j, job *jb, char *line, size_t n) {
    append_rank0_log(jb, line, n);
    json_error_t jerr;
    json_t *o = json_loadb(line, n, 0, &jerr);
    const char *type = o ? json_string_value(json_object_get(o, "event")) : NULL;
    if (!o || !json_is_object(o) || !type || !*type || strlen(type) > 64 ||
        strpbrk(type, "\r\n:")) {
        json_decref(o);
        return;
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
    const char *ckpt = NULL;
    long long size = 0;
    char full[2 * PATH_MAX];
    if (strcmp(type, "checkpoint") == 0) {
        const char *path = json_string_value(json_object_get(o, "path"));
        /* relative to the job's directory, where its processes run; copied, as "path" is
         * replaced in o below */
        if (path) {
            snprintf(full, sizeof full, "%s%s%s", path[0] == '/' ? "" : jb->dir,
                     path[0] == '/' ? "" : "/", path);
            path = full;
        }
        if (checkpoint_size(path, &size)) {
            ckpt = path;
            json_object_set_new(o, "path", json_string(path));
            json_object_set_new(o, "size", json_integer(size));
            changed = true;
            jb->n_checkpoints++;
            set_latest_checkpoint(jb, step, path);
        }
    }
    if (strcmp(type, "train") == 0) {
        json_decref(jb->latest_train);
        jb->latest_train = json_incref(o);
    } else if (strcmp(type, "eval") == 0) {
        json_decref(jb->latest_eval);
        jb->latest_eval = json_incref(o);
    }
    bool metric = strcmp(type, "checkpoint") != 0;
    /* kept as written unless it changed or holds a CR (which would break an SSE record) */
    bool raw = !changed && !memchr(line, '\r', n);
    emit(j, jb, type, o, raw ? line : NULL, step, metric, ckpt, size);
    json_decref(o);
}

/* Reads what rank 0 wrote; closes the pipe at its end. */
static void read_output(td_jobs *j, job *jb) {
    char buf[65536];
    for (;;) {
        ssize_t k = read(jb->out_fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK)) {
                if (jb->line.len) on_line(j, jb, jb->line.data, jb->line.len);
                jb->line.len = 0;
                close(jb->out_fd);
                jb->out_fd = -1;
            }
            return;
        }
        td_buf_append(&jb->line, buf, (size_t)k);
        char *start = jb->line.data, *nl;
        while ((nl = memchr(start, '\n', jb->line.len - (size_t)(start - jb->line.data)))) {
            *nl = 0;
            on_line(j, jb, start, (size_t)(nl - start));
            start = nl + 1;
        }
        size_t rest = jb->line.len - (size_t)(start - jb->line.data);
        memmove(jb->line.data, start, rest);
        jb->line.len = rest;
        jb->line.data[rest] = 0;
        if (rest > (1u << 20)) { /* a runaway line: keep the log, not the memory */
            append_rank0_log(jb, jb->line.data, rest);
            jb->line.len = 0;
        }
    }
}

/* ---- the supervisor ----------------------------------------------------------------------- */

static void reap(td_jobs *j) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) return;
        for (int i = 0; i < j->n_jobs; i++) {
            job *jb = j->jobs[i];
            if (jb->active && jb->group.pids &&
                td_group_reaped(&jb->group, pid, status, j->cfg.grace_s))
                break;
        }
    }
}

static void *supervise(void *arg) {
    td_jobs *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stopping) {
        schedule(j);
        int n = 0;
        struct pollfd fds[2 + j->n_jobs];
        job *owner[2 + j->n_jobs];
        fds[n++] = (struct pollfd){j->wake_fd, POLLIN, 0};
        fds[n++] = (struct pollfd){j->sig_fd, POLLIN, 0};
        bool ticking = false;
        double now = wall_now(), next_limit = 0;
        for (int i = 0; i < j->n_jobs; i++) {
            job *jb = j->jobs[i];
            if (!jb->active) continue;
            ticking |= jb->group.terminating || jb->cancel_requested;
            double limit = deadline_of(jb);
            if (limit > 0 && !jb->timed_out && (next_limit == 0 || limit < next_limit))
                next_limit = limit;
            if (jb->out_fd >= 0) owner[n] = jb, fds[n++] = (struct pollfd){jb->out_fd, POLLIN, 0};
        }
        /* kill deadlines and time limits are the only things without a file descriptor to
         * wake us */
        int timeout_ms = ticking ? 100 : -1;
        if (next_limit > 0) {
            double ms = (next_limit - now) * 1000.0 + 1.0;
            int until = ms < 0 ? 0 : ms > 60000 ? 60000 : (int)ms;
            if (timeout_ms < 0 || until < timeout_ms) timeout_ms = until;
        }
        pthread_mutex_unlock(&j->mu);
        int rc = poll(fds, (nfds_t)n, timeout_ms);
        pthread_mutex_lock(&j->mu);
        if (rc < 0 && errno != EINTR) {
            fprintf(j->log, "traind: poll: %s\n", strerror(errno));
            continue;
        }
        if (fds[0].revents) {
            uint64_t v;
            (void)!read(j->wake_fd, &v, sizeof v);
        }
        if (fds[1].revents) {
            struct signalfd_siginfo si;
            while (read(j->sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
            }
        }
        reap(j);
        for (int i = 2; i < n; i++)
            if (fds[i].revents && owner[i]->out_fd >= 0) read_output(j, owner[i]);
        for (int i = 0; i < j->n_jobs; i++) {
            job *jb = j->jobs[i];
            if (!jb->active || !jb->group.pids) continue;
            double limit = deadline_of(jb);
            if (limit > 0 && !jb->timed_out && !jb->cancel_requested && wall_now() >= limit) {
                jb->timed_out = true;
                fprintf(j->log, "traind: job %ld reached its time limit of %g s: stopping it\n",
                        jb->row.id, jb->row.time_limit_s);
            }
            if ((jb->cancel_requested || jb->timed_out) && !jb->group.terminating)
                td_group_terminate(&jb->group, SIGTERM, j->cfg.grace_s);
            td_group_tick(&jb->group);
            if (jb->group.alive == 0) {
                if (jb->out_fd >= 0) read_output(j, jb); /* what is left in the pipe */
                if (jb->out_fd >= 0) {                   /* a stray holder: stop reading */
                    close(jb->out_fd);
                    jb->out_fd = -1;
                }
                attempt_over(j, jb);
            }
        }
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

static void wake(td_jobs *j) {
    uint64_t one = 1;
    (void)!write(j->wake_fd, &one, sizeof one);
}

/* ---- opening: load and recover ------------------------------------------------------------ */

static job *new_job(td_jobs *j, const td_db_job *row) {
    job *jb = td_calloc(1, sizeof *jb);
    jb->row = *row;
    jb->out_fd = -1;
    jb->ckpt_step = -1;
    jb->state = QUEUED;
    for (int s = 0; s < N_STATES; s++)
        if (strcmp(row->state, STATE_NAMES[s]) == 0) jb->state = s;
    snprintf(jb->dir, sizeof jb->dir, "%s/jobs/%ld", j->cfg.state_dir, row->id);
    return jb;
}

typedef struct load_ctx {
    td_jobs *j;
} load_ctx;

static void load_one(void *ctx, const td_db_job *row, const td_db_attempt *attempts, int n) {
    td_jobs *j = ((load_ctx *)ctx)->j;
    job *jb = new_job(j, row);
    for (int i = 0; i < n; i++) *new_attempt(jb) = attempts[i];
    add_job(j, jb);
}

/* Metrics and checkpoints a job had, for its JSON: read back from the event log. */
static void load_latest(td_jobs *j, job *jb) {
    td_buf b = {0};
    long last = 0;
    td_err err = {{0}};
    if (td_db_events_sse(j->db, jb->row.id, 0, INT_MAX, &b, &last, &err) != 0) {
        td_buf_free(&b);
        return;
    }
    for (char *p = b.data; p && (p = strstr(p, "event: "));) {
        char *type = p + 7, *nl = strchr(type, '\n');
        if (!nl) break;
        char *data = nl + 1 + 6, *end = strchr(data, '\n');
        if (!end) break;
        *nl = *end = 0;
        json_t *o = json_loads(data, 0, NULL);
        json_t *step = json_object_get(o, "step");
        bool ours = !strcmp(type, "state") || !strcmp(type, "restart"); /* the daemon's */
        if (!ours && json_is_integer(step)) jb->last_step = (long)json_integer_value(step);
        if (strcmp(type, "train") == 0) {
            json_decref(jb->latest_train), jb->latest_train = o, o = NULL;
        } else if (strcmp(type, "eval") == 0) {
            json_decref(jb->latest_eval), jb->latest_eval = o, o = NULL;
        } else if (strcmp(type, "checkpoint") == 0 && json_object_get(o, "size")) {
            jb->n_checkpoints++;
            const char *path = json_string_value(json_object_get(o, "path"));
            if (path) set_latest_checkpoint(jb, (long)json_integer_value(step), path);
        }
        json_decref(o);
        p = end + 1;
    }
    td_buf_free(&b);
}

/* A job the previous daemon was running: its workers died with it (PR_SET_PDEATHSIG), or are
 * killed now if they somehow outlived it; the job goes on from its latest checkpoint. */
static void recover(td_jobs *j, job *jb) {
    if (jb->row.pgid > 0 && killpg((pid_t)jb->row.pgid, 0) == 0)
        killpg((pid_t)jb->row.pgid, SIGKILL);
    if (jb->n_attempts > 0 && jb->attempts[jb->n_attempts - 1].finished_at <= 0) {
        td_db_attempt *a = &jb->attempts[jb->n_attempts - 1];
        a->finished_at = wall_now();
        snprintf(a->reason, sizeof a->reason, "the daemon stopped while this attempt ran");
        save_attempt(j, jb, a);
    }
    jb->row.pgid = 0;
    set_state(jb, RESTARTING);
    char note[256];
    resume_note(jb, note, sizeof note);
    snprintf(jb->row.reason, sizeof jb->row.reason,
             "the daemon restarted while the job ran; %s (not counted against max_restarts)", note);
    json_t *d =
        json_pack("{s:i, s:i, s:s, s:o}", "attempt", jb->n_attempts, "restarts", jb->row.restarts,
                  "reason", jb->row.reason, "resume_from", resume_json(jb));
    emit(j, jb, "restart", d, NULL, -1, false, NULL, 0);
    json_decref(d);
    emit_state(j, jb);
    fprintf(j->log, "traind: job %ld was running when the daemon stopped: restarting it\n",
            jb->row.id);
}

/* Re-reads what a stored job runs (its spec is in the database, its worker spec on disk). */
static int rebuild_run(td_jobs *j, job *jb, td_err *err) {
    if (strcmp(jb->row.kind, "command") != 0) {
        char path[PATH_MAX + 16];
        snprintf(path, sizeof path, "%s/spec.json", jb->dir);
        set_worker_run(j, jb, path);
        return access(path, R_OK) == 0 ? 0 : td_fail(err, "%s is gone", path);
    }
    td_submission s;
    td_reply_error e;
    td_submit_rules rules = j->cfg.rules;
    rules.slots = INT_MAX;
    if (td_submission_parse(&s, jb->row.spec, strlen(jb->row.spec), &rules, &e) != 0)
        return td_fail(err, "its stored spec no longer parses: %s", e.message);
    jb->argv = s.argv;
    jb->env = s.env;
    s.argv = s.env = NULL;
    td_submission_free(&s);
    return 0;
}

int td_jobs_open(td_jobs **out, const td_jobs_config *cfg, td_db *db, FILE *log, td_err *err) {
    td_jobs *j = td_calloc(1, sizeof *j);
    j->cfg = *cfg;
    j->db = db;
    j->log = log;
    j->wake_fd = j->sig_fd = -1;
    pthread_mutex_init(&j->mu, NULL);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&j->changed, &ca);
    pthread_condattr_destroy(&ca);
    if (cfg->gpus > 0) j->gpu_used = td_calloc((size_t)cfg->gpus, sizeof(bool));
    char jobs_dir[PATH_MAX];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", cfg->state_dir);
    if (mkdir(jobs_dir, 0750) != 0 && errno != EEXIST) {
        td_fail(err, "cannot create %s: %s", jobs_dir, strerror(errno));
        goto fail;
    }
    load_ctx ctx = {j};
    if (td_db_load_jobs(db, load_one, &ctx, err) != 0) goto fail;
    for (int i = 0; i < j->n_jobs; i++) {
        job *jb = j->jobs[i];
        load_latest(j, jb);
        if (final_state(jb->state)) continue;
        td_err why = {{0}};
        if (rebuild_run(j, jb, &why) != 0) {
            char reason[TD_ERR_MAX + 64];
            snprintf(reason, sizeof reason, "cannot run after a daemon restart: %s", why.msg);
            finish(j, jb, FAILED, -1, reason);
            continue;
        }
        if (jb->state == RUNNING || jb->state == RESTARTING) recover(j, jb);
    }
    *out = j;
    return 0;
fail:
    td_jobs_close(j);
    return -1;
}

int td_jobs_start(td_jobs *j, td_err *err) {
    j->wake_fd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    j->sig_fd = signalfd(-1, &chld, SFD_CLOEXEC | SFD_NONBLOCK);
    if (j->wake_fd < 0 || j->sig_fd < 0)
        return td_fail(err, "eventfd/signalfd: %s", strerror(errno));
    int rc = pthread_create(&j->thread, NULL, supervise, j);
    if (rc != 0) return td_fail(err, "starting the supervisor thread: %s", strerror(rc));
    j->started = true;
    return 0;
}

static void free_job(job *jb) {
    free(jb->row.spec);
    free(jb->attempts);
    json_decref(jb->latest_train);
    json_decref(jb->latest_eval);
    free(jb->ckpt_path);
    free(jb->log_start);
    td_strv_free(jb->argv);
    td_strv_free(jb->env);
    free(jb->json);
    free(jb->devices);
    td_group_free(&jb->group);
    td_buf_free(&jb->line);
    if (jb->out_fd >= 0) close(jb->out_fd);
    free(jb);
}

void td_jobs_stop(td_jobs *j) {
    pthread_mutex_lock(&j->mu);
    j->stopping = true;
    pthread_cond_broadcast(&j->changed);
    pthread_mutex_unlock(&j->mu);
    if (j->started) {
        wake(j);
        pthread_join(j->thread, NULL);
        j->started = false;
    }
}

void td_jobs_close(td_jobs *j) {
    if (!j) return;
    td_jobs_stop(j);
    /* the workers go with the daemon; their jobs stay "running" and resume at the next start */
    for (int i = 0; i < j->n_jobs; i++) {
        job *jb = j->jobs[i];
        if (jb->active && jb->group.pids && jb->group.alive > 0) killpg(jb->group.pgid, SIGKILL);
        free_job(jb);
    }
    free(j->jobs);
    free(j->gpu_used);
    if (j->wake_fd >= 0) close(j->wake_fd);
    if (j->sig_fd >= 0) close(j->sig_fd);
    pthread_cond_destroy(&j->changed);
    pthread_mutex_destroy(&j->mu);
    free(j);
}

/* ---- the API side --------------------------------------------------------------------------- */

static int not_found(td_reply_error *e, long id) {
    return td_reply_fail(e, 404, "not_found", NULL, "there is no job %ld", id);
}

int td_jobs_submit(td_jobs *j, const char *body, size_t len, td_buf *out, long *id,
                   td_reply_error *e) {
    td_submission s;
    if (td_submission_parse(&s, body, len, &j->cfg.rules, e) != 0) return -1;
    td_db_job row = {.nproc = s.nproc,
                     .max_restarts = s.max_restarts,
                     .priority = s.priority,
                     .time_limit_s = s.time_limit_s,
                     .exit_code = -1};
    snprintf(row.name, sizeof row.name, "%s", s.name);
    snprintf(row.kind, sizeof row.kind, "%s", s.command ? "command" : "train");
    snprintf(row.state, sizeof row.state, "queued");
    row.spec = malloc(len + 1);
    TD_ASSERT(row.spec, "out of memory storing a spec");
    memcpy(row.spec, body, len);
    row.spec[len] = 0;
    row.created_at = wall_now();
    td_err err = {{0}};
    pthread_mutex_lock(&j->mu);
    if (td_db_insert_job(j->db, &row, &err) != 0) {
        pthread_mutex_unlock(&j->mu);
        free(row.spec);
        td_submission_free(&s);
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    }
    job *jb = new_job(j, &row);
    int rc = prepare_run(j, jb, &s, &err);
    add_job(j, jb);
    if (rc != 0) {
        finish(j, jb, FAILED, -1, err.msg);
    } else {
        emit_state(j, jb);
        wake(j);
    }
    td_buf_puts(out, render(jb));
    *id = jb->row.id;
    pthread_mutex_unlock(&j->mu);
    td_submission_free(&s);
    return 0;
}

int td_jobs_get(td_jobs *j, long id, td_buf *out, td_reply_error *e) {
    pthread_mutex_lock(&j->mu);
    job *jb = find(j, id);
    if (jb) td_buf_puts(out, render(jb));
    pthread_mutex_unlock(&j->mu);
    return jb ? 0 : not_found(e, id);
}

int td_jobs_exists(td_jobs *j, long id, td_reply_error *e) {
    pthread_mutex_lock(&j->mu);
    job *jb = find(j, id);
    pthread_mutex_unlock(&j->mu);
    return jb ? 0 : not_found(e, id);
}

unsigned td_jobs_state_bit(const char *state) {
    for (int s = 0; s < N_STATES; s++)
        if (strcmp(state, STATE_NAMES[s]) == 0) return 1u << s;
    return 0;
}

void td_jobs_list(td_jobs *j, unsigned states, int limit, int offset, td_buf *out) {
    pthread_mutex_lock(&j->mu);
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
        td_buf_puts(out, render(jb));
    }
    if (more)
        td_buf_printf(out, "],\"next_offset\":%d}\n", offset + limit);
    else
        td_buf_puts(out, "],\"next_offset\":null}\n");
    pthread_mutex_unlock(&j->mu);
}

static void deadline_in(struct timespec *ts, double s) {
    clock_gettime(CLOCK_MONOTONIC, ts);
    double t = (double)ts->tv_sec + (double)ts->tv_nsec * 1e-9 + s;
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

int td_jobs_cancel(td_jobs *j, long id, td_buf *out, td_reply_error *e) {
    pthread_mutex_lock(&j->mu);
    job *jb = find(j, id);
    int rc = 0;
    if (!jb) {
        rc = not_found(e, id);
    } else if (final_state(jb->state)) {
        rc = td_reply_fail(e, 409, "conflict", NULL, "job %ld has already %s", id,
                           STATE_NAMES[jb->state]);
    } else if (!jb->active) { /* queued, or waiting to be restarted */
        jb->cancel_requested = true;
        finish(j, jb, CANCELLED, -1, "cancelled by request");
    } else {
        jb->cancel_requested = true;
        wake(j);
        struct timespec until;
        deadline_in(&until, j->cfg.grace_s + 30.0);
        while (!final_state(jb->state) && !j->stopping &&
               pthread_cond_timedwait(&j->changed, &j->mu, &until) != ETIMEDOUT) {
        }
        if (!final_state(jb->state))
            rc = td_reply_fail(e, 503, "unavailable", NULL, "job %ld is still stopping; ask again",
                               id);
    }
    if (rc == 0) td_buf_puts(out, render(jb));
    pthread_mutex_unlock(&j->mu);
    return rc;
}

int td_jobs_wait(td_jobs *j, long id, long after, double timeout_s, long *last_seq, bool *ended) {
    pthread_mutex_lock(&j->mu);
    job *jb = find(j, id);
    if (!jb) {
        pthread_mutex_unlock(&j->mu);
        return -1;
    }
    struct timespec until;
    deadline_in(&until, timeout_s);
    while (jb->row.last_seq <= after && !final_state(jb->state) && !j->stopping &&
           pthread_cond_timedwait(&j->changed, &j->mu, &until) != ETIMEDOUT) {
    }
    *last_seq = jb->row.last_seq;
    *ended = final_state(jb->state) || j->stopping;
    pthread_mutex_unlock(&j->mu);
    return 0;
}

int td_jobs_log_path(td_jobs *j, long id, int rank, char *path, size_t len, td_reply_error *e) {
    pthread_mutex_lock(&j->mu);
    job *jb = find(j, id);
    int nproc = jb ? jb->row.nproc : 0;
    if (jb) snprintf(path, len, "%s/rank-%d.log", jb->dir, rank);
    pthread_mutex_unlock(&j->mu);
    if (!jb) return not_found(e, id);
    if (rank < 0 || rank >= nproc)
        return td_reply_fail(e, 404, "not_found", "rank", "job %ld has ranks 0 to %d, not %d", id,
                             nproc - 1, rank);
    return 0;
}

td_db *td_jobs_db(td_jobs *j) {
    return j->db;
}

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)ftw;
    return (type == FTW_DP ? rmdir(path) : unlink(path)) == 0 || errno == ENOENT ? 0 : -1;
}

int td_jobs_delete(td_jobs *j, long id, td_reply_error *e) {
    pthread_mutex_lock(&j->mu);
    int at = -1;
    for (int i = 0; i < j->n_jobs; i++)
        if (j->jobs[i]->row.id == id) at = i;
    if (at < 0) {
        pthread_mutex_unlock(&j->mu);
        return not_found(e, id);
    }
    job *jb = j->jobs[at];
    if (!final_state(jb->state)) {
        int rc = td_reply_fail(e, 409, "conflict", NULL,
                               "job %ld is %s: only a finished job can be deleted (cancel it "
                               "first: POST /v1/jobs/%ld/cancel)",
                               id, STATE_NAMES[jb->state], id);
        pthread_mutex_unlock(&j->mu);
        return rc;
    }
    td_err err = {{0}};
    if (td_db_delete_job(j->db, id, &err) != 0) {
        pthread_mutex_unlock(&j->mu);
        return td_reply_fail(e, 500, "internal", NULL, "%s", err.msg);
    }
    /* out of the way at once (a rename), removed after the lock is let go: a job's files can
     * be gigabytes of checkpoints */
    char doomed[PATH_MAX + 32];
    snprintf(doomed, sizeof doomed, "%s/jobs/.deleted-%ld", j->cfg.state_dir, id);
    bool moved = rename(jb->dir, doomed) == 0;
    if (!moved && errno != ENOENT)
        fprintf(j->log, "traind: job %ld: cannot move %s aside: %s\n", id, jb->dir,
                strerror(errno));
    memmove(&j->jobs[at], &j->jobs[at + 1], (size_t)(j->n_jobs - at - 1) * sizeof *j->jobs);
    j->n_jobs--;
    pthread_cond_broadcast(&j->changed); /* its streams end */
    free_job(jb);
    pthread_mutex_unlock(&j->mu);
    if (moved && nftw(doomed, remove_entry, 16, FTW_DEPTH | FTW_PHYS) != 0)
        fprintf(j->log, "traind: job %ld: cannot remove all of %s: %s\n", id, doomed,
                strerror(errno));
    fprintf(j->log, "traind: job %ld deleted\n", id);
    return 0;
}
