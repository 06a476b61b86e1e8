/* traind's HTTP API v1 (api/README.md) on libmicrohttpd: routing, bearer-token checks, body
 * limits, JSON errors, Server-Sent Events, log following and checkpoint downloads with Range.
 *
 * One thread per connection: an event stream or a followed log blocks its own thread on the
 * job's condition variable instead of polling, and keep-alive clients (curl, wrk, browsers)
 * each get a thread that serves request after request without a hand-off. */
#ifndef TD_API_H
#define TD_API_H

#include "base/td_error.h"
#include "service/cluster/td_cluster.h"
#include "service/exp/td_experiments.h"
#include "service/jobs/td_jobs.h"

#include <stddef.h>

typedef struct td_api td_api;

typedef struct td_api_config {
    int listen_fd;     /* from td_api_listen; the server owns it from td_api_start on */
    td_tokens *tokens; /* who may do what (service/store/td_tokens.h); the caller keeps it */
    /* every mutating request, one JSON line each (who, what, when, result); NULL: none */
    const char *audit_log;
    size_t max_body;
    const char *version;
    td_cluster *cluster;    /* the node registry of a master (GET /v1/nodes, agents' calls) */
    const char *master;     /* an agent's master (ADDR:PORT); then cluster is NULL */
    const char *web_root;   /* the dashboard's files (index.html, app.js, app.css) */
    const char *chart_root; /* the chart library's (Debian's libjs-dygraphs) */
    const char *state_dir;  /* where state.db is: its size for GET /metrics; NULL: not shown */
    td_log *log;
    /* HTTPS (libmicrohttpd with GnuTLS): the certificate chain and its private key, PEM text;
     * both NULL: plain HTTP */
    const char *tls_cert_pem, *tls_key_pem;
    /* a second socket (td_api_listen) that serves GET /metrics alone, without the token, for
     * Prometheus on a network the operator keeps for it; -1: none (GET /metrics on the API
     * port, with the token, either way) */
    int metrics_listen_fd;
    /* connections served at once (each a thread); 0: libmicrohttpd's default (about 1,000) */
    unsigned max_connections;
    unsigned max_connections_per_ip; /* of one address at once; 0: 128 */
    double connection_timeout_s;     /* a connection silent this long is closed; 0: 30 */
    td_experiments *experiments;     /* the experiments' (NULL on an agent: its master has them) */
} td_api_config;

/* Binds and listens on host:port (port 0: any free port) before anything else starts, so that a
 * port in use stops the daemon before it touches its jobs. No SO_REUSEPORT: a second daemon on
 * the same port is an error, never a silent split of the requests. *port gets the bound port. */
int td_api_listen(const char *host, int *port, int *fd, td_err *err);
int td_api_start(td_api **out, const td_api_config *cfg, td_jobs *jobs, td_err *err);
int td_api_port(const td_api *api);
void td_api_stop(td_api *api);
/* A reload's body limit, for the requests that begin from now on. */
void td_api_set_max_body(td_api *api, size_t max_body);

#endif
