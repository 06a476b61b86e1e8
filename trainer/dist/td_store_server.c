/* The rendezvous store's server (td_store.h, td_store_private.h): it runs on threads of rank 0's
 * process, one per connected rank (a few hundred at most), over a table guarded by one mutex; a
 * GET for a missing key waits on the table's condition variable, and so does every GET while the
 * rendezvous can still fail: failing it is one broadcast. */
#define _GNU_SOURCE /* strsignal */
#include "dist/td_store_private.h"

#include "dist/td_dist.h"
#include "dist/td_net.h"

#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

typedef struct td_store_server server;

typedef struct entry {
    char *key;
    uint8_t *value;
    size_t len;
} entry;

/* Who a client is, from its HELLO: "<rank> <world> <pid> <host>". rank -1: anonymous. */
typedef struct member {
    int rank, world, pid;
    char host[64];
} member;

struct td_store_server {
    int listen_fd;
    char namespace_[256];
    pthread_t accept_thread;
    pthread_mutex_t lock;
    pthread_cond_t changed;
    bool stopping;
    entry *table;
    int n_entries;
    int clients[MAX_CLIENTS];
    pthread_t threads[MAX_CLIENTS];
    int n_clients;

    /* the rendezvous: until complete, failed[] can be set once and then answers every call */
    char failed[768];
    bool complete; /* every rank is ready: the job has begun and nothing fails it any more */
    int world;     /* named by the first rank that said; 0: none yet */
    member first;  /* that rank, to name when another says otherwise */
    member *ranks; /* [world] who joined as each rank (rank -1: no one yet) */
    bool *ready;   /* [world] */
    int n_ready;
    int waiting; /* requests being handled or answered: server_stop lets them answer first */
};

/* ---- server -------------------------------------------------------------------------- */
static entry *find(server *s, const char *key) {
    for (int i = 0; i < s->n_entries; i++)
        if (strcmp(s->table[i].key, key) == 0) return &s->table[i];
    return NULL;
}

static void put(server *s, const char *key, const uint8_t *value, size_t len) {
    entry *e = find(s, key);
    if (!e) {
        s->table = td_realloc(s->table, (size_t)(s->n_entries + 1) * sizeof *s->table);
        e = &s->table[s->n_entries++];
        e->key = td_strdup(key);
        e->value = NULL;
    }
    free(e->value);
    e->value = td_malloc(len);
    memcpy(e->value, value, len);
    e->len = len;
    pthread_cond_broadcast(&s->changed);
}

static int reply(int fd, uint8_t status, const void *data, size_t len) {
    uint8_t head[9];
    head[0] = status;
    for (int i = 0; i < 8; i++) head[1 + i] = (uint8_t)((uint64_t)len >> (8 * i));
    double deadline = td_clock_now() + 60.0;
    if (td_net_send_all(fd, head, 9, deadline, NULL) != 0) return -1;
    return td_net_send_all(fd, data, len, deadline, NULL);
}

/* "rank 3 (host n2, pid 4711)": what an error says about a client. */
typedef struct who_text {
    char s[128];
} who_text;

static who_text who(const member *m) {
    who_text w;
    if (m->rank < 0)
        snprintf(w.s, sizeof w.s, "a client");
    else if (m->pid <= 0)
        snprintf(w.s, sizeof w.s, "rank %d", m->rank);
    else
        snprintf(w.s, sizeof w.s, "rank %d (host %s, pid %d)", m->rank, m->host, m->pid);
    return w;
}

static member parse_member(const uint8_t *value, size_t len) {
    member m = {.rank = -1};
    char text[128];
    if (len == 0 || len >= sizeof text) return m;
    memcpy(text, value, len);
    text[len] = 0;
    if (sscanf(text, "%d %d %d %63s", &m.rank, &m.world, &m.pid, m.host) != 4 || m.rank < 0 ||
        m.world < 1 || m.rank >= m.world)
        m.rank = -1;
    return m;
}

/* The run id: the namespace up to its last TD_DIST_ATTEMPT (all of it if it has none). */
static int run_len(const char *ns) {
    int len = (int)strlen(ns);
    for (const char *p = ns; (p = strstr(p, TD_DIST_ATTEMPT)); p++) len = (int)(p - ns);
    return len;
}

/* Fails the rendezvous (lock held), unless it failed already or is complete. */
static void fail_locked(server *s, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static void fail_locked(server *s, const char *fmt, ...) {
    if (s->complete || s->failed[0]) return;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->failed, sizeof s->failed, fmt, ap);
    va_end(ap);
    pthread_cond_broadcast(&s->changed);
}

/* What the serving thread sends back for one request. */
typedef struct answer {
    uint8_t status;
    uint8_t *data; /* malloc'd, or NULL */
    size_t len;
    bool silent;  /* no reply (the server is stopping) */
    bool hang_up; /* close the connection after the reply */
} answer;

static void say(answer *a, uint8_t status, const char *text) {
    a->status = status;
    a->len = strlen(text);
    a->data = (uint8_t *)td_strdup(text);
}

/* A client that cannot be part of this job: it is told why and dropped, and the rendezvous
 * fails with the same words if it still can (once the job has begun, only this client goes). */
static void misfit(server *s, answer *a, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void misfit(server *s, answer *a, const char *fmt, ...) {
    char msg[sizeof s->failed];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    fail_locked(s, "%s", msg);
    say(a, REPLY_FAILED, msg);
    a->hang_up = true;
}

/* The first rank to name the world size sets it; another size is a configuration error. */
static bool same_world(server *s, const member *m, answer *a) {
    if (s->world == 0) {
        s->world = m->world;
        s->first = *m;
        s->ranks = td_calloc((size_t)m->world, sizeof *s->ranks);
        s->ready = td_calloc((size_t)m->world, sizeof *s->ready);
        for (int i = 0; i < m->world; i++) s->ranks[i].rank = -1;
    }
    if (m->world == s->world) return true;
    misfit(s, a,
           "%s was started with WORLD_SIZE %d but %s with %d: give every node the same --nnodes "
           "and --nproc-per-node",
           who(m).s, m->world, who(&s->first).s, s->world);
    return false;
}

/* One connection as its serving thread knows it. */
typedef struct conn {
    member me;  /* from its HELLO; rank -1: anonymous */
    bool ready; /* it called td_store_ready: leaving no longer fails the rendezvous */
} conn;

static void hello(server *s, conn *c, const char *ns, const uint8_t *value, size_t len, answer *a) {
    member m = parse_member(value, len);
    if (strcmp(ns, s->namespace_) != 0) {
        int mine = run_len(s->namespace_), theirs = run_len(ns);
        if (mine == theirs && strncmp(ns, s->namespace_, (size_t)mine) == 0) {
            char msg[600]; /* a stale process of an earlier attempt: only it is turned away */
            snprintf(msg, sizeof msg, "this store serves \"%s\", not \"%.255s\"", s->namespace_,
                     ns);
            say(a, REPLY_REFUSED, msg);
            a->hang_up = true;
            return;
        }
        misfit(s, a,
               "%s belongs to run \"%.*s\" but this store serves run \"%.*s\": give every node "
               "the same --run-id, or none (traind-run then derives it from --master-addr and "
               "--master-port)",
               who(&m).s, theirs, ns, mine, s->namespace_);
        return;
    }
    if (s->failed[0]) {
        say(a, REPLY_FAILED, s->failed);
        a->hang_up = true;
        return;
    }
    if (m.rank >= 0) {
        if (!same_world(s, &m, a)) return;
        member *taken = &s->ranks[m.rank];
        if (taken->rank >= 0) {
            misfit(s, a,
                   "%s and %s both joined as rank %d: give every node its own --node-rank (0 to "
                   "--nnodes - 1)",
                   who(taken).s, who(&m).s, m.rank);
            return;
        }
        *taken = m;
        c->me = m;
    }
    a->status = REPLY_OK;
}

static void ready(server *s, conn *c, const uint8_t *value, size_t len, answer *a) {
    int rank = -1, world = 0;
    char text[64];
    if (len < sizeof text) {
        memcpy(text, value, len);
        text[len] = 0;
        if (sscanf(text, "%d %d", &rank, &world) != 2) rank = -1;
    }
    if (rank < 0 || world < 1 || rank >= world) {
        a->hang_up = a->silent = true; /* not our protocol */
        return;
    }
    member m = c->me.rank == rank ? c->me : (member){.rank = rank, .world = world};
    if (!same_world(s, &m, a)) return;
    if (s->ranks[rank].rank < 0) s->ranks[rank] = m;
    if (!s->ready[rank]) {
        s->ready[rank] = true;
        if (++s->n_ready == s->world) s->complete = true;
    }
    c->ready = true;
    a->status = REPLY_OK;
}

static void abort_rendezvous(server *s, conn *c, const char *ns, const uint8_t *value, size_t len,
                             answer *a) {
    if (strcmp(ns, s->namespace_) != 0) {
        char msg[600];
        snprintf(msg, sizeof msg, "this store serves \"%s\", not \"%.255s\"", s->namespace_, ns);
        say(a, REPLY_REFUSED, msg);
        return;
    }
    if (s->complete || s->failed[0]) { /* too late, or too: the ranks know why already */
        say(a, REPLY_REFUSED, s->complete ? "every rank had joined: the job has begun" : s->failed);
        return;
    }
    int n = len > 600 ? 600 : (int)len;
    if (c->me.rank >= 0)
        fail_locked(s, "%s failed before every rank had joined: %.*s", who(&c->me).s, n,
                    (const char *)value);
    else
        fail_locked(s, "%.*s", n, (const char *)value);
    a->status = REPLY_OK;
}

static void get(server *s, const char *key, answer *a) {
    entry *e;
    while (!(e = find(s, key)) && !s->failed[0] && !s->stopping)
        pthread_cond_wait(&s->changed, &s->lock);
    if (e) {
        a->status = REPLY_OK;
        a->len = e->len;
        a->data = td_malloc(e->len);
        memcpy(a->data, e->value, e->len);
    } else if (s->failed[0]) {
        say(a, REPLY_FAILED, s->failed);
    } else {
        a->hang_up = a->silent = true;
    }
}

/* One request, lock held. */
static void handle(server *s, conn *c, uint8_t op, const char *key, const uint8_t *value,
                   size_t len, answer *a) {
    if (op == OP_HELLO) {
        hello(s, c, key, value, len, a);
    } else if (op == OP_ABORT) {
        abort_rendezvous(s, c, key, value, len, a);
    } else if (s->failed[0] && op >= OP_SET && op <= OP_READY) {
        say(a, REPLY_FAILED, s->failed);
    } else if (op == OP_READY) {
        ready(s, c, value, len, a);
    } else if (op == OP_SET) {
        put(s, key, value, len);
        a->status = REPLY_OK;
    } else if (op == OP_GET) {
        get(s, key, a);
    } else if (op == OP_ADD && len == 8) {
        int64_t delta = 0, cur = 0;
        memcpy(&delta, value, 8);
        entry *e = find(s, key);
        if (e && e->len == 8) memcpy(&cur, e->value, 8);
        cur += delta;
        put(s, key, (uint8_t *)&cur, 8);
        a->status = REPLY_OK;
        a->len = 8;
        a->data = td_malloc(8);
        memcpy(a->data, &cur, 8);
    } else {
        a->hang_up = a->silent = true;
    }
}

typedef struct client_arg {
    server *srv;
    int fd;
} client_arg;

/* Serves one rank until it disconnects or the server stops. */
static void *serve_client(void *p) {
    client_arg *arg = p;
    server *s = arg->srv;
    int fd = arg->fd;
    free(arg);
    conn c = {.me = {.rank = -1}};
    uint8_t *value = NULL;
    char *key = NULL;
    for (;;) {
        uint8_t op, lenbuf[8];
        uint32_t klen = 0;
        uint64_t vlen = 0;
        double forever = td_clock_now() + 1e9; /* ranks may idle between calls for hours */
        if (td_net_recv_all(fd, &op, 1, forever, NULL) != 0) break;
        if (td_net_recv_all(fd, lenbuf, 4, forever, NULL) != 0) break;
        for (int i = 0; i < 4; i++) klen |= (uint32_t)lenbuf[i] << (8 * i);
        if (klen > MAX_KEY) break;
        key = td_realloc(key, klen + 1);
        if (td_net_recv_all(fd, key, klen, forever, NULL) != 0) break;
        key[klen] = 0;
        if (td_net_recv_all(fd, lenbuf, 8, forever, NULL) != 0) break;
        for (int i = 0; i < 8; i++) vlen |= (uint64_t)lenbuf[i] << (8 * i);
        if (vlen > MAX_VALUE) break;
        value = td_realloc(value, vlen);
        if (td_net_recv_all(fd, value, vlen, forever, NULL) != 0) break;
        answer a = {0};
        /* counted until the reply is out: a failure this request causes (a misfit) makes
         * rank 0 stop the server, which must not shut this connection before its answer says
         * why */
        pthread_mutex_lock(&s->lock);
        s->waiting++;
        handle(s, &c, op, key, value, vlen, &a);
        pthread_mutex_unlock(&s->lock);
        int rc = a.silent ? 0 : reply(fd, a.status, a.data, a.len);
        free(a.data);
        pthread_mutex_lock(&s->lock);
        s->waiting--;
        pthread_cond_broadcast(&s->changed);
        pthread_mutex_unlock(&s->lock);
        if (rc != 0 || a.hang_up) break;
    }
    pthread_mutex_lock(&s->lock);
    if (c.me.rank >= 0 && !c.ready && !s->stopping)
        fail_locked(s, "%s disconnected before every rank had joined (did it crash? see its log)",
                    who(&c.me).s);
    pthread_mutex_unlock(&s->lock);
    free(key);
    free(value);
    return NULL;
}

static void *accept_loop(void *p) {
    server *s = p;
    for (;;) {
        int fd;
        td_err err;
        if (td_net_accept(s->listen_fd, td_clock_now() + 0.2, &fd, &err) != 0) {
            pthread_mutex_lock(&s->lock);
            bool stop = s->stopping;
            pthread_mutex_unlock(&s->lock);
            if (stop) return NULL;
            continue; /* a quiet interval: check for shutdown and wait again */
        }
        pthread_mutex_lock(&s->lock);
        if (s->stopping || s->n_clients == MAX_CLIENTS) {
            pthread_mutex_unlock(&s->lock);
            close(fd);
            if (s->stopping) return NULL;
            continue;
        }
        client_arg *a = td_malloc(sizeof *a);
        a->srv = s;
        a->fd = fd;
        int k = s->n_clients;
        if (pthread_create(&s->threads[k], NULL, serve_client, a) != 0) {
            free(a);
            close(fd);
        } else {
            s->clients[s->n_clients++] = fd;
        }
        pthread_mutex_unlock(&s->lock);
    }
}

void td_store_server_stop(server *s) {
    pthread_mutex_lock(&s->lock);
    if (s->world > 0) /* a job's rank 0 leaving early (with an error, or told to stop) */
        fail_locked(s, "%s, which hosts the store, left before every rank had joined (see its log)",
                    s->ranks[0].rank == 0 ? who(&s->ranks[0]).s : "rank 0");
    s->stopping = true;
    pthread_cond_broadcast(&s->changed);
    /* the requests in hand (a GET waiting, a misfit saying why) answer before their connections
     * go (bounded: one may be stuck sending to a rank that stopped reading) */
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 2;
    while (s->waiting > 0)
        if (pthread_cond_timedwait(&s->changed, &s->lock, &until) == ETIMEDOUT) break;
    for (int i = 0; i < s->n_clients; i++) shutdown(s->clients[i], SHUT_RDWR);
    pthread_mutex_unlock(&s->lock);
    pthread_join(s->accept_thread, NULL);
    for (int i = 0; i < s->n_clients; i++) {
        pthread_join(s->threads[i], NULL);
        close(s->clients[i]);
    }
    close(s->listen_fd);
    for (int i = 0; i < s->n_entries; i++) {
        free(s->table[i].key);
        free(s->table[i].value);
    }
    free(s->table);
    free(s->ranks);
    free(s->ready);
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->changed);
    free(s);
}

int td_store_server_start(server **out, const char *host, int *port, const char *namespace_,
                          td_err *err) {
    server *s = td_calloc(1, sizeof *s);
    if (td_net_listen(host, port, &s->listen_fd, err) != 0) {
        free(s);
        return td_fail_prefix(err, "rendezvous store");
    }
    snprintf(s->namespace_, sizeof s->namespace_, "%s", namespace_);
    pthread_mutex_init(&s->lock, NULL);
    pthread_cond_init(&s->changed, NULL);
    TD_ASSERT(pthread_create(&s->accept_thread, NULL, accept_loop, s) == 0,
              "cannot start the rendezvous store thread");
    *out = s;
    return 0;
}
