/* The subcommands (trainctl.h): each parses its own options, calls the API and prints for
 * people (tables, summaries) or, with --json, the API's JSON for scripts. */
#include "trainctl.h"

#include <ctype.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* --set PATH=VALUE on spec: PATH as the API's error messages write it (train.optimizer.lr,
 * data.train.files[2]); VALUE is JSON when it parses as JSON, else a string. */
static int set_path(json_t *spec, const char *arg) {
    const char *eq = strchr(arg, '=');
    if (!eq || eq == arg)
        return tc_error("--set \"%s\": expected PATH=VALUE, e.g. train.optimizer.lr=0.01", arg);
    char path[512];
    snprintf(path, sizeof path, "%.*s", (int)(eq - arg), arg);
    json_t *value = json_loads(eq + 1, JSON_DECODE_ANY, NULL);
    if (!value) value = json_string(eq + 1);
    json_t *at = spec;
    char *p = path;
    while (*p) {
        char key[256];
        size_t n = strcspn(p, ".[");
        long index = -1;
        if (*p == '[') {
            char *end;
            index = strtol(p + 1, &end, 10);
            if (end == p + 1 || *end != ']' || index < 0) {
                json_decref(value);
                return tc_error("--set %s: a malformed index at \"%s\"", path, p);
            }
            p = end + 1;
        } else {
            if (n == 0 || n >= sizeof key) {
                json_decref(value);
                return tc_error("--set %s: an empty or too long name at \"%s\"", path, p);
            }
            snprintf(key, sizeof key, "%.*s", (int)n, p);
            p += n;
        }
        if (*p == '.') p++;
        bool last = *p == 0;
        if (index >= 0) {
            if (!json_is_array(at) || (size_t)index > json_array_size(at)) {
                json_decref(value);
                return tc_error("--set %s: [%ld] is not an element of an array (or just past "
                                "its end)",
                                path, index);
            }
            if (last) {
                if ((size_t)index == json_array_size(at))
                    json_array_append_new(at, value);
                else
                    json_array_set_new(at, (size_t)index, value);
                return 0;
            }
            at = json_array_get(at, (size_t)index);
            if (!at) {
                json_decref(value);
                return tc_error("--set %s: [%ld] is past the array's end", path, index);
            }
        } else {
            if (!json_is_object(at)) {
                json_decref(value);
                return tc_error("--set %s: \"%s\" is not inside an object", path, key);
            }
            if (last) {
                json_object_set_new(at, key, value);
                return 0;
            }
            json_t *next = json_object_get(at, key);
            if (!next) { /* made as the path needs: an object, or an array before [0] */
                next = *p == '[' ? json_array() : json_object();
                json_object_set_new(at, key, next);
            }
            at = next;
        }
    }
    json_decref(value);
    return tc_error("--set %s: nothing to set", path);
}

int tc_cmd_submit(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --name --nproc --nnodes --set --follow --json --quiet --cancel-on-interrupt ", 1, 1);
    const char *from = a.pos[0];
    json_error_t je;
    json_t *spec = strcmp(from, "-") == 0 ? json_loadf(stdin, JSON_REJECT_DUPLICATES, &je)
                                          : json_load_file(from, JSON_REJECT_DUPLICATES, &je);
    if (!spec)
        return tc_error("%s:%d:%d: %s", strcmp(from, "-") == 0 ? "(stdin)" : from, je.line,
                        je.column, je.text);
    if (!json_is_object(spec)) {
        json_decref(spec);
        return tc_error("%s: expected a JSON object (a job spec, api/README.md)", from);
    }
    int rc = 0;
    if (a.name) json_object_set_new(spec, "name", json_string(a.name));
    if (a.nproc > 0 || a.nnodes > 0) {
        json_t *r = json_object_get(spec, "resources");
        if (!json_is_object(r)) {
            r = json_object();
            json_object_set_new(spec, "resources", r);
        }
        bool across =
            a.nnodes > 0 || json_object_get(r, "nnodes") || json_object_get(r, "nproc_per_node");
        if (a.nnodes > 0) json_object_set_new(r, "nnodes", json_integer(a.nnodes));
        if (a.nproc > 0 && across) {
            json_object_del(r, "nproc");
            json_object_set_new(r, "nproc_per_node", json_integer(a.nproc));
        } else if (a.nproc > 0) {
            json_object_set_new(r, "nproc", json_integer(a.nproc));
        } else if (across && json_object_get(r, "nproc")) { /* --nnodes on an nproc spec */
            json_object_set(r, "nproc_per_node", json_object_get(r, "nproc"));
            json_object_del(r, "nproc");
        }
    }
    for (int i = 0; i < a.n_sets && rc == 0; i++) rc = set_path(spec, a.sets[i]);
    char *body = rc == 0 ? json_dumps(spec, JSON_COMPACT | JSON_REAL_PRECISION(15)) : NULL;
    json_decref(spec);
    if (rc != 0) return rc;
    tc_reply r;
    char err[512] = "";
    tc_request(c, "POST", "/v1/jobs", body, &r, err, sizeof err);
    free(body);
    json_t *job = r.status == 201 ? tc_reply_json(&r) : NULL;
    if (!job) {
        rc = tc_fail_reply(c, &r, err);
        tc_reply_free(&r);
        return rc;
    }
    tc_reply_free(&r);
    long id = (long)json_integer_value(json_object_get(job, "id"));
    if (a.json && !a.follow)
        tc_print_json(job);
    else if (a.quiet) /* for id=$(trainctl submit -q spec.json) */
        printf("%ld\n", id);
    else if (!a.json)
        printf("job %ld submitted: %s, %s\n", id, tc_str(job, "name", "?"),
               tc_str(job, "state", "?"));
    fflush(stdout);
    json_decref(job);
    if (!a.follow) return 0;
    tc_follow_options fo = {.json = a.json, .cancel_on_interrupt = a.cancel_on_interrupt};
    return tc_follow(c, id, &fo);
}

/* ---- ls, show, follow, cancel -------------------------------------------------------------- */

static json_t *latest_field(json_t *job, const char *which, const char *key) {
    return json_object_get(json_object_get(json_object_get(job, "latest"), which), key);
}

int tc_cmd_ls(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --state --limit --json ", 0, 0);
    char path[256];
    snprintf(path, sizeof path, "/v1/jobs?limit=%ld%s%s", a.limit > 0 ? a.limit : 50,
             a.state ? "&state=" : "", a.state ? a.state : "");
    for (char *p = path; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("/?=&,_-", *p))
            return tc_error("--state \"%s\": expected states separated by commas, e.g. "
                            "running,queued",
                            a.state);
    json_t *o = tc_get_json(c, path);
    if (!o) return TC_EXIT_ERROR;
    if (a.json) {
        tc_print_json(o);
        json_decref(o);
        return 0;
    }
    printf("%-6s %-24s %-10s %-7s %-7s %9s %9s %8s  %s\n", "ID", "NAME", "STATE", "KIND", "PROCS",
           "STEP", "LOSS", "VAL_ACC", "CREATED");
    size_t i;
    json_t *j;
    json_array_foreach(json_object_get(o, "jobs"), i, j) {
        char procs[32], step[32] = "-", loss[32] = "-", acc[32] = "-";
        snprintf(procs, sizeof procs, "%lldx%lld",
                 (long long)json_integer_value(json_object_get(j, "nnodes")),
                 (long long)json_integer_value(json_object_get(j, "nproc")));
        json_t *s = latest_field(j, "train", "step"), *l = latest_field(j, "train", "loss"),
               *va = latest_field(j, "eval", "val_acc");
        if (!va) va = latest_field(j, "done", "val_acc"); /* a run's summary may have it alone */
        if (s) snprintf(step, sizeof step, "%lld", (long long)json_integer_value(s));
        if (l) snprintf(loss, sizeof loss, "%.4f", json_number_value(l));
        if (va) snprintf(acc, sizeof acc, "%.4f", json_number_value(va));
        printf("%-6lld %-24.24s %-10s %-7s %-7s %9s %9s %8s  %.19s\n",
               (long long)json_integer_value(json_object_get(j, "id")), tc_str(j, "name", ""),
               tc_str(j, "state", ""), tc_str(j, "kind", ""), procs, step, loss, acc,
               tc_str(j, "created_at", ""));
    }
    json_decref(o);
    return 0;
}

int tc_cmd_show(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --json ", 1, 1);
    long id = tc_job_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld", id);
    json_t *j = tc_get_json(c, path);
    if (!j) return TC_EXIT_ERROR;
    if (a.json) {
        tc_print_json(j);
        json_decref(j);
        return 0;
    }
    printf("job %lld  %s  (%s)\n", (long long)json_integer_value(json_object_get(j, "id")),
           tc_str(j, "name", ""), tc_str(j, "kind", ""));
    printf("  state       %s%s%s\n", tc_str(j, "state", ""),
           json_is_string(json_object_get(j, "reason")) ? ": " : "", tc_str(j, "reason", ""));
    printf("  processes   %lld node(s) x %lld\n",
           (long long)json_integer_value(json_object_get(j, "nnodes")),
           (long long)json_integer_value(json_object_get(j, "nproc")));
    printf("  created     %s\n  started     %s\n  finished    %s\n", tc_str(j, "created_at", "-"),
           tc_str(j, "started_at", "-"), tc_str(j, "finished_at", "-"));
    json_t *t = json_object_get(json_object_get(j, "latest"), "train");
    json_t *e = json_object_get(json_object_get(j, "latest"), "eval");
    if (json_is_object(t))
        printf("  latest      step %lld, loss %.4f\n",
               (long long)json_integer_value(json_object_get(t, "step")),
               json_number_value(json_object_get(t, "loss")));
    if (json_is_object(e)) { /* what the line has: a script's eval line may lack either */
        printf("  evaluation  step %lld",
               (long long)json_integer_value(json_object_get(e, "step")));
        const char *names[] = {"val_loss", "val_acc"};
        for (int k = 0; k < 2; k++)
            if (json_is_number(json_object_get(e, names[k])))
                printf(", %s %.4f", names[k], json_number_value(json_object_get(e, names[k])));
        printf("\n");
    }
    printf("  checkpoints %lld\n",
           (long long)json_integer_value(json_object_get(j, "checkpoints")));
    size_t i;
    json_t *x;
    json_array_foreach(json_object_get(j, "attempts"), i, x)
        printf("  attempt %lld  %s -> %s%s%s\n",
               (long long)json_integer_value(json_object_get(x, "attempt")),
               tc_str(x, "started_at", "-"), tc_str(x, "finished_at", "running"),
               json_is_string(json_object_get(x, "reason")) ? ": " : "", tc_str(x, "reason", ""));
    json_t *pl = json_object_get(j, "placement");
    json_array_foreach(json_object_get(pl, "nodes"), i, x) {
        json_t *ranks = json_object_get(x, "ranks");
        /* each process's GPUs, "0,1 | 2,3", where it has any */
        char gpus[512] = "";
        size_t k;
        json_t *p;
        json_array_foreach(json_object_get(x, "processes"), k, p) if (tc_str(p, "devices", "")[0])
            snprintf(gpus + strlen(gpus), sizeof gpus - strlen(gpus), "%s%s", k ? " | " : "",
                     tc_str(p, "devices", ""));
        if (!gpus[0]) snprintf(gpus, sizeof gpus, "%s", tc_str(x, "devices", ""));
        char which[64];
        tc_rank_range(ranks, which, sizeof which);
        printf("  node %-12s node rank %lld, %s%s%s%s%s\n", tc_str(x, "node", "?"),
               (long long)json_integer_value(json_object_get(x, "node_rank")), which,
               gpus[0] ? ", GPUs " : "", gpus, json_object_get(x, "state") ? ", " : "",
               tc_str(x, "state", ""));
    }
    json_decref(j);
    return 0;
}

int tc_cmd_follow(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --json --cancel-on-interrupt ", 1, 1);
    long id = tc_job_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    tc_follow_options fo = {.json = a.json, .cancel_on_interrupt = a.cancel_on_interrupt};
    return tc_follow(c, id, &fo);
}

int tc_cmd_cancel(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --json ", 1, 1);
    long id = tc_job_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    char path[64], err[512] = "";
    snprintf(path, sizeof path, "/v1/jobs/%ld/cancel", id);
    tc_reply r;
    tc_request(c, "POST", path, NULL, &r, err, sizeof err);
    json_t *j = r.status == 200 ? tc_reply_json(&r) : NULL;
    int rc = j ? 0 : tc_fail_reply(c, &r, err);
    tc_reply_free(&r);
    if (j && a.json) tc_print_json(j);
    if (j && !a.json) printf("job %ld %s\n", id, tc_str(j, "state", "?"));
    json_decref(j);
    return rc;
}

/* ---- logs, metrics, download ------------------------------------------------------------- */

int tc_cmd_logs(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --rank --follow ", 1, 1);
    long id = tc_job_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    char path[96];
    snprintf(path, sizeof path, "/v1/jobs/%ld/logs?rank=%ld%s", id, a.rank,
             a.follow ? "&follow=1" : "");
    return tc_stream(c, path, stdout, &tc_interrupted);
}

/* One CSV field: quoted when it holds a comma, quote or line break. */
static void csv_field(const char *s) {
    if (!strpbrk(s, ",\"\r\n")) {
        fputs(s, stdout);
        return;
    }
    putchar('"');
    for (; *s; s++) {
        if (*s == '"') putchar('"');
        putchar(*s);
    }
    putchar('"');
}

int tc_cmd_metrics(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --csv --json ", 1, 1);
    long id = tc_job_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld/metrics", id);
    json_t *m = tc_get_json(c, path);
    if (!m) return TC_EXIT_ERROR;
    if (a.json) {
        tc_print_json(m);
        json_decref(m);
        return 0;
    }
    /* the columns: every key any event has, in the order they first appear */
    json_t *keys = json_array();
    size_t i, k;
    json_t *e, *key;
    json_array_foreach(m, i, e) {
        const char *name;
        json_t *v;
        json_object_foreach(e, name, v) {
            bool seen = false;
            json_array_foreach(keys, k, key) seen |= strcmp(json_string_value(key), name) == 0;
            if (!seen && !json_is_object(v) && !json_is_array(v))
                json_array_append_new(keys, json_string(name));
        }
    }
    json_array_foreach(keys, k, key) {
        if (a.csv) {
            if (k) putchar(',');
            csv_field(json_string_value(key));
        } else {
            printf("%-14.14s ", json_string_value(key));
        }
    }
    printf("\n");
    json_array_foreach(m, i, e) {
        json_array_foreach(keys, k, key) {
            json_t *v = json_object_get(e, json_string_value(key));
            char text[64] = "";
            if (json_is_integer(v))
                snprintf(text, sizeof text, "%lld", (long long)json_integer_value(v));
            else if (json_is_real(v))
                snprintf(text, sizeof text, a.csv ? "%.9g" : "%.6g", json_real_value(v));
            else if (json_is_string(v))
                snprintf(text, sizeof text, "%s", json_string_value(v));
            else if (json_is_boolean(v))
                snprintf(text, sizeof text, "%s", json_is_true(v) ? "true" : "false");
            if (a.csv) {
                if (k) putchar(',');
                csv_field(text);
            } else {
                printf("%-14.14s ", text[0] ? text : "-");
            }
        }
        printf("\n");
    }
    json_decref(keys);
    json_decref(m);
    return 0;
}

int tc_cmd_download(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --step --output --file ", 1, 1);
    long id = tc_job_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    char path[512];
    snprintf(path, sizeof path, "/v1/jobs/%ld/checkpoints", id);
    json_t *list = tc_get_json(c, path);
    if (!list) return TC_EXIT_ERROR;
    json_t *pick = NULL, *e;
    size_t i;
    json_array_foreach(list, i, e) {
        long step = (long)json_integer_value(json_object_get(e, "step"));
        if (!json_is_true(json_object_get(e, "on_disk"))) continue;
        if (a.step >= 0 ? step == a.step : true) pick = e; /* the list is by step: the latest */
    }
    int rc = 0;
    if (!pick) {
        rc = a.step >= 0 ? tc_error("job %ld has no checkpoint of step %ld on disk (trainctl "
                                    "show %ld lists them)",
                                    id, a.step, id)
                         : tc_error("job %ld has no checkpoint on disk yet", id);
        json_decref(list);
        return rc;
    }
    json_t *file = NULL, *f;
    json_array_foreach(json_object_get(pick, "files"), i, f) {
        const char *name = tc_str(f, "name", "");
        if (a.file ? strcmp(name, a.file) == 0 : strcmp(name, "model.safetensors") == 0) file = f;
    }
    if (!file && !a.file) file = json_array_get(json_object_get(pick, "files"), 0);
    long step = (long)json_integer_value(json_object_get(pick, "step"));
    if (!file) {
        rc = tc_error("checkpoint %ld of job %ld has no file \"%s\"", step, id, a.file);
        json_decref(list);
        return rc;
    }
    const char *name = tc_str(file, "name", "file"), *slash = strrchr(name, '/');
    char out[1024];
    if (a.out)
        snprintf(out, sizeof out, "%s", a.out);
    else
        snprintf(out, sizeof out, "job%ld-step%ld-%s", id, step, slash ? slash + 1 : name);
    rc = tc_download(c, tc_str(file, "url", ""), out,
                     (long long)json_integer_value(json_object_get(file, "size")),
                     isatty(STDERR_FILENO), &tc_interrupted);
    json_decref(list);
    return rc;
}

/* ---- nodes -------------------------------------------------------------------------------------
 */

int tc_cmd_nodes(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --json ", 0, 0);
    json_t *o = tc_get_json(c, "/v1/nodes");
    if (!o) return TC_EXIT_ERROR;
    if (a.json) {
        tc_print_json(o);
        json_decref(o);
        return 0;
    }
    printf("%-16s %-7s %-9s %-16s %-9s %-10s %s\n", "NAME", "ROLE", "STATE", "ADDRESS", "SLOTS",
           "HEARTBEAT", "GPUS");
    size_t i, g;
    json_t *n, *gpu;
    json_array_foreach(json_object_get(o, "nodes"), i, n) {
        json_t *slots = json_object_get(n, "slots");
        char used[32], beat[32], gpus[512] = "-";
        snprintf(used, sizeof used, "%lld/%lld",
                 (long long)json_integer_value(json_object_get(slots, "used")),
                 (long long)json_integer_value(json_object_get(slots, "total")));
        snprintf(beat, sizeof beat, "%.1f s ago",
                 json_number_value(json_object_get(n, "seconds_since_heartbeat")));
        json_array_foreach(json_object_get(n, "gpus"), g, gpu) {
            size_t at = g ? strlen(gpus) : 0;
            json_t *mem = json_object_get(gpu, "memory_bytes");
            char size[32] = "";
            if (json_is_integer(mem))
                snprintf(size, sizeof size, ", %.0f GiB",
                         (double)json_integer_value(mem) / 1073741824.0);
            snprintf(gpus + at, sizeof gpus - at, "%s%lld%s%s%s%s", g ? "; " : "",
                     (long long)json_integer_value(json_object_get(gpu, "index")),
                     json_is_string(json_object_get(gpu, "name")) ? " " : "",
                     tc_str(gpu, "name", ""), size, "");
        }
        printf("%-16s %-7s %-9s %-16s %-9s %-10s %s\n", tc_str(n, "name", ""),
               tc_str(n, "role", ""), tc_str(n, "state", ""), tc_str(n, "address", ""), used, beat,
               gpus);
    }
    json_decref(o);
    return 0;
}

int tc_cmd_drain(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --json ", 1, 1);
    char path[256], err[512] = "";
    for (const char *p = a.pos[0]; *p; p++)
        if (!isalnum((unsigned char)*p) && !strchr("._-", *p))
            return tc_error("node name \"%s\": expected letters, digits, '.', '_' or '-'",
                            a.pos[0]);
    snprintf(path, sizeof path, "/v1/nodes/%.64s/%s", a.pos[0], argv[0]);
    tc_reply r;
    tc_request(c, "POST", path, NULL, &r, err, sizeof err);
    json_t *n = r.status == 200 ? tc_reply_json(&r) : NULL;
    int rc = n ? 0 : tc_fail_reply(c, &r, err);
    tc_reply_free(&r);
    if (n && a.json) tc_print_json(n);
    if (n && !a.json) printf("node %s: %s\n", a.pos[0], tc_str(n, "state", "?"));
    json_decref(n);
    return rc;
}

int tc_cmd_version(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --json ", 0, 0);
    tc_reply r;
    char err[512] = "";
    tc_request(c, "GET", "/v1/version", NULL, &r, err, sizeof err);
    json_t *v = r.status == 200 ? tc_reply_json(&r) : NULL;
    printf("trainctl %s\n", TC_VERSION);
    int rc = 0;
    if (v)
        printf("traind %s (API %s) at %s\n", tc_str(v, "version", "?"), tc_str(v, "api", "?"),
               c->url);
    else
        rc = tc_fail_reply(c, &r, err);
    json_decref(v);
    tc_reply_free(&r);
    return rc;
}
