/* The launchers' c10d rendezvous across nodes (run_options.h): a line protocol over TCP.
 *   launcher -> host   "join RUN_ID NODE_RANK|-1 NPROC"
 *   host -> launcher   "start NODE_RANK MASTER_PORT" | "error TEXT"
 *   launcher -> host   "failed ATTEMPT TEXT" (its workers failed) | "done" (it ended well)
 *   host -> launcher   "stop ATTEMPT TEXT" (another node failed; ATTEMPT -1: for good)
 * Written by hand: torchrun's own rendezvous is PyTorch's c10d store, which no C library
 * speaks, and what the launchers need to say is these four lines. */
#define _GNU_SOURCE
#include "programs/run_options.h"

#include "base/td_clock.h"
#include "base/td_strv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <time.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

enum { MAX_NODES = 1024, LINE = 1024, STOP_DELAY_S = 5, JOIN_IDLE_S = 30, LINES_A_WATCH = 64 };

typedef struct peer {
    int fd, node_rank, want_rank, nproc;
    double since; /* monotonic: when it connected (one that never joins is dropped) */
    bool joined, done, host_side; /* host_side: the host's own launcher */
    char run_id[64];
    char buf[LINE];
    size_t n;
} peer;

/* The host's side, in its thread. */
typedef struct host {
    int listen_fd, nnodes, nproc;
    char run_id[64];
    peer peers[MAX_NODES];
    int n_peers;
    int failed_attempt_told; /* the last attempt whose failure was passed on */
    char refused[LINE];      /* why the last launcher was refused, for the host's own */
    pthread_t thread;
} host;

struct run_rendezvous {
    int fd;
    char endpoint[300];
    char in[LINE];
    size_t n_in;
    int failed_said; /* the attempt whose failure this node said (-1: none) */
    double stop_at;  /* monotonic: when to stop the workers for another node's failure; 0 */
    int stop_attempt;
    char stop_why[LINE];
    bool host_gone;
    host *h;
};

static void send_line(int fd, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void send_line(int fd, const char *fmt, ...) {
    char line[LINE];
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(line, sizeof line - 1, fmt, ap);
    va_end(ap);
    if (k < 0) return;
    if (k > (int)sizeof line - 2) k = (int)sizeof line - 2;
    line[k++] = '\n';
    /* never blocks: a peer that does not read loses what it would not take */
    (void)!send(fd, line, (size_t)k, MSG_NOSIGNAL | MSG_DONTWAIT);
}

/* Whether a line ends in p's buffer: returns it (NUL-terminated, removed), else NULL. */
static char *take_line(char *buf, size_t *n, char *out, size_t len) {
    char *nl = memchr(buf, '\n', *n);
    if (!nl) {
        if (*n == LINE) *n = 0; /* a line too long for the protocol: dropped */
        return NULL;
    }
    size_t k = (size_t)(nl - buf);
    snprintf(out, len, "%.*s", (int)k, buf);
    memmove(buf, nl + 1, *n - k - 1);
    *n -= k + 1;
    return out;
}

/* ---- the host ---------------------------------------------------------------------------------
 */

static void host_error_all(host *h, const char *text) {
    for (int i = 0; i < h->n_peers; i++) {
        send_line(h->peers[i].fd, "error %s", text);
        close(h->peers[i].fd);
    }
    h->n_peers = 0;
}

/* A port every node can reach on this host, free now: the workers' MASTER_PORT. */
static int free_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0) close(fd);
    return port;
}

/* Every node has joined: connections that have not are dropped, then node ranks (the asked-for
 * ones, the host's 0, the rest in join order) and the workers' port, or an error for all. */
static bool host_start(host *h) {
    for (int i = h->n_peers - 1; i >= 0; i--)
        if (!h->peers[i].joined) {
            close(h->peers[i].fd);
            h->peers[i] = h->peers[--h->n_peers];
        }
    bool used[MAX_NODES] = {false};
    for (int i = 0; i < h->n_peers; i++) {
        peer *p = &h->peers[i];
        if (p->want_rank < 0) continue;
        used[p->want_rank] = true; /* (each at most once: host_join refused a second) */
        p->node_rank = p->want_rank;
    }
    for (int pass = 0; pass < 2; pass++) /* the host's own launcher first: it runs rank 0 */
        for (int i = 0; i < h->n_peers; i++) {
            peer *p = &h->peers[i];
            if (p->want_rank >= 0 || p->host_side != (pass == 0)) continue;
            int r = 0;
            while (used[r]) r++;
            used[r] = true;
            p->node_rank = r;
        }
    int port = free_port();
    if (port < 0) {
        host_error_all(h, "the host found no free port for the workers' MASTER_PORT");
        return false;
    }
    for (int i = 0; i < h->n_peers; i++)
        send_line(h->peers[i].fd, "start %d %d", h->peers[i].node_rank, port);
    return true;
}

/* Whether a joined launcher asked for node rank r already. */
static bool rank_taken(const host *h, int r) {
    for (int i = 0; i < h->n_peers; i++)
        if (h->peers[i].joined && h->peers[i].want_rank == r) return true;
    return false;
}

/* A joining launcher's "join RUN_ID NODE_RANK NPROC [host]"; false: it was refused. Anyone may
 * connect (as to torchrun's c10d store): one that does not fit is refused alone, and the host's
 * own launcher is told, so the job's nodes go on joining. */
static bool host_join(host *h, peer *p, const char *line) {
    char run_id[64] = "", role[16] = "";
    int want = -1, nproc = 0;
    char text[LINE];
    if (sscanf(line, "join %63s %d %d %15s", run_id, &want, &nproc, role) < 3 || want < -1 ||
        want >= h->nnodes) {
        snprintf(text, sizeof text,
                 "expected \"join RUN_ID NODE_RANK NPROC\" with a node rank below %d", h->nnodes);
    } else if (strcmp(run_id, h->run_id) != 0) {
        snprintf(text, sizeof text,
                 "a launcher of run \"%s\" joined the host of run \"%s\": give every node the "
                 "same --rdzv-id, or none",
                 run_id, h->run_id);
    } else if (nproc != h->nproc) {
        snprintf(text, sizeof text,
                 "a launcher with --nproc-per-node %d joined a host with %d: give every node "
                 "the same",
                 nproc, h->nproc);
    } else if (want >= 0 && rank_taken(h, want)) {
        snprintf(text, sizeof text, "another launcher was given --node-rank %d already", want);
    } else {
        p->joined = true;
        p->want_rank = want;
        p->host_side = strcmp(role, "host") == 0;
        if (p->host_side && h->refused[0]) /* one came before the host's own launcher */
            send_line(p->fd, "note refused a launcher: %s", h->refused);
        return true;
    }
    send_line(p->fd, "error %s", text);
    snprintf(h->refused, sizeof h->refused, "%s", text);
    for (int i = 0; i < h->n_peers; i++)
        if (h->peers[i].host_side) send_line(h->peers[i].fd, "note refused a launcher: %s", text);
    return false;
}

/* One line from peer i. false: drop the peer. */
static bool host_line(host *h, int i, const char *line, bool *started) {
    peer *p = &h->peers[i];
    if (!p->joined) {
        if (*started) {
            send_line(p->fd, "error the job's %d nodes have joined already", h->nnodes);
            return false;
        }
        if (!host_join(h, p, line)) return false;
        int joined = 0;
        for (int k = 0; k < h->n_peers; k++) joined += h->peers[k].joined;
        if (joined == h->nnodes) *started = host_start(h);
        return true;
    }
    int attempt;
    int at = 0;
    if (strcmp(line, "done") == 0) {
        p->done = true;
    } else if (sscanf(line, "failed %d %n", &attempt, &at) == 1 && at > 0) {
        for (int k = 0; k < h->n_peers; k++)
            if (k != i)
                send_line(h->peers[k].fd, "stop %d node %d: %s", attempt, p->node_rank, line + at);
    }
    return true;
}

static void host_drop(host *h, int i, bool started) {
    peer gone = h->peers[i];
    close(gone.fd);
    h->peers[i] = h->peers[--h->n_peers];
    if (started && gone.joined && !gone.done)
        for (int k = 0; k < h->n_peers; k++)
            send_line(h->peers[k].fd,
                      "stop -1 node %d's traind-run is gone (its connection closed before its "
                      "workers ended)",
                      gone.node_rank);
}

static void *host_main(void *arg) {
    host *h = arg;
    bool started = false;
    struct pollfd fds[MAX_NODES + 1];
    for (;;) {
        if (started && h->n_peers == 0) break;
        /* (full: no accepting, and no polling for it either) */
        fds[0] = (struct pollfd){started || h->n_peers == MAX_NODES ? -1 : h->listen_fd, POLLIN, 0};
        for (int i = 0; i < h->n_peers; i++)
            fds[1 + i] = (struct pollfd){h->peers[i].fd, POLLIN, 0};
        if (poll(fds, (nfds_t)h->n_peers + 1, 1000) < 0 && errno != EINTR) break;
        int polled = h->n_peers; /* fds[1 + i] is peer i's for i below this */
        double now = td_clock_now();
        if (fds[0].revents && h->n_peers < MAX_NODES) {
            int fd = accept4(h->listen_fd, NULL, NULL, SOCK_CLOEXEC);
            if (fd >= 0) h->peers[h->n_peers++] = (peer){.fd = fd, .want_rank = -1, .since = now};
        }

        /* downwards: a dropped peer's place takes the last one, already seen (or new) */
        for (int i = polled - 1; i >= 0; i--) {
            if (i >= h->n_peers || !fds[1 + i].revents) continue;
            peer *p = &h->peers[i];
            ssize_t k = recv(p->fd, p->buf + p->n, sizeof p->buf - p->n, 0);
            bool keep = k > 0;
            if (k > 0) p->n += (size_t)k;
            char line[LINE];
            while (keep && take_line(p->buf, &p->n, line, sizeof line))
                keep = host_line(h, i, line, &started);
            if (!keep && i < h->n_peers) host_drop(h, i, started);
        }
        for (int i = h->n_peers - 1; i >= 0; i--) /* connected but silent: its place goes back */
            if (!h->peers[i].joined && now - h->peers[i].since > JOIN_IDLE_S) {
                close(h->peers[i].fd);
                h->peers[i] = h->peers[--h->n_peers];
            }
    }
    close(h->listen_fd);
    return NULL;
}

/* ---- a launcher ------------------------------------------------------------------------------ */

/* Whether host names this machine (loopback, or an address of one of its interfaces). */
static bool names_this_machine(const char *name) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    if (getaddrinfo(name, NULL, &hints, &res) != 0) return false;
    struct ifaddrs *list = NULL;
    bool mine = false;
    if (getifaddrs(&list) == 0)
        for (struct addrinfo *a = res; a && !mine; a = a->ai_next) {
            struct in_addr want = ((struct sockaddr_in *)a->ai_addr)->sin_addr;
            mine = (ntohl(want.s_addr) >> 24) == 127;
            for (struct ifaddrs *i = list; i && !mine; i = i->ifa_next)
                mine = i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
                       ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == want.s_addr;
        }
    if (list) freeifaddrs(list);
    freeaddrinfo(res);
    return mine;
}

/* Listens at the endpoint's port when this launcher is to host; -1 when another does. */
static int try_host(int port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return -1;
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, 128) != 0) {
        close(fd); /* in use: a launcher on this machine hosts it (or another program) */
        return -1;
    }
    return fd;
}

static int connect_to(const char *name, int port) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res = NULL;
    char service[16];
    snprintf(service, sizeof service, "%d", port);
    if (getaddrinfo(name, service, &hints, &res) != 0) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd >= 0 && connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
        close(fd);
        fd = -1;
    }
    freeaddrinfo(res);
    return fd;
}

/* The next line from the host within the deadline (one that has passed: what has come
 * already): 1, 0 at the connection's end, -1 at the deadline. */
static int read_line(run_rendezvous *r, char *out, size_t len, double deadline) {
    for (;;) {
        if (take_line(r->in, &r->n_in, out, len)) return 1;
        double left = deadline - td_clock_now();
        struct pollfd p = {r->fd, POLLIN, 0};
        int ready = poll(&p, 1, left > 0 ? (int)(left * 1000) + 1 : 0);
        if (ready <= 0) {
            if (left <= 0) return -1;
            continue;
        }
        ssize_t k = recv(r->fd, r->in + r->n_in, sizeof r->in - r->n_in, 0);
        if (k <= 0) return 0;
        r->n_in += (size_t)k;
    }
}

/* --rdzv-conf's join_timeout (seconds, 1 to a day), torchrun's default 600 otherwise. */
static double join_timeout(const run_options *o) {
    char conf[512];
    snprintf(conf, sizeof conf, "%s", o->rdzv_conf ? o->rdzv_conf : "");
    char *save = NULL;
    for (char *kv = strtok_r(conf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        if (strncmp(kv, "join_timeout=", 13) != 0) continue;
        char *end;
        double v = strtod(kv + 13, &end);
        if (*end || !(v >= 1 && v <= 86400)) {
            fprintf(stderr,
                    "traind-run: --rdzv-conf join_timeout=%s: expected seconds, 1 to "
                    "86400\n",
                    kv + 13);
            exit(2);
        }
        return v;
    }
    return 600;
}

static void fail(run_rendezvous *r, const char *fmt, ...)
    __attribute__((noreturn, format(printf, 2, 3)));
static void fail(run_rendezvous *r, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "traind-run: the rendezvous at %s: ", r->endpoint);
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(1);
}

/* Called while an attempt runs: says this node's failure once, reads what the host says, and
 * answers whether the workers should stop for another node's failure now. */
static bool watch(void *arg, int attempt, const td_group *g, char *why, size_t len) {
    run_rendezvous *r = arg;
    if (g->first_failure && r->failed_said < attempt) {
        send_line(r->fd, "failed %d %s", attempt, g->reason);
        r->failed_said = attempt;
    }
    if (r->stop_at > 0 && r->stop_attempt != -1 && r->stop_attempt != attempt) r->stop_at = 0;
    char line[LINE];
    int got, lines = 0; /* (a bounded number each call: the workers are watched meanwhile) */
    while (!r->host_gone && lines++ < LINES_A_WATCH &&
           (got = read_line(r, line, sizeof line, td_clock_now())) != -1) {
        int a = -1, at = 0;
        const char *what = line;
        if (got == 0) {
            r->host_gone = true;
            what = "the rendezvous host (node 0's traind-run) is gone";
        } else if (sscanf(line, "stop %d %n", &a, &at) == 1 && at > 0) {
            what = line + at;
        } else {
            continue;
        }
        if (r->stop_at == 0 && (a == -1 || a == attempt)) {
            r->stop_at = td_clock_now() + STOP_DELAY_S;
            r->stop_attempt = a;
            snprintf(r->stop_why, sizeof r->stop_why, "%s", what);
        }
    }
    if (r->stop_at == 0 || td_clock_now() < r->stop_at || g->terminating) return false;
    snprintf(why, len, "%s (%d s ago)", r->stop_why, STOP_DELAY_S);
    return true;
}

run_rendezvous *run_rendezvous_join(run_options *o, FILE *log) {
    td_launch_config *c = &o->launch;
    if (!o->rdzv_backend || strcmp(o->rdzv_backend, "c10d") != 0 || c->nnodes < 2) return NULL;
    if (c->nnodes > MAX_NODES || strchr(c->master_addr, ':')) {
        fprintf(stderr,
                "traind-run: the c10d rendezvous across nodes takes up to %d nodes at an "
                "IPv4 address or a host name (--nnodes %d, --rdzv-endpoint %s)\n",
                MAX_NODES, c->nnodes, c->master_addr);
        exit(2);
    }
    run_rendezvous *r = td_calloc(1, sizeof *r);
    r->failed_said = -1;
    snprintf(r->endpoint, sizeof r->endpoint, "%s:%d", c->master_addr, c->master_port);
    bool may_host = o->node_rank_given ? c->node_rank == 0 : names_this_machine(c->master_addr);
    int listen_fd = may_host ? try_host(c->master_port) : -1;
    if (listen_fd >= 0) {
        r->h = td_calloc(1, sizeof *r->h);
        *r->h = (host){.listen_fd = listen_fd, .nnodes = c->nnodes, .nproc = c->nproc_per_node};
        snprintf(r->h->run_id, sizeof r->h->run_id, "%s", c->run_id);
        if (pthread_create(&r->h->thread, NULL, host_main, r->h) != 0)
            fail(r, "cannot start the host's thread");
    }
    double timeout = join_timeout(o), deadline = td_clock_now() + timeout;
    bool said = false;
    while ((r->fd = connect_to(c->master_addr, c->master_port)) < 0) {
        if (td_clock_now() >= deadline)
            fail(r, "no host answered within join_timeout %g s (--rdzv-conf join_timeout=S)",
                 timeout);
        if (!said)
            fprintf(log, "[traind-run] waiting for the rendezvous host at %s\n", r->endpoint);
        said = true;
        struct timespec pause = {0, 200 * 1000 * 1000}; /* a host not started yet: again soon */
        nanosleep(&pause, NULL);
    }
    send_line(r->fd, "join %s %d %d%s", c->run_id, o->node_rank_given ? c->node_rank : -1,
              c->nproc_per_node, r->h ? " host" : "");
    char line[LINE];
    int got;
    while ((got = read_line(r, line, sizeof line, deadline)) == 1 && strncmp(line, "note ", 5) == 0)
        fprintf(log, "[traind-run] the rendezvous host %s\n", line + 5);
    int node_rank, port;
    if (got < 0)
        fail(r, "not every node joined within join_timeout %g s (--nnodes %d)", timeout, c->nnodes);
    if (got == 0) fail(r, "the host closed the connection before the job began");
    if (strncmp(line, "error ", 6) == 0) fail(r, "%s", line + 6);
    if (sscanf(line, "start %d %d", &node_rank, &port) != 2 || node_rank < 0 ||
        node_rank >= c->nnodes || port <= 0 || port > 65535)
        fail(r, "the host said \"%.200s\"", line);
    c->node_rank = node_rank;
    c->master_port = port;
    c->watch = watch;
    c->watch_arg = r;
    fprintf(log,
            "[traind-run] node rank %d of %d (c10d rendezvous at %s%s); the workers' "
            "MASTER_ADDR %s, MASTER_PORT %d\n",
            node_rank, c->nnodes, r->endpoint, r->h ? ", hosted here" : "", c->master_addr, port);
    return r;
}

void run_rendezvous_finish(run_rendezvous *r, int code) {
    if (!r) return;
    if (code == 0) send_line(r->fd, "done");
    close(r->fd);
    if (r->h) {
        /* the others may still run: the host stays until each has ended (or 5 minutes, as
         * torchrun's exit barrier waits) */
        struct timespec until;
        clock_gettime(CLOCK_REALTIME, &until);
        until.tv_sec += 300;
        if (pthread_timedjoin_np(r->h->thread, NULL, &until) != 0)
            fprintf(stderr, "[traind-run] the other nodes did not end within 300 s; leaving\n");
        else
            free(r->h);
    }
    free(r);
}
