/* traind-shepherd's spec (SPEC.json, written by the daemon: service/run/td_shepherd_protocol.h)
 * read into what it runs. Apart from the program's running parts: a spec it cannot use ends it
 * before anything starts (exit status 2, said on stderr). */
#include "programs/shepherd.h"

#include "base/td_json.h"
#include "base/td_strv.h"

#include <jansson.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void fail_spec(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "traind-shepherd: ");
    vfprintf(stderr, fmt, ap);
    fputc('\n', stderr);
    va_end(ap);
    exit(2);
}

/* A JSON array of strings into a NULL-terminated vector (NULL when the member is null or
 * absent and not required). */
static char **strings(json_t *o, const char *key, bool required, const char *path) {
    json_t *a = json_object_get(o, key);
    if (!a || json_is_null(a)) {
        if (required) fail_spec("%s: %s: missing", path, key);
        return NULL;
    }
    if (!json_is_array(a) || json_array_size(a) > MAX_PROCS * 16)
        fail_spec("%s: %s: expected an array of strings", path, key);
    char **v = td_strv_new((int)json_array_size(a));
    size_t i;
    json_t *s;
    json_array_foreach(a, i, s) {
        if (!json_is_string(s)) fail_spec("%s: %s[%zu]: expected a string", path, key, i);
        v[i] = td_str_dup(json_string_value(s));
    }
    return v;
}

static void text(json_t *o, const char *key, char *out, size_t len, bool required,
                 const char *path) {
    td_err err = {{0}};
    if (td_json_string(o, "", key, required, "", out, len, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
}

static long integer(json_t *o, const char *key, long def, long min, long max, bool required,
                    const char *path) {
    td_err err = {{0}};
    long v;
    if (td_json_int(o, "", key, required, def, min, max, &v, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
    return v;
}

static double number(json_t *o, const char *key, double def, double min, double max,
                     const char *path) {
    td_err err = {{0}};
    double v;
    if (td_json_number(o, "", key, false, def, min, max, &v, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
    return v;
}

static int count(char **v) {
    int n = 0;
    while (v && v[n]) n++;
    return n;
}

/* "user": {"name", "uid", "gid", "groups": [...], "lookup_groups"}: who the processes run as. */
static void read_user(spec *s, json_t *user, const char *path) {
    if (!json_is_object(user)) fail_spec("%s: user: expected {\"name\", \"uid\", \"gid\"}", path);
    text(user, "name", s->user.name, sizeof s->user.name, true, path);
    s->user.uid = (uid_t)integer(user, "uid", 0, 1, UINT_MAX - 1, true, path);
    s->user.gid = (gid_t)integer(user, "gid", 0, 0, UINT_MAX - 1, true, path);
    s->user.lookup_groups = json_is_true(json_object_get(user, "lookup_groups"));
    json_t *groups = json_object_get(user, "groups");
    if (groups && (!json_is_array(groups) || json_array_size(groups) > TD_IDENTITY_GROUPS))
        fail_spec("%s: user.groups: expected at most %d group ids", path, TD_IDENTITY_GROUPS);
    size_t i;
    json_t *g;
    json_array_foreach(groups, i, g) {
        if (!json_is_integer(g) || json_integer_value(g) < 0)
            fail_spec("%s: user.groups[%zu]: expected a group id", path, i);
        s->user.groups[s->user.n_groups++] = (gid_t)json_integer_value(g);
    }
    s->user.drop = true;
    s->launch.user = &s->user;
}

void read_spec(spec *s, const char *path) {
    json_error_t je;
    json_t *o = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!o) fail_spec("%s:%d:%d: %s", path, je.line, je.column, je.text);
    if (!json_is_object(o)) fail_spec("%s: expected a JSON object", path);
    memset(s, 0, sizeof *s);
    td_launch_config *c = &s->launch;
    s->argv = strings(o, "argv", true, path);
    if (!s->argv[0]) fail_spec("%s: argv: empty", path);
    s->env = strings(o, "env", false, path);
    s->devices = strings(o, "devices", false, path);
    s->logs = strings(o, "logs", true, path);
    text(o, "dir", s->dir, sizeof s->dir, true, path);
    /* absent or "": process 0's stdout goes to its log like the others' (a node that does not
     * run global rank 0) */
    text(o, "output", s->output, sizeof s->output, false, path);
    text(o, "socket", s->socket_path, sizeof s->socket_path, true, path);
    text(o, "status", s->status_path, sizeof s->status_path, true, path);
    text(o, "master_addr", c->master_addr, sizeof c->master_addr, true, path);
    text(o, "run_id", c->run_id, sizeof c->run_id, true, path);
    text(o, "local_rank_arg", s->local_rank_arg, sizeof s->local_rank_arg, false, path);
    text(o, "token", s->token, sizeof s->token, true, path);
    if (strlen(s->token) < 16) fail_spec("%s: token: expected at least 16 characters", path);
    c->nproc_per_node = (int)integer(o, "nproc", 1, 1, MAX_PROCS, true, path);
    c->nnodes = (int)integer(o, "nnodes", 1, 1, 1 << 16, false, path);
    c->node_rank = (int)integer(o, "node_rank", 0, 0, c->nnodes - 1, false, path);
    c->master_port = (int)integer(o, "master_port", 0, 1, 65535, true, path);
    c->max_restarts = (int)integer(o, "max_restarts", 0, 0, 1 << 20, false, path);
    s->attempt = (int)integer(o, "attempt", 0, 0, INT_MAX, false, path);
    s->daemon_fd = (int)integer(o, "daemon_fd", -1, -1, INT_MAX, false, path);
    s->listen_fd = (int)integer(o, "listen_fd", -1, -1, INT_MAX, false, path);
    c->grace_s = number(o, "grace_s", 10, 0, 3600, path);
    s->deadline = number(o, "deadline", 0, 0, 1e11, path);
    s->orphan_s = number(o, "orphan_timeout_s", 600, 0.1, 30 * 86400.0, path);
    td_err err = {{0}};
    bool launch_self = false, no_bind = false;
    if (td_json_bool(o, "", "launch_self", false, &launch_self, &err) != 0 ||
        td_json_bool(o, "", "no_cpu_bind", false, &no_bind, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
    c->launch_self = launch_self;
    c->no_cpu_bind = no_bind;
    int procs = launch_self ? 1 : c->nproc_per_node;
    if (count(s->logs) != procs)
        fail_spec("%s: logs: expected %d paths (one per process), found %d", path, procs,
                  count(s->logs));
    if (s->devices && count(s->devices) != procs)
        fail_spec("%s: devices: expected %d entries (one per process), found %d", path, procs,
                  count(s->devices));
    c->argv = s->argv;
    c->extra_env = s->env;
    c->devices = (const char *const *)s->devices;
    c->cwd = s->dir;
    c->local_rank_arg = s->local_rank_arg[0] ? s->local_rank_arg : NULL;
    json_t *user = json_object_get(o, "user");
    if (user && !json_is_null(user)) read_user(s, user, path);
    /* the attempt's cgroup: the shepherd moves into its "shepherd", the processes into "ranks" */
    text(o, "cgroup", s->cgroup, sizeof s->cgroup, false, path);
    if (s->cgroup[0]) {
        snprintf(s->ranks_cgroup, sizeof s->ranks_cgroup, "%s/ranks", s->cgroup);
        c->cgroup = s->ranks_cgroup;
    }
    c->max_file_bytes = integer(o, "max_file_bytes", 0, 0, LONG_MAX, false, path);
    bool as_job = false;
    if (td_json_bool(o, "", "dir_as_job", false, &as_job, &err) != 0)
        fail_spec("%s: %s", path, err.msg);
    s->dir_as_job = as_job;
    s->dir_fd = -1;
    json_t *metrics = json_object_get(o, "metrics");
    json_t *patterns = json_object_get(metrics, "patterns");
    int bad;
    if (patterns && !(s->patterns = td_metric_patterns_new(patterns, &bad, &err)))
        fail_spec("%s: metrics.patterns[%d]: %s", path, bad, err.msg);
    text(metrics ? metrics : o, "tensorboard_dir", s->tensorboard_dir, sizeof s->tensorboard_dir,
         false, path);
    s->max_log_bytes = integer(o, "max_log_bytes", 0, 0, LONG_MAX, false, path);
    json_decref(o);
}
