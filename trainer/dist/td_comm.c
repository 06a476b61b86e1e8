#include "dist/td_comm.h"

#include "core/td_fault.h"
#include "dist/td_comm_private.h"
#include "dist/td_net.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int td_comm_rank(const td_comm *c) {
    return c->rank;
}
int td_comm_world(const td_comm *c) {
    return c->world;
}

/* Names the neighbour a failed transfer was with: the one error a user needs to find the
 * crashed or stuck rank. */
int td_comm_peer_fail(const td_comm *c, bool next, td_err *err) {
    int peer = (c->rank + (next ? 1 : c->world - 1)) % c->world;
    return td_fail_prefix(err, "rank %d: peer rank %d (%s, the %s rank in the ring)", c->rank, peer,
                          next ? c->next_addr : c->prev_addr, next ? "next" : "previous");
}

/* How long a ring connection may take to come, once both neighbours have published their
 * addresses. */
#define CONNECT_S 10.0

int td_comm_init(td_comm **out, td_store *store, int rank, int world, const char *host,
                 double timeout_s, td_err *err) {
    td_comm *c = td_calloc(1, sizeof *c);
    c->rank = rank;
    c->world = world;
    c->next_fd = c->prev_fd = -1;
    c->timeout_s = timeout_s;
    c->store = store;
    c->tmp = td_malloc(PIECE_FLOATS * sizeof(float));
    *out = c;
    if (world == 1) return 0;
    int port = 0, listen_fd;
    if (td_net_listen(host, &port, &listen_fd, err) != 0) goto fail;
    char key[64], addr[128];
    snprintf(addr, sizeof addr, "%s:%d", host, port);
    snprintf(key, sizeof key, "comm/addr/%d", rank);
    if (td_store_set(store, key, addr, strlen(addr) + 1, err) != 0) goto fail_listen;
    int next = (rank + 1) % world, prev = (rank + world - 1) % world;
    void *v;
    snprintf(key, sizeof key, "comm/addr/%d", next);
    if (td_store_get(store, key, &v, NULL, err) != 0) goto fail_listen;
    snprintf(c->next_addr, sizeof c->next_addr, "%s", (char *)v);
    free(v);
    snprintf(key, sizeof key, "comm/addr/%d", prev);
    if (td_store_get(store, key, &v, NULL, err) != 0) goto fail_listen;
    snprintf(c->prev_addr, sizeof c->prev_addr, "%s", (char *)v);
    free(v);
    char next_host[128];
    int next_port;
    char *colon = strrchr(c->next_addr, ':');
    snprintf(next_host, sizeof next_host, "%.*s", (int)(colon - c->next_addr), c->next_addr);
    next_port = atoi(colon + 1);
    /* A peer listens before it advertises, and both neighbours are past the exchange above:
     * a connection that does not come within seconds never will (an address the others cannot
     * reach), so it fails now, naming the address, not at the collectives' timeout. */
    double start = td_clock_now();
    double connect_by = start + (timeout_s < CONNECT_S ? timeout_s : CONNECT_S);
    double accept_by = start + (timeout_s < CONNECT_S + 5 ? timeout_s : CONNECT_S + 5);
    if (td_net_connect(next_host, next_port, connect_by, &c->next_fd, err) != 0) {
        close(listen_fd);
        return td_fail_prefix(err,
                              "rank %d: cannot reach rank %d at %s, the address it advertises (if "
                              "that host has an address this one can reach, give it TRAIND_HOST "
                              "or TRAIND_SOCKET_IFNAME)",
                              rank, next, c->next_addr);
    }
    int32_t me = rank, who = -1;
    double deadline = start + timeout_s;
    if (td_net_send_all(c->next_fd, &me, 4, deadline, err) != 0) {
        close(listen_fd);
        return td_comm_peer_fail(c, true, err);
    }
    if (td_net_accept(listen_fd, accept_by, &c->prev_fd, err) != 0) {
        close(listen_fd);
        return td_fail_prefix(err,
                              "rank %d: rank %d did not connect to %s:%d, the address this rank "
                              "advertises, within %.0f s (can it reach this host there? set "
                              "TRAIND_HOST or TRAIND_SOCKET_IFNAME)",
                              rank, prev, host, port, accept_by - start);
    }
    if (td_net_recv_all(c->prev_fd, &who, 4, deadline, err) != 0) {
        close(listen_fd);
        return td_comm_peer_fail(c, false, err);
    }
    close(listen_fd);
    if (who != prev)
        return td_fail(err, "rank %d: expected rank %d to connect, got %d", rank, prev, who);
    return 0;
fail_listen:
    close(listen_fd);
fail:
    return td_fail_prefix(err, "rank %d joining the ring of %d", rank, world);
}

void td_comm_abort(td_comm *c) {
    if (c->next_fd >= 0) shutdown(c->next_fd, SHUT_RDWR);
    if (c->prev_fd >= 0) shutdown(c->prev_fd, SHUT_RDWR);
}

void td_comm_close(td_comm *c) {
    if (!c) return;
    if (c->next_fd >= 0) close(c->next_fd);
    if (c->prev_fd >= 0) close(c->prev_fd);
    td_comm_free_regions(c);
    free(c->tmp);
    free(c);
}

void td_comm_segment(size_t n, int world, int k, size_t *off, size_t *len) {
    size_t base = n / (size_t)world, extra = n % (size_t)world;
    *off = (size_t)k * base + ((size_t)k < extra ? (size_t)k : extra);
    *len = base + ((size_t)k < extra ? 1 : 0);
}

/* Sends buf[send_off + i] and receives into recv_to (or adds into add_to) piece by piece. */
static int step(td_comm *c, const float *send, size_t send_len, float *recv, size_t recv_len,
                bool add, td_err *err) {
    size_t done_s = 0, done_r = 0;
    double deadline = td_clock_now() + c->timeout_s;
    while (done_s < send_len || done_r < recv_len) {
        size_t ps = send_len - done_s < PIECE_FLOATS ? send_len - done_s : PIECE_FLOATS;
        size_t pr = recv_len - done_r < PIECE_FLOATS ? recv_len - done_r : PIECE_FLOATS;
        float *into = add ? c->tmp : recv + done_r;
        bool recv_side;
        if (td_net_exchange(c->next_fd, send + done_s, ps * sizeof(float), c->prev_fd, into,
                            pr * sizeof(float), deadline, &recv_side, err) != 0)
            return td_comm_peer_fail(c, !recv_side, err);
        if (add)
            for (size_t i = 0; i < pr; i++) recv[done_r + i] += c->tmp[i];
        done_s += ps;
        done_r += pr;
    }
    return 0;
}

int td_comm_allreduce(td_comm *c, float *buf, size_t n, bool average, td_err *err) {
    int w = c->world, r = c->rank;
    td_comm_region *shared = w > 1 ? td_comm_region_of(c, buf, n) : NULL;
    if (shared) return td_comm_allreduce_shared(c, shared, buf, n, average, err);
    if (w > 1) {
        for (int s = 0; s < w - 1; s++) { /* reduce-scatter */
            size_t so, sl, ro, rl;
            td_comm_segment(n, w, (r - s + w) % w, &so, &sl);
            td_comm_segment(n, w, (r - s - 1 + 2 * w) % w, &ro, &rl);
            if (step(c, buf + so, sl, buf + ro, rl, true, err) != 0) return -1;
            td_fault_at(TD_FAULT_ALLREDUCE); /* tests: a peer dying mid-collective (td_fault.h) */
        }
        for (int s = 0; s < w - 1; s++) { /* all-gather of the reduced segments */
            size_t so, sl, ro, rl;
            td_comm_segment(n, w, (r + 1 - s + w) % w, &so, &sl);
            td_comm_segment(n, w, (r - s + w) % w, &ro, &rl);
            if (step(c, buf + so, sl, buf + ro, rl, false, err) != 0) return -1;
        }
    }
    if (average) {
        float inv = 1.0f / (float)w;
        for (size_t i = 0; i < n; i++) buf[i] *= inv;
    }
    return 0;
}

int td_comm_broadcast(td_comm *c, float *buf, size_t n, int root, td_err *err) {
    int w = c->world;
    if (w == 1) return 0;
    bool receives = c->rank != root, forwards = (c->rank + 1) % w != root;
    double deadline = td_clock_now() + c->timeout_s;
    for (size_t off = 0; off < n; off += PIECE_FLOATS) {
        size_t len = n - off < PIECE_FLOATS ? n - off : PIECE_FLOATS;
        if (receives &&
            td_net_recv_all(c->prev_fd, buf + off, len * sizeof(float), deadline, err) != 0)
            return td_comm_peer_fail(c, false, err);
        if (forwards &&
            td_net_send_all(c->next_fd, buf + off, len * sizeof(float), deadline, err) != 0)
            return td_comm_peer_fail(c, true, err);
    }
    return 0;
}

int td_comm_allgather(td_comm *c, const float *mine, size_t n, float *all, td_err *err) {
    int w = c->world, r = c->rank;
    memcpy(all + (size_t)r * n, mine, n * sizeof(float));
    for (int s = 0; s < w - 1; s++) {
        int send_block = (r - s + w) % w, recv_block = (r - s - 1 + 2 * w) % w;
        if (step(c, all + (size_t)send_block * n, n, all + (size_t)recv_block * n, n, false, err) !=
            0)
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
