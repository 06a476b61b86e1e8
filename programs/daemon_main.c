/* traind: the training daemon. Serves the HTTP API (api/README.md), keeps its state in SQLite
 * under the state directory, and runs jobs on this node's slots. */
#define _GNU_SOURCE /* getrandom's header, strsignal */
#include "api/td_api.h"
#include "base/td_json.h"
#include "base/td_parse.h"
#include "gpu/td_gpu.h"
#include "service/agent/td_agent.h"
#include "service/cluster/td_cluster.h"
#include "service/store/td_db.h"
#include "service/run/td_gpus.h"
#include "service/jobs/td_jobs.h"
#include "service/run/td_identity.h"
#include "base/td_log.h"

#include "base/td_clock.h"
#include "daemon_config.h"
#include "daemon_private.h"

#include <arpa/inet.h>
#include <errno.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <grp.h>
#include <pwd.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <systemd/sd-daemon.h>
#include <unistd.h>

/* Where start-up errors go once the log is open (in its format: a log shipper reading JSON gets
 * them as JSON too); before that, stderr as text. The program's, not a library's. */
static td_log *fatal_log;

/* A start-up error: the message as an error line, exit status 2. */
void daemon_die(const char *fmt, ...) {
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    if (fatal_log)
        td_log_error(fatal_log, "%s", msg);
    else
        fprintf(stderr, "traind: %s\n", msg);
    exit(2);
}

/* Every thread inherits this mask: children are reaped through the supervisor's signalfd, and
 * SIGTERM/SIGINT/SIGHUP are taken by the main thread's sigwait. */
static void block_signals(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void set_draining(void *jobs, bool drained) {
    td_jobs_set_draining(jobs, drained);
}

/* systemd's watchdog (WatchdogSec=): pinged from the supervisor's loop, so a supervisor that is
 * stuck (a deadlock, a blocking call that never returns) stops the pings and systemd restarts
 * the daemon. Half the interval between pings, as sd_watchdog_enabled(3) advises. */
typedef struct watchdog {
    double every_s; /* 0: no watchdog */
    double last;    /* td_clock_now of the last ping */
} watchdog;

static void watchdog_ping(void *ctx) {
    watchdog *w = ctx;
    double now = td_clock_now();
    if (now - w->last < w->every_s / 2) return;
    w->last = now;
    sd_notify(0, "WATCHDOG=1");
}

/* Whether host (an IPv4 address) is a loopback one: traffic that never leaves this machine. */
static bool loopback(const char *host) {
    struct in_addr a;
    return inet_pton(AF_INET, host, &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

/* Cluster traffic (the secret at each join, the nodes' credentials, jobs' checkpoints) crosses a
 * network only over TLS, unless insecure_cluster says otherwise, which is said at start. */
static void check_cluster_transport(const daemon_options *o, const char *host, td_log *log) {
    char join_host[256] = "";
    if (o->join[0])
        snprintf(join_host, sizeof join_host, "%.*s", (int)strcspn(o->join, ":"), o->join);
    bool master_clear =
        !o->join[0] && o->cluster_secret_file[0] && !loopback(host) && !o->tls_cert[0];
    bool agent_clear = o->join[0] && !loopback(join_host) && !o->tls_ca[0];
    if (!master_clear && !agent_clear) return;
    const char *what = master_clear ? "this master takes agents on a network address without TLS"
                                    : "this agent joins its master across a network without TLS";
    if (!o->insecure_cluster)
        daemon_die(
            "%s: the cluster secret, the nodes' credentials and jobs' checkpoints would cross it "
            "in clear. Give %s, or set insecure_cluster true (--insecure-cluster true) on a "
            "network you trust",
            what,
            master_clear ? "tls_cert and tls_key (--tls-cert, --tls-key)" : "tls_ca (--tls-ca)");
    td_log_warn(log,
                "warning: %s (insecure_cluster, %s): anyone on the network can read the cluster "
                "secret and the jobs' checkpoints",
                what, daemon_config_source(o, OPT_INSECURE_CLUSTER));
}

/* Each API connection is a socket, and each job a few pipes and files: the soft limit on open
 * files (1024 on most systems, for select()'s sake; traind polls) is raised towards the hard one
 * so that max_connections can be served. */
static void raise_open_files(const daemon_options *o, td_log *log) {
    struct rlimit rl;
    if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return;
    rlim_t want = (rlim_t)o->max_connections + 1024; /* the jobs', the database's, the logs' */
    if (rl.rlim_cur >= want) return;
    struct rlimit next = {rl.rlim_max == RLIM_INFINITY || rl.rlim_max >= want ? want : rl.rlim_max,
                          rl.rlim_max};
    rlim_t got = setrlimit(RLIMIT_NOFILE, &next) == 0 ? next.rlim_cur : rl.rlim_cur;
    if (got < want)
        td_log_warn(log,
                    "warning: open files are limited to %llu (ulimit -n, or LimitNOFILE= in the "
                    "unit): fewer than max_connections %ld needs (%llu), so connections past "
                    "the limit fail",
                    (unsigned long long)got, o->max_connections, (unsigned long long)want);
}

/* A daemon being started, serving, then stopped: what serve()'s steps share. */
typedef struct daemon_run {
    daemon_options *o;
    const char *state, *host;
    td_log *log;
    /* this node */
    char node_id[128], secret[256], name[64];
    td_node_gpu gpu[TD_GPUS_MAX];
    int gpu_ids[TD_GPUS_MAX];
    int gpus, slots;
    char resolved[MAX_ROOTS + 1][PATH_MAX]; /* the data roots, resolved */
    const char *roots[MAX_ROOTS + 1];
    int n_roots;
    char *cert_pem, *key_pem;
    watchdog dog;
    /* what it runs */
    td_db *db;
    td_tokens *tokens;
    td_cluster *cluster; /* a master's registry (a node alone is a master of one) */
    td_agent *agent;     /* an agent's link to its master */
    td_jobs *jobs;
    td_experiments *experiments; /* NULL on an agent */
    td_api *api;
} daemon_run;

/* The GPUs jobs may use (declared, else found) and the slots they make. */
static void find_gpus(daemon_run *d) {
    char why[256] = "";
    td_gpu_device_info info[TD_GPUS_MAX];
    td_node_gpu found[TD_GPUS_MAX];
    int n_found = td_gpu_devices(info, TD_GPUS_MAX, why, sizeof why);
    if (n_found < 0) n_found = 0;
    if (n_found > TD_GPUS_MAX) n_found = TD_GPUS_MAX;
    for (int i = 0; i < n_found; i++) {
        found[i] = (td_node_gpu){.index = info[i].index, .memory_bytes = info[i].memory_bytes};
        snprintf(found[i].name, sizeof found[i].name, "%s", info[i].name);
    }
    td_err gerr = {{0}};
    if (td_gpus_resolve(d->o->gpus, d->o->n_gpus, found, n_found, d->gpu, &d->gpus, &gerr) != 0)
        daemon_die("%s", gerr.msg);
    for (int i = 0; i < d->gpus; i++) d->gpu_ids[i] = d->gpu[i].index;
    char described[512];
    td_gpus_describe(d->gpu, d->gpus, described, sizeof described);
    if (d->o->n_gpus > 0 && n_found == 0)
        td_log_info(d->log,
                    "%s declared (the driver finds none: %s); jobs are placed on them as on "
                    "real ones",
                    described, why);
    else if (d->gpus > 0)
        td_log_info(d->log, "%s", described);
    int slots = d->gpus > 0       ? d->gpus
                : d->o->slots > 0 ? d->o->slots
                                  : (int)sysconf(_SC_NPROCESSORS_ONLN);
    d->slots = slots < 1 ? 1 : slots;
}

/* This node's id, name and cluster secret, and its TLS files. */
static void identify_node(daemon_run *d) {
    const daemon_options *o = d->o;
    check_cluster_transport(o, d->host, d->log);
    daemon_load_random(d->state, "node-id", "node id", d->node_id, sizeof d->node_id, d->log);
    if (o->cluster_secret_file[0])
        daemon_load_cluster_secret(o->cluster_secret_file, d->secret, sizeof d->secret, d->log);
    if (o->join[0] && !d->secret[0])
        daemon_die("--join needs --cluster-secret-file: the master only takes agents that hold "
                   "its cluster secret");
    if (o->node_name[0])
        snprintf(d->name, sizeof d->name, "%s", o->node_name);
    else if (gethostname(d->name, sizeof d->name) != 0)
        snprintf(d->name, sizeof d->name, "node");
    d->name[sizeof d->name - 1] = 0;
    if (!td_cluster_name_ok(d->name))
        daemon_die("node name \"%s\": expected 1 to 63 letters, digits, '.', '_' or '-' (give "
                   "--node-name)",
                   d->name);
    if (o->tls_cert[0]) {
        d->cert_pem = daemon_read_pem(o->tls_cert, "tls_cert", false, d->log);
        d->key_pem = daemon_read_pem(o->tls_key, "tls_key", true, d->log);
    }
    uint64_t watchdog_us = 0;
    if (sd_watchdog_enabled(0, &watchdog_us) > 0) d->dog.every_s = (double)watchdog_us / 1e6;
}

/* A master's registry of nodes: alone, it is the master of a one-node cluster. */
static int open_cluster(daemon_run *d, td_err *err) {
    const daemon_options *o = d->o;
    td_cluster_config cc = {.name = d->name,
                            .address = o->advertise[0] ? o->advertise : d->host,
                            .slots = d->slots,
                            .gpus = d->gpus,
                            .gpu = d->gpu,
                            .version = TRAIND_VERSION,
                            .secret = d->secret[0] ? d->secret : NULL,
                            .heartbeat_s = o->heartbeat_s,
                            .timeout_s = o->node_timeout_s,
                            .log = d->log,
                            .db = d->db};
    if (td_cluster_open(&d->cluster, &cc, err) != 0 || td_cluster_start(d->cluster, err) != 0)
        return -1;
    return 0;
}

/* An agent: its master's address checked before anything serves. */
static int open_agent(daemon_run *d, td_err *err) {
    const daemon_options *o = d->o;
    td_agent_config gc = {.master = o->join,
                          .secret = d->secret,
                          .name = d->name,
                          .node_id = d->node_id,
                          .advertise = o->advertise[0] ? o->advertise : NULL,
                          .slots = d->slots,
                          .gpus = d->gpus,
                          .gpu = d->gpu,
                          .version = TRAIND_VERSION,
                          .state_dir = d->state,
                          .tls_ca = o->tls_ca[0] ? o->tls_ca : NULL,
                          .log = d->log};
    if (o->tls_ca[0] && access(o->tls_ca, R_OK) != 0)
        daemon_die("tls_ca %s: %s", o->tls_ca, strerror(errno));
    return td_agent_open(&d->agent, &gc, err);
}

/* The job service's configuration, from the settings and this node. */
static void jobs_config(daemon_run *d, td_jobs_config *jc) {
    const daemon_options *o = d->o;
    jc->runner.worker = o->worker;
    jc->runner.shepherd = o->shepherd;
    jc->runner.orphan_timeout_s = o->orphan_timeout_s;
    jc->keep_jobs_on_stop = o->keep_jobs_on_stop;
    jc->runner.slots = d->slots;
    jc->runner.gpus = d->gpus;
    jc->runner.gpu_ids = d->gpu_ids;
    jc->runner.grace_s = o->grace_s;
    jc->rules = (td_submit_rules){.data_roots = d->roots,
                                  .n_roots = d->n_roots,
                                  .slots = d->slots,
                                  .state_dir = d->state,
                                  .command_jobs = o->command_jobs};
    jc->limits = daemon_job_limits(o);
    jc->runner.max_checkpoint_files = (int)o->max_checkpoint_files;
    jc->runner.max_events_per_s = o->max_events_per_s;
    jc->runner.max_log_bytes = o->max_log_bytes;
    jc->keep_finished_for_s = o->keep_finished_for_s;
    jc->keep_finished_jobs = o->keep_finished_jobs;
    jc->on_turn = d->dog.every_s > 0 ? watchdog_ping : NULL;
    jc->turn_ctx = &d->dog;
    jc->turn_every_s = d->dog.every_s / 4;
    char cgroup_note[1024], hint[17];
    snprintf(hint, sizeof hint, "%.16s", d->node_id); /* this state directory's, for good */
    td_cgroups_setup(&jc->runner.cgroups, hint, cgroup_note, sizeof cgroup_note);
    td_log_notice(d->log, "%s", cgroup_note);
}

/* The job service, started: it recovers what a previous daemon left running. */
static int start_jobs(daemon_run *d, td_jobs_config *jc, td_err *err) {
    if (td_jobs_open(&d->jobs, jc, d->db, d->log, err) != 0) return -1;
    td_jobs_set_cluster(d->jobs, d->cluster, d->name);
    if (d->cluster) {
        /* jobs run on the master's own node: its queue holds while it is drained (also when it
         * was drained before this start) */
        if (td_cluster_drained(d->cluster, d->name))
            td_log_info(d->log,
                        "node %s is drained: no job starts here until POST /v1/nodes/%s/undrain",
                        d->name, d->name);
        td_cluster_on_master_drain(d->cluster, set_draining, d->jobs);
    }
    /* each attempt's shepherd reaps what its processes leave behind; what a shepherd that was
     * killed leaves (its processes die with it) is handed to us rather than to init, and the
     * supervisor reaps it */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        td_log_warn(d->log,
                    "warning: prctl(PR_SET_CHILD_SUBREAPER): %s (what a killed shepherd leaves "
                    "goes to init)",
                    strerror(errno));
    return td_jobs_start(d->jobs, err);
}

/* The database, the tokens, the cluster (or agent) and the jobs, opened in that order. */
static int open_services(daemon_run *d, td_err *err) {
    const daemon_options *o = d->o;
    char db_path[PATH_MAX + 16], token_path[PATH_MAX + 16];
    snprintf(db_path, sizeof db_path, "%s/state.db", d->state);
    snprintf(token_path, sizeof token_path, "%s/token", d->state);
    td_jobs_config jc = {.runner = {.state_dir = d->state}};
    daemon_resolve_run_as(o, d->log, &jc);
    if (td_db_open(&d->db, db_path, err) != 0) return -1;
    daemon_open_for_jobs(d->state, db_path, jc.runner.run_as != TD_RUN_AS_SELF, d->log);
    if (td_tokens_open(&d->tokens, d->db, token_path, d->log, err) != 0) return -1;
    td_tokens_limits limits = daemon_token_limits(o);
    td_tokens_set_limits(d->tokens, &limits);
    if (!o->join[0] && open_cluster(d, err) != 0) return -1;
    jobs_config(d, &jc);
    if (o->join[0] && open_agent(d, err) != 0) return -1;
    if (start_jobs(d, &jc, err) != 0) return -1;
    /* experiments run where jobs are placed: on a master or a daemon alone, never an agent */
    if (o->join[0]) return 0;
    if (td_experiments_open(&d->experiments, d->jobs, d->db, d->tokens, d->log, err) != 0)
        return -1;
    return td_experiments_start(d->experiments, err);
}

static int start_api(daemon_run *d, int listen_fd, int metrics_fd, td_err *err) {
    const daemon_options *o = d->o;
    td_api_config ac = {.listen_fd = listen_fd,
                        .metrics_listen_fd = metrics_fd,
                        .tokens = d->tokens,
                        .audit_log = o->audit_log,
                        .max_body = (size_t)o->max_body_bytes,
                        .version = TRAIND_VERSION,
                        .cluster = d->cluster,
                        .master = o->join[0] ? o->join : NULL,
                        .web_root = o->web_root,
                        .chart_root = TRAIND_CHART_ROOT,
                        .state_dir = d->state,
                        .log = d->log,
                        .tls_cert_pem = d->cert_pem,
                        .tls_key_pem = d->key_pem,
                        .max_connections = (unsigned)o->max_connections,
                        .max_connections_per_ip = (unsigned)o->max_connections_per_ip,
                        .connection_timeout_s = o->connection_timeout_s,
                        .experiments = d->experiments};
    return td_api_start(&d->api, &ac, d->jobs, err);
}

/* What an operator reads at start: slots, where it serves, the dashboard, the cluster. */
static void announce(const daemon_run *d, int metrics_fd) {
    td_log *log = d->log;
    int port = td_api_port(d->api);
    td_log_notice(log, "%d %s slot%s; state in %s; worker %s", d->slots,
                  d->gpus > 0 ? "GPU" : "CPU", d->slots == 1 ? "" : "s", d->state, d->o->worker);
    const char *scheme = d->cert_pem ? "https" : "http";
    td_log_notice(log, "listening on %s://%s:%d", scheme, d->host, port);
    if (!d->cert_pem && !loopback(d->host))
        td_log_warn(log,
                    "serving plain HTTP on %s, a network address: API tokens, the "
                    "dashboard's session cookie and the jobs' data cross the network "
                    "unencrypted; give --tls-cert and --tls-key (deploy/make-certs.sh makes "
                    "them), or listen on 127.0.0.1",
                    d->host);
    if (metrics_fd >= 0) {
        struct sockaddr_in a;
        socklen_t alen = sizeof a;
        char where[INET_ADDRSTRLEN] = "?";
        int mport = 0;
        if (getsockname(metrics_fd, (struct sockaddr *)&a, &alen) == 0) {
            inet_ntop(AF_INET, &a.sin_addr, where, sizeof where);
            mport = ntohs(a.sin_port);
        }
        td_log_notice(log, "metrics (GET /metrics, no token) on %s://%s:%d/metrics", scheme, where,
                      mport);
    }
    td_log_notice(log, "the dashboard is at %s://%s:%d/ (sign in with the API token)", scheme,
                  d->host, port);
    if (d->cluster)
        td_log_notice(log, "node %s is the cluster's master; %s", d->name,
                      d->secret[0] ? "agents join with --join and the cluster secret"
                                   : "it accepts no agents (no --cluster-secret-file)");
}

/* Serving: SIGHUP reloads, SIGTERM or SIGINT ends it. Returns the exit status. */
static int wait_for_signals(daemon_run *d, int argc, char **argv) {
    /* systemd (Type=notify): the port answers and the database is open */
    sd_notifyf(0, "READY=1\nSTATUS=serving on %s:%d\nMAINPID=%ld", d->host, td_api_port(d->api),
               (long)getpid());
    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGHUP);
    int sig = 0;
    daemon_running r = {
        .state = d->state, .log = d->log, .jobs = d->jobs, .api = d->api, .tokens = d->tokens};
    for (;;) {
        sigwait(&stop, &sig);
        if (sig != SIGHUP) break;
        daemon_reload(d->o, argc, argv, &r);
    }
    sd_notify(0, "STOPPING=1");
    bool refused = td_agent_refused(d->agent);
    if (refused)
        td_log_error(d->log, "stopping: the master refused this node (see above)");
    else
        td_log_notice(d->log, "%s: stopping (%s)", strsignal(sig),
                      d->o->keep_jobs_on_stop
                          ? "running jobs go on; the next start re-attaches to them"
                          : "running jobs are stopped; the next start resumes them");
    return refused ? 1 : 0;
}

static void close_all(daemon_run *d) {
    td_agent_stop(d->agent);
    /* the experiments first: their thread submits jobs */
    if (d->experiments) td_experiments_stop(d->experiments);
    /* the jobs stop first (their shepherds, keep_jobs_on_stop false), with the registry still
     * answering agents as it did: an agent must not take a reply without orders for "run
     * nothing" meanwhile */
    td_jobs_stop(d->jobs);
    /* the registry's sweeper calls into the jobs: cut it off before they go */
    if (d->cluster) td_cluster_on_jobs(d->cluster, NULL, NULL, NULL);
    td_api_stop(d->api);
    td_cluster_close(d->cluster); /* its sweeper joined before the jobs it calls go */
    td_experiments_close(d->experiments);
    td_jobs_close(d->jobs);
    td_tokens_close(d->tokens);
    td_db_close(d->db);
    free(d->cert_pem);
    if (d->key_pem) /* no private key left in free memory */
        explicit_bzero(d->key_pem, strlen(d->key_pem));
    free(d->key_pem);
}

/* Serves from the state directory `state` (locked) on listen_fd until SIGTERM or SIGINT. */
static int serve(daemon_options *o, int argc, char **argv, const char *state, const char *host,
                 int listen_fd, int metrics_fd, td_log *log) {
    /* first: CUDA's driver (td_gpu_device_count) starts threads, which must inherit the mask,
     * or a SIGTERM (the agent's own, on a refusal) or SIGCHLD could land on one of them */
    block_signals();
    static daemon_run d; /* large (paths): not on the stack */
    d = (daemon_run){.o = o, .state = state, .host = host, .log = log};
    d.n_roots = daemon_resolve_roots(o, state, log, d.resolved, d.roots);
    find_gpus(&d);
    identify_node(&d);
    td_err err = {{0}};
    int rc = 1;
    if (open_services(&d, &err) != 0 || start_api(&d, listen_fd, metrics_fd, &err) != 0) goto fail;
    announce(&d, metrics_fd);
    if (d.agent && td_agent_start(d.agent, d.jobs, &err) != 0) goto fail;
    rc = wait_for_signals(&d, argc, argv);
    close_all(&d);
    return rc;
fail:
    td_log_error(log, "%s", err.msg);
    close_all(&d);
    return rc;
}

/* "ADDR:PORT" of option opt into host and the port it returns; a bad one ends the daemon
 * naming the option and where its value came from. */
static int address_of(const daemon_options *o, daemon_option opt, const char *value, char *host,
                      size_t len) {
    const char *colon = strrchr(value, ':');
    if (!colon || colon == value || (size_t)(colon - value) >= len)
        daemon_die("%s \"%s\" (%s): expected ADDR:PORT, e.g. 127.0.0.1:8470",
                   daemon_config_key(opt), value, daemon_config_source(o, opt));
    snprintf(host, len, "%.*s", (int)(colon - value), value);
    long port;
    if (!td_parse_long(colon + 1, 0, 65535, &port))
        daemon_die("%s \"%s\" (%s): the port \"%s\" is not an integer in [0, 65535]",
                   daemon_config_key(opt), value, daemon_config_source(o, opt), colon + 1);
    return (int)port;
}

int main(int argc, char **argv) {
    static daemon_options o; /* large (paths): not on the stack */
    daemon_config_load(&o, argc, argv);
    if (o.print_config) {
        daemon_config_print(&o, stdout);
        return 0;
    }
    td_log *log = td_log_open(stderr, strcmp(o.log_format, "json") == 0, daemon_log_level(&o));
    if (!log) daemon_die("out of memory");
    fatal_log = log;
    /* everything the daemon makes is its own unless it says otherwise (a job's files are
     * given to the job explicitly), and as root it holds no group that a file a job names
     * could be readable by (td_identity_become relies on that) */
    umask(077);
    if (td_identity_can_switch() && setgroups(0, NULL) != 0)
        daemon_die("cannot drop the supplementary groups: %s", strerror(errno));
    if (access(o.worker, X_OK) != 0)
        daemon_die("cannot run the worker %s: %s (give --worker)", o.worker, strerror(errno));
    if (access(o.shepherd, X_OK) != 0)
        daemon_die("cannot run %s: %s (give --shepherd; it is installed in PREFIX/lib/traind)",
                   o.shepherd, strerror(errno));
    char host[128], metrics_host[128] = "";
    int port = address_of(&o, OPT_LISTEN, o.listen, host, sizeof host), metrics_port = 0;
    if (o.metrics_listen[0])
        metrics_port =
            address_of(&o, OPT_METRICS_LISTEN, o.metrics_listen, metrics_host, sizeof metrics_host);

    raise_open_files(&o, log);
    daemon_make_dirs(o.state_dir);
    char state[PATH_MAX];
    if (!realpath(o.state_dir, state)) daemon_die("%s: %s", o.state_dir, strerror(errno));
    int lock_fd = daemon_lock_state_dir(state, log); /* held until the process ends */
    /* the port before the jobs: a daemon that cannot serve must not recover anything */
    int listen_fd = -1;
    td_err err = {{0}};
    if (td_api_listen(host, &port, &listen_fd, &err) != 0) {
        td_log_error(log, "%s", err.msg);
        return 1;
    }
    int metrics_fd = -1;
    if (metrics_host[0] && td_api_listen(metrics_host, &metrics_port, &metrics_fd, &err) != 0) {
        td_log_error(log, "metrics_listen: %s", err.msg);
        return 1;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) daemon_die("cannot initialise libcurl");
    int rc = serve(&o, argc, argv, state, host, listen_fd, metrics_fd, log);
    curl_global_cleanup();
    close(lock_fd);
    td_log_close(log);
    return rc;
}
