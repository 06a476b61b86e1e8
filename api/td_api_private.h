/* Inside the HTTP API (td_api.h), shared by its files:
 *   td_api.c             the route table, the user's and the job routes, admission
 *   td_api_reply.c       replies and errors, and the small readers of a request
 *   td_api_path.c        whether a path as sent may be routed at all
 *   td_api_cluster.c     the cluster's routes (agents, nodes), the master's only
 *   td_api_experiments.c the experiments' routes
 *   td_api_stream.c      the responses that stay open: Server-Sent Events and followed logs
 *   td_api_checkpoint.c  checkpoint listings, files with Range, and whole checkpoints as tar
 *   td_api_files.c       a job's files between its master and its nodes (cluster secret)
 *   td_api_web.c         the dashboard's files and browser sessions (cookie and CSRF token)
 *   td_api_metrics.c     GET /metrics for Prometheus, and the HTTP figures it shows
 *   td_api_audit.c       the audit log: a JSON line per mutating request
 *   td_api_https_guard.c with TLS, the listeners' door: plain HTTP is told to use https://
 * Every reply goes out through td_api_respond, so each carries its content type and headers the
 * same way, and every error is td_api_error's JSON object. */
#ifndef TD_API_PRIVATE_H
#define TD_API_PRIVATE_H

#include "api/td_api.h"
#include "service/run/td_jobfs.h"

#include <microhttpd.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#define TD_API_SESSIONS_MAX 1024
typedef struct td_api_session {
    char id[65], csrf[65];
    double last_used; /* monotonic */
    double signed_in; /* monotonic: a token's oldest goes past max_sessions_per_token */
    long token;       /* the token it signed in with: revoking it ends the session */
} td_api_session;

/* Requests answered with one route, method and status: a count and latency histogram. */
#define TD_API_BUCKETS    12
#define TD_API_SERIES_MAX 512 /* route × method × status seen; beyond, not counted */
typedef struct td_api_series {
    const char *route; /* a route's pattern ("/v1/jobs/{id}/events"): a static string */
    char method[12];
    unsigned status;
    unsigned long long count, buckets[TD_API_BUCKETS];
    double sum;
} td_api_series;

typedef struct td_api_stats {
    pthread_mutex_t mu;
    td_api_series *series;
    int n, cap;
    atomic_long sse_clients; /* event streams open now */
} td_api_stats;

void td_api_stats_init(td_api_stats *s);
void td_api_stats_free(td_api_stats *s);
void td_api_stats_request(td_api_stats *s, const char *route, const char *method, unsigned status,
                          double seconds);

/* One request's state across libmicrohttpd's calls (td_api_server.c): the body arrives in
 * pieces, after the request was admitted on its headers alone (td_api_admit). */
typedef struct td_api_request {
    char *raw_url;                /* as the client sent it, before unescaping (the query too) */
    bool admitted;                /* its headers were looked at */
    const char *route;            /* the route's pattern, for GET /metrics; NULL: none matched */
    double started;               /* monotonic, when the headers were in */
    const char *method;           /* one of METHODS: a client may send any string as its method */
    td_buf body;                  /* at most max_body bytes of it */
    size_t max_body;              /* this route's limit */
    bool too_large;               /* more came: dropped, and a 413 */
    struct td_api_upload *upload; /* PUT /v1/cluster/files/...: streamed to a file, not kept */
    td_principal who;             /* the request's token (id 0: none, or not checked) */
    long job;                     /* the job it made or acted on, for the audit log */
    bool stream;                  /* holds one of who's event streams until it ends */
    bool audit;                   /* a mutating request: the audit log gets it once answered */
} td_api_request;

/* What a route's handler is given: the request and, under /v1/jobs/{id}, the job's id. */
typedef struct td_api_call {
    td_api *api;
    struct MHD_Connection *c;
    const char *method, *url;
    td_api_request *rq;
    long id;
    const char *tail; /* after a prefix route's path */
} td_api_call;

/* The cluster's routes (td_api_cluster.c): POST /v1/cluster/register and /heartbeat, GET and
 * PUT /v1/cluster/files/..., GET /v1/nodes, POST /v1/nodes/{name}/drain and /undrain. */
enum MHD_Result td_api_cluster_register(const td_api_call *k);
enum MHD_Result td_api_cluster_heartbeat(const td_api_call *k);
enum MHD_Result td_api_cluster_file(const td_api_call *k);
enum MHD_Result td_api_nodes(const td_api_call *k);
enum MHD_Result td_api_node_action(const td_api_call *k);

/* One of the token's streams (events, a followed log) for as long as the request lasts; false
 * with a 429 answered when it holds its limit of them (td_api.c). */
bool td_api_take_stream(const td_api_call *k, enum MHD_Result *answer);
/* The experiments' routes (td_api_experiments.c): /v1/experiments and
 * /v1/experiments/{id}[/cancel|pause|resume|events]. */
enum MHD_Result td_api_experiments(const td_api_call *k);
enum MHD_Result td_api_experiment(const td_api_call *k);

/* Whether a request whose headers are in may go on (its body read, then routed): its path as
 * sent is a path, its token is known and under its rate (open routes need none). false: it was
 * answered (*answer), and libmicrohttpd reads no body. rq->max_body: its route's limit. */
bool td_api_admit(td_api *api, struct MHD_Connection *c, const char *url, const char *method,
                  td_api_request *rq, enum MHD_Result *answer);
/* The admitted request, its body read, to its route's handler. */
enum MHD_Result td_api_route(td_api *api, struct MHD_Connection *c, const char *url,
                             const char *method, td_api_request *rq);
/* Whether a path as a client sent it has no NUL, no encoded '/', no control character (raw or
 * encoded); *why says which when not. Apart, to be fuzzed (tests/fuzz/fuzz_http_path.c). */
bool td_api_raw_path_ok(const char *raw, const char **why);
/* Whether the path as sent is refused (td_api_raw_path_ok): then the 400 is in answer. */
bool td_api_path_refused(struct MHD_Connection *c, const char *raw, enum MHD_Result *answer);

struct td_api {
    td_api_config cfg;
    pthread_mutex_t session_mu;
    td_api_session *sessions; /* signed-in browsers (td_api_web.c), TD_API_SESSIONS_MAX */
    int n_sessions;
    char master[256]; /* cfg.master's copy */
    td_jobs *jobs;
    struct MHD_Daemon *daemon;
    struct MHD_Daemon *metrics_daemon; /* the separate metrics listener; NULL: none */
    /* with TLS, the listeners' doors (td_api_https_guard.c); NULL: plain HTTP */
    struct td_api_https_guard *guard, *metrics_guard;
    int port;
    td_api_stats stats;
    atomic_size_t max_body; /* cfg.max_body, then what a reload sets (td_api_set_max_body) */
};

/* With TLS, accepts listen_fd's connections in a thread of its own: a TLS client's goes to
 * daemon (started with MHD_USE_NO_LISTEN_SOCKET), a plain HTTP request gets a 400 that says to
 * use https:// (td_api_https_guard.c). Stopping it closes listen_fd. */
typedef struct td_api_https_guard td_api_https_guard;
int td_api_https_guard_start(td_api_https_guard **out, int listen_fd, struct MHD_Daemon *daemon,
                             double connection_timeout_s, td_log *log, td_err *err);
void td_api_https_guard_stop(td_api_https_guard *g);

/* GET /metrics (td_api_metrics.c). */
enum MHD_Result td_api_metrics(td_api *api, struct MHD_Connection *c);

extern const char TD_API_JSON[]; /* "application/json" */

/* Sets the content type and any further headers (name, value, ..., NULL), queues r and releases
 * it. r NULL (out of memory) drops the connection: nothing else is left to do. */
enum MHD_Result td_api_respond(struct MHD_Connection *c, unsigned status, struct MHD_Response *r,
                               const char *type, ...);
/* The body of a reply built in memory, handed to libmicrohttpd to free (b is emptied). */
struct MHD_Response *td_api_from_buf(td_buf *b);
/* b's bytes as the body (b is emptied). */
enum MHD_Result td_api_reply_buf(struct MHD_Connection *c, unsigned status, td_buf *b);
/* {"error": {"code", "message", "field"}} with e's status; Allow when given. */
enum MHD_Result td_api_error(struct MHD_Connection *c, const td_reply_error *e, const char *allow);
enum MHD_Result td_api_fail(struct MHD_Connection *c, int status, const char *code,
                            const char *field, const char *message);

/* The client's address ("?" when unknown), for logs and the audit. */
void td_api_peer(struct MHD_Connection *c, char *out, size_t len);

/* A non-negative decimal of n characters; false for anything else (signs, spaces, overflow). */
bool td_api_parse_id(const char *s, size_t n, long *out);

/* The pure parsers of what a client sends, apart from their handlers so that they can be fuzzed
 * on their own (tests/fuzz/fuzz_http_*.c). */
/* A Range header, "bytes=A-B", "bytes=A-" or "bytes=-N", against a file of n bytes: true with
 * from <= to < n, false for anything else (several ranges, a range past the end). */
bool td_api_parse_range(const char *h, uint64_t n, uint64_t *from, uint64_t *to);
/* Last-Event-ID (or ?last_event_id=): the id of an event the client has, a decimal >= 0. */
bool td_api_parse_last_event_id(const char *h, long *after);
/* What follows /v1/jobs/{id}/checkpoints/: STEP (listing), STEP.tar or STEP/FILE (*name). */
typedef enum {
    TD_API_CKPT_BAD_STEP,
    TD_API_CKPT_LISTING,
    TD_API_CKPT_TAR,
    TD_API_CKPT_FILE,
    TD_API_CKPT_NO_ROUTE
} td_api_checkpoint_route;
td_api_checkpoint_route td_api_parse_checkpoint_tail(const char *tail, long *step,
                                                     const char **name);
/* /v1/cluster/files/{job}/{rel}: the job's id and the path within its directory (unchecked:
 * td_jobs_file_path checks it). */
bool td_api_file_route_split(const char *url, long *job, const char **rel);
/* Query parameter `name` in [min, max]: true when given and good, *bad when given and not. */
bool td_api_query_long(struct MHD_Connection *c, const char *name, long min, long max, long *out,
                       bool *bad);

/* Bytes made ahead of what libmicrohttpd has asked for (SSE records, tar blocks). */
typedef struct td_api_pending {
    td_buf buf;
    size_t off;
} td_api_pending;
/* Copies what is pending into buf, at most max; 0 when nothing is, and then the buffer is
 * emptied for the caller to make more. */
size_t td_api_pending_take(td_api_pending *p, char *buf, size_t max);

/* A stream of events (a job's, an experiment's) for td_api_sse: events after `after` (at most
 * limit) to fn, -1 when the source is gone; and a wait until there are some after `after`, the
 * source ends (*ended) or timeout_s passes, -1 when it is gone. */
typedef struct td_api_event_source {
    int (*events)(void *ctx, long id, long after, int limit, td_db_event_fn fn, void *fctx);
    int (*wait)(void *ctx, long id, long after, double timeout_s, long *last, bool *ended);
    void *ctx;
} td_api_event_source;
/* Server-Sent Events of source's item id, from the start or after Last-Event-ID (td_api_stream.c;
 * the caller has checked that the item exists and taken the token's stream). */
enum MHD_Result td_api_sse(td_api *api, struct MHD_Connection *c, long id,
                           const td_api_event_source *source);
/* GET /v1/jobs/{id}/events and /logs (td_api_stream.c) */
enum MHD_Result td_api_events(td_api *api, struct MHD_Connection *c, long id);
enum MHD_Result td_api_logs(td_api *api, struct MHD_Connection *c, long id);
/* GET /v1/jobs/{id}/checkpoints and .../checkpoints/{tail} (td_api_checkpoint.c) */
enum MHD_Result td_api_checkpoints(td_api *api, struct MHD_Connection *c, long id);
enum MHD_Result td_api_checkpoint(td_api *api, struct MHD_Connection *c, long id, const char *tail);
enum MHD_Result td_api_tensorboard(td_api *api, struct MHD_Connection *c, long id);

/* Node-to-node files of a job (td_api_files.c): an upload streams through begin, chunk and end
 * (abandon drops it when the connection ends first). */
struct td_sha256;
typedef struct td_api_upload {
    char path[8192];    /* its path in the job's directory, for messages */
    td_job_files files; /* the job's, whose identity the file is written with */
    td_jobfs_put put;   /* the file being written (td_jobfs.h) */
    struct td_sha256 *hash;
    long long size;
    td_reply_error error; /* status 0: none so far */
    td_jobs *jobs;
} td_api_upload;
bool td_api_is_file_upload(const char *url, const char *method);
void td_api_upload_begin(td_api *api, struct MHD_Connection *c, const char *url, td_api_upload *u);
void td_api_upload_chunk(td_api_upload *u, const char *data, size_t n);
enum MHD_Result td_api_upload_end(struct MHD_Connection *c, td_api_upload *u);
void td_api_upload_abandon(td_api_upload *u);
enum MHD_Result td_api_file_get(td_api *api, struct MHD_Connection *c, const char *url);

/* The dashboard (td_api_web.c). Whether a session cookie authorizes the request: 1 yes (*token:
 * the token it signed in with), 0 no session (the bearer token decides), -1 a session without
 * its CSRF token (which every request made with the cookie carries). */
int td_api_session_auth(td_api *api, struct MHD_Connection *c, const char *method, long *token);
/* /v1/session: POST {"token"} signs in (the cookie and {"csrf"}; *who: that token), GET says
 * whether the cookie and CSRF token still hold, DELETE signs out. bearer: the request also
 * carried a good bearer token. */
enum MHD_Result td_api_session_route(td_api *api, struct MHD_Connection *c, const char *method,
                                     const char *body, size_t len, bool bearer, td_principal *who);

/* The audit log (td_api_audit.c): one JSON line for a mutating request once it is answered.
 * job: the job it made or acted on (0: none). */
void td_api_audit(td_api *api, struct MHD_Connection *c, const td_principal *who,
                  const char *method, const char *url, unsigned status, long job);
/* GET / and /ui/...: the page's files, and the chart library under /ui/lib/dygraphs/. */
enum MHD_Result td_api_web_file(td_api *api, struct MHD_Connection *c, const char *url);

#endif
