/* The store server runs on a thread of rank 0's process, one thread per connected rank (a few
 * hundred at most), over a table guarded by one mutex; a GET for a missing key waits on the
 * table's condition variable. Messages: request = op (1 byte), key length (4), key, value
 * length (8), value; reply = status (1 byte: 0 ok, 1 error), length (8), payload. */
#include "td_store.h"

#include "td_net.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { OP_HELLO = 1, OP_SET, OP_GET, OP_ADD };

#define MAX_KEY     4096
#define MAX_VALUE   (64u << 20)
#define MAX_CLIENTS 1024

typedef struct entry {
    char *key;
    uint8_t *value;
    size_t len;
} entry;

typedef struct server {
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
} server;

struct td_store {
    server *srv; /* rank 0 only */
    int fd;
    int port;
    char namespace_[256];
    double timeout_s;
    bool broken; /* a reply was lost to a timeout: the stream is out of step */
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
        s->table = realloc(s->table, (size_t)(s->n_entries + 1) * sizeof *s->table);
        TD_ASSERT(s->table != NULL, "out of memory in the rendezvous store");
        e = &s->table[s->n_entries++];
        e->key = strdup(key);
        e->value = NULL;
    }
    free(e->value);
    e->value = malloc(len ? len : 1);
    TD_ASSERT(e->value && e->key, "out of memory in the rendezvous store");
    memcpy(e->value, value, len);
    e->len = len;
    pthread_cond_broadcast(&s->changed);
}

static int reply(int fd, uint8_t status, const void *data, size_t len) {
    uint8_t head[9];
    head[0] = status;
    for (int i = 0; i < 8; i++) head[1 + i] = (uint8_t)((uint64_t)len >> (8 * i));
    double deadline = td_net_now() + 60.0;
    if (td_net_send_all(fd, head, 9, deadline, NULL) != 0) return -1;
    return td_net_send_all(fd, data, len, deadline, NULL);
}

typedef struct client_arg {
    server *srv;
    int fd;
} client_arg;

/* Serves one rank until it disconnects or the server stops. */
static void *serve_client(void *p) {
    client_arg *a = p;
    server *s = a->srv;
    int fd = a->fd;
    free(a);
    uint8_t *value = NULL;
    char *key = NULL;
    for (;;) {
        uint8_t op, lenbuf[8];
        uint32_t klen = 0;
        uint64_t vlen = 0;
        double forever = td_net_now() + 1e9; /* ranks may idle between calls for hours */
        if (td_net_recv_all(fd, &op, 1, forever, NULL) != 0) break;
        if (td_net_recv_all(fd, lenbuf, 4, forever, NULL) != 0) break;
        for (int i = 0; i < 4; i++) klen |= (uint32_t)lenbuf[i] << (8 * i);
        if (klen > MAX_KEY) break;
        key = realloc(key, klen + 1);
        if (td_net_recv_all(fd, key, klen, forever, NULL) != 0) break;
        key[klen] = 0;
        if (td_net_recv_all(fd, lenbuf, 8, forever, NULL) != 0) break;
        for (int i = 0; i < 8; i++) vlen |= (uint64_t)lenbuf[i] << (8 * i);
        if (vlen > MAX_VALUE) break;
        value = realloc(value, vlen ? vlen : 1);
        if (td_net_recv_all(fd, value, vlen, forever, NULL) != 0) break;
        int rc = 0;
        pthread_mutex_lock(&s->lock);
        if (op == OP_HELLO) {
            bool ok = strcmp(key, s->namespace_) == 0;
            char msg[600];
            snprintf(msg, sizeof msg, "this store serves \"%s\", not \"%s\"", s->namespace_, key);
            pthread_mutex_unlock(&s->lock);
            rc = ok ? reply(fd, 0, NULL, 0) : reply(fd, 1, msg, strlen(msg));
            if (!ok) break;
        } else if (op == OP_SET) {
            put(s, key, value, vlen);
            pthread_mutex_unlock(&s->lock);
            rc = reply(fd, 0, NULL, 0);
        } else if (op == OP_GET) {
            entry *e;
            while (!(e = find(s, key)) && !s->stopping) pthread_cond_wait(&s->changed, &s->lock);
            if (!e) {
                pthread_mutex_unlock(&s->lock);
                break;
            }
            size_t len = e->len;
            uint8_t *copy = malloc(len ? len : 1);
            TD_ASSERT(copy != NULL, "out of memory in the rendezvous store");
            memcpy(copy, e->value, len);
            pthread_mutex_unlock(&s->lock);
            rc = reply(fd, 0, copy, len);
            free(copy);
        } else if (op == OP_ADD && vlen == 8) {
            int64_t delta = 0, cur = 0;
            memcpy(&delta, value, 8);
            entry *e = find(s, key);
            if (e && e->len == 8) memcpy(&cur, e->value, 8);
            cur += delta;
            put(s, key, (uint8_t *)&cur, 8);
            pthread_mutex_unlock(&s->lock);
            rc = reply(fd, 0, &cur, 8);
        } else {
            pthread_mutex_unlock(&s->lock);
            break;
        }
        if (rc != 0) break;
    }
    free(key);
    free(value);
    return NULL;
}

static void *accept_loop(void *p) {
    server *s = p;
    for (;;) {
        int fd;
        td_err err;
        if (td_net_accept(s->listen_fd, td_net_now() + 0.2, &fd, &err) != 0) {
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
        client_arg *a = malloc(sizeof *a);
        TD_ASSERT(a != NULL, "out of memory in the rendezvous store");
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

static void server_stop(server *s) {
    pthread_mutex_lock(&s->lock);
    s->stopping = true;
    pthread_cond_broadcast(&s->changed);
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
    pthread_mutex_destroy(&s->lock);
    pthread_cond_destroy(&s->changed);
    free(s);
}

/* ---- client -------------------------------------------------------------------------- */

static int call(td_store *st, uint8_t op, const char *key, const void *value, size_t len,
                void **out, size_t *out_len, td_err *err) {
    if (st->broken)
        return td_fail(err, "rendezvous store: an earlier call timed out; the connection is no "
                            "longer usable");
    char full[MAX_KEY];
    if (op == OP_HELLO)
        snprintf(full, sizeof full, "%s", key);
    else
        snprintf(full, sizeof full, "%s/%s", st->namespace_, key);
    uint32_t klen = (uint32_t)strlen(full);
    uint8_t head[1 + 4], vl[8];
    head[0] = op;
    for (int i = 0; i < 4; i++) head[1 + i] = (uint8_t)(klen >> (8 * i));
    for (int i = 0; i < 8; i++) vl[i] = (uint8_t)((uint64_t)len >> (8 * i));
    double deadline = td_net_now() + st->timeout_s;
    if (td_net_send_all(st->fd, head, 5, deadline, err) != 0 ||
        td_net_send_all(st->fd, full, klen, deadline, err) != 0 ||
        td_net_send_all(st->fd, vl, 8, deadline, err) != 0 ||
        td_net_send_all(st->fd, value, len, deadline, err) != 0)
        goto lost;
    uint8_t rh[9];
    if (td_net_recv_all(st->fd, rh, 9, deadline, err) != 0) goto lost;
    uint64_t rlen = 0;
    for (int i = 0; i < 8; i++) rlen |= (uint64_t)rh[1 + i] << (8 * i);
    if (rlen > MAX_VALUE) {
        td_fail(err, "rendezvous store: implausible reply of %llu bytes", (unsigned long long)rlen);
        goto lost;
    }
    uint8_t *data = malloc(rlen + 1);
    TD_ASSERT(data != NULL, "out of memory");
    if (td_net_recv_all(st->fd, data, rlen, deadline, err) != 0) {
        free(data);
        goto lost;
    }
    data[rlen] = 0;
    if (rh[0] != 0) {
        td_fail(err, "rendezvous store refused: %s", (char *)data);
        free(data);
        return -1;
    }
    if (out) {
        *out = data;
        if (out_len) *out_len = rlen;
    } else {
        free(data);
    }
    return 0;
lost:
    st->broken = true;
    return td_fail_prefix(err, "rendezvous store at port %d, key \"%s\"", st->port, key);
}

int td_store_open(td_store **out, const char *host, int port, bool host_server,
                  const char *namespace_, double timeout_s, td_err *err) {
    td_store *st = td_calloc(1, sizeof *st);
    st->fd = -1;
    st->timeout_s = timeout_s;
    snprintf(st->namespace_, sizeof st->namespace_, "%s", namespace_);
    if (host_server) {
        server *s = td_calloc(1, sizeof *s);
        if (td_net_listen(host, &port, &s->listen_fd, err) != 0) {
            free(s);
            free(st);
            return td_fail_prefix(err, "rendezvous store");
        }
        snprintf(s->namespace_, sizeof s->namespace_, "%s", namespace_);
        pthread_mutex_init(&s->lock, NULL);
        pthread_cond_init(&s->changed, NULL);
        TD_ASSERT(pthread_create(&s->accept_thread, NULL, accept_loop, s) == 0,
                  "cannot start the rendezvous store thread");
        st->srv = s;
    }
    st->port = port;
    if (td_net_connect(host, port, td_net_now() + timeout_s, &st->fd, err) != 0 ||
        call(st, OP_HELLO, namespace_, NULL, 0, NULL, NULL, err) != 0) {
        td_fail_prefix(err, "rendezvous with %s:%d", host, port);
        td_store_close(st);
        return -1;
    }
    *out = st;
    return 0;
}

int td_store_port(const td_store *s) {
    return s->port;
}

void td_store_set_timeout(td_store *s, double timeout_s) {
    s->timeout_s = timeout_s;
}

void td_store_close(td_store *s) {
    if (!s) return;
    if (s->fd >= 0) close(s->fd);
    if (s->srv) server_stop(s->srv);
    free(s);
}

int td_store_set(td_store *s, const char *key, const void *value, size_t len, td_err *err) {
    return call(s, OP_SET, key, value, len, NULL, NULL, err);
}

int td_store_get(td_store *s, const char *key, void **value, size_t *len, td_err *err) {
    return call(s, OP_GET, key, NULL, 0, value, len, err);
}

int td_store_add(td_store *s, const char *key, int64_t delta, int64_t *result, td_err *err) {
    void *out;
    if (call(s, OP_ADD, key, &delta, 8, &out, NULL, err) != 0) return -1;
    if (result) memcpy(result, out, 8);
    free(out);
    return 0;
}

int td_store_barrier(td_store *s, const char *name, int count, td_err *err) {
    char key[512], done[600];
    snprintf(key, sizeof key, "barrier/%s", name);
    snprintf(done, sizeof done, "%s/done", key);
    int64_t arrived;
    if (td_store_add(s, key, 1, &arrived, err) != 0) return -1;
    if (arrived == count && td_store_set(s, done, "1", 1, err) != 0) return -1;
    void *v;
    if (td_store_get(s, done, &v, NULL, err) != 0)
        return td_fail_prefix(err, "barrier \"%s\" (%lld of %d ranks arrived when this one did)",
                              name, (long long)arrived, count);
    free(v);
    return 0;
}
