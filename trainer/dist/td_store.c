/* The rendezvous store's client side (td_store.h); the server, hosted by rank 0, is in
 * td_store_server.c, the messages in td_store_private.h. */
#define _GNU_SOURCE /* gethostname */
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
#include <time.h>
#include <unistd.h>

struct td_store {
    td_store_server *srv; /* rank 0 only */
    int fd;
    int port;
    char namespace_[256];
    int rank, world; /* -1, 0: anonymous */
    double timeout_s;
    bool broken;  /* a reply was lost to a timeout: the stream is out of step */
    bool refused; /* the last call was refused (REPLY_REFUSED) */
};

/* ---- client -------------------------------------------------------------------------- */
static int call(td_store *st, uint8_t op, const char *key, const void *value, size_t len,
                void **out, size_t *out_len, td_err *err) {
    st->refused = false;
    if (st->broken)
        return td_fail(err, "rendezvous store: an earlier call timed out; the connection is no "
                            "longer usable");
    char full[MAX_KEY];
    if (op == OP_HELLO || op == OP_READY || op == OP_ABORT)
        snprintf(full, sizeof full, "%s", key);
    else
        snprintf(full, sizeof full, "%s/%s", st->namespace_, key);
    uint32_t klen = (uint32_t)strlen(full);
    uint8_t head[1 + 4], vl[8];
    head[0] = op;
    for (int i = 0; i < 4; i++) head[1 + i] = (uint8_t)(klen >> (8 * i));
    for (int i = 0; i < 8; i++) vl[i] = (uint8_t)((uint64_t)len >> (8 * i));
    double deadline = td_clock_now() + st->timeout_s;
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
    uint8_t *data = td_malloc(rlen + 1);
    if (td_net_recv_all(st->fd, data, rlen, deadline, err) != 0) {
        free(data);
        goto lost;
    }
    data[rlen] = 0;
    if (rh[0] != REPLY_OK) {
        st->refused = rh[0] == REPLY_REFUSED;
        td_fail(err, "%s: %s", st->refused ? "rendezvous store refused" : "rendezvous failed",
                (char *)data);
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

/* HELLO's value: who this client is, for the server's checks and errors ("" if anonymous). */
static void introduce(const td_store *st, char *out, size_t len) {
    if (st->rank < 0) {
        out[0] = 0;
        return;
    }
    char host[64];
    if (gethostname(host, sizeof host) != 0 || !host[0]) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    for (char *p = host; *p; p++)
        if (*p == ' ') *p = '_';
    snprintf(out, len, "%d %d %d %s", st->rank, st->world, (int)getpid(), host);
}

int td_store_open_rank(td_store **out, const char *host, int port, bool host_server,
                       const char *namespace_, int rank, int world, double timeout_s, td_err *err) {
    td_store *st = td_calloc(1, sizeof *st);
    st->fd = -1;
    st->rank = rank;
    st->world = world;
    st->timeout_s = timeout_s;
    snprintf(st->namespace_, sizeof st->namespace_, "%s", namespace_);
    if (host_server && td_store_server_start(&st->srv, host, &port, namespace_, err) != 0) {
        free(st);
        return -1;
    }
    st->port = port;
    char me[128];
    introduce(st, me, sizeof me);
    if (td_net_connect(host, port, td_clock_now() + timeout_s, &st->fd, err) != 0 ||
        call(st, OP_HELLO, namespace_, me, strlen(me), NULL, NULL, err) != 0) {
        td_fail_prefix(err, "rendezvous with %s:%d", host, port);
        td_store_close(st);
        return -1;
    }
    *out = st;
    return 0;
}

int td_store_open(td_store **out, const char *host, int port, bool host_server,
                  const char *namespace_, double timeout_s, td_err *err) {
    return td_store_open_rank(out, host, port, host_server, namespace_, -1, 0, timeout_s, err);
}

int td_store_port(const td_store *s) {
    return s->port;
}

void td_store_set_timeout(td_store *s, double timeout_s) {
    s->timeout_s = timeout_s;
}

void td_store_close(td_store *s) {
    if (!s) return;
    /* the server first: rank 0's own connection closing is then no "disconnected" failure, and
     * ranks still waiting hear why rank 0 left */
    if (s->srv) td_store_server_stop(s->srv);
    if (s->fd >= 0) close(s->fd);
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

int td_store_ready(td_store *s, int rank, int world, td_err *err) {
    char text[64];
    snprintf(text, sizeof text, "%d %d", rank, world);
    return call(s, OP_READY, s->namespace_, text, strlen(text), NULL, NULL, err);
}

void td_store_abort(td_store *s, const char *why) {
    td_err ignored;
    double timeout = s->timeout_s;
    s->timeout_s = timeout < 5.0 ? timeout : 5.0; /* the store may be gone with rank 0 */
    call(s, OP_ABORT, s->namespace_, why, strlen(why), NULL, NULL, &ignored);
    s->timeout_s = timeout;
}

int td_store_abort_at(const char *host, int port, const char *namespace_, const char *why,
                      double timeout_s, bool *failed, td_err *err) {
    td_store st = {.fd = -1, .port = port, .rank = -1, .timeout_s = timeout_s};
    snprintf(st.namespace_, sizeof st.namespace_, "%s", namespace_);
    *failed = false;
    if (td_net_connect(host, port, td_clock_now() + timeout_s, &st.fd, err) != 0)
        return td_fail_prefix(err, "rendezvous store at %s:%d", host, port);
    int rc = call(&st, OP_ABORT, namespace_, why, strlen(why), NULL, NULL, err);
    close(st.fd);
    *failed = rc == 0;
    return rc == 0 || st.refused ? 0 : -1;
}
