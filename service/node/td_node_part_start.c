/* Starting a part a master orders (td_node_parts.c applies the orders): its directory, uid and
 * fetched checkpoint checked, what it runs and its GPUs, then the runner every attempt on a node
 * starts through (service/run/td_runner_start.c), in named steps. Apart from the rest of a part's
 * life because it turns an order into what the runner takes; a part that cannot start is reported
 * as ended, with why. */
#include "service/node/td_node_private.h"

#include "base/td_strv.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

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

static char **order_strv(json_t *a) {
    size_t n = json_is_array(a) ? json_array_size(a) : 0;
    char **v = td_strv_new((int)n);
    for (size_t i = 0; i < n; i++) {
        const char *s = json_string_value(json_array_get(a, i));
        v[i] = td_str_dup(s ? s : "");
    }
    return v;
}

/* The order's numbers into a new node part, listed in np->parts at once: a part that cannot
 * start is reported as ended all the same. */
static td_node_part *new_node_part(td_node_parts *np, json_t *o) {
    td_node_part *g = td_calloc(1, sizeof *g);
    g->job = (long)json_integer_value(json_object_get(o, "job"));
    g->attempt = td_node_order_int(o, "attempt");
    g->node_rank = td_node_order_int(o, "node_rank");
    g->nnodes = td_node_order_int(o, "nnodes");
    g->nproc = td_node_order_int(o, "nproc");
    g->out_fd = -1;
    g->sh.fd = -1;
    snprintf(g->kind, sizeof g->kind, "%s", td_node_order_string(o, "kind"));
    snprintf(g->dir, sizeof g->dir, "%s/jobs/%ld", np->runner->cfg->state_dir, g->job);
    td_node_parts_add(np, g);
    return g;
}

/* What the order gives the part: its uid and limits, its processes and slots (held here on an
 * agent; on a master, placement holds them); it runs from now on. */
static void take_order(td_node_parts *np, td_node_part *g, json_t *o, bool self, int per_proc) {
    g->uid = (long)json_integer_value(json_object_get(o, "uid"));
    json_t *lim = json_object_get(o, "limits");
    g->cg_limits.memory_bytes = (long long)json_integer_value(json_object_get(lim, "memory_bytes"));
    g->cg_limits.pids = (long)json_integer_value(json_object_get(lim, "pids"));
    g->cg_limits.cpu_weight = (int)json_integer_value(json_object_get(lim, "cpu_weight"));
    g->disk_bytes = (long long)json_integer_value(json_object_get(lim, "disk_bytes"));
    g->procs = self ? 1 : g->nproc;
    g->see_all_gpus = json_is_true(json_object_get(o, "see_all_gpus"));
    g->slots = g->nproc * per_proc;
    g->holds_slots = !np->on_master;
    if (g->holds_slots) np->runner->used_slots += g->slots;
    g->running = true;
}

/* Whether the part may start here: its directory made, its uid one of this node's, and no
 * error fetching its checkpoint (the agent's, in the order). */
static bool may_start(td_node_parts *np, td_node_part *g, json_t *o, td_err *err) {
    bool ok = (mkdir(g->dir, 0750) == 0 || errno == EEXIST) ||
              (td_fail(err, "cannot create %s: %s", g->dir, strerror(errno)), false);
    /* the master gives the job's uid: one of this node's job_uids too, or the part fails */
    if (ok && !td_runner_uid_ok(np->runner, g->uid))
        ok = (td_fail(err,
                      "the master gives the job uid %ld, which is not one of this node's job_uids "
                      "(give every node the same job_uids)",
                      g->uid),
              false);
    const char *fetch_error = json_string_value(json_object_get(o, "fetch_error"));
    if (ok && fetch_error) ok = (td_fail(err, "%s", fetch_error), false);
    return ok;
}

/* Where the ranks look for the checkpoint they resume from (the agent fetched it there), into
 * root: the job's checkpoints/, or a train job's own checkpoint.dir; what is newer there than
 * the master registered goes (ok: the part may start). The base name of the checkpoint it
 * resumes from, or NULL. */
static const char *resume_root(td_node_part *g, json_t *o, const td_job_files *files, bool ok,
                               char *root, size_t len) {
    json_t *resume =
        json_is_object(json_object_get(o, "resume")) ? json_object_get(o, "resume") : NULL;
    long resume_step = resume ? (long)json_integer_value(json_object_get(resume, "step")) : -1;
    const char *rdir = json_string_value(json_object_get(o, "checkpoint_dir"));
    const char *rbase = resume ? json_string_value(json_object_get(resume, "base")) : NULL;
    snprintf(root, len, "%s%s%s", rdir && rdir[0] == '/' ? "" : g->dir,
             rdir && rdir[0] == '/' ? "" : "/", rdir ? rdir : "checkpoints");
    /* a job's own checkpoint.dir is left as it is at its first start (it may hold what the user
     * means it to resume from); on a restart, what is newer than the master registered goes */
    bool custom = rdir && rdir[0] == '/';
    if (ok && (!custom || resume || td_node_order_int(o, "restart_count") > 0))
        remove_newer_checkpoints(files, root, resume_step);
    return rbase;
}

/* What the part's processes run: a command's argv, or traind-worker on the job's spec (an
 * agent writes the order's); NULL when the part already cannot start (*ok false). */
static char **order_argv(td_node_parts *np, td_node_part *g, json_t *o, bool remote,
                         const char *checkpoint_root, bool *ok, td_err *err) {
    char **argv = NULL;
    if (*ok && strcmp(g->kind, "command") == 0) {
        argv = order_strv(json_object_get(o, "argv"));
    } else if (*ok) {
        char spec[PATH_MAX + 16];
        snprintf(spec, sizeof spec, "%s/spec.json", g->dir);
        /* a checkpoint.dir the master made relative is the job directory's here (the ranks
         * may run in another, dir/work, as run_as) */
        json_t *ck = json_object_get(json_object_get(o, "spec"), "checkpoint");
        const char *cdir = json_string_value(json_object_get(ck, "dir"));
        if (remote && cdir && cdir[0] != '/')
            json_object_set_new(ck, "dir", json_string(checkpoint_root));
        if (remote && json_dump_file(json_object_get(o, "spec"), spec, JSON_INDENT(2)) != 0) {
            td_fail(err, "cannot write %s: %s", spec, strerror(errno));
            *ok = false;
        }
        argv = td_strv_new(2);
        argv[0] = td_str_dup(np->runner->cfg->worker);
        argv[1] = td_str_dup(spec);
    }
    if (*ok && !argv[0]) {
        td_fail(err, "the order has no command to run");
        *ok = false;
    }
    return argv;
}

/* The part's GPU slots: the first free ones, all of them or none (*ok false). */
static void take_gpus(td_node_parts *np, td_node_part *g, bool *ok, td_err *err) {
    int free_now = td_runner_gpus_free(np->runner);
    g->devices = td_runner_take_gpus(np->runner, g->slots);
    if (!g->devices) {
        td_fail(err, "%d GPUs asked for, %d free on this node", g->slots, free_now);
        *ok = false;
    }
}

/* Says in the log that the part started, or ends it at once with why it could not. */
static void say_started(td_node_parts *np, td_node_part *g, bool ok, const td_err *err,
                        const char *master_addr, int master_port) {
    int n = g->procs;
    if (!ok) {
        char why[sizeof g->reason];
        snprintf(why, sizeof why, "could not start on node %s: %.400s", np->name, err->msg);
        td_node_part_end(np, g, 1, why);
        td_log_at(np->log, TD_LOG_WARNING, TD_LOG_JOB(g->job), "job %ld attempt %d: %s", g->job,
                  g->attempt, why);
        return;
    }
    td_log_at(np->log, TD_LOG_INFO, TD_LOG_JOB(g->job),
              "job %ld attempt %d: node rank %d of %d started here: %d process%s, shepherd pid "
              "%d, rendezvous at %s:%d",
              g->job, g->attempt, g->node_rank, g->nnodes, n, n == 1 ? "" : "es", (int)g->sh.pid,
              master_addr, master_port);
}

/* What the part runs here, as the runner takes it (service/run/td_runner_start.c). */
static td_runner_attempt order_run(const td_node_part *g, json_t *o, char **argv,
                                   const char *latest) {
    return (td_runner_attempt){.job = g->job,
                               .uid = g->uid,
                               .kind = g->kind,
                               .attempt = g->attempt,
                               .node_rank = g->node_rank,
                               .nnodes = g->nnodes,
                               .nproc = g->nproc,
                               .procs = g->procs,
                               .dir = g->dir,
                               .argv = argv,
                               .env = NULL,
                               .latest_checkpoint = latest,
                               .stop_at_step =
                                   (long)json_integer_value(json_object_get(o, "stop_at_step")),
                               .spec_cwd = td_node_order_string(o, "cwd"),
                               .local_rank_arg = td_node_order_string(o, "local_rank_arg"),
                               .launch_self = json_is_true(json_object_get(o, "launch_self")),
                               .see_all_gpus = g->see_all_gpus,
                               .slots = g->devices,
                               .n_slots = g->slots,
                               .master_addr = td_node_order_string(o, "master_addr"),
                               .master_port = td_node_order_int(o, "master_port"),
                               .max_restarts = td_node_order_int(o, "max_restarts"),
                               .limits = g->cg_limits,
                               .disk_bytes = g->disk_bytes,
                               .metrics = json_object_get(o, "metrics"),
                               .deadline = 0 /* the master keeps the time limit */};
}

/* The steps in order: a step that can fail does nothing once one has (ok false), and err says
 * the first failure, which the part ends with. */
void td_node_part_start(td_node_parts *np, json_t *o, bool remote) {
    int per_proc =
        td_node_order_int(o, "gpus_per_proc") > 0 ? td_node_order_int(o, "gpus_per_proc") : 1;
    bool self = json_is_true(json_object_get(o, "launch_self"));
    td_node_part *g = new_node_part(np, o);
    if (g->nproc < 1 || g->nproc > 4096 || per_proc > 64 || g->nnodes < 1 || g->node_rank < 0 ||
        g->node_rank >= g->nnodes) {
        g->ended = true, g->exit_code = 1;
        snprintf(g->reason, sizeof g->reason, "node %s: the master's order is malformed", np->name);
        return;
    }
    take_order(np, g, o, self, per_proc);
    td_err err = {{0}};
    td_shepherd_base(g->sh.base, sizeof g->sh.base, g->dir, g->attempt, g->node_rank);
    g->log_start = td_calloc((size_t)g->procs, sizeof *g->log_start);
    g->log_sent = td_calloc((size_t)g->procs, sizeof *g->log_sent);
    bool ok = may_start(np, g, o, &err);
    td_job_files files;
    td_runner_files_for(np->runner, g->job, g->uid, &files);
    char checkpoint_root[PATH_MAX + 16], latest[2 * PATH_MAX + 32];
    const char *rbase = resume_root(g, o, &files, ok, checkpoint_root, sizeof checkpoint_root);
    bool command = strcmp(g->kind, "command") == 0;
    snprintf(latest, sizeof latest, "%s/%s", checkpoint_root, rbase ? rbase : "");
    char **argv = order_argv(np, g, o, remote, checkpoint_root, &ok, &err);
    if (ok && np->runner->cfg->gpus > 0) take_gpus(np, g, &ok, &err);
    td_runner_attempt r = order_run(g, o, argv, rbase && command ? latest : NULL);
    char **env = order_strv(json_object_get(o, "env"));
    r.env = env;
    char **logs = td_runner_logs(&r, g->log_start);
    if (ok) {
        json_t *notes = json_pack("{s:b}", "part", 1);
        ok = td_runner_start(np->runner, &r, g->log_start, logs, notes, &g->sh, g->cgroup,
                             sizeof g->cgroup, &err) == 0;
        json_decref(notes);
    }
    td_strv_free(argv);
    td_strv_free(env);
    td_strv_free(logs);
    say_started(np, g, ok, &err, r.master_addr, r.master_port);
}
