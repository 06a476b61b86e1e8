/* All-reduce through shared memory, for the ranks of one node (the common case: one process
 * per core or GPU of a node).
 *
 * Over the TCP ring, every float crosses the loopback twice and every rank copies it through
 * the kernel; on one node the ranks can instead read each other's buffers. td_comm_alloc maps
 * each rank's buffer into every rank of its node (POSIX shared memory), like NCCL's registered
 * buffers. On one node, an all-reduce on such a buffer is: the node's q-th rank sums segment q
 * straight from every rank's memory and writes the result into every rank's memory, between
 * two barriers. Each segment is summed by one rank in rank order and written to all, so every
 * rank ends with the same bits.
 *
 * On several nodes the sum goes to the node's leader only; the leaders all-reduce their sums
 * over their own TCP ring (every element summed in one place, in one order); then the node's
 * ranks copy the leader's result, segment by segment, into every rank's memory. Four barriers
 * instead of two, and only one rank per node on the network, as NCCL's trees and rings across
 * nodes do.
 *
 * The barriers live in a control page after each rank's buffer, not on the sockets: a rank
 * announces its arrival with a store and waits by spinning, then by sleeping on a futex. A
 * message over loopback TCP wakes the peer through the kernel, and on a virtual machine a
 * sleeping vCPU takes tens to hundreds of microseconds to wake: measured on our 2-core CI VM,
 * the two socket barriers of a LeNet step cost 400-800 us of a 2.5 ms step. The sockets stay
 * open for what shared memory cannot tell: a waiting rank polls them between futex sleeps, so
 * a peer that died (the kernel closes its sockets) is an error naming it, never a hang.
 */
#include "core/td_fault.h"
#include "dist/td_comm_private.h"
#include "dist/td_net.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* Spinning keeps a waiting vCPU awake for the common short wait (ranks finishing backward a
 * little apart); past this a waiter sleeps so a long wait (a slow peer, a checkpoint) costs no
 * CPU. */
#define SPIN_S 300e-6
/* Between futex sleeps a waiter checks its sockets for a dead neighbour and its deadline. */
#define SLEEP_NS (5 * 1000 * 1000)

/* The control page after a rank's buffer. Only its owner writes `arrived` and `span`; peers
 * write only `sleepers`. span is indexed by barrier parity: a rank cannot reach barrier e + 2
 * before every peer has reached e + 1, so slot e & 1 is stable while anyone still reads it. */
struct td_comm_ctl {
    _Atomic uint32_t arrived;  /* barriers this rank has reached on the region */
    _Atomic uint32_t sleepers; /* peers in a futex wait on `arrived` */
    uint64_t span[2][2];       /* (offset, floats) of the all-reduce, by barrier parity */
    /* while this rank, a node's leader, all-reduces with the other nodes' leaders: when its
     * current ring step began (CLOCK_MONOTONIC, ns; 0: not in the ring). The node's ranks that
     * wait for it meanwhile give it its own step's timeout: a peer that hangs on another node is
     * then named by the leader that waits for it, not the leader by the ranks that wait for it */
    _Atomic uint64_t ring_step_ns;
};

/* How long after its step's own timeout a leader has to say why it failed (the job's store)
 * and close its sockets, which its node's ranks notice. */
#define LEADER_MARGIN_S 2.0

static td_comm_ctl *control_of(const td_comm_region *g, int p) {
    return (td_comm_ctl *)((char *)g->peer[p] + g->data_bytes);
}

static void *map_shared(int fd, size_t bytes) {
    void *p = mmap(NULL, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    return p == MAP_FAILED ? NULL : p;
}

/* Creates this rank's segment; NULL (and the reason in why) when shared memory is unavailable. */
static float *create_own(const char *name, size_t bytes, char *why, size_t why_len) {
    int fd = shm_open(name, O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) {
        snprintf(why, why_len, "shm_open(%s): %s", name, strerror(errno));
        return NULL;
    }
    void *p = NULL;
    if (ftruncate(fd, (off_t)bytes) != 0)
        snprintf(why, why_len, "ftruncate(%s, %zu): %s", name, bytes, strerror(errno));
    else if (!(p = map_shared(fd, bytes)))
        snprintf(why, why_len, "mmap(%s, %zu): %s", name, bytes, strerror(errno));
    close(fd);
    if (!p) shm_unlink(name);
    return p;
}

static float *map_peer(const char *name, size_t bytes) {
    int fd = shm_open(name, O_RDWR, 0);
    if (fd < 0) return NULL;
    struct stat st;
    void *p = NULL;
    if (fstat(fd, &st) == 0 && (size_t)st.st_size == bytes) p = map_shared(fd, bytes);
    close(fd);
    return p;
}

/* Unmaps the peers' mappings of g and this rank's own (which peer[local_pos] may or may not
 * hold). */
static void unmap_region(const td_comm *c, td_comm_region *g, float *own) {
    if (g->peer) {
        for (int p = 0; p < c->local_size; p++)
            if (g->peer[p] && g->peer[p] != own) munmap(g->peer[p], g->bytes);
        free(g->peer);
        g->peer = NULL;
    }
    if (own) munmap(own, g->bytes);
}

float *td_comm_alloc(td_comm *c, size_t n, td_err *err) {
    int slot = 0;
    while (slot < TD_COMM_MAX_REGIONS && c->regions[slot].mine) slot++;
    if (slot == TD_COMM_MAX_REGIONS) {
        td_fail(err, "rank %d: more than %d communication buffers at once", c->rank,
                TD_COMM_MAX_REGIONS);
        return NULL;
    }
    td_comm_region *g = &c->regions[slot];
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    g->floats = n;
    g->data_bytes = (n * sizeof(float) + page - 1) / page * page;
    if (g->data_bytes == 0) g->data_bytes = page;
    g->bytes = g->data_bytes + page; /* the control page (unused off shared memory) */
    int seq = c->region_seq++;
    if (c->world == 1) {
        g->mine = td_aligned_alloc(g->bytes);
        snprintf(g->transport, sizeof g->transport, "nothing (a world of one)");
        return g->mine;
    }

    /* one rank per node: nothing to share */
    if (c->nodes == c->world) {
        g->mine = td_aligned_alloc(g->bytes);
        snprintf(g->transport, sizeof g->transport, "the TCP ring (one rank on each of %d nodes)",
                 c->nodes);
        return g->mine;
    }
    /* every rank publishes its segment's name ("" if it has none), then maps those of the
     * ranks on its node */
    char name[96], key[64], why[256] = "";
    snprintf(name, sizeof name, "/traind-%ld-%d-%d", (long)getpid(), c->rank, seq);
    float *own = create_own(name, g->bytes, why, sizeof why);
    snprintf(key, sizeof key, "comm/shm/%d/%d", seq, c->rank);
    if (td_store_set(c->store, key, own ? name : "", own ? strlen(name) + 1 : 1, err) != 0)
        goto fail;
    g->peer = td_calloc((size_t)c->local_size, sizeof(float *));
    float shared = own ? 1.0f : 0.0f;
    for (int q = 0; q < c->local_size && own; q++) {
        if (q == c->local_pos) {
            g->peer[q] = own;
            continue;
        }
        void *v;
        snprintf(key, sizeof key, "comm/shm/%d/%d", seq, c->local[q]);
        if (td_store_get(c->store, key, &v, NULL, err) != 0) goto fail;
        g->peer[q] = *(char *)v ? map_peer(v, g->bytes) : NULL;
        if (!g->peer[q] && !why[0])
            snprintf(why, sizeof why,
                     "rank %d cannot map the shared memory of rank %d, on its node%s", c->rank,
                     c->local[q], *(char *)v ? "" : ", which has none");
        free(v);
        if (!g->peer[q]) shared = 0.0f; /* the peer has no shared memory, or no memory left */
    }
    /* all or nothing: the count of ranks that mapped their node's peers, summed over the TCP
     * ring (no region is registered yet); once it returns, every rank has opened the names */
    if (td_comm_allreduce(c, &shared, 1, false, err) != 0) goto fail;
    if (own) shm_unlink(name); /* the mappings live on; nothing is left in /dev/shm */
    if (shared == (float)c->world) {
        g->mine = own;
        if (c->nodes == 1)
            snprintf(g->transport, sizeof g->transport, "shared memory");
        else
            snprintf(g->transport, sizeof g->transport,
                     "shared memory within each node, and a TCP ring between the %d nodes' "
                     "leaders",
                     c->nodes);
        return own;
    }
    unmap_region(c, g, own);
    g->mine = td_aligned_alloc(g->bytes); /* TCP all-reduces on plain memory */
    snprintf(g->transport, sizeof g->transport, "the TCP ring (%s)",
             why[0] ? why : "another rank of the node cannot share memory");
    return g->mine;
fail:
    if (own) shm_unlink(name);
    unmap_region(c, g, own);
    memset(g, 0, sizeof *g);
    td_fail_prefix(err, "rank %d: allocating a shared gradient buffer", c->rank);
    return NULL;
}

static void release(td_comm *c, td_comm_region *g) {
    if (g->peer)
        unmap_region(c, g, g->mine);
    else
        free(g->mine);
    memset(g, 0, sizeof *g);
}

void td_comm_free(td_comm *c, float *p) {
    if (!c || !p) return;
    for (int i = 0; i < TD_COMM_MAX_REGIONS; i++)
        if (c->regions[i].mine == p) release(c, &c->regions[i]);
}

const char *td_comm_transport(const td_comm *c, const float *p) {
    for (int i = 0; i < TD_COMM_MAX_REGIONS; i++)
        if (c->regions[i].mine == p) return c->regions[i].transport;
    return "the TCP ring";
}

void td_comm_free_regions(td_comm *c) {
    for (int i = 0; i < TD_COMM_MAX_REGIONS; i++)
        if (c->regions[i].mine) release(c, &c->regions[i]);
}

td_comm_region *td_comm_region_of(td_comm *c, const float *buf, size_t n) {
    for (int i = 0; i < TD_COMM_MAX_REGIONS; i++) {
        td_comm_region *g = &c->regions[i];
        if (g->peer && buf >= g->mine && buf + n <= g->mine + g->floats) return g;
    }
    return NULL;
}

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause(); /* yields the core's pipeline to its sibling while spinning */
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

static bool reached(uint32_t arrived, uint32_t barrier) {
    return (int32_t)(arrived - barrier) >= 0; /* wraps after 2^31 barriers: harmless */
}

static long futex(_Atomic uint32_t *word, int op, uint32_t value, const struct timespec *timeout) {
    /* not FUTEX_PRIVATE_FLAG: the word is shared between processes */
    return syscall(SYS_futex, (uint32_t *)word, op, value, timeout, NULL, 0);
}

/* What a neighbour's socket says while this rank waits at a barrier: nothing (the usual), the
 * neighbour is gone (closed: it died, or aborted after its own failure), or it sent data. */
typedef enum { SOCKET_QUIET, SOCKET_CLOSED, SOCKET_DATA } socket_news;

static socket_news neighbour_news(int fd) {
    struct pollfd p = {fd, POLLIN, 0};
    if (poll(&p, 1, 0) <= 0) return SOCKET_QUIET;
    char byte;
    ssize_t k = recv(fd, &byte, 1, MSG_PEEK | MSG_DONTWAIT);
    if (k > 0) return SOCKET_DATA;
    return k == 0 || (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) ? SOCKET_CLOSED
                                                                                 : SOCKET_QUIET;
}

/* Checks both ring neighbours while waiting for the node's q-th rank. A neighbour on this node
 * that sent data has left this barrier for a collective over the sockets; it can only have left
 * after every rank of the node arrived, and it announced its own arrival before sending, so if
 * q has still not arrived the ranks are making different collective calls. (A neighbour on
 * another node may legitimately be ahead: its node's part of the all-reduce ends apart from
 * ours.) */
static int check_neighbours(td_comm *c, td_comm_region *g, int q, uint32_t barrier, td_err *err) {
    for (int side = 0; side < 2; side++) {
        bool next = side == 0;
        int peer = next ? c->ring.next_rank : c->ring.prev_rank;
        socket_news news = neighbour_news(next ? c->ring.next_fd : c->ring.prev_fd);
        if (news == SOCKET_CLOSED) {
            td_fail(err, "it closed the connection"); /* it died, or gave up itself */
            return td_comm_peer_fail(c, &c->ring, next, err);
        }
        if (news == SOCKET_DATA && c->node_first[peer] == c->node_first[c->rank] &&
            !reached(atomic_load(&control_of(g, q)->arrived), barrier)) {
            td_fail(err,
                    "it is in a collective over the sockets while this rank waits in a "
                    "shared-memory all-reduce for rank %d (%s); every rank must make the "
                    "same collective calls in the same order",
                    c->local[q], td_comm_who(c, c->local[q]));
            return td_comm_peer_fail(c, &c->ring, next, err);
        }
    }
    return 0;
}

static int wait_for(td_comm *c, td_comm_region *g, int q, uint32_t barrier, double start,
                    td_err *err) {
    td_comm_ctl *ctl = control_of(g, q);
    double deadline = start + c->timeout_s;
    for (int i = 0; !reached(atomic_load(&ctl->arrived), barrier); i++) {
        if (i % 64 == 0 && td_clock_now() - start > SPIN_S) break;
        cpu_relax();
    }
    while (!reached(atomic_load(&ctl->arrived), barrier)) {
        atomic_fetch_add(&ctl->sleepers, 1);
        uint32_t seen = atomic_load(&ctl->arrived); /* after announcing: no wake-up is lost */
        if (!reached(seen, barrier)) {
            struct timespec ts = {0, SLEEP_NS};
            (void)futex(&ctl->arrived, FUTEX_WAIT, seen, &ts); /* EAGAIN, ETIMEDOUT: re-check */
        }
        atomic_fetch_sub(&ctl->sleepers, 1);
        if (reached(atomic_load(&ctl->arrived), barrier)) break;
        if (check_neighbours(c, g, q, barrier, err) != 0) return -1;
        double now = td_clock_now();
        uint64_t ring = atomic_load(&ctl->ring_step_ns);
        if (now > deadline && ring && now <= (double)ring / 1e9 + c->timeout_s + LEADER_MARGIN_S)
            continue; /* its leader waits on another node within its own timeout */
        if (now > deadline)
            return td_fail(err,
                           "rank %d: timed out after %.0f s waiting for rank %d (%s) to reach "
                           "an all-reduce%s",
                           c->rank, now - start, c->local[q], td_comm_who(c, c->local[q]),
                           ring ? ", stuck in its step of the node leaders' ring"
                                : " (is it stuck, or making other collective calls?)");
    }
    return 0;
}

/* Waits for the node's q-th rank to reach the barrier (timed for TRAIND_PROFILE). */
static int wait_for_peer(td_comm *c, td_comm_region *g, int q, uint32_t barrier, td_err *err) {
    if (reached(atomic_load(&control_of(g, q)->arrived), barrier)) return 0;
    double start = td_clock_now();
    int rc = wait_for(c, g, q, barrier, start, err);
    c->wait_s += td_clock_now() - start;
    return rc;
}

/* A barrier of the node's ranks through the control pages that also checks they all name the
 * same part of the region. */
static int sync_ranks(td_comm *c, td_comm_region *g, uint64_t off, uint64_t n, td_err *err) {
    uint32_t barrier = ++g->barriers;
    td_comm_ctl *me = control_of(g, c->local_pos);
    me->span[barrier & 1][0] = off;
    me->span[barrier & 1][1] = n;
    atomic_store(&me->arrived, barrier); /* seq_cst: ordered before the sleepers load below */
    if (atomic_load(&me->sleepers) > 0) (void)futex(&me->arrived, FUTEX_WAKE, INT_MAX, NULL);
    for (int q = 0; q < c->local_size; q++) {
        if (q == c->local_pos) continue;
        if (wait_for_peer(c, g, q, barrier, err) != 0) return -1;
        const uint64_t *got = control_of(g, q)->span[barrier & 1];
        if (got[0] != off || got[1] != n)
            return td_fail(err,
                           "rank %d: ranks all-reduce different buffers (this rank: %llu floats at "
                           "offset %llu; rank %d: %llu at %llu); every rank must make the same "
                           "collective calls in the same order",
                           c->rank, (unsigned long long)n, (unsigned long long)off, c->local[q],
                           (unsigned long long)got[1], (unsigned long long)got[0]);
    }
    return 0;
}

/* out[k][i] = (in[0][i] + in[1][i] + ...) · scale for each of the outs, summed in rank order.
 * Block by block, every input of a block is read before any output of it is written (an output
 * may be an input). */
static void sum_segment(float *const *in, int ins, float *const *out, int outs, size_t n,
                        float scale) {
    enum { BLOCK = 2048 };
    float acc[BLOCK];
    for (size_t b = 0; b < n; b += BLOCK) {
        size_t m = n - b < BLOCK ? n - b : BLOCK;
        memcpy(acc, in[0] + b, m * sizeof(float));
        for (int p = 1; p < ins; p++)
            for (size_t i = 0; i < m; i++) acc[i] += in[p][b + i];
        if (scale != 1.0f)
            for (size_t i = 0; i < m; i++) acc[i] *= scale;
        for (int p = 0; p < outs; p++) memcpy(out[p] + b, acc, m * sizeof(float));
    }
}

int td_comm_allreduce_shared(td_comm *c, td_comm_region *g, float *buf, size_t n, bool average,
                             td_err *err) {
    int ranks = c->local_size, q = c->local_pos;
    float scale = average ? 1.0f / (float)c->world : 1.0f;
    size_t off = (size_t)(buf - g->mine), so, sl;
    /* 1: every rank's input is complete */
    if (sync_ranks(c, g, off, n, err) != 0) return -1;
    /* only the node's q-th rank reads or writes segment q, in any rank's memory */
    td_comm_segment(n, ranks, q, &so, &sl);
    float *seg[ranks];
    for (int p = 0; p < ranks; p++) seg[p] = g->peer[p] + off + so;
    if (c->nodes == 1) {
        sum_segment(seg, ranks, seg, ranks, sl, scale);
        td_fault_at(TD_FAULT_ALLREDUCE); /* tests: a peer dying mid-collective (td_fault.h) */
        /* 2: every segment is written everywhere; nobody touches this rank's memory any more */
        return sync_ranks(c, g, off, n, err);
    }
    /* several nodes: the node's sum goes to its leader (the node's first rank) */
    sum_segment(seg, ranks, seg, 1, sl, 1.0f);
    /* 2: the leader holds the node's sum; it all-reduces it with the other nodes' leaders */
    if (sync_ranks(c, g, off, n, err) != 0) return -1;
    if (q == 0) {
        td_comm_ctl *me = control_of(g, 0);
        c->ring_mark = &me->ring_step_ns;
        int rc = td_comm_ring_allreduce(c, &c->leaders, g->mine + off, n, err);
        c->ring_mark = NULL;
        if (rc != 0) return -1; /* the mark stays: the node's ranks wait for this rank's abort */
        atomic_store(&me->ring_step_ns, 0);
    }
    /* 3: the leader holds the sum over every node; each rank spreads its segment of it */
    if (sync_ranks(c, g, off, n, err) != 0) return -1;
    sum_segment(seg, 1, seg, ranks, sl, scale);
    /* 4: every segment is written everywhere; nobody touches this rank's memory any more */
    return sync_ranks(c, g, off, n, err);
}
