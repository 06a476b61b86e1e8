/* Inside the agent (td_agent.h), shared by its files:
 *   td_agent.c        the agent thread: register, heartbeat, retry; starting and stopping
 *   td_agent_http.c   its requests to the master, over libcurl
 *   td_agent_mover.c  the mover thread: checkpoints up to the master and down for a resume */
#ifndef TD_AGENT_PRIVATE_H
#define TD_AGENT_PRIVATE_H

#include "service/agent/td_agent.h"

#include "base/td_buf.h"
#include "service/jobs/td_jobs.h"

#include <jansson.h>
#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>

/* how often a node running parts talks to its master: their lines and exits go up, stop orders
 * come down, within this */
static const double BUSY_INTERVAL_S = 0.25;

struct td_agent {
    td_agent_config cfg;
    char master[256], secret[256], name[64], node_id[65], address[64], version[32];
    char url_register[320], url_heartbeat[320], url_files[320], auth[300], state_dir[4096];
    /* "Authorization: Node NAME:CREDENTIAL": what the master gave at the last registration,
     * for heartbeats and files ("" until it registered); the secret (auth) only registers */
    char node_auth[200];
    char tls_ca[4096];            /* "": plain HTTP to the master */
    td_node_gpu gpu[TD_GPUS_MAX]; /* cfg.gpus of them (cfg.gpu is the caller's) */
    pthread_mutex_t mu;
    pthread_cond_t wake; /* monotonic clock */
    pthread_t thread, mover;
    bool started, stopping, refused;
    /* checkpoints to fetch before a part starts, by "job/attempt": {"job", "resume", "ready"};
     * the mover thread moves files so that heartbeats never wait for a transfer (a node whose
     * heartbeats stopped for a big checkpoint would be marked lost) */
    json_t *fetches;
    pthread_cond_t moved;
    double fetch_limit_s; /* how long a failing fetch may go on: the master's node timeout */
    td_jobs *jobs;
};

/* POSTs body to url; the HTTP status (0 when no answer came, with why) and the reply. */
long td_agent_post(td_agent *a, const char *url, const char *body, td_buf *reply, char *why,
                   size_t why_len);
/* Moves one file to or from the master (PUT when up); the HTTP status, 0 with why when none
 * came, and the master's words when it is not 200. */
long td_agent_transfer(td_agent *a, const char *url, FILE *f, long long size, bool up, char *why,
                       size_t why_len);
/* The master's orders, less the parts whose checkpoint the mover has not fetched yet, applied. */
void td_agent_take_orders(td_agent *a, json_t *orders);
/* The mover thread (arg: the agent). */
void *td_agent_mover_loop(void *arg);

#endif
