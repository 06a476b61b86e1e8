/* The parts this node runs for its master (a "guest" each: one node's group of a job's attempt),
 * on an agent and on the master's own node alike. The master's orders say which parts should run
 * (td_job_place.c builds them); this file starts what is missing, stops what is no longer wanted
 * or told to stop, and reports each part: running or ended (with its first failure in words),
 * rank 0's lines not yet acknowledged, and, from an agent, the tail of every rank's log.
 *
 * Orders are the whole wanted state, not commands: a lost reply, a master restart or a node back
 * from a partition converges on the next exchange, and a part the master no longer knows is
 * stopped at once. A part's lines carry sequence numbers within the attempt and logs their byte
 * offsets, so resending after a drop can neither lose nor repeat anything. */
#define _GNU_SOURCE /* pipe2 */
#include "service/td_jobs_private.h"

#include "base/td_strv.h"
#include "train/td_metrics.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    REPORT_LINES = 256,     /* rank 0's lines per message at most */
    REPORT_LOG = 64 * 1024, /* bytes of one rank's log per message at most */
    /* bytes of lines and logs in one message, all parts together: well under the API's smallest
     * body limit; the rest goes in the next message, sent at once */
    REPORT_BUDGET = 384 * 1024,
    /* rank 0's lines a node holds for its master at most (bytes): minutes of any real job's
     * metrics; a flood beyond it waits in no memory */
    GUEST_BACKLOG_BYTES = 16 * 1024 * 1024
};

static guest *find_guest(td_jobs *j, long job_id, int attempt) {
    for (int i = 0; i < j->n_guests; i++)
        if (j->guests[i]->job == job_id && j->guests[i]->attempt == attempt) return j->guests[i];
    return NULL;
}

static void free_guest(guest *g) {
    for (int i = 0; i < g->n_lines; i++) {
        free(g->lines[i].text);
        free(g->lines[i].ckpt);
        json_decref(g->lines[i].files);
    }
    free(g->lines);
    free(g->devices);
    free(g->log_start);
    free(g->log_sent);
    td_shepherd_close(&g->sh);
    td_buf_free(&g->line);
    if (g->out_fd >= 0) close(g->out_fd);
    free(g);
}

void td_jobs_guests_free(td_jobs *j) {
    for (int i = 0; i < j->n_guests; i++) free_guest(j->guests[i]); /* their shepherds go on */
    free(j->guests);
    j->guests = NULL;
    j->n_guests = 0;
}

/* ---- output ---------------------------------------------------------------------------------- */

/* A line of rank 0: kept until the master acknowledges it. On an agent a checkpoint line waits
 * for its files to be uploaded first (td_agent.c), so the master registers only what it has. */
static void keep_line(td_jobs *j, guest *g, const char *line, size_t n) {
    /* (rank 0's log has it already: the shepherd writes every line there) */
    json_t *o = json_loadb(line, n, 0, NULL);
    const char *ev = json_string_value(json_object_get(o, "event"));
    const char *path = json_string_value(json_object_get(o, "path"));
    bool checkpoint = ev && strcmp(ev, TD_EVENT_CHECKPOINT) == 0;
    bool done = ev && strcmp(ev, TD_EVENT_DONE) == 0;
    /* held here until the master has it: bounded as the master bounds what it stores, and in
     * bytes, so a job printing faster than the master takes its lines cannot fill this node's
     * memory (the master is told how many were dropped) */
    bool keep = done || (g->backlog_bytes + (long long)n <= GUEST_BACKLOG_BYTES &&
                         td_jobs_rate_admit(j, checkpoint ? &g->checkpoint_rate : &g->metric_rate));
    long seq = g->next_seq++;
    if (!keep) {
        json_decref(o);
        return;
    }
    if (g->n_lines == g->cap_lines) {
        g->cap_lines = g->cap_lines ? 2 * g->cap_lines : 64;
        g->lines = td_realloc(g->lines, (size_t)g->cap_lines * sizeof *g->lines);
    }
    struct guest_line *l = &g->lines[g->n_lines++];
    *l = (struct guest_line){.seq = seq};
    l->text = td_malloc(n + 1);
    memcpy(l->text, line, n);
    l->text[n] = 0;
    g->backlog_bytes += (long long)n;
    if (!j->cluster && checkpoint && path) { /* an agent: its files go up first */
        char full[2 * PATH_MAX], cwd[PATH_MAX];
        td_identity who = td_jobs_identity_of(j, g->job, g->uid);
        td_jobs_cwd_of(&who, g->dir, cwd, sizeof cwd);
        snprintf(full, sizeof full, "%s%s%s", path[0] == '/' ? "" : cwd, path[0] == '/' ? "" : "/",
                 path);
        l->ckpt = td_str_dup(full);
    }
    json_decref(o);
}

typedef struct guest_ctx {
    td_jobs *j;
    guest *g;
} guest_ctx;

static bool guest_line(void *ctx, char *line, size_t n, long long end) {
    (void)end; /* a line's place is its sequence number: the lines of BASE.out from its start */
    guest_ctx *c = ctx;
    keep_line(c->j, c->g, line, n);
    return true;
}

/* Rank 0's output on to what the shepherd said (final: to until, < 0 the file's end). */
static void read_output(td_jobs *j, guest *g, bool final, long long until) {
    if (g->node_rank != 0) return;
    if (g->out_fd < 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s.out", g->sh.base);
        g->out_fd = td_jobs_open_output(j, g->job, path);
    }
    guest_ctx ctx = {j, g};
    td_jobs_read_file(g->out_fd, &g->out_read, final ? until : g->sh.out_size, final, 0, &g->line,
                      guest_line, &ctx);
}

void td_jobs_guests_read(td_jobs *j, guest *g) {
    td_shepherd_read(&g->sh);
    read_output(j, g, false, 0);
}

/* ---- starting and stopping ------------------------------------------------------------------- */

/* Checkpoints in root (a directory of the job's: its checkpoints/ or its checkpoint.dir) newer
 * than the one this attempt resumes from were never registered by the master (written as the
 * last attempt ended): resuming from one would put this node's ranks ahead of the others'. They
 * are removed as the job would remove them (td_jobfs.h: its rights, no link followed). */
static void remove_newer_checkpoints(const td_job_files *f, const char *root, long resume_step) {
    td_err err = {{0}};
    int dfd = td_jobfs_open_path(&f->who, f->dir, root, O_RDONLY | O_DIRECTORY, &err);
    DIR *d = dfd >= 0 ? fdopendir(dfd) : NULL;
    if (!d) {
        if (dfd >= 0) close(dfd);
        return;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        long step;
        char extra;
        if (sscanf(e->d_name, "step-%ld%c", &step, &extra) != 1 || step <= resume_step) continue;
        td_identity_saved saved;
        if (td_identity_become(&f->who, &saved, &err) != 0) break;
        (void)td_jobfs_remove(dirfd(d), e->d_name, &err);
        td_identity_return(&saved);
    }
    closedir(d);
}

static void end_guest(td_jobs *j, guest *g, int code, const char *reason) {
    g->running = false;
    g->ended = true;
    g->exit_code = code;
    snprintf(g->reason, sizeof g->reason, "%s", reason);
    td_str_utf8_repair(g->reason); /* cut at a byte count; JSON carries only whole characters */
    if (g->devices)
        for (int i = 0; i < g->slots; i++) j->gpu_used[g->devices[i]] = false;
    if (g->holds_slots) j->used_slots -= g->slots; /* else the master's placement holds them */
    g->holds_slots = false;
    free(g->devices);
    g->devices = NULL;
}

static const char *order_string(json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

static int order_int(json_t *o, const char *key) {
    return (int)json_integer_value(json_object_get(o, key));
}

static char **order_strv(json_t *a) {
    size_t n = json_is_array(a) ? json_array_size(a) : 0;
    char **v = td_strv_new((int)n);
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(a, i));
        v[i] = td_str_dup(s ? s : "");
    }
    return v;
}

static void start_guest(td_jobs *j, json_t *o, bool remote) {
    guest *g = td_calloc(1, sizeof *g);
    g->job = (long)json_integer_value(json_object_get(o, "job"));
    g->attempt = order_int(o, "attempt");
    g->node_rank = order_int(o, "node_rank");
    g->nnodes = order_int(o, "nnodes");
    g->nproc = order_int(o, "nproc");
    int per_proc = order_int(o, "gpus_per_proc") > 0 ? order_int(o, "gpus_per_proc") : 1;
    bool self = json_is_true(json_object_get(o, "launch_self"));
    g->out_fd = -1;
    g->sh.fd = -1;
    snprintf(g->kind, sizeof g->kind, "%s", order_string(o, "kind"));
    snprintf(g->dir, sizeof g->dir, "%s/jobs/%ld", j->cfg.state_dir, g->job);
    j->guests = td_realloc(j->guests, (size_t)(j->n_guests + 1) * sizeof *j->guests);
    j->guests[j->n_guests++] = g;
    if (g->nproc < 1 || g->nproc > 4096 || per_proc > 64 || g->nnodes < 1 || g->node_rank < 0 ||
        g->node_rank >= g->nnodes) {
        g->ended = true, g->exit_code = 1;
        snprintf(g->reason, sizeof g->reason, "node %s: the master's order is malformed",
                 j->node_name);
        return;
    }
    g->uid = (long)json_integer_value(json_object_get(o, "uid"));
    json_t *lim = json_object_get(o, "limits");
    g->cg_limits.memory_bytes = (long long)json_integer_value(json_object_get(lim, "memory_bytes"));
    g->cg_limits.pids = (long)json_integer_value(json_object_get(lim, "pids"));
    g->cg_limits.cpu_weight = (int)json_integer_value(json_object_get(lim, "cpu_weight"));
    g->disk_bytes = (long long)json_integer_value(json_object_get(lim, "disk_bytes"));
    g->procs = self ? 1 : g->nproc;
    g->see_all_gpus = json_is_true(json_object_get(o, "see_all_gpus"));
    g->slots = g->nproc * per_proc;
    int n = g->procs;
    g->holds_slots = !j->cluster;
    if (g->holds_slots) j->used_slots += g->slots;
    g->running = true;
    td_err err = {{0}};
    char **argv = NULL, **env = NULL;
    char **devices = NULL, **logs = td_strv_new(n);
    td_shepherd_base(g->sh.base, sizeof g->sh.base, g->dir, g->attempt, g->node_rank);
    g->log_start = td_calloc((size_t)n, sizeof *g->log_start);
    g->log_sent = td_calloc((size_t)n, sizeof *g->log_sent);
    bool ok = (mkdir(g->dir, 0750) == 0 || errno == EEXIST) ||
              (td_fail(&err, "cannot create %s: %s", g->dir, strerror(errno)), false);
    /* the master gives the job's uid: one of this node's job_uids too, or the part fails */
    if (ok && !td_jobs_uid_ok(j, g->uid))
        ok = (td_fail(&err,
                      "the master gives the job uid %ld, which is not one of this node's job_uids "
                      "(give every node the same job_uids)",
                      g->uid),
              false);
    td_identity who = td_jobs_identity_of(j, g->job, g->uid);
    td_job_files files;
    td_jobs_files_for(j, g->job, g->uid, &files);
    const char *fetch_error = json_string_value(json_object_get(o, "fetch_error"));
    if (ok && fetch_error) ok = (td_fail(&err, "%s", fetch_error), false);
    /* where the ranks look for the checkpoint they resume from (the agent fetched it there):
     * the job's checkpoints/, or a train job's own checkpoint.dir */
    json_t *resume =
        json_is_object(json_object_get(o, "resume")) ? json_object_get(o, "resume") : NULL;
    long resume_step = resume ? (long)json_integer_value(json_object_get(resume, "step")) : -1;
    const char *rdir = json_string_value(json_object_get(o, "checkpoint_dir"));
    const char *rbase = resume ? json_string_value(json_object_get(resume, "base")) : NULL;
    char ckpt_root[PATH_MAX + 16];
    snprintf(ckpt_root, sizeof ckpt_root, "%s%s%s", rdir && rdir[0] == '/' ? "" : g->dir,
             rdir && rdir[0] == '/' ? "" : "/", rdir ? rdir : "checkpoints");
    /* a job's own checkpoint.dir is left as it is at its first start (it may hold what the user
     * means it to resume from); on a restart, what is newer than the master registered goes */
    bool custom = rdir && rdir[0] == '/';
    if (ok && (!custom || resume || order_int(o, "restart_count") > 0))
        remove_newer_checkpoints(&files, ckpt_root, resume_step);
    if (ok && strcmp(g->kind, "command") == 0) {
        argv = order_strv(json_object_get(o, "argv"));
    } else if (ok) {
        char spec[PATH_MAX + 16];
        snprintf(spec, sizeof spec, "%s/spec.json", g->dir);
        /* a checkpoint.dir the master made relative is the job directory's here (the ranks
         * may run in another, dir/work, as run_as) */
        json_t *ck = json_object_get(json_object_get(o, "spec"), "checkpoint");
        const char *cdir = json_string_value(json_object_get(ck, "dir"));
        if (remote && cdir && cdir[0] != '/')
            json_object_set_new(ck, "dir", json_string(ckpt_root));
        if (remote && json_dump_file(json_object_get(o, "spec"), spec, JSON_INDENT(2)) != 0) {
            td_fail(&err, "cannot write %s: %s", spec, strerror(errno));
            ok = false;
        }
        argv = td_strv_new(2);
        argv[0] = td_str_dup(j->cfg.worker);
        argv[1] = td_str_dup(spec);
    }
    if (ok && !argv[0]) {
        td_fail(&err, "the order has no command to run");
        ok = false;
    }
    char cwd[PATH_MAX + 16], start[PATH_MAX + 16];
    if (ok && td_jobs_work_dir(&who, g->dir, cwd, sizeof cwd, &err) != 0) ok = false;
    const char *spec_cwd = order_string(o, "cwd");
    td_jobs_start_dir(g->dir, cwd, spec_cwd, start, sizeof start);
    json_t *order_env = json_object_get(o, "env");
    size_t n_env = json_is_array(order_env) ? json_array_size(order_env) : 0;
    env = td_strv_new((int)n_env + 7);
    for (size_t i = 0; i < n_env; i++) {
        const char *s = json_string_value(json_array_get(order_env, i));
        env[i] = td_str_dup(s ? s : "");
    }
    char var[PATH_MAX + 64];
    snprintf(var, sizeof var, "TRAIND_JOB_ID=%ld", g->job);
    env[n_env] = td_str_dup(var);
    if (rbase && strcmp(g->kind, "command") == 0) {
        snprintf(var, sizeof var, "TRAIND_LATEST_CHECKPOINT=%s/%s", ckpt_root, rbase);
        env[n_env + 1] = td_str_dup(var);
    }
    size_t n_set = 0;
    while (env[n_set]) n_set++;
    if (ok) td_jobs_identity_env(&who, cwd, env, &n_set);
    if (ok && j->cfg.gpus > 0) {
        g->devices = td_calloc((size_t)g->slots, sizeof *g->devices);
        int k = 0;
        for (int i = 0; i < j->cfg.gpus && k < g->slots; i++)
            if (!j->gpu_used[i]) j->gpu_used[i] = true, g->devices[k++] = i;
        if (k < g->slots) {
            for (int r = 0; r < k; r++) j->gpu_used[g->devices[r]] = false;
            free(g->devices);
            g->devices = NULL;
            td_fail(&err, "%d GPUs asked for, %d free on this node", g->slots, k);
            ok = false;
        } else {
            devices = td_jobs_devices_strv(j, g->devices, g->slots, n, g->see_all_gpus);
        }
    }
    for (int r = 0; r < n; r++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/rank-%d.log", g->dir, g->node_rank * g->nproc + r);
        logs[r] = td_str_dup(path);
        struct stat st;
        if (stat(path, &st) == 0) g->log_start[r] = (long long)st.st_size;
    }
    if (ok && td_jobs_attempt_cgroup(j, g->job, g->attempt, g->node_rank, &g->cg_limits, g->cgroup,
                                     sizeof g->cgroup, &err) != 0)
        ok = false;
    td_launch_config cfg = {.nproc_per_node = g->nproc,
                            .nnodes = g->nnodes,
                            .node_rank = g->node_rank,
                            .master_port = order_int(o, "master_port"),
                            .max_restarts = order_int(o, "max_restarts"),
                            .grace_s = j->cfg.grace_s,
                            .argv = argv,
                            .local_rank_arg = order_string(o, "local_rank_arg"),
                            .launch_self = self,
                            .cwd = ok ? start : g->dir,
                            .extra_env = env,
                            .user = &who,
                            .max_file_bytes = g->disk_bytes};
    snprintf(cfg.master_addr, sizeof cfg.master_addr, "%s", order_string(o, "master_addr"));
    snprintf(cfg.run_id, sizeof cfg.run_id, "traind-job-%ld", g->job);
    if (ok) {
        json_t *spec =
            td_jobs_shepherd_spec(j, &cfg, order_int(o, "restart_count"), logs, devices, 0);
        if (g->node_rank != 0) json_object_set_new(spec, "output", json_null());
        if (spec_cwd && spec_cwd[0]) json_object_set_new(spec, "dir_as_job", json_true());
        json_t *metrics = json_object_get(o, "metrics");
        if (metrics && g->node_rank == 0) json_object_set(spec, "metrics", metrics);
        if (g->cgroup[0]) json_object_set_new(spec, "cgroup", json_string(g->cgroup));
        json_t *slots = td_jobs_ints_json(g->devices, g->slots);
        json_t *starts = td_jobs_sizes_json(g->log_start, n);
        /* what a restarted daemon needs to report this part again (td_jobs_guests_recover) */
        json_object_set_new(spec, "daemon",
                            json_pack("{s:b, s:I, s:i, s:i, s:i, s:i, s:i, s:i, s:b, s:s, s:o, "
                                      "s:o, s:I, s:s}",
                                      "guest", 1, "job", (json_int_t)g->job, "attempt", g->attempt,
                                      "node_rank", g->node_rank, "nnodes", g->nnodes, "nproc",
                                      g->nproc, "procs", g->procs, "slots", g->slots,
                                      "see_all_gpus", g->see_all_gpus, "kind", g->kind, "devices",
                                      slots, "log_start", starts, "uid", (json_int_t)g->uid,
                                      "cgroup", g->cgroup));
        char base[sizeof g->sh.base];
        snprintf(base, sizeof base, "%s", g->sh.base);
        if (td_shepherd_start(&g->sh, j->cfg.shepherd, base, spec, &err) != 0) ok = false;
        snprintf(g->sh.base, sizeof g->sh.base, "%s", base);
        json_decref(spec);
    }
    td_strv_free(argv);
    td_strv_free(env);
    td_strv_free(devices);
    td_strv_free(logs);
    if (!ok) {
        char why[sizeof g->reason];
        snprintf(why, sizeof why, "could not start on node %s: %.400s", j->node_name, err.msg);
        end_guest(j, g, 1, why);
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(g->job), "job %ld attempt %d: %s", g->job,
                  g->attempt, why);
        return;
    }
    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(g->job),
              "job %ld attempt %d: node rank %d of %d started here: %d process%s, shepherd pid "
              "%d, rendezvous at %s:%d",
              g->job, g->attempt, g->node_rank, g->nnodes, n, n == 1 ? "" : "es", (int)g->sh.pid,
              cfg.master_addr, cfg.master_port);
}

static void stop_guest(td_jobs *j, guest *g) {
    if (g->running && !g->stop) /* (without a connection now: td_jobs_guests_tick, later) */
        td_shepherd_stop(&g->sh, SIGTERM, j->cfg.grace_s,
                         g->cut_off[0] ? g->cut_off : "the master stopped this part");
    g->stop = true;
}

void td_jobs_guests_apply(td_jobs *j, json_t *orders, bool remote) {
    size_t n = json_is_array(orders) ? json_array_size(orders) : 0;
    bool wanted[j->n_guests + 1];
    for (int i = 0; i < j->n_guests; i++) wanted[i] = false;
    int before = j->n_guests;
    for (size_t k = 0; k < n; k++) {
        json_t *o = json_array_get(orders, k);
        long id = (long)json_integer_value(json_object_get(o, "job"));
        int attempt = order_int(o, "attempt");
        guest *g = find_guest(j, id, attempt);
        if (!g) {
            if (json_is_true(json_object_get(o, "stop"))) continue;
            /* an earlier attempt of the job still stopping here holds its slots and port */
            bool busy = false;
            for (int i = 0; i < j->n_guests; i++)
                busy |= j->guests[i]->job == id && j->guests[i]->running;
            if (!busy) start_guest(j, o, remote);
            continue;
        }
        for (int i = 0; i < before; i++)
            if (j->guests[i] == g) wanted[i] = true;
        if (json_is_true(json_object_get(o, "stop"))) stop_guest(j, g);
        /* the master has what it acknowledges: forget it */
        long acked = (long)json_integer_value(json_object_get(o, "acked_lines"));
        int drop = 0;
        /* (a checkpoint line is acknowledged only after its upload, or when a restarted daemon
         * read it again: the master has it either way) */
        while (drop < g->n_lines && g->lines[drop].seq < acked) drop++;
        for (int i = 0; i < drop; i++) {
            g->backlog_bytes -= (long long)strlen(g->lines[i].text);
            free(g->lines[i].text);
            free(g->lines[i].ckpt);
            json_decref(g->lines[i].files);
        }
        if (drop > 0) /* lines is NULL before the first line */
            memmove(g->lines, g->lines + drop, (size_t)(g->n_lines - drop) * sizeof *g->lines);
        g->n_lines -= drop;
        json_t *logs = json_object_get(o, "acked_logs");
        for (int r = 0; r < g->procs && json_is_array(logs); r++) {
            json_t *v = json_array_get(logs, (size_t)r);
            if (json_is_integer(v)) g->log_sent[r] = (long long)json_integer_value(v);
        }
    }
    /* what the master no longer wants: stopped, and forgotten once it has ended */
    for (int i = 0; i < before; i++) {
        guest *g = j->guests[i];
        if (!wanted[i]) {
            if (g->running) {
                if (!g->stop)
                    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(g->job),
                              "job %ld attempt %d is no longer this node's to run (the "
                              "master ended it or does not know it): stopping its processes",
                              g->job, g->attempt);
                stop_guest(j, g);
            }
            if (!g->running) {
                td_shepherd_forget(g->sh.base); /* the master knows how it ended */
                td_jobs_cgroup_ended(j, g->cgroup);
                free_guest(g);
                j->guests[i] = NULL;
            }
        }
    }
    int k = 0;
    for (int i = 0; i < j->n_guests; i++)
        if (j->guests[i]) j->guests[k++] = j->guests[i];
    j->n_guests = k;
}

/* An agent cut off from its master: nothing of its must train on (the master has ended those
 * attempts, or will); the parts are stopped and forgotten. */
void td_jobs_guests_stop_all(td_jobs *j, const char *why) {
    td_jobs_lock(j);
    for (int i = 0; i < j->n_guests; i++) {
        guest *g = j->guests[i];
        if (g->running && !g->stop) {
            td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(g->job),
                      "job %ld attempt %d: stopping its processes here: %s", g->job, g->attempt,
                      why);
            stop_guest(j, g);
            /* not the master's order: if the master still waits for this part, it failed */
            snprintf(g->cut_off, sizeof g->cut_off, "node %s: %s", j->node_name, why);
        }
    }
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j);
}

/* ---- the supervisor's side ------------------------------------------------------------------- */

void td_jobs_guests_poll(td_jobs *j, struct pollfd *fds, int *n, int max, guest **owner) {
    for (int i = 0; i < j->n_guests && *n < max; i++)
        if (j->guests[i]->running && j->guests[i]->sh.fd >= 0) {
            owner[*n] = j->guests[i];
            fds[(*n)++] = (struct pollfd){j->guests[i]->sh.fd, POLLIN, 0};
        }
}

bool td_jobs_guests_connected(const td_jobs *j) {
    for (int i = 0; i < j->n_guests; i++)
        if (j->guests[i]->running && j->guests[i]->sh.fd >= 0) return true;
    return false;
}

void td_jobs_guests_stop_for_exit(td_jobs *j, const char *why) {
    for (int i = 0; i < j->n_guests; i++) {
        guest *g = j->guests[i];
        if (!g->running) continue;
        g->sh.stop_sent = false; /* this stop's words are the ones that count */
        td_shepherd_stop(&g->sh, SIGTERM, j->cfg.grace_s, why);
    }
}

/* A failure of rank `rank` (what: the shepherd's words) as the master shows it: naming this
 * node, with the rank's own error line from its log. */
static void failure_words(td_jobs *j, const guest *g, int rank, const char *what, char *out,
                          size_t len) {
    char own[340]; /* (a cascade's error ends with the job's first failure: keep it whole) */
    int local = rank - g->node_rank * g->nproc;
    td_jobs_rank_message(g->dir, rank, local >= 0 && local < g->procs ? g->log_start[local] : 0,
                         strcmp(g->kind, "command") == 0, own, sizeof own);
    if (own[0] && strstr(what, own)) own[0] = 0; /* its error file said it already */
    snprintf(out, len, "node %s: %.100s%s%s", j->node_name, what, own[0] ? ": " : "", own);
    td_str_utf8_repair(out); /* cut at a byte count; JSON carries only whole characters */
}

/* Its shepherd's connection ended: the part is over (or the shepherd died, or dropped a slow
 * daemon: connected to again). */
static void guest_gone(td_jobs *j, guest *g) {
    td_err err = {{0}};
    if (!g->sh.over) {
        td_shepherd again;
        if (td_shepherd_attach(&again, g->sh.base, &err) == 0) {
            /* a stop it was sent may be among what it dropped: td_jobs_guests_tick sends it
             * again (the shepherd keeps the first reason it got) */
            again.pid = g->sh.pid;
            g->sh = again;
            return;
        }
    }
    td_shepherd_end e;
    int rc = td_shepherd_end_read(g->sh.base, &e, &err);
    read_output(j, g, true, rc == 1 ? e.output_bytes : -1);
    if (g->out_fd >= 0) close(g->out_fd);
    g->out_fd = -1;
    char reason[sizeof g->reason] = "";
    int code;
    if (rc != 1) {
        /* what its processes left (they die with it); only a group still this part's: an id
         * from before a restart may be another's by now */
        if (g->sh.pgid > 0 && td_jobs_group_of(g->sh.pgid, g->dir)) killpg(g->sh.pgid, SIGKILL);
        td_jobs_cgroup_ended(j, g->cgroup);
        char words[200];
        td_shepherd_last_words(g->sh.base, words, sizeof words);
        code = -1;
        snprintf(reason, sizeof reason,
                 "node %s: the shepherd of node rank %d ended without a "
                 "status%s%.200s",
                 j->node_name, g->node_rank, words[0] ? ": " : "", words);
    } else if (e.failed) {
        code = e.exit_code ? e.exit_code : 1;
        failure_words(j, g, e.failed_rank, e.reason, reason, sizeof reason);
    } else if (g->cut_off[0]) {
        code = 1;
        snprintf(reason, sizeof reason, "%s", g->cut_off);
    } else if (g->stop) {
        code = 0;                 /* the master's own stop */
    } else if (e.stopped_by[0]) { /* without the master's word: its daemon was away, or stops */
        code = e.exit_code ? e.exit_code : 1;
        const char *words = e.stop_reason;
        if (strncmp(words, TD_JOBS_STOP_DAEMON, strlen(TD_JOBS_STOP_DAEMON)) == 0)
            words += strlen(TD_JOBS_STOP_DAEMON);
        snprintf(reason, sizeof reason, "node %s: node rank %d was stopped: %.300s", j->node_name,
                 g->node_rank, words);
    } else {
        code = e.exit_code;
    }
    g->sh.fd = -1;
    end_guest(j, g, code, reason);
    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(g->job),
              "job %ld attempt %d: node rank %d ended here%s%s", g->job, g->attempt, g->node_rank,
              reason[0] ? ": " : "", reason);
    pthread_cond_broadcast(&j->changed); /* a stopping daemon waits for its shepherds */
}

void td_jobs_guests_tick(td_jobs *j) {
    for (int i = 0; i < j->n_guests; i++) {
        guest *g = j->guests[i];
        if (g->running && g->sh.fd < 0) guest_gone(j, g);
        /* a stop not sent (no connection then), or dropped with a connection since */
        if (!g->running || g->sh.fd < 0 || g->sh.stop_sent) continue;
        if (j->stopping_jobs)
            td_shepherd_stop(&g->sh, SIGTERM, j->cfg.grace_s, TD_JOBS_STOP_DAEMON_WORDS);
        else if (g->stop)
            td_shepherd_stop(&g->sh, SIGTERM, j->cfg.grace_s,
                             g->cut_off[0] ? g->cut_off : "the master stopped this part");
    }
}

/* One guest from its attempt file's notes (a previous daemon's part). */
static void recover_guest(td_jobs *j, const char *base, json_t *n) {
    guest *g = td_calloc(1, sizeof *g);
    g->out_fd = -1;
    g->sh.fd = -1;
    g->job = (long)json_integer_value(json_object_get(n, "job"));
    g->attempt = order_int(n, "attempt");
    g->node_rank = order_int(n, "node_rank");
    g->nnodes = order_int(n, "nnodes");
    g->nproc = order_int(n, "nproc");
    g->procs = order_int(n, "procs");
    g->slots = order_int(n, "slots");
    g->see_all_gpus = json_is_true(json_object_get(n, "see_all_gpus"));
    snprintf(g->kind, sizeof g->kind, "%s", order_string(n, "kind"));
    snprintf(g->dir, sizeof g->dir, "%s/jobs/%ld", j->cfg.state_dir, g->job);
    g->uid = (long)json_integer_value(json_object_get(n, "uid"));
    snprintf(g->cgroup, sizeof g->cgroup, "%s", order_string(n, "cgroup"));
    if (g->procs < 1 || g->procs > 4096 || g->slots < 0 || g->slots > 4096 * 64) {
        free(g);
        return;
    }
    g->log_start = td_calloc((size_t)g->procs, sizeof *g->log_start);
    g->log_sent = td_calloc((size_t)g->procs, sizeof *g->log_sent);
    json_t *starts = json_object_get(n, "log_start");
    for (int r = 0; r < g->procs; r++)
        g->log_start[r] = (long long)json_integer_value(json_array_get(starts, (size_t)r));
    g->devices = td_jobs_hold_gpus(j, json_object_get(n, "devices"), g->slots);
    /* counted here on a master too: no placement of its knows this part until it ends */
    g->holds_slots = true;
    j->used_slots += g->slots;
    g->running = true;
    td_err err = {{0}};
    int rc = td_shepherd_attach(&g->sh, base, &err);
    snprintf(g->sh.base, sizeof g->sh.base, "%.*s", (int)sizeof g->sh.base - 1, base);
    j->guests = td_realloc(j->guests, (size_t)(j->n_guests + 1) * sizeof *j->guests);
    j->guests[j->n_guests++] = g;
    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(g->job), "job %ld attempt %d: node rank %d %s",
              g->job, g->attempt, g->node_rank,
              rc == 0   ? "still runs here: re-attached (reported to the master as it is)"
              : rc == 1 ? "ended here while no daemon ran: reporting how"
                        : "left an attempt file that cannot be read; reported as ended");
    if (rc < 0)
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(g->job), "job %ld: %s", g->job, err.msg);
    /* rc 1 or -1: ended in the supervisor's first turn (td_jobs_guests_tick) */
}

void td_jobs_guests_recover(td_jobs *j) {
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/jobs", j->cfg.state_dir);
    DIR *d = opendir(root);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char dir[PATH_MAX / 2];
        if (e->d_name[0] == '.' ||
            snprintf(dir, sizeof dir, "%s/%s", root, e->d_name) >= (int)sizeof dir)
            continue;
        DIR *sub = opendir(dir);
        struct dirent *f;
        while (sub && (f = readdir(sub))) {
            int attempt, node_rank, used = 0;
            if (sscanf(f->d_name, "attempt-%d.node-%d.json%n", &attempt, &node_rank, &used) != 2 ||
                used != (int)strlen(f->d_name))
                continue;
            char base[PATH_MAX - 16];
            snprintf(base, sizeof base, "%s/attempt-%d.node-%d", dir, attempt, node_rank);
            json_t *notes = td_shepherd_notes(base);
            if (json_is_true(json_object_get(notes, "guest"))) recover_guest(j, base, notes);
            json_decref(notes);
        }
        if (sub) closedir(sub);
    }
    if (d) closedir(d);
}

/* ---- the report ------------------------------------------------------------------------------ */

static json_t *log_chunk(const guest *g, int r, bool *whole, size_t *budget) {
    char path[PATH_MAX + 32];
    int rank = g->node_rank * g->nproc + r;
    snprintf(path, sizeof path, "%s/rank-%d.log", g->dir, rank);
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    long long have = (long long)st.st_size - g->log_start[r] - g->log_sent[r];
    if (have <= 0) return NULL;
    size_t cap = *budget * 3 / 4 < REPORT_LOG ? *budget * 3 / 4 : REPORT_LOG; /* base64: 4/3 */
    size_t n = (long long)cap < have ? cap : (size_t)have;
    if ((long long)n < have) *whole = false;
    if (n == 0) return NULL;
    *budget -= 4 * ((n + 2) / 3);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    unsigned char *raw = td_malloc(n);
    ssize_t got = pread(fd, raw, n, (off_t)(g->log_start[r] + g->log_sent[r]));
    close(fd);
    if (got <= 0) {
        free(raw);
        return NULL;
    }
    /* base64: a log is bytes, and JSON strings must be UTF-8 */
    char *b64 = td_malloc(4 * (((size_t)got + 2) / 3) + 1);
    EVP_EncodeBlock((unsigned char *)b64, raw, (int)got);
    free(raw);
    json_t *o = json_pack("{s:i, s:I, s:s}", "rank", rank, "offset", (json_int_t)g->log_sent[r],
                          "data", b64);
    free(b64);
    return o;
}

json_t *td_jobs_guests_report(td_jobs *j, bool remote) {
    json_t *list = json_array();
    size_t budget = REPORT_BUDGET;
    for (int i = 0; i < j->n_guests; i++) {
        guest *g = j->guests[i];
        bool whole = !g->running && g->out_fd < 0;
        json_t *lines = json_array();
        int k = 0;
        for (; k < g->n_lines && k < REPORT_LINES; k++) {
            struct guest_line *l = &g->lines[k];
            if (l->ckpt && remote) break; /* its files first */
            size_t size = strlen(l->text) + 64;
            if (remote && size > budget && k > 0) break;
            budget = size > budget ? 0 : budget - size;
            json_t *e = json_pack("{s:I, s:s}", "seq", (json_int_t)l->seq, "text", l->text);
            if (!e)
                e = json_pack("{s:I, s:s}", "seq", (json_int_t)l->seq, "text",
                              "(a line that is not UTF-8)");
            if (l->files) json_object_set(e, "files", l->files);
            json_array_append_new(lines, e);
        }
        if (k < g->n_lines) whole = false;
        json_t *logs = json_array();
        for (int r = 0; remote && r < g->procs; r++) {
            json_t *c = log_chunk(g, r, &whole, &budget);
            if (c) json_array_append_new(logs, c);
        }
        char devices[128] = "";
        for (int r = 0; g->devices && r < g->slots; r++)
            snprintf(devices + strlen(devices), sizeof devices - strlen(devices), "%s%d",
                     r ? "," : "", td_jobs_gpu_id(j, g->devices[r]));
        json_t *each = json_array();
        char **per = g->devices
                         ? td_jobs_devices_strv(j, g->devices, g->slots, g->procs, g->see_all_gpus)
                         : NULL;
        for (int p = 0; per && per[p]; p++) json_array_append_new(each, json_string(per[p]));
        td_strv_free(per);
        json_t *e =
            json_pack("{s:I, s:i, s:s, s:i, s:s, s:o, s:o, s:I, s:b, s:s, s:o}", "job",
                      (json_int_t)g->job, "attempt", g->attempt, "state",
                      g->running ? "running" : "ended", "exit_code", g->exit_code, "reason",
                      g->reason, "lines", lines, "logs", logs, "next_seq", (json_int_t)g->next_seq,
                      "complete", whole, "devices", devices, "process_devices", each);
        TD_ASSERT(e, "json_pack of a part's report failed");
        if (g->sh.failed) {
            /* as soon as the shepherd says so, with when it happened: the master tells the
             * first failure from the cascade it caused on other nodes by that time, not by
             * which part's end it hears of first (a part whose stopped rank holds it for the
             * grace period ends last, though its failure came first) */
            char words[sizeof g->reason];
            if (g->running)
                failure_words(j, g, g->sh.failed_rank, g->sh.failed_reason, words, sizeof words);
            json_object_set_new(e, "failure",
                                json_pack("{s:i, s:s, s:f}", "exit_code",
                                          g->sh.failed_code ? g->sh.failed_code : 1, "reason",
                                          g->running ? words : g->reason, "at", g->sh.failed_at));
        }
        json_array_append_new(list, e);
    }
    return list;
}

/* ---- checkpoint uploads (an agent's) --------------------------------------------------------- */

bool td_jobs_guests_next_upload(td_jobs *j, long *job_id, int *attempt, long *seq, char *path,
                                size_t len, td_job_files *files) {
    td_jobs_lock(j);
    bool found = false;
    for (int i = 0; i < j->n_guests && !found; i++) {
        guest *g = j->guests[i];
        for (int k = 0; k < g->n_lines && !found; k++)
            if (g->lines[k].ckpt && g->stop) { /* an ended attempt's: never into the job's store */
                free(g->lines[k].ckpt);
                g->lines[k].ckpt = NULL;
            } else if (g->lines[k].ckpt) {
                *job_id = g->job, *attempt = g->attempt, *seq = g->lines[k].seq;
                snprintf(path, len, "%s", g->lines[k].ckpt);
                td_jobs_files_for(j, g->job, g->uid, files);
                found = true;
            }
    }
    pthread_mutex_unlock(&j->mu);
    return found;
}

void td_jobs_guests_uploaded(td_jobs *j, long job_id, int attempt, long seq, json_t *files) {
    td_jobs_lock(j);
    guest *g = find_guest(j, job_id, attempt);
    int k = 0;
    while (g && k < g->n_lines && g->lines[k].seq != seq) k++;
    if (g && k < g->n_lines) {
        free(g->lines[k].ckpt);
        g->lines[k].ckpt = NULL;
        json_decref(g->lines[k].files);
        g->lines[k].files = json_incref(files);
    }
    pthread_mutex_unlock(&j->mu);
}

int td_jobs_order_files(td_jobs *j, long id, long uid, td_job_files *out, td_err *err) {
    td_jobs_lock(j);
    int rc = 0;
    if (!td_jobs_uid_ok(j, uid))
        rc = td_fail(err,
                     "the master gives job %ld uid %ld, which is not one of this node's "
                     "job_uids (give every node the same job_uids)",
                     id, uid);
    td_jobs_files_for(j, id, uid, out);
    char cwd[PATH_MAX + 16];
    if (rc == 0 && mkdir(out->dir, 0750) != 0 && errno != EEXIST)
        rc = td_fail(err, "cannot create %s: %s", out->dir, strerror(errno));
    if (rc == 0) rc = td_jobs_work_dir(&out->who, out->dir, cwd, sizeof cwd, err);
    pthread_mutex_unlock(&j->mu);
    return rc;
}

bool td_jobs_guest_known(td_jobs *j, long job_id, int attempt) {
    td_jobs_lock(j);
    bool known = find_guest(j, job_id, attempt) != NULL;
    pthread_mutex_unlock(&j->mu);
    return known;
}

json_t *td_jobs_guests_report_locked(td_jobs *j) {
    td_jobs_lock(j);
    json_t *r = td_jobs_guests_report(j, true);
    pthread_mutex_unlock(&j->mu);
    return r;
}

void td_jobs_guests_apply_locked(td_jobs *j, json_t *orders) {
    td_jobs_lock(j);
    td_jobs_guests_apply(j, orders, true);
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j);
}

bool td_jobs_guests_running(td_jobs *j) {
    td_jobs_lock(j);
    bool any = j->n_guests > 0;
    pthread_mutex_unlock(&j->mu);
    return any;
}
