/* The HTTP server itself: libmicrohttpd with one thread per connection, each request's life
 * (td_api_request) from its first line to its last byte, and the limits a stranger meets before
 * anything else: connections per address, a connection that says nothing, a path that is not
 * one, a token checked before any body is read (td_api_admit), a body over its route's limit. */
#include "api/td_api_private.h"

#include "base/td_clock.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* The method as GET /metrics counts it: the ones HTTP defines, or "other", so that what a client
 * makes up can neither add series nor put bytes that are not UTF-8 into a label. */
static const char *method_label(const char *method) {
    static const char *const METHODS[] = {"GET",     "HEAD",    "POST",  "PUT",  "DELETE",
                                          "CONNECT", "OPTIONS", "TRACE", "PATCH"};
    for (size_t i = 0; i < sizeof METHODS / sizeof METHODS[0]; i++)
        if (strcmp(method, METHODS[i]) == 0) return METHODS[i];
    return "other";
}

/* The request line as the client sent it, before libmicrohttpd unescapes it: a request's life
 * begins here (its state is what this returns). */
static void *begin(void *cls, const char *uri, struct MHD_Connection *c) {
    (void)cls;
    (void)c;
    td_api_request *rq = td_calloc(1, sizeof *rq);
    rq->raw_url = td_strdup(uri ? uri : "");
    return rq;
}

/* The first call, the headers in and no byte of the body read: the request is admitted (its
 * path, its token, its rate) or answered at once, which ends the connection after the answer
 * (libmicrohttpd reads no body then). */
static enum MHD_Result first_call(td_api *api, struct MHD_Connection *c, const char *url,
                                  const char *method, td_api_request *rq) {
    rq->admitted = true;
    rq->started = td_clock_now();
    rq->method = method_label(method);
    /* every change is audited but the agents' heartbeats: one per node every heartbeat_s,
     * carrying no decision of anyone's (GET /v1/nodes shows what they say) */
    rq->audit = strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0 &&
                strcmp(url, "/v1/cluster/heartbeat") != 0;
    enum MHD_Result answer = MHD_YES;
    if (td_api_is_file_upload(url, method)) {
        if (td_api_path_refused(c, rq->raw_url ? rq->raw_url : url, &answer)) return answer;
        rq->route = "/v1/cluster/files/{path}";
        rq->upload = td_calloc(1, sizeof *rq->upload);
        td_api_upload_begin(api, c, url, rq->upload);
        /* a node that may not send it: answered before its bytes are read */
        return rq->upload->error.status ? td_api_upload_end(c, rq->upload) : MHD_YES;
    }
    if (!td_api_admit(api, c, url, method, rq, &answer)) return answer;
    const char *cl =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl && strtoull(cl, NULL, 10) > rq->max_body) {
        td_reply_error e;
        td_reply_fail(&e, 413, "body_too_large", NULL,
                      "the request body (%s bytes) is over this route's limit of %zu bytes", cl,
                      rq->max_body);
        return td_api_error(c, &e, NULL);
    }
    return MHD_YES;
}

static enum MHD_Result handle(void *cls, struct MHD_Connection *c, const char *url,
                              const char *method, const char *version, const char *upload,
                              size_t *upload_size, void **con_cls) {
    (void)version;
    td_api *api = cls;
    td_api_request *rq = *con_cls;
    if (!rq) *con_cls = rq = begin(NULL, url, c); /* (the log callback always made one) */
    if (!rq->admitted) return first_call(api, c, url, method, rq);
    if (rq->upload) {
        if (*upload_size) {
            td_api_upload_chunk(rq->upload, upload, *upload_size);
            *upload_size = 0;
            return MHD_YES;
        }
        return td_api_upload_end(c, rq->upload);
    }
    if (*upload_size) {
        if (!rq->too_large && rq->body.len + *upload_size <= rq->max_body)
            td_buf_append(&rq->body, upload, *upload_size);
        else
            rq->too_large = true; /* (chunked: no length said) read and dropped: a 413 */
        *upload_size = 0;
        return MHD_YES;
    }
    if (rq->too_large) {
        td_reply_error e;
        td_reply_fail(&e, 413, "body_too_large", NULL,
                      "the request body is over this route's limit of %zu bytes", rq->max_body);
        return td_api_error(c, &e, NULL);
    }
    return td_api_route(api, c, url, method, rq);
}

static void completed(void *cls, struct MHD_Connection *c, void **con_cls,
                      enum MHD_RequestTerminationCode code) {
    (void)code;
    td_api *api = cls;
    td_api_request *rq = *con_cls;
    if (!rq) return;
    const union MHD_ConnectionInfo *status =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_HTTP_STATUS);
    if (status && status->http_status) /* 0: the connection ended before a reply */
        td_api_stats_request(&api->stats, rq->route ? rq->route : "other", rq->method,
                             status->http_status, td_clock_now() - rq->started);
    if (rq->audit) { /* the path as sent, without the query (a CSRF token may travel there) */
        rq->raw_url[strcspn(rq->raw_url, "?")] = 0;
        td_api_audit(api, c, &rq->who, rq->method ? rq->method : "other", rq->raw_url,
                     status ? status->http_status : 0, rq->job);
    }
    free(rq->raw_url);
    if (rq->stream) td_tokens_stream_end(api->cfg.tokens, rq->who.id);
    td_buf_free(&rq->body);
    if (rq->upload) td_api_upload_abandon(rq->upload); /* nothing once it was kept */
    free(rq->upload);
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
        bind(s, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(s, SOMAXCONN) != 0) {
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

/* libmicrohttpd's own messages (a client's failed TLS handshake, a connection it dropped) go to
 * the daemon's log, in its format, as warnings. */
static void mhd_log(void *cls, const char *fmt, va_list ap) {
    td_api *api = cls;
    char msg[1024];
    vsnprintf(msg, sizeof msg, fmt, ap);
    msg[strcspn(msg, "\r\n")] = 0;
    td_log_at(api->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE, "HTTP server: %s", msg);
}

/* The metrics listener's requests: GET /metrics and nothing else, no token (whoever reaches
 * this port may read the service's figures, never a job's data or an action). */
static enum MHD_Result handle_metrics(void *cls, struct MHD_Connection *c, const char *url,
                                      const char *method, const char *version, const char *upload,
                                      size_t *upload_size, void **con_cls) {
    (void)version;
    (void)upload;
    if (!*con_cls) { /* headers are in */
        *con_cls = cls;
        return MHD_YES;
    }
    if (*upload_size) { /* a body means nothing here: read and dropped */
        *upload_size = 0;
        return MHD_YES;
    }
    if (strcmp(url, "/metrics") != 0)
        return td_api_fail(c, MHD_HTTP_NOT_FOUND, "not_found", NULL,
                           "this is the metrics listener: it serves GET /metrics only (the API "
                           "is on traind's --listen port)");
    if (strcmp(method, "GET") != 0 && strcmp(method, "HEAD") != 0) {
        td_reply_error e;
        td_reply_fail(&e, MHD_HTTP_METHOD_NOT_ALLOWED, "method_not_allowed", NULL,
                      "/metrics answers GET and HEAD only");
        return td_api_error(c, &e, "GET, HEAD");
    }
    return td_api_metrics(cls, c);
}

/* One libmicrohttpd server on listen_fd with the options both listeners share. With TLS it has
 * no listen socket of its own: a guard accepts for it (td_api_https_guard.c), so that plain HTTP
 * on the HTTPS port gets an answer, not a closed connection. */
static int start_server(td_api *api, int listen_fd, MHD_AccessHandlerCallback handler,
                        const struct MHD_OptionItem *limits, struct MHD_Daemon **daemon,
                        td_api_https_guard **guard, td_err *err) {
    const td_api_config *cfg = &api->cfg;
    bool tls = cfg->tls_cert_pem && cfg->tls_key_pem;
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD |
                     MHD_USE_POLL | MHD_USE_ERROR_LOG;
    if (tls) flags |= MHD_USE_TLS | MHD_USE_NO_LISTEN_SOCKET | MHD_USE_ITC;
    /* the logger first (libmicrohttpd's advice: messages about later options use it) */
    struct MHD_OptionItem options[16] = {
        {MHD_OPTION_EXTERNAL_LOGGER, (intptr_t)mhd_log, api},
        {MHD_OPTION_ARRAY, 0, (void *)limits},
    };
    int n = 2;
    if (tls) {
        options[n++] =
            (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_CERT, 0, (void *)cfg->tls_cert_pem};
        options[n++] =
            (struct MHD_OptionItem){MHD_OPTION_HTTPS_MEM_KEY, 0, (void *)cfg->tls_key_pem};
    } else {
        options[n++] = (struct MHD_OptionItem){MHD_OPTION_LISTEN_SOCKET, listen_fd, NULL};
    }
    options[n] = (struct MHD_OptionItem){MHD_OPTION_END, 0, NULL};
    *daemon = MHD_start_daemon(flags, 0, NULL, NULL, handler, api, MHD_OPTION_ARRAY, options,
                               MHD_OPTION_END);
    if (!*daemon) {
        if (tls) close(listen_fd); /* the guard would have owned it: nobody else closes it */
        return td_fail(err, "cannot start the HTTP%s server (libmicrohttpd) on port %d%s",
                       tls ? "S" : "", api->port,
                       tls ? ": is the key the certificate's, and both PEM?" : "");
    }
    if (tls && td_api_https_guard_start(guard, listen_fd, *daemon, cfg->connection_timeout_s,
                                        cfg->log, err) != 0) {
        MHD_stop_daemon(*daemon);
        *daemon = NULL;
        close(listen_fd);
        return -1;
    }
    return 0;
}

int td_api_start(td_api **out, const td_api_config *cfg, td_jobs *jobs, td_err *err) {
    td_api *api = td_calloc(1, sizeof *api);
    api->cfg = *cfg;
    atomic_init(&api->max_body, cfg->max_body);
    api->jobs = jobs;
    pthread_mutex_init(&api->session_mu, NULL);
    api->sessions = td_calloc(TD_API_SESSIONS_MAX, sizeof *api->sessions);
    td_api_stats_init(&api->stats);
    snprintf(api->master, sizeof api->master, "%s", cfg->master ? cfg->master : "");
    struct sockaddr_in addr;
    socklen_t len = sizeof addr;
    api->port =
        getsockname(cfg->listen_fd, (struct sockaddr *)&addr, &len) == 0 ? ntohs(addr.sin_port) : 0;
    const struct MHD_OptionItem api_limits[] = {
        {MHD_OPTION_NOTIFY_COMPLETED, (intptr_t)completed, api},
        {MHD_OPTION_URI_LOG_CALLBACK, (intptr_t)begin, api},
        /* a connection that says nothing this long (or never finishes its headers) goes: a
         * thousand half-open connections do not hold the server for ever */
        {MHD_OPTION_CONNECTION_TIMEOUT,
         cfg->connection_timeout_s > 0 ? (unsigned)cfg->connection_timeout_s : 30u, NULL},
        /* past the limit a connection is closed at once: the default (its select() size) is a
         * thousand, which event streams alone reach; and one address holds at most its share */
        {MHD_OPTION_CONNECTION_LIMIT,
         cfg->max_connections ? cfg->max_connections : (unsigned)FD_SETSIZE - 4, NULL},
        {MHD_OPTION_PER_IP_CONNECTION_LIMIT,
         cfg->max_connections_per_ip ? cfg->max_connections_per_ip : 128u, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    if (start_server(api, cfg->listen_fd, handle, api_limits, &api->daemon, &api->guard, err)) {
        td_api_stats_free(&api->stats);
        free(api->sessions);
        free(api);
        return -1;
    }
    /* plain HTTP, or HTTPS with the API's certificate: a scraper is configured either way; no
     * token there, so its connections are few */
    const struct MHD_OptionItem metrics_limits[] = {
        {MHD_OPTION_CONNECTION_TIMEOUT, 30, NULL},
        {MHD_OPTION_CONNECTION_LIMIT, 64, NULL},
        {MHD_OPTION_END, 0, NULL},
    };
    if (cfg->metrics_listen_fd >= 0 &&
        start_server(api, cfg->metrics_listen_fd, handle_metrics, metrics_limits,
                     &api->metrics_daemon, &api->metrics_guard, err)) {
        td_api_stop(api);
        return td_fail_prefix(err, "the metrics listener");
    }
    *out = api;
    return 0;
}

void td_api_set_max_body(td_api *api, size_t max_body) {
    atomic_store(&api->max_body, max_body);
}

int td_api_port(const td_api *api) {
    return api->port;
}

void td_api_stop(td_api *api) {
    if (!api) return;
    /* the guards first: nothing is handed to a server that is gone */
    td_api_https_guard_stop(api->metrics_guard);
    td_api_https_guard_stop(api->guard);
    if (api->metrics_daemon) MHD_stop_daemon(api->metrics_daemon);
    MHD_stop_daemon(api->daemon);
    td_api_stats_free(&api->stats);
    pthread_mutex_destroy(&api->session_mu);
    free(api->sessions);
    free(api);
}
