#include "api/td_api.h"

#include "service/td_ckpt.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <microhttpd.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

struct td_api {
    td_api_config cfg;
    char token[128];
    td_jobs *jobs;
    struct MHD_Daemon *daemon;
    int port;
};

/* One request's state across libmicrohttpd's calls: the body arrives in pieces. */
typedef struct request {
    td_buf body;
    bool too_large;
} request;

static const char JSON_TYPE[] = "application/json";

static bool is(const char *a, const char *b) {
    return strcmp(a, b) == 0;
}

static enum MHD_Result send_buf(struct MHD_Connection *c, int status, const char *type, td_buf *b) {
    size_t len = b->len;
    char *data = td_buf_take(b);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(data);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result send_error(struct MHD_Connection *c, const td_reply_error *e,
                                  const char *allow) {
    json_t *o = json_pack("{s:{s:s, s:s, s:o}}", "error", "code", e->code, "message", e->message,
                          "field", e->field[0] ? json_string(e->field) : json_null());
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text)
        text = strdup("{\"error\":{\"code\":\"internal\",\"message\":\"?\",\"field\":null}}");
    if (!text) return MHD_NO;
    size_t len = strlen(text);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, text, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(text);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_TYPE);
    if (allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (e->status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"traind\"");
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)e->status, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result fail(struct MHD_Connection *c, int status, const char *code,
                            const char *field, const char *message) {
    td_reply_error e;
    td_reply_fail(&e, status, code, field, "%s", message);
    return send_error(c, &e, NULL);
}

static enum MHD_Result send_json_text(struct MHD_Connection *c, int status, const char *text) {
    td_buf b = {0};
    td_buf_puts(&b, text);
    return send_buf(c, status, JSON_TYPE, &b);
}

/* Constant time in the token's length: a wrong guess takes as long whatever it shares. */
static bool token_ok(const td_api *api, struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    const char *given = h + 7;
    size_t n = strlen(api->token), m = strlen(given);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(api->token[i] ^ (i < m ? given[i] : 0));
    return diff == 0;
}

/* A non-negative decimal; false for anything else (signs, spaces, overflow). */
static bool parse_id(const char *s, size_t n, long *out) {
    if (n == 0 || n > 18) return false;
    long v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        v = v * 10 + (s[i] - '0');
    }
    *out = v;
    return true;
}

static bool query_long(struct MHD_Connection *c, const char *name, long min, long max, long *out,
                       bool *bad) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v) return false;
    long x;
    bool neg = v[0] == '-';
    if (!parse_id(v + neg, strlen(v + neg), &x) || (neg ? -x : x) < min || (neg ? -x : x) > max) {
        *bad = true;
        return false;
    }
    *out = neg ? -x : x;
    return true;
}

/* ---- streamed responses ----------------------------------------------------------------- */

/* Bytes made ahead of what libmicrohttpd has asked for (SSE records, tar blocks). */
typedef struct pending {
    td_buf buf;
    size_t off;
} pending;

/* Copies what is pending into buf, at most max; 0 when nothing is, and then the buffer is
 * emptied for the caller to make more. */
static size_t pending_take(pending *p, char *buf, size_t max) {
    if (p->off < p->buf.len) {
        size_t n = p->buf.len - p->off < max ? p->buf.len - p->off : max;
        memcpy(buf, p->buf.data + p->off, n);
        p->off += n;
        return n;
    }
    p->buf.len = p->off = 0;
    return 0;
}

/* ---- Server-Sent Events ------------------------------------------------------------------- */

typedef struct stream {
    td_jobs *jobs;
    long id, sent; /* the last event id written */
    pending out;
    bool done;
} stream;

static ssize_t read_events(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *s = cls;
    for (;;) {
        size_t n = pending_take(&s->out, buf, max);
        if (n) return (ssize_t)n;
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        td_err err = {{0}};
        if (td_db_events_sse(td_jobs_db(s->jobs), s->id, s->sent, 256, &s->out.buf, &s->sent,
                             &err) != 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (s->out.buf.len) continue;
        long last;
        bool ended;
        if (td_jobs_wait(s->jobs, s->id, s->sent, 15.0, &last, &ended) != 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (ended && last <= s->sent)
            s->done = true;
        else if (last <= s->sent) /* quiet for 15 s: a comment keeps proxies from timing out */
            td_buf_puts(&s->out.buf, ": keep-alive\n\n");
    }
}

static void free_stream(void *cls) {
    stream *s = cls;
    td_buf_free(&s->out.buf);
    free(s);
}

static enum MHD_Result events(td_api *api, struct MHD_Connection *c, long id) {
    td_reply_error e;
    if (td_jobs_exists(api->jobs, id, &e) != 0) return send_error(c, &e, NULL);
    const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    if (!last) last = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "last_event_id");
    long after = 0;
    if (last && !parse_id(last, strlen(last), &after))
        return fail(c, 400, "bad_request", "Last-Event-ID",
                    "Last-Event-ID: expected the decimal id of an event already received");
    stream *s = td_calloc(1, sizeof *s);
    s->jobs = api->jobs;
    s->id = id;
    s->sent = after;
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, read_events, s, free_stream);
    if (!r) {
        free_stream(s);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- logs ------------------------------------------------------------------------------------ */

typedef struct follower {
    td_jobs *jobs;
    long id;
    int fd;
    bool ended_seen; /* the job had ended at the last empty read: one more read, then stop */
} follower;

static ssize_t read_log(void *cls, uint64_t pos, char *buf, size_t max) {
    follower *f = cls;
    for (;;) {
        ssize_t n = pread(f->fd, buf, max, (off_t)pos);
        if (n > 0) return n;
        if (n < 0 && errno != EINTR) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (f->ended_seen) return MHD_CONTENT_READER_END_OF_STREAM;
        long last;
        bool ended;
        /* workers write the file directly: no event announces a line, so look every 250 ms */
        if (td_jobs_wait(f->jobs, f->id, LONG_MAX, 0.25, &last, &ended) != 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        f->ended_seen = ended;
    }
}

static void free_follower(void *cls) {
    follower *f = cls;
    close(f->fd);
    free(f);
}

static enum MHD_Result logs(td_api *api, struct MHD_Connection *c, long id) {
    long rank = 0, follow = 0;
    bool bad = false;
    query_long(c, "rank", 0, 1 << 20, &rank, &bad);
    query_long(c, "follow", 0, 1, &follow, &bad);
    if (bad)
        return fail(c, 400, "bad_request", NULL,
                    "rank: expected a rank number; follow: expected 0 or 1");
    char path[PATH_MAX];
    td_reply_error e;
    if (td_jobs_log_path(api->jobs, id, (int)rank, path, sizeof path, &e) != 0)
        return send_error(c, &e, NULL);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_CREAT, 0640); /* not started yet: empty */
    if (fd < 0) return fail(c, 500, "internal", NULL, "cannot open the log file");
    struct MHD_Response *r;
    if (follow) {
        follower *f = td_calloc(1, sizeof *f);
        *f = (follower){api->jobs, id, fd, false};
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, read_log, f, free_follower);
        if (!r) free_follower(f);
    } else {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            close(fd);
            return fail(c, 500, "internal", NULL, "cannot read the log file");
        }
        r = MHD_create_response_from_fd64((uint64_t)st.st_size, fd);
        if (!r) close(fd);
    }
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/plain; charset=utf-8");
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* ---- checkpoints ------------------------------------------------------------------------- */

/* "bytes=A-B", "bytes=A-" or "bytes=-N" against a file of size n: [*from, *to]. */
static bool parse_range(const char *h, uint64_t n, uint64_t *from, uint64_t *to) {
    if (strncmp(h, "bytes=", 6) != 0 || strchr(h, ',')) return false;
    const char *p = h + 6, *dash = strchr(p, '-');
    if (!dash) return false;
    long a = -1, b = -1;
    if (dash > p && !parse_id(p, (size_t)(dash - p), &a)) return false;
    if (dash[1] && !parse_id(dash + 1, strlen(dash + 1), &b)) return false;
    if (a < 0) { /* the last b bytes */
        if (b <= 0) return false;
        *from = (uint64_t)b >= n ? 0 : n - (uint64_t)b;
        *to = n - 1;
    } else {
        *from = (uint64_t)a;
        *to = b < 0 || (uint64_t)b >= n ? n - 1 : (uint64_t)b;
        if (b >= 0 && b < a) return false;
    }
    return *from < n;
}

/* Percent-encodes a file name for a URL path (unreserved characters and "/" stay). */
static void url_escape(td_buf *b, const char *s) {
    for (; *s; s++) {
        unsigned char c = (unsigned char)*s;
        if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            strchr("-._~/", c))
            td_buf_append(b, (const char *)&c, 1);
        else
            td_buf_printf(b, "%%%02X", c);
    }
}

static json_t *url_json(long job, long step, const char *name) {
    td_buf b = {0};
    td_buf_printf(&b, "/v1/jobs/%ld/checkpoints/%ld/", job, step);
    url_escape(&b, name);
    json_t *v = json_string(b.data);
    td_buf_free(&b);
    return v;
}

typedef struct ckpt_ctx {
    long job;
    json_t *list;
} ckpt_ctx;

/* One checkpoint as the API shows it: its files as they are on disk now (checkpoint.keep may
 * have removed it since), each with its download URL, and the URL of the whole as a tar. */
static void checkpoint_json(void *cls, const td_db_checkpoint *c) {
    ckpt_ctx *ctx = cls;
    td_ckpt_file *files = NULL;
    int n = 0;
    td_err err = {{0}};
    bool on_disk = td_ckpt_list(c->path, &files, &n, &err) == 0;
    json_t *list = json_array(), *model = json_null();
    for (int i = 0; i < n; i++) {
        json_array_append_new(list, json_pack("{s:s, s:I, s:o}", "name", files[i].name, "size",
                                              (json_int_t)files[i].size, "url",
                                              url_json(ctx->job, c->step, files[i].name)));
        if (strcmp(files[i].name, "model.safetensors") == 0) {
            json_decref(model);
            model = url_json(ctx->job, c->step, files[i].name);
        }
    }
    td_ckpt_files_free(files, n);
    char when[64], archive[96];
    time_t t = (time_t)c->created_at;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(archive, sizeof archive, "/v1/jobs/%ld/checkpoints/%ld.tar", ctx->job, c->step);
    json_t *o = json_pack("{s:I, s:I, s:s, s:b, s:o, s:o, s:s}", "step", (json_int_t)c->step,
                          "size", (json_int_t)c->size, "created_at", when, "on_disk", on_disk,
                          "files", list, "url", model, "archive_url", archive);
    if (o) json_array_append_new(ctx->list, o);
}

/* GET .../checkpoints (step < 0: all) or .../checkpoints/{step}. */
static enum MHD_Result checkpoints(td_api *api, struct MHD_Connection *c, long id, long step) {
    td_reply_error e;
    if (td_jobs_exists(api->jobs, id, &e) != 0) return send_error(c, &e, NULL);
    ckpt_ctx ctx = {id, json_array()};
    td_err err = {{0}};
    if (td_db_checkpoints(td_jobs_db(api->jobs), id, step, checkpoint_json, &ctx, &err) != 0) {
        json_decref(ctx.list);
        return fail(c, 500, "internal", NULL, err.msg);
    }
    if (step >= 0 && json_array_size(ctx.list) == 0) {
        json_decref(ctx.list);
        td_reply_fail(&e, 404, "not_found", NULL, "job %ld has no checkpoint at step %ld", id,
                      step);
        return send_error(c, &e, NULL);
    }
    json_t *body = step >= 0 ? json_incref(json_array_get(ctx.list, 0)) : json_incref(ctx.list);
    json_decref(ctx.list);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) return MHD_NO;
    enum MHD_Result ok = send_json_text(c, MHD_HTTP_OK, text);
    free(text);
    return ok;
}

/* The path of job id's checkpoint at step, or an error reply already queued (*sent). */
static int checkpoint_path(td_api *api, struct MHD_Connection *c, long id, long step, char *path,
                           size_t len, enum MHD_Result *sent) {
    td_reply_error e;
    if (td_jobs_exists(api->jobs, id, &e) != 0) {
        *sent = send_error(c, &e, NULL);
        return -1;
    }
    td_err err = {{0}};
    int found = td_db_checkpoint_path(td_jobs_db(api->jobs), id, step, path, len, &err);
    if (found < 0) {
        *sent = fail(c, 500, "internal", NULL, err.msg);
        return -1;
    }
    if (found == 0) {
        td_reply_fail(&e, 404, "not_found", NULL, "job %ld has no checkpoint at step %ld", id,
                      step);
        *sent = send_error(c, &e, NULL);
        return -1;
    }
    return 0;
}

static enum MHD_Result range_not_satisfiable(struct MHD_Connection *c, const char *range,
                                             uint64_t n) {
    td_reply_error e;
    char cr[64];
    snprintf(cr, sizeof cr, "bytes */%llu", (unsigned long long)n);
    td_reply_fail(&e, 416, "range_not_satisfiable", "Range",
                  "Range \"%s\" does not fit a file of %llu bytes (one range, bytes=A-B, A-, "
                  "or -N)",
                  range, (unsigned long long)n);
    json_t *o = json_pack("{s:{s:s, s:s, s:s}}", "error", "code", e.code, "message", e.message,
                          "field", "Range");
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(text ? strlen(text) : 0, text, MHD_RESPMEM_MUST_FREE);
    if (!r) return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_TYPE);
    enum MHD_Result ok = MHD_queue_response(c, 416, r);
    MHD_destroy_response(r);
    return ok;
}

/* GET .../checkpoints/{step}/{name}: one file of a checkpoint, with Range. */
static enum MHD_Result checkpoint_file(td_api *api, struct MHD_Connection *c, long id, long step,
                                       const char *name) {
    char path[PATH_MAX];
    enum MHD_Result sent;
    if (checkpoint_path(api, c, id, step, path, sizeof path, &sent) != 0) return sent;
    int fd;
    long long size;
    td_err err = {{0}};
    if (td_ckpt_open(path, name, &fd, &size, &err) != 0) {
        td_reply_error e;
        td_reply_fail(&e, 404, "not_found", NULL,
                      "checkpoint of step %ld: %s (the list at /v1/jobs/%ld/checkpoints/%ld names "
                      "its files; checkpoint.keep removes older checkpoints)",
                      step, err.msg, id, step);
        return send_error(c, &e, NULL);
    }
    uint64_t n = (uint64_t)size, from = 0, to = n ? n - 1 : 0;
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_RANGE);
    int status = MHD_HTTP_OK;
    if (range) {
        if (!parse_range(range, n, &from, &to)) {
            close(fd);
            return range_not_satisfiable(c, range, n);
        }
        status = MHD_HTTP_PARTIAL_CONTENT;
    }
    struct MHD_Response *r =
        MHD_create_response_from_fd_at_offset64(n ? to - from + 1 : 0, fd, from);
    if (!r) {
        close(fd);
        return MHD_NO;
    }
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/octet-stream");
    MHD_add_response_header(r, MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes");
    if (status == MHD_HTTP_PARTIAL_CONTENT) {
        char cr[96];
        snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)from,
                 (unsigned long long)to, (unsigned long long)n);
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_RANGE, cr);
    }
    enum MHD_Result ok = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    return ok;
}

typedef struct tar_stream {
    td_ckpt_tar *tar;
    pending out;
    bool done;
} tar_stream;

static ssize_t read_tar(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    tar_stream *s = cls;
    for (;;) {
        size_t n = pending_take(&s->out, buf, max);
        if (n) return (ssize_t)n;
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        td_err err = {{0}};
        /* a file that went away mid-download: cut the response, never a short archive that
         * looks complete (the chunked encoding then lacks its end) */
        if (td_ckpt_tar_next(s->tar, &s->out.buf, &s->done, &err) != 0) {
            fprintf(stderr, "traind: checkpoint archive: %s\n", err.msg);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void free_tar(void *cls) {
    tar_stream *s = cls;
    td_ckpt_tar_close(s->tar);
    td_buf_free(&s->out.buf);
    free(s);
}

/* GET .../checkpoints/{step}.tar: the whole checkpoint as one tar, its files under the
 * checkpoint directory's name (step-00000400/model.safetensors, ...). */
static enum MHD_Result checkpoint_tar(td_api *api, struct MHD_Connection *c, long id, long step) {
    char path[PATH_MAX];
    enum MHD_Result sent;
    if (checkpoint_path(api, c, id, step, path, sizeof path, &sent) != 0) return sent;
    struct stat st;
    char top[PATH_MAX + 2] = "";
    const char *base = strrchr(path, '/');
    if (stat(path, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(top, sizeof top, "%s/", base && base[1] ? base + 1 : "checkpoint");
    tar_stream *s = td_calloc(1, sizeof *s);
    td_err err = {{0}};
    if (td_ckpt_tar_open(&s->tar, path, top, &err) != 0) {
        free(s);
        td_reply_error e;
        td_reply_fail(&e, 404, "not_found", NULL,
                      "the checkpoint of step %ld is no longer on disk (%s)", step, err.msg);
        return send_error(c, &e, NULL);
    }
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 65536, read_tar, s, free_tar);
    if (!r) {
        free_tar(s);
        return MHD_NO;
    }
    char disposition[128];
    snprintf(disposition, sizeof disposition,
             "attachment; filename=\"traind-job-%ld-step-%ld.tar\"", id, step);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/x-tar");
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_DISPOSITION, disposition);
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    return ok;
}

/* .../checkpoints/{step}[.tar|/{name}] */
static enum MHD_Result checkpoint_route(td_api *api, struct MHD_Connection *c, long id,
                                        const char *tail) {
    size_t digits = strspn(tail, "0123456789");
    long step;
    if (!parse_id(tail, digits, &step))
        return fail(c, 400, "bad_request", "step",
                    "a checkpoint is named by its step: /checkpoints/STEP, /checkpoints/STEP.tar "
                    "or /checkpoints/STEP/FILE");
    const char *rest = tail + digits;
    if (!*rest) return checkpoints(api, c, id, step);
    if (is(rest, ".tar")) return checkpoint_tar(api, c, id, step);
    if (rest[0] == '/' && rest[1]) return checkpoint_file(api, c, id, step, rest + 1);
    td_reply_error e;
    td_reply_fail(&e, 404, "not_found", NULL, "no checkpoint route %s", tail);
    return send_error(c, &e, NULL);
}

/* ---- routing ------------------------------------------------------------------------------- */

static enum MHD_Result wrong_method(struct MHD_Connection *c, const char *method, const char *url,
                                    const char *allow) {
    td_reply_error e;
    td_reply_fail(&e, 405, "method_not_allowed", NULL, "%s is not allowed on %s; allowed: %s",
                  method, url, allow);
    return send_error(c, &e, allow);
}

static enum MHD_Result submit(td_api *api, struct MHD_Connection *c, request *rq) {
    if (rq->too_large) {
        td_reply_error e;
        td_reply_fail(&e, 413, "body_too_large", NULL,
                      "the request body is over the limit of %zu bytes", api->cfg.max_body);
        return send_error(c, &e, NULL);
    }
    td_buf out = {0};
    long id;
    td_reply_error e;
    if (td_jobs_submit(api->jobs, rq->body.data ? rq->body.data : "", rq->body.len, &out, &id,
                       &e) != 0)
        return send_error(c, &e, NULL);
    size_t len = out.len;
    char *data = td_buf_take(&out);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) {
        free(data);
        return MHD_NO;
    }
    char location[64];
    snprintf(location, sizeof location, "/v1/jobs/%ld", id);
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, JSON_TYPE);
    MHD_add_response_header(r, MHD_HTTP_HEADER_LOCATION, location);
    enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_CREATED, r);
    MHD_destroy_response(r);
    return ok;
}

static enum MHD_Result list(td_api *api, struct MHD_Connection *c) {
    long limit = 50, offset = 0;
    bool bad = false;
    query_long(c, "limit", 1, 500, &limit, &bad);
    query_long(c, "offset", 0, LONG_MAX / 2, &offset, &bad);
    if (bad)
        return fail(c, 400, "bad_request", NULL,
                    "limit: expected 1 to 500; offset: expected a non-negative integer");
    unsigned states = 0;
    const char *st = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "state");
    if (st) {
        char copy[256], *save = NULL;
        snprintf(copy, sizeof copy, "%s", st);
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            unsigned bit = td_jobs_state_bit(t);
            if (!bit) {
                td_reply_error e;
                td_reply_fail(&e, 400, "bad_request", "state",
                              "state \"%s\": expected queued, running, restarting, succeeded, "
                              "failed or cancelled",
                              t);
                return send_error(c, &e, NULL);
            }
            states |= bit;
        }
    }
    td_buf out = {0};
    td_jobs_list(api->jobs, states, (int)limit, (int)offset, &out);
    return send_buf(c, MHD_HTTP_OK, JSON_TYPE, &out);
}

/* /v1/jobs/{id}[/rest]: the routes under one job. */
static enum MHD_Result job_route(td_api *api, struct MHD_Connection *c, const char *url,
                                 const char *method, const char *tail) {
    const char *slash = strchr(tail, '/');
    size_t id_len = slash ? (size_t)(slash - tail) : strlen(tail);
    long id;
    if (!parse_id(tail, id_len, &id))
        return fail(c, 400, "bad_request", "id", "a job id is a positive integer");
    const char *rest = slash ? slash : "";
    bool get = is(method, "GET") || is(method, "HEAD");
    td_reply_error e;
    td_buf out = {0};
    if (!*rest) {
        if (is(method, "DELETE")) {
            if (td_jobs_delete(api->jobs, id, &e) != 0) return send_error(c, &e, NULL);
            struct MHD_Response *r =
                MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
            if (!r) return MHD_NO;
            enum MHD_Result ok = MHD_queue_response(c, MHD_HTTP_NO_CONTENT, r);
            MHD_destroy_response(r);
            return ok;
        }
        if (!get) return wrong_method(c, method, url, "GET, DELETE");
        if (td_jobs_get(api->jobs, id, &out, &e) != 0) return send_error(c, &e, NULL);
        return send_buf(c, MHD_HTTP_OK, JSON_TYPE, &out);
    }
    if (is(rest, "/cancel")) {
        if (!is(method, "POST")) return wrong_method(c, method, url, "POST");
        if (td_jobs_cancel(api->jobs, id, &out, &e) != 0) return send_error(c, &e, NULL);
        return send_buf(c, MHD_HTTP_OK, JSON_TYPE, &out);
    }
    if (is(rest, "/metrics") || is(rest, "/events") || is(rest, "/logs") ||
        is(rest, "/checkpoints") || strncmp(rest, "/checkpoints/", 13) == 0) {
        if (!get) return wrong_method(c, method, url, "GET");
    }
    if (is(rest, "/metrics")) {
        long since = -1;
        bool bad = false;
        query_long(c, "since", -1, LONG_MAX / 2, &since, &bad);
        if (bad) return fail(c, 400, "bad_request", "since", "since: expected a step number");
        if (td_jobs_exists(api->jobs, id, &e) != 0) return send_error(c, &e, NULL);
        td_err err = {{0}};
        if (td_db_metrics_json(td_jobs_db(api->jobs), id, since, &out, &err) != 0)
            return fail(c, 500, "internal", NULL, err.msg);
        return send_buf(c, MHD_HTTP_OK, JSON_TYPE, &out);
    }
    if (is(rest, "/events")) return events(api, c, id);
    if (is(rest, "/logs")) return logs(api, c, id);
    if (is(rest, "/checkpoints")) return checkpoints(api, c, id, -1);
    if (strncmp(rest, "/checkpoints/", 13) == 0) return checkpoint_route(api, c, id, rest + 13);
    td_reply_fail(&e, 404, "not_found", NULL, "no route %s", url);
    return send_error(c, &e, NULL);
}

static enum MHD_Result route(td_api *api, struct MHD_Connection *c, const char *url,
                             const char *method, request *rq) {
    bool get = is(method, "GET") || is(method, "HEAD");
    if (is(url, "/v1/health")) {
        if (!get) return wrong_method(c, method, url, "GET");
        return send_json_text(c, MHD_HTTP_OK, "{\"status\":\"ok\"}\n");
    }
    if (!token_ok(api, c))
        return fail(c, 401, "unauthorized", NULL,
                    "missing or wrong bearer token: send \"Authorization: Bearer TOKEN\" with "
                    "the token from STATE_DIR/token");
    if (is(url, "/v1/version")) {
        if (!get) return wrong_method(c, method, url, "GET");
        td_buf b = {0};
        td_buf_printf(&b, "{\"version\":\"%s\",\"api\":\"v1\"}\n", api->cfg.version);
        return send_buf(c, MHD_HTTP_OK, JSON_TYPE, &b);
    }
    if (is(url, "/v1/jobs") || is(url, "/v1/jobs/")) {
        if (is(method, "POST")) return submit(api, c, rq);
        if (get) return list(api, c);
        return wrong_method(c, method, url, "GET, POST");
    }
    if (strncmp(url, "/v1/jobs/", 9) == 0) return job_route(api, c, url, method, url + 9);
    td_reply_error e;
    td_reply_fail(&e, 404, "not_found", NULL, "no route %s %s (see api/README.md)", method, url);
    return send_error(c, &e, NULL);
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)version;
    td_api *api = cls;
    request *rq = *con_cls;
    if (!rq) { /* headers are in; the body, if any, comes in the next calls */
        rq = td_calloc(1, sizeof *rq);
        *con_cls = rq;
        const char *cl =
            MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > api->cfg.max_body) rq->too_large = true;
        return MHD_YES;
    }
    if (*upload_size) {
        if (!rq->too_large && rq->body.len + *upload_size <= api->cfg.max_body)
            td_buf_append(&rq->body, upload, *upload_size);
        else
            rq->too_large = true; /* read and dropped: the client still gets its 413 */
        *upload_size = 0;
        return MHD_YES;
    }
    if (rq->too_large && !is(method, "POST")) rq->too_large = false;
    return route(api, c, url, method, rq);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode code) {
    (void)cls, (void)c, (void)code;
    request *rq = *con_cls;
    if (!rq) return;
    td_buf_free(&rq->body);
    free(rq);
    *con_cls = NULL;
}

int td_api_listen(const char *host, int *port, int *fd, td_err *err) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)*port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1)
        return td_fail(err, "--listen: \"%s\" is not an IPv4 address (e.g. 127.0.0.1)", host);
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (s < 0) return td_fail(err, "socket: %s", strerror(errno));
    /* SO_REUSEADDR only lets a restarted daemon bind while old connections sit in TIME_WAIT;
     * on Linux it never lets two sockets listen on one address and port */
    int one = 1;
    if (setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) != 0 ||
        bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, 128) != 0) {
        int e = errno;
        close(s);
        return td_fail(err, "cannot listen on %s:%d: %s%s", host, *port, strerror(e),
                       e == EADDRINUSE ? " (another traind or program serves there: stop it, or "
                                         "give this one another --listen ADDR:PORT)"
                       : e == EADDRNOTAVAIL ? " (no interface of this host has that address)"
                       : e == EACCES        ? " (ports below 1024 need privileges)"
                                            : "");
    }
    socklen_t len = sizeof addr;
    if (getsockname(s, (struct sockaddr *)&addr, &len) != 0) {
        int e = errno;
        close(s);
        return td_fail(err, "getsockname: %s", strerror(e));
    }
    *port = ntohs(addr.sin_port);
    *fd = s;
    return 0;
}

int td_api_start(td_api **out, const td_api_config *cfg, td_jobs *jobs, td_err *err) {
    td_api *api = td_calloc(1, sizeof *api);
    api->cfg = *cfg;
    api->jobs = jobs;
    snprintf(api->token, sizeof api->token, "%s", cfg->token);
    struct sockaddr_in addr;
    socklen_t len = sizeof addr;
    api->port =
        getsockname(cfg->listen_fd, (struct sockaddr *)&addr, &len) == 0 ? ntohs(addr.sin_port) : 0;
    api->daemon = MHD_start_daemon(MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                                       MHD_USE_POLL | MHD_USE_ERROR_LOG,
                                   0, NULL, NULL, handle, api, MHD_OPTION_LISTEN_SOCKET,
                                   cfg->listen_fd, MHD_OPTION_NOTIFY_COMPLETED, completed, api,
                                   MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)120, MHD_OPTION_END);
    if (!api->daemon) {
        int port = api->port;
        free(api);
        return td_fail(err, "cannot start the HTTP server (libmicrohttpd) on port %d", port);
    }
    *out = api;
    return 0;
}

int td_api_port(const td_api *api) {
    return api->port;
}

void td_api_stop(td_api *api) {
    if (!api) return;
    MHD_stop_daemon(api->daemon);
    free(api);
}
