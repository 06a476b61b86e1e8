/* A job's checkpoints over HTTP: the listing with every file of each one (as it is on disk now),
 * one file with Range, and a whole checkpoint streamed as a tar
 * (service/run/td_checkpoint_files.c). */
#include "api/td_api_private.h"

#include "io/td_checkpoint.h"
#include "service/run/td_checkpoint_files.h"
#include "service/run/td_jobfs.h"

#include <fcntl.h>

#include <jansson.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

bool td_api_parse_range(const char *h, uint64_t n, uint64_t *from, uint64_t *to) {
    if (strncmp(h, "bytes=", 6) != 0 || strchr(h, ',')) return false;
    const char *p = h + 6, *dash = strchr(p, '-');
    if (!dash) return false;
    long a = -1, b = -1;
    if (dash > p && !td_api_parse_id(p, (size_t)(dash - p), &a)) return false;
    if (dash[1] && !td_api_parse_id(dash + 1, strlen(dash + 1), &b)) return false;
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

/* The listing's pages: checkpoints in step order, `limit` of them from `offset` (a Link header
 * names the next page), each with at most MAX_LISTED of its files (its archive and its files'
 * own URLs serve all of them); once the page has walked PAGE_FILES files, its later
 * checkpoints are listed without their files (file_count null, files_truncated): a
 * job that registered many checkpoints of many files makes neither a reply of hundreds of
 * megabytes nor a request that walks them all. */
enum { PAGE_DEFAULT = 100, PAGE_MAX = 1000, MAX_LISTED = 1000, PAGE_FILES = 2000 };

typedef struct checkpoint_ctx {
    long job;
    json_t *list;
    td_job_files files; /* whose they are, and how to reach them (td_jobfs.h) */
    long offset, limit, seen;
    int files_left; /* of the page's PAGE_FILES: the rest of its checkpoints list none */
} checkpoint_ctx;

/* One checkpoint as the API shows it: its files as they are on disk now (checkpoint.keep may
 * have removed it since), each with its download URL, and the URL of the whole as a tar. */
static void checkpoint_json(void *cls, const td_db_checkpoint *c) {
    checkpoint_ctx *ctx = cls;
    long at = ctx->seen++;
    if (at < ctx->offset || at >= ctx->offset + ctx->limit) return; /* another page's */
    td_checkpoint_file *files = NULL;
    int n = 0, listed = 0;
    td_err err = {{0}};
    bool on_disk, walked = ctx->files_left > 0;
    if (walked) {
        on_disk = td_checkpoint_list(&ctx->files, c->path, &files, &n, &err) == 0;
        listed = n < MAX_LISTED ? n : MAX_LISTED;
        if (listed > ctx->files_left) listed = ctx->files_left;
        ctx->files_left -= n; /* what the walk cost */
    } else {                  /* past the page's budget: whether it is there, not what it holds */
        int fd = td_jobfs_open_path(&ctx->files.who, ctx->files.dir, c->path, O_RDONLY, &err);
        on_disk = fd >= 0;
        if (fd >= 0) close(fd);
    }
    json_t *list = json_array(), *model = json_null();
    for (int i = 0; i < listed; i++) {
        json_array_append_new(list, json_pack("{s:s, s:I, s:o}", "name", files[i].name, "size",
                                              (json_int_t)files[i].size, "url",
                                              url_json(ctx->job, c->step, files[i].name)));
        if (strcmp(files[i].name, TD_CHECKPOINT_MODEL) == 0) {
            json_decref(model);
            model = url_json(ctx->job, c->step, files[i].name);
        }
    }
    td_checkpoint_files_free(files, n);
    char when[64], archive[96];
    time_t t = (time_t)c->created_at;
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    snprintf(archive, sizeof archive, "/v1/jobs/%ld/checkpoints/%ld.tar", ctx->job, c->step);
    json_t *o = json_pack("{s:I, s:I, s:s, s:b, s:o, s:o, s:s, s:i, s:b}", "step",
                          (json_int_t)c->step, "size", (json_int_t)c->size, "created_at", when,
                          "on_disk", on_disk, "files", list, "url", model, "archive_url", archive,
                          "file_count", n, "files_truncated", !walked || n > listed);
    if (o && !walked) json_object_set_new(o, "file_count", json_null());
    if (o) json_array_append_new(ctx->list, o);
}

/* GET .../checkpoints (step < 0: a page of them) or .../checkpoints/{step}. */
static enum MHD_Result listing(td_api *api, struct MHD_Connection *c, long id, long step) {
    td_reply_error e;
    checkpoint_ctx ctx = {
        .job = id, .list = json_array(), .limit = PAGE_DEFAULT, .files_left = PAGE_FILES};
    bool bad = false;
    td_api_query_long(c, "limit", 1, PAGE_MAX, &ctx.limit, &bad);
    td_api_query_long(c, "offset", 0, LONG_MAX / 4, &ctx.offset, &bad);
    if (bad) {
        json_decref(ctx.list);
        return td_api_fail(c, 400, "bad_request", NULL,
                           "limit: expected 1 to 1000; offset: expected a non-negative integer");
    }
    if (step >= 0) ctx.offset = 0, ctx.limit = 1, ctx.files_left = MAX_LISTED;
    if (td_jobs_files_of(api->jobs, id, &ctx.files, &e) != 0 ||
        td_jobs_checkpoints(api->jobs, id, step, checkpoint_json, &ctx, &e) != 0) {
        json_decref(ctx.list);
        return td_api_error(c, &e, NULL);
    }
    if (step >= 0 && json_array_size(ctx.list) == 0) {
        json_decref(ctx.list);
        td_reply_fail(&e, 404, "not_found", NULL, "job %ld has no checkpoint at step %ld", id,
                      step);
        return td_api_error(c, &e, NULL);
    }
    json_t *body = step >= 0 ? json_incref(json_array_get(ctx.list, 0)) : json_incref(ctx.list);
    json_decref(ctx.list);
    char *text = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!text) return MHD_NO;
    td_buf b = {0};
    td_buf_puts(&b, text);
    free(text);
    char link[160] = "", total[32];
    if (step < 0 && ctx.seen > ctx.offset + ctx.limit)
        snprintf(link, sizeof link, "</v1/jobs/%ld/checkpoints?offset=%ld&limit=%ld>; rel=\"next\"",
                 id, ctx.offset + ctx.limit, ctx.limit);
    snprintf(total, sizeof total, "%ld", ctx.seen);
    size_t len = b.len;
    char *data = td_buf_take(&b);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) free(data);
    return td_api_respond(c, MHD_HTTP_OK, r, TD_API_JSON, "X-Total-Count", total,
                          link[0] ? "Link" : NULL, link, NULL);
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
    return td_api_respond(c, 416, r, TD_API_JSON, MHD_HTTP_HEADER_CONTENT_RANGE, cr, NULL);
}

/* GET .../checkpoints/{step}/{name}: one file of a checkpoint, with Range, and If-Range against
 * its Last-Modified: a client resuming a download of a file that has since been written again
 * (a restarted job saving the same step) gets the whole new file instead of a splice. */
static enum MHD_Result send_checkpoint_file(td_api *api, struct MHD_Connection *c, long id,
                                            long step, const char *name) {
    char path[PATH_MAX];
    td_reply_error e;
    td_job_files files;
    if (td_jobs_checkpoint_path(api->jobs, id, step, path, sizeof path, &e) != 0 ||
        td_jobs_files_of(api->jobs, id, &files, &e) != 0)
        return td_api_error(c, &e, NULL);
    int fd;
    long long size;
    td_err err = {{0}};
    if (td_checkpoint_open(&files, path, name, &fd, &size, &err) != 0) {
        td_reply_fail(&e, 404, "not_found", NULL,
                      "checkpoint of step %ld: %s (the list at /v1/jobs/%ld/checkpoints/%ld names "
                      "its files; checkpoint.keep removes older checkpoints)",
                      step, err.msg, id, step);
        return td_api_error(c, &e, NULL);
    }
    uint64_t n = (uint64_t)size, from = 0, to = n ? n - 1 : 0;
    const char *range = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_RANGE);
    char modified[64] = "";
    struct stat st;
    struct tm tm;
    if (fstat(fd, &st) == 0 && gmtime_r(&st.st_mtime, &tm))
        strftime(modified, sizeof modified, "%a, %d %b %Y %H:%M:%S GMT", &tm);
    const char *if_range =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_IF_RANGE);
    if (range && if_range && strcmp(if_range, modified) != 0) range = NULL; /* changed: whole */
    int status = MHD_HTTP_OK;
    if (range) {
        if (!td_api_parse_range(range, n, &from, &to)) {
            close(fd);
            return range_not_satisfiable(c, range, n);
        }
        status = MHD_HTTP_PARTIAL_CONTENT;
    }
    struct MHD_Response *r =
        MHD_create_response_from_fd_at_offset64(n ? to - from + 1 : 0, fd, from);
    if (!r) close(fd);
    char cr[96];
    snprintf(cr, sizeof cr, "bytes %llu-%llu/%llu", (unsigned long long)from,
             (unsigned long long)to, (unsigned long long)n);
    /* Content-Range only with a range: a NULL name ends the header list early */
    return td_api_respond(
        c, (unsigned)status, r, "application/octet-stream", MHD_HTTP_HEADER_ACCEPT_RANGES, "bytes",
        MHD_HTTP_HEADER_LAST_MODIFIED, modified,
        status == MHD_HTTP_PARTIAL_CONTENT ? MHD_HTTP_HEADER_CONTENT_RANGE : NULL, cr, NULL);
}

typedef struct tar_stream {
    td_checkpoint_tar *tar;
    td_api_pending out;
    bool done;
    td_log *log;
    long job;
} tar_stream;

static ssize_t read_tar(void *cls, uint64_t pos, char *buf, size_t max) {
    (void)pos;
    tar_stream *s = cls;
    for (;;) {
        size_t n = td_api_pending_take(&s->out, buf, max);
        if (n) return (ssize_t)n;
        if (s->done) return MHD_CONTENT_READER_END_OF_STREAM;
        td_err err = {{0}};
        /* a file that went away mid-download: cut the response, never a short archive that
         * looks complete (the chunked encoding then lacks its end) */
        if (td_checkpoint_tar_next(s->tar, &s->out.buf, &s->done, &err) != 0) {
            td_log_at(s->log, TD_LOG_WARNING, TD_LOG_JOB(s->job), "job %ld: checkpoint archive: %s",
                      s->job, err.msg);
            return MHD_CONTENT_READER_END_WITH_ERROR;
        }
    }
}

static void free_tar(void *cls) {
    tar_stream *s = cls;
    td_checkpoint_tar_close(s->tar);
    td_buf_free(&s->out.buf);
    free(s);
}

/* GET .../checkpoints/{step}.tar: the whole checkpoint as one tar, its files under the
 * checkpoint directory's name (step-00000400/model.safetensors, ...). */
/* path (a directory or a file) streamed as a tar whose members are under top; what names it in
 * a 404 when it went away. */
static enum MHD_Result send_tar(td_api *api, struct MHD_Connection *c, long id,
                                const td_job_files *files, const char *path, const char *top,
                                const char *what, const char *filename) {
    tar_stream *s = td_calloc(1, sizeof *s);
    s->log = api->cfg.log;
    s->job = id;
    td_err err = {{0}};
    if (td_checkpoint_tar_open(&s->tar, files, path, top, &err) != 0) {
        free(s);
        td_reply_error e;
        td_reply_fail(&e, 404, "not_found", NULL, "%s is no longer on disk (%s)", what, err.msg);
        return td_api_error(c, &e, NULL);
    }
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 65536, read_tar, s, free_tar);
    if (!r) free_tar(s);
    char disposition[160];
    snprintf(disposition, sizeof disposition, "attachment; filename=\"%s\"", filename);
    return td_api_respond(c, MHD_HTTP_OK, r, "application/x-tar",
                          MHD_HTTP_HEADER_CONTENT_DISPOSITION, disposition, NULL);
}

static enum MHD_Result checkpoint_tar(td_api *api, struct MHD_Connection *c, long id, long step) {
    char path[PATH_MAX];
    td_reply_error e;
    td_job_files files;
    if (td_jobs_checkpoint_path(api->jobs, id, step, path, sizeof path, &e) != 0 ||
        td_jobs_files_of(api->jobs, id, &files, &e) != 0)
        return td_api_error(c, &e, NULL);
    char top[PATH_MAX + 2] = "";
    const char *base = strrchr(path, '/');
    td_err err = {{0}};
    int fd = td_jobfs_open_path(&files.who, files.dir, path, O_RDONLY, &err);
    struct stat st;
    if (fd >= 0 && fstat(fd, &st) == 0 && S_ISDIR(st.st_mode))
        snprintf(top, sizeof top, "%s/", base && base[1] ? base + 1 : "checkpoint");
    if (fd >= 0) close(fd);
    char what[64], filename[96];
    snprintf(what, sizeof what, "the checkpoint of step %ld", step);
    snprintf(filename, sizeof filename, "traind-job-%ld-step-%ld.tar", id, step);
    return send_tar(api, c, id, &files, path, top, what, filename);
}

/* GET /v1/jobs/{id}/tensorboard: the job's event files as a tar of one directory,
 * job-ID-tensorboard/, for `tar xf` and `tensorboard --logdir`. Of a running job it is a
 * snapshot: each file as long as it was when the archive reached it. */
enum MHD_Result td_api_tensorboard(td_api *api, struct MHD_Connection *c, long id) {
    char path[PATH_MAX], top[64], filename[96];
    td_reply_error e;
    if (td_jobs_tensorboard_dir(api->jobs, id, path, sizeof path, &e) != 0)
        return td_api_error(c, &e, NULL);
    snprintf(top, sizeof top, "job-%ld-tensorboard/", id);
    snprintf(filename, sizeof filename, "traind-job-%ld-tensorboard.tar", id);
    /* the daemon's own files, below the job's directory (which the job cannot change) */
    td_job_files files = {.owner = TD_JOBFS_ANY_OWNER, .max_files = 100000};
    snprintf(files.dir, sizeof files.dir, "%.*s", (int)(strlen(path) - strlen("/tensorboard")),
             path);
    return send_tar(api, c, id, &files, path, top, "its TensorBoard directory", filename);
}

enum MHD_Result td_api_checkpoints(td_api *api, struct MHD_Connection *c, long id) {
    return listing(api, c, id, -1);
}

td_api_checkpoint_route td_api_parse_checkpoint_tail(const char *tail, long *step,
                                                     const char **name) {
    size_t digits = strspn(tail, "0123456789");
    *name = NULL;
    if (!td_api_parse_id(tail, digits, step)) return TD_API_CKPT_BAD_STEP;
    const char *rest = tail + digits;
    if (!*rest) return TD_API_CKPT_LISTING;
    if (strcmp(rest, ".tar") == 0) return TD_API_CKPT_TAR;
    if (rest[0] == '/' && rest[1]) {
        *name = rest + 1;
        return TD_API_CKPT_FILE;
    }
    return TD_API_CKPT_NO_ROUTE;
}

/* .../checkpoints/{step}[.tar|/{name}] */
enum MHD_Result td_api_checkpoint(td_api *api, struct MHD_Connection *c, long id,
                                  const char *tail) {
    long step;
    const char *name;
    switch (td_api_parse_checkpoint_tail(tail, &step, &name)) {
    case TD_API_CKPT_BAD_STEP:
        return td_api_fail(
            c, 400, "bad_request", "step",
            "a checkpoint is named by its step: /checkpoints/STEP, /checkpoints/STEP.tar "
            "or /checkpoints/STEP/FILE");
    case TD_API_CKPT_LISTING:
        return listing(api, c, id, step);
    case TD_API_CKPT_TAR:
        return checkpoint_tar(api, c, id, step);
    case TD_API_CKPT_FILE:
        return send_checkpoint_file(api, c, id, step, name);
    case TD_API_CKPT_NO_ROUTE:
        break;
    }
    return td_api_fail(c, 404, "not_found", NULL,
                       "no such checkpoint route: expected /checkpoints/STEP, STEP.tar or "
                       "STEP/FILE");
}
