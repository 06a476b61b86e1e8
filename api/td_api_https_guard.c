/* The HTTPS port's door (td_api_private.h): a client that speaks plain HTTP to it gets a plain
 * HTTP 400 that says to use https://, the way nginx and Go's server answer, instead of a closed
 * connection ("Empty reply from server") that tells a newcomer nothing.
 *
 * libmicrohttpd has no hook before its TLS handshake, so this thread accepts the connections
 * itself and looks at each one's first byte without reading it (MSG_PEEK): a TLS record starts
 * with a byte below 0x20 (22, a handshake); an HTTP request with a method's capital letter. TLS
 * goes on to libmicrohttpd (MHD_add_connection) untouched; HTTP gets the answer and is closed.
 *
 * Every waiting connection is bounded: at most GUARD_PENDING_MAX wait for their first byte, at
 * most GUARD_PENDING_PER_ADDRESS of one address, each for at most GUARD_FIRST_BYTE_S (or the
 * configured connection timeout, if shorter); one that says nothing is closed, as
 * libmicrohttpd's own timeout would. The listen queue is always drained: a full list makes room
 * by closing its oldest connection, so silent connections from a few addresses cannot keep new
 * ones in the kernel's queue. Only poll() and non-blocking calls here: one silent client never
 * holds the others. When descriptors run out, accepting pauses briefly instead of spinning. */
#define _GNU_SOURCE /* accept4, pipe2, strcasestr */
#include "api/td_api_private.h"

#include <errno.h>
#include <fcntl.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#define GUARD_PENDING_MAX         64
#define GUARD_PENDING_PER_ADDRESS 8
#define GUARD_FIRST_BYTE_S        5.0 /* a TLS client's hello comes one round trip after connect */
#define GUARD_PAUSE_S             0.5 /* accepting waits this long when descriptors run out */
#define GUARD_LINGER_S            2.0 /* after the answer: its request read and dropped */
#define GUARD_LOG_EVERY_S         60.0

typedef struct guard_conn {
    int fd;
    bool answered; /* the 400 is sent: waiting for the client to close (or the deadline) */
    double deadline;
    struct sockaddr_storage addr;
    socklen_t addr_len;
} guard_conn;

struct td_api_https_guard {
    struct MHD_Daemon *daemon;
    td_log *log;
    int listen_fd, wake[2];
    double first_byte_s; /* GUARD_FIRST_BYTE_S, or the connection timeout if shorter */
    double paused_until; /* monotonic: accepting stops till then (out of descriptors) */
    double last_trouble; /* the last log line about accept or poll failing */
    pthread_t thread;
    guard_conn pending[GUARD_PENDING_MAX];
    int n;
    double last_logged;
    unsigned long unlogged;
};

static double now_s(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec / 1e9;
}

/* The same host: the address alone, never the port (nor IPv6's flow label) */
static bool same_address(const guard_conn *a, const struct sockaddr_storage *b, socklen_t len) {
    (void)len;
    if (a->addr.ss_family != b->ss_family) return false;
    if (b->ss_family == AF_INET)
        return ((const struct sockaddr_in *)&a->addr)->sin_addr.s_addr ==
               ((const struct sockaddr_in *)b)->sin_addr.s_addr;
    if (b->ss_family == AF_INET6)
        return memcmp(&((const struct sockaddr_in6 *)&a->addr)->sin6_addr,
                      &((const struct sockaddr_in6 *)b)->sin6_addr, sizeof(struct in6_addr)) == 0;
    return false;
}

/* At most one line a minute about the listener's own trouble (accept or poll failing). */
static void trouble(td_api_https_guard *g, const char *what, int e) {
    double t = now_s();
    if (t - g->last_trouble < GUARD_LOG_EVERY_S) return;
    g->last_trouble = t;
    td_log_warn(g->log, "HTTP server: the HTTPS port's listener: %s: %s", what, strerror(e));
}

static void drop(td_api_https_guard *g, int i) {
    close(g->pending[i].fd);
    g->pending[i] = g->pending[--g->n];
}

/* A new connection waits for its first byte, unless its address already has its share waiting;
 * a full list first closes its oldest. false: nothing more to accept now. */
static bool accept_one(td_api_https_guard *g) {
    guard_conn c = {.addr_len = sizeof c.addr};
    c.fd = accept4(g->listen_fd, (struct sockaddr *)&c.addr, &c.addr_len,
                   SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (c.fd < 0) {
        /* out of descriptors or memory: the connection stays queued and poll() would return at
         * once for as long as that lasts, so accepting pauses (as libmicrohttpd's at_limit) */
        if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
            g->paused_until = now_s() + GUARD_PAUSE_S;
            trouble(g, "accept (paused)", errno);
            return false;
        }
        return errno == ECONNABORTED || errno == EINTR; /* else EAGAIN: the queue is empty */
    }
    int same = 0;
    for (int i = 0; i < g->n; i++) same += same_address(&g->pending[i], &c.addr, c.addr_len);
    if (same >= GUARD_PENDING_PER_ADDRESS) {
        close(c.fd);
        return true;
    }
    if (g->n == GUARD_PENDING_MAX) {
        int oldest = 0;
        for (int i = 1; i < g->n; i++)
            if (g->pending[i].deadline < g->pending[oldest].deadline) oldest = i;
        drop(g, oldest);
    }
    c.deadline = now_s() + g->first_byte_s;
    g->pending[g->n++] = c;
    return true;
}

/* The Host header's value as sent, when it is a plain host[:port] (nothing to escape in JSON). */
static void request_host(const char *req, char *host, size_t cap) {
    host[0] = 0;
    const char *h = strcasestr(req, "\r\nhost:");
    if (!h) return;
    h += 7;
    h += strspn(h, " \t");
    size_t n = strspn(h, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.-:[]");
    if (n == 0 || n >= cap || (h[n] != '\r' && h[n] != ' ')) return;
    memcpy(host, h, n);
    host[n] = 0;
}

static void answer_plain_http(td_api_https_guard *g, guard_conn *c, const char *req) {
    char host[256], body[512], reply[1024];
    request_host(req, host, sizeof host);
    int nb = snprintf(body, sizeof body,
                      "{\"error\":{\"code\":\"https_required\",\"message\":\"this port speaks "
                      "HTTPS, and the request came as plain HTTP: use https://%s/ (and the "
                      "cluster's CA: curl --cacert, trainctl --cacert)\",\"field\":null}}\n",
                      host[0] ? host : "HOST:PORT");
    int nr = snprintf(reply, sizeof reply,
                      "HTTP/1.1 400 Bad Request\r\nContent-Type: application/json\r\n"
                      "Content-Length: %d\r\nConnection: close\r\n\r\n%s",
                      nb, body);
    /* the log line before the answer: a client that has its answer finds the line written */
    double t = now_s();
    if (t - g->last_logged >= GUARD_LOG_EVERY_S) {
        char more[64] = "";
        if (g->unlogged)
            snprintf(more, sizeof more, " (and %lu more since the last such line)", g->unlogged);
        char who[INET6_ADDRSTRLEN] = "?";
        const void *a = c->addr.ss_family == AF_INET6
                            ? (const void *)&((const struct sockaddr_in6 *)&c->addr)->sin6_addr
                            : (const void *)&((const struct sockaddr_in *)&c->addr)->sin_addr;
        inet_ntop(c->addr.ss_family, a, who, sizeof who);
        td_log_warn(g->log,
                    "HTTP server: a client (%s) sent plain HTTP to the HTTPS port; it was told "
                    "to use https://%s",
                    who, more);
        g->unlogged = 0;
        g->last_logged = t;
    } else {
        g->unlogged++; /* one line a minute: a client cannot fill the log */
    }
    /* a few hundred bytes into an empty socket buffer: all of it goes, or the client is gone */
    (void)!send(c->fd, reply, (size_t)nr, MSG_NOSIGNAL | MSG_DONTWAIT);
    shutdown(c->fd, SHUT_WR);
    c->answered = true;
    c->deadline = t + GUARD_LINGER_S;
}

/* Connection i has bytes (or an end). Returns whether it left the pending list. */
static bool readable(td_api_https_guard *g, int i) {
    guard_conn *c = &g->pending[i];
    char buf[2048];
    if (c->answered) { /* its request, read and dropped so that closing sends no reset */
        ssize_t r = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (r > 0 || (r < 0 && (errno == EAGAIN || errno == EINTR))) return false;
        drop(g, i);
        return true;
    }
    ssize_t r = recv(c->fd, buf, sizeof buf - 1, MSG_PEEK | MSG_DONTWAIT);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return false;
    if (r <= 0) {
        drop(g, i);
        return true;
    }
    buf[r] = 0;
    if (buf[0] >= 'A' && buf[0] <= 'Z') {
        answer_plain_http(g, c, buf);
        return false;
    }
    /* TLS (or garbage, which libmicrohttpd's handshake refuses as before): it owns the socket
     * from here, closes it on failure, and counts it against its own connection limits */
    guard_conn taken = *c;
    g->pending[i] = g->pending[--g->n];
    MHD_add_connection(g->daemon, taken.fd, (const struct sockaddr *)&taken.addr, taken.addr_len);
    return true;
}

static int poll_timeout_ms(const td_api_https_guard *g, double t) {
    double soonest = t + 60.0;
    if (g->paused_until > t) soonest = g->paused_until;
    for (int i = 0; i < g->n; i++)
        if (g->pending[i].deadline < soonest) soonest = g->pending[i].deadline;
    double ms = (soonest - t) * 1000.0 + 1.0;
    return ms < 0 ? 0 : (int)ms;
}

static void *guard_main(void *arg) {
    td_api_https_guard *g = arg;
    struct pollfd fds[GUARD_PENDING_MAX + 2];
    for (;;) {
        double t = now_s();
        fds[0] = (struct pollfd){.fd = g->wake[0], .events = POLLIN};
        fds[1] = (struct pollfd){.fd = t >= g->paused_until ? g->listen_fd : -1, .events = POLLIN};
        int n = g->n;
        for (int i = 0; i < n; i++) fds[i + 2] = (struct pollfd){g->pending[i].fd, POLLIN, 0};
        int r = poll(fds, (nfds_t)n + 2, poll_timeout_ms(g, t));
        if (r < 0) {
            /* only the wake pipe ends this thread: anything else (ENOMEM) waits and retries,
             * or the HTTPS port would stop accepting without a word */
            if (errno != EINTR) {
                trouble(g, "poll", errno);
                nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
            }
            continue;
        }
        if (fds[0].revents) break;
        /* backwards: drop() moves the last entry into the hole, which was already seen */
        for (int i = n - 1; i >= 0; i--)
            if (fds[i + 2].revents) readable(g, i);
        t = now_s();
        for (int i = g->n - 1; i >= 0; i--)
            if (g->pending[i].deadline <= t) drop(g, i);
        /* a burst at a time: the queue drains even while clients keep connecting */
        if (fds[1].revents & POLLIN)
            for (int k = 0; k < GUARD_PENDING_MAX && accept_one(g); k++) continue;
    }
    return NULL;
}

int td_api_https_guard_start(td_api_https_guard **out, int listen_fd, struct MHD_Daemon *daemon,
                             double connection_timeout_s, td_log *log, td_err *err) {
    td_api_https_guard *g = td_calloc(1, sizeof *g);
    g->first_byte_s = connection_timeout_s > 0 && connection_timeout_s < GUARD_FIRST_BYTE_S
                          ? connection_timeout_s
                          : GUARD_FIRST_BYTE_S;
    g->last_trouble = -GUARD_LOG_EVERY_S;
    g->daemon = daemon;
    g->log = log;
    g->listen_fd = listen_fd;
    g->last_logged = -GUARD_LOG_EVERY_S;
    int fl = fcntl(listen_fd, F_GETFL);
    if (fl < 0 || fcntl(listen_fd, F_SETFL, fl | O_NONBLOCK) != 0 ||
        pipe2(g->wake, O_CLOEXEC) != 0) {
        int e = errno;
        free(g);
        return td_fail(err, "the HTTPS port's listener: %s", strerror(e));
    }
    int e = pthread_create(&g->thread, NULL, guard_main, g);
    if (e != 0) {
        close(g->wake[0]);
        close(g->wake[1]);
        free(g);
        return td_fail(err, "the HTTPS port's listener: a thread: %s", strerror(e));
    }
    *out = g;
    return 0;
}

void td_api_https_guard_stop(td_api_https_guard *g) {
    if (!g) return;
    (void)!write(g->wake[1], "x", 1);
    pthread_join(g->thread, NULL);
    for (int i = 0; i < g->n; i++) close(g->pending[i].fd);
    close(g->wake[0]);
    close(g->wake[1]);
    close(g->listen_fd); /* as MHD_stop_daemon closes the listen socket it was given */
    free(g);
}
