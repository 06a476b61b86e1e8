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

#include <errno.h>
#include <curl/curl.h>
#include <fcntl.h>
#include <jansson.h>
#include <limits.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define TRAIND_VERSION "0.1.0"
#define MAX_ROOTS      16

typedef struct options {
    char listen[256];
    char state_dir[PATH_MAX];
    char worker[PATH_MAX];
    int slots; /* 0: the core count */
    double grace_s;
    long max_body;
    char roots[MAX_ROOTS][PATH_MAX];
    int n_roots; /* 0: the defaults */
    /* the cluster */
    char join[256];                /* "": this traind is a master */
    char secret_file[PATH_MAX];    /* "": a master that accepts no agents */
    char node_name[64];            /* "": the hostname */
    char advertise[64];            /* "": the listen address (master) or the route (agent) */
    double heartbeat_s, timeout_s; /* a master's: what agents keep, when they are lost */
    char web_root[PATH_MAX];       /* the dashboard's files; "": TRAIND_WEB_ROOT */
    td_node_gpu gpus[TD_GPUS_MAX]; /* declared (--gpus, "gpus"); n_gpus 0: discovered */
    int n_gpus;
} options;

/* Indexes of have[]: what the command line gave, which the config file must not override. */
enum {
    HAVE_LISTEN,
    HAVE_STATE,
    HAVE_SLOTS,
    HAVE_GRACE,
    HAVE_BODY,
    HAVE_WORKER,
    HAVE_ROOTS,
    HAVE_JOIN,
    HAVE_SECRET,
    HAVE_NAME,
    HAVE_ADVERTISE,
    HAVE_HEARTBEAT,
    HAVE_TIMEOUT,
    HAVE_GPUS,
    HAVE_WEB,
    HAVE_COUNT
};

static void usage(FILE *out) {
    fprintf(out,
            "usage: traind [--listen ADDR:PORT] [--state-dir DIR] [--config FILE]\n"
            "              [--slots N] [--data-root DIR]... [--grace S] [--max-body BYTES]\n"
            "              [--worker PATH] [--cluster-secret-file FILE] [--join ADDR:PORT]\n"
            "              [--node-name NAME] [--advertise ADDR] [--heartbeat S]\n"
            "              [--node-timeout S] [--gpus LIST] [--web-root DIR]\n"
            "\n"
            "The traind daemon: accepts training jobs over HTTP (API v1, see api/README.md),\n"
            "runs them on this node's slots, streams their metrics, stores their checkpoints.\n"
            "\n"
            "  --listen ADDR:PORT  where to serve (default 127.0.0.1:8470; port 0: any free\n"
            "                      port). Loopback by default: put a TLS proxy in front to\n"
            "                      serve other hosts.\n"
            "  --state-dir DIR     jobs, logs, checkpoints, the database (state.db) and the API\n"
            "                      token (default: $STATE_DIRECTORY, /var/lib/traind for root,\n"
            "                      else $XDG_STATE_HOME/traind or ~/.local/state/traind)\n"
            "  --config FILE       a JSON object with any of: listen, state_dir, slots,\n"
            "                      data_roots (array), grace_s, max_body_bytes, worker,\n"
            "                      web_root,\n"
            "                      join, cluster_secret_file, node_name, advertise,\n"
            "                      heartbeat_s, node_timeout_s, gpus (an array of\n"
            "                      ordinals or of {\"index\", \"name\", \"memory_gib\"});\n"
            "                      command-line options override it\n"
            "  --slots N           job processes at once when there is no GPU (default: the\n"
            "                      core count); with GPUs, one slot per GPU\n"
            "  --gpus LIST         the GPUs jobs may use, as CUDA ordinals (e.g. 0,1,2,3)\n"
            "                      instead of every one the driver finds; on a machine\n"
            "                      without GPUs, declared ones are placed as if they were\n"
            "                      there (each process gets its CUDA_VISIBLE_DEVICES)\n"
            "  --data-root DIR     a directory job specs may read from (repeatable; default\n"
            "                      /usr/share/datasets); the state directory always is one\n"
            "  --grace S           seconds between SIGTERM and SIGKILL when stopping a job\n"
            "                      (default 10)\n"
            "  --max-body BYTES    the largest request body (default 1048576)\n"
            "  --worker PATH       traind-worker (default: next to traind)\n"
            "  --web-root DIR      the dashboard's files, served at / (default:\n"
            "                      PREFIX/share/traind/web when installed, else " TRAIND_WEB_ROOT
            ")\n"
            "\n"
            "A cluster: one traind is the master (the default), the others join it.\n"
            "  --cluster-secret-file FILE  the cluster's shared secret (the same file on\n"
            "                      every node, mode 0600); a master without one accepts no\n"
            "                      agents\n"
            "  --join ADDR:PORT    become an agent of the master serving there\n"
            "  --node-name NAME    this node's name in the cluster (default: the hostname)\n"
            "  --advertise ADDR    the address other nodes reach this one at (default: the\n"
            "                      --listen address on a master, on an agent the address it\n"
            "                      reaches the master from)\n"
            "  --heartbeat S       (master) seconds between agents' heartbeats (default 2)\n"
            "  --node-timeout S    (master) seconds of silence before a node is lost\n"
            "                      (default 10)\n"
            "\n"
            "On its first start traind writes a random API token to STATE_DIR/token (mode\n"
            "0600; it is never printed); every endpoint but GET /v1/health needs\n"
            "\"Authorization: Bearer TOKEN\". Once it serves it prints\n"
            "\"traind: listening on http://ADDR:PORT\" to stderr. SIGTERM or SIGINT stops it;\n"
            "running jobs resume from their latest checkpoints at the next start.\n"
            "One traind per state directory (it holds a lock on STATE_DIR/traind.pid) and per\n"
            "address: a second one on either exits with status 1 and touches nothing.\n");
}

/* A start-up error: "traind: " and the message on stderr, exit status 2. */
__attribute__((format(printf, 1, 2), noreturn)) static void die(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "traind: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    exit(2);
}

static long number(const char *what, const char *v, long min, long max) {
    long x;
    if (!td_parse_long(v, min, max, &x))
        die("%s \"%s\": expected an integer in [%ld, %ld]", what, v, min, max);
    return x;
}

static double seconds(const char *what, const char *v, double min, double max) {
    char *end;
    errno = 0;
    double x = strtod(v, &end);
    if (errno || end == v || *end || !(x >= min && x <= max))
        die("%s \"%s\": expected seconds in [%g, %g]", what, v, min, max);
    return x;
}

/* The config file: a JSON object whose members default what the command line did not give
 * (have[]); read with the JSON kit, so an error names the member ("traind: /etc/traind.json:
 * slots: expected an integer in [1, 4096], found 0"). */
static void read_config(options *o, const char *path, bool *have) {
    static const char *const KEYS[] = {"listen",
                                       "state_dir",
                                       "slots",
                                       "data_roots",
                                       "grace_s",
                                       "max_body_bytes",
                                       "worker",
                                       "join",
                                       "cluster_secret_file",
                                       "node_name",
                                       "advertise",
                                       "heartbeat_s",
                                       "node_timeout_s",
                                       "gpus",
                                       "web_root",
                                       NULL};
    json_error_t je;
    json_t *c = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!c) die("%s:%d:%d: %s", path, je.line, je.column, je.text);
    if (!json_is_object(c)) die("%s: expected a JSON object", path);
    td_err err = {{0}};
    long slots = o->slots, body = o->max_body;
    double grace = o->grace_s;
    options f = *o;
    json_t *roots = NULL;
    if (td_json_check_keys(c, "", KEYS, &err) != 0 ||
        td_json_string(c, "", "listen", false, o->listen, f.listen, sizeof f.listen, &err) != 0 ||
        td_json_string(c, "", "state_dir", false, o->state_dir, f.state_dir, sizeof f.state_dir,
                       &err) != 0 ||
        td_json_string(c, "", "worker", false, o->worker, f.worker, sizeof f.worker, &err) != 0 ||
        td_json_string(c, "", "web_root", false, o->web_root, f.web_root, sizeof f.web_root,
                       &err) != 0 ||
        td_json_int(c, "", "slots", false, o->slots, 1, 4096, &slots, &err) != 0 ||
        td_json_number(c, "", "grace_s", false, o->grace_s, 0, 3600, &grace, &err) != 0 ||
        td_json_int(c, "", "max_body_bytes", false, o->max_body, 1, 1L << 30, &body, &err) != 0 ||
        td_json_string(c, "", "join", false, o->join, f.join, sizeof f.join, &err) != 0 ||
        td_json_string(c, "", "cluster_secret_file", false, o->secret_file, f.secret_file,
                       sizeof f.secret_file, &err) != 0 ||
        td_json_string(c, "", "node_name", false, o->node_name, f.node_name, sizeof f.node_name,
                       &err) != 0 ||
        td_json_string(c, "", "advertise", false, o->advertise, f.advertise, sizeof f.advertise,
                       &err) != 0 ||
        td_json_number(c, "", "heartbeat_s", false, o->heartbeat_s, 0.1, 3600, &f.heartbeat_s,
                       &err) != 0 ||
        td_json_number(c, "", "node_timeout_s", false, o->timeout_s, 0.5, 86400, &f.timeout_s,
                       &err) != 0)
        die("%s: %s", path, err.msg);
    roots = json_object_get(c, "data_roots");
    if (roots && (!json_is_array(roots) || json_array_size(roots) > MAX_ROOTS))
        die("%s: data_roots: expected an array of at most %d paths", path, MAX_ROOTS);
    /* what the command line gave stays */
    if (!have[HAVE_LISTEN]) snprintf(o->listen, sizeof o->listen, "%s", f.listen);
    if (!have[HAVE_STATE]) snprintf(o->state_dir, sizeof o->state_dir, "%s", f.state_dir);
    if (!have[HAVE_SLOTS]) o->slots = (int)slots;
    if (!have[HAVE_GRACE]) o->grace_s = grace;
    if (!have[HAVE_BODY]) o->max_body = body;
    if (!have[HAVE_WORKER]) snprintf(o->worker, sizeof o->worker, "%s", f.worker);
    if (!have[HAVE_WEB]) snprintf(o->web_root, sizeof o->web_root, "%s", f.web_root);
    if (!have[HAVE_JOIN]) snprintf(o->join, sizeof o->join, "%s", f.join);
    if (!have[HAVE_SECRET]) snprintf(o->secret_file, sizeof o->secret_file, "%s", f.secret_file);
    if (!have[HAVE_NAME]) snprintf(o->node_name, sizeof o->node_name, "%s", f.node_name);
    if (!have[HAVE_ADVERTISE]) snprintf(o->advertise, sizeof o->advertise, "%s", f.advertise);
    if (!have[HAVE_HEARTBEAT]) o->heartbeat_s = f.heartbeat_s;
    if (!have[HAVE_TIMEOUT]) o->timeout_s = f.timeout_s;
    json_t *gpus = json_object_get(c, "gpus");
    if (gpus && !have[HAVE_GPUS] &&
        td_gpus_parse_json(gpus, "gpus", o->gpus, &o->n_gpus, &err) != 0)
        die("%s: %s", path, err.msg);
    for (size_t i = 0; roots && !have[HAVE_ROOTS] && i < json_array_size(roots); i++) {
        json_t *r = json_array_get(roots, i);
        if (!json_is_string(r)) {
            char where[48];
            snprintf(where, sizeof where, "data_roots[%d]", (int)i);
            td_json_fail_found(&err, where, "a path (a string)", r);
            die("%s: %s", path, err.msg);
        }
        snprintf(o->roots[o->n_roots++], PATH_MAX, "%s", json_string_value(r));
    }
    json_decref(c);
}

static void default_state_dir(char *out, size_t len) {
    const char *s = getenv("STATE_DIRECTORY"); /* systemd's StateDirectory= */
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (s && *s)
        snprintf(out, len, "%s", s);
    else if (getuid() == 0)
        snprintf(out, len, "/var/lib/traind");
    else if (xdg && *xdg)
        snprintf(out, len, "%s/traind", xdg);
    else
        snprintf(out, len, "%s/.local/state/traind", home && *home ? home : ".");
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
static void read_secret(FILE *f, const char *path, const char *what, char *out, size_t len) {
    if (!fgets(out, (int)len, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\r\n")] = 0;
    if (strlen(out) < 16)
        die("%s: the %s on its first line is shorter than 16 characters", path, what);
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        fprintf(stderr, "traind: warning: %s is readable by others (chmod 600 it)\n", path);
}

/* STATE_DIR/NAME: read, or created on the first start as 32 random bytes in hex (mode 0600):
 * the API token, the node id. */
static void load_random(const char *dir, const char *name, const char *what, char *token,
                        size_t len) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (f) {
        read_secret(f, path, what, token, len);
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
    fprintf(stderr, "traind: created a new %s in %s (mode 0600)%s\n", what, path,
            strcmp(name, "token") == 0 ? "; clients read it there" : "");
}

/* The cluster secret, from --cluster-secret-file. */
static void load_cluster_secret(const char *path, char *out, size_t len) {
    FILE *f = fopen(path, "r");
    if (!f)
        die("--cluster-secret-file %s: %s (every node needs the same file; make one with: head -c "
            "32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > FILE)",
            path, strerror(errno));
    read_secret(f, path, "cluster secret", out, len);
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
        fprintf(stderr,
                "traind: the state directory %s is in use by another traind (pid %s, which "
                "holds the lock on %s); stop that daemon first, or give this one another "
                "--state-dir\n",
                dir, pid[0] ? pid : "unknown", path);
        exit(1);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        die("cannot write %s: %s", path, strerror(errno));
    return fd;
}

/* The dashboard's files: PREFIX/share/traind/web beside an installed traind (bin/), else the
 * source tree's web/ this binary was built from. */
static void default_web_root(char *out, size_t len) {
    char self[PATH_MAX - 64];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    snprintf(out, len, "%s", TRAIND_WEB_ROOT);
    if (n <= 0) return;
    self[n] = 0;
    char *slash = strrchr(self, '/');
    if (!slash) return;
    *slash = 0;
    char installed[PATH_MAX];
    snprintf(installed, sizeof installed, "%s/../share/traind/web/index.html", self);
    if (access(installed, R_OK) == 0) snprintf(out, len, "%s/../share/traind/web", self);
}

static void default_worker(char *out, size_t len) {
    char self[PATH_MAX - 32];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) {
        snprintf(out, len, "traind-worker");
        return;
    }
    self[n] = 0;
    char *slash = strrchr(self, '/');
    *slash = 0;
    snprintf(out, len, "%s/traind-worker", self);
}

/* The command line into o; have[] marks what it gave, so the config file fills only the rest.
 * Returns the --config path or NULL; --help, --version and a usage error end the process. */
static const char *parse_args(int argc, char **argv, options *o, bool *have) {
    const char *config = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--help") || !strcmp(a, "-h")) {
            usage(stdout);
            exit(0);
        }
        if (!strcmp(a, "--version")) {
            printf("traind %s\n", TRAIND_VERSION);
            exit(0);
        }
        if (i + 1 >= argc || strncmp(a, "--", 2) != 0) {
            fprintf(stderr, "traind: %s: %s\n", a,
                    strncmp(a, "--", 2) ? "unexpected argument" : "needs a value");
            usage(stderr);
            exit(2);
        }
        const char *v = argv[++i];
        if (!strcmp(a, "--listen"))
            snprintf(o->listen, sizeof o->listen, "%s", v), have[HAVE_LISTEN] = true;
        else if (!strcmp(a, "--state-dir"))
            snprintf(o->state_dir, sizeof o->state_dir, "%s", v), have[HAVE_STATE] = true;
        else if (!strcmp(a, "--slots"))
            o->slots = (int)number("--slots", v, 1, 4096), have[HAVE_SLOTS] = true;
        else if (!strcmp(a, "--grace"))
            o->grace_s = (double)number("--grace", v, 0, 3600), have[HAVE_GRACE] = true;
        else if (!strcmp(a, "--max-body"))
            o->max_body = number("--max-body", v, 1, 1L << 30), have[HAVE_BODY] = true;
        else if (!strcmp(a, "--worker"))
            snprintf(o->worker, sizeof o->worker, "%s", v), have[HAVE_WORKER] = true;
        else if (!strcmp(a, "--web-root"))
            snprintf(o->web_root, sizeof o->web_root, "%s", v), have[HAVE_WEB] = true;
        else if (!strcmp(a, "--data-root")) {
            if (o->n_roots == MAX_ROOTS) die("at most %d --data-root", MAX_ROOTS);
            snprintf(o->roots[o->n_roots++], PATH_MAX, "%s", v);
            have[HAVE_ROOTS] = true;
        } else if (!strcmp(a, "--join"))
            snprintf(o->join, sizeof o->join, "%s", v), have[HAVE_JOIN] = true;
        else if (!strcmp(a, "--cluster-secret-file"))
            snprintf(o->secret_file, sizeof o->secret_file, "%s", v), have[HAVE_SECRET] = true;
        else if (!strcmp(a, "--node-name"))
            snprintf(o->node_name, sizeof o->node_name, "%s", v), have[HAVE_NAME] = true;
        else if (!strcmp(a, "--advertise"))
            snprintf(o->advertise, sizeof o->advertise, "%s", v), have[HAVE_ADVERTISE] = true;
        else if (!strcmp(a, "--heartbeat"))
            o->heartbeat_s = seconds("--heartbeat", v, 0.1, 3600), have[HAVE_HEARTBEAT] = true;
        else if (!strcmp(a, "--node-timeout"))
            o->timeout_s = seconds("--node-timeout", v, 0.5, 86400), have[HAVE_TIMEOUT] = true;
        else if (!strcmp(a, "--gpus")) {
            td_err err = {{0}};
            if (td_gpus_parse_list(v, o->gpus, &o->n_gpus, &err) != 0) die("%s", err.msg);
            have[HAVE_GPUS] = true;
        } else if (!strcmp(a, "--config"))
            config = v;
        else {
            fprintf(stderr, "traind: unknown option %s\n", a);
            usage(stderr);
            exit(2);
        }
    }
    return config;
}

/* The data roots resolved after symlinks (a missing one is skipped with a warning), then the
 * state directory, which always is one. Returns how many. */
static int resolve_roots(const options *o, const char *state, char (*resolved)[PATH_MAX],
                         const char **roots) {
    int n = 0;
    for (int i = 0; i < o->n_roots; i++) {
        if (!realpath(o->roots[i], resolved[n])) {
            fprintf(stderr, "traind: warning: data root %s: %s (skipped)\n", o->roots[i],
                    strerror(errno));
            continue;
        }
        roots[n] = resolved[n];
        n++;
    }
    snprintf(resolved[n], PATH_MAX, "%s", state);
    roots[n] = resolved[n];
    return n + 1;
}

/* Every thread inherits this mask: children are reaped through the supervisor's signalfd, and
 * SIGTERM/SIGINT are taken by the main thread's sigwait. */
static void block_signals(void) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    pthread_sigmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN);
}

static void set_draining(void *jobs, bool drained) {
    td_jobs_set_draining(jobs, drained);
}

/* Serves from the state directory `state` (locked) on listen_fd until SIGTERM or SIGINT. */
static int serve(const options *o, const char *state, const char *host, int listen_fd) {
    /* first: CUDA's driver (td_gpu_device_count) starts threads, which must inherit the mask,
     * or a SIGTERM (the agent's own, on a refusal) or SIGCHLD could land on one of them */
    block_signals();
    static char resolved[MAX_ROOTS + 1][PATH_MAX];
    const char *roots[MAX_ROOTS + 1];
    int n_roots = resolve_roots(o, state, resolved, roots);
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
        fprintf(stderr,
                "traind: %s declared (the driver finds none: %s); jobs are placed on them as on "
                "real ones\n",
                described, why);
    else if (gpus > 0)
        fprintf(stderr, "traind: %s\n", described);
    int slots = gpus > 0 ? gpus : o->slots > 0 ? o->slots : (int)sysconf(_SC_NPROCESSORS_ONLN);
    if (slots < 1) slots = 1;

    char token[128], node_id[128], secret[256] = "", name[64];
    load_random(state, "token", "API token", token, sizeof token);
    load_random(state, "node-id", "node id", node_id, sizeof node_id);
    if (o->secret_file[0]) load_cluster_secret(o->secret_file, secret, sizeof secret);
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
    int rc = 1;
    if (td_db_open(&db, db_path, &err) != 0) goto fail;
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
                                .log = stderr,
                                .db = db};
        if (td_cluster_open(&cluster, &cc, &err) != 0 || td_cluster_start(cluster, &err) != 0)
            goto fail;
    }
    td_jobs_config jc = {
        .state_dir = state,
        .worker = o->worker,
        .slots = slots,
        .gpus = gpus,
        .gpu_ids = gpu_ids,
        .grace_s = o->grace_s,
        .rules = {.data_roots = roots, .n_roots = n_roots, .slots = slots, .state_dir = state}};
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
                              .log = stderr};
        if (td_agent_open(&agent, &gc, &err) != 0) goto fail;
    }
    if (td_jobs_open(&jobs, &jc, db, stderr, &err) != 0) goto fail;
    td_jobs_set_cluster(jobs, cluster, name);
    if (cluster) {
        /* jobs run on the master's own node: its queue holds while it is drained (also when it
         * was drained before this start) */
        if (td_cluster_drained(cluster, name))
            fprintf(stderr,
                    "traind: node %s is drained: no job starts here until "
                    "POST /v1/nodes/%s/undrain\n",
                    name, name);
        td_cluster_on_master_drain(cluster, set_draining, jobs);
    }
    /* what a job's processes leave behind when they die (mp.spawn's children) is handed to us,
     * not to init: the supervisor reaps it, so a job's process group empties as soon as its
     * last process has ended (td_group_over) and no zombie of a job outlives it */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        fprintf(stderr,
                "traind: prctl(PR_SET_CHILD_SUBREAPER): %s (a job's leftover processes "
                "are killed at the end of the grace period instead)\n",
                strerror(errno));
    if (td_jobs_start(jobs, &err) != 0) goto fail;
    td_api_config ac = {.listen_fd = listen_fd,
                        .token = token,
                        .max_body = (size_t)o->max_body,
                        .version = TRAIND_VERSION,
                        .cluster = cluster,
                        .master = o->join[0] ? o->join : NULL,
                        .web_root = o->web_root,
                        .chart_root = TRAIND_CHART_ROOT,
                        .state_dir = state};
    if (td_api_start(&api, &ac, jobs, &err) != 0) goto fail;
    fprintf(stderr, "traind: %d %s slot%s; state in %s; worker %s\n", slots,
            gpus > 0 ? "GPU" : "CPU", slots == 1 ? "" : "s", state, o->worker);
    fprintf(stderr, "traind: listening on http://%s:%d\n", host, td_api_port(api));
    fprintf(stderr, "traind: the dashboard is at http://%s:%d/ (sign in with the API token)\n",
            host, td_api_port(api));
    if (cluster)
        fprintf(stderr, "traind: node %s is the cluster's master; %s\n", name,
                secret[0] ? "agents join with --join and the cluster secret"
                          : "it accepts no agents (no --cluster-secret-file)");
    fflush(stderr);
    if (agent && td_agent_start(agent, jobs, &err) != 0) goto fail;

    sigset_t stop;
    sigemptyset(&stop);
    sigaddset(&stop, SIGTERM);
    sigaddset(&stop, SIGINT);
    int sig = 0;
    sigwait(&stop, &sig);
    bool refused = td_agent_refused(agent);
    if (refused)
        fprintf(stderr, "traind: stopping: the master refused this node (see above)\n");
    else
        fprintf(stderr, "traind: %s: stopping (running jobs resume at the next start)\n",
                strsignal(sig));
    rc = refused ? 1 : 0;
    goto stop;
fail:
    fprintf(stderr, "traind: %s\n", err.msg);
stop:
    td_agent_stop(agent);
    /* the registry's sweeper calls into the jobs: cut it off before they go */
    if (cluster) td_cluster_on_jobs(cluster, NULL, NULL, NULL);
    td_jobs_stop(jobs);
    td_api_stop(api);
    td_cluster_close(cluster); /* its sweeper joined before the jobs it calls go */
    td_jobs_close(jobs);
    td_db_close(db);
    return rc;
}

int main(int argc, char **argv) {
    options o = {.grace_s = 10, .max_body = 1 << 20, .heartbeat_s = 2, .timeout_s = 10};
    bool have[HAVE_COUNT] = {false}; /* given on the command line */
    const char *config = parse_args(argc, argv, &o, have);
    if (config) read_config(&o, config, have);
    if (!o.listen[0]) snprintf(o.listen, sizeof o.listen, "127.0.0.1:8470");
    if (!o.state_dir[0]) default_state_dir(o.state_dir, sizeof o.state_dir);
    if (!o.worker[0]) default_worker(o.worker, sizeof o.worker);
    if (!o.web_root[0]) default_web_root(o.web_root, sizeof o.web_root);
    if (o.n_roots == 0) snprintf(o.roots[o.n_roots++], PATH_MAX, "/usr/share/datasets");
    if (o.heartbeat_s * 2 > o.timeout_s)
        die("--heartbeat %g must be at most half of --node-timeout %g: agents would be marked lost "
            "between two heartbeats",
            o.heartbeat_s, o.timeout_s);
    if (access(o.worker, X_OK) != 0)
        die("cannot run the worker %s: %s (give --worker)", o.worker, strerror(errno));
    char host[128];
    const char *colon = strrchr(o.listen, ':');
    if (!colon || colon == o.listen || (size_t)(colon - o.listen) >= sizeof host)
        die("--listen \"%s\": expected ADDR:PORT, e.g. 127.0.0.1:8470", o.listen);
    snprintf(host, sizeof host, "%.*s", (int)(colon - o.listen), o.listen);
    int port = (int)number("--listen port", colon + 1, 0, 65535);

    make_dirs(o.state_dir);
    char state[PATH_MAX];
    if (!realpath(o.state_dir, state)) die("%s: %s", o.state_dir, strerror(errno));
    int lock_fd = lock_state_dir(state); /* held until the process ends */
    /* the port before the jobs: a daemon that cannot serve must not recover anything */
    int listen_fd = -1;
    td_err err = {{0}};
    if (td_api_listen(host, &port, &listen_fd, &err) != 0) {
        fprintf(stderr, "traind: %s\n", err.msg);
        return 1;
    }
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) die("cannot initialise libcurl");
    int rc = serve(&o, state, host, listen_fd);
    curl_global_cleanup();
    close(lock_fd);
    return rc;
}
