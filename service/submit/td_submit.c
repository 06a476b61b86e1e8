#include "service/submit/td_submit.h"

#include "base/td_json.h"
#include "data/td_data.h"
#include "spec/td_spec.h"
#include "service/submit/td_submit_private.h"
#include "base/td_strv.h"

#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int int_member(json_t *obj, const char *path, const char *key, long def, long min, long max,
                      int *out, td_reply_error *e) {
    long v;
    td_err err = {{0}};
    if (td_json_int(obj, path, key, false, def, min, max, &v, &err) != 0)
        return td_submit_spec_error(e, &err);
    *out = (int)v;
    return 0;
}

/* What the daemon adds to a job spec, and what a command job has instead of the worker's. */
#define NODE_NAME_CHARS "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-"

const char *const TD_SUBMIT_SERVICE_KEYS[] = {"resources", "restart", "priority", NULL};

/* resources.memory_gb, pids, cpu_weight and disk_gb, within what the daemon allows. */
static int parse_limits(td_submission *s, json_t *r, const td_submit_rules *rules,
                        td_reply_error *e) {
    const td_job_limits *lim = rules->limits;
    double max_memory = lim && lim->max_memory_gb > 0 ? lim->max_memory_gb : 1e7;
    double max_disk = lim && lim->max_disk_gb > 0 ? lim->max_disk_gb : 1e9;
    long max_pids = lim && lim->max_pids > 0 ? lim->max_pids : 4194304;
    td_err err = {{0}};
    if (td_json_number(r, "resources", "memory_gb", false, 0, 1.0 / 1024, max_memory, &s->memory_gb,
                       &err) != 0 ||
        td_json_number(r, "resources", "disk_gb", false, 0, 1.0 / 1024, max_disk, &s->disk_gb,
                       &err) != 0 ||
        td_json_int(r, "resources", "pids", false, 0, 16, max_pids, &s->pids, &err) != 0)
        return td_submit_spec_error(e, &err);
    return int_member(r, "resources", "cpu_weight", 0, 1, 10000, &s->cpu_weight, e);
}

static int parse_resources(td_submission *s, json_t *root, const td_submit_rules *rules,
                           td_reply_error *e) {
    static const char *const RESOURCE_KEYS[] = {
        "nproc",        "nproc_per_node", "nnodes", "nodes",      "time_limit_s", "gpus_per_proc",
        "visible_gpus", "memory_gb",      "pids",   "cpu_weight", "disk_gb",      NULL};
    static const char *const RESTART_KEYS[] = {"max_restarts", NULL};
    const char *const *resource_keys[] = {RESOURCE_KEYS, NULL};
    const char *const *restart_keys[] = {RESTART_KEYS, NULL};
    td_err err = {{0}};
    json_t *r, *t;
    if (td_json_object(root, "", "resources", false, &r, &err) != 0 ||
        td_json_object(root, "", "restart", false, &t, &err) != 0 ||
        td_json_string(root, "", "name", false, "", s->name, sizeof s->name, &err) != 0)
        return td_submit_spec_error(e, &err);
    s->nproc = 1;
    s->nnodes = 1;
    s->gpus_per_proc = 1;
    if (r) {
        if (td_submit_keys_in(r, "resources", resource_keys, NULL, e) != 0) return -1;
        json_t *per_node = json_object_get(r, "nproc_per_node");
        if (per_node && json_object_get(r, "nproc"))
            return td_reply_fail(e, 400, "invalid_spec", "resources.nproc_per_node",
                                 "resources: give nproc (one node) or nproc_per_node (torchrun's "
                                 "name, with nnodes), not both");
        if (int_member(r, "resources", per_node ? "nproc_per_node" : "nproc", 1, 1, 4096, &s->nproc,
                       e) != 0)
            return -1;
        json_t *nodes = json_object_get(r, "nodes");
        if (nodes && (!json_is_array(nodes) || json_array_size(nodes) == 0))
            return td_reply_fail(e, 400, "invalid_spec", "resources.nodes",
                                 "resources.nodes: expected a non-empty array of node names");
        size_t n_nodes = nodes ? json_array_size(nodes) : 0;
        if (n_nodes > 4096)
            return td_reply_fail(e, 400, "invalid_spec", "resources.nodes",
                                 "resources.nodes: %zu names, at most 4096", n_nodes);
        if (int_member(r, "resources", "nnodes", n_nodes ? (long)n_nodes : 1, 1, 4096, &s->nnodes,
                       e) != 0)
            return -1;
        if (n_nodes) {
            s->nodes = td_strv_new((int)n_nodes);
            for (size_t i = 0; i < n_nodes; i++) {
                const char *name = json_string_value(json_array_get(nodes, i));
                char field[64];
                snprintf(field, sizeof field, "resources.nodes[%zu]", i);
                if (!name || !*name || strlen(name) > 63 ||
                    strspn(name, NODE_NAME_CHARS) != strlen(name))
                    return td_reply_fail(e, 400, "invalid_spec", field,
                                         "%s: expected a node name (1 to 63 of A-Z a-z 0-9 . _ -)",
                                         field);
                for (size_t k = 0; k < i; k++)
                    if (strcmp(s->nodes[k], name) == 0)
                        return td_reply_fail(e, 400, "invalid_spec", field,
                                             "%s: \"%s\" is listed twice", field, name);
                s->nodes[i] = td_str_dup(name);
            }
            if ((size_t)s->nnodes > n_nodes)
                return td_reply_fail(e, 400, "invalid_spec", "resources.nnodes",
                                     "resources.nnodes is %d but resources.nodes names only %zu "
                                     "node%s to run on",
                                     s->nnodes, n_nodes, n_nodes == 1 ? "" : "s");
        }
        if (td_json_number(r, "resources", "time_limit_s", false, 0, 1e-3, 1e8, &s->time_limit_s,
                           &err) != 0)
            return td_submit_spec_error(e, &err);
        /* a slot is a GPU on a GPU node (a CPU share elsewhere): a process may hold several */
        if (int_member(r, "resources", "gpus_per_proc", 1, 1, 64, &s->gpus_per_proc, e) != 0)
            return -1;
        /* torchrun leaves every GPU visible and scripts pick theirs as cuda:LOCAL_RANK; a
         * process that sees only its own finds it at cuda:0 ("own", safer: no rank can touch
         * another's GPU). "job" shows each process the node's GPUs of the job, in local rank
         * order, so that cuda:LOCAL_RANK is its own, as under torchrun */
        json_t *vis = json_object_get(r, "visible_gpus");
        if (vis && !(json_is_string(vis) && (strcmp(json_string_value(vis), "own") == 0 ||
                                             strcmp(json_string_value(vis), "job") == 0)))
            return td_reply_fail(e, 400, "invalid_spec", "resources.visible_gpus",
                                 "resources.visible_gpus: expected \"own\" (each process sees "
                                 "only its GPUs, the default) or \"job\" (every process sees "
                                 "all of the job's on its node, as cuda:LOCAL_RANK scripts need)");
        s->see_all_gpus = vis && strcmp(json_string_value(vis), "job") == 0;
        if (!rules->cluster && s->nnodes > 1)
            return td_reply_fail(e, 400, "invalid_spec", "resources.nnodes",
                                 "resources.nnodes: %d nodes, but this traind is not a cluster's "
                                 "master",
                                 s->nnodes);
        if (!rules->cluster && s->gpus_per_proc > 1 && s->nproc * s->gpus_per_proc > rules->slots &&
            json_object_get(root, "command"))
            return td_reply_fail(e, 400, "invalid_spec", "resources.gpus_per_proc",
                                 "resources: %d processes of %d GPUs (slots) need %d slots, "
                                 "but this node has %d",
                                 s->nproc, s->gpus_per_proc, s->nproc * s->gpus_per_proc,
                                 rules->slots);
        if (parse_limits(s, r, rules, e) != 0) return -1;
        if (!rules->cluster && s->nproc > rules->slots)
            return td_reply_fail(e, 400, "invalid_spec",
                                 per_node ? "resources.nproc_per_node" : "resources.nproc",
                                 "resources.%s: %d processes, but this node has %d slots",
                                 per_node ? "nproc_per_node" : "nproc", s->nproc, rules->slots);
    }
    if (t && (td_submit_keys_in(t, "restart", restart_keys, NULL, e) != 0 ||
              int_member(t, "restart", "max_restarts", 0, 0, 1000, &s->max_restarts, e) != 0))
        return -1;
    return int_member(root, "", "priority", 0, -1000000, 1000000, &s->priority, e);
}

static int check_path(const char *path, const char *field, const td_submit_rules *rules,
                      td_reply_error *e) {
    if (!path[0] || td_path_inside_roots(path, rules->data_roots, rules->n_roots)) return 0;
    char roots[512] = "";
    for (int i = 0; i < rules->n_roots; i++)
        snprintf(roots + strlen(roots), sizeof roots - strlen(roots), "%s%s", i ? ", " : "",
                 rules->data_roots[i]);
    return td_reply_fail(e, 400, "invalid_spec", field,
                         "%s: \"%s\" is not inside a data root (after resolving symlinks); "
                         "allowed: %s",
                         field, path, roots);
}

/* one_file: csv and text, whose split is {"path": ...} (kept in images) */
static int check_split(const td_split_spec *sp, const char *where, bool one_file,
                       const td_submit_rules *rules, td_reply_error *e) {
    char field[64];
    snprintf(field, sizeof field, "data.%s.%s", where, one_file ? "path" : "images");
    if (check_path(sp->images, field, rules, e) != 0) return -1;
    snprintf(field, sizeof field, "data.%s.labels", where);
    if (check_path(sp->labels, field, rules, e) != 0) return -1;
    for (int i = 0; i < sp->n_files; i++) {
        snprintf(field, sizeof field, "data.%s.files[%d]", where, i);
        if (check_path(sp->files[i], field, rules, e) != 0) return -1;
    }
    return 0;
}

/* The JSON path of the split's file that an error message starts with (loaders begin their
 * messages with the file's path), else the split itself. */
static void field_of_file(const td_split_spec *sp, const char *where, const char *msg, char *field,
                          size_t len) {
    snprintf(field, len, "data.%s", where);
    size_t best = 0;
    const char *names[2] = {"images", "labels"};
    const char *paths[2] = {sp->images, sp->labels};
    for (int i = 0; i < 2; i++) {
        size_t n = strlen(paths[i]);
        /* one file given as both: the message says which role it failed in */
        bool tie = n == best && i == 1 && strstr(msg, " label");
        if ((n > best || tie) && strncmp(msg, paths[i], n) == 0 && msg[n] == ':') {
            best = n;
            snprintf(field, len, "data.%s.%s", where, names[i]);
        }
    }
    for (int i = 0; i < sp->n_files; i++) {
        size_t n = strlen(sp->files[i]);
        if (n > best && strncmp(msg, sp->files[i], n) == 0 && msg[n] == ':') {
            best = n;
            snprintf(field, len, "data.%s.files[%d]", where, i);
        }
    }
}

/* Reads what is cheap to read of a split (headers, sizes, labels) and checks it as the worker
 * would at its start: the files exist and are what the format says, labels match the samples
 * one to one and lie within the model's classes. 1: nothing on disk to check (synthetic). */
static int check_data(const td_data_spec *d, int num_classes, const td_split_spec *sp,
                      const char *where, td_data_probe *p, td_reply_error *e) {
    td_err err = {{0}};
    int rc = td_data_probe_split(d, sp, p, &err);
    if (rc > 0) return 1;
    char field[128];
    if (rc != 0) {
        field_of_file(sp, where, err.msg, field, sizeof field);
        if (d->format == TD_DATA_CSV || d->format == TD_DATA_TEXT || d->format == TD_DATA_TOKENS)
            snprintf(field, sizeof field, "data.%s.path",
                     sp == &d->val && d->val_from_train ? "train" : where);
        return td_reply_fail(e, 400, "invalid_data", field, "%s: %s", field, err.msg);
    }
    if (num_classes > 0 && p->max_label >= num_classes) {
        const char *labels = d->format == TD_DATA_CIFAR10 ? "files"
                             : d->format == TD_DATA_CSV   ? "path"
                                                          : "labels";
        snprintf(field, sizeof field, "data.%s.%s", where, labels);
        return td_reply_fail(e, 400, "invalid_data", field,
                             "%s: holds label %d but model.num_classes is %d (labels must be "
                             "0..%d)",
                             field, p->max_label, num_classes, num_classes - 1);
    }
    return 0;
}

static int check_splits(const td_job *job, td_reply_error *e) {
    td_data_probe train = {0}, val = {0};
    int rc = check_data(&job->data, job->model.num_classes, &job->data.train, "train", &train, e);
    if (rc < 0) return -1;
    if (!job->data.val.present) return 0;
    int rv = check_data(&job->data, job->model.num_classes, &job->data.val, "val", &val, e);
    if (rv < 0) return -1;
    td_shape a = train.shape, b = val.shape;
    if (rc == 0 && rv == 0 && train.n > 0 && val.n > 0 &&
        (a.c != b.c || a.h != b.h || a.w != b.w || a.spatial != b.spatial)) {
        char sa[64], sb[64];
        td_shape_format(a, sa, sizeof sa);
        td_shape_format(b, sb, sizeof sb);
        return td_reply_fail(e, 400, "invalid_data", "data.val",
                             "data.val: samples have shape %s but training samples %s", sb, sa);
    }
    return 0;
}

static int parse_train(td_submission *s, json_t *root, const td_submit_rules *rules,
                       td_reply_error *e) {
    const char *const *lists[] = {td_job_keys, TD_SUBMIT_SERVICE_KEYS, NULL};
    if (td_submit_keys_in(root, "", lists, "; or, for a command job: command, env", e) != 0)
        return -1;
    if (s->gpus_per_proc != 1)
        return td_reply_fail(e, 400, "invalid_spec", "resources.gpus_per_proc",
                             "resources.gpus_per_proc: traind-worker drives one GPU per process; "
                             "give a train job more processes (nproc_per_node) instead, or run "
                             "a script that uses several as a command job");
    s->spec = json_deep_copy(root);
    for (int i = 0; TD_SUBMIT_SERVICE_KEYS[i]; i++)
        json_object_del(s->spec, TD_SUBMIT_SERVICE_KEYS[i]);
    /* checked as it will run: the daemon gives a checkpoint section without a dir one in the
     * job's directory (td_jobs), so validate with a stand-in there */
    json_t *check = json_deep_copy(s->spec);
    json_t *ck = json_object_get(check, "checkpoint");
    if (json_is_object(ck) && !json_object_get(ck, "dir")) {
        char dir[4096];
        snprintf(dir, sizeof dir, "%s/jobs/new/checkpoints", rules->state_dir);
        json_object_set_new(ck, "dir", json_string(dir));
    }
    char *text = json_dumps(check, JSON_COMPACT);
    json_decref(check);
    TD_CHECK_ALLOC(text, "checking a spec");
    td_job job;
    td_err err = {{0}};
    int rc = td_job_parse_string(&job, text, &err);
    free(text);
    if (rc != 0) return td_submit_spec_error(e, &err);
    bool one_file = job.data.format == TD_DATA_CSV || job.data.format == TD_DATA_TEXT ||
                    job.data.format == TD_DATA_TOKENS;
    rc = check_split(&job.data.train, "train", one_file, rules, e);
    if (rc == 0 && job.data.val.present && !job.data.val_from_train)
        rc = check_split(&job.data.val, "val", one_file, rules, e);
    if (rc == 0) rc = check_path(job.model.init_from, "model.init_from", rules, e);
    if (rc == 0) rc = check_path(job.checkpoint.dir, "checkpoint.dir", rules, e);
    if (rc == 0 && strcmp(job.checkpoint.resume_from, "latest") != 0)
        rc = check_path(job.checkpoint.resume_from, "resume_from", rules, e);
    if (rc == 0) rc = check_splits(&job, e); /* only once every path is known to be allowed */
    if (!s->name[0]) snprintf(s->name, sizeof s->name, "%s", job.name[0] ? job.name : "job");
    td_job_free(&job);
    return rc;
}

int td_submission_parse(td_submission *s, const char *body, size_t len,
                        const td_submit_rules *rules, td_reply_error *e) {
    memset(s, 0, sizeof *s);
    json_error_t jerr;
    json_t *root = json_loadb(body, len, JSON_REJECT_DUPLICATES, &jerr);
    if (!root)
        return td_reply_fail(e, 400, "bad_json", NULL,
                             "the body is not valid JSON: line %d, column %d: %s", jerr.line,
                             jerr.column, jerr.text);
    int rc = -1;
    if (!json_is_object(root)) {
        td_reply_fail(e, 400, "invalid_spec", NULL, "the body must be a JSON object (a job spec)");
        goto out;
    }
    if (parse_resources(s, root, rules, e) != 0) goto out;
    s->command = json_object_get(root, "command") != NULL;
    rc = s->command ? td_submit_parse_command(s, root, rules, e) : parse_train(s, root, rules, e);
out:
    json_decref(root);
    if (rc != 0) td_submission_free(s);
    return rc;
}

void td_submission_placement(const char *body, int *nnodes, char ***nodes, int *gpus_per_proc,
                             bool *launch_self, bool *see_all_gpus) {
    json_t *root = json_loads(body, 0, NULL);
    json_t *r = json_object_get(root, "resources");
    json_t *vis = json_object_get(r, "visible_gpus");
    *see_all_gpus = json_is_string(vis) && strcmp(json_string_value(vis), "job") == 0;
    json_t *g = json_object_get(r, "gpus_per_proc");
    *gpus_per_proc = json_is_integer(g) ? (int)json_integer_value(g) : 1;
    *launch_self = json_is_string(json_object_get(root, "launch")) &&
                   strcmp(json_string_value(json_object_get(root, "launch")), "self") == 0;
    json_t *list = json_object_get(r, "nodes");
    size_t n = json_is_array(list) ? json_array_size(list) : 0;
    json_t *nn = json_object_get(r, "nnodes");
    *nnodes = json_is_integer(nn) ? (int)json_integer_value(nn) : n ? (int)n : 1;
    *nodes = NULL;
    if (n) {
        *nodes = td_strv_new((int)n);
        for (size_t i = 0; i < n; i++) {
            const char *name = json_string_value(json_array_get(list, i));
            (*nodes)[i] = td_str_dup(name ? name : "");
        }
    }
    json_decref(root);
}

void td_submission_limits(const char *body, double *memory_gb, long *pids, int *cpu_weight,
                          double *disk_gb) {
    json_t *root = json_loads(body, 0, NULL);
    json_t *r = json_object_get(root, "resources");
    *memory_gb = json_number_value(json_object_get(r, "memory_gb"));
    *disk_gb = json_number_value(json_object_get(r, "disk_gb"));
    *pids = (long)json_integer_value(json_object_get(r, "pids"));
    *cpu_weight = (int)json_integer_value(json_object_get(r, "cpu_weight"));
    json_decref(root);
}

void td_submission_free(td_submission *s) {
    json_decref(s->spec);
    td_strv_free(s->nodes);
    s->nodes = NULL;
    td_strv_free(s->argv);
    td_strv_free(s->env);
    json_decref(s->metrics);
    s->metrics = NULL;
    s->spec = NULL;
    s->argv = s->env = NULL;
}
