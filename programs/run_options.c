/* traind-run's options: one table (name, value, help), read by the parser and the help text. */
#include "programs/run_options.h"

#include "base/td_parse.h"
#include "gpu/td_gpu.h"
#include "service/run/td_launch.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef enum {
    O_NPROC,
    O_NNODES,
    O_NODE_RANK,
    O_MASTER_ADDR,
    O_MASTER_PORT,
    O_STANDALONE,
    O_RDZV_BACKEND,
    O_RDZV_ENDPOINT,
    O_RDZV_ID,
    O_RDZV_CONF,
    O_MAX_RESTARTS,
    O_MONITOR_INTERVAL,
    O_START_METHOD,
    O_MODULE,
    O_NO_PYTHON,
    O_LOG_DIR,
    O_REDIRECTS,
    O_TEE,
    O_LOCAL_RANK_ARG,
    O_USE_ENV,
    O_GRACE,
    O_NO_CPU_BIND,
    O_HELP,
    O_VERSION,
} option_id;

typedef struct option {
    option_id id;
    const char *name;  /* with dashes; underscores are accepted for them, as torchrun does */
    const char *alias; /* another spelling (a short option, or our older name), or NULL */
    const char *value; /* the value's placeholder; NULL: a flag */
    const char *help;
} option;

static const option OPTIONS[] = {
    {O_NPROC, "--nproc-per-node", NULL, "N|auto|cpu|gpu",
     "processes on this node (default 1); auto: one per GPU, or per CPU without GPUs"},
    {O_NNODES, "--nnodes", NULL, "N|N:N",
     "nodes of the job (default 1); MIN:MAX only with MIN = MAX"},
    {O_NODE_RANK, "--node-rank", NULL, "K", "this node's rank, 0 to N-1 (default 0)"},
    {O_MASTER_ADDR, "--master-addr", NULL, "HOST", "node 0's address (default 127.0.0.1)"},
    {O_MASTER_PORT, "--master-port", NULL, "PORT", "rank 0's store port (default 29500)"},
    {O_STANDALONE, "--standalone", NULL, NULL,
     "one node on its own: 127.0.0.1, a free port, a run id of its own"},
    {O_RDZV_BACKEND, "--rdzv-backend", NULL, "static|c10d",
     "static (default) or c10d: both meet at the endpoint (or --master-addr/--master-port)"},
    {O_RDZV_ENDPOINT, "--rdzv-endpoint", NULL, "HOST[:PORT]",
     "static: MASTER_ADDR:MASTER_PORT; c10d: where the launchers meet (port 29400)"},
    {O_RDZV_ID, "--rdzv-id", "--run-id", "ID", "the job's id, the same on every node"},
    {O_RDZV_CONF, "--rdzv-conf", NULL, "K=V,...",
     "c10d across nodes: join_timeout=S (default 600); other keys are not used"},
    {O_MAX_RESTARTS, "--max-restarts", NULL, "R",
     "restarts of the group after a failure (default 0)"},
    {O_MONITOR_INTERVAL, "--monitor-interval", NULL, "S", "accepted; workers are watched at once"},
    {O_START_METHOD, "--start-method", NULL, "M",
     "accepted; processes are always forked and exec'ed"},
    {O_MODULE, "--module", "-m", NULL, "run the command as a Python module (python -m)"},
    {O_NO_PYTHON, "--no-python", NULL, NULL, "run the command as it is, not with Python"},
    {O_LOG_DIR, "--log-dir", NULL, "DIR",
     "keep each attempt's files in DIR/RUN_ID_xxxxxx/attempt_N/LOCAL_RANK/"},
    {O_REDIRECTS, "--redirects", "-r", "S|R:S,...",
     "workers' output to stdout.log/stderr.log only: 1 stdout, 2 stderr, 3 both"},
    {O_TEE, "--tee", "-t", "S|R:S,...", "the same, and to the console too, prefixed [defaultR]:"},
    {O_LOCAL_RANK_ARG, "--local-rank-arg", NULL, "OPTION",
     "append OPTION=LOCAL_RANK (--local_rank) to each worker, as torch.distributed.launch"},
    {O_USE_ENV, "--use-env", NULL, NULL, "accepted: LOCAL_RANK is always in the environment"},
    {O_GRACE, "--grace-period", NULL, "S", "SIGTERM to SIGKILL when stopping workers (default 10)"},
    {O_NO_CPU_BIND, "--no-cpu-bind", NULL, NULL, "leave each worker on every CPU"},
    {O_HELP, "--help", "-h", NULL, "this text"},
    {O_VERSION, "--version", NULL, NULL, "traind-run's version"},
};
enum { N_OPTIONS = sizeof OPTIONS / sizeof *OPTIONS };

void run_options_usage(FILE *out) {
    fprintf(out, "usage: traind-run [OPTIONS] SCRIPT.py [ARGS...]\n"
                 "       traind-run [OPTIONS] -m MODULE [ARGS...]\n"
                 "       traind-run [OPTIONS] --no-python PROGRAM [ARGS...]\n"
                 "\nA drop-in for torchrun: the same options, defaults and environment.\n\n");
    for (int i = 0; i < N_OPTIONS; i++) {
        const option *p = &OPTIONS[i];
        char left[80];
        snprintf(left, sizeof left, "%s%s%s%s%s", p->name, p->alias ? ", " : "",
                 p->alias ? p->alias : "", p->value ? " " : "", p->value ? p->value : "");
        fprintf(out, "  %-34s %s\n", left, p->help);
    }
    fprintf(out,
            "\nAcross nodes with c10d the launchers meet at the endpoint (node ranks in join\n"
            "order unless given; the workers' MASTER_PORT a free port on the endpoint's host),\n"
            "and a node whose workers fail stops the others' workers 5 s later.\n"
            "\nEach process gets torchrun's environment: RANK, LOCAL_RANK, WORLD_SIZE,\n"
            "LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_*, MASTER_ADDR, MASTER_PORT, TORCHELASTIC_RUN_ID,\n"
            "TORCHELASTIC_RESTART_COUNT, TORCHELASTIC_MAX_RESTARTS, TORCHELASTIC_ERROR_FILE,\n"
            "TORCHELASTIC_USE_AGENT_STORE=False (rank 0 hosts the store), NCCL's async error\n"
            "handling, and with several nodes GLOO_SOCKET_IFNAME/NCCL_SOCKET_IFNAME (the\n"
            "interface of the route to MASTER_ADDR) unless set. Python: $TRAIND_PYTHON, else\n"
            "$PYTHON, else the first python3 on PATH that can import torch, else python3.\n"
            "When a worker fails the others get SIGTERM (SIGKILL after the grace period), the\n"
            "failing rank's exception is shown as torchrun shows it (Root Cause), and with\n"
            "restarts left the group starts again. Without --rdzv-id the run id is\n"
            "traind-run-ADDR-PORT with several nodes (every node started alike agrees), and\n"
            "unique with one. Workers are bound to equal shares of the CPUs (--no-cpu-bind).\n"
            "Exit status: 0, or the first failing worker's (128 + signal for a signal).\n");
}

static void die(const char *fmt, ...) __attribute__((noreturn, format(printf, 1, 2)));
static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "traind-run: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(traind-run --help lists the options)\n");
    va_end(ap);
    exit(2);
}

/* The option argv[*i] names ("--nproc_per_node=2", "--nproc-per-node 2", "-m"), its value in
 * *value (NULL for a flag); NULL when it is none of ours. */
static const option *match(int argc, char **argv, int *i, const char **value) {
    char norm[64];
    const char *a = argv[*i];
    size_t k = 0;
    for (; a[k] && a[k] != '=' && k + 1 < sizeof norm; k++) norm[k] = a[k] == '_' ? '-' : a[k];
    norm[k] = 0;
    for (int n = 0; n < N_OPTIONS; n++) {
        const option *p = &OPTIONS[n];
        if (strcmp(norm, p->name) != 0 && !(p->alias && strcmp(norm, p->alias) == 0)) continue;
        *value = NULL;
        if (!p->value) {
            if (a[k] == '=') die("%s takes no value (%s)", p->name, a);
        } else if (a[k] == '=') {
            *value = a + k + 1;
        } else if (*i + 1 < argc) {
            *value = argv[++*i];
        } else {
            die("%s needs a value (%s)", p->name, p->value);
        }
        return p;
    }
    return NULL;
}

static int int_value(const char *name, const char *v, int min, int max) {
    long x;
    if (!td_parse_long(v, min, max, &x)) {
        char range[64];
        snprintf(range, sizeof range, "an integer in [%d, %d]", min, max);
        fprintf(stderr, "traind-run: %s \"%s\": expected %s\n", name, v, range);
        exit(2);
    }
    return (int)x;
}

/* --nnodes N or MIN:MAX; elastic ranges have no meaning here. */
static int nnodes_value(const char *v) {
    const char *colon = strchr(v, ':');
    if (!colon) return int_value("--nnodes", v, 1, 1 << 16);
    char min[32];
    snprintf(min, sizeof min, "%.*s", (int)(colon - v) < 31 ? (int)(colon - v) : 31, v);
    int lo = int_value("--nnodes (its MIN)", min, 1, 1 << 16);
    int hi = int_value("--nnodes (its MAX)", colon + 1, 1, 1 << 16);
    if (lo != hi)
        die("--nnodes %s: elastic ranges (MIN below MAX) are not supported; give a fixed "
            "number of nodes (--nnodes %s or MIN:MAX with MIN = MAX)",
            v, colon + 1);
    return lo;
}

static void apply(run_options *o, const option *p, const char *v) {
    td_launch_config *c = &o->launch;
    switch (p->id) {
    case O_NPROC:
        o->nproc = v;
        break;
    case O_NNODES:
        c->nnodes = nnodes_value(v);
        break;
    case O_NODE_RANK:
        c->node_rank = int_value("--node-rank", v, 0, 1 << 16);
        o->node_rank_given = true;
        break;
    case O_MASTER_ADDR:
        snprintf(c->master_addr, sizeof c->master_addr, "%s", v);
        o->addr_given = true;
        break;
    case O_MASTER_PORT:
        c->master_port = int_value("--master-port", v, 1, 65535);
        o->port_given = true;
        break;
    case O_STANDALONE:
        o->standalone = true;
        break;
    case O_RDZV_BACKEND:
        o->rdzv_backend = v;
        break;
    case O_RDZV_ENDPOINT:
        o->rdzv_endpoint = v;
        break;
    case O_RDZV_ID:
        snprintf(c->run_id, sizeof c->run_id, "%s", v);
        o->run_id_given = true;
        break;
    case O_MAX_RESTARTS:
        c->max_restarts = int_value("--max-restarts", v, 0, 1000);
        break;
    case O_MODULE:
        o->module = true;
        break;
    case O_NO_PYTHON:
        o->no_python = true;
        break;
    case O_LOG_DIR:
        o->log_dir = v;
        break;
    case O_REDIRECTS:
        o->redirects = v;
        break;
    case O_TEE:
        o->tee = v;
        break;
    case O_LOCAL_RANK_ARG:
        o->local_rank_arg = v;
        break;
    case O_GRACE:
        c->grace_s = int_value("--grace-period", v, 0, 3600);
        break;
    case O_NO_CPU_BIND:
        c->no_cpu_bind = true;
        break;
    case O_HELP:
        run_options_usage(stdout);
        exit(0);
    case O_VERSION:
        printf("traind-run %s\n", TRAIND_VERSION);
        exit(0);
    case O_RDZV_CONF:
        o->rdzv_conf = v;
        break;
    case O_MONITOR_INTERVAL:
    case O_START_METHOD:
    case O_USE_ENV:
        break;
    }
}

/* --nproc-per-node as torchrun reads it. */
static int nproc_value(const char *v) {
    long cpus = sysconf(_SC_NPROCESSORS_ONLN);
    if (strcmp(v, "cpu") == 0) return cpus > 0 ? (int)cpus : 1;
    if (strcmp(v, "gpu") == 0 || strcmp(v, "auto") == 0) {
        char why[256] = "";
        int gpus = td_gpu_device_count(why, sizeof why);
        if (gpus > 0) return gpus;
        if (strcmp(v, "auto") == 0) return cpus > 0 ? (int)cpus : 1;
        die("--nproc-per-node gpu: no GPU found (%s)", why);
    }
    return int_value("--nproc-per-node", v, 1, 1024);
}

/* HOST[:PORT] (an IPv6 host in brackets: [::1]:29400) into the master's address and port. */
static void endpoint_value(run_options *o, int default_port) {
    td_launch_config *c = &o->launch;
    const char *v = o->rdzv_endpoint, *port = NULL;
    size_t host_len;
    if (v[0] == '[') {
        const char *close = strchr(v, ']');
        if (!close) die("--rdzv-endpoint %s: no ] after the IPv6 address", v);
        host_len = (size_t)(close - v - 1);
        v++;
        if (close[1] == ':') port = close + 2;
    } else {
        const char *colon = strrchr(v, ':');
        host_len = colon ? (size_t)(colon - v) : strlen(v);
        if (colon) port = colon + 1;
    }
    if (host_len == 0 || host_len >= sizeof c->master_addr)
        die("--rdzv-endpoint %s: expected HOST[:PORT]", o->rdzv_endpoint);
    snprintf(c->master_addr, sizeof c->master_addr, "%.*s", (int)host_len, v);
    c->master_port = port ? int_value("--rdzv-endpoint's port", port, 1, 65535) : default_port;
    o->addr_given = o->port_given = true;
}

/* What torchrun derives from the options: the rendezvous, the run id, the counts. */
static void derive(run_options *o) {
    td_launch_config *c = &o->launch;
    const char *backend = o->rdzv_backend ? o->rdzv_backend : "static";
    if (strcmp(backend, "static") != 0 && strcmp(backend, "c10d") != 0)
        die("--rdzv-backend %s is not supported: traind-run has static and c10d (it stores the "
            "rendezvous at rank 0, as PyTorch's TCPStore does)",
            backend);
    if (o->standalone) { /* torchrun: a c10d rendezvous of its own on a free local port */
        if (c->nnodes > 1) die("--standalone is one node, but --nnodes is %d", c->nnodes);
        if (o->rdzv_endpoint || o->addr_given || o->port_given)
            fprintf(stderr,
                    "[traind-run] --standalone: the given rendezvous address is not used\n");
        snprintf(c->master_addr, sizeof c->master_addr, "127.0.0.1");
        c->master_port = 0;
        o->port_given = false;
        o->run_id_given = false;
    } else if (o->rdzv_endpoint) {
        endpoint_value(o, strcmp(backend, "c10d") == 0 ? 29400 : 29500);
    } else if (strcmp(backend, "c10d") == 0) {
        die("--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]");
    }
    if (!o->port_given && c->master_port == 0 && !o->standalone) c->master_port = 29500;
    c->nproc_per_node = nproc_value(o->nproc ? o->nproc : "1");
    if (c->node_rank >= c->nnodes) {
        die("--node-rank %d is not below --nnodes %d", c->node_rank, c->nnodes);
    }
    if (o->local_rank_arg && strcmp(o->local_rank_arg, "--local_rank") != 0 &&
        strcmp(o->local_rank_arg, "--local-rank") != 0)
        die("--local-rank-arg %s: expected --local_rank or --local-rank", o->local_rank_arg);
    c->local_rank_arg = o->local_rank_arg;
    if (o->run_id_given) return;
    /* without an id, as torchrun's fixed default ("none"): the nodes of one job must agree on
     * it, so with several it comes only from what every node is given (the master); one node
     * keeps a run of its own */
    if (c->nnodes > 1)
        snprintf(c->run_id, sizeof c->run_id, "traind-run-%.40s-%d", c->master_addr,
                 c->master_port);
    else
        snprintf(c->run_id, sizeof c->run_id, "run-%ld-%d", (long)time(NULL), (int)getpid());
}

void run_options_parse(int argc, char **argv, run_options *o) {
    memset(o, 0, sizeof *o);
    o->launch.nnodes = 1;
    o->launch.grace_s = 10;
    snprintf(o->launch.master_addr, sizeof o->launch.master_addr, "127.0.0.1");
    int i = 1;
    for (; i < argc; i++) {
        const char *v;
        const option *p;
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else if ((p = match(argc, argv, &i, &v))) {
            apply(o, p, v);
        } else if (argv[i][0] == '-' && argv[i][1]) {
            die("unknown option %s", argv[i]);
        } else {
            break; /* the script: what follows is its own */
        }
    }
    if (i >= argc) die("no %s given", o->module ? "module" : o->no_python ? "program" : "script");
    if (o->module && o->no_python)
        die("-m runs a Python module and --no-python runs a program: give one of them");
    o->command = argv + i;
    derive(o);
}
