/* A job's Server-Sent Events (GET /v1/jobs/{id}/events), parsed as the stream arrives and
 * followed across dropped connections: each reconnection sends Last-Event-ID, and the daemon's
 * ids increase by one per job, so nothing is missed or seen twice (trainctl.h). The parser is
 * written here because libcurl hands over bytes, not events, and no Debian C library parses
 * text/event-stream: it keeps the few fields the daemon sends (id, event, data). */
#include "trainctl.h"

#include <curl/curl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

typedef struct stream {
    tc_event_fn fn;
    void *ctx;
    long *last_id;
    volatile sig_atomic_t *stop;
    CURL *h;
    char *line; /* the line being read */
    size_t len, cap;
    long id;         /* of the event being read; -1: none given */
    char event[128]; /* its name ("message" when none) */
    char *data;      /* its data lines, joined by \n */
    size_t data_len;
    bool done;    /* fn said stop */
    bool got_any; /* an answer with status 200 began */
    tc_notice_fn notice;
    bool *told;     /* that the connection was lost: told again when it is back */
    tc_reply error; /* an error reply's body */
} stream;

static void dispatch(stream *s) {
    if (s->data) {
        if (s->id >= 0) *s->last_id = s->id;
        if (!s->done && s->fn(s->ctx, s->id, s->event[0] ? s->event : "message", s->data))
            s->done = true;
    }
    free(s->data);
    s->data = NULL;
    s->data_len = 0;
    s->id = -1;
    s->event[0] = 0;
}

static void field(stream *s, char *line) {
    if (!*line) {
        dispatch(s);
        return;
    }
    if (*line == ':') return; /* a comment: the daemon's keep-alive */
    char *value = strchr(line, ':');
    if (value) {
        *value++ = 0;
        if (*value == ' ') value++;
    } else {
        value = line + strlen(line);
    }
    if (strcmp(line, "id") == 0) {
        char *end;
        long id = strtol(value, &end, 10);
        if (*value && !*end) s->id = id;
    } else if (strcmp(line, "event") == 0) {
        snprintf(s->event, sizeof s->event, "%s", value);
    } else if (strcmp(line, "data") == 0) {
        size_t n = strlen(value);
        char *grown = realloc(s->data, s->data_len + n + 2);
        if (!grown) return;
        s->data = grown;
        if (s->data_len) s->data[s->data_len++] = '\n';
        memcpy(s->data + s->data_len, value, n + 1);
        s->data_len += n;
    }
}

static size_t on_bytes(char *p, size_t size, size_t n, void *ctx) {
    stream *s = ctx;
    size_t total = size * n;
    long status = 0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) return tc_collect(p, size, n, &s->error);
    if (!s->got_any && *s->told && s->notice) {
        s->notice(s->ctx, "reconnected");
        *s->told = false;
    }
    s->got_any = true;
    for (size_t i = 0; i < total && !s->done; i++) {
        char ch = p[i];
        if (ch == '\n') {
            if (s->len && s->line[s->len - 1] == '\r') s->len--;
            s->line[s->len] = 0;
            field(s, s->line);
            s->len = 0;
            continue;
        }
        if (s->len + 2 > s->cap) {
            size_t cap = s->cap ? 2 * s->cap : 4096;
            char *grown = realloc(s->line, cap);
            if (!grown) return 0;
            s->line = grown, s->cap = cap;
        }
        s->line[s->len++] = ch;
    }
    return s->done ? 0 : total; /* 0 ends the transfer once the job is over */
}

static int check_stop(void *ctx, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
    (void)a, (void)b, (void)c, (void)d;
    stream *s = ctx;
    return s->stop && *s->stop;
}

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

int tc_events_follow(const tc_conn *c, long job, long *last_id, tc_event_fn fn, tc_notice_fn notice,
                     void *ctx, volatile sig_atomic_t *stop, double give_up_s) {
    char path[64];
    snprintf(path, sizeof path, "/v1/jobs/%ld/events", job);
    double failing_since = 0, pause = 0.2;
    bool told = false;
    for (;;) {
        stream s = {.fn = fn,
                    .ctx = ctx,
                    .last_id = last_id,
                    .stop = stop,
                    .id = -1,
                    .notice = notice,
                    .told = &told};
        char resume[64], why[CURL_ERROR_SIZE] = "";
        struct curl_slist *hdr;
        CURL *h = tc_handle(c, path, &hdr, why);
        if (!h) return tc_error("curl_easy_init failed");
        s.h = h;
        if (*last_id >= 0) {
            snprintf(resume, sizeof resume, "Last-Event-ID: %ld", *last_id);
            hdr = curl_slist_append(hdr, resume);
        }
        hdr = curl_slist_append(hdr, "Accept: text/event-stream");
        curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
        curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 5L); /* retried soon: give up soon */
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, on_bytes);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
        curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
        curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, check_stop);
        curl_easy_setopt(h, CURLOPT_XFERINFODATA, &s);
        /* a stream that goes quiet for a minute (a dead peer) is given up and reopened */
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 60L);
        CURLcode rc = curl_easy_perform(h);
        if (rc != CURLE_OK && !why[0]) snprintf(why, sizeof why, "%s", curl_easy_strerror(rc));
        long status = 0;
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
        curl_slist_free_all(hdr);
        curl_easy_cleanup(h);
        /* an event not ended by its blank line at the stream's end is dropped, as SSE says:
         * last_id has not moved past it, so the reconnection brings it whole */
        free(s.line);
        free(s.data);
        if (s.done) {
            tc_reply_free(&s.error);
            return 0;
        }
        if (stop && *stop) {
            tc_reply_free(&s.error);
            return 1;
        }
        if (status != 0 && status != 200 && status < 500) { /* refused: retrying cannot help */
            s.error.status = status;
            int r = tc_fail_reply(c, &s.error, why);
            tc_reply_free(&s.error);
            return r;
        }
        tc_reply_free(&s.error);
        /* the stream dropped (the daemon restarted, the network went away): again, from after
         * the last event seen */
        double t = now_s();
        if (s.got_any) failing_since = 0, pause = 0.2;
        if (failing_since == 0) failing_since = t;
        if (t - failing_since > give_up_s)
            return tc_error("lost the event stream of job %ld and could not reach %s for %.0f s "
                            "(%s); the job goes on: trainctl follow %ld",
                            job, c->url, give_up_s,
                            why[0]   ? why
                            : status ? "a server error"
                                     : "no answer",
                            job);
        if (notice && !told) {
            char text[1024];
            snprintf(text, sizeof text, "connection to %.400s lost (%.400s); reconnecting", c->url,
                     why[0] ? why : "the stream ended");
            notice(ctx, text);
            told = true;
        }
        struct timespec ts = {(time_t)pause, (long)((pause - (time_t)pause) * 1e9)};
        nanosleep(&ts, NULL);
        if (pause < 2) pause *= 2;
    }
}
