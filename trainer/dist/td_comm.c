#include "dist/td_comm.h"

#include "core/td_fault.h"
#include "dist/td_comm_private.h"
#include "dist/td_net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

const char *td_comm_who(const td_comm *c, int p) {
    return c->who && p >= 0 && p < c->world && c->who[p][0] ? c->who[p] : "host unknown";
}

/* Names the neighbour a failed transfer was with, and where it runs: the one error a user needs
 * to find the crashed or stuck rank. */
int td_comm_peer_fail(const td_comm *c, const td_comm_ring *ring, bool next, td_err *err) {
    int peer = next ? ring->next_rank : ring->prev_rank;
    return td_fail_prefix(err, "rank %d: peer rank %d (%s, %s, the %s rank in the %s)", c->rank,
                          peer, td_comm_who(c, peer), next ? ring->next_addr : ring->prev_addr,
                          next ? "next" : "previous", ring->name);
}

/* How long a ring connection may take to come. The clock starts once every rank has published
 * its node identity (td_comm_find_nodes waits for all of them), so every rank is joining the
 * ring by then and a healthy connection takes milliseconds. */
#define CONNECT_S 8.0

static void ring_clear(td_comm_ring *ring, const char *name) {
    memset(ring, 0, sizeof *ring);
    ring->name = name;
    ring->size = 1;
    ring->next_fd = ring->prev_fd = -1;
}

/* First half of joining a ring of the members [size] (global ranks in rank order, this rank
 * among them): listens and publishes the address under comm/<tag>/<rank>. Every ring's address
 * is published before any ring connects, so no rank waits on another's later step. */
static int ring_listen(td_comm *c, td_comm_ring *ring, const char *tag, const int *members,
                       int size, const char *host, int *listen_fd, td_err *err) {
    *listen_fd = -1;
    ring->size = size;
    for (int i = 0; i < size; i++)
        if (members[i] == c->rank) ring->pos = i;
    ring->next_rank = members[(ring->pos + 1) % size];
    ring->prev_rank = members[(ring->pos + size - 1) % size];
    if (size == 1) return 0;
    int port = 0;
    if (td_net_listen(host, &port, listen_fd, err) != 0)
        return td_fail_prefix(err, "rank %d: listening for the %s at the address it advertises",
                              c->rank, ring->name);
    char key[64];
    snprintf(ring->addr, sizeof ring->addr, "%s:%d", host, port);
    snprintf(key, sizeof key, "comm/%s/%d", tag, c->rank);
    return td_store_set(c->store, key, ring->addr, strlen(ring->addr) + 1, err);
}

/* Second half: connects to the next member and accepts the previous one, each bounded by
 * seconds rather than the collectives' timeout. Closes listen_fd. */
static int ring_connect(td_comm *c, td_comm_ring *ring, const char *tag, int listen_fd,
                        td_err *err) {
    if (ring->size == 1) return 0;
    char key[64], next_host[128];
    void *v;
    snprintf(key, sizeof key, "comm/%s/%d", tag, ring->next_rank);
    if (td_store_get(c->store, key, &v, NULL, err) != 0) goto fail;
    snprintf(ring->next_addr, sizeof ring->next_addr, "%s", (char *)v);
    free(v);
    snprintf(key, sizeof key, "comm/%s/%d", tag, ring->prev_rank);
    if (td_store_get(c->store, key, &v, NULL, err) != 0) goto fail;
    snprintf(ring->prev_addr, sizeof ring->prev_addr, "%s", (char *)v);
    free(v);
    char *colon = strrchr(ring->next_addr, ':');
    snprintf(next_host, sizeof next_host, "%.*s", (int)(colon - ring->next_addr), ring->next_addr);
    int next_port = atoi(colon + 1);
    /* A peer listens before it advertises, and both neighbours are past the exchange above:
     * a connection that does not come within seconds never will (an address the others cannot
     * reach), so it fails now, naming the address, not at the collectives' timeout. */
    double start = td_clock_now(), timeout_s = c->timeout_s;
    double connect_by = start + (timeout_s < CONNECT_S ? timeout_s : CONNECT_S);
    double accept_by = start + (timeout_s < CONNECT_S + 2 ? timeout_s : CONNECT_S + 2);
    if (td_net_connect(next_host, next_port, connect_by, &ring->next_fd, err) != 0) {
        close(listen_fd);
        return td_fail_prefix(err,
                              "rank %d: cannot reach rank %d at %s, the address it advertises for "
                              "the %s (if that host has an address this one can reach, give it "
                              "TRAIND_HOST or TRAIND_SOCKET_IFNAME)",
                              c->rank, ring->next_rank, ring->next_addr, ring->name);
    }
    int32_t me = c->rank, who = -1;
    double deadline = start + timeout_s;
    if (td_net_send_all(ring->next_fd, &me, 4, deadline, err) != 0) {
        close(listen_fd);
        return td_comm_peer_fail(c, ring, true, err);
    }
    if (td_net_accept(listen_fd, accept_by, &ring->prev_fd, err) != 0) {
        close(listen_fd);
        return td_fail_prefix(err,
                              "rank %d: rank %d never connected to %s, the address this rank "
                              "advertises for the %s (can it reach this host there? set "
                              "TRAIND_HOST or TRAIND_SOCKET_IFNAME)",
                              c->rank, ring->prev_rank, ring->addr, ring->name);
    }
    close(listen_fd);
    if (td_net_recv_all(ring->prev_fd, &who, 4, deadline, err) != 0)
        return td_comm_peer_fail(c, ring, false, err);
    if (who != ring->prev_rank)
        return td_fail(err, "rank %d: expected rank %d to connect in the %s, got %d", c->rank,
                       ring->prev_rank, ring->name, who);
    return 0;
fail:
    close(listen_fd);
    return -1;
}

int td_comm_init(td_comm **out, td_store *store, int rank, int world, const char *host,
                 const char *node, double timeout_s, td_err *err) {
    td_comm *c = td_calloc(1, sizeof *c);
    c->rank = rank;
    c->world = world;
    c->timeout_s = timeout_s;
    c->store = store;
    c->tmp = td_malloc(PIECE_FLOATS * sizeof(float));
    ring_clear(&c->ring, "ring");
    ring_clear(&c->leaders, "ring of node leaders");
    *out = c;
    if (world == 1) { /* a node of one */
        c->nodes = c->local_size = 1;
        c->local = td_calloc(1, sizeof(int));
        c->local[0] = rank;
        return 0;
    }
    if (td_comm_find_nodes(c, node, err) != 0) goto fail;
    int *everyone = td_calloc((size_t)world, sizeof(int)), *leaders = NULL;
    for (int p = 0; p < world; p++) everyone[p] = p;
    int ring_fd = -1, leaders_fd = -1, rc = -1;
    if (ring_listen(c, &c->ring, "addr", everyone, world, host, &ring_fd, err) != 0) goto done;
    /* several nodes: the first rank of each also joins a ring of the leaders (the all-reduce
     * of shared memory between nodes) */
    if (c->nodes > 1 && c->local_pos == 0) {
        leaders = td_calloc((size_t)c->nodes, sizeof(int));
        for (int p = 0, k = 0; p < world; p++)
            if (c->node_first[p] == p) leaders[k++] = p;
        if (ring_listen(c, &c->leaders, "leaders", leaders, c->nodes, host, &leaders_fd, err) != 0)
            goto done;
    }
    if (ring_connect(c, &c->ring, "addr", ring_fd, err) != 0) {
        ring_fd = -1;
        goto done;
    }
    ring_fd = -1;
    rc = ring_connect(c, &c->leaders, "leaders", leaders_fd, err);
    leaders_fd = -1;
done:
    if (ring_fd >= 0) close(ring_fd);
    if (leaders_fd >= 0) close(leaders_fd);
    free(everyone);
    free(leaders);
    if (rc == 0) return 0;
fail:
    return td_fail_prefix(err, "rank %d joining the ring of %d", rank, world);
}

void td_comm_abort(td_comm *c) {
    td_comm_ring *rings[2] = {&c->ring, &c->leaders};
    for (int i = 0; i < 2; i++) {
        if (rings[i]->next_fd >= 0) shutdown(rings[i]->next_fd, SHUT_RDWR);
        if (rings[i]->prev_fd >= 0) shutdown(rings[i]->prev_fd, SHUT_RDWR);
    }
}

void td_comm_close(td_comm *c) {
    if (!c) return;
    td_comm_ring *rings[2] = {&c->ring, &c->leaders};
    for (int i = 0; i < 2; i++) {
        if (rings[i]->next_fd >= 0) close(rings[i]->next_fd);
        if (rings[i]->prev_fd >= 0) close(rings[i]->prev_fd);
    }
    td_comm_free_regions(c);
    free(c->local);
    free(c->node_first);
    free(c->who);
    free(c->tmp);
    free(c);
}

void td_comm_segment(size_t n, int parts, int k, size_t *off, size_t *len) {
    size_t base = n / (size_t)parts, extra = n % (size_t)parts;
    *off = (size_t)k * base + ((size_t)k < extra ? (size_t)k : extra);
    *len = base + ((size_t)k < extra ? 1 : 0);
}

/* Sends send [send_len] to the next member while receiving recv [recv_len] (or adding into it)
 * from the previous one, piece by piece. */
static int step(td_comm *c, td_comm_ring *ring, const float *send, size_t send_len, float *recv,
                size_t recv_len, bool add, td_err *err) {
    size_t done_s = 0, done_r = 0;
    double now = td_clock_now(), deadline = now + c->timeout_s;
    if (c->ring_mark) atomic_store(c->ring_mark, (uint64_t)(now * 1e9)); /* for the node's ranks */
    while (done_s < send_len || done_r < recv_len) {
        size_t ps = send_len - done_s < PIECE_FLOATS ? send_len - done_s : PIECE_FLOATS;
        size_t pr = recv_len - done_r < PIECE_FLOATS ? recv_len - done_r : PIECE_FLOATS;
        float *into = add ? c->tmp : recv + done_r;
        bool recv_side;
        if (td_net_exchange(ring->next_fd, send + done_s, ps * sizeof(float), ring->prev_fd, into,
                            pr * sizeof(float), deadline, &recv_side, err) != 0)
            return td_comm_peer_fail(c, ring, !recv_side, err);
        if (add)
            for (size_t i = 0; i < pr; i++) recv[done_r + i] += c->tmp[i];
        done_s += ps;
        done_r += pr;
    }
    return 0;
}

int td_comm_ring_allreduce(td_comm *c, td_comm_ring *ring, float *buf, size_t n, td_err *err) {
    int w = ring->size, r = ring->pos;
    for (int s = 0; s < w - 1; s++) { /* reduce-scatter */
        size_t so, sl, ro, rl;
        td_comm_segment(n, w, (r - s + w) % w, &so, &sl);
        td_comm_segment(n, w, (r - s - 1 + 2 * w) % w, &ro, &rl);
        if (step(c, ring, buf + so, sl, buf + ro, rl, true, err) != 0) return -1;
        td_fault_at(TD_FAULT_ALLREDUCE); /* tests: a peer dying mid-collective (td_fault.h) */
    }
    for (int s = 0; s < w - 1; s++) { /* all-gather of the reduced segments */
        size_t so, sl, ro, rl;
        td_comm_segment(n, w, (r + 1 - s + w) % w, &so, &sl);
        td_comm_segment(n, w, (r - s + w) % w, &ro, &rl);
        if (step(c, ring, buf + so, sl, buf + ro, rl, false, err) != 0) return -1;
    }
    return 0;
}

static int allreduce(td_comm *c, float *buf, size_t n, bool average, td_err *err) {
    int w = c->world;
    td_comm_region *shared = w > 1 ? td_comm_region_of(c, buf, n) : NULL;
    if (shared) return td_comm_allreduce_shared(c, shared, buf, n, average, err);
    if (w > 1 && td_comm_ring_allreduce(c, &c->ring, buf, n, err) != 0) return -1;
    if (average) {
        float inv = 1.0f / (float)w;
        for (size_t i = 0; i < n; i++) buf[i] *= inv;
    }
    return 0;
}

int td_comm_allreduce(td_comm *c, float *buf, size_t n, bool average, td_err *err) {
    double t0 = td_clock_now();
    int rc = allreduce(c, buf, n, average, err);
    c->allreduce_s += td_clock_now() - t0;
    return rc;
}

void td_comm_times(const td_comm *c, double *allreduce_s, double *wait_s) {
    *allreduce_s = c->allreduce_s;
    *wait_s = c->wait_s;
}

int td_comm_broadcast(td_comm *c, float *buf, size_t n, int root, td_err *err) {
    int w = c->world;
    if (w == 1) return 0;
    bool receives = c->rank != root, forwards = (c->rank + 1) % w != root;
    double deadline = td_clock_now() + c->timeout_s;
    for (size_t off = 0; off < n; off += PIECE_FLOATS) {
        size_t len = n - off < PIECE_FLOATS ? n - off : PIECE_FLOATS;
        if (receives &&
            td_net_recv_all(c->ring.prev_fd, buf + off, len * sizeof(float), deadline, err) != 0)
            return td_comm_peer_fail(c, &c->ring, false, err);
        if (forwards &&
            td_net_send_all(c->ring.next_fd, buf + off, len * sizeof(float), deadline, err) != 0)
            return td_comm_peer_fail(c, &c->ring, true, err);
    }
    return 0;
}

int td_comm_allgather(td_comm *c, const float *mine, size_t n, float *all, td_err *err) {
    int w = c->world, r = c->rank;
    memcpy(all + (size_t)r * n, mine, n * sizeof(float));
    for (int s = 0; s < w - 1; s++) {
        int send_block = (r - s + w) % w, recv_block = (r - s - 1 + 2 * w) % w;
        if (step(c, &c->ring, all + (size_t)send_block * n, n, all + (size_t)recv_block * n, n,
                 false, err) != 0)
            return -1;
    }
    return 0;
}

/* world floats, not one: every ring step then carries a float in each direction, so a rank
 * in a barrier always writes to its neighbours, and one that meets a shared-memory all-reduce
 * there is told at once rather than at the timeout (td_comm_shm.c watches the sockets). */
int td_comm_barrier(td_comm *c, td_err *err) {
    float ones[c->world];
    for (int i = 0; i < c->world; i++) ones[i] = 1.0f;
    return td_comm_allreduce(c, ones, (size_t)c->world, false, err);
}
