#define _GNU_SOURCE /* accept4 */
#include "dist/td_net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int remaining_ms(double deadline) {
    double left = deadline - td_clock_now();
    if (left <= 0) return 0;
    return left > 1e6 ? 1000000000 : (int)(left * 1000.0) + 1;
}

static int resolve(const char *host, int port, struct sockaddr_in *addr, td_err *err) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_STREAM}, *res;
    int rc = getaddrinfo(host, NULL, &hints, &res);
    if (rc != 0) return td_fail(err, "%s: cannot resolve: %s", host, gai_strerror(rc));
    *addr = *(struct sockaddr_in *)res->ai_addr;
    addr->sin_port = htons((uint16_t)port);
    freeaddrinfo(res);
    return 0;
}

static void tune(int fd) {
    int one = 1;
    /* small control messages must not wait for Nagle; failure only costs latency */
    (void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int flags = fcntl(fd, F_GETFL, 0);
    if (flags >= 0) (void)fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

int td_net_listen(const char *host, int *port, int *fd_out, td_err *err) {
    struct sockaddr_in addr;
    if (resolve(host, *port, &addr, err) != 0) return -1;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return td_fail(err, "socket: %s", strerror(errno));
    int one = 1;
    (void)setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (bind(fd, (struct sockaddr *)&addr, sizeof addr) != 0 || listen(fd, 256) != 0) {
        int e = errno;
        close(fd);
        return td_fail(err, "cannot listen on %s:%d: %s%s", host, *port, strerror(e),
                       e == EADDRINUSE      ? " (choose another MASTER_PORT)"
                       : e == EADDRNOTAVAIL ? " (not an address of this machine: check TRAIND_HOST "
                                              "or TRAIND_SOCKET_IFNAME)"
                                            : "");
    }
    socklen_t len = sizeof addr;
    getsockname(fd, (struct sockaddr *)&addr, &len);
    *port = ntohs(addr.sin_port);
    tune(fd);
    *fd_out = fd;
    return 0;
}

int td_net_accept(int listen_fd, double deadline, int *fd_out, td_err *err) {
    for (;;) {
        int fd = accept4(listen_fd, NULL, NULL, SOCK_CLOEXEC);
        if (fd >= 0) {
            tune(fd);
            *fd_out = fd;
            return 0;
        }
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return td_fail(err, "accept: %s", strerror(errno));
        struct pollfd p = {listen_fd, POLLIN, 0};
        int ms = remaining_ms(deadline);
        if (ms == 0) return td_fail(err, "timed out waiting for a peer to connect");
        if (poll(&p, 1, ms) < 0 && errno != EINTR) return td_fail(err, "poll: %s", strerror(errno));
    }
}

/* One attempt, bounded by the deadline: a blocking connect() to a host that drops packets waits
 * for the kernel's SYN retries (about two minutes), whatever the deadline says. */
static int connect_once(const struct sockaddr_in *addr, double deadline, int *fd_out) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) return errno;
    int e = connect(fd, (const struct sockaddr *)addr, sizeof *addr) == 0 ? 0 : errno;
    if (e == EINPROGRESS) {
        struct pollfd p = {fd, POLLOUT, 0};
        int rc;
        while ((rc = poll(&p, 1, remaining_ms(deadline))) < 0 && errno == EINTR) {
        }
        socklen_t len = sizeof e;
        if (rc == 0)
            e = ETIMEDOUT;
        else if (rc < 0 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len) != 0)
            e = errno;
    }
    if (e != 0) {
        close(fd);
        return e;
    }
    tune(fd);
    *fd_out = fd;
    return 0;
}

int td_net_connect(const char *host, int port, double deadline, int *fd_out, td_err *err) {
    struct sockaddr_in addr;
    if (resolve(host, port, &addr, err) != 0) return -1;
    int last = 0;
    while (td_clock_now() < deadline) {
        last = connect_once(&addr, deadline, fd_out);
        if (last == 0) return 0;
        /* not listening yet: retry shortly (a back-off, not a synchronisation) */
        struct timespec pause = {0, 20 * 1000 * 1000};
        nanosleep(&pause, NULL);
    }
    return td_fail(err, "cannot connect to %s:%d before the timeout: %s", host, port,
                   last ? strerror(last) : "timed out");
}

static int wait_fd(int fd, short events, double deadline, const char *what, td_err *err) {
    struct pollfd p = {fd, events, 0};
    int ms = remaining_ms(deadline);
    if (ms == 0) return td_fail(err, "timed out %s", what);
    int rc = poll(&p, 1, ms);
    if (rc < 0 && errno != EINTR) return td_fail(err, "poll: %s", strerror(errno));
    if (rc == 0) return td_fail(err, "timed out %s", what);
    return 0;
}

int td_net_send_all(int fd, const void *buf, size_t len, double deadline, td_err *err) {
    const char *p = buf;
    while (len > 0) {
        ssize_t n = send(fd, p, len, MSG_NOSIGNAL);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return td_fail(err, "send failed: %s (the peer closed the connection?)",
                           strerror(errno));
        if (wait_fd(fd, POLLOUT, deadline, "sending", err) != 0) return -1;
    }
    return 0;
}

int td_net_recv_all(int fd, void *buf, size_t len, double deadline, td_err *err) {
    char *p = buf;
    while (len > 0) {
        ssize_t n = recv(fd, p, len, 0);
        if (n > 0) {
            p += n;
            len -= (size_t)n;
            continue;
        }
        if (n == 0) return td_fail(err, "the peer closed the connection");
        if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)
            return td_fail(err, "receive failed: %s", strerror(errno));
        if (wait_fd(fd, POLLIN, deadline, "receiving", err) != 0) return -1;
    }
    return 0;
}

int td_net_exchange(int send_fd, const void *sbuf, size_t slen, int recv_fd, void *rbuf,
                    size_t rlen, double deadline, bool *recv_side, td_err *err) {
    const char *sp = sbuf;
    *recv_side = true;
    char *rp = rbuf;
    while (slen > 0 || rlen > 0) {
        struct pollfd p[2];
        int n = 0, si = -1, ri = -1;
        if (slen > 0) si = n, p[n++] = (struct pollfd){send_fd, POLLOUT, 0};
        if (rlen > 0) ri = n, p[n++] = (struct pollfd){recv_fd, POLLIN, 0};
        int ms = remaining_ms(deadline);
        if (ms == 0) return td_fail(err, "timed out waiting for data");
        int rc = poll(p, (nfds_t)n, ms);
        if (rc < 0 && errno != EINTR) return td_fail(err, "poll: %s", strerror(errno));
        if (rc == 0) return td_fail(err, "timed out waiting for data");
        if (si >= 0 && (p[si].revents & (POLLOUT | POLLERR | POLLHUP))) {
            ssize_t k = send(send_fd, sp, slen, MSG_NOSIGNAL);
            if (k > 0) {
                sp += k;
                slen -= (size_t)k;
            } else if (k < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                *recv_side = false;
                return td_fail(err, "sending failed: %s", strerror(errno));
            }
        }
        if (ri >= 0 && (p[ri].revents & (POLLIN | POLLERR | POLLHUP))) {
            ssize_t k = recv(recv_fd, rp, rlen, 0);
            if (k > 0) {
                rp += k;
                rlen -= (size_t)k;
            } else if (k == 0) {
                return td_fail(err, "it closed the connection");
            } else if (errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
                return td_fail(err, "receive from the previous rank failed: %s", strerror(errno));
            }
        }
    }
    return 0;
}

int td_net_route_address(const char *host, const char *what, char *out, size_t len, td_err *err) {
    struct addrinfo hints = {.ai_family = AF_INET, .ai_socktype = SOCK_DGRAM}, *res = NULL;
    int rc = getaddrinfo(host, "9", &hints, &res);
    if (rc != 0) return td_fail(err, "%s %s: %s", what, host, gai_strerror(rc));
    int fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in self;
    socklen_t n = sizeof self;
    if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0 ||
        getsockname(fd, (struct sockaddr *)&self, &n) != 0)
        rc = td_fail(err, "no route to %s %s: %s", what, host, strerror(errno));
    else
        inet_ntop(AF_INET, &self.sin_addr, out, (socklen_t)len);
    if (fd >= 0) close(fd);
    freeaddrinfo(res);
    return rc;
}
