/* The HTTP API's cluster routes: an agent's registration and heartbeats (with the cluster's
 * secret or the node's credential, not a user's token), a job's files between nodes, and the
 * nodes' listing and draining. Apart from the user's routes: only a master answers them. */
#include "api/td_api_private.h"

#include "base/td_clock.h"

#include <jansson.h>
#include <stdio.h>
#include <string.h>

/* POST /v1/cluster/register and /heartbeat: agents, with the cluster secret (not a user token). */
/* An agent keeps no cluster state: the cluster's routes are the master's. */
static enum MHD_Result not_master(const td_api_call *k) {
    td_reply_error e;
    td_reply_fail(&e, 409, "not_master", NULL,
                  "this traind is an agent of the master at %s: ask the master", k->api->master);
    return td_api_error(k->c, &e, NULL);
}

/* Registering takes the cluster secret; a heartbeat, the node's own credential (given at its
 * registration), and it speaks for that node only. */
static enum MHD_Result cluster_call(const td_api_call *k, bool reg) {
    if (!k->api->cfg.cluster) return not_master(k);
    td_reply_error e;
    char peer[64], from[64] = "";
    td_api_peer(k->c, peer, sizeof peer);
    const char *auth =
        MHD_lookup_connection_value(k->c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (reg ? !td_cluster_authorized(k->api->cfg.cluster, auth, peer, &e)
            : !td_cluster_node_authorized(k->api->cfg.cluster, auth, peer, from, &e))
        return td_api_error(k->c, &e, NULL);
    if (k->rq->too_large)
        return td_api_fail(k->c, 413, "body_too_large", NULL, "the request body is over the limit");
    td_buf out = {0};
    const char *body = k->rq->body.data ? k->rq->body.data : "";
    int rc = reg ? td_cluster_register(k->api->cfg.cluster, body, k->rq->body.len, td_clock_now(),
                                       peer, &out, &e)
                 : td_cluster_heartbeat(k->api->cfg.cluster, from, body, k->rq->body.len,
                                        td_clock_now(), &out, &e);
    if (rc != 0) {
        td_buf_free(&out);
        return td_api_error(k->c, &e, NULL);
    }
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}

enum MHD_Result td_api_cluster_register(const td_api_call *k) {
    return cluster_call(k, true);
}

enum MHD_Result td_api_cluster_heartbeat(const td_api_call *k) {
    return cluster_call(k, false);
}

/* GET /v1/cluster/files/{job}/{path} (PUT streams through handle) */
enum MHD_Result td_api_cluster_file(const td_api_call *k) {
    return td_api_file_get(k->api, k->c, k->url);
}

enum MHD_Result td_api_nodes(const td_api_call *k) {
    if (!k->api->cfg.cluster) return not_master(k);
    td_buf out = {0};
    json_t *users = td_jobs_gpu_users(k->api->jobs);
    td_cluster_list(k->api->cfg.cluster, td_clock_now(), td_jobs_slots_used(k->api->jobs), users,
                    &out);
    json_decref(users);
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}

/* POST /v1/nodes/{name}/drain and /undrain */
enum MHD_Result td_api_node_action(const td_api_call *k) {
    if (!k->api->cfg.cluster) return not_master(k);
    const char *slash = strchr(k->tail, '/');
    char name[64];
    bool drain = slash && strcmp(slash, "/drain") == 0;
    if (!slash || (!drain && strcmp(slash, "/undrain") != 0) || slash == k->tail ||
        (size_t)(slash - k->tail) >= sizeof name) {
        td_reply_error e;
        td_reply_fail(&e, 404, "not_found", NULL,
                      "no route %s (POST /v1/nodes/NAME/drain or /undrain)", k->url);
        return td_api_error(k->c, &e, NULL);
    }
    snprintf(name, sizeof name, "%.*s", (int)(slash - k->tail), k->tail);
    td_reply_error e;
    td_buf out = {0};
    if (td_cluster_drain(k->api->cfg.cluster, name, drain, td_clock_now(),
                         td_jobs_slots_used(k->api->jobs), &out, &e) != 0) {
        td_buf_free(&out);
        return td_api_error(k->c, &e, NULL);
    }
    return td_api_reply_buf(k->c, MHD_HTTP_OK, &out);
}
