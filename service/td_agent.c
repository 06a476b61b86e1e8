/* The agent thread (td_agent.h): register, heartbeat, retry, over libcurl. */
#include "service/td_agent.h"

#include "core/td_clock.h"
#include "dist/td_net.h"
#include "service/td_buf.h"
#include "service/td_log.h"
#include "service/td_cluster.h" /* TD_CLUSTER_PROTOCOL */

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { BACKOFF_MAX_S = 10 };

struct td_agent {
    td_agent_config cfg;
    char master[256], secret[256], name[64], node_id[65], address[64], version[32];
    char url_register[320], url_heartbeat[320], auth[300];
    pthread_mutex_t mu;
    pthread_cond_t wake; /* monotonic clock */
    pthread_t thread;
    bool started, stopping, refused;
    int (*slots_used)(void *ctx);
    void *ctx;
};

static size_t collect(char *p, size_t size, size_t n, void *ctx) {
    td_buf_append(ctx, p, size * n);
    return size * n;
}

/* POSTs body to url; the HTTP status (0 when no answer came, with why) and the reply. */
static long post(td_agent *a, const char *url, const char *body, td_buf *reply, char *why,
                 size_t why_len) {
    CURL *h = curl_easy_init();
    if (!h) {
        snprintf(why, why_len, "curl_easy_init failed");
        return 0;
    }
    struct curl_slist *hdr = curl_slist_append(NULL, "Content-Type: application/json");
    hdr = curl_slist_append(hdr, a->auth);
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
    curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
    curl_easy_setopt(h, CURLOPT_WRITEDATA, reply);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* a thread of a daemon: no SIGALRM */
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    long status = 0;
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else
        snprintf(why, why_len, "%s", err[0] ? err : curl_easy_strerror(rc));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return status;
}

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
        td_log_line(a->cfg.log, "the master at %s refused this node (HTTP %ld): %s", a->master,
                    status, msg);
    else /* a traind from before the cluster answers its routes as a user's */
        td_log_line(a->cfg.log,
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
    json_t *ro = json_pack("{s:i, s:s, s:s, s:s, s:i, s:i, s:s}", "protocol", TD_CLUSTER_PROTOCOL,
                           "name", a->name, "node_id", a->node_id, "address", a->address, "slots",
                           a->cfg.slots, "gpus", a->cfg.gpus, "version", a->version);
    char *reg = ro ? json_dumps(ro, JSON_COMPACT) : NULL;
    json_decref(ro);
    if (!reg) {
        td_log_line(a->cfg.log,
                    "cannot build the registration message (out of memory); not joining");
        return NULL;
    }
    bool joined = false, ever = false, unreachable = false;
    double heartbeat_s = 2, backoff = 1;
    for (;;) {
        td_buf reply = {0};
        char why[CURL_ERROR_SIZE + 64] = "";
        long status;
        if (!joined) {
            status = post(a, a->url_register, reg, &reply, why, sizeof why);
        } else {
            int used = a->slots_used ? a->slots_used(a->ctx) : 0;
            json_t *ho = json_pack("{s:s, s:s, s:i}", "name", a->name, "node_id", a->node_id,
                                   "slots_used", used);
            char *hb = ho ? json_dumps(ho, JSON_COMPACT) : NULL;
            json_decref(ho);
            status = hb ? post(a, a->url_heartbeat, hb, &reply, why, sizeof why) : 0;
            if (!hb) snprintf(why, sizeof why, "out of memory");
            free(hb);
        }
        if (status == 200) {
            json_t *o = json_loads(reply.data ? reply.data : "", 0, NULL);
            double h = json_number_value(json_object_get(o, "heartbeat_s"));
            json_decref(o);
            if (h > 0) heartbeat_s = h;
            if (!joined)
                td_log_line(
                    a->cfg.log,
                    "%s the cluster at %s as node %s (advertising %s; a heartbeat every %g s)",
                    ever ? "joined again" : "joined", a->master, a->name, a->address, heartbeat_s);
            else if (unreachable)
                td_log_line(a->cfg.log, "the master at %s answers again", a->master);
            joined = ever = true, unreachable = false, backoff = 1;
            td_buf_free(&reply);
            if (pause_for(a, heartbeat_s)) break;
            continue;
        }
        if (status == 404 && joined) { /* the master forgot this node: register again */
            char msg[512];
            error_message(&reply, msg, sizeof msg, NULL, 0);
            td_log_line(a->cfg.log, "the master at %s says: %s", a->master, msg);
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
            td_log_line(
                a->cfg.log,
                "cannot reach the master at %s: %s; retrying with back-off up to %d s%s", a->master,
                status ? msg : why, BACKOFF_MAX_S,
                status ? ""
                       : " (HINT: is the master running, and listening on an address this node "
                         "reaches? Its --listen defaults to 127.0.0.1)");
        }
        unreachable = true;
        joined = false; /* a master back from a restart knows no node: register */
        td_buf_free(&reply);
        if (pause_for(a, backoff)) break;
        backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
    }
    free(reg);
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
    snprintf(a->url_register, sizeof a->url_register, "http://%s/v1/cluster/register", a->master);
    snprintf(a->url_heartbeat, sizeof a->url_heartbeat, "http://%s/v1/cluster/heartbeat",
             a->master);
    snprintf(a->auth, sizeof a->auth, "Authorization: Cluster %s", a->secret);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->wake, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&a->mu, NULL);
    *out = a;
    return 0;
}

int td_agent_start(td_agent *a, int (*slots_used)(void *ctx), void *ctx, td_err *err) {
    a->slots_used = slots_used, a->ctx = ctx;
    int rc = pthread_create(&a->thread, NULL, agent_loop, a);
    if (rc != 0) return td_fail(err, "cannot start the agent thread: %s", strerror(rc));
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
    pthread_mutex_unlock(&a->mu);
    if (a->started) pthread_join(a->thread, NULL);
    pthread_cond_destroy(&a->wake);
    pthread_mutex_destroy(&a->mu);
    free(a);
}
