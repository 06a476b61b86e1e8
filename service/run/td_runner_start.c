/* One runner for what this node runs of an attempt, whoever asked for it: a job's own attempt on
 * a daemon without agents (node rank 0 of 1) and a part its master orders (td_job_part_start.c)
 * start their processes the same way: each process's log, the work directory made ready for who
 * the job runs as, its environment, its cgroup, then traind-shepherd on a spec that carries the
 * notes a restarted daemon reads to find the attempt again (td_runner_notes). A node is a
 * cluster of one: the callers differ in where the numbers come from (the job's record, or the
 * master's order), not in how the processes start. */
#include "service/run/td_runner.h"

#include "base/td_error.h"

#include "base/td_strv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static json_t *strv_json(char *const *v) {
    json_t *a = json_array();
    for (int i = 0; v && v[i]; i++) json_array_append_new(a, json_string(v[i]));
    return a;
}

static json_t *ints_json(const int *v, int n) {
    if (!v) return json_null();
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

static json_t *sizes_json(const long long *v, int n) {
    json_t *a = json_array();
    for (int i = 0; i < n; i++) json_array_append_new(a, json_integer(v[i]));
    return a;
}

json_t *td_runner_shepherd_spec(const td_runner *n, const td_launch_config *c, int attempt,
                                char **logs, char **devices, double deadline) {
    json_t *o = json_pack(
        "{s:o, s:o, s:o, s:o, s:s, s:s, s:s, s:s, s:i, s:i, s:i, s:i, s:i, "
        "s:i, s:f, s:f, s:f, s:b}",
        "argv", strv_json(c->argv), "env", strv_json(c->extra_env), "devices",
        devices ? strv_json(devices) : json_null(), "logs", strv_json(logs), "dir", c->cwd,
        "master_addr", c->master_addr, "run_id", c->run_id, "local_rank_arg",
        c->local_rank_arg ? c->local_rank_arg : "", "nproc", c->nproc_per_node, "nnodes", c->nnodes,
        "node_rank", c->node_rank, "master_port", c->master_port, "max_restarts", c->max_restarts,
        "attempt", attempt, "grace_s", n->cfg->grace_s, "deadline", deadline, "orphan_timeout_s",
        n->cfg->orphan_timeout_s > 0 ? n->cfg->orphan_timeout_s : 600.0, "launch_self",
        c->launch_self);
    TD_ASSERT(o, "json_pack of a shepherd's spec failed");
    const td_identity *u = c->user;
    if (u && u->drop) {
        json_t *groups = json_array();
        for (int i = 0; i < u->n_groups; i++)
            json_array_append_new(groups, json_integer((json_int_t)u->groups[i]));
        json_object_set_new(o, "user",
                            json_pack("{s:s, s:I, s:I, s:o, s:b}", "name", u->name, "uid",
                                      (json_int_t)u->uid, "gid", (json_int_t)u->gid, "groups",
                                      groups, "lookup_groups", u->lookup_groups));
    }
    if (n->cfg->max_log_bytes > 0)
        json_object_set_new(o, "max_log_bytes", json_integer((json_int_t)n->cfg->max_log_bytes));
    if (c->max_file_bytes > 0)
        json_object_set_new(o, "max_file_bytes", json_integer((json_int_t)c->max_file_bytes));
    return o;
}

char **td_runner_logs(const td_runner_attempt *r, long long *log_start) {
    char **logs = td_strv_new(r->procs);
    for (int p = 0; p < r->procs; p++) {
        char path[PATH_MAX + 32];
        snprintf(path, sizeof path, "%s/rank-%d.log", r->dir, r->node_rank * r->nproc + p);
        logs[p] = td_str_dup(path);
        struct stat st;
        log_start[p] = stat(path, &st) == 0 ? (long long)st.st_size : 0; /* its lines start here */
    }
    return logs;
}

/* An experiment's trial (service/exp/) has its hyperparameters in TRAIND_HPARAMS: they go in
 * DIR/hparams.json too (the daemon's file in the daemon's directory, readable by the job's
 * group as spec.json is), on every node the attempt runs on. Its path into path; "" when the
 * job is no trial. */
static int write_hparams(const td_runner_attempt *r, const td_identity *who, char *path, size_t len,
                         td_err *err) {
    path[0] = 0;
    const char *h = NULL;
    for (char **v = r->env; v && *v && !h; v++)
        if (strncmp(*v, "TRAIND_HPARAMS=", 15) == 0) h = *v + 15;
    if (!h) return 0;
    snprintf(path, len, "%s/hparams.json", r->dir);
    /* (jobs/ID is the daemon's; a job of the daemon's own identity could still plant a name
     * there: no link followed, no FIFO waited on, nothing but a regular file written) */
    int fd = open(path, O_WRONLY | O_CREAT | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC, 0640);
    struct stat st;
    if (fd >= 0 && (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))) {
        close(fd);
        fd = -1;
        errno = EINVAL;
    }
    size_t n = strlen(h);
    bool ok = fd >= 0 && ftruncate(fd, 0) == 0 && write(fd, h, n) == (ssize_t)n &&
              write(fd, "\n", 1) == 1 && fchmod(fd, 0640) == 0 &&
              (!who->drop || fchown(fd, 0, who->gid) == 0);
    int saved = errno;
    if (fd >= 0) close(fd);
    return ok ? 0 : td_fail(err, "cannot write %s: %s", path, strerror(saved));
}

/* The environment the processes get besides the launcher's: the job's own, its id, a command's
 * latest checkpoint, the step to stop after, a trial's hyperparameters file, and who they run as
 * in cwd. */
static char **run_env(const td_runner_attempt *r, const td_identity *who, const char *cwd,
                      const char *hparams) {
    int n_env = 0;
    while (r->env && r->env[n_env]) n_env++;
    char **env = td_strv_new(n_env + 8);
    for (int i = 0; i < n_env; i++) env[i] = td_str_dup(r->env[i]);
    char var[PATH_MAX + 64];
    snprintf(var, sizeof var, "TRAIND_JOB_ID=%ld", r->job);
    env[n_env++] = td_str_dup(var);
    /* a command restarts from its beginning: where its own latest checkpoint is lets a script
     * resume (traind-worker finds its checkpoints in checkpoint.dir itself) */
    if (r->latest_checkpoint) {
        snprintf(var, sizeof var, "TRAIND_LATEST_CHECKPOINT=%s", r->latest_checkpoint);
        env[n_env++] = td_str_dup(var);
    }
    /* stop after this step with a checkpoint there, and exit 0: traind-worker does (as with
     * --stop-after); a command is asked to (docs/experiments.md) */
    if (r->stop_at_step > 0) {
        snprintf(var, sizeof var, "TRAIND_STOP_AT_STEP=%ld", r->stop_at_step);
        env[n_env++] = td_str_dup(var);
    }
    if (hparams[0]) {
        snprintf(var, sizeof var, "TRAIND_HPARAMS_FILE=%s", hparams);
        env[n_env++] = td_str_dup(var);
    }
    size_t n_set = (size_t)n_env;
    td_runner_identity_env(who, cwd, env, &n_set);
    return env;
}

void td_runner_notes(const td_runner_attempt *r, const char *cgroup, const long long *log_start,
                     json_t *notes) {
    json_t *common = json_pack(
        "{s:I, s:i, s:i, s:i, s:i, s:i, s:i, s:o, s:b, s:s, s:o, s:I, s:s}", "job",
        (json_int_t)r->job, "attempt", r->attempt, "node_rank", r->node_rank, "nnodes", r->nnodes,
        "nproc", r->nproc, "procs", r->procs, "n_slots", r->n_slots, "gpu_slots",
        ints_json(r->slots, r->n_slots), "see_all_gpus", r->see_all_gpus, "kind", r->kind,
        "log_start", sizes_json(log_start, r->procs), "uid", (json_int_t)r->uid, "cgroup", cgroup);
    TD_ASSERT(common, "json_pack of an attempt's notes failed");
    json_object_update(notes, common);
    json_decref(common);
}

/* The shepherd's spec for r, which runs cfg: rank 0's output and metrics where node rank 0 runs,
 * its cgroup, and the notes. */
static json_t *run_spec(const td_runner *n, const td_runner_attempt *r, const td_launch_config *cfg,
                        char **logs, char **devices, const char *cgroup, json_t *notes) {
    json_t *spec = td_runner_shepherd_spec(n, cfg, r->attempt, logs, devices, r->deadline);
    if (r->node_rank != 0) json_object_set_new(spec, "output", json_null());
    if (r->metrics && r->node_rank == 0) json_object_set(spec, "metrics", r->metrics);
    /* a directory the job chose: the shepherd enters it as the job */
    if (r->spec_cwd && r->spec_cwd[0]) json_object_set_new(spec, "dir_as_job", json_true());
    if (cgroup[0]) json_object_set_new(spec, "cgroup", json_string(cgroup));
    json_object_set(spec, "daemon", notes);
    return spec;
}

int td_runner_start(td_runner *n, const td_runner_attempt *r, const long long *log_start,
                    char **logs, json_t *notes, td_shepherd *sh, char *cgroup, size_t len,
                    td_err *err) {
    cgroup[0] = 0;
    char base[sizeof sh->base];
    td_shepherd_base(base, sizeof base, r->dir, r->attempt, r->node_rank);
    snprintf(sh->base, sizeof sh->base, "%s", base);
    td_identity who = td_runner_identity_of(n, r->job, r->uid);
    char cwd[PATH_MAX + 16], start[PATH_MAX + 16];
    if (td_runner_work_dir(&who, r->dir, cwd, sizeof cwd, err) != 0) return -1;
    td_runner_start_dir(r->dir, cwd, r->spec_cwd, start, sizeof start);
    if (td_runner_attempt_cgroup(n, r->job, r->attempt, r->node_rank, &r->limits, cgroup, len,
                                 err) != 0)
        return -1;
    char hparams[PATH_MAX + 16];
    if (write_hparams(r, &who, hparams, sizeof hparams, err) != 0) return -1;
    char **env = run_env(r, &who, cwd, hparams);
    char **devices =
        r->slots ? td_runner_devices_strv(n, r->slots, r->n_slots, r->procs, r->see_all_gpus)
                 : NULL;
    td_launch_config cfg = {.nproc_per_node = r->nproc,
                            .nnodes = r->nnodes,
                            .node_rank = r->node_rank,
                            .master_port = r->master_port,
                            .max_restarts = r->max_restarts,
                            .grace_s = n->cfg->grace_s,
                            .argv = r->argv,
                            .local_rank_arg = r->local_rank_arg,
                            .launch_self = r->launch_self,
                            .cwd = start,
                            .extra_env = env,
                            .user = &who,
                            .max_file_bytes = r->disk_bytes};
    snprintf(cfg.master_addr, sizeof cfg.master_addr, "%s", r->master_addr);
    snprintf(cfg.run_id, sizeof cfg.run_id, "traind-job-%ld", r->job);
    td_runner_notes(r, cgroup, log_start, notes);
    json_t *spec = run_spec(n, r, &cfg, logs, devices, cgroup, notes);
    int rc = td_shepherd_start(sh, n->cfg->shepherd, base, spec, err);
    snprintf(sh->base, sizeof sh->base, "%s", base);
    json_decref(spec);
    td_strv_free(env);
    td_strv_free(devices);
    return rc;
}

/* The GPU slots an attempt's notes list (an older traind wrote "slots" for a job's own attempt
 * and "devices" for a part). */
static json_t *notes_gpu_slots(json_t *notes) {
    json_t *s = json_object_get(notes, "gpu_slots");
    if (s) return s;
    s = json_object_get(notes, "slots");
    return json_is_array(s) ? s : json_object_get(notes, "devices");
}

int td_runner_notes_n_slots(json_t *notes, int otherwise) {
    json_t *n = json_object_get(notes, "n_slots");
    if (!n) n = json_object_get(notes, "slots"); /* an older traind's part: the count */
    return json_is_integer(n) ? (int)json_integer_value(n) : otherwise;
}

bool td_runner_notes_of_part(json_t *notes) {
    return json_is_true(json_object_get(notes, "part")) ||
           json_is_true(json_object_get(notes, "guest")); /* an older traind's word */
}

int td_runner_attach(td_runner *n, const char *base, json_t *notes, int procs, int n_slots,
                     int **devices, long long *log_start, char *cgroup, size_t len, td_shepherd *sh,
                     td_err *err) {
    n->used_slots += n_slots;
    *devices = td_runner_hold_gpus(n, notes_gpu_slots(notes), n_slots);
    json_t *starts = json_object_get(notes, "log_start");
    for (int p = 0; p < procs; p++)
        log_start[p] = (long long)json_integer_value(json_array_get(starts, (size_t)p));
    const char *path = json_string_value(json_object_get(notes, "cgroup"));
    snprintf(cgroup, len, "%s", path ? path : "");
    char at[sizeof sh->base];
    snprintf(at, sizeof at, "%s", base);
    int rc = td_shepherd_attach(sh, at, err);
    snprintf(sh->base, sizeof sh->base, "%s", at);
    return rc;
}
