/* A command job's part of a submission (td_submit.h): its program, which may run it, its
 * environment, local_rank_arg, launch, metrics and cwd. */
#include "service/submit/td_submit_private.h"

#include "service/run/td_metric_patterns.h"
#include "base/td_strv.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What a command job may have besides TD_SUBMIT_SERVICE_KEYS. */
static const char *const COMMAND_KEYS[] = {"name",   "command", "env", "local_rank_arg",
                                           "launch", "metrics", "cwd", NULL};

/* Where the launcher will find prog with PATH path_env: the resolved file in out, or false.
 * Relative names are found by no one: the processes resolve them in their own cwd, not where
 * this check ran (the launcher skips relative PATH entries too, td_launch.c). */
static bool find_program(const char *prog, const char *path_env, char *out) {
    if (strchr(prog, '/')) return prog[0] == '/' && realpath(prog, out) != NULL;
    char dirs[8192];
    snprintf(dirs, sizeof dirs, "%s", path_env ? path_env : "/usr/local/bin:/usr/bin:/bin");
    char *save = NULL;
    for (char *d = strtok_r(dirs, ":", &save); d; d = strtok_r(NULL, ":", &save)) {
        if (d[0] != '/') continue;
        char cand[PATH_MAX * 2];
        snprintf(cand, sizeof cand, "%s/%s", *d ? d : ".", prog);
        if (access(cand, X_OK) == 0 && realpath(cand, out)) return true;
    }
    return false;
}

/* The daemon's command_jobs policy for argv[0] (with the job's own PATH when its env sets one,
 * as that is what the launch will search). */
static int command_allowed(const td_submission *s, const char *policy, td_reply_error *e) {
    if (!policy || strcmp(policy, "any") == 0) return 0;
    if (strcmp(policy, "none") == 0)
        return td_reply_fail(e, 403, "forbidden", "command",
                             "command jobs are disabled on this traind (command_jobs: \"none\"); "
                             "submit a training job spec instead");
    const char *path_env = getenv("PATH");
    for (char **v = s->env; v && *v; v++) {
        if (strncmp(*v, "PATH=", 5) == 0) path_env = *v + 5;
        /* the loader would run a library of the job's choosing inside an allowed program */
        if (strncmp(*v, "LD_", 3) == 0) {
            char name[64];
            snprintf(name, sizeof name, "%.*s", (int)strcspn(*v, "="), *v);
            return td_reply_fail(e, 403, "forbidden", "env",
                                 "env.%s: a command job may not set LD_* variables while "
                                 "command_jobs limits which programs may run",
                                 name);
        }
    }
    char found[PATH_MAX];
    if (strchr(s->argv[0], '/') && s->argv[0][0] != '/')
        return td_reply_fail(e, 403, "forbidden", "command[0]",
                             "command[0] \"%s\": a relative path names a different program in "
                             "each cwd; while command_jobs limits which programs may run, give "
                             "an absolute path or a name found on PATH",
                             s->argv[0]);
    if (!find_program(s->argv[0], path_env, found))
        return td_reply_fail(e, 403, "forbidden", "command[0]",
                             "command[0] \"%s\": no such executable here, and this traind runs "
                             "only the programs in command_jobs (%s)",
                             s->argv[0], policy);
    char list[8192];
    snprintf(list, sizeof list, "%s", policy);
    char *save = NULL;
    for (char *p = strtok_r(list, ":", &save); p; p = strtok_r(NULL, ":", &save)) {
        char allowed[PATH_MAX];
        if (realpath(p, allowed) && strcmp(allowed, found) == 0) return 0;
    }
    return td_reply_fail(e, 403, "forbidden", "command[0]",
                         "command[0] \"%s\" (%s) is not one of the programs this traind runs "
                         "as command jobs: %s (its command_jobs setting)",
                         s->argv[0], found, policy);
}

/* Whether rel is a relative path of plain names ("runs", "logs/tb"): no "..", "." or empty part. */
static bool plain_relative(const char *rel) {
    if (!*rel || rel[0] == '/' || strlen(rel) > 255) return false;
    for (const char *p = rel; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        p += n + (slash ? 1 : 0);
    }
    return true;
}

/* metrics: {"patterns": [...] (td_metric_patterns.h, checked by compiling them),
 * "tensorboard_dir": where the script's SummaryWriter writes, below its working directory
 * ("runs", SummaryWriter's default; "" for none)}. */
static int parse_metrics(td_submission *s, json_t *m, td_reply_error *e) {
    static const char *const KEYS[] = {"patterns", "tensorboard_dir", NULL};
    const char *const *lists[] = {KEYS, NULL};
    if (m && !json_is_object(m))
        return td_reply_fail(e, 400, "invalid_spec", "metrics",
                             "metrics: expected an object, {\"patterns\": [...], "
                             "\"tensorboard_dir\": \"runs\"}");
    if (m && td_submit_keys_in(m, "metrics", lists, "", e) != 0) return -1;
    s->metrics = json_object();
    json_t *list = json_object_get(m, "patterns");
    if (list) {
        int bad;
        td_err err = {{0}};
        td_metric_patterns *p = td_metric_patterns_new(list, &bad, &err);
        if (!p) {
            char path[64] = "metrics.patterns";
            if (bad >= 0) snprintf(path, sizeof path, "metrics.patterns[%d]", bad);
            return td_reply_fail(e, 400, "invalid_spec", path, "%s: %s", path, err.msg);
        }
        td_metric_patterns_free(p);
        json_object_set(s->metrics, "patterns", list);
    }
    json_t *dir = json_object_get(m, "tensorboard_dir");
    const char *d = dir ? json_string_value(dir) : "runs";
    if (!d || (*d && !plain_relative(d)))
        return td_reply_fail(e, 400, "invalid_spec", "metrics.tensorboard_dir",
                             "metrics.tensorboard_dir: expected a relative path of plain names "
                             "below the job's working directory (\"runs\", SummaryWriter's "
                             "default), or \"\" for none");
    json_object_set_new(s->metrics, "tensorboard_dir", json_string(d));
    return 0;
}

/* cwd: inside a data root (absolute: every node sees the same files there) or below the job's
 * work directory (relative: each node its own). */
static int parse_cwd(td_submission *s, json_t *cwd, const td_submit_rules *rules,
                     td_reply_error *e) {
    if (!cwd) return 0;
    const char *v = json_string_value(cwd);
    if (!v || !*v || strlen(v) >= sizeof s->cwd)
        return td_reply_fail(e, 400, "invalid_spec", "cwd",
                             "cwd: expected a directory path of at most %zu bytes",
                             sizeof s->cwd - 1);
    if (v[0] == '/' && !td_path_inside_roots(v, rules->data_roots, rules->n_roots))
        return td_reply_fail(e, 400, "invalid_spec", "cwd",
                             "cwd: %s is not inside a data root (the daemon's --data-root): "
                             "an absolute cwd must be on storage every node shares",
                             v);
    if (v[0] != '/' && !plain_relative(v))
        return td_reply_fail(e, 400, "invalid_spec", "cwd",
                             "cwd: \"%s\": a relative cwd is below the job's work directory, "
                             "made of plain names (no \"..\")",
                             v);
    snprintf(s->cwd, sizeof s->cwd, "%s", v);
    return 0;
}

int td_submit_parse_command(td_submission *s, json_t *root, const td_submit_rules *rules,
                            td_reply_error *e) {
    const char *const *lists[] = {COMMAND_KEYS, TD_SUBMIT_SERVICE_KEYS, NULL};
    if (td_submit_keys_in(root, "", lists, " (a command job has none of the training keys)", e) !=
        0)
        return -1;
    json_t *cmd = json_object_get(root, "command");
    if (!json_is_array(cmd) || json_array_size(cmd) == 0)
        return td_reply_fail(e, 400, "invalid_spec", "command",
                             "command: expected a non-empty array of strings, the program first");
    size_t n = json_array_size(cmd);
    s->argv = td_strv_new((int)n);
    for (size_t i = 0; i < n; i++) {
        json_t *a = json_array_get(cmd, i);
        if (!json_is_string(a) || (i == 0 && !*json_string_value(a))) {
            char path[64];
            snprintf(path, sizeof path, "command[%zu]", i);
            return td_reply_fail(e, 400, "invalid_spec", path, "%s: expected a%s string", path,
                                 i == 0 ? " non-empty" : "");
        }
        s->argv[i] = td_str_dup(json_string_value(a));
    }
    json_t *env = json_object_get(root, "env");
    size_t k = 0;
    /* one more for PYTHONUNBUFFERED */
    s->env = td_strv_new(env && json_is_object(env) ? (int)json_object_size(env) + 1 : 1);
    if (env) {
        if (!json_is_object(env))
            return td_reply_fail(e, 400, "invalid_spec", "env",
                                 "env: expected an object of string values");
        const char *key;
        json_t *v;
        json_object_foreach(env, key, v) {
            char path[160];
            snprintf(path, sizeof path, "env.%.150s", key);
            if (!json_is_string(v))
                return td_reply_fail(e, 400, "invalid_spec", path, "%s: expected a string", path);
            if (!*key || strchr(key, '='))
                return td_reply_fail(e, 400, "invalid_spec", path,
                                     "%s: a variable name must be non-empty, without '='", path);
            size_t len = strlen(key) + strlen(json_string_value(v)) + 2;
            s->env[k] = td_malloc(len);
            snprintf(s->env[k++], len, "%s=%s", key, json_string_value(v));
        }
    }
    /* Python block-buffers stdout into a pipe, so a script's metric lines would reach the
     * daemon only when 8 KiB had piled up or at exit; as torchrun users expect print() to show
     * at once, the job gets unbuffered output unless its env says otherwise */
    if (!json_object_get(env, "PYTHONUNBUFFERED")) s->env[k++] = td_str_dup("PYTHONUNBUFFERED=1");
    /* scripts written for python -m torch.distributed.launch read their local rank from an
     * argument: true gives its old spelling, or the option's name is given */
    json_t *lra = json_object_get(root, "local_rank_arg");
    if (json_is_true(lra))
        snprintf(s->local_rank_arg, sizeof s->local_rank_arg, "--local_rank");
    else if (json_is_string(lra) && (strcmp(json_string_value(lra), "--local_rank") == 0 ||
                                     strcmp(json_string_value(lra), "--local-rank") == 0))
        snprintf(s->local_rank_arg, sizeof s->local_rank_arg, "%s", json_string_value(lra));
    else if (lra && !json_is_false(lra))
        return td_reply_fail(e, 400, "invalid_spec", "local_rank_arg",
                             "local_rank_arg: expected true (--local_rank=N), \"--local_rank\" "
                             "or \"--local-rank\", or false");
    /* a script that starts its own processes (mp.spawn): one process per node, holding the
     * node's share of the job's GPUs; nproc_per_node says how many it should start */
    json_t *launch = json_object_get(root, "launch");
    if (launch && !(json_is_string(launch) && (strcmp(json_string_value(launch), "self") == 0 ||
                                               strcmp(json_string_value(launch), "torchrun") == 0)))
        return td_reply_fail(e, 400, "invalid_spec", "launch",
                             "launch: expected \"torchrun\" (the daemon starts every process, "
                             "the default) or \"self\" (it starts one per node, which starts the "
                             "rest itself, as mp.spawn does)");
    s->launch_self = launch && strcmp(json_string_value(launch), "self") == 0;
    if (s->launch_self && s->local_rank_arg[0])
        return td_reply_fail(e, 400, "invalid_spec", "local_rank_arg",
                             "local_rank_arg: a job with launch \"self\" starts one process per "
                             "node, which gives its own processes their ranks; leave it out");
    if (parse_metrics(s, json_object_get(root, "metrics"), e) != 0) return -1;
    if (parse_cwd(s, json_object_get(root, "cwd"), rules, e) != 0) return -1;
    if (!s->name[0]) {
        const char *base = strrchr(s->argv[n > 1 ? 1 : 0], '/');
        snprintf(s->name, sizeof s->name, "%s", base ? base + 1 : s->argv[n > 1 ? 1 : 0]);
        /* a path ending in '/' leaves nothing after it (found by fuzzing: "u /") */
        if (!s->name[0]) snprintf(s->name, sizeof s->name, "command");
    }
    return command_allowed(s, rules->command_jobs, e);
}
