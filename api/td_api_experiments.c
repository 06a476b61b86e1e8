/* The experiments' routes (service/exp/td_experiments.h): POST and GET /v1/experiments,
 * GET and DELETE /v1/experiments/{id}, POST /v1/experiments/{id}/cancel|pause|resume, and its
 * events as Server-Sent Events (GET /v1/experiments/{id}/events: trial, promoted, stopped,
 * paused, resumed, best, state), the same stream as a job's (td_api_sse).
 * A daemon that runs no experiments (an agent: its master does) answers 404 with where to go. */
#include "api/td_api_private.h"

#include "service/exp/td_experiments.h"

#include <stdlib.h>
#include <string.h>

/* An experiment's events, as a source for td_api_sse (td_experiments_events, _wait). */
static int exp_events(void *ctx, long id, long after, int limit, td_db_event_fn fn, void *fctx) {
    td_reply_error e;
    return td_experiments_events(ctx, id, after, limit, fn, fctx, &e);
}

static int exp_wait(void *ctx, long id, long after, double timeout_s, long *last, bool *ended) {
    return td_experiments_wait(ctx, id, after, timeout_s, last, ended);
}

static enum MHD_Result events(const td_api_call *k, long id) {
    td_reply_error e; /* (limit 0: whether it exists, nothing read) */
    if (td_experiments_events(k->api->cfg.experiments, id, 0, 0, NULL, NULL, &e) != 0)
        return td_api_error(k->c, &e, NULL);
    enum MHD_Result answer;
    if (!td_api_take_stream(k, &answer)) return answer;
    td_api_event_source source = {exp_events, exp_wait, k->api->cfg.experiments};
    return td_api_sse(k->api, k->c, id, &source);
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
    bool change = strcmp(action, "cancel") == 0 || strcmp(action, "pause") == 0 ||
                  strcmp(action, "resume") == 0;
    if (change && post) {
        rc = action[0] == 'c'
                 ? td_experiments_cancel(x, id, &k->rq->who, &out, &e)
                 : td_experiments_pause(x, id, action[0] == 'p', &k->rq->who, &out, &e);
    } else if (action[0] || post) {
        td_buf_free(&out);
        bool unknown = action[0] && !change && strcmp(action, "events") != 0;
        td_reply_fail(&e, unknown ? 404 : 405, unknown ? "not_found" : "method_not_allowed", NULL,
                      "%s %s: an experiment has GET, DELETE, POST .../cancel, .../pause and "
                      ".../resume, and GET .../events",
                      k->method, k->url);
        const char *allow = change ? "POST" : strcmp(action, "events") == 0 ? "GET" : "GET, DELETE";
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
