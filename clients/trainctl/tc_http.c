/* Requests to traind's API with libcurl: JSON calls, streamed text (logs) and resumable
 * downloads (trainctl.h). Every failure is put in words for a person at a terminal. */
#include "trainctl.h"

#include <curl/curl.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

size_t tc_collect(char *p, size_t size, size_t n, void *ctx) {
    tc_reply *r = ctx;
    size_t add = size * n;
    char *grown = realloc(r->body, r->len + add + 1);
    if (!grown) return 0; /* libcurl then fails the transfer: out of memory */
    memcpy(grown + r->len, p, add);
    r->body = grown;
    r->len += add;
    r->body[r->len] = 0;
    return add;
}

CURL *tc_handle(const tc_conn *c, const char *path, struct curl_slist **hdr, char *why) {
    CURL *h = curl_easy_init();
    if (!h) return NULL;
    char url[4096], auth[300];
    snprintf(url, sizeof url, "%s%s", c->url, path);
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L);
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT, 10L);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, why);
    /* a daemon's own CA (--tls-cert signed by it): trusted instead of the system's store */
    if (c->cacert[0]) {
        curl_easy_setopt(h, CURLOPT_CAINFO, c->cacert);
        curl_easy_setopt(h, CURLOPT_CAPATH, NULL); /* libcurl's built-in /etc/ssl/certs too */
    }
    why[0] = 0;
    *hdr = NULL;
    if (c->token[0]) {
        snprintf(auth, sizeof auth, "Authorization: Bearer %s", c->token);
        *hdr = curl_slist_append(*hdr, auth);
    }
    return h;
}

/* Ctrl-C ends any transfer: libcurl calls this about once a second and on every chunk. */
static int interruptible(void *ctx, curl_off_t a, curl_off_t b, curl_off_t c, curl_off_t d) {
    (void)ctx, (void)a, (void)b, (void)c, (void)d;
    return tc_interrupted != 0;
}

/* Runs h: the status of the answer (0: none came), and in *code how the transfer ended (a
 * write error after a good answer: the reader of our output went away). */
static long finish(CURL *h, struct curl_slist *hdr, const char *why, char *err, size_t len,
                   CURLcode *code) {
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    CURLcode rc = curl_easy_perform(h);
    long status = 0;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    if (rc != CURLE_OK) snprintf(err, len, "%s", why[0] ? why : curl_easy_strerror(rc));
    if (rc != CURLE_OK && rc != CURLE_WRITE_ERROR) status = 0;
    if (code) *code = rc;
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return status;
}

long tc_request(const tc_conn *c, const char *method, const char *path, const char *body,
                tc_reply *r, char *err, size_t len) {
    memset(r, 0, sizeof *r);
    char why[CURL_ERROR_SIZE];
    struct curl_slist *hdr;
    CURL *h = tc_handle(c, path, &hdr, why);
    if (!h) {
        snprintf(err, len, "curl_easy_init failed");
        return 0;
    }
    curl_easy_setopt(h, CURLOPT_CUSTOMREQUEST, method);
    curl_easy_setopt(h, CURLOPT_TIMEOUT, 600L); /* a cancel waits out the grace period */
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, interruptible);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, tc_collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, r);
    if (body) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        hdr = curl_slist_append(hdr, "Content-Type: application/json");
    } else if (strcmp(method, "POST") == 0) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, "");
    }
    CURLcode code;
    r->status = finish(h, hdr, why, err, len, &code);
    if (code != CURLE_OK) r->status = 0; /* a reply cut short is no reply */
    return r->status;
}

void tc_reply_free(tc_reply *r) {
    free(r->body);
    memset(r, 0, sizeof *r);
}

json_t *tc_reply_json(const tc_reply *r) {
    return r->body ? json_loadb(r->body, r->len, 0, NULL) : NULL;
}

int tc_fail_reply(const tc_conn *c, const tc_reply *r, const char *err) {
    if (tc_interrupted) {
        fprintf(stderr, "trainctl: interrupted\n");
        return 130;
    }
    if ((!r || r->status == 0) && err && (strstr(err, "SSL") || strstr(err, "certificate")))
        return tc_error("cannot reach traind at %s: %s (a TLS failure: give the CA that signed "
                        "the daemon's certificate with --cacert FILE, TRAIND_CACERT or \"cacert\" "
                        "in the config file)",
                        c->url, err);
    if (!r || r->status == 0)
        return tc_error("cannot reach traind at %s: %s (is it running? give --url or TRAIND_URL)",
                        c->url, err && *err ? err : "no answer");
    json_t *o = tc_reply_json(r);
    json_t *e = json_object_get(o, "error");
    const char *message = json_string_value(json_object_get(e, "message"));
    const char *field = json_string_value(json_object_get(e, "field"));
    if (r->status == 401 && !c->token[0])
        tc_error("%s refused the request: no API token found (looked at: %s). Give --token, "
                 "TRAIND_TOKEN or --token-file STATE_DIR/token (traind writes its token there on "
                 "its first start), or put \"token_file\" in %s",
                 c->url, c->token_from[0] ? c->token_from : "nothing", c->config_path);
    else if (r->status == 401)
        tc_error("%s refused the API token from %s: %s (is it the token of this traind?)", c->url,
                 c->token_from, message ? message : "unauthorized");
    else if (message)
        tc_error("%s%s%s (HTTP %ld)", field ? field : "", field ? ": " : "", message, r->status);
    else
        tc_error("%s answered HTTP %ld%s%.200s", c->url, r->status, r->body ? ": " : "",
                 r->body ? r->body : "");
    json_decref(o);
    return TC_EXIT_ERROR;
}

json_t *tc_get_json(const tc_conn *c, const char *path) {
    tc_reply r;
    char err[CURL_ERROR_SIZE + 64] = "";
    tc_request(c, "GET", path, NULL, &r, err, sizeof err);
    json_t *o = r.status == 200 ? tc_reply_json(&r) : NULL;
    if (!o) tc_fail_reply(c, &r, err);
    tc_reply_free(&r);
    return o;
}

/* ---- streams ---------------------------------------------------------------------------- */

typedef struct sink {
    FILE *out;
    tc_reply error; /* the body of an error reply, kept for its message */
    CURL *h;
    volatile sig_atomic_t *stop;
    /* downloads */
    long long have, size, base; /* on disk before, expected in all, and where this one began */
    bool restart;               /* asked for a range, got the whole file: start it again */
    bool progress, checked;
    double t0, last_draw;
} sink;

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static size_t to_file(char *p, size_t size, size_t n, void *ctx) {
    sink *s = ctx;
    long status = 0;
    curl_easy_getinfo(s->h, CURLINFO_RESPONSE_CODE, &status);
    if (status >= 300) return tc_collect(p, size, n, &s->error);
    if (!s->checked) {
        s->checked = true;
        if (status == 200 && s->base > 0) { /* the server sent it whole: start again */
            if (fflush(s->out) != 0 || ftruncate(fileno(s->out), 0) != 0) return 0;
            s->base = 0;
        }
    }
    size_t wrote = fwrite(p, size, n, s->out);
    if (s->out == stdout) fflush(stdout);
    return wrote * size;
}

static void human(double bytes, char *out, size_t len) {
    const char *unit[] = {"B", "kB", "MB", "GB", "TB"};
    int u = 0;
    while (bytes >= 1000 && u < 4) bytes /= 1000, u++;
    snprintf(out, len, u ? "%.1f %s" : "%.0f %s", bytes, unit[u]);
}

static int progress(void *ctx, curl_off_t dl_total, curl_off_t dl_now, curl_off_t ul_total,
                    curl_off_t ul_now) {
    (void)dl_total, (void)ul_total, (void)ul_now;
    sink *s = ctx;
    if (s->stop && *s->stop) return 1; /* aborts the transfer */
    if (!s->progress) return 0;
    double t = now_s();
    if (t - s->last_draw < 0.1) return 0;
    s->last_draw = t;
    double got = (double)(s->base + dl_now), rate = (double)dl_now / (t - s->t0 + 1e-9);
    char a[32], b[32], r[32];
    human(got, a, sizeof a);
    human((double)s->size, b, sizeof b);
    human(rate, r, sizeof r);
    int pct = s->size > 0 ? (int)(100.0 * got / (double)s->size) : 0;
    char bar[31];
    int fill = s->size > 0 ? pct * 30 / 100 : 0;
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = 0;
    fprintf(stderr, "\r\033[K[%s] %3d%%  %s of %s  %s/s", bar, pct, a, b, r);
    return 0;
}

int tc_stream(const tc_conn *c, const char *path, FILE *out, volatile sig_atomic_t *stop) {
    char why[CURL_ERROR_SIZE], err[CURL_ERROR_SIZE + 64] = "";
    struct curl_slist *hdr;
    sink s = {.out = out, .stop = stop};
    CURL *h = tc_handle(c, path, &hdr, why);
    if (!h) return tc_error("curl_easy_init failed");
    s.h = h;
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, to_file);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &s);
    CURLcode code;
    long status = finish(h, hdr, why, err, sizeof err, &code);
    int rc = 0;
    if (stop && *stop)
        rc = 130; /* Ctrl-C while following: as for follow */
    else if (status != 200) {
        s.error.status = status;
        rc = tc_fail_reply(c, &s.error, err);
    } else if (code == CURLE_WRITE_ERROR) {
        rc = 0; /* whoever read our output stopped (trainctl logs -f ID | head): done */
    } else if (code != CURLE_OK) {
        rc = tc_error("the log stream stopped: %s", err);
    }
    tc_reply_free(&s.error);
    return rc;
}

/* The file's modification time as an HTTP date (what the server's Last-Modified was, when a
 * download set it). */
static void http_date(time_t t, char *out, size_t len) {
    struct tm tm;
    if (!gmtime_r(&t, &tm) || !strftime(out, len, "%a, %d %b %Y %H:%M:%S GMT", &tm)) out[0] = 0;
}

int tc_download(const tc_conn *c, const char *path, const char *file, long long size, bool show,
                volatile sig_atomic_t *stop) {
    struct stat st;
    bool exists = stat(file, &st) == 0;
    long long have = exists ? (long long)st.st_size : 0;
    if (size >= 0 && have > size)
        return tc_error("%s holds %lld bytes, more than the %lld of what it would be downloaded "
                        "from: remove it, or give another -o",
                        file, have, size);
    /* A partial file resumes where it stopped, but only if the server's file is the one it was
     * started from: its modification time is the server's Last-Modified (set after every
     * transfer, whole or cut short) and goes back as If-Range; a file written again since comes
     * whole. A file of full size is checked the same way by asking for its last byte. */
    char since[64] = "";
    if (exists && have > 0) http_date(st.st_mtime, since, sizeof since);
    long long from = have == size && have > 0 ? have - 1 : have;
    FILE *out = fopen(file, "ab");
    if (!out) return tc_error("cannot write %s: %s", file, strerror(errno));
    if (from < have && ftruncate(fileno(out), (off_t)from) != 0) {
        fclose(out);
        return tc_error("cannot write %s: %s", file, strerror(errno));
    }
    char why[CURL_ERROR_SIZE], err[CURL_ERROR_SIZE + 64] = "", range[64], if_range[96];
    struct curl_slist *hdr;
    sink s = {.out = out,
              .stop = stop,
              .have = from,
              .size = size,
              .base = from,
              .progress = show,
              .t0 = now_s()};
    CURL *h = tc_handle(c, path, &hdr, why);
    if (!h) {
        fclose(out);
        return tc_error("curl_easy_init failed");
    }
    s.h = h;
    if (from > 0) {
        snprintf(range, sizeof range, "Range: bytes=%lld-", from);
        hdr = curl_slist_append(hdr, range);
        snprintf(if_range, sizeof if_range, "If-Range: %s", since);
        hdr = curl_slist_append(hdr, if_range);
    }
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, to_file);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, &s);
    curl_easy_setopt(h, CURLOPT_NOPROGRESS, 0L);
    curl_easy_setopt(h, CURLOPT_XFERINFOFUNCTION, progress);
    curl_easy_setopt(h, CURLOPT_XFERINFODATA, &s);
    curl_easy_setopt(h, CURLOPT_FILETIME, 1L);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    CURLcode code = curl_easy_perform(h);
    long status = 0;
    curl_off_t remote_time = -1;
    curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    curl_easy_getinfo(h, CURLINFO_FILETIME_T, &remote_time);
    if (code != CURLE_OK) snprintf(err, sizeof err, "%s", why[0] ? why : curl_easy_strerror(code));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    int closed = fclose(out);
    if (show) fprintf(stderr, "\r\033[K");
    bool got = status == 200 || status == 206;
    if (got && remote_time >= 0) { /* what the next run's If-Range compares with */
        struct timespec times[2] = {{.tv_nsec = UTIME_OMIT}, {.tv_sec = (time_t)remote_time}};
        utimensat(AT_FDCWD, file, times, 0);
    }
    int rc = 0;
    if (stop && *stop) {
        fprintf(stderr,
                "trainctl: interrupted: %s is partial; run the same command again to "
                "resume\n",
                file);
        rc = 130;
    } else if (!got) {
        s.error.status = status;
        rc = tc_fail_reply(c, &s.error, err);
    } else if (code != CURLE_OK || closed != 0) {
        rc = tc_error("%s: the transfer stopped (%s); run the same command again to resume", file,
                      closed != 0 ? strerror(errno) : err);
    } else {
        long long now = stat(file, &st) == 0 ? (long long)st.st_size : -1;
        if (size >= 0 && now != size)
            rc = tc_error("%s has %lld bytes, not the %lld expected: the transfer stopped early; "
                          "run the same command again to resume",
                          file, now, size);
        else if (have == size && status == 206)
            fprintf(stderr, "%s: already complete (%lld bytes)\n", file, now);
        else
            fprintf(stderr, "%s: %lld bytes%s\n", file, now,
                    status == 206 ? " (resumed)"
                    : have > 0    ? " (the server's file changed: "
                                    "downloaded again whole)"
                                  : "");
    }
    tc_reply_free(&s.error);
    return rc;
}
