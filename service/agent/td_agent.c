/* The agent thread (td_agent.h): register, heartbeat, retry, over libcurl
 * (td_agent_http.c); the checkpoints a node's parts need move on a thread of their own
 * (td_agent_mover.c). */
#include "service/agent/td_agent_private.h"

#include "base/td_clock.h"
#include "dist/td_net.h"
#include "base/td_log.h"
#include "service/cluster/td_cluster.h" /* TD_CLUSTER_PROTOCOL */

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { BACKOFF_MAX_S = 10 };

/* The "message" of the master's JSON error, or the reply itself; its "code" in code. */
static void error_message(const td_buf *reply, char *out, size_t len, char *code, size_t code_len) {
    json_t *o = reply->data ? json_loads(reply->data, 0, NULL) : NULL;
    json_t *e = json_object_get(o, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    const char *c = json_string_value(json_object_get(e, "code"));
    snprintf(out, len, "%s", m ? m : reply->data ? reply->data : "(no reply)");
    out[strcspn(out, "\n")] = 0;
    if (code) snprintf(code, code_len, "%s", c ? c : "");
    json_decref(o);
}

/* Waits s seconds or until stopped; true when stopping. */
static bool pause_for(td_agent *a, double s) {
    struct timespec ts;
    td_clock_deadline(&ts, s);
    pthread_mutex_lock(&a->mu);
    while (!a->stopping && pthread_cond_timedwait(&a->wake, &a->mu, &ts) == 0) {
    }
    bool stop = a->stopping;
    pthread_mutex_unlock(&a->mu);
    return stop;
}

/* A refusal no retry cures: say so and end the daemon. */
static void refuse(td_agent *a, long status, const td_buf *reply) {
    char msg[1024], code[64];
    error_message(reply, msg, sizeof msg, code, sizeof code);
    static const char *const OURS[] = {"cluster_secret",   "cluster_closed", "duplicate_node",
                                       "protocol_version", "bad_request",    "not_master"};
    bool ours = false;
    for (size_t i = 0; i < sizeof OURS / sizeof *OURS; i++) ours |= strcmp(code, OURS[i]) == 0;
    if (ours)
        td_log_at(a->cfg.log, TD_LOG_ERROR, TD_LOG_NOWHERE,
                  "the master at %s refused this node (HTTP %ld): %s", a->master, status, msg);
    else /* a traind from before the cluster answers its routes as a user's */
        td_log_at(a->cfg.log, TD_LOG_ERROR, TD_LOG_NOWHERE,
                  "the master at %s does not speak the cluster protocol (HTTP %ld: %s): is it an "
                  "older traind? Run the same traind version on every node",
                  a->master, status, msg);
    pthread_mutex_lock(&a->mu);
    a->refused = true;
    pthread_mutex_unlock(&a->mu);
    kill(getpid(), SIGTERM);
}

static void *agent_loop(void *arg) {
    td_agent *a = arg;
    bool joined = false, ever = false, unreachable = false;
    double heartbeat_s = 2, timeout_s = 10, backoff = 1, last_ok = td_clock_now();
    for (;;) {
        td_buf reply = {0};
        char why[CURL_ERROR_SIZE + 64] = "";
        long status;
        /* (a checkpoint's line goes up only once the mover has uploaded its files) */
        json_t *msg = joined
                          ? json_pack("{s:s, s:s}", "name", a->name, "node_id", a->node_id)
                          : json_pack("{s:i, s:s, s:s, s:s, s:i, s:o, s:s}", "protocol",
                                      TD_CLUSTER_PROTOCOL, "name", a->name, "node_id", a->node_id,
                                      "address", a->address, "slots", a->cfg.slots, "gpus",
                                      td_gpus_json(a->gpu, a->cfg.gpus), "version", a->version);
        if (msg) json_object_set_new(msg, "slots_used", json_integer(td_jobs_slots_used(a->jobs)));
        if (msg) json_object_set_new(msg, "parts", td_jobs_node_parts_report_locked(a->jobs));
        char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
        json_decref(msg);
        if (text)
            status = td_agent_post(a, joined ? a->url_heartbeat : a->url_register, text, &reply,
                                   why, sizeof why);
        else
            status = 0, snprintf(why, sizeof why, "out of memory");
        free(text);
        if (status == 200) {
            json_t *o = json_loads(reply.data ? reply.data : "", 0, NULL);
            double h = json_number_value(json_object_get(o, "heartbeat_s"));
            double t = json_number_value(json_object_get(o, "timeout_s"));
            const char *cred = json_string_value(json_object_get(o, "credential"));
            if (!joined && cred) { /* this node's own from now on */
                pthread_mutex_lock(&a->mu);
                snprintf(a->node_auth, sizeof a->node_auth, "Authorization: Node %s:%s", a->name,
                         cred);
                pthread_mutex_unlock(&a->mu);
            }
            /* no "parts" at all (a master on its way out): no new orders, not "run nothing" */
            if (json_object_get(o, "parts")) td_agent_take_orders(a, json_object_get(o, "parts"));
            json_decref(o);
            last_ok = td_clock_now();
            if (h > 0) heartbeat_s = h;
            if (t > 0) timeout_s = t;
            pthread_mutex_lock(&a->mu);
            a->fetch_limit_s = timeout_s;
            pthread_mutex_unlock(&a->mu);
            if (!joined)
                td_log_at(
                    a->cfg.log, TD_LOG_INFO, TD_LOG_NOWHERE,
                    "%s the cluster at %s as node %s (advertising %s; a heartbeat every %g s)",
                    ever ? "joined again" : "joined", a->master, a->name, a->address, heartbeat_s);
            else if (unreachable)
                td_log_at(a->cfg.log, TD_LOG_INFO, TD_LOG_NOWHERE, "the master at %s answers again",
                          a->master);
            joined = ever = true, unreachable = false, backoff = 1;
            td_buf_free(&reply);
            bool busy = td_jobs_node_parts_running(a->jobs);
            if (pause_for(a, busy && BUSY_INTERVAL_S < heartbeat_s ? BUSY_INTERVAL_S : heartbeat_s))
                break;
            continue;
        }
        /* the master forgot this node (it restarted, or marked it lost), or no longer takes
         * its credential: register again */
        if ((status == 404 || status == 401) && joined) {
            char msg[512];
            error_message(&reply, msg, sizeof msg, NULL, 0);
            td_log_at(a->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE, "the master at %s says: %s",
                      a->master, msg);
            joined = false;
            td_buf_free(&reply);
            continue;
        }
        if (status == 400 || status == 401 || status == 403 || status == 409) {
            refuse(a, status, &reply);
            td_buf_free(&reply);
            break;
        }
        /* no answer, or one a retry may cure (5xx): back off */
        if (!unreachable) {
            char msg[512];
            if (status) error_message(&reply, msg, sizeof msg, NULL, 0);
            /* no answer at all: most often a master still on its default loopback address */
            td_log_at(a->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE,
                      "cannot reach the master at %s: %s; retrying with back-off up to %d s%s",
                      a->master, status ? msg : why, BACKOFF_MAX_S,
                      status
                          ? ""
                          : " (HINT: is the master running, and listening on an address this node "
                            "reaches? Its --listen defaults to 127.0.0.1)");
        }
        unreachable = true;
        joined = false; /* a master back from a restart knows no node: register */
        td_buf_free(&reply);
        if (td_clock_now() - last_ok >= timeout_s && td_jobs_node_parts_running(a->jobs)) {
            char stop_why[160];
            snprintf(stop_why, sizeof stop_why,
                     "this node has not reached its master for %.0f s (the node timeout): the "
                     "master has ended the attempt",
                     td_clock_now() - last_ok);
            td_jobs_node_parts_stop_all(a->jobs, stop_why);
        }
        /* cut off while running parts: try again soon, to stop them within the timeout */
        double wait = backoff;
        if (td_jobs_node_parts_running(a->jobs) && wait > timeout_s / 4) wait = timeout_s / 4;
        if (pause_for(a, wait)) break;
        backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
    }
    return NULL;
}

int td_agent_open(td_agent **out, const td_agent_config *cfg, td_err *err) {
    char host[256];
    const char *colon = strrchr(cfg->master, ':');
    long port = colon ? strtol(colon + 1, NULL, 10) : 0;
    if (!colon || colon == cfg->master || (size_t)(colon - cfg->master) >= sizeof host ||
        port < 1 || port > 65535)
        return td_fail(err, "--join \"%s\": expected the master's ADDR:PORT, e.g. 10.0.0.1:8470",
                       cfg->master);
    snprintf(host, sizeof host, "%.*s", (int)(colon - cfg->master), cfg->master);
    td_agent *a = td_calloc(1, sizeof *a);
    a->cfg = *cfg;
    a->fetch_limit_s = 10;
    if (a->cfg.gpus > TD_GPUS_MAX) a->cfg.gpus = TD_GPUS_MAX;
    for (int i = 0; i < a->cfg.gpus; i++)
        a->gpu[i] = cfg->gpu ? cfg->gpu[i] : (td_node_gpu){.index = i};
    a->cfg.gpu = a->gpu;
    if (cfg->advertise && *cfg->advertise)
        snprintf(a->address, sizeof a->address, "%s", cfg->advertise);
    else if (td_net_route_address(host, "the master (--join)", a->address, sizeof a->address,
                                  err) != 0) {
        free(a);
        return -1;
    }
    snprintf(a->master, sizeof a->master, "%s", cfg->master);
    snprintf(a->secret, sizeof a->secret, "%s", cfg->secret);
    snprintf(a->name, sizeof a->name, "%s", cfg->name);
    snprintf(a->node_id, sizeof a->node_id, "%s", cfg->node_id);
    snprintf(a->version, sizeof a->version, "%s", cfg->version);
    snprintf(a->tls_ca, sizeof a->tls_ca, "%s", cfg->tls_ca ? cfg->tls_ca : "");
    const char *scheme = a->tls_ca[0] ? "https" : "http";
    snprintf(a->url_register, sizeof a->url_register, "%s://%s/v1/cluster/register", scheme,
             a->master);
    snprintf(a->url_heartbeat, sizeof a->url_heartbeat, "%s://%s/v1/cluster/heartbeat", scheme,
             a->master);
    snprintf(a->url_files, sizeof a->url_files, "%s://%s/v1/cluster/files", scheme, a->master);
    snprintf(a->state_dir, sizeof a->state_dir, "%s", cfg->state_dir ? cfg->state_dir : ".");
    snprintf(a->auth, sizeof a->auth, "Authorization: Cluster %s", a->secret);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->wake, &ca);
    pthread_cond_init(&a->moved, &ca);
    pthread_condattr_destroy(&ca);
    a->fetches = json_object();
    pthread_mutex_init(&a->mu, NULL);
    *out = a;
    return 0;
}

int td_agent_start(td_agent *a, td_jobs *jobs, td_err *err) {
    a->jobs = jobs;
    int rc = pthread_create(&a->mover, NULL, td_agent_mover_loop, a);
    if (rc != 0) return td_fail(err, "cannot start the agent's file mover: %s", strerror(rc));
    rc = pthread_create(&a->thread, NULL, agent_loop, a);
    if (rc != 0) {
        pthread_mutex_lock(&a->mu);
        a->stopping = true;
        pthread_cond_broadcast(&a->moved);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->mover, NULL);
        return td_fail(err, "cannot start the agent thread: %s", strerror(rc));
    }
    a->started = true;
    return 0;
}

bool td_agent_refused(td_agent *a) {
    if (!a) return false;
    pthread_mutex_lock(&a->mu);
    bool r = a->refused;
    pthread_mutex_unlock(&a->mu);
    return r;
}

void td_agent_stop(td_agent *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stopping = true;
    pthread_cond_broadcast(&a->wake);
    pthread_cond_broadcast(&a->moved);
    pthread_mutex_unlock(&a->mu);
    if (a->started) {
        pthread_join(a->thread, NULL);
        pthread_join(a->mover, NULL);
    }
    json_decref(a->fetches);
    pthread_cond_destroy(&a->moved);
    pthread_cond_destroy(&a->wake);
    pthread_mutex_destroy(&a->mu);
    /* the secret and the node's credential, not left in freed memory */
    explicit_bzero(a->secret, sizeof a->secret);
    explicit_bzero(a->auth, sizeof a->auth);
    explicit_bzero(a->node_auth, sizeof a->node_auth);
    free(a);
}
