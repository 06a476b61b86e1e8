#define _GNU_SOURCE /* getifaddrs, getaddrinfo */
#include "dist/td_dist.h"

#include "base/td_parse.h"
#include "dist/td_net.h"

#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

static int env_int(const char *name, int def, int min, int max, int *out, td_err *err) {
    const char *v = getenv(name);
    if (!v || !*v) {
        *out = def;
        return 0;
    }
    long x;
    if (!td_parse_long(v, min, max, &x))
        return td_fail(err, "environment variable %s=\"%s\": expected an integer in [%d, %d]", name,
                       v, min, max);
    *out = (int)x;
    return 0;
}

int td_dist_from_env(td_dist *d, td_err *err) {
    memset(d, 0, sizeof *d);
    d->world = 1;
    d->timeout_s = 300.0;
    bool has_rank = getenv("RANK") != NULL, has_world = getenv("WORLD_SIZE") != NULL;
    if (has_rank != has_world)
        return td_fail(err,
                       "environment: RANK and WORLD_SIZE must be set together (found only "
                       "%s)",
                       has_rank ? "RANK" : "WORLD_SIZE");
    if (env_int("WORLD_SIZE", 1, 1, 1 << 16, &d->world, err) != 0 ||
        env_int("RANK", 0, 0, d->world - 1, &d->rank, err) != 0 ||
        env_int("LOCAL_WORLD_SIZE", d->world, 1, d->world, &d->local_world, err) != 0 ||
        env_int("LOCAL_RANK", d->rank % d->local_world, 0, d->local_world - 1, &d->local_rank,
                err) != 0 ||
        env_int("GROUP_RANK", d->rank / d->local_world, 0, 1 << 16, &d->group_rank, err) != 0)
        return -1;
    int timeout = 300;
    if (env_int("TRAIND_TIMEOUT_S", 300, 1, 86400, &timeout, err) != 0) return -1;
    d->timeout_s = timeout;
    if (d->world == 1) return 0;
    const char *addr = getenv("MASTER_ADDR");
    if (!addr || !*addr)
        return td_fail(err, "environment: WORLD_SIZE is %d but MASTER_ADDR is not set", d->world);
    snprintf(d->master_addr, sizeof d->master_addr, "%s", addr);
    if (!getenv("MASTER_PORT"))
        return td_fail(err, "environment: WORLD_SIZE is %d but MASTER_PORT is not set", d->world);
    if (env_int("MASTER_PORT", 0, 1, 65535, &d->master_port, err) != 0) return -1;
    if (td_dist_pick_host(d, err) != 0) return -1;
    const char *run = getenv("TORCHELASTIC_RUN_ID");
    int restart = 0;
    if (env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20, &restart, err) != 0) return -1;
    td_dist_namespace(d->namespace_, sizeof d->namespace_, run && *run ? run : "none", restart);
    return 0;
}

/* The IPv4 address of interface `name`. */
static int interface_address(const char *name, char *out, size_t len, td_err *err) {
    struct ifaddrs *list;
    if (getifaddrs(&list) != 0) return td_fail(err, "getifaddrs: %s", strerror(errno));
    int rc = td_fail(err, "no network interface named \"%s\" with an IPv4 address", name);
    for (struct ifaddrs *i = list; i; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET && strcmp(i->ifa_name, name) == 0) {
            inet_ntop(AF_INET, &((struct sockaddr_in *)i->ifa_addr)->sin_addr, out, (socklen_t)len);
            rc = 0;
            break;
        }
    freeifaddrs(list);
    return rc;
}

int td_dist_pick_host(td_dist *d, td_err *err) {
    const char *host = getenv("TRAIND_HOST");
    const char *ifname = getenv("TRAIND_SOCKET_IFNAME");
    const char *ifvar = "TRAIND_SOCKET_IFNAME";
    if (!ifname || !*ifname) ifname = getenv("GLOO_SOCKET_IFNAME"), ifvar = "GLOO_SOCKET_IFNAME";
    if (host && *host) {
        snprintf(d->host, sizeof d->host, "%s", host);
        snprintf(d->host_why, sizeof d->host_why, "TRAIND_HOST");
    } else if (ifname && *ifname) {
        if (interface_address(ifname, d->host, sizeof d->host, err) != 0)
            return td_fail_prefix(err, "%s", ifvar);
        snprintf(d->host_why, sizeof d->host_why, "the address of %.64s (%s)", ifname, ifvar);
    } else if (d->local_world == d->world) {
        snprintf(d->host, sizeof d->host, "%s", d->master_addr);
        snprintf(d->host_why, sizeof d->host_why, "one node: where the master is");
    } else {
        if (td_net_route_address(d->master_addr, "the master", d->host, sizeof d->host, err) != 0)
            return td_fail_prefix(err, "choosing the address to advertise (set TRAIND_HOST or "
                                       "TRAIND_SOCKET_IFNAME)");
        snprintf(d->host_why, sizeof d->host_why,
                 "the local address of the route to the master %.64s", d->master_addr);
    }
    return 0;
}

void td_dist_namespace(char *out, size_t len, const char *run_id, int restart) {
    snprintf(out, len, "%s" TD_DIST_ATTEMPT "%d", run_id, restart);
}
