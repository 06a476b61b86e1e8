/* The experiments' routes (service/exp/td_experiments.h): POST and GET /v1/experiments,
 * GET and DELETE /v1/experiments/{id}, POST /v1/experiments/{id}/cancel, and its events as
 * Server-Sent Events (GET /v1/experiments/{id}/events: trial, best, state), which block their
 * connection's thread on the experiments' condition as a job's stream does (td_api_stream.c).
 * A daemon that runs no experiments (an agent: its master does) answers 404 with where to go. */
#include "api/td_api_private.h"

#include "service/exp/td_experiments.h"

#include <stdlib.h>
#include <string.h>

typedef struct stream {
    td_experiments *x;
    atomic_long *open; /* the API's count of open streams */
    long id, sent;     /* the last event id written */
    td_api_pending out;
    bool done;
} stream;

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
        td_reply_error e;
        if (td_experiments_events(s->x, s->id, s->sent, 256, sse_record, s, &e) != 0)
            return MHD_CONTENT_READER_END_OF_STREAM; /* it was deleted */
        if (s->out.buf.len) continue;
        long last;
        bool ended;
        if (td_experiments_wait(s->x, s->id, s->sent, 15.0, &last, &ended) != 0)
            return MHD_CONTENT_READER_END_OF_STREAM;
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

static enum MHD_Result events(const td_api_call *k, long id) {
    td_reply_error e;
    td_buf probe = {0};
    if (td_experiments_get(k->api->cfg.experiments, id, &probe, &e) != 0)
        return td_api_error(k->c, &e, NULL);
    td_buf_free(&probe);
    const char *last = MHD_lookup_connection_value(k->c, MHD_HEADER_KIND, "Last-Event-ID");
    if (!last) last = MHD_lookup_connection_value(k->c, MHD_GET_ARGUMENT_KIND, "last_event_id");
    long after = 0;
    if (last && !td_api_parse_last_event_id(last, &after))
        return td_api_fail(k->c, 400, "bad_request", "Last-Event-ID",
                           "Last-Event-ID: expected the decimal id of an event already received");
    enum MHD_Result answer;
    if (!td_api_take_stream(k, &answer)) return answer;
    stream *s = td_calloc(1, sizeof *s);
    s->x = k->api->cfg.experiments;
    s->id = id;
    s->sent = after;
    s->open = &k->api->stats.sse_clients;
    atomic_fetch_add(s->open, 1);
    struct MHD_Response *r =
        MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, read_events, s, free_stream);
    if (!r) free_stream(s);
    return td_api_respond(k->c, MHD_HTTP_OK, r, "text/event-stream", MHD_HTTP_HEADER_CACHE_CONTROL,
                          "no-cache", NULL);
}

static enum MHD_Result none_here(const td_api_call *k) {
    td_reply_error e;
    td_reply_fail(&e, 404, "not_found", NULL,
                  "this traind runs no experiments: it is an agent; ask its master%s%s",
                  k->api->master[0] ? " at " : "", k->api->master);
    return td_api_error(k->c, &e, NULL);
}

static enum MHD_Result create(const td_api_call *k) {
    td_reply_error e;
    if (k->rq->too_large) {
        td_reply_fail(&e, 413, "body_too_large", NULL,
                      "the request body is over the limit of %zu bytes",
                      atomic_load(&k->api->max_body));
        return td_api_error(k->c, &e, NULL);
    }
    td_buf out = {0};
    long id;
    td_tokens_limits limits = td_tokens_get_limits(k->api->cfg.tokens);
    if (td_experiments_create(k->api->cfg.experiments, k->rq->body.data ? k->rq->body.data : "",
                              k->rq->body.len, &k->rq->who, &limits, &out, &id, &e) != 0)
        return td_api_error(k->c, &e, NULL);
    char location[64];
    snprintf(location, sizeof location, "/v1/experiments/%ld", id);
    return td_api_respond(k->c, MHD_HTTP_CREATED, td_api_from_buf(&out), TD_API_JSON,
                          MHD_HTTP_HEADER_LOCATION, location, NULL);
}

enum MHD_Result td_api_experiments(const td_api_call *k) {
    if (!k->api->cfg.experiments) return none_here(k);
    if (strcmp(k->method, "POST") == 0) return create(k);
    td_buf out = {0};
    td_experiments_list(k->api->cfg.experiments, &out);
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}

enum MHD_Result td_api_experiment(const td_api_call *k) {
    if (!k->api->cfg.experiments) return none_here(k);
    td_experiments *x = k->api->cfg.experiments;
    const char *slash = strchr(k->tail, '/');
    size_t n = slash ? (size_t)(slash - k->tail) : strlen(k->tail);
    long id;
    if (!td_api_parse_id(k->tail, n, &id) || id == 0)
        return td_api_fail(k->c, 400, "bad_request", "id",
                           "an experiment id is a positive integer");
    const char *action = slash ? slash + 1 : "";
    bool post = strcmp(k->method, "POST") == 0;
    td_reply_error e;
    td_buf out = {0};
    int rc;
    bool get = strcmp(k->method, "GET") == 0 || strcmp(k->method, "HEAD") == 0;
    if (strcmp(action, "events") == 0 && get) {
        td_buf_free(&out);
        return events(k, id);
    }
    if (strcmp(action, "cancel") == 0 && post) {
        rc = td_experiments_cancel(x, id, &k->rq->who, &out, &e);
    } else if (action[0] || post) {
        td_buf_free(&out);
        bool unknown = action[0] && strcmp(action, "cancel") != 0 && strcmp(action, "events") != 0;
        td_reply_fail(&e, unknown ? 404 : 405, unknown ? "not_found" : "method_not_allowed", NULL,
                      "%s %s: an experiment has GET, DELETE, POST .../cancel and GET .../events",
                      k->method, k->url);
        const char *allow = strcmp(action, "cancel") == 0   ? "POST"
                            : strcmp(action, "events") == 0 ? "GET"
                                                            : "GET, DELETE";
        return td_api_error(k->c, &e, unknown ? NULL : allow);
    } else if (strcmp(k->method, "DELETE") == 0) {
        rc = td_experiments_delete(x, id, &k->rq->who, &e);
        if (rc == 0)
            return td_api_respond(k->c, MHD_HTTP_NO_CONTENT,
                                  MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT),
                                  NULL, NULL);
    } else {
        rc = td_experiments_get(x, id, &out, &e);
    }
    if (rc != 0) {
        td_buf_free(&out);
        return td_api_error(k->c, &e, NULL);
    }
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}
