/* The responses that stay open while a job runs: its Server-Sent Events and a followed log, and
 * an experiment's events through the same stream (td_api_event_source). Each blocks its own
 * connection thread on its source's condition variable (one thread per connection), never
 * polling faster than the source changes. */
#include "api/td_api_private.h"

#include "base/td_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

size_t td_api_pending_take(td_api_pending *p, char *buf, size_t max) {
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

bool td_api_parse_last_event_id(const char *h, long *after) {
    return td_api_parse_id(h, strlen(h), after);
}

/* A stream that has just sent waits this long before it looks again, so that the events of a
 * busy job go out in batches: a job printing 50 metrics a second costs each follower 10
 * wake-ups and sends a second instead of 50 (with a thousand followers, the difference between
 * the daemon's CPU going to streams and going to requests). A dashboard redraws no faster. */
#define STREAM_BATCH_S 0.1

typedef struct stream {
    td_api_event_source source;
    atomic_long *open; /* the API's count of open streams */
    long id, sent;     /* the last event id written */
    double sent_at;    /* when events were last written (monotonic); 0: not yet */
    td_api_pending out;
    bool done;
} stream;

/* One stored event as an SSE record; its data is one line (the daemon stores compact JSON). */
static void sse_record(void *ctx, long seq, const char *type, const char *data) {
    stream *s = ctx;
    td_buf_printf(&s->out.buf, "id: %ld\nevent: %s\ndata: %s\n\n", seq, type, data);
    s->sent = seq;
}

static ssize_t read_events(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    stream *s = cls;
    for (;;) {
        size_t n = td_api_pending_take(&s->out, buf, max);
        if (n) return (ssize_t)n;
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        if (s->source.events(s->source.ctx, s->id, s->sent, 256, sse_record, s) != 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (s->out.buf.len) {
            s->sent_at = td_clock_now();
            continue;
        }
        double since = td_clock_now() - s->sent_at;
        if (s->sent_at > 0 && since < STREAM_BATCH_S) { /* not a wait for anything: a pace */
            struct timespec pause = {0, (long)((STREAM_BATCH_S - since) * 1e9)};
            nanosleep(&pause, NULL);
            s->sent_at = 0; /* then wait for events as usual */
            continue;
        }
        long last;
        bool ended;
        if (s->source.wait(s->source.ctx, s->id, s->sent, 15.0, &last, &ended) != 0)
            return MHD_CONTENT_READER_END_WITH_ERROR;
        if (ended && last <= s->sent)
            s->done = true;
        else if (last <= s->sent) /* quiet for 15 s: a comment keeps proxies from timing out */
            td_buf_puts(&s->out.buf, ": keep-alive\n\n");
    }
}

static void free_stream(void *cls) {
    stream *s = cls;
    if (s->open) atomic_fetch_sub(s->open, 1);
    td_buf_free(&s->out.buf);
    free(s);
}

enum MHD_Result td_api_sse(td_api *api, struct MHD_Connection *c, long id,
                           const td_api_event_source *source) {
    const char *last = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Last-Event-ID");
    if (!last) last = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "last_event_id");
    long after = 0;
    if (last && !td_api_parse_last_event_id(last, &after))
        return td_api_fail(c, 400, "bad_request", "Last-Event-ID",
                           "Last-Event-ID: expected the decimal id of an event already received");
    stream *s = td_calloc(1, sizeof *s);
    s->source = *source;
    s->id = id;
    s->sent = after;
    s->open = &api->stats.sse_clients;
    atomic_fetch_add(s->open, 1);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, read_events, s, free_stream);
    if (!r) free_stream(s);
    return td_api_respond(c, MHD_HTTP_OK, r, "text/event-stream", MHD_HTTP_HEADER_CACHE_CONTROL,
                          "no-cache", NULL);
}

/* A job's events, as a source (its stored events, td_jobs.h). */
static int job_events(void *ctx, long id, long after, int limit, td_db_event_fn fn, void *fctx) {
    td_reply_error e;
    return td_jobs_events(ctx, id, after, limit, fn, fctx, &e);
}

static int job_wait(void *ctx, long id, long after, double timeout_s, long *last, bool *ended) {
    return td_jobs_wait(ctx, id, after, timeout_s, last, ended);
}

enum MHD_Result td_api_events(td_api *api, struct MHD_Connection *c, long id) {
    td_reply_error e;
    if (td_jobs_exists(api->jobs, id, &e) != 0) return td_api_error(c, &e, NULL);
    td_api_event_source source = {job_events, job_wait, api->jobs};
    return td_api_sse(api, c, id, &source);
}

/* ---- logs ------------------------------------------------------------------------------------ */

typedef struct follower {
    td_jobs *jobs;
    long id;
    int fd;
    char path[PATH_MAX]; /* the log's name: a new file there once it rotated (max_log_bytes) */
    uint64_t base;       /* the stream's position where fd's file begins */
    bool ended_seen;     /* the job had ended at the last empty read: one more read, then stop */
} follower;

/* Whether the log was rotated (its name is another file now, and fd's is read to its end):
 * the follower goes on with the new one. The log is the daemon's, in a directory the job
 * cannot change (td_job_uid.c), so the name is not the job's to plant. */
static bool rotated(follower *f, uint64_t pos) {
    struct stat now, old;
    if (stat(f->path, &now) != 0 || fstat(f->fd, &old) != 0) return false;
    if (now.st_ino == old.st_ino && now.st_dev == old.st_dev) return false;
    int fd = open(f->path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
    if (fd < 0) return false;
    close(f->fd);
    f->fd = fd;
    f->base = pos;
    return true;
}

static ssize_t read_log(void *cls, uint64_t pos, char *buf, size_t max) {
    follower *f = cls;
    for (;;) {
        ssize_t n = pread(f->fd, buf, max, (off_t)(pos - f->base));
        if (n > 0) return n;
        if (n < 0 && errno != EINTR) return MHD_CONTENT_READER_END_WITH_ERROR;
        if (n == 0 && rotated(f, pos)) continue;
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

enum MHD_Result td_api_logs(td_api *api, struct MHD_Connection *c, long id) {
    long rank = 0, follow = 0;
    bool bad = false;
    td_api_query_long(c, "rank", 0, 1 << 20, &rank, &bad);
    td_api_query_long(c, "follow", 0, 1, &follow, &bad);
    if (bad)
        return td_api_fail(c, 400, "bad_request", NULL,
                           "rank: expected a rank number; follow: expected 0 or 1");
    char path[PATH_MAX];
    td_reply_error e;
    if (td_jobs_log_path(api->jobs, id, (int)rank, path, sizeof path, &e) != 0)
        return td_api_error(c, &e, NULL);
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_CREAT, 0640); /* not started yet: empty */
    if (fd < 0) return td_api_fail(c, 500, "internal", NULL, "cannot open the log file");
    struct MHD_Response *r;
    if (follow) {
        follower *f = td_calloc(1, sizeof *f);
        *f = (follower){.jobs = api->jobs, .id = id, .fd = fd};
        snprintf(f->path, sizeof f->path, "%s", path);
        r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, read_log, f, free_follower);
        if (!r) free_follower(f);
    } else {
        struct stat st;
        if (fstat(fd, &st) != 0) {
            close(fd);
            return td_api_fail(c, 500, "internal", NULL, "cannot read the log file");
        }
        r = MHD_create_response_from_fd64((uint64_t)st.st_size, fd);
        if (!r) close(fd);
    }
    return td_api_respond(c, MHD_HTTP_OK, r, "text/plain; charset=utf-8", NULL);
}
