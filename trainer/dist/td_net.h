/* TCP plumbing for the rendezvous store and the CPU collectives: listen, connect with retries,
 * and exact sends and receives, every one bounded by a deadline (a monotonic time in seconds).
 * Nothing here blocks without one: a dead or silent peer becomes an error, never a hang. */
#ifndef TD_NET_H
#define TD_NET_H

#include "base/td_clock.h" /* deadlines are td_clock_now() times */
#include "base/td_error.h"

#include <stdbool.h>
#include <stddef.h>

/* Listens on host:port (port 0: any free port, written back). */
int td_net_listen(const char *host, int *port, int *fd_out, td_err *err);
/* Accepts one connection before the deadline. */
int td_net_accept(int listen_fd, double deadline, int *fd_out, td_err *err);
/* Connects to host:port, retrying refused connections until the deadline (the peer may not be
 * listening yet). */
int td_net_connect(const char *host, int port, double deadline, int *fd_out, td_err *err);

/* The local IPv4 address the kernel would send from to reach host: a UDP socket "connected"
 * there (which sends nothing) and asked its own name. what names host in errors ("the master"). */
int td_net_route_address(const char *host, const char *what, char *out, size_t len, td_err *err);

int td_net_send_all(int fd, const void *buf, size_t len, double deadline, td_err *err);
int td_net_recv_all(int fd, void *buf, size_t len, double deadline, td_err *err);

/* Sends sbuf on send_fd while receiving rbuf on recv_fd, both to completion, interleaved so two
 * peers exchanging large buffers cannot deadlock on full socket buffers. On failure *recv_side
 * tells which side failed (true: the receive; also for a timeout). */
int td_net_exchange(int send_fd, const void *sbuf, size_t slen, int recv_fd, void *rbuf,
                    size_t rlen, double deadline, bool *recv_side, td_err *err);

#endif
