/* A job followed to its end (trainctl.h, tc_follow): on a terminal, one progress line redrawn in
 * place, with what happens (evaluations, checkpoints, restarts, placement, the end) printed
 * above it; elsewhere, or with --json, one JSON object per event for scripts. */
#define _GNU_SOURCE /* timegm */
#include "trainctl.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <time.h>
#include <unistd.h>

typedef struct view {
    const tc_conn *conn;
    long job;
    bool tty, json;
    int final; /* an exit status once the job ended; -1 before */
    bool drawn;
    /* the latest train line */
    bool have_train;
    long step, total_steps;
    int epoch, epochs;
    double loss, samples_per_s, step_ms;
    bool have_acc;
    double val_acc;
    double started; /* wall seconds the job started, 0: not yet */
} view;

static double wall_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* "2026-11-24T17:16:55.192Z" as seconds since 1970, or 0. */
static double parse_time(const char *text) {
    struct tm tm = {0};
    if (!text) return 0;
    const char *rest = strptime(text, "%Y-%m-%dT%H:%M:%S", &tm);
    if (!rest) return 0;
    double frac = *rest == '.' ? strtod(rest, NULL) : 0;
    return (double)timegm(&tm) + frac;
}

static void clock_text(double s, char *out, size_t len) {
    long t = s < 0 ? 0 : (long)(s + 0.5);
    if (t >= 3600)
        snprintf(out, len, "%ld:%02ld:%02ld", t / 3600, t / 60 % 60, t % 60);
    else
        snprintf(out, len, "%ld:%02ld", t / 60, t % 60);
}

static int width(void) {
    struct winsize w;
    return ioctl(STDOUT_FILENO, TIOCGWINSZ, &w) == 0 && w.ws_col > 20 ? w.ws_col : 80;
}

static void draw(view *v) {
    if (!v->tty || !v->have_train) return;
    char line[512], part[128];
    size_t n = 0;
#define ADD(...)                                                                                   \
    do {                                                                                           \
        snprintf(part, sizeof part, __VA_ARGS__);                                                  \
        n += (size_t)snprintf(line + n, sizeof line - n, "%s", part);                              \
        if (n >= sizeof line) n = sizeof line - 1;                                                 \
    } while (0)
    line[0] = 0;
    if (v->epochs > 0)
        ADD("epoch %d/%d  ", v->epoch, v->epochs);
    else
        ADD("epoch %d  ", v->epoch);
    if (v->total_steps > 0) {
        int pct = (int)(100.0 * (double)v->step / (double)v->total_steps);
        char bar[21];
        for (int i = 0; i < 20; i++) bar[i] = i < pct / 5 ? '#' : '.';
        bar[20] = 0;
        ADD("step %ld/%ld [%s] %3d%%  ", v->step, v->total_steps, bar, pct);
    } else {
        ADD("step %ld  ", v->step);
    }
    ADD("loss %.4f  ", v->loss);
    if (v->have_acc) ADD("val_acc %.4f  ", v->val_acc);
    if (v->samples_per_s > 0) ADD("%.0f samples/s  ", v->samples_per_s);
    char a[32], b[32];
    if (v->started > 0) {
        clock_text(wall_now() - v->started, a, sizeof a);
        ADD("%s", a);
    }
    if (v->total_steps > v->step && v->step_ms > 0) {
        clock_text((double)(v->total_steps - v->step) * v->step_ms / 1000.0, b, sizeof b);
        ADD("  ETA %s", b);
    }
#undef ADD
    int w = width() - 1;
    if ((int)n > w) line[w] = 0;
    printf("\r\033[K%s", line);
    fflush(stdout);
    v->drawn = true;
}

/* A line above the progress line (which is drawn again under it). */
static void say(view *v, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void say(view *v, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    if (v->tty && v->drawn) printf("\r\033[K");
    vprintf(fmt, ap);
    printf("\n");
    va_end(ap);
    v->drawn = false;
    draw(v);
    fflush(stdout);
}

void tc_rank_range(json_t *ranks, char *out, size_t len) {
    size_t n = json_array_size(ranks);
    long long first = json_integer_value(json_array_get(ranks, 0));
    long long last = json_integer_value(json_array_get(ranks, n ? n - 1 : 0));
    if (n <= 1)
        snprintf(out, len, "rank %lld", first);
    else
        snprintf(out, len, "ranks %lld-%lld", first, last);
}

static double num(json_t *o, const char *key) {
    return json_number_value(json_object_get(o, key));
}

static const char *str(json_t *o, const char *key, const char *def) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : def;
}

/* A job's own text for the terminal: at most len - 1 bytes, control characters (C0 but newline
 * and tab, DEL, and C1's UTF-8 forms, which some terminals obey as escapes) shown as '?'. */
static void printable(const char *s, char *out, size_t len) {
    size_t w = 0;
    for (const unsigned char *p = (const unsigned char *)s; *p && w + 1 < len; p++) {
        bool c1 = p[0] == 0xC2 && p[1] >= 0x80 && p[1] <= 0x9F;
        if ((*p < 0x20 && *p != '\n' && *p != '\t') || *p == 0x7F || c1) {
            out[w++] = '?';
            p += c1;
        } else {
            out[w++] = (char)*p;
        }
    }
    out[w] = 0;
}

static void show_event(view *v, const char *event, json_t *d) {
    if (strcmp(event, "train") == 0) {
        v->have_train = true;
        v->step = (long)json_integer_value(json_object_get(d, "step"));
        v->epoch = (int)json_integer_value(json_object_get(d, "epoch"));
        v->epochs = (int)json_integer_value(json_object_get(d, "epochs"));
        v->total_steps = (long)json_integer_value(json_object_get(d, "total_steps"));
        v->loss = num(d, "loss");
        v->samples_per_s = num(d, "samples_per_s");
        v->step_ms = num(d, "step_ms");
        draw(v);
    } else if (strcmp(event, "eval") == 0) {
        v->have_acc = json_object_get(d, "val_acc") != NULL;
        v->val_acc = num(d, "val_acc");
        char line[160];
        int k = 0;
        if (json_object_get(d, "epoch"))
            k = snprintf(line, sizeof line, "epoch %d  ",
                         (int)json_integer_value(json_object_get(d, "epoch")));
        k += snprintf(line + k, sizeof line - (size_t)k, "step %ld",
                      (long)json_integer_value(json_object_get(d, "step")));
        /* a language model's also: the training loss estimate and the perplexity */
        const char *names[] = {"loss", "val_loss", "val_acc", "perplexity"};
        for (int n = 0; n < 4 && k > 0 && (size_t)k < sizeof line; n++)
            if (json_is_number(json_object_get(d, names[n])))
                k += snprintf(line + k, sizeof line - (size_t)k, "  %s %.4f", names[n],
                              num(d, names[n]));
        say(v, "%s", line);
    } else if (strcmp(event, "checkpoint") == 0) {
        say(v, "checkpoint  step %ld  %.1f kB  %s",
            (long)json_integer_value(json_object_get(d, "step")), num(d, "size") / 1000.0,
            str(d, "path", ""));
    } else if (strcmp(event, "restart") == 0) {
        json_t *from = json_object_get(d, "resume_from");
        char resume[64] = "from scratch";
        if (json_is_object(from))
            snprintf(resume, sizeof resume, "from step %ld",
                     (long)json_integer_value(json_object_get(from, "step")));
        say(v, "restart %ld (attempt %ld), %s: %s",
            (long)json_integer_value(json_object_get(d, "restarts")),
            (long)json_integer_value(json_object_get(d, "attempt")), resume,
            str(d, "reason", "no reason given"));
    } else if (strcmp(event, "placement") == 0) {
        char where[400] = "";
        size_t i;
        json_t *nd;
        json_array_foreach(json_object_get(d, "nodes"), i, nd) {
            json_t *ranks = json_object_get(nd, "ranks");
            size_t used = strlen(where);
            char which[64];
            tc_rank_range(ranks, which, sizeof which);
            snprintf(where + used, sizeof where - used, "%s%s (%s)", i ? ", " : "",
                     str(nd, "node", "?"), which);
        }
        say(v, "attempt %ld placed on %s; rendezvous at %s:%ld",
            (long)json_integer_value(json_object_get(d, "attempt")), where,
            str(d, "master_addr", "?"),
            (long)json_integer_value(json_object_get(d, "master_port")));
    } else if (strcmp(event, "done") == 0) {
        char t[32];
        clock_text(num(d, "elapsed_s"), t, sizeof t);
        if (json_object_get(d, "val_acc"))
            say(v, "done  step %ld  loss %.4f  val_acc %.4f  %.0f samples/s  %s",
                (long)json_integer_value(json_object_get(d, "step")), num(d, "loss"),
                num(d, "val_acc"), num(d, "samples_per_s"), t);
        else
            say(v, "done  step %ld  loss %.4f  %.0f samples/s  %s",
                (long)json_integer_value(json_object_get(d, "step")), num(d, "loss"),
                num(d, "samples_per_s"), t);
    } else if (strcmp(event, "sample") == 0) {
        char prompt[80], text[4096];
        printable(str(d, "prompt", ""), prompt, sizeof prompt);
        printable(str(d, "text", ""), text, sizeof text);
        say(v, "sample  step %ld, after \"%s\":\n%s",
            (long)json_integer_value(json_object_get(d, "step")), prompt, text);
    } else if (strcmp(event, "state") == 0) {
        const char *state = str(d, "state", "?");
        const char *reason = str(d, "reason", NULL);
        if (strcmp(state, "running") == 0 && v->started == 0) v->started = wall_now();
        bool ok = strcmp(state, "succeeded") == 0, failed = strcmp(state, "failed") == 0,
             cancelled = strcmp(state, "cancelled") == 0;
        if (ok || failed || cancelled) {
            char t[32] = "";
            if (v->started > 0) clock_text(wall_now() - v->started, t, sizeof t);
            v->have_train = v->have_train && !ok; /* the finished bar is not drawn again */
            say(v, "job %ld %s%s%s%s%s", v->job, state, t[0] ? " after " : "", t,
                reason ? ": " : "", reason ? reason : "");
            v->final = ok ? TC_EXIT_OK : failed ? TC_EXIT_FAILED : TC_EXIT_CANCELLED;
        } else {
            say(v, "job %ld %s%s%s", v->job, state, reason ? ": " : "", reason ? reason : "");
        }
    } else {
        char *text = json_dumps(d, JSON_COMPACT | JSON_REAL_PRECISION(15)); /* (as it came) */
        say(v, "%s %.300s", event, text ? text : "");
        free(text);
    }
}

static bool on_event(void *ctx, long id, const char *event, const char *data) {
    view *v = ctx;
    json_t *d = json_loads(data, 0, NULL);
    if (v->json) {
        json_t *o = json_pack("{s:I, s:s, s:o}", "id", (json_int_t)id, "event", event, "data",
                              d ? json_incref(d) : json_string(data));
        char *text = o ? json_dumps(o, JSON_COMPACT | JSON_REAL_PRECISION(15)) : NULL;
        if (text) printf("%s\n", text);
        fflush(stdout);
        free(text);
        json_decref(o);
        if (strcmp(event, "state") == 0) {
            const char *state = str(d, "state", "");
            v->final = strcmp(state, "succeeded") == 0   ? TC_EXIT_OK
                       : strcmp(state, "failed") == 0    ? TC_EXIT_FAILED
                       : strcmp(state, "cancelled") == 0 ? TC_EXIT_CANCELLED
                                                         : -1;
        }
    } else if (d) {
        show_event(v, event, d);
    } else {
        json_t *none = json_object();
        show_event(v, event, none);
        json_decref(none);
    }
    json_decref(d);
    return v->final >= 0;
}

static void on_notice(void *ctx, const char *text) {
    view *v = ctx;
    if (v->json)
        fprintf(stderr, "trainctl: %s\n", text);
    else
        say(v, "(%s)", text);
}

int tc_follow(const tc_conn *c, long job, const tc_follow_options *o) {
    view v = {.conn = c, .job = job, .tty = isatty(STDOUT_FILENO), .final = -1};
    v.json = o->json || !v.tty;
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld", job);
    json_t *j = tc_get_json(c, path);
    if (!j) return TC_EXIT_ERROR;
    v.started = parse_time(json_string_value(json_object_get(j, "started_at")));
    json_decref(j);
    long last_id = -1;
    int rc = tc_events_follow(c, job, &last_id, on_event, on_notice, &v, &tc_interrupted, 300);
    if (v.tty && v.drawn) printf("\n");
    fflush(stdout);
    if (rc == 1) { /* Ctrl-C */
        if (!o->cancel_on_interrupt) {
            fprintf(stderr,
                    "trainctl: stopped following job %ld; it goes on (trainctl cancel %ld stops "
                    "it)\n",
                    job, job);
            return 130;
        }
        tc_reply r;
        char err[512] = "";
        tc_interrupted = 0; /* (a second Ctrl-C stops the cancel request itself) */
        snprintf(path, sizeof path, "/v1/jobs/%ld/cancel", job);
        tc_request(c, "POST", path, NULL, &r, err, sizeof err);
        int status = r.status == 200 ? TC_EXIT_CANCELLED : tc_fail_reply(c, &r, err);
        if (r.status == 200) fprintf(stderr, "trainctl: job %ld cancelled\n", job);
        tc_reply_free(&r);
        return status;
    }
    if (rc != 0) return rc;
    return v.final >= 0 ? v.final : TC_EXIT_ERROR;
}
