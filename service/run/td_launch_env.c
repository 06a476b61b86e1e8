/* A worker's environment: torchrun's variables, what the launcher chooses for the network, and
 * whatever else the worker inherits or the daemon adds. */
#define _GNU_SOURCE /* environ */
#include "dist/td_net.h"
#include "service/run/td_launch_private.h"
#include "base/td_strv.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern char **environ;

/* The variables a worker's environment gets from us, replacing any inherited value. */
static const char *const OURS[] = {"RANK",
                                   "NODE_RANK",
                                   "LOCAL_RANK",
                                   "WORLD_SIZE",
                                   "LOCAL_WORLD_SIZE",
                                   "GROUP_RANK",
                                   "ROLE_RANK",
                                   "ROLE_NAME",
                                   "GROUP_WORLD_SIZE",
                                   "ROLE_WORLD_SIZE",
                                   "MASTER_ADDR",
                                   "MASTER_PORT",
                                   "TORCHELASTIC_RUN_ID",
                                   "TORCHELASTIC_RESTART_COUNT",
                                   "TORCHELASTIC_MAX_RESTARTS",
                                   "TORCHELASTIC_USE_AGENT_STORE",
                                   "TORCHELASTIC_ERROR_FILE",
                                   NULL};

/* Set as torchrun sets them, unless the user chose a value: NCCL then watches its collectives
 * and fails a rank whose peer is gone instead of hanging (PyTorch before 2.2 reads the name
 * without TORCH_, later ones the other). */
static const char *const DEFAULTS[][2] = {{"TORCH_NCCL_ASYNC_ERROR_HANDLING", "1"},
                                          {"NCCL_ASYNC_ERROR_HANDLING", "1"}};

static bool named(const char *entry, const char *name) {
    size_t k = strlen(name);
    return strncmp(entry, name, k) == 0 && entry[k] == '=';
}

/* What systemd gives the daemon alone: a job's process that saw NOTIFY_SOCKET or WATCHDOG_PID
 * could speak for the service (or think a watchdog expects it to ping). */
static const char *const THE_DAEMONS[] = {"NOTIFY_SOCKET",
                                          "WATCHDOG_USEC",
                                          "WATCHDOG_PID",
                                          "LISTEN_FDS",
                                          "LISTEN_PID",
                                          "LISTEN_FDNAMES",
                                          NULL};

static bool in_extra(const char *entry, const td_launch_config *cfg) {
    for (int i = 0; cfg->extra_env && cfg->extra_env[i]; i++) {
        const char *eq = strchr(cfg->extra_env[i], '=');
        if (eq && strncmp(entry, cfg->extra_env[i], (size_t)(eq - cfg->extra_env[i]) + 1) == 0)
            return true;
    }
    return false;
}

static bool overridden(const char *entry, const td_launch_config *cfg) {
    for (int i = 0; OURS[i]; i++)
        if (named(entry, OURS[i])) return true;
    for (int i = 0; THE_DAEMONS[i]; i++)
        if (named(entry, THE_DAEMONS[i])) return true;
    if (cfg->devices && named(entry, "CUDA_VISIBLE_DEVICES")) return true;
    return in_extra(entry, cfg);
}

/* Whether the worker gets `name` from its inherited environment or the daemon's additions. */
static bool user_set(const td_launch_config *cfg, const char *name) {
    char probe[96];
    snprintf(probe, sizeof probe, "%s=", name);
    return getenv(name) != NULL || in_extra(probe, cfg);
}

/* "NAME=value", allocated. */
static char *entry(const char *name, const char *value) {
    size_t n = strlen(name) + strlen(value) + 2;
    char *s = td_malloc(n);
    snprintf(s, n, "%s=%s", name, value);
    return s;
}

static char *int_entry(const char *name, int v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d", v);
    return entry(name, buf);
}

/* The interface holding IPv4 address addr; false when none does. */
static bool interface_of(const char *addr, char *out, size_t len) {
    struct in_addr want;
    struct ifaddrs *list;
    if (inet_pton(AF_INET, addr, &want) != 1 || getifaddrs(&list) != 0) return false;
    bool found = false;
    for (struct ifaddrs *i = list; i && !found; i = i->ifa_next)
        if (i->ifa_addr && i->ifa_addr->sa_family == AF_INET &&
            ((struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr == want.s_addr) {
            snprintf(out, len, "%s", i->ifa_name);
            found = true;
        }
    freeifaddrs(list);
    return found;
}

/* With several nodes, Gloo and NCCL pick their address from the hostname unless told an
 * interface, and Debian's /etc/hosts maps the hostname to 127.0.1.1: the peers on other nodes
 * are then told to connect to a loopback address ("connect [127.0.0.1]:N: Connection refused").
 * So the workers get the interface of this node's route to MASTER_ADDR, the one its peers reach
 * it by (what traind-worker advertises too), unless the user named one. */
void td_launch_shared_init(const td_launch_config *cfg, td_launch_shared *sh, char *note,
                           size_t note_len) {
    memset(sh, 0, sizeof *sh);
    note[0] = 0;
    if (cfg->nnodes < 2 || user_set(cfg, "GLOO_SOCKET_IFNAME") ||
        user_set(cfg, "NCCL_SOCKET_IFNAME"))
        return;
    char addr[64];
    td_err err = {{0}};
    if (td_net_route_address(cfg->master_addr, "MASTER_ADDR", addr, sizeof addr, &err) != 0) {
        snprintf(note, note_len, "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME not set: %s", err.msg);
        return;
    }
    char ifname[64];
    if (!interface_of(addr, ifname, sizeof ifname)) {
        snprintf(note, note_len,
                 "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME not set: no interface holds %s, the "
                 "address of the route to MASTER_ADDR %.64s",
                 addr, cfg->master_addr);
        return;
    }
    if (strncmp(addr, "127.", 4) == 0) { /* the other nodes could not reach it */
        snprintf(note, note_len,
                 "GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME not set: MASTER_ADDR %.64s is a "
                 "loopback address (%s) on this node, which the other nodes cannot reach; set "
                 "them (or give the master's routable address)",
                 cfg->master_addr, addr);
        return;
    }
    snprintf(sh->socket_ifname, sizeof sh->socket_ifname, "%s", ifname);
    snprintf(note, note_len,
             "GLOO_SOCKET_IFNAME=%s NCCL_SOCKET_IFNAME==%s: the interface of the route to "
             "MASTER_ADDR %.64s (%s); set either to choose another",
             ifname, ifname, cfg->master_addr, addr);
}

void td_launch_error_file(const td_launch_config *cfg, int attempt, int local_rank, char *out,
                          size_t len) {
    if (!cfg->error_dir || !cfg->error_dir[0]) {
        out[0] = 0;
        return;
    }
    snprintf(out, len, "%s/attempt_%d/%d/error.json", cfg->error_dir, attempt, local_rank);
}

char **td_launch_worker_env(const td_launch_config *cfg, const td_launch_shared *sh, int r,
                            int attempt) {
    size_t n_env = 0, n_extra = 0;
    while (environ[n_env]) n_env++;
    while (cfg->extra_env && cfg->extra_env[n_extra]) n_extra++;
    char **env = td_strv_new((int)(n_env + n_extra + 28));
    size_t k = 0;
    for (size_t i = 0; i < n_env; i++)
        if (!overridden(environ[i], cfg)) env[k++] = td_str_dup(environ[i]);
    int world = cfg->nnodes * cfg->nproc_per_node;
    /* a launching process (launch_self) stands for the node's first rank; its processes take
     * RANK = NODE_RANK * LOCAL_WORLD_SIZE + i, as the mp.spawn tutorials compute it */
    if (cfg->launch_self) env[k++] = int_entry("NODE_RANK", cfg->node_rank);
    env[k++] = int_entry("RANK", cfg->node_rank * cfg->nproc_per_node + r);
    env[k++] = int_entry("LOCAL_RANK", r);
    env[k++] = int_entry("WORLD_SIZE", world);
    env[k++] = int_entry("LOCAL_WORLD_SIZE", cfg->nproc_per_node);
    env[k++] = int_entry("GROUP_RANK", cfg->node_rank);
    /* torchrun's role variables: one role ("default") holding every rank */
    env[k++] = int_entry("ROLE_RANK", cfg->node_rank * cfg->nproc_per_node + r);
    env[k++] = entry("ROLE_NAME", "default");
    env[k++] = int_entry("GROUP_WORLD_SIZE", cfg->nnodes);
    env[k++] = int_entry("ROLE_WORLD_SIZE", world);
    env[k++] = entry("MASTER_ADDR", cfg->master_addr);
    env[k++] = int_entry("MASTER_PORT", cfg->master_port);
    env[k++] = entry("TORCHELASTIC_RUN_ID", cfg->run_id);
    env[k++] = int_entry("TORCHELASTIC_RESTART_COUNT", attempt);
    env[k++] = int_entry("TORCHELASTIC_MAX_RESTARTS", cfg->max_restarts);
    /* no launcher hosts a store at MASTER_PORT (torchrun's agent does): rank 0's
     * init_process_group makes it, as under torch.distributed.launch */
    env[k++] = entry("TORCHELASTIC_USE_AGENT_STORE", "False");
    char error_file[4096];
    td_launch_error_file(cfg, attempt, r, error_file, sizeof error_file);
    if (error_file[0]) env[k++] = entry("TORCHELASTIC_ERROR_FILE", error_file);
    for (size_t i = 0; i < sizeof DEFAULTS / sizeof *DEFAULTS; i++)
        if (!user_set(cfg, DEFAULTS[i][0])) env[k++] = entry(DEFAULTS[i][0], DEFAULTS[i][1]);
    if (sh->socket_ifname[0]) {
        env[k++] = entry("GLOO_SOCKET_IFNAME", sh->socket_ifname);
        /* NCCL takes a name as a prefix (eth1 would match eth10): "=" asks for it exactly */
        char exact[sizeof sh->socket_ifname + 1];
        snprintf(exact, sizeof exact, "=%s", sh->socket_ifname);
        env[k++] = entry("NCCL_SOCKET_IFNAME", exact);
    }
    if (cfg->devices) env[k++] = entry("CUDA_VISIBLE_DEVICES", cfg->devices[r]);
    /* as torchrun: one OpenMP thread per process unless the user chose otherwise */
    if (cfg->nproc_per_node > 1 && !getenv("OMP_NUM_THREADS"))
        env[k++] = td_str_dup("OMP_NUM_THREADS=1");
    for (size_t i = 0; i < n_extra; i++) env[k++] = td_str_dup(cfg->extra_env[i]);
    env[k] = NULL;
    return env;
}
