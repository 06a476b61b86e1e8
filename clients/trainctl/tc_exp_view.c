/* trainctl exp, on screen: an experiment's trials as a table (best first, cut to the terminal),
 * its heading and counts, its best trial, and following it to its end (--follow). Following
 * polls GET /v1/experiments/ID once a second rather than reading its event stream: the table
 * needs the whole experiment anyway, once a second is plenty for a table people read, and a
 * daemon that restarts meanwhile is simply asked again. */
#include "trainctl.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

enum { POLL_MS = 1000, GIVE_UP_S = 300 };

long long tc_exp_int(json_t *o, const char *key) {
    return (long long)json_integer_value(json_object_get(o, key));
}

double tc_exp_num(json_t *o, const char *key) {
    return json_number_value(json_object_get(o, key));
}

static const char *const STATES[] = {"pending",   "queued", "running",  "paused",
                                     "succeeded", "failed", "cancelled"};
enum { N_STATES = sizeof STATES / sizeof STATES[0] };

/* A hyperparameter's value: for a table, a string as it is and a real with 6 digits; exact, as
 * JSON with the digits the daemon sent (strings quoted), to copy into a spec. */
static void value_text(json_t *v, bool exact, char *out, size_t len) {
    if (!exact && json_is_string(v)) {
        snprintf(out, len, "%s", json_string_value(v));
    } else {
        char *text =
            json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(exact ? 15 : 6));
        snprintf(out, len, "%s", text ? text : "?");
        free(text);
    }
}

/* "train.optimizer.lr=0.01 model.width=64": a trial's hyperparameters on one line. */
static void hparams_text(json_t *h, char *out, size_t len) {
    const char *path;
    json_t *v;
    size_t n = 0;
    out[0] = 0;
    json_object_foreach(h, path, v) {
        char text[256];
        value_text(v, false, text, sizeof text);
        n += (size_t)snprintf(out + n, len - n, "%s%s=%s", n ? " " : "", path, text);
        if (n >= len) break; /* (cut at the buffer's end) */
    }
}

/* ---- the trials table -------------------------------------------------------------------- */

/* Where lines go: on a terminal each is cut at its width, and the lines drawn are counted so
 * that the next drawing goes over them. */
typedef struct screen {
    bool tty;
    int width, height;
    int drawn; /* lines drawn since the last moment they were cleared */
} screen;

static void out(screen *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void out(screen *s, const char *fmt, ...) {
    char line[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof line, fmt, ap);
    va_end(ap);
    if (s->tty && (int)strlen(line) > s->width - 1) line[s->width - 1] = 0;
    printf("%s\n", line);
    s->drawn++;
}

typedef struct row {
    json_t *t;
    bool has;   /* it has a best value */
    double key; /* that value, negated for mode "max": smaller is better */
    long long trial;
} row;

static int by_best(const void *pa, const void *pb) {
    const row *a = pa, *b = pb;
    if (a->has != b->has) return a->has ? -1 : 1;
    if (a->has && a->key != b->key) return a->key < b->key ? -1 : 1;
    return (a->trial > b->trial) - (a->trial < b->trial);
}

/* The experiment's trials best first (by each one's best value, as its mode says), then those
 * with no value yet by number; *n of them (NULL: none, or out of memory). */
static row *ranked(json_t *x, size_t *n) {
    json_t *trials = json_object_get(x, "trials");
    bool max = strcmp(tc_str(json_object_get(x, "searcher"), "mode", "min"), "max") == 0;
    *n = json_array_size(trials);
    row *r = *n ? calloc(*n, sizeof *r) : NULL;
    if (!r) *n = 0;
    for (size_t i = 0; i < *n; i++) {
        json_t *t = json_array_get(trials, i);
        json_t *v = json_object_get(json_object_get(t, "best"), "value");
        double value = json_number_value(v);
        r[i] = (row){t, json_is_number(v), max ? -value : value, tc_exp_int(t, "trial")};
    }
    if (r) qsort(r, *n, sizeof *r, by_best);
    return r;
}

/* The trials, best first; at most max_rows of them (-1: all), then how many more there are. */
static void trials_table(screen *s, json_t *x, int max_rows) {
    size_t n;
    row *r = ranked(x, &n);
    /* ASHA's trials say their rung (the one they train to or are paused at), PBT's their
     * generation */
    json_t *searcher = json_object_get(x, "searcher");
    bool rungs = json_object_get(searcher, "rung_steps") != NULL;
    bool generations = json_object_get(searcher, "interval") != NULL;
    out(s, "%-5s %-7s %-10s %7s%s %12s  %s", "TRIAL", "JOB", "STATE", "STEPS",
        rungs         ? " RUNG"
        : generations ? "  GEN"
                      : "",
        "BEST", "HPARAMS");
    for (size_t i = 0; i < n; i++) {
        if (max_rows >= 0 && i >= (size_t)max_rows) {
            out(s, "... and %zu more trials (trainctl exp show %lld lists them all)", n - i,
                tc_exp_int(x, "id"));
            break;
        }
        json_t *t = r[i].t;
        char job[24] = "-", best[32] = "-", h[768];
        if (json_is_integer(json_object_get(t, "job")))
            snprintf(job, sizeof job, "%lld", tc_exp_int(t, "job"));
        if (r[i].has)
            snprintf(best, sizeof best, "%.6g", tc_exp_num(json_object_get(t, "best"), "value"));
        hparams_text(json_object_get(t, "hparams"), h, sizeof h);
        char rung[16] = "";
        if (rungs) snprintf(rung, sizeof rung, " %4lld", tc_exp_int(t, "rung"));
        if (generations) snprintf(rung, sizeof rung, " %4lld", tc_exp_int(t, "generation"));
        out(s, "%-5lld %-7s %-10s %7lld%s %12s  %s", r[i].trial, job, tc_str(t, "state", "?"),
            tc_exp_int(t, "steps"), rung, best, h);
    }
    free(r);
}

/* "2 running, 1 queued, 5 succeeded": the trials by state, the states that have some. */
void tc_exp_counts_text(json_t *x, char *text, size_t len) {
    json_t *k = json_object_get(x, "counts");
    size_t n = 0;
    text[0] = 0;
    for (int i = 0; i < N_STATES && n < len; i++)
        if (tc_exp_int(k, STATES[i]) > 0)
            n += (size_t)snprintf(text + n, len - n, "%s%lld %s", n ? ", " : "",
                                  tc_exp_int(k, STATES[i]), STATES[i]);
}

/* "experiment 3 lr-grid: running; 4 trials: 2 running, 2 pending; best val_acc 0.91 (trial 1)" */
static void heading(screen *s, json_t *x) {
    char counts[256], best[160] = "no best yet";
    tc_exp_counts_text(x, counts, sizeof counts);
    json_t *b = json_object_get(x, "best");
    if (json_is_object(b))
        snprintf(best, sizeof best, "best %s %.6g (trial %lld)",
                 tc_str(json_object_get(x, "searcher"), "metric", "?"), tc_exp_num(b, "value"),
                 tc_exp_int(b, "trial"));
    out(s, "experiment %lld %s: %s; %lld trials: %s; %s", tc_exp_int(x, "id"),
        tc_str(x, "name", ""), tc_str(x, "state", "?"), tc_exp_int(x, "trials_total"), counts,
        best);
}

/* ---- the best trial ------------------------------------------------------------------------ */

/* The best trial as `exp best` prints it (and a followed experiment at its end). */
void tc_exp_best_lines(json_t *x) {
    json_t *b = json_object_get(x, "best"), *sr = json_object_get(x, "searcher");
    printf("experiment %lld: best trial %lld, job %lld\n", tc_exp_int(x, "id"),
           tc_exp_int(b, "trial"), tc_exp_int(b, "job"));
    const char *path, *metric = tc_str(sr, "metric", "?");
    int w = strlen(metric) > 10 ? (int)strlen(metric) : 10; /* the longest name: "checkpoint" */
    json_t *v;
    json_object_foreach(json_object_get(b, "hparams"), path, v) {
        if ((int)strlen(path) > w) w = (int)strlen(path);
    }
    printf("  %-*s %.15g (%s, at step %lld)\n", w, metric, tc_exp_num(b, "value"),
           tc_str(sr, "mode", "?"), tc_exp_int(b, "step"));
    json_object_foreach(json_object_get(b, "hparams"), path, v) {
        char text[512];
        value_text(v, true, text, sizeof text);
        printf("  %-*s %s\n", w, path, text);
    }
    json_t *ck = json_object_get(b, "checkpoint");
    if (json_is_object(ck))
        printf("  %-*s step %lld: %s\n", w, "checkpoint", tc_exp_int(ck, "step"),
               tc_str(ck, "archive_url", "?"));
    else
        printf("  %-*s none (its job registered none)\n", w, "checkpoint");
}

/* ---- following ----------------------------------------------------------------------------- */

typedef struct watch {
    screen s;
    long id;
    bool json;      /* nothing on the way */
    json_t *seen;   /* off a terminal: each trial's state as last printed ({"3": "running"}) */
    char note[384]; /* on a terminal: the connection's trouble, drawn under the heading */
} watch;

/* Off a terminal, a line for each trial whose state changed since the last poll. */
static void changes(watch *w, json_t *x) {
    size_t i;
    json_t *t;
    json_array_foreach(json_object_get(x, "trials"), i, t) {
        char key[32], job[48] = "", best[96] = "";
        snprintf(key, sizeof key, "%lld", tc_exp_int(t, "trial"));
        const char *state = tc_str(t, "state", "?");
        const char *was = json_string_value(json_object_get(w->seen, key));
        if (strcmp(was ? was : "pending", state) == 0) continue;
        json_object_set_new(w->seen, key, json_string(state));
        if (json_is_integer(json_object_get(t, "job")))
            snprintf(job, sizeof job, " (job %lld)", tc_exp_int(t, "job"));
        json_t *b = json_object_get(t, "best");
        if (json_is_object(b))
            snprintf(best, sizeof best, ", best %s %.6g at step %lld",
                     tc_str(json_object_get(x, "searcher"), "metric", "?"), tc_exp_num(b, "value"),
                     tc_exp_int(b, "step"));
        printf("trial %lld: %s%s%s%s%s\n", tc_exp_int(t, "trial"), state, job, best,
               json_is_string(json_object_get(t, "reason")) ? ": " : "", tc_str(t, "reason", ""));
    }
    fflush(stdout);
}

/* On a terminal, the heading and the table drawn over the previous ones (as many trials as the
 * terminal has lines for); off one, the changes. */
static void show(watch *w, json_t *x) {
    if (w->json) return;
    if (!w->s.tty) {
        changes(w, x);
        return;
    }
    struct winsize ws; /* (again each time: the terminal may have been resized) */
    bool ok = ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) == 0;
    w->s.width = ok && ws.ws_col > 20 ? ws.ws_col : 80;
    w->s.height = ok && ws.ws_row > 6 ? ws.ws_row : 24;
    if (w->s.drawn > 0) printf("\033[%dA\r\033[J", w->s.drawn);
    w->s.drawn = 0;
    heading(&w->s, x);
    if (w->note[0]) out(&w->s, "(%s)", w->note);
    trials_table(&w->s, x, w->s.height - 4 - (w->note[0] != 0));
    fflush(stdout);
}

static void nap(int ms) {
    for (int t = 0; t < ms && !tc_interrupted; t += 100) {
        struct timespec ts = {0, 100 * 1000000L};
        nanosleep(&ts, NULL);
    }
}

/* The connection's trouble when it begins, and NULL when it ends: on a terminal, a line of the
 * drawing while it lasts; elsewhere, on stderr. */
static void notice(watch *w, const char *text) {
    if (w->s.tty)
        snprintf(w->note, sizeof w->note, "%s", text ? text : "");
    else
        fprintf(stderr, "trainctl: %s\n", text ? text : "reconnected");
}

/* Polls the experiment until it ends (its JSON then, in *x) or following stops: 0, or an exit
 * status after a message. The daemon not answering (a restart) is waited out for GIVE_UP_S. */
static int poll_to_end(const tc_conn *c, watch *w, json_t **x) {
    char path[64];
    snprintf(path, sizeof path, "/v1/experiments/%ld", w->id);
    time_t down = 0; /* since when the daemon has not answered; 0: it answers */
    while (!tc_interrupted) {
        tc_reply r;
        char err[CURL_ERROR_SIZE + 64] = "", text[sizeof w->note];
        tc_request(c, "GET", path, NULL, &r, err, sizeof err);
        json_t *got = r.status == 200 ? tc_reply_json(&r) : NULL;
        if (!got && r.status == 0 && !tc_interrupted &&
            (down == 0 || time(NULL) - down < GIVE_UP_S)) {
            if (down == 0) {
                snprintf(text, sizeof text,
                         "traind at %.100s does not answer (%.120s): trying again", c->url, err);
                notice(w, text);
                down = time(NULL);
            }
        } else if (!got) {
            int rc = tc_fail_reply(c, &r, err);
            tc_reply_free(&r);
            return rc;
        } else {
            if (down > 0) notice(w, NULL);
            down = 0;
            json_decref(*x);
            *x = got;
        }
        tc_reply_free(&r);
        if (*x) show(w, *x);
        if (*x && strcmp(tc_str(*x, "state", ""), "running") != 0) return 0;
        nap(POLL_MS);
    }
    return 130;
}

/* Follows experiment id to its end: the table (or the changes), then how it ended and its best
 * trial; its end as an exit status. json: nothing on the way, the experiment's JSON at the end. */
int tc_exp_follow(const tc_conn *c, long id, bool json) {
    watch w = {.s = {.tty = !json && isatty(STDOUT_FILENO)},
               .id = id,
               .json = json,
               .seen = json_object()};
    json_t *x = NULL;
    int rc = poll_to_end(c, &w, &x);
    json_decref(w.seen);
    if (rc == 130)
        fprintf(stderr,
                "trainctl: stopped following experiment %ld; it goes on (trainctl exp cancel %ld "
                "stops it)\n",
                id, id);
    if (rc != 0 || !x) {
        json_decref(x);
        return rc ? rc : TC_EXIT_ERROR;
    }
    if (json) {
        tc_print_json(x);
    } else {
        if (!w.s.tty) trials_table(&w.s, x, -1);
        printf("experiment %ld %s%s%s\n", id, tc_str(x, "state", "?"),
               json_is_string(json_object_get(x, "reason")) ? ": " : "", tc_str(x, "reason", ""));
        if (json_is_object(json_object_get(x, "best"))) tc_exp_best_lines(x);
    }
    const char *state = tc_str(x, "state", ""); /* the exit status, as for a followed job */
    rc = !strcmp(state, "succeeded")   ? TC_EXIT_OK
         : !strcmp(state, "cancelled") ? TC_EXIT_CANCELLED
                                       : TC_EXIT_FAILED;
    json_decref(x);
    return rc;
}

void tc_exp_trials_table(json_t *x) {
    screen s = {.tty = false};
    trials_table(&s, x, -1);
}
