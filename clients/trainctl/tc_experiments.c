/* trainctl exp: experiments, hyperparameter searches whose trials are jobs (api/README.md,
 * "Experiments"). Each command is one call of the API: create (POST the file as it is written,
 * so its numbers reach the daemon digit for digit; --follow: tc_exp_view.c), ls, show, best
 * (with the best checkpoint's archive through tc_download), cancel and rm. */
#include "trainctl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

/* An experiment id argument, or -1 after an error message. */
static long exp_id(const char *text) {
    char *end;
    errno = 0;
    long id = strtol(text, &end, 10);
    if (errno || end == text || *end || id < 1) {
        tc_error("\"%s\": expected an experiment id (a positive integer, as exp ls shows)", text);
        return -1;
    }
    return id;
}

/* ---- the commands -------------------------------------------------------------------------- */

int tc_cmd_exp(const tc_conn *c, int argc, char **argv) {
    (void)c;
    if (argc >= 2 && (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0))
        return tc_usage("exp", false);
    if (argc < 2)
        tc_error("exp: no command given");
    else
        tc_error("exp: unknown command \"%s\"", argv[1]);
    return tc_usage("exp", true);
}

/* FILE's text (-: stdin) into text->body (NULL when empty); 0, or an exit status after a
 * message. */
static int read_text(const char *from, tc_reply *text) {
    bool in = strcmp(from, "-") == 0;
    memset(text, 0, sizeof *text);
    FILE *f = in ? stdin : fopen(from, "rb");
    if (!f) return tc_error("cannot read %s: %s", from, strerror(errno));
    char chunk[65536];
    size_t got;
    bool ok = true;
    while (ok && (got = fread(chunk, 1, sizeof chunk, f)) > 0)
        ok = tc_collect(chunk, 1, got, text) == got;
    int saved = ferror(f) ? errno : 0;
    if (!in) fclose(f);
    if (ok && !saved) return 0;
    tc_reply_free(text);
    return tc_error("cannot read %s: %s", in ? "(stdin)" : from,
                    saved ? strerror(saved) : "out of memory");
}

int tc_cmd_exp_create(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --follow --json --quiet ", 1, 1);
    const char *from = a.pos[0], *where = strcmp(from, "-") == 0 ? "(stdin)" : from;
    tc_reply text;
    int rc = read_text(from, &text);
    if (rc != 0) return rc;
    json_error_t je;
    json_t *body = json_loadb(text.body ? text.body : "", text.len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(body)) { /* the daemon would say so too, without the file's name */
        rc = body ? tc_error("%s: expected a JSON object (an experiment: api/README.md, "
                             "\"Experiments\")",
                             where)
                  : tc_error("%s:%d:%d: %s", where, je.line, je.column, je.text);
        json_decref(body);
        tc_reply_free(&text);
        return rc;
    }
    json_decref(body);
    tc_reply r;
    char err[512] = "";
    tc_request(c, "POST", "/v1/experiments", text.body, &r, err, sizeof err);
    tc_reply_free(&text);
    json_t *x = r.status == 201 ? tc_reply_json(&r) : NULL;
    if (!x) rc = tc_fail_reply(c, &r, err);
    tc_reply_free(&r);
    if (!x) return rc;
    long id = (long)tc_exp_int(x, "id");
    json_t *sr = json_object_get(x, "searcher");
    if (a.json && !a.follow)
        tc_print_json(x);
    else if (a.quiet) /* for id=$(trainctl exp create -q FILE) */
        printf("%ld\n", id);
    else if (!a.json)
        printf("experiment %ld created: %s, %lld trials (%s search, %s %s)\n", id,
               tc_str(x, "name", "?"), tc_exp_int(x, "trials_total"), tc_str(sr, "type", "?"),
               tc_str(sr, "mode", "?"), tc_str(sr, "metric", "?"));
    fflush(stdout);
    json_decref(x);
    return a.follow ? tc_exp_follow(c, id, a.json) : 0;
}

int tc_cmd_exp_ls(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --json ", 0, 0);
    json_t *list = tc_get_json(c, "/v1/experiments"), *x;
    if (!list) return TC_EXIT_ERROR;
    if (a.json) {
        tc_print_json(list);
        json_decref(list);
        return 0;
    }
    printf("%-6s %-20s %-10s %-7s %-9s %7s %-16s %-18s %s\n", "ID", "NAME", "STATE", "SEARCH",
           "TRIALS", "RUNNING", "METRIC", "BEST", "CREATED");
    size_t i;
    json_array_foreach(json_object_get(list, "experiments"), i, x) {
        json_t *k = json_object_get(x, "counts"), *sr = json_object_get(x, "searcher"),
               *b = json_object_get(x, "best");
        char trials[48], metric[96], best[48] = "-";
        snprintf(trials, sizeof trials, "%lld/%lld",
                 tc_exp_int(k, "succeeded") + tc_exp_int(k, "failed") + tc_exp_int(k, "cancelled"),
                 tc_exp_int(x, "trials_total"));
        snprintf(metric, sizeof metric, "%s %.80s", tc_str(sr, "mode", "?"),
                 tc_str(sr, "metric", "?"));
        if (json_is_object(b))
            snprintf(best, sizeof best, "%.6g (#%lld)", tc_exp_num(b, "value"),
                     tc_exp_int(b, "trial"));
        printf("%-6lld %-20.20s %-10s %-7s %-9s %7lld %-16.16s %-18s %.19s\n", tc_exp_int(x, "id"),
               tc_str(x, "name", ""), tc_str(x, "state", ""), tc_str(sr, "type", ""), trials,
               tc_exp_int(k, "running"), metric, best, tc_str(x, "created_at", ""));
    }
    json_decref(list);
    return 0;
}

static json_t *get_experiment(const tc_conn *c, long id) {
    char path[64];
    snprintf(path, sizeof path, "/v1/experiments/%ld", id);
    return tc_get_json(c, path);
}

/* What `exp show` prints above the trials. */
static void summary_lines(json_t *x) {
    json_t *sr = json_object_get(x, "searcher"), *b = json_object_get(x, "best"), *v;
    char counts[256];
    tc_exp_counts_text(x, counts, sizeof counts);
    printf("experiment %lld  %s  (%s search of %lld trials, %s %s)\n", tc_exp_int(x, "id"),
           tc_str(x, "name", ""), tc_str(sr, "type", "?"), tc_exp_int(x, "trials_total"),
           tc_str(sr, "mode", "?"), tc_str(sr, "metric", "?"));
    printf("  state       %s%s%s\n", tc_str(x, "state", "?"),
           json_is_string(json_object_get(x, "reason")) ? ": " : "", tc_str(x, "reason", ""));
    printf("  owner       %s\n", tc_str(json_object_get(x, "owner"), "name", "-"));
    printf("  created     %s\n  finished    %s\n", tc_str(x, "created_at", "-"),
           tc_str(x, "finished_at", "-"));
    printf("  trials      %s\n", counts);
    printf("  limits      at most %lld queued or running at a time; priority %lld; seed %lld\n",
           tc_exp_int(x, "max_concurrent"), tc_exp_int(x, "priority"), tc_exp_int(x, "seed"));
    const char *path;
    bool first = true;
    json_object_foreach(json_object_get(x, "space"), path, v) {
        char *text = json_dumps(v, JSON_REAL_PRECISION(15)); /* one line, with spaces */
        printf("  %-11s %s %.200s\n", first ? "space" : "", path, text ? text : "?");
        free(text);
        first = false;
    }
    char hint[96] = "";
    if (json_is_object(json_object_get(b, "checkpoint")))
        snprintf(hint, sizeof hint, ", with a checkpoint (trainctl exp best %lld --download)",
                 tc_exp_int(x, "id"));
    if (json_is_object(b))
        printf("  best        trial %lld (job %lld): %s %.15g at step %lld%s\n",
               tc_exp_int(b, "trial"), tc_exp_int(b, "job"), tc_str(sr, "metric", "?"),
               tc_exp_num(b, "value"), tc_exp_int(b, "step"), hint);
    else
        printf("  best        none yet: no trial has reported %s\n", tc_str(sr, "metric", "?"));
}

int tc_cmd_exp_show(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --json ", 1, 1);
    long id = exp_id(a.pos[0]);
    json_t *x = id > 0 ? get_experiment(c, id) : NULL;
    if (!x) return TC_EXIT_ERROR;
    if (a.json) {
        tc_print_json(x);
    } else {
        summary_lines(x);
        printf("\n");
        tc_exp_trials_table(x);
    }
    json_decref(x);
    return 0;
}

/* exp cancel|pause|resume ID: argv[0] says which. */
int tc_cmd_exp_act(const tc_conn *c, int argc, char **argv) {
    const char *action = strchr(argv[0], ' ') + 1;
    TC_PARSE(" --json ", 1, 1);
    long id = exp_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    char path[64], err[512] = "";
    snprintf(path, sizeof path, "/v1/experiments/%ld/%s", id, action);
    tc_reply r;
    tc_request(c, "POST", path, NULL, &r, err, sizeof err);
    json_t *x = r.status == 200 ? tc_reply_json(&r) : NULL;
    int rc = x ? 0 : tc_fail_reply(c, &r, err);
    tc_reply_free(&r);
    json_t *k = json_object_get(x, "counts");
    if (x && a.json) tc_print_json(x);
    long long busy = tc_exp_int(k, "queued") + tc_exp_int(k, "running");
    if (x && !a.json && action[0] == 'c')
        printf("experiment %ld: cancelling (%lld unfinished trials stopping; it ends cancelled "
               "once they have)\n",
               id, busy);
    else if (x && !a.json && action[0] == 'p')
        printf("experiment %ld: paused (%lld trials pausing: a running one goes on from its "
               "latest checkpoint; trainctl exp resume %ld)\n",
               id, busy, id);
    else if (x && !a.json)
        printf("experiment %ld: running again (its paused trials go on first)\n", id);
    json_decref(x);
    return rc;
}

int tc_cmd_exp_rm(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" ", 1, 1);
    long id = exp_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    char path[64], err[512] = "";
    snprintf(path, sizeof path, "/v1/experiments/%ld", id);
    tc_reply r;
    tc_request(c, "DELETE", path, NULL, &r, err, sizeof err);
    int rc = r.status == 204 ? 0 : tc_fail_reply(c, &r, err);
    tc_reply_free(&r);
    if (rc == 0) printf("experiment %ld deleted with its trials\n", id);
    return rc;
}

/* The best trial's checkpoint as a tar archive: DIR/exp-ID-best-step-S.tar. */
static int download_best(const tc_conn *c, json_t *x, const char *dir, bool json) {
    json_t *b = json_object_get(x, "best"), *ck = json_object_get(b, "checkpoint");
    long long id = tc_exp_int(x, "id"), step = tc_exp_int(ck, "step");
    if (!json_is_object(ck))
        return tc_error("trial %lld (job %lld), the best of experiment %lld, has no checkpoint: "
                        "its job registered none (a command registers one with a checkpoint "
                        "line: api/README.md, \"Metric lines\")",
                        tc_exp_int(b, "trial"), tc_exp_int(b, "job"), id);
    if (mkdir(dir, 0777) != 0 && errno != EEXIST)
        return tc_error("cannot make the directory %s: %s", dir, strerror(errno));
    char file[4096];
    int n = (int)strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--; /* models/ is models */
    snprintf(file, sizeof file, "%.*s/exp-%lld-best-step-%lld.tar", n, dir, id, step);
    /* the archive is made at each request, with no Last-Modified to resume against (as
     * tensorboard's): one left from an earlier download is not continued */
    if (unlink(file) != 0 && errno != ENOENT)
        return tc_error("cannot replace %s: %s", file, strerror(errno));
    int rc = tc_download(c, tc_str(ck, "archive_url", ""), file, -1, isatty(STDERR_FILENO),
                         &tc_interrupted);
    if (rc == 0 && !json)
        printf("%s: the checkpoint of step %lld of trial %lld (job %lld); tar xf %s\n", file, step,
               tc_exp_int(b, "trial"), tc_exp_int(b, "job"), file);
    return rc;
}

int tc_cmd_exp_best(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --download --json ", 2, 1);
    if (a.n_pos == 2 && (!a.download || a.dir)) {
        tc_error("%s: unexpected argument \"%s\" (a directory follows --download)", argv[0],
                 a.pos[1]);
        return tc_usage(argv[0], true);
    }
    long id = exp_id(a.pos[0]);
    json_t *x = id > 0 ? get_experiment(c, id) : NULL;
    if (!x) return TC_EXIT_ERROR;
    json_t *b = json_object_get(x, "best");
    int rc = 0;
    if (!json_is_object(b))
        rc = tc_error("experiment %ld has no best trial%s: no trial has reported %s in its metric "
                      "lines (trainctl exp show %ld)",
                      id, strcmp(tc_str(x, "state", ""), "running") == 0 ? " yet" : "",
                      tc_str(json_object_get(x, "searcher"), "metric", "?"), id);
    else if (a.json)
        tc_print_json(b);
    else
        tc_exp_best_lines(x);
    fflush(stdout);
    const char *dir = a.n_pos == 2 ? a.pos[1] : a.dir ? a.dir : ".";
    if (rc == 0 && a.download) rc = download_best(c, x, dir, a.json);
    json_decref(x);
    return rc;
}
