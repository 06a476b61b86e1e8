/* Who may speak to the master (td_cluster.h): the cluster secret admits a node, the
 * credential it is given then signs its calls, and what a registration claims is checked. */
#include "service/cluster/td_cluster_private.h"

#include "base/td_clock.h"
#include "base/td_log.h"

#include <arpa/inet.h>
#include <stdio.h>
#include <string.h>
#include <strings.h>

/* ---- authentication ------------------------------------------------------------------------- */

/* Whether to log a refusal of peer now: at most once per peer each 10 s, so that anyone who can
 * reach the port cannot flood the log without the secret. */
static bool log_refusal(td_cluster *c, const char *peer) {
    double now = td_clock_now();
    pthread_mutex_lock(&c->mu);
    int slot = 0;
    for (int i = 0; i < 16; i++) {
        if (strcmp(c->refused[i].peer, peer) == 0) {
            slot = i;
            break;
        }
        if (c->refused[i].at < c->refused[slot].at) slot = i; /* else the oldest */
    }
    bool log = strcmp(c->refused[slot].peer, peer) != 0 || now - c->refused[slot].at >= 10;
    if (log)
        snprintf(c->refused[slot].peer, sizeof c->refused[slot].peer, "%s", peer),
            c->refused[slot].at = now;
    pthread_mutex_unlock(&c->mu);
    return log;
}

/* a and b equal, in constant time in a's length */
static bool same_secret(const char *a, const char *b) {
    size_t n = strlen(a), m = strlen(b);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(a[i] ^ (i < m ? b[i] : 0));
    return diff == 0;
}

bool td_cluster_authorized(td_cluster *c, const char *authorization, const char *peer,
                           td_reply_error *e) {
    if (!c->has_secret) {
        td_reply_fail(e, 403, "cluster_closed", NULL,
                      "this traind accepts no agents: start the master with "
                      "--cluster-secret-file FILE (the same file on every node)");
        if (log_refusal(c, peer))
            td_log_at(c->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE,
                      "refused an agent from %s: this master has no cluster secret", peer);
        return false;
    }
    const char *given = "";
    if (authorization && strncasecmp(authorization, "Cluster ", 8) == 0) given = authorization + 8;
    /* constant time in the secret's length: a wrong guess takes as long whatever it shares */
    size_t m = strlen(given);
    if (same_secret(c->secret, given)) return true;
    if (log_refusal(c, peer))
        td_log_at(c->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE,
                  "refused an agent from %s: %s cluster secret", peer,
                  m == 0 ? "missing" : "wrong");
    td_reply_fail(e, 401, "cluster_secret", NULL,
                  "%s cluster secret: every node's --cluster-secret-file must hold the master's "
                  "secret",
                  m == 0 ? "missing" : "wrong");
    return false;
}

bool td_cluster_node_authorized(td_cluster *c, const char *authorization, const char *peer,
                                char *node_name, td_reply_error *e) {
    char name[64] = "";
    const char *given = "";
    if (authorization && strncasecmp(authorization, "Node ", 5) == 0) {
        const char *colon = strchr(authorization + 5, ':');
        size_t k = colon ? (size_t)(colon - authorization - 5) : 0;
        if (colon && k > 0 && k < sizeof name) {
            memcpy(name, authorization + 5, k);
            name[k] = 0;
            given = colon + 1;
        }
    }
    pthread_mutex_lock(&c->mu);
    node *n = name[0] ? td_cluster_find(c, name) : NULL;
    bool ok = n && n->credential[0] && same_secret(n->credential, given); /* (lost: a 404 then) */
    pthread_mutex_unlock(&c->mu);
    if (ok) {
        snprintf(node_name, 64, "%s", name);
        return true;
    }
    if (log_refusal(c, peer))
        td_log_at(c->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE, "refused a node's call from %s: %s",
                  peer,
                  !name[0] ? "no node credential" : "a wrong node credential, or an unknown node");
    td_reply_fail(e, 401, "node_credential", NULL,
                  "%s: heartbeats and file transfers carry the credential the node was given "
                  "when it registered (Authorization: Node NAME:CREDENTIAL), not the shared "
                  "secret; register again",
                  !name[0] ? "no node credential" : "a wrong node credential, or an unknown node");
    return false;
}

node *td_cluster_find(td_cluster *c, const char *name) {
    for (int i = 0; i < c->n; i++)
        if (strcmp(c->nodes[i].name, name) == 0) return &c->nodes[i];
    return NULL;
}

bool td_cluster_name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 63) return false;
    for (size_t i = 0; i < n; i++)
        if (!(s[i] >= 'a' && s[i] <= 'z') && !(s[i] >= 'A' && s[i] <= 'Z') &&
            !(s[i] >= '0' && s[i] <= '9') && s[i] != '.' && s[i] != '_' && s[i] != '-')
            return false;
    return true;
}

/* Whether s is printable ASCII (what the node listing and the log show as it is). */
static bool printable(const char *s) {
    for (; *s; s++)
        if (*s < 0x20 || *s > 0x7e) return false;
    return true;
}

/* A node's advertised address: a unicast IPv4 address other nodes can reach it at (loopback
 * only from a node that is itself on loopback: a test, one host). -1 with 400 in e. */
int td_cluster_address_ok(const char *address, const char *peer, td_reply_error *e) {
    struct in_addr a, p;
    if (inet_pton(AF_INET, address, &a) != 1)
        return td_reply_fail(e, 400, "bad_request", "address",
                             "address \"%s\": expected the IPv4 address other nodes reach this "
                             "one at",
                             address);
    unsigned long ip = ntohl(a.s_addr);
    bool peer_loopback = inet_pton(AF_INET, peer, &p) == 1 && (ntohl(p.s_addr) >> 24) == 127;
    const char *why = ip == 0                               ? "the unspecified address"
                      : ip == 0xffffffffUL                  ? "the broadcast address"
                      : (ip >> 28) == 0xe                   ? "a multicast address"
                      : (ip >> 24) == 127 && !peer_loopback ? "a loopback address"
                                                            : NULL;
    if (!why) return 0;
    return td_reply_fail(e, 400, "bad_request", "address",
                         "address \"%s\" is %s: a node advertises a unicast address the other "
                         "nodes reach it at (--advertise)",
                         address, why);
}

/* What a node says of itself, beyond its address: printable, so that the listing and the log
 * show it as it is. */
int td_cluster_strings_ok(const node *n, td_reply_error *e) {
    if (!printable(n->version))
        return td_reply_fail(e, 400, "bad_request", "version",
                             "version: expected printable ASCII (a traind version)");
    for (int i = 0; i < n->gpus; i++)
        if (!printable(n->gpu[i].name)) {
            char field[32];
            snprintf(field, sizeof field, "gpus[%d].name", i);
            return td_reply_fail(e, 400, "bad_request", field,
                                 "%s: expected printable ASCII (a GPU's name)", field);
        }
    return 0;
}
