/* The rendezvous store and the CPU ring collectives, with ranks as threads of this process
 * talking over loopback: results against a sequential reference for world 2, 3 and 4 and sizes
 * 1, 7 and 1,000,003, on plain memory (the TCP ring) and on buffers from td_comm_alloc (shared
 * memory), there also at an offset inside the buffer; bitwise agreement between ranks; a dead
 * peer is an error naming it; ranks naming different buffers are an error. The store's
 * rendezvous fails every waiting rank at once, with the cause, on another run, a rank that leaves
 * before it is ready, an abort, a rank taken twice or another world size. */
#include "dist/td_comm.h"
#include "dist/td_dist.h"
#include "dist/td_store.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <ifaddrs.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define HOST    "127.0.0.1"
#define TIMEOUT 20.0

typedef struct rank_ctx {
    int rank, world, port;
    td_store *store; /* rank 0's is opened (with the server) before the threads start */
    bool die_after_init;
    bool shared;           /* all-reduce on td_comm_alloc's memory */
    char node[8];          /* the node identity this rank claims ("" for this host's) */
    const char *transport; /* what td_comm_transport must say (a part of it) */
    bool mismatched;       /* each rank all-reduces at a different offset: all must fail */
    bool hang;             /* joins, then makes no collective call until the others have ended */
    double timeout;        /* the collectives' (0: TIMEOUT) */
    int failures;
    char error[TD_ERR_MAX + 128];
    float *result; /* rank's all-reduce of pseudo-random data, to compare across ranks */
} rank_ctx;

static const size_t SIZES[3] = {1, 7, 1000003};

/* ranks of the current world that have ended (a hanging rank waits for the others) */
static int ended;
static pthread_mutex_t ended_mu = PTHREAD_MUTEX_INITIALIZER;

static float value(int rank, size_t i) {
    return (float)((rank + 1) * ((int)(i % 17) - 8));
}

#define CHECK(cond, ...)                                                                           \
    do {                                                                                           \
        if (!(cond)) {                                                                             \
            snprintf(x->error, sizeof x->error, __VA_ARGS__);                                      \
            x->failures++;                                                                         \
            goto out;                                                                              \
        }                                                                                          \
    } while (0)

static void *run_rank(void *p) {
    rank_ctx *x = p;
    td_err err = {{0}};
    td_comm *c = NULL;
    float *buf = NULL, *plain = NULL; /* plain: buf when it is malloc'd */
    if (!x->store &&
        td_store_open(&x->store, HOST, x->port, false, "test/attempt-0", TIMEOUT, &err) != 0)
        CHECK(0, "store: %s", err.msg);
    CHECK(td_comm_init(&c, x->store, x->rank, x->world, HOST, x->node[0] ? x->node : NULL,
                       x->timeout > 0 ? x->timeout : TIMEOUT, &err) == 0,
          "init: %s", err.msg);
    if (x->die_after_init) goto out; /* a rank that vanishes: closes its sockets */
    float *region = NULL;
    if (x->shared || x->mismatched) {
        region = td_comm_alloc(c, SIZES[2] + 64, &err);
        CHECK(region, "alloc: %s", err.msg);
        CHECK(strstr(td_comm_transport(c, region), x->transport), "transport: %s (expected %s)",
              td_comm_transport(c, region), x->transport);
    }
    if (x->hang) { /* a stopped process: its sockets stay open, it never arrives */
        for (int i = 0; i < 3000; i++) {
            pthread_mutex_lock(&ended_mu);
            bool others = ended == x->world - 1;
            pthread_mutex_unlock(&ended_mu);
            if (others) break;
            usleep(10 * 1000);
        }
        goto out;
    }
    if (x->mismatched) {
        int rc = td_comm_allreduce(c, region + x->rank, 10, false, &err);
        CHECK(rc != 0 && strstr(err.msg, "different buffers"), "mismatch not detected: %s",
              err.msg);
        goto out;
    }
    if (!x->shared) buf = plain = malloc(SIZES[2] * sizeof(float));
    for (int k = 0; k < 3; k++) {
        size_t n = SIZES[k];
        if (x->shared) buf = region + (k == 1 ? 33 : 0); /* also a part at an offset */
        for (size_t i = 0; i < n; i++) buf[i] = value(x->rank, i);
        CHECK(td_comm_allreduce(c, buf, n, false, &err) == 0, "allreduce %zu: %s", n, err.msg);
        for (size_t i = 0; i < n; i++) {
            float want = 0;
            for (int r = 0; r < x->world; r++) want += value(r, i);
            CHECK(buf[i] == want, "allreduce %zu: element %zu is %g, expected %g", n, i, buf[i],
                  want);
        }
        for (size_t i = 0; i < n; i++) buf[i] = value(x->rank, i);
        CHECK(td_comm_allreduce(c, buf, n, true, &err) == 0, "average: %s", err.msg);
        float sum0 = 0;
        for (int r = 0; r < x->world; r++) sum0 += value(r, n - 1);
        CHECK(buf[n - 1] == sum0 * (1.0f / (float)x->world), "average of the last element");
    }
    /* bitwise agreement on data whose float sum depends on the order */
    x->result = malloc(4096 * sizeof(float));
    float *mixed = x->shared ? region + 64 : x->result;
    for (int i = 0; i < 4096; i++) mixed[i] = 1.0f / (float)(i + x->rank + 3) + 1e-3f * x->rank;
    CHECK(td_comm_allreduce(c, mixed, 4096, false, &err) == 0, "allreduce: %s", err.msg);
    memmove(x->result, mixed, 4096 * sizeof(float));
    if (x->shared) {
        buf = plain = malloc(SIZES[2] * sizeof(float)); /* the rest on plain memory */
        td_comm_free(c, region);
    }
    /* broadcast from the last rank */
    int root = x->world - 1;
    for (size_t i = 0; i < SIZES[2]; i++) buf[i] = x->rank == root ? (float)i * 0.5f : -1.0f;
    CHECK(td_comm_broadcast(c, buf, SIZES[2], root, &err) == 0, "broadcast: %s", err.msg);
    CHECK(buf[12345] == 12345 * 0.5f && buf[SIZES[2] - 1] == (float)(SIZES[2] - 1) * 0.5f,
          "broadcast content");
    float mine[7], all[4 * 7];
    for (int i = 0; i < 7; i++) mine[i] = (float)(x->rank * 100 + i);
    CHECK(td_comm_allgather(c, mine, 7, all, &err) == 0, "allgather: %s", err.msg);
    for (int r = 0; r < x->world; r++)
        for (int i = 0; i < 7; i++)
            CHECK(all[r * 7 + i] == (float)(r * 100 + i), "allgather block %d", r);
    CHECK(td_comm_barrier(c, &err) == 0, "barrier: %s", err.msg);
    /* the store's own barrier and counter */
    CHECK(td_store_barrier(x->store, "end", x->world, &err) == 0, "store barrier: %s", err.msg);
out:
    free(plain);
    td_comm_close(c);
    pthread_mutex_lock(&ended_mu);
    ended++;
    pthread_mutex_unlock(&ended_mu);
    if (x->rank != 0) td_store_close(x->store); /* rank 0's (the server) closes after join */
    return NULL;
}

/* nodes: one letter per rank, the node identity it claims (NULL: all on this host). */
static void run_world(int world, rank_ctx *ctx, bool last_dies, bool shared, bool mismatched,
                      const char *nodes, const char *transport) {
    td_err err = {{0}};
    td_store *server;
    cr_assert_eq(td_store_open(&server, HOST, 0, true, "test/attempt-0", TIMEOUT, &err), 0, "%s",
                 err.msg);
    pthread_t threads[4];
    ended = 0;
    for (int r = 0; r < world; r++) {
        ctx[r] = (rank_ctx){.rank = r,
                            .world = world,
                            .port = td_store_port(server),
                            .store = r == 0 ? server : NULL,
                            .die_after_init = last_dies && r == world - 1,
                            .shared = shared,
                            .mismatched = mismatched,
                            .transport = transport ? transport : "shared memory"};
        if (nodes) snprintf(ctx[r].node, sizeof ctx[r].node, "node-%c", nodes[r]);
        cr_assert_eq(pthread_create(&threads[r], NULL, run_rank, &ctx[r]), 0);
    }
    for (int r = 0; r < world; r++) pthread_join(threads[r], NULL);
    td_store_close(server);
}

static void check_world(int world, bool shared, const char *nodes, const char *transport) {
    rank_ctx ctx[4];
    run_world(world, ctx, false, shared, false, nodes, transport);
    for (int r = 0; r < world; r++)
        cr_expect_eq(ctx[r].failures, 0, "rank %d: %s", r, ctx[r].error);
    for (int r = 1; r < world; r++)
        if (ctx[r].result && ctx[0].result)
            cr_expect(memcmp(ctx[r].result, ctx[0].result, 4096 * sizeof(float)) == 0,
                      "rank %d's all-reduce differs from rank 0's in some bit", r);
    for (int r = 0; r < world; r++) free(ctx[r].result);
}

Test(comm, world_2, .timeout = 120) {
    check_world(2, false, NULL, NULL);
}
Test(comm, world_3, .timeout = 120) {
    check_world(3, false, NULL, NULL);
}
Test(comm, world_4, .timeout = 120) {
    check_world(4, false, NULL, NULL);
}
Test(comm, world_2_shared_memory, .timeout = 120) {
    check_world(2, true, NULL, NULL);
}
Test(comm, world_3_shared_memory, .timeout = 120) {
    check_world(3, true, NULL, NULL);
}
Test(comm, world_4_shared_memory, .timeout = 120) {
    check_world(4, true, NULL, NULL);
}

/* Ranks claiming other nodes' identities: shared memory only within a node, the node leaders'
 * TCP ring between nodes, and the same sums, to the bit on every rank. */
Test(comm, two_nodes_of_two_ranks_share_memory_within_and_talk_tcp_between, .timeout = 120) {
    check_world(4, true, "aabb", "shared memory within each node, and a TCP ring between the 2");
}
Test(comm, nodes_of_unequal_size, .timeout = 120) {
    check_world(3, true, "abb", "between the 2 nodes");
    check_world(4, true, "abcc", "between the 3 nodes");
}
Test(comm, one_rank_per_node_is_the_tcp_ring, .timeout = 120) {
    check_world(2, true, "ab", "the TCP ring (one rank on each of 2 nodes)");
}
Test(comm, ranks_on_one_node_need_not_be_neighbours, .timeout = 120) {
    check_world(4, true, "abab", "between the 2 nodes");
}

Test(comm, shared_memory_ranks_naming_different_buffers_fail, .timeout = 120) {
    rank_ctx ctx[3];
    run_world(3, ctx, false, false, true, NULL, NULL);
    for (int r = 0; r < 3; r++) cr_expect_eq(ctx[r].failures, 0, "rank %d: %s", r, ctx[r].error);
}

Test(comm, dead_peer_is_an_error_naming_it, .timeout = 120) {
    rank_ctx ctx[3];
    run_world(3, ctx, true, false, false, NULL, NULL);
    /* rank 2 vanished after joining: rank 0, which receives from it, fails naming it; rank 1
     * fails too, naming whichever neighbour closed on it first (rank 2, or rank 0 once rank 0
     * gave up). The trainer adds the job's first failure to such cascades (test_ddp). */
    cr_expect_eq(ctx[0].failures, 1, "rank 0 did not fail");
    cr_expect(strstr(ctx[0].error, "peer rank 2"), "rank 0's error names rank 2: %s", ctx[0].error);
    cr_expect_eq(ctx[1].failures, 1, "rank 1 did not fail");
    cr_expect(strstr(ctx[1].error, "peer rank 2") || strstr(ctx[1].error, "peer rank 0"),
              "rank 1's error names a peer: %s", ctx[1].error);
}

Test(store, refuses_another_namespace, .timeout = 60) {
    td_err err = {{0}};
    td_store *server, *stale;
    cr_assert_eq(td_store_open(&server, HOST, 0, true, "job-7/attempt-2", TIMEOUT, &err), 0, "%s",
                 err.msg);
    cr_expect_neq(
        td_store_open(&stale, HOST, td_store_port(server), false, "job-7/attempt-1", TIMEOUT, &err),
        0);
    cr_expect(strstr(err.msg, "serves \"job-7/attempt-2\", not \"job-7/attempt-1\""), "%s",
              err.msg);
    int64_t v;
    cr_expect_eq(td_store_add(server, "counter", 5, &v, &err), 0, "%s", err.msg);
    cr_expect_eq(td_store_add(server, "counter", -2, &v, &err), 0, "%s", err.msg);
    cr_expect_eq(v, 3);
    td_store_close(server);
}

Test(store, get_times_out_on_a_missing_key, .timeout = 60) {
    td_err err = {{0}};
    td_store *server;
    cr_assert_eq(td_store_open(&server, HOST, 0, true, "ns", 0.5, &err), 0, "%s", err.msg);
    void *v;
    cr_expect_neq(td_store_get(server, "never-set", &v, NULL, &err), 0);
    cr_expect(strstr(err.msg, "timed out") && strstr(err.msg, "never-set"), "%s", err.msg);
    td_store_close(server);
}

/* A rank waiting in the store (as td_comm_init waits for its neighbour's address). */
typedef struct waiter {
    td_store *store;
    int rc;
    td_err err;
} waiter;

static void *wait_for_a_key(void *p) {
    waiter *w = p;
    void *v;
    w->rc = td_store_get(w->store, "never-set", &v, NULL, &w->err);
    if (w->rc == 0) free(v);
    return NULL;
}

/* Rank 0 of a world of 2, with a thread waiting in a GET. */
static td_store *rank0_waiting(const char *ns, waiter *w, pthread_t *th) {
    td_err err = {{0}};
    td_store *server;
    cr_assert_eq(td_store_open_rank(&server, HOST, 0, true, ns, 0, 2, TIMEOUT, &err), 0, "%s",
                 err.msg);
    *w = (waiter){.store = server};
    cr_assert_eq(pthread_create(th, NULL, wait_for_a_key, w), 0);
    return server;
}

/* Nodes given different run ids: a configuration error that the stray rank and the waiting one
 * both report at once, rather than one of them at its timeout. */
Test(store, another_run_fails_every_rank_at_once, .timeout = 60) {
    waiter w;
    pthread_t th;
    td_store *server = rank0_waiting("run-a/attempt-0", &w, &th), *stray;
    td_err err = {{0}};
    cr_expect_neq(td_store_open_rank(&stray, HOST, td_store_port(server), false, "run-b/attempt-0",
                                     1, 2, TIMEOUT, &err),
                  0);
    const char *why = "belongs to run \"run-b\" but this store serves run \"run-a\"";
    cr_expect(strstr(err.msg, "rendezvous failed: rank 1 (host ") && strstr(err.msg, why), "%s",
              err.msg);
    pthread_join(th, NULL);
    cr_expect_neq(w.rc, 0);
    cr_expect(strstr(w.err.msg, why) && !strstr(w.err.msg, "timed out"), "%s", w.err.msg);
    /* and every later call says so too */
    cr_expect_neq(td_store_set(server, "k", "v", 1, &err), 0);
    cr_expect(strstr(err.msg, why), "%s", err.msg);
    td_store_close(server);
}

Test(store, a_rank_leaving_before_it_is_ready_fails_every_rank, .timeout = 60) {
    waiter w;
    pthread_t th;
    td_store *server = rank0_waiting("job/attempt-0", &w, &th), *rank1;
    td_err err = {{0}};
    cr_assert_eq(td_store_open_rank(&rank1, HOST, td_store_port(server), false, "job/attempt-0", 1,
                                    2, TIMEOUT, &err),
                 0, "%s", err.msg);
    td_store_close(rank1); /* as a crash would */
    pthread_join(th, NULL);
    cr_expect_neq(w.rc, 0);
    cr_expect(strstr(w.err.msg, "rendezvous failed: rank 1 (host ") &&
                  strstr(w.err.msg, "disconnected before every rank had joined"),
              "%s", w.err.msg);
    td_store_close(server);
}

/* traind-run's word that a worker died (perhaps before it connected) fails the rendezvous; once
 * every rank is ready the job has begun and the store ignores it, and keeps working. */
Test(store, abort_fails_the_rendezvous_until_every_rank_is_ready, .timeout = 60) {
    waiter w;
    pthread_t th;
    td_store *server = rank0_waiting("job/attempt-0", &w, &th);
    td_err err = {{0}};
    bool failed = true;
    int port = td_store_port(server);
    cr_expect_eq(td_store_abort_at(HOST, port, "job/attempt-1", "stale", 5, &failed, &err), 0, "%s",
                 err.msg);
    cr_expect(!failed, "another attempt's abort is not this one's");
    cr_expect_eq(
        td_store_abort_at(HOST, port, "job/attempt-0", "node 1: rank 1 failed", 5, &failed, &err),
        0, "%s", err.msg);
    cr_expect(failed);
    pthread_join(th, NULL);
    cr_expect(strstr(w.err.msg, "rendezvous failed: node 1: rank 1 failed"), "%s", w.err.msg);
    td_store_close(server);

    td_store *rank1;
    cr_assert_eq(td_store_open_rank(&server, HOST, 0, true, "job/attempt-0", 0, 2, TIMEOUT, &err),
                 0, "%s", err.msg);
    port = td_store_port(server);
    cr_assert_eq(
        td_store_open_rank(&rank1, HOST, port, false, "job/attempt-0", 1, 2, TIMEOUT, &err), 0,
        "%s", err.msg);
    cr_expect_eq(td_store_ready(server, 0, 2, &err), 0, "%s", err.msg);
    cr_expect_eq(td_store_ready(rank1, 1, 2, &err), 0, "%s", err.msg);
    cr_expect_eq(td_store_abort_at(HOST, port, "job/attempt-0", "late", 5, &failed, &err), 0, "%s",
                 err.msg);
    cr_expect(!failed, "the job had begun");
    cr_expect_eq(td_store_set(rank1, "k", "v", 2, &err), 0, "%s", err.msg);
    void *v = NULL;
    cr_expect_eq(td_store_get(server, "k", &v, NULL, &err), 0, "%s", err.msg);
    free(v);
    td_store_close(rank1);
    td_store_close(server);
}

/* Two nodes with the same --node-rank, or nodes disagreeing on the world size. */
Test(store, a_rank_taken_twice_or_another_world_size_fails_the_rendezvous, .timeout = 60) {
    const char *cases[2] = {"both joined as rank 1", "was started with WORLD_SIZE 3"};
    for (int k = 0; k < 2; k++) {
        waiter w;
        pthread_t th;
        td_store *server = rank0_waiting("job/attempt-0", &w, &th), *a, *b;
        td_err err = {{0}};
        int port = td_store_port(server);
        cr_assert_eq(
            td_store_open_rank(&a, HOST, port, false, "job/attempt-0", 1, 2, TIMEOUT, &err), 0,
            "%s", err.msg);
        cr_expect_neq(
            td_store_open_rank(&b, HOST, port, false, "job/attempt-0", 1, k ? 3 : 2, TIMEOUT, &err),
            0);
        cr_expect(strstr(err.msg, cases[k]), "%s", err.msg);
        pthread_join(th, NULL);
        cr_expect(strstr(w.err.msg, cases[k]), "%s", w.err.msg);
        td_store_close(a);
        td_store_close(server);
    }
}

/* ---- the address a rank advertises (td_dist_pick_host) -------------------------------------- */

static td_dist two_nodes(const char *master) {
    unsetenv("TRAIND_HOST");
    unsetenv("TRAIND_SOCKET_IFNAME");
    unsetenv("GLOO_SOCKET_IFNAME");
    td_dist d = {.rank = 2, .world = 4, .local_world = 2};
    snprintf(d.master_addr, sizeof d.master_addr, "%s", master);
    return d;
}

/* This host's first IPv4 address that is not loopback, or "" when it has none. */
static void some_local_address(char *out, size_t len) {
    struct ifaddrs *list, *i;
    out[0] = 0;
    cr_assert_eq(getifaddrs(&list), 0);
    for (i = list; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strcmp(i->ifa_name, "lo") != 0) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, len);
            break;
        }
    freeifaddrs(list);
}

Test(host, several_nodes_advertise_the_route_to_the_master_never_the_hostname) {
    char addr[64];
    some_local_address(addr, sizeof addr);
    if (!addr[0]) cr_skip_test("no IPv4 address but loopback on this host");
    td_dist d = two_nodes(addr); /* the master is this host, reached over its interface */
    td_err err = {{0}};
    cr_assert_eq(td_dist_pick_host(&d, &err), 0, "%s", err.msg);
    cr_assert_str_eq(d.host, addr, "a peer on another host must be able to dial it");
    cr_assert(strstr(d.host_why, "route to the master"), "%s", d.host_why);
    d = two_nodes("127.0.0.1"); /* a master on loopback: loopback is right */
    cr_assert_eq(td_dist_pick_host(&d, &err), 0, "%s", err.msg);
    cr_assert_str_eq(d.host, "127.0.0.1");
}

Test(host, the_user_chooses_by_address_or_interface) {
    td_dist d = two_nodes("127.0.0.1");
    td_err err = {{0}};
    setenv("TRAIND_SOCKET_IFNAME", "lo", 1);
    cr_assert_eq(td_dist_pick_host(&d, &err), 0, "%s", err.msg);
    cr_assert_str_eq(d.host, "127.0.0.1");
    cr_assert(strstr(d.host_why, "TRAIND_SOCKET_IFNAME"), "%s", d.host_why);
    setenv("TRAIND_HOST", "10.9.8.7", 1); /* wins over the interface */
    cr_assert_eq(td_dist_pick_host(&d, &err), 0, "%s", err.msg);
    cr_assert_str_eq(d.host, "10.9.8.7");
    d = two_nodes("127.0.0.1");
    setenv("GLOO_SOCKET_IFNAME", "no-such-interface0", 1); /* as PyTorch's Gloo reads it */
    cr_assert_neq(td_dist_pick_host(&d, &err), 0);
    cr_assert(strstr(err.msg, "no-such-interface0") && strstr(err.msg, "GLOO_SOCKET_IFNAME"), "%s",
              err.msg);
    unsetenv("GLOO_SOCKET_IFNAME");
}

Test(host, one_node_reaches_its_ranks_where_the_master_is) {
    td_dist d = two_nodes("127.0.0.1");
    d.local_world = d.world;
    td_err err = {{0}};
    cr_assert_eq(td_dist_pick_host(&d, &err), 0, "%s", err.msg);
    cr_assert_str_eq(d.host, "127.0.0.1");
}

/* A rank that hangs (SIGSTOPped) on the second node of two, its node's leader: the first node's
 * leader, waiting for it in the leaders' ring, names it, and so does the rank beside it; the
 * first node's other rank, waiting for its own leader meanwhile, must not give up first and
 * blame that leader, which is only waiting itself (chaos.py's hung peer found it doing so: the
 * leader starts its ring step just after its node's ranks start to wait for it, so their own
 * timeouts ran out first). */
Test(comm, a_hung_leader_is_named_not_the_leader_waiting_for_it, .timeout = 120) {
    td_err err = {{0}};
    td_store *server;
    cr_assert_eq(td_store_open(&server, HOST, 0, true, "test/attempt-0", TIMEOUT, &err), 0, "%s",
                 err.msg);
    rank_ctx ctx[4];
    pthread_t threads[4];
    ended = 0;
    for (int r = 0; r < 4; r++) {
        ctx[r] = (rank_ctx){.rank = r,
                            .world = 4,
                            .port = td_store_port(server),
                            .store = r == 0 ? server : NULL,
                            .shared = true,
                            .hang = r == 2,
                            /* rank 0's step ends after rank 1's wait would: by a second
                             * here, by the microseconds between them otherwise */
                            .timeout = r == 0 ? 3.0 : 2.0,
                            .transport = "between the 2"};
        snprintf(ctx[r].node, sizeof ctx[r].node, "node-%c", "aabb"[r]);
        cr_assert_eq(pthread_create(&threads[r], NULL, run_rank, &ctx[r]), 0);
    }
    for (int r = 0; r < 4; r++) pthread_join(threads[r], NULL);
    td_store_close(server);
    char host[64];
    gethostname(host, sizeof host);
    char named[128];
    snprintf(named, sizeof named, "rank 2 (host %s, pid %d", host, (int)getpid());
    cr_expect(strstr(ctx[0].error, "peer rank 2") && strstr(ctx[0].error, named),
              "rank 0 names the hung rank with its host and pid: %s", ctx[0].error);
    /* rank 3 names it too, unless rank 0 gave up first and closed on it (the trainer then adds
     * the job's first failure, rank 0's, to its error) */
    cr_expect(strstr(ctx[3].error, named) || strstr(ctx[3].error, "peer rank 0"),
              "rank 3 names the hung rank, or rank 0 that closed on it: %s", ctx[3].error);
    cr_expect(ctx[1].failures == 1 && !strstr(ctx[1].error, "waiting for rank 0"),
              "rank 1 does not blame its leader for waiting: %s", ctx[1].error);
}
