/* traind: the training daemon. Serves the HTTP API (api/README.md), keeps its state in SQLite
 * under the state directory, and runs jobs on this node's slots. */
#define _GNU_SOURCE /* getrandom's header, strsignal */
#include "api/td_api.h"
#include "core/td_json.h"
#include "core/td_parse.h"
#include "gpu/td_gpu.h"
#include "service/td_agent.h"
#include "service/td_cluster.h"
#include "service/td_db.h"
#include "service/td_gpus.h"
#include "service/td_jobs.h"
#include "service/td_identity.h"
#include "service/td_log.h"

#include "core/td_clock.h"
#include "daemon_config.h"

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

#define MAX_ROOTS DAEMON_MAX_ROOTS

/* Where start-up errors go once the log is open (in its format: a log shipper reading JSON gets
 * them as JSON too); before that, stderr as text. The program's, not a library's. */
static td_log *fatal_log;

/* A start-up error: the message as an error line, exit status 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...) {
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

/* mkdir -p with mode 0700 for the directories it creates. */
static void make_dirs(const char *path) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0700) != 0 && errno != EEXIST)
                die("cannot create %s: %s", p, strerror(errno));
            *s = '/';
        }
    if (mkdir(p, 0700) != 0 && errno != EEXIST) die("cannot create %s: %s", p, strerror(errno));
}

/* A secret's first line from the open file f (closed here): at least 16 characters, and a
 * warning when others may read the file. what names it in messages. */
static void read_secret(FILE *f, const char *path, const char *what, char *out, size_t len,
                        td_log *log) {
    if (!fgets(out, (int)len, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\r\n")] = 0;
    if (strlen(out) < 16)
        die("%s: the %s on its first line is shorter than 16 characters", path, what);
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        td_log_warn(log, "warning: %s is readable by others (chmod 600 it)", path);
}

/* STATE_DIR/NAME: read, or created on the first start as 32 random bytes in hex (mode 0600):
 * the API token, the node id. */
static void load_random(const char *dir, const char *name, const char *what, char *token,
                        size_t len, td_log *log) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (f) {
        read_secret(f, path, what, token, len, log);
        return;
    }
    unsigned char raw[32];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        die("cannot read random bytes for the %s: %s", what, strerror(errno));
    for (size_t i = 0; i < sizeof raw && 2 * i + 2 < len; i++)
        snprintf(token + 2 * i, 3, "%02x", raw[i]);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) die("cannot create %s: %s", path, strerror(errno));
    size_t n = strlen(token);
    if (write(fd, token, n) != (ssize_t)n || write(fd, "\n", 1) != 1 || fsync(fd) != 0)
        die("cannot write %s: %s", path, strerror(errno));
    close(fd);
    /* never the token itself: under systemd stderr is the journal, which others may read */
    td_log_notice(log, "created a new %s in %s (mode 0600)%s", what, path,
                  strcmp(name, "token") == 0 ? "; clients read it there" : "");
}

/* The cluster secret, from --cluster-secret-file. */
static void load_cluster_secret(const char *path, char *out, size_t len, td_log *log) {
    FILE *f = fopen(path, "r");
    if (!f)
        die("--cluster-secret-file %s: %s (every node needs the same file; make one with: head -c "
            "32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > FILE)",
            path, strerror(errno));
    read_secret(f, path, "cluster secret", out, len, log);
}

/* One daemon per state directory: an exclusive flock on STATE_DIR/traind.pid, held for the
 * daemon's life. Two daemons on one directory would each recover the other's running jobs as
 * interrupted and kill its workers. The kernel drops the lock when the process ends, SIGKILL
 * included, so a crash never leaves a stale lock behind; the file's content (the PID) only
 * serves the message a second daemon prints. The descriptor is close-on-exec: workers never
 * inherit it. */
static int lock_state_dir(const char *dir) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/traind.pid", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) die("cannot open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e != EWOULDBLOCK) die("cannot lock %s: %s", path, strerror(e));
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\r\n")] = 0;
        td_log_error(fatal_log,
                     "the state directory %s is in use by another traind (pid %s, which holds "
                     "the lock on %s); stop that daemon first, or give this one another "
                     "--state-dir",
                     dir, pid[0] ? pid : "unknown", path);
        exit(1);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        die("cannot write %s: %s", path, strerror(errno));
    return fd;
}

/* The data roots resolved after symlinks (a missing one is skipped with a warning), then the
 * state directory, which always is one. Returns how many. */
static int resolve_roots(const daemon_options *o, const char *state, td_log *log,
                         char (*resolved)[PATH_MAX], const char **roots) {
    int n = 0;
    for (int i = 0; i < o->n_roots; i++) {
        if (!realpath(o->roots[i], resolved[n])) {
            td_log_warn(log, "warning: data root %s: %s (skipped)", o->roots[i], strerror(errno));
            continue;
        }
        roots[n] = resolved[n];
        n++;
    }
    snprintf(resolved[n], PATH_MAX, "%s", state);
    roots[n] = resolved[n];
    return n + 1;
}

/* A PEM file's text (certificate or key), at most 1 MiB; what names it in messages. A private
 * key others may read is said so. */
static char *read_pem(const char *path, const char *what, bool secret, td_log *log) {
    FILE *f = fopen(path, "rb");
    if (!f) die("%s %s: %s", what, path, strerror(errno));
    setvbuf(f, NULL, _IONBF, 0); /* no stdio buffer holding a copy of a private key */
    struct stat st;
    if (secret && fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        td_log_warn(log, "warning: %s %s is readable by others (chmod 600 it)", what, path);
    char *text = malloc((1 << 20) + 1);
    if (!text) die("out of memory reading %s", path);
    size_t n = fread(text, 1, 1 << 20, f);
    bool more = fgetc(f) != EOF, failed = ferror(f);
    fclose(f);
    if (failed) die("%s %s: cannot read it", what, path);
    if (more) die("%s %s: larger than 1 MiB: not a PEM file", what, path);
    text[n] = 0;
    if (!strstr(text, "-----BEGIN ")) die("%s %s: not PEM (no \"-----BEGIN\" line)", what, path);
    return text;
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

static td_log_level level_of(const daemon_options *o) {
    td_log_level lv = TD_LOG_INFO;
    td_log_level_parse(o->log_level, &lv);
    return lv;
}

/* "FIRST-LAST" of job_uids: at least two uids (the last is the probes'), none a system one. */
static void parse_uid_range(const daemon_options *o, uid_t *first, uid_t *last) {
    long a = 0, b = 0;
    char extra;
    if (sscanf(o->job_uids, "%ld-%ld%c", &a, &b, &extra) != 2 || a < 1000 || b <= a ||
        b >= 4294967295L)
        die("job_uids \"%s\" (%s): expected FIRST-LAST, two uids of at least 1000, FIRST below "
            "LAST (e.g. 1879048192-1879113727)",
            o->job_uids, daemon_config_source(o, OPT_JOB_UIDS));
    *first = (uid_t)a;
    *last = (uid_t)b;
}

/* job_groups ("video,datasets") into gids. */
static int parse_groups(const daemon_options *o, gid_t *out) {
    char copy[sizeof o->job_groups], *save = NULL;
    snprintf(copy, sizeof copy, "%s", o->job_groups);
    int n = 0;
    for (char *g = strtok_r(copy, ",", &save); g; g = strtok_r(NULL, ",", &save)) {
        struct group *gr = getgrnam(g);
        if (!gr)
            die("job_groups (%s): no group \"%s\" here", daemon_config_source(o, OPT_JOB_GROUPS),
                g);
        if (n == TD_IDENTITY_GROUPS) die("job_groups: at most %d groups", TD_IDENTITY_GROUPS);
        out[n++] = gr->gr_gid;
    }
    return n;
}

/* Who jobs run as (td_identity.h): a root daemon gives each its own uid unless run_as names a
 * user (or root); a daemon that is not root runs them as itself and says they are not
 * isolated. */
static void resolve_run_as(const daemon_options *o, td_log *log, td_jobs_config *jc) {
    if (!td_identity_can_switch()) {
        jc->run_as = TD_RUN_AS_SELF;
        td_log_warn(log,
                    "warning: traind is not root: jobs run as its own user (uid %ld), so they "
                    "can read its token and state and each other's files (run it as root, as "
                    "the packaged unit does, to give each job a user of its own)%s",
                    (long)getuid(),
                    o->from[OPT_RUN_AS] != DAEMON_FROM_DEFAULT ? "; run_as is ignored" : "");
        return;
    }
    const char *name = o->run_as[0] ? o->run_as : "dynamic";
    jc->n_job_groups = parse_groups(o, jc->job_groups);
    if (strcmp(name, "dynamic") == 0) {
        jc->run_as = TD_RUN_AS_DYNAMIC;
        parse_uid_range(o, &jc->job_uid_first, &jc->job_uid_last);
        td_log_info(log, "jobs run as users of their own: uids (and gids) %u to %u (job_uids)",
                    (unsigned)jc->job_uid_first, (unsigned)jc->job_uid_last - 1);
        return;
    }
    jc->run_as = TD_RUN_AS_USER;
    if (strcmp(name, "root") == 0) {
        td_log_warn(log,
                    "warning: jobs run as root (run_as \"root\", %s): every job can do "
                    "anything on this host",
                    daemon_config_source(o, OPT_RUN_AS));
        jc->run_as = TD_RUN_AS_SELF;
        return;
    }
    struct passwd *pw = getpwnam(name);
    if (!pw)
        die("run_as \"%s\" (%s): no such user (create it, e.g. adduser --system %s, or say "
            "\"dynamic\")",
            name, daemon_config_source(o, OPT_RUN_AS), name);
    if (pw->pw_uid == 0)
        die("run_as \"%s\": that user is root (uid 0); say \"root\" if that is meant", name);
    td_identity *u = &jc->run_as_user;
    *u = (td_identity){.drop = true, .uid = pw->pw_uid, .gid = pw->pw_gid, .lookup_groups = true};
    snprintf(u->name, sizeof u->name, "%s", name);
    td_log_warn(log,
                "jobs run as user %s (uid %ld, gid %ld): isolated from the daemon, not from each "
                "other (run_as \"dynamic\" gives each job its own)",
                name, (long)u->uid, (long)u->gid);
}

/* The state directory, for jobs run as other users: its directories let them through to their
 * job directories (o+x, not o+r: nothing is listed), and everything else in it is the
 * daemon's alone (the umask is 077; the database's -wal and -shm files take its mode). */
static void open_for_jobs(const char *state, const char *db_path, bool others, td_log *log) {
    if (!others) return;
    char jobs_dir[PATH_MAX + 16];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", state);
    const char *dirs[] = {state, jobs_dir};
    for (size_t i = 0; i < 2; i++) {
        if (mkdir(dirs[i], 0711) != 0 && errno != EEXIST)
            die("cannot create %s: %s", dirs[i], strerror(errno));
        if (chmod(dirs[i], 0711) != 0)
            die("%s: cannot let jobs through to their directories (chmod 0711): %s", dirs[i],
                strerror(errno));
    }
    const char *suffix[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        char p[PATH_MAX + 32];
        snprintf(p, sizeof p, "%s%s", db_path, suffix[i]);
        if (chmod(p, 0600) != 0 && errno != ENOENT)
            td_log_warn(log, "warning: chmod 600 %s: %s", p, strerror(errno));
    }
}

/* What a job may use unless it says, and the most (td_job_limits); memory 0: the node's less a
 * reserve (1 GiB, or a tenth of a small node's) for the daemon and the system. */
static td_job_limits limits_of_jobs(const daemon_options *o) {
    double total = (double)sysconf(_SC_PHYS_PAGES) * (double)sysconf(_SC_PAGESIZE) / 1073741824.0;
    double reserve = total > 10 ? 1.0 : total / 10;
    double node = total - reserve;
    return (td_job_limits){.memory_gb = o->job_memory_gb > 0 ? o->job_memory_gb : node,
                           .max_memory_gb = o->max_job_memory_gb > 0 ? o->max_job_memory_gb : node,
                           .pids = o->job_pids,
                           .max_pids = o->max_job_pids,
                           .disk_gb = o->job_disk_gb,
                           .max_disk_gb = o->max_job_disk_gb};
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
    bool master_clear = !o->join[0] && o->secret_file[0] && !loopback(host) && !o->tls_cert[0];
    bool agent_clear = o->join[0] && !loopback(join_host) && !o->tls_ca[0];
    if (!master_clear && !agent_clear) return;
    const char *what = master_clear ? "this master takes agents on a network address without TLS"
                                    : "this agent joins its master across a network without TLS";
    if (!o->insecure_cluster)
        die("%s: the cluster secret, the nodes' credentials and jobs' checkpoints would cross it "
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

static td_tokens_limits limits_of(const daemon_options *o) {
    return (td_tokens_limits){.requests_per_s = o->rate_limit_per_s,
                              .streams = (int)o->max_streams_per_token,
                              .queued = (int)o->max_queued_per_token,
                              .job_bytes = o->max_job_bytes_per_token,
                              .sessions = (int)o->max_sessions_per_token};
}

/* SIGHUP: the configuration again. What a running daemon can take (data roots, grace, body
 * limit, logging) changes now; any other change is named and waits for a restart. */
static void reload(daemon_options *o, int argc, char **argv, const char *state, td_log *log,
                   td_jobs *jobs, td_api *api, td_tokens *tokens) {
    /* MONOTONIC_USEC: systemd (253 on) pairs it with the reload it asked for */
    sd_notifyf(0, "RELOADING=1\nSTATUS=reloading the configuration\nMONOTONIC_USEC=%llu",
               (unsigned long long)(td_clock_now() * 1e6));
    daemon_options *next = malloc(sizeof *next);
    char why[1024];
    if (!next) {
        td_log_error(log, "reload: out of memory; the configuration is unchanged");
    } else if (daemon_config_reload(next, o, argc, argv, why, sizeof why) != 0) {
        td_log_error(log, "reload failed, the configuration is unchanged: %s", why);
    } else {
        int applied = 0, waiting = 0;
        for (int i = 0; i < OPT_COUNT; i++) {
            if (!daemon_config_changed(o, next, (daemon_option)i)) continue;
            char *was = daemon_config_value(o, (daemon_option)i);
            char *now = daemon_config_value(next, (daemon_option)i);
            if (daemon_config_live((daemon_option)i)) {
                td_log_info(log, "reload: %s is now %s (was %s)", daemon_config_key(i), now, was);
                applied++;
            } else {
                td_log_warn(log,
                            "reload: %s changed to %s, which needs a restart: it stays %s until "
                            "then",
                            daemon_config_key(i), now, was);
                waiting++;
            }
            free(was);
            free(now);
        }
        /* the live ones into o; the others keep the values this daemon runs with */
        o->n_roots = next->n_roots;
        memcpy(o->roots, next->roots, sizeof o->roots);
        o->grace_s = next->grace_s;
        o->keep_jobs_on_stop = next->keep_jobs_on_stop;
        o->orphan_timeout_s = next->orphan_timeout_s;
        o->max_body = next->max_body;
        memcpy(o->command_jobs, next->command_jobs, sizeof o->command_jobs);
        o->rate_limit_per_s = next->rate_limit_per_s;
        o->max_streams_per_token = next->max_streams_per_token;
        o->max_queued_per_token = next->max_queued_per_token;
        o->keep_finished_for_s = next->keep_finished_for_s;
        o->keep_finished_jobs = next->keep_finished_jobs;
        memcpy(o->log_format, next->log_format, sizeof o->log_format);
        memcpy(o->log_level, next->log_level, sizeof o->log_level);
        for (int i = 0; i < OPT_COUNT; i++)
            if (daemon_config_live((daemon_option)i)) o->from[i] = next->from[i];
        static char resolved[MAX_ROOTS + 1][PATH_MAX];
        const char *roots[MAX_ROOTS + 1];
        int n_roots = resolve_roots(o, state, log, resolved, roots);
        td_jobs_set_limits(jobs, roots, n_roots, o->grace_s);
        td_jobs_set_stop_policy(jobs, o->keep_jobs_on_stop, o->orphan_timeout_s);
        td_api_set_max_body(api, (size_t)o->max_body);
        td_jobs_set_command_jobs(jobs, o->command_jobs);
        td_jobs_set_retention(jobs, o->keep_finished_for_s, o->keep_finished_jobs);
        td_tokens_limits limits = limits_of(o);
        td_tokens_set_limits(tokens, &limits);
        td_log_notice(log, "reloaded %s: %d change%s applied, %d waiting for a restart",
                      o->config_path[0] ? o->config_path : "(no config file)", applied,
                      applied == 1 ? "" : "s", waiting);
        /* last: the summary above is written in the format and at the level it was asked in */
        td_log_configure(log, strcmp(o->log_format, "json") == 0, level_of(o));
    }
    free(next);
    sd_notify(0, "READY=1\nSTATUS=serving");
}

/* Serves from the state directory `state` (locked) on listen_fd until SIGTERM or SIGINT. */
static int serve(daemon_options *o, int argc, char **argv, const char *state, const char *host,
                 int listen_fd, int metrics_fd, td_log *log) {
    /* first: CUDA's driver (td_gpu_device_count) starts threads, which must inherit the mask,
     * or a SIGTERM (the agent's own, on a refusal) or SIGCHLD could land on one of them */
    block_signals();
    static char resolved[MAX_ROOTS + 1][PATH_MAX];
    const char *roots[MAX_ROOTS + 1];
    int n_roots = resolve_roots(o, state, log, resolved, roots);
    char why[256] = "";
    td_gpu_device_info info[TD_GPUS_MAX];
    td_node_gpu found[TD_GPUS_MAX], gpu[TD_GPUS_MAX];
    int n_found = td_gpu_devices(info, TD_GPUS_MAX, why, sizeof why), gpus = 0;
    if (n_found < 0) n_found = 0;
    if (n_found > TD_GPUS_MAX) n_found = TD_GPUS_MAX;
    for (int i = 0; i < n_found; i++) {
        found[i] = (td_node_gpu){.index = info[i].index, .memory_bytes = info[i].memory_bytes};
        snprintf(found[i].name, sizeof found[i].name, "%s", info[i].name);
    }
    td_err gerr = {{0}};
    if (td_gpus_resolve(o->gpus, o->n_gpus, found, n_found, gpu, &gpus, &gerr) != 0)
        die("%s", gerr.msg);
    static int gpu_ids[TD_GPUS_MAX];
    for (int i = 0; i < gpus; i++) gpu_ids[i] = gpu[i].index;
    char described[512];
    td_gpus_describe(gpu, gpus, described, sizeof described);
    if (o->n_gpus > 0 && n_found == 0)
        td_log_info(log,
                    "%s declared (the driver finds none: %s); jobs are placed on them as on "
                    "real ones",
                    described, why);
    else if (gpus > 0)
        td_log_info(log, "%s", described);
    int slots = gpus > 0 ? gpus : o->slots > 0 ? o->slots : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (slots < 1) slots = 1;

    char node_id[128], secret[256] = "", name[64];
    check_cluster_transport(o, host, log);
    load_random(state, "node-id", "node id", node_id, sizeof node_id, log);
    if (o->secret_file[0]) load_cluster_secret(o->secret_file, secret, sizeof secret, log);
    if (o->join[0] && !secret[0])
        die("--join needs --cluster-secret-file: the master only takes agents that hold its "
            "cluster secret");
    if (o->node_name[0])
        snprintf(name, sizeof name, "%s", o->node_name);
    else if (gethostname(name, sizeof name) != 0)
        snprintf(name, sizeof name, "node");
    name[sizeof name - 1] = 0;
    if (!td_cluster_name_ok(name))
        die("node name \"%s\": expected 1 to 63 letters, digits, '.', '_' or '-' (give "
            "--node-name)",
            name);
    char db_path[PATH_MAX + 16];
    snprintf(db_path, sizeof db_path, "%s/state.db", state);
    td_err err = {{0}};
    td_db *db = NULL;
    td_jobs *jobs = NULL;
    td_api *api = NULL;
    td_cluster *cluster = NULL;
    td_agent *agent = NULL;
    td_tokens *tokens = NULL;
    int rc = 1;
    char *cert_pem = NULL, *key_pem = NULL;
    if (o->tls_cert[0]) {
        cert_pem = read_pem(o->tls_cert, "tls_cert", false, log);
        key_pem = read_pem(o->tls_key, "tls_key", true, log);
    }
    uint64_t watchdog_us = 0;
    watchdog dog = {0};
    if (sd_watchdog_enabled(0, &watchdog_us) > 0) dog.every_s = (double)watchdog_us / 1e6;
    td_jobs_config jc = {.state_dir = state};
    resolve_run_as(o, log, &jc);
    if (td_db_open(&db, db_path, &err) != 0) goto fail;
    open_for_jobs(state, db_path, jc.run_as != TD_RUN_AS_SELF, log);
    char token_path[PATH_MAX + 16];
    snprintf(token_path, sizeof token_path, "%s/token", state);
    if (td_tokens_open(&tokens, db, token_path, log, &err) != 0) goto fail;
    td_tokens_limits limits = limits_of(o);
    td_tokens_set_limits(tokens, &limits);
    if (!o->join[0]) { /* a master; alone, of a one-node cluster */
        td_cluster_config cc = {.name = name,
                                .address = o->advertise[0] ? o->advertise : host,
                                .slots = slots,
                                .gpus = gpus,
                                .gpu = gpu,
                                .version = TRAIND_VERSION,
                                .secret = secret[0] ? secret : NULL,
                                .heartbeat_s = o->heartbeat_s,
                                .timeout_s = o->timeout_s,
                                .log = log,
                                .db = db};
        if (td_cluster_open(&cluster, &cc, &err) != 0 || td_cluster_start(cluster, &err) != 0)
            goto fail;
    }
    jc.worker = o->worker;
    jc.shepherd = o->shepherd;
    jc.orphan_timeout_s = o->orphan_timeout_s;
    jc.keep_jobs_on_stop = o->keep_jobs_on_stop;
    jc.slots = slots;
    jc.gpus = gpus;
    jc.gpu_ids = gpu_ids;
    jc.grace_s = o->grace_s;
    jc.rules = (td_submit_rules){.data_roots = roots,
                                 .n_roots = n_roots,
                                 .slots = slots,
                                 .state_dir = state,
                                 .command_jobs = o->command_jobs};
    jc.limits = limits_of_jobs(o);
    jc.max_checkpoint_files = (int)o->max_checkpoint_files;
    jc.max_events_per_s = o->max_events_per_s;
    jc.max_log_bytes = o->max_log_bytes;
    jc.keep_finished_for_s = o->keep_finished_for_s;
    jc.keep_finished_jobs = o->keep_finished_jobs;
    jc.on_turn = dog.every_s > 0 ? watchdog_ping : NULL;
    jc.turn_ctx = &dog;
    jc.turn_every_s = dog.every_s / 4;
    char cgroup_note[1024], hint[17];
    snprintf(hint, sizeof hint, "%.16s", node_id); /* this state directory's, for good */
    td_cgroups_setup(&jc.cgroups, hint, cgroup_note, sizeof cgroup_note);
    td_log_notice(log, "%s", cgroup_note);
    if (o->join[0]) { /* an agent: its master's address checked before anything serves */
        td_agent_config gc = {.master = o->join,
                              .secret = secret,
                              .name = name,
                              .node_id = node_id,
                              .advertise = o->advertise[0] ? o->advertise : NULL,
                              .slots = slots,
                              .gpus = gpus,
                              .gpu = gpu,
                              .version = TRAIND_VERSION,
                              .state_dir = state,
                              .tls_ca = o->tls_ca[0] ? o->tls_ca : NULL,
                              .log = log};
        if (o->tls_ca[0] && access(o->tls_ca, R_OK) != 0)
            die("tls_ca %s: %s", o->tls_ca, strerror(errno));
        if (td_agent_open(&agent, &gc, &err) != 0) goto fail;
    }
    if (td_jobs_open(&jobs, &jc, db, log, &err) != 0) goto fail;
    td_jobs_set_cluster(jobs, cluster, name);
    if (cluster) {
        /* jobs run on the master's own node: its queue holds while it is drained (also when it
         * was drained before this start) */
        if (td_cluster_drained(cluster, name))
            td_log_info(log,
                        "node %s is drained: no job starts here until POST /v1/nodes/%s/undrain",
                        name, name);
        td_cluster_on_master_drain(cluster, set_draining, jobs);
    }
    /* each attempt's shepherd reaps what its processes leave behind; what a shepherd that was
     * killed leaves (its processes die with it) is handed to us rather than to init, and the
     * supervisor reaps it */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        td_log_warn(log,
                    "warning: prctl(PR_SET_CHILD_SUBREAPER): %s (what a killed shepherd leaves "
                    "goes to init)",
                    strerror(errno));
    if (td_jobs_start(jobs, &err) != 0) goto fail;
    td_api_config ac = {.listen_fd = listen_fd,
                        .metrics_listen_fd = metrics_fd,
                        .tokens = tokens,
                        .audit_log = o->audit_log,
                        .max_body = (size_t)o->max_body,
                        .version = TRAIND_VERSION,
                        .cluster = cluster,
                        .master = o->join[0] ? o->join : NULL,
                        .web_root = o->web_root,
                        .chart_root = TRAIND_CHART_ROOT,
                        .state_dir = state,
                        .log = log,
                        .tls_cert_pem = cert_pem,
                        .tls_key_pem = key_pem,
                        .max_connections = (unsigned)o->max_connections,
                        .max_connections_per_ip = (unsigned)o->max_connections_per_ip,
                        .connection_timeout_s = o->connection_timeout_s};
    if (td_api_start(&api, &ac, jobs, &err) != 0) goto fail;
    td_log_notice(log, "%d %s slot%s; state in %s; worker %s", slots, gpus > 0 ? "GPU" : "CPU",
                  slots == 1 ? "" : "s", state, o->worker);
    const char *scheme = cert_pem ? "https" : "http";
    td_log_notice(log, "listening on %s://%s:%d", scheme, host, td_api_port(api));
    if (!cert_pem && !loopback(host))
        td_log_warn(log,
                    "serving plain HTTP on %s, a network address: API tokens, the "
                    "dashboard's session cookie and the jobs' data cross the network "
                    "unencrypted; give --tls-cert and --tls-key (deploy/make-certs.sh makes "
                    "them), or listen on 127.0.0.1",
                    host);
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
    td_log_notice(log, "the dashboard is at %s://%s:%d/ (sign in with the API token)", scheme, host,
                  td_api_port(api));
    if (cluster)
        td_log_notice(log, "node %s is the cluster's master; %s", name,
                      secret[0] ? "agents join with --join and the cluster secret"
                                : "it accepts no agents (no --cluster-secret-file)");
    if (agent && td_agent_start(agent, jobs, &err) != 0) goto fail;
    /* systemd (Type=notify): the port answers and the database is open */
    sd_notifyf(0, "READY=1\nSTATUS=serving on %s:%d\nMAINPID=%ld", host, td_api_port(api),
               (long)getpid());

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    sigaddset(&stop, SIGHUP);
    int sig = 0;
    for (;;) {
        sigwait(&stop, &sig);
        if (sig != SIGHUP) break;
        reload(o, argc, argv, state, log, jobs, api, tokens);
    }
    sd_notify(0, "STOPPING=1");
    bool refused = td_agent_refused(agent);
    if (refused)
        td_log_error(log, "stopping: the master refused this node (see above)");
    else
        td_log_notice(log, "%s: stopping (%s)", strsignal(sig),
                      o->keep_jobs_on_stop
                          ? "running jobs go on; the next start re-attaches to them"
                          : "running jobs are stopped; the next start resumes them");
    rc = refused ? 1 : 0;
    goto stop;
fail:
    td_log_error(log, "%s", err.msg);
stop:
    td_agent_stop(agent);
    /* the jobs stop first (their shepherds, keep_jobs_on_stop false), with the registry still
     * answering agents as it did: an agent must not take a reply without orders for "run
     * nothing" meanwhile */
    td_jobs_stop(jobs);
    /* the registry's sweeper calls into the jobs: cut it off before they go */
    if (cluster) td_cluster_on_jobs(cluster, NULL, NULL, NULL);
    td_api_stop(api);
    td_cluster_close(cluster); /* its sweeper joined before the jobs it calls go */
    td_jobs_close(jobs);
    td_tokens_close(tokens);
    td_db_close(db);
    free(cert_pem);
    if (key_pem) explicit_bzero(key_pem, strlen(key_pem)); /* no private key left in free memory */
    free(key_pem);
    return rc;
}

/* "ADDR:PORT" of option opt into host and the port it returns; a bad one ends the daemon
 * naming the option and where its value came from. */
static int address_of(const daemon_options *o, daemon_option opt, const char *value, char *host,
                      size_t len) {
    const char *colon = strrchr(value, ':');
    if (!colon || colon == value || (size_t)(colon - value) >= len)
        die("%s \"%s\" (%s): expected ADDR:PORT, e.g. 127.0.0.1:8470", daemon_config_key(opt),
            value, daemon_config_source(o, opt));
    snprintf(host, len, "%.*s", (int)(colon - value), value);
    long port;
    if (!td_parse_long(colon + 1, 0, 65535, &port))
        die("%s \"%s\" (%s): the port \"%s\" is not an integer in [0, 65535]",
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
    td_log *log = td_log_open(stderr, strcmp(o.log_format, "json") == 0, level_of(&o));
    if (!log) die("out of memory");
    fatal_log = log;
    /* everything the daemon makes is its own unless it says otherwise (a job's files are
     * given to the job explicitly), and as root it holds no group that a file a job names
     * could be readable by (td_identity_become relies on that) */
    umask(077);
    if (td_identity_can_switch() && setgroups(0, NULL) != 0)
        die("cannot drop the supplementary groups: %s", strerror(errno));
    if (access(o.worker, X_OK) != 0)
        die("cannot run the worker %s: %s (give --worker)", o.worker, strerror(errno));
    if (access(o.shepherd, X_OK) != 0)
        die("cannot run %s: %s (give --shepherd; it is installed in PREFIX/lib/traind)", o.shepherd,
            strerror(errno));
    char host[128], metrics_host[128] = "";
    int port = address_of(&o, OPT_LISTEN, o.listen, host, sizeof host), metrics_port = 0;
    if (o.metrics_listen[0])
        metrics_port =
            address_of(&o, OPT_METRICS_LISTEN, o.metrics_listen, metrics_host, sizeof metrics_host);

    raise_open_files(&o, log);
    make_dirs(o.state_dir);
    char state[PATH_MAX];
    if (!realpath(o.state_dir, state)) die("%s: %s", o.state_dir, strerror(errno));
    int lock_fd = lock_state_dir(state); /* held until the process ends */
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
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) die("cannot initialise libcurl");
    int rc = serve(&o, argc, argv, state, host, listen_fd, metrics_fd, log);
    curl_global_cleanup();
    close(lock_fd);
    td_log_close(log);
    return rc;
}
