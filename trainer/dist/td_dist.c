#include "dist/td_dist.h"

#include "core/td_parse.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    /* one node: reach each other where the master is; several: TRAIND_HOST or the hostname */
    const char *host = getenv("TRAIND_HOST");
    if (host && *host)
        snprintf(d->host, sizeof d->host, "%s", host);
    else if (d->local_world == d->world)
        snprintf(d->host, sizeof d->host, "%s", d->master_addr);
    else if (gethostname(d->host, sizeof d->host) != 0)
        return td_fail(err, "gethostname: %s; set TRAIND_HOST", strerror(errno));
    const char *run = getenv("TORCHELASTIC_RUN_ID");
    int restart = 0;
    if (env_int("TORCHELASTIC_RESTART_COUNT", 0, 0, 1 << 20, &restart, err) != 0) return -1;
    td_dist_namespace(d->namespace_, sizeof d->namespace_, run && *run ? run : "none", restart);
    return 0;
}

void td_dist_namespace(char *out, size_t len, const char *run_id, int restart) {
    snprintf(out, len, "%s" TD_DIST_ATTEMPT "%d", run_id, restart);
}
