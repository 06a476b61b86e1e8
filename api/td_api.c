/* The HTTP API's routes: the user's and the jobs' handlers, the route table that sends each
 * request to its handler, and the admission of a request on its headers (bearer-token checks,
 * body limits, rates). td_api_private.h lists the other files. */
#include "api/td_api_private.h"

#include "base/td_clock.h"
#include "base/td_parse.h"

#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* The bearer token's owner (td_tokens compares digests in constant time). */
static bool bearer(const td_api *api, struct MHD_Connection *c, td_principal *who) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7) != 0) return false;
    return td_tokens_check(api->cfg.tokens, h + 7, who);
}

/* ---- the handlers ---------------------------------------------------------------------------- */

static bool is(const char *a, const char *b) {
    return strcmp(a, b) == 0;
}

static enum MHD_Result health(const td_api_call *k) {
    td_buf b = {0};
    td_buf_puts(&b, "{\"status\":\"ok\"}\n");
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &b);
}

/* GET /metrics: Prometheus's view (td_api_metrics.c); token-protected like every route */
static enum MHD_Result prometheus(const td_api_call *k) {
    return td_api_metrics(k->api, k->c);
}

static enum MHD_Result version(const td_api_call *k) {
    td_buf b = {0};
    td_buf_printf(&b, "{\"version\":\"%s\",\"api\":\"v1\"}\n", k->api->cfg.version);
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &b);
}

/* api/openapi.json, compiled in (api/embed.cmake) */
extern const char td_api_openapi[];
extern const size_t td_api_openapi_len;

static enum MHD_Result openapi(const td_api_call *k) {
    td_buf b = {0};
    td_buf_append(&b, td_api_openapi, td_api_openapi_len);
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &b);
}

static enum MHD_Result session(const td_api_call *k) {
    td_principal who = {0};
    bool has_bearer = bearer(k->api, k->c, &who);
    return td_api_session_route(k->api, k->c, k->method, k->rq->body.data, k->rq->body.len,
                                has_bearer, &k->rq->who);
}

/* GET /v1/whoami: the request's token, so clients and the dashboard know what they may do. */
static enum MHD_Result whoami(const td_api_call *k) {
    td_buf b = {0};
    json_t *o = json_pack("{s:I, s:s, s:s}", "token", (json_int_t)k->rq->who.id, "name",
                          k->rq->who.name, "scope", td_scope_name(k->rq->who.scope));
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    if (!text) return td_api_fail(k->c, 500, "internal", NULL, "out of memory");
    td_buf_puts(&b, text);
    td_buf_puts(&b, "\n");
    free(text);
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &b);
}

/* GET and POST /v1/tokens, DELETE /v1/tokens/{id}: admins only (the route table says so). */
static enum MHD_Result tokens(const td_api_call *k) {
    td_buf out = {0};
    if (is(k->method, "POST")) {
        td_reply_error e;
        if (k->rq->too_large)
            return td_api_fail(k->c, 413, "body_too_large", NULL, "the request body is too large");
        if (td_tokens_create(k->api->cfg.tokens, k->rq->body.data ? k->rq->body.data : "",
                             k->rq->body.len, &k->rq->who, &out, &e) != 0)
            return td_api_error(k->c, &e, NULL);
        /* the secret is in this reply only: no cache may keep it */
        return td_api_respond(k->c, MHD_HTTP_CREATED, td_api_from_buf(&out), TD_API_JSON,
                              "Cache-Control", "no-store", NULL);
    }
    td_tokens_list(k->api->cfg.tokens, &out);
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}

static enum MHD_Result token_revoke(const td_api_call *k) {
    long id;
    if (!td_api_parse_id(k->tail, strlen(k->tail), &id) || id == 0)
        return td_api_fail(k->c, 400, "bad_request", "id", "a token id is a positive integer");
    td_reply_error e;
    if (td_tokens_revoke(k->api->cfg.tokens, id, &k->rq->who, &e) != 0)
        return td_api_error(k->c, &e, NULL);
    return td_api_respond(k->c, MHD_HTTP_NO_CONTENT,
                          MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT), NULL,
                          NULL);
}

static enum MHD_Result submit(const td_api_call *k) {
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
    if (td_jobs_submit(k->api->jobs, k->rq->body.data ? k->rq->body.data : "", k->rq->body.len,
                       &k->rq->who, &limits, &out, &id, &e) != 0)
        return td_api_error(k->c, &e, NULL);
    k->rq->job = id;
    char location[64];
    snprintf(location, sizeof location, "/v1/jobs/%ld", id);
    return td_api_respond(k->c, MHD_HTTP_CREATED, td_api_from_buf(&out), TD_API_JSON,
                          MHD_HTTP_HEADER_LOCATION, location, NULL);
}

static enum MHD_Result jobs_list(td_api *api, struct MHD_Connection *c) {
    long limit = 50, offset = 0;
    bool bad = false;
    td_api_query_long(c, "limit", 1, 500, &limit, &bad);
    td_api_query_long(c, "offset", 0, LONG_MAX / 2, &offset, &bad);
    if (bad)
        return td_api_fail(c, 400, "bad_request", NULL,
                           "limit: expected 1 to 500; offset: expected a non-negative integer");
    unsigned states = 0;
    const char *st = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "state");
    if (st) {
        char copy[256], *save = NULL;
        snprintf(copy, sizeof copy, "%s", st);
        for (char *t = strtok_r(copy, ",", &save); t; t = strtok_r(NULL, ",", &save)) {
            unsigned bit = td_jobs_state_bit(t);
            if (!bit) {
                char names[128];
                td_jobs_state_list(names, sizeof names);
                td_reply_error e;
                td_reply_fail(&e, 400, "bad_request", "state", "state \"%s\": expected one of %s",
                              t, names);
                return td_api_error(c, &e, NULL);
            }
            states |= bit;
        }
    }
    td_buf out = {0};
    td_jobs_list(api->jobs, states, (int)limit, (int)offset, &out);
    return td_api_reply_buf(c, MHD_HTTP_OK, &out);
}

static enum MHD_Result jobs(const td_api_call *k) {
    return is(k->method, "POST") ? submit(k) : jobs_list(k->api, k->c);
}

static enum MHD_Result job(const td_api_call *k) {
    td_reply_error e;
    td_buf out = {0};
    if (is(k->method, "DELETE")) {
        if (td_jobs_delete(k->api->jobs, k->id, &k->rq->who, &e) != 0)
            return td_api_error(k->c, &e, NULL);
        return td_api_respond(k->c, MHD_HTTP_NO_CONTENT,
                              MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT),
                              NULL, NULL);
    }
    if (td_jobs_get(k->api->jobs, k->id, &out, &e) != 0) return td_api_error(k->c, &e, NULL);
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}

static enum MHD_Result cancel(const td_api_call *k) {
    td_reply_error e;
    td_buf out = {0};
    if (td_jobs_cancel(k->api->jobs, k->id, &k->rq->who, &out, &e) != 0)
        return td_api_error(k->c, &e, NULL);
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}

static enum MHD_Result metrics(const td_api_call *k) {
    long since = -1;
    bool bad = false;
    td_api_query_long(k->c, "since", -1, LONG_MAX / 2, &since, &bad);
    if (bad) return td_api_fail(k->c, 400, "bad_request", "since", "since: expected a step number");
    td_reply_error e;
    td_buf out = {0};
    if (td_jobs_metrics(k->api->jobs, k->id, since, &out, &e) != 0) {
        td_buf_free(&out);
        return td_api_error(k->c, &e, NULL);
    }
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}

/* One of the token's streams (events, a followed log) for as long as the request lasts; false
 * with a 429 answered when it holds its limit of them. */
bool td_api_take_stream(const td_api_call *k, enum MHD_Result *answer) {
    if (!k->rq->who.id || td_tokens_stream_begin(k->api->cfg.tokens, k->rq->who.id)) {
        k->rq->stream = k->rq->who.id != 0; /* given back when the request completes */
        return true;
    }
    td_reply_error e;
    td_reply_fail(&e, 429, "too_many_streams", NULL,
                  "token \"%s\" already follows %d event streams and logs, its limit "
                  "(max_streams_per_token): close one first",
                  k->rq->who.name, td_tokens_get_limits(k->api->cfg.tokens).streams);
    e.retry_after_s = 5;
    *answer = td_api_error(k->c, &e, NULL);
    return false;
}

static enum MHD_Result events(const td_api_call *k) {
    enum MHD_Result answer;
    if (!td_api_take_stream(k, &answer)) return answer;
    return td_api_events(k->api, k->c, k->id);
}

static enum MHD_Result logs(const td_api_call *k) {
    const char *follow = MHD_lookup_connection_value(k->c, MHD_GET_ARGUMENT_KIND, "follow");
    enum MHD_Result answer;
    if (follow && strcmp(follow, "1") == 0 && !td_api_take_stream(k, &answer)) return answer;
    return td_api_logs(k->api, k->c, k->id);
}

static enum MHD_Result checkpoints(const td_api_call *k) {
    return td_api_checkpoints(k->api, k->c, k->id);
}

static enum MHD_Result checkpoint(const td_api_call *k) {
    return td_api_checkpoint(k->api, k->c, k->id, k->tail);
}

static enum MHD_Result spec(const td_api_call *k) {
    td_reply_error e;
    td_buf out = {0};
    if (td_jobs_spec(k->api->jobs, k->id, &k->rq->who, &out, &e) != 0) {
        td_buf_free(&out);
        return td_api_error(k->c, &e, NULL);
    }
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}

static enum MHD_Result tensorboard(const td_api_call *k) {
    return td_api_tensorboard(k->api, k->c, k->id);
}

/* ---- the route table ----------------------------------------------------------------------- */

typedef struct route {
    const char *path;    /* the whole URL, or (job routes) what follows /v1/jobs/{id} */
    const char *methods; /* for the Allow header of a 405; HEAD goes wherever GET does */
    const char *label;   /* what GET /metrics counts its requests under, whatever their ids */
    enum MHD_Result (*handler)(const td_api_call *k);
    bool prefix; /* path is a prefix; the rest is td_api_call.tail */
    bool open;   /* no user token needed (health; the cluster's routes check their own secret) */
    /* the scope a token needs to read (GET, HEAD) and to change (any other method); a job's
     * owner is checked by the job's own functions */
    td_scope read, write;
} route;

#define R TD_SCOPE_READ
#define S TD_SCOPE_SUBMIT
#define A TD_SCOPE_ADMIN
static const route ROUTES[] = {
    {"/v1/health", "GET", "/v1/health", health, false, true, R, R},
    {"/v1/version", "GET", "/v1/version", version, false, false, R, R},
    {"/v1/openapi.json", "GET", "/v1/openapi.json", openapi, false, true, R, R},
    {"/v1/session", "GET, POST, DELETE", "/v1/session", session, false, true, R, R},
    {"/v1/whoami", "GET", "/v1/whoami", whoami, false, false, R, R},
    {"/v1/jobs", "GET, POST", "/v1/jobs", jobs, false, false, R, S},
    {"/v1/jobs/", "GET, POST", "/v1/jobs/", jobs, false, false, R, S},
    {"/v1/experiments", "GET, POST", "/v1/experiments", td_api_experiments, false, false, R, S},
    {"/v1/experiments/", "GET, POST, DELETE", "/v1/experiments/{id}", td_api_experiment, true,
     false, R, S},
    {"/v1/nodes", "GET", "/v1/nodes", td_api_nodes, false, false, R, A},
    {"/v1/nodes/", "POST", "/v1/nodes/{name}/{action}", td_api_node_action, true, false, R, A},
    {"/v1/tokens", "GET, POST", "/v1/tokens", tokens, false, false, A, A},
    {"/v1/tokens/", "DELETE", "/v1/tokens/{id}", token_revoke, true, false, A, A},
    {"/v1/cluster/register", "POST", "/v1/cluster/register", td_api_cluster_register, false, true,
     R, R},
    {"/v1/cluster/heartbeat", "POST", "/v1/cluster/heartbeat", td_api_cluster_heartbeat, false,
     true, R, R},
    {"/v1/cluster/files/", "GET, PUT", "/v1/cluster/files/{path}", td_api_cluster_file, true, true,
     R, R},
    {"/metrics", "GET", "/metrics", prometheus, false, false, R, R},
};

static const route JOB_ROUTES[] = {
    {"", "GET, DELETE", "/v1/jobs/{id}", job, false, false, R, S},
    {"/cancel", "POST", "/v1/jobs/{id}/cancel", cancel, false, false, R, S},
    {"/metrics", "GET", "/v1/jobs/{id}/metrics", metrics, false, false, R, R},
    {"/events", "GET", "/v1/jobs/{id}/events", events, false, false, R, R},
    {"/logs", "GET", "/v1/jobs/{id}/logs", logs, false, false, R, R},
    {"/checkpoints", "GET", "/v1/jobs/{id}/checkpoints", checkpoints, false, false, R, R},
    {"/checkpoints/", "GET", "/v1/jobs/{id}/checkpoints/{file}", checkpoint, true, false, R, R},
    {"/tensorboard", "GET", "/v1/jobs/{id}/tensorboard", tensorboard, false, false, R, R},
    {"/spec", "GET", "/v1/jobs/{id}/spec", spec, false, false, R, R},
};
#undef R
#undef S
#undef A

static const route *find_route(const route *table, size_t n, const char *path, const char **tail) {
    for (size_t i = 0; i < n; i++) {
        size_t len = strlen(table[i].path);
        if (table[i].prefix ? strncmp(path, table[i].path, len) == 0 : is(path, table[i].path)) {
            *tail = path + len;
            return &table[i];
        }
    }
    return NULL;
}

/* Whether method is one of "GET, POST" (HEAD counting as GET). */
static bool allowed(const char *methods, const char *method) {
    const char *m = is(method, "HEAD") ? "GET" : method;
    size_t n = strlen(m);
    for (const char *p = methods; (p = strstr(p, m)); p += n)
        if ((p == methods || p[-1] == ' ') && (p[n] == 0 || p[n] == ',')) return true;
    return false;
}

static enum MHD_Result dispatch(const route *r, td_api_call *k) {
    if (!allowed(r->methods, k->method)) {
        td_reply_error e;
        td_reply_fail(&e, 405, "method_not_allowed", NULL, "%s is not allowed on %s; allowed: %s",
                      k->method, k->url, r->methods);
        return td_api_error(k->c, &e, r->methods);
    }
    bool read = is(k->method, "GET") || is(k->method, "HEAD");
    td_scope need = read ? r->read : r->write;
    if (!r->open && k->rq->who.scope < need) {
        td_reply_error e;
        td_reply_fail(&e, 403, "forbidden", NULL,
                      "%s %s needs a token with scope %s; token \"%s\" has scope %s (an admin "
                      "makes tokens: POST /v1/tokens)",
                      k->method, k->url, td_scope_name(need), k->rq->who.name,
                      td_scope_name(k->rq->who.scope));
        return td_api_error(k->c, &e, NULL);
    }
    return r->handler(k);
}

/* Who the request comes from: 1 known (rq->who), 0 no token, -1 a session cookie without its
 * CSRF token. A revoked token, or a session signed in with one, is no token from that moment. */
static int authenticate(td_api *api, struct MHD_Connection *c, const char *method,
                        td_api_request *rq) {
    if (bearer(api, c, &rq->who)) return 1;
    long token = 0;
    int session = td_api_session_auth(api, c, method, &token);
    if (session <= 0) return session;
    return td_tokens_live(api->cfg.tokens, token, &rq->who) ? 1 : 0;
}

/* The route of url, top-level or a job's (*id: the job's; 0 when the id is malformed, which
 * is said when the request is routed); NULL: none. */
static const route *route_of(const char *url, long *id, const char **tail, const char **label) {
    *id = -1;
    const route *r = find_route(ROUTES, sizeof ROUTES / sizeof ROUTES[0], url, tail);
    if (r) {
        *label = r->label;
        return r;
    }
    if (strncmp(url, "/v1/jobs/", 9) != 0) return NULL;
    const char *num = url + 9, *slash = strchr(num, '/');
    if (!td_api_parse_id(num, slash ? (size_t)(slash - num) : strlen(num), id)) *id = 0;
    r = find_route(JOB_ROUTES, sizeof JOB_ROUTES / sizeof JOB_ROUTES[0], slash ? slash : "", tail);
    if (r) *label = r->label;
    return r;
}

enum { OPEN_BODY_MAX = 64 * 1024 }; /* what a request without a user's token may send */

/* A registration's secret or a heartbeat's node credential, on the headers: a stranger's body
 * is never read (the handler checks again, and reads who the node is). */
static bool cluster_admit(td_api *api, struct MHD_Connection *c, const route *r,
                          enum MHD_Result *answer) {
    bool reg = r->handler == td_api_cluster_register;
    if ((!reg && r->handler != td_api_cluster_heartbeat) || !api->cfg.cluster) return true;
    td_reply_error e;
    char peer[64], from[64];
    td_api_peer(c, peer, sizeof peer);
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (reg ? td_cluster_authorized(api->cfg.cluster, auth, peer, &e)
            : td_cluster_node_authorized(api->cfg.cluster, auth, peer, from, &e))
        return true;
    *answer = td_api_error(c, &e, NULL);
    return false;
}

bool td_api_admit(td_api *api, struct MHD_Connection *c, const char *url, const char *method,
                  td_api_request *rq, enum MHD_Result *answer) {
    if (td_api_path_refused(c, rq->raw_url ? rq->raw_url : url, answer)) return false;
    bool read = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    rq->max_body = atomic_load(&api->max_body);
    if (read && (strcmp(url, "/") == 0 || strncmp(url, "/ui", 3) == 0)) {
        rq->route = "/ui";
        return true; /* the dashboard's page: nothing secret in it */
    }
    long id;
    const char *tail, *label = NULL;
    const route *r = route_of(url, &id, &tail, &label);
    if (label) rq->route = label;
    if (r && r->open) { /* health, openapi, sign-in, the cluster's own (checked there) */
        if (r->handler == session) rq->max_body = OPEN_BODY_MAX;
        return cluster_admit(api, c, r, answer);
    }
    /* a user's token, before a byte of the body is read: a stranger's body is never kept */
    int known = authenticate(api, c, method, rq);
    if (known <= 0) {
        *answer = known < 0 ? td_api_fail(c, 403, "csrf", NULL,
                                          "a request with the session cookie needs the "
                                          "session's CSRF token (X-CSRF-Token, or ?csrf=)")
                            : td_api_fail(c, 401, "unauthorized", NULL,
                                          "missing, wrong or revoked bearer token: send "
                                          "\"Authorization: Bearer TOKEN\" with a live token "
                                          "(an admin's is in STATE_DIR/token)");
        return false;
    }
    double retry = 0;
    if (!td_tokens_admit(api->cfg.tokens, rq->who.id, td_clock_now(), &retry)) {
        td_reply_error e;
        td_reply_fail(&e, 429, "rate_limited", NULL,
                      "token \"%s\" is over its rate of %g requests per second "
                      "(rate_limit_per_s): retry after the Retry-After seconds",
                      rq->who.name, td_tokens_get_limits(api->cfg.tokens).requests_per_s);
        e.retry_after_s = retry;
        *answer = td_api_error(c, &e, NULL);
        return false;
    }
    return true;
}

enum MHD_Result td_api_route(td_api *api, struct MHD_Connection *c, const char *url,
                             const char *method, td_api_request *rq) {
    td_api_call k = {api, c, method, url, rq, 0, ""};
    bool read = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    if (read && (strcmp(url, "/") == 0 || strncmp(url, "/ui", 3) == 0))
        return td_api_web_file(api, c, url);
    const char *label = NULL;
    const route *r = route_of(url, &k.id, &k.tail, &label);
    if (k.id == 0)
        return td_api_fail(c, 400, "bad_request", "id", "a job id is a positive integer");
    if (k.id > 0) rq->job = k.id;
    if (r) return dispatch(r, &k);
    td_reply_error e;
    if (k.id > 0)
        td_reply_fail(&e, 404, "not_found", NULL, "no route %s", url);
    else
        td_reply_fail(&e, 404, "not_found", NULL, "no route %s %s (see api/README.md)", method,
                      url);
    return td_api_error(c, &e, NULL);
}
