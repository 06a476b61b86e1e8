/* The master's node registry (td_cluster.h): joins, heartbeats, losses, the node listing. */
#include "service/cluster/td_cluster_private.h"

#include "base/td_clock.h"
#include "base/td_json.h"
#include "base/td_log.h"

#include <errno.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

static int drained_index(const td_cluster *c, const char *name) {
    for (int i = 0; i < c->n_drained; i++)
        if (strcmp(c->drained[i], name) == 0) return i;
    return -1;
}

static void add_drained(td_cluster *c, const char *name) {
    if (drained_index(c, name) >= 0) return;
    c->drained = td_realloc(c->drained, (size_t)(c->n_drained + 1) * sizeof *c->drained);
    snprintf(c->drained[c->n_drained++], NAME_LEN, "%s", name);
}

static void load_drained(void *ctx, const char *name) {
    add_drained(ctx, name);
}

int td_cluster_open(td_cluster **out, const td_cluster_config *cfg, td_err *err) {
    if (cfg->secret && strlen(cfg->secret) >= sizeof((td_cluster *)0)->secret)
        return td_fail(err, "the cluster secret is longer than 255 characters");
    td_cluster *c = td_calloc(1, sizeof *c);
    c->cfg = *cfg;
    snprintf(c->name, sizeof c->name, "%s", cfg->name);
    snprintf(c->address, sizeof c->address, "%s", cfg->address ? cfg->address : "");
    snprintf(c->version, sizeof c->version, "%s", cfg->version);
    c->has_secret = cfg->secret != NULL;
    if (cfg->secret) snprintf(c->secret, sizeof c->secret, "%s", cfg->secret);
    c->cfg.name = c->name, c->cfg.address = c->address, c->cfg.version = c->version;
    c->cfg.secret = NULL; /* kept in c->secret only */
    if (c->cfg.gpus > TD_GPUS_MAX) c->cfg.gpus = TD_GPUS_MAX;
    if (c->cfg.gpus > 0 && cfg->gpu) memcpy(c->gpu, cfg->gpu, (size_t)c->cfg.gpus * sizeof *c->gpu);
    for (int i = 0; i < c->cfg.gpus && !cfg->gpu; i++) c->gpu[i].index = i;
    c->cfg.gpu = c->gpu;
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&c->wake, &ca);
    pthread_condattr_destroy(&ca);
    pthread_mutex_init(&c->mu, NULL);
    pthread_mutex_init(&c->drain_mu, NULL);
    if (cfg->db && td_db_drained_nodes(cfg->db, load_drained, c, err) != 0) {
        td_cluster_close(c);
        return -1;
    }
    *out = c;
    return 0;
}

static void *sweep_loop(void *arg) {
    td_cluster *c = arg;
    /* a quarter of the timeout between sweeps: a loss is seen within 1.25 timeouts at worst */
    double every = c->cfg.timeout_s / 4 < 1.0 ? c->cfg.timeout_s / 4 : 1.0;
    pthread_mutex_lock(&c->mu);
    while (!c->stopping) {
        struct timespec ts;
        td_clock_deadline(&ts, every);
        pthread_cond_timedwait(&c->wake, &c->mu, &ts);
        if (c->stopping) break;
        pthread_mutex_unlock(&c->mu);
        td_cluster_sweep(c, td_clock_now());
        pthread_mutex_lock(&c->mu);
    }
    pthread_mutex_unlock(&c->mu);
    return NULL;
}

int td_cluster_start(td_cluster *c, td_err *err) {
    int rc = pthread_create(&c->sweeper, NULL, sweep_loop, c);
    if (rc != 0) return td_fail(err, "cannot start the cluster's sweeper thread: %s", strerror(rc));
    c->started = true;
    return 0;
}

void td_cluster_close(td_cluster *c) {
    if (!c) return;
    if (c->started) {
        pthread_mutex_lock(&c->mu);
        c->stopping = true;
        pthread_cond_broadcast(&c->wake);
        pthread_mutex_unlock(&c->mu);
        pthread_join(c->sweeper, NULL);
    }
    pthread_cond_destroy(&c->wake);
    pthread_mutex_destroy(&c->mu);
    pthread_mutex_destroy(&c->drain_mu);
    free(c->nodes);
    free(c->drained);
    free(c);
}

/* ---- messages ------------------------------------------------------------------------------- */

/* Reads a message's body as a JSON object; 400 in e otherwise. */
static json_t *parse_body(const char *body, size_t len, td_reply_error *e) {
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!o) {
        td_reply_fail(e, 400, "bad_request", NULL, "line %d, column %d: %s", je.line, je.column,
                      je.text);
        return NULL;
    }
    if (!json_is_object(o)) {
        json_decref(o);
        td_reply_fail(e, 400, "bad_request", NULL, "expected a JSON object");
        return NULL;
    }
    return o;
}

/* The node's identity from a message: name and node_id, checked. */
static int read_identity(json_t *o, char *name, char *id, td_reply_error *e) {
    td_err err = {{0}};
    if (td_json_string(o, "", "name", true, "", name, 64, &err) != 0 ||
        td_json_string(o, "", "node_id", true, "", id, 65, &err) != 0)
        return td_reply_fail(e, 400, "bad_request", NULL, "%s", err.msg);
    if (!td_cluster_name_ok(name))
        return td_reply_fail(e, 400, "bad_request", "name",
                             "name \"%s\": expected 1 to 63 letters, digits, '.', '_' or '-'",
                             name);
    if (strlen(id) < 8)
        return td_reply_fail(e, 400, "bad_request", "node_id",
                             "node_id: expected 8 to 64 characters");
    return 0;
}

static void put_json(td_buf *out, json_t *o);

static json_t *reply_registered(td_cluster *c) {
    return json_pack("{s:f, s:f, s:s, s:s}", "heartbeat_s", c->cfg.heartbeat_s, "timeout_s",
                     c->cfg.timeout_s, "master", c->name, "version", c->version);
}

/* After a register or heartbeat is accepted: the jobs read the node's report (the parts it runs,
 * their output) and add their orders to the reply. */
static void sync_jobs(td_cluster *c, const char *name, bool registered, json_t *msg, json_t *reply,
                      td_buf *out) {
    pthread_mutex_lock(&c->mu);
    td_cluster_sync_fn on_sync = c->on_sync;
    void *ctx = c->jobs_ctx;
    pthread_mutex_unlock(&c->mu);
    if (on_sync) on_sync(ctx, name, registered, msg, reply);
    put_json(out, reply);
}

int td_cluster_register(td_cluster *c, const char *body, size_t len, double now, const char *peer,
                        td_buf *out, td_reply_error *e) {
    json_t *o = parse_body(body, len, e);
    if (!o) return -1;
    static const char *const KEYS[] = {"protocol", "name",    "node_id",    "address", "slots",
                                       "gpus",     "version", "slots_used", "parts",   NULL};
    node n = {0};
    long protocol = 0, slots = 0, used = 0;
    td_err err = {{0}};
    int rc = -1;
    if (td_json_int(o, "", "protocol", true, 0, 0, 1 << 20, &protocol, &err) != 0) {
        td_reply_fail(e, 400, "bad_request", "protocol", "%s", err.msg);
        goto done;
    }
    if (protocol != TD_CLUSTER_PROTOCOL) {
        td_reply_fail(e, 400, "protocol_version", "protocol",
                      "the agent speaks cluster protocol %ld, this master (traind %s) speaks %d: "
                      "run the same traind version on every node",
                      protocol, c->version, TD_CLUSTER_PROTOCOL);
        td_log_at(c->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE,
                  "refused an agent: it speaks cluster protocol %ld, this master %d", protocol,
                  TD_CLUSTER_PROTOCOL);
        goto done;
    }
    if (td_json_check_keys(o, "", KEYS, &err) != 0 ||
        td_json_string(o, "", "address", true, "", n.address, sizeof n.address, &err) != 0 ||

        td_json_int(o, "", "slots", true, 0, 1, 4096, &slots, &err) != 0 ||
        td_gpus_from_json(json_object_get(o, "gpus"), "gpus", n.gpu, &n.gpus, &err) != 0 ||
        td_json_int(o, "", "slots_used", false, 0, 0, 4096, &used, &err) != 0) {
        td_reply_fail(e, 400, "bad_request", NULL, "%s", err.msg);
        goto done;
    }
    if (td_json_string(o, "", "version", true, "", n.version, sizeof n.version, &err) != 0) {
        td_reply_fail(e, 400, "bad_request", "version", "%s (at most %zu characters)", err.msg,
                      sizeof n.version - 1);
        goto done;
    }
    if (read_identity(o, n.name, n.node_id, e) != 0 ||
        td_cluster_address_ok(n.address, peer, e) != 0 || td_cluster_strings_ok(&n, e) != 0)
        goto done;
    unsigned char raw[32];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
        td_reply_fail(e, 500, "internal", NULL, "no random bytes for the node's credential");
        goto done;
    }
    for (size_t i = 0; i < sizeof raw; i++) snprintf(n.credential + 2 * i, 3, "%02x", raw[i]);
    /* slots_used: a node registering again may still be stopping what an ended attempt ran */
    n.slots = (int)slots, n.slots_used = (int)used;
    if (n.gpus > 0 && n.gpus != n.slots) {
        td_reply_fail(e, 400, "bad_request", "gpus",
                      "slots %d but %d GPUs: a node with GPUs has one slot per GPU", n.slots,
                      n.gpus);
        goto done;
    }
    n.last_seen = now, n.last_wall = td_clock_wall();
    pthread_mutex_lock(&c->mu);
    node *old = td_cluster_find(c, n.name);
    if (strcmp(n.name, c->name) == 0 || (old && !old->lost && strcmp(old->node_id, n.node_id))) {
        const char *where = old ? old->address : c->address;
        td_reply_fail(e, 409, "duplicate_node", "name",
                      "a node named \"%s\" is already in the cluster (at %s): give this node "
                      "another --node-name, or stop the other one",
                      n.name, where);
        td_log_at(c->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE,
                  "refused node %s from %s: the name is taken by the node at %s", n.name, n.address,
                  where);
    } else {
        if (!old && c->n == MAX_NODES) {
            td_reply_fail(e, 503, "cluster_full", NULL,
                          "the cluster has %d nodes, the most it takes", MAX_NODES);
        } else {
            if (!old) {
                if (c->n == c->cap) {
                    c->cap = c->cap ? 2 * c->cap : 16;
                    c->nodes = td_realloc(c->nodes, (size_t)c->cap * sizeof *c->nodes);
                }
                old = &c->nodes[c->n++];
                char gpus[512] = "";
                td_gpus_describe(n.gpu, n.gpus, gpus, sizeof gpus);
                td_log_at(c->cfg.log, TD_LOG_INFO, TD_LOG_NODE(n.name),
                          "node %s joined from %s: %d %s slot%s%s%s, traind %s", n.name, n.address,
                          n.slots, n.gpus > 0 ? "GPU" : "CPU", n.slots == 1 ? "" : "s",
                          n.gpus > 0 ? ": " : "", gpus, n.version);
            } else if (old->lost) {
                td_log_at(c->cfg.log, TD_LOG_INFO, TD_LOG_NODE(n.name),
                          "node %s is back from %s after %.1f s lost%s", n.name, n.address,
                          now - old->lost_since,
                          strcmp(old->node_id, n.node_id) ? " (a new node id)" : "");
            } else {
                td_log_at(c->cfg.log, TD_LOG_INFO, TD_LOG_NODE(n.name),
                          "node %s registered again from %s", n.name, n.address);
            }
            *old = n;
            rc = 0;
        }
    }
    pthread_mutex_unlock(&c->mu);
    if (rc == 0) {
        json_t *reply = reply_registered(c);
        json_object_set_new(reply, "credential", json_string(n.credential));
        sync_jobs(c, n.name, true, o, reply, out);
    }
    explicit_bzero(n.credential, sizeof n.credential);
done:
    json_decref(o);
    return rc;
}

int td_cluster_heartbeat(td_cluster *c, const char *from, const char *body, size_t len, double now,
                         td_buf *out, td_reply_error *e) {
    json_t *o = parse_body(body, len, e);
    if (!o) return -1;
    char name[64], id[65];
    long used = 0;
    td_err err = {{0}};
    int rc = -1;
    if (read_identity(o, name, id, e) != 0) goto done;
    if (strcmp(name, from) != 0) { /* what a node reports is its own only */
        td_reply_fail(e, 403, "forbidden", "name", "node %s's credential cannot speak for node %s",
                      from, name);
        goto done;
    }
    if (td_json_int(o, "", "slots_used", false, 0, 0, 4096, &used, &err) != 0) {
        td_reply_fail(e, 400, "bad_request", "slots_used", "%s", err.msg);
        goto done;
    }
    pthread_mutex_lock(&c->mu);
    node *n = td_cluster_find(c, name);
    if (!n || strcmp(n->node_id, id) != 0 || n->lost) {
        td_reply_fail(e, 404, "unknown_node", NULL, "node %s is not registered%s: register again",
                      name, n && n->lost ? " (the master marked it lost)" : "");
    } else {
        n->last_seen = now, n->last_wall = td_clock_wall();
        n->slots_used = (int)used;
        rc = 0;
    }
    pthread_mutex_unlock(&c->mu);
    if (rc == 0) sync_jobs(c, name, false, o, reply_registered(c), out);
done:
    json_decref(o);
    return rc;
}

int td_cluster_sweep(td_cluster *c, double now) {
    int lost = 0;
    char(*names)[NAME_LEN] = NULL;
    double *silent = NULL;
    pthread_mutex_lock(&c->mu);
    for (int i = 0; i < c->n; i++) {
        node *n = &c->nodes[i];
        if (n->lost || now - n->last_seen < c->cfg.timeout_s) continue;
        n->lost = true;
        n->lost_since = now;
        names = td_realloc(names, (size_t)(lost + 1) * sizeof *names);
        silent = td_realloc(silent, (size_t)(lost + 1) * sizeof *silent);
        snprintf(names[lost], NAME_LEN, "%s", n->name);
        silent[lost++] = now - n->last_seen;
        td_log_at(c->cfg.log, TD_LOG_WARNING, TD_LOG_NODE(n->name),
                  "node %s (%s) lost: no heartbeat for %.1f s (timeout %g s)", n->name, n->address,
                  now - n->last_seen, c->cfg.timeout_s);
    }
    td_cluster_lost_fn on_lost = c->on_lost;
    void *ctx = c->jobs_ctx;
    pthread_mutex_unlock(&c->mu);
    for (int i = 0; i < lost && on_lost; i++) {
        char why[192];
        snprintf(why, sizeof why, "node %s was lost: no heartbeat for %.1f s (timeout %g s)",
                 names[i], silent[i], c->cfg.timeout_s);
        on_lost(ctx, names[i], why);
    }
    free(names);
    free(silent);
    return lost;
}

void td_cluster_on_jobs(td_cluster *c, td_cluster_sync_fn sync, td_cluster_lost_fn lost,
                        void *ctx) {
    pthread_mutex_lock(&c->mu);
    c->on_sync = sync, c->on_lost = lost, c->jobs_ctx = ctx;
    pthread_mutex_unlock(&c->mu);
}

int td_cluster_snapshot(td_cluster *c, td_cluster_node **out) {
    double now = td_clock_now();
    pthread_mutex_lock(&c->mu);
    td_cluster_node *v = td_calloc((size_t)c->n + 1, sizeof *v);
    snprintf(v[0].name, sizeof v[0].name, "%s", c->name);
    snprintf(v[0].address, sizeof v[0].address, "%s", c->address);
    v[0].slots = c->cfg.slots;
    v[0].master = true;
    v[0].drained = drained_index(c, c->name) >= 0;
    for (int i = 0; i < c->n; i++) {
        const node *n = &c->nodes[i];
        td_cluster_node *d = &v[i + 1];
        snprintf(d->name, sizeof d->name, "%s", n->name);
        snprintf(d->address, sizeof d->address, "%s", n->address);
        d->slots = n->slots, d->reported_used = n->slots_used;
        d->lost = n->lost;
        d->stale = now - n->last_seen > 2.5 * c->cfg.heartbeat_s;
        d->drained = drained_index(c, n->name) >= 0;
    }
    int n = c->n + 1;
    pthread_mutex_unlock(&c->mu);
    *out = v;
    return n;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const node *)a)->name, ((const node *)b)->name);
}

static json_t *node_json(const node *n, const char *role, bool drained, double now,
                         const json_t *gpu_users) {
    json_t *gpus = td_gpus_json(n->gpu, n->gpus);
    json_t *users = json_object_get(gpu_users, n->name);
    for (int i = 0; gpu_users && i < n->gpus; i++) { /* not known: left out */
        char key[16];
        snprintf(key, sizeof key, "%d", n->gpu[i].index);
        json_t *u = json_object_get(users, key);
        json_object_set_new(json_array_get(gpus, (size_t)i), "used_by",
                            u ? json_deep_copy(u) : json_null());
    }
    const char *state = n->lost ? "lost" : drained ? "draining" : "ready";
    return json_pack("{s:s, s:s, s:s, s:s, s:{s:i, s:i}, s:o, s:s, s:f, s:f}", "name", n->name,
                     "role", role, "address", n->address, "state", state, "slots", "total",
                     n->slots, "used", n->slots_used, "gpus", gpus, "version", n->version,
                     "last_heartbeat", n->last_wall, "seconds_since_heartbeat", now - n->last_seen);
}

/* The master's own entry: always heard from, by definition. */
static node master_node(const td_cluster *c, double now, int used) {
    node self = {.slots = c->cfg.slots,
                 .slots_used = used,
                 .gpus = c->cfg.gpus,
                 .last_seen = now,
                 .last_wall = td_clock_wall()};
    memcpy(self.gpu, c->gpu, (size_t)c->cfg.gpus * sizeof *self.gpu);
    snprintf(self.name, sizeof self.name, "%s", c->name);
    snprintf(self.address, sizeof self.address, "%s", c->address);
    snprintf(self.version, sizeof self.version, "%s", c->version);
    return self;
}

static void put_json(td_buf *out, json_t *o) {
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    td_buf_puts(out, text ? text : "{}");
    td_buf_puts(out, "\n");
    free(text);
    json_decref(o);
}

void td_cluster_list(td_cluster *c, double now, int master_used, const json_t *gpu_users,
                     td_buf *out) {
    node self = master_node(c, now, master_used);
    json_t *list = json_array();
    pthread_mutex_lock(&c->mu);
    json_array_append_new(
        list, node_json(&self, "master", drained_index(c, c->name) >= 0, now, gpu_users));
    if (c->n > 1) qsort(c->nodes, (size_t)c->n, sizeof *c->nodes, by_name); /* nodes is NULL at 0 */
    for (int i = 0; i < c->n; i++)
        json_array_append_new(list,
                              node_json(&c->nodes[i], "agent",
                                        drained_index(c, c->nodes[i].name) >= 0, now, gpu_users));
    pthread_mutex_unlock(&c->mu);
    put_json(out, json_pack("{s:o}", "nodes", list));
}

bool td_cluster_is_master(const td_cluster *c, const char *name) {
    return strcmp(c->name, name) == 0;
}

bool td_cluster_drained(td_cluster *c, const char *name) {
    pthread_mutex_lock(&c->mu);
    bool d = drained_index(c, name) >= 0;
    pthread_mutex_unlock(&c->mu);
    return d;
}

/* Whether name is a node (the master or one that joined). Under c->mu. */
static bool known(td_cluster *c, const char *name) {
    return td_cluster_is_master(c, name) || td_cluster_find(c, name) != NULL;
}

int td_cluster_drain(td_cluster *c, const char *name, bool drain, double now, int master_used,
                     td_buf *out, td_reply_error *e) {
    /* drains one at a time, the database written outside c->mu: heartbeats and the sweeper
     * never wait for SQLite */
    pthread_mutex_lock(&c->drain_mu);
    pthread_mutex_lock(&c->mu);
    bool ok = known(c, name), change = ok && drain != (drained_index(c, name) >= 0);
    pthread_mutex_unlock(&c->mu);
    int rc = 0;
    td_err err = {{0}};
    if (!ok) {
        rc = td_reply_fail(e, 404, "not_found", NULL,
                           "no node named \"%s\" in the cluster (GET /v1/nodes lists them)", name);
    } else if (change && c->cfg.db && td_db_set_drained(c->cfg.db, name, drain, &err) != 0) {
        rc = td_reply_fail(e, 503, "unavailable", NULL, "%s", err.msg);
    } else {
        pthread_mutex_lock(&c->mu);
        bool self = td_cluster_is_master(c, name);
        if (change) {
            int at = drained_index(c, name);
            if (drain) {
                add_drained(c, name);
            } else if (at >= 0) {
                memmove(c->drained + at, c->drained + at + 1,
                        (size_t)(c->n_drained - at - 1) * sizeof *c->drained);
                c->n_drained--;
            }
            td_log_at(c->cfg.log, TD_LOG_INFO, TD_LOG_NODE(name), "node %s %s", name,
                      drain ? "drained: no new jobs start there; running ones go on" : "undrained");
        }
        node self_node = master_node(c, now, master_used),
             *n = self ? &self_node : td_cluster_find(c, name);
        json_t *o = n ? node_json(n, self ? "master" : "agent", drain, now, NULL) : NULL;
        pthread_mutex_unlock(&c->mu);
        /* the master's queue follows under drain_mu, so the two never disagree; not under mu:
         * the queue reads the registry with its own lock held */
        if (change && self && c->on_master_drain) c->on_master_drain(c->drain_ctx, drain);
        put_json(out, o);
    }
    pthread_mutex_unlock(&c->drain_mu);
    return rc;
}

void td_cluster_on_master_drain(td_cluster *c, void (*fn)(void *ctx, bool drained), void *ctx) {
    pthread_mutex_lock(&c->drain_mu);
    pthread_mutex_lock(&c->mu);
    c->on_master_drain = fn, c->drain_ctx = ctx;
    bool drained = drained_index(c, c->name) >= 0;
    pthread_mutex_unlock(&c->mu);
    if (fn) fn(ctx, drained);
    pthread_mutex_unlock(&c->drain_mu);
}
