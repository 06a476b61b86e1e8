/* traind's options: the command line, the config file and the defaults, from one table. */
#include "daemon_config.h"

#include "core/td_json.h"
#include "core/td_parse.h"
#include "service/td_shepherd.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum {
    T_TEXT,
    T_INT,
    T_LONG,
    T_SECONDS,
    T_ROOTS,
    T_GPUS,
    T_CHOICE,
    T_BOOL,
    T_NUMBER,  /* like T_SECONDS, in other words */
    T_PROGRAMS /* "any", "none", or executables: a ':'-joined text, or a JSON array */
} opt_type;

typedef struct opt_info {
    const char *flag, *key;
    opt_type type;
    size_t offset, size; /* the field in daemon_options */
    double min, max;     /* numbers */
    const char *choices; /* T_CHOICE: "a|b|c" */
    bool live;           /* a reload (SIGHUP) applies a change; else it needs a restart */
} opt_info;

/* Text options whose empty value means nothing (an empty one for join, node_name, advertise or
 * cluster_secret_file means "none"). */
static bool needs_text(daemon_option opt) {
    return opt == OPT_LISTEN || opt == OPT_STATE_DIR || opt == OPT_WORKER || opt == OPT_WEB_ROOT ||
           opt == OPT_SHEPHERD;
}

#define FIELD(f) offsetof(daemon_options, f), sizeof(((daemon_options *)0)->f)

/* In daemon_option order (check_table says so at start-up). */
static const opt_info OPTS[OPT_COUNT] = {
    [OPT_LISTEN] = {"--listen", "listen", T_TEXT, FIELD(listen), 0, 0, NULL, false},
    [OPT_STATE_DIR] = {"--state-dir", "state_dir", T_TEXT, FIELD(state_dir), 0, 0, NULL, false},
    [OPT_SLOTS] = {"--slots", "slots", T_INT, FIELD(slots), 1, 4096, NULL, false},
    [OPT_GPUS] = {"--gpus", "gpus", T_GPUS, FIELD(gpus), 0, 0, NULL, false},
    [OPT_DATA_ROOTS] = {"--data-root", "data_roots", T_ROOTS, FIELD(roots), 0, 0, NULL, true},
    [OPT_GRACE] = {"--grace", "grace_s", T_SECONDS, FIELD(grace_s), 0, 3600, NULL, true},
    [OPT_MAX_BODY] = {"--max-body", "max_body_bytes", T_LONG, FIELD(max_body), 1, 1 << 30, NULL,
                      true},
    [OPT_WORKER] = {"--worker", "worker", T_TEXT, FIELD(worker), 0, 0, NULL, false},
    [OPT_WEB_ROOT] = {"--web-root", "web_root", T_TEXT, FIELD(web_root), 0, 0, NULL, false},
    [OPT_LOG_FORMAT] = {"--log-format", "log_format", T_CHOICE, FIELD(log_format), 0, 0,
                        "text|json", true},
    [OPT_LOG_LEVEL] = {"--log-level", "log_level", T_CHOICE, FIELD(log_level), 0, 0,
                       "error|warning|info|debug", true},
    [OPT_SECRET] = {"--cluster-secret-file", "cluster_secret_file", T_TEXT, FIELD(secret_file), 0,
                    0, NULL, false},
    [OPT_JOIN] = {"--join", "join", T_TEXT, FIELD(join), 0, 0, NULL, false},
    [OPT_NODE_NAME] = {"--node-name", "node_name", T_TEXT, FIELD(node_name), 0, 0, NULL, false},
    [OPT_ADVERTISE] = {"--advertise", "advertise", T_TEXT, FIELD(advertise), 0, 0, NULL, false},
    [OPT_HEARTBEAT] = {"--heartbeat", "heartbeat_s", T_SECONDS, FIELD(heartbeat_s), 0.1, 3600, NULL,
                       false},
    [OPT_NODE_TIMEOUT] = {"--node-timeout", "node_timeout_s", T_SECONDS, FIELD(timeout_s), 0.5,
                          86400, NULL, false},
    [OPT_TLS_CERT] = {"--tls-cert", "tls_cert", T_TEXT, FIELD(tls_cert), 0, 0, NULL, false},
    [OPT_TLS_KEY] = {"--tls-key", "tls_key", T_TEXT, FIELD(tls_key), 0, 0, NULL, false},
    [OPT_TLS_CA] = {"--tls-ca", "tls_ca", T_TEXT, FIELD(tls_ca), 0, 0, NULL, false},
    [OPT_KEEP_JOBS] = {"--keep-jobs-on-stop", "keep_jobs_on_stop", T_BOOL, FIELD(keep_jobs_on_stop),
                       0, 0, NULL, true},
    [OPT_ORPHAN_TIMEOUT] = {"--orphan-timeout", "orphan_timeout_s", T_SECONDS,
                            FIELD(orphan_timeout_s), 1, 30 * 86400.0, NULL, true},
    [OPT_SHEPHERD] = {"--shepherd", "shepherd", T_TEXT, FIELD(shepherd), 0, 0, NULL, false},
    [OPT_METRICS_LISTEN] = {"--metrics-listen", "metrics_listen", T_TEXT, FIELD(metrics_listen), 0,
                            0, NULL, false},
    [OPT_RUN_AS] = {"--run-as", "run_as", T_TEXT, FIELD(run_as), 0, 0, NULL, false},
    [OPT_COMMAND_JOBS] = {"--command-jobs", "command_jobs", T_PROGRAMS, FIELD(command_jobs), 0, 0,
                          NULL, true},
    [OPT_RATE_LIMIT] = {"--rate-limit", "rate_limit_per_s", T_NUMBER, FIELD(rate_limit_per_s), 0,
                        1e7, NULL, true},
    [OPT_MAX_STREAMS] = {"--max-streams", "max_streams_per_token", T_LONG,
                         FIELD(max_streams_per_token), 0, 1000000, NULL, true},
    [OPT_MAX_QUEUED] = {"--max-queued", "max_queued_per_token", T_LONG, FIELD(max_queued_per_token),
                        0, 1000000, NULL, true},
    [OPT_AUDIT_LOG] = {"--audit-log", "audit_log", T_TEXT, FIELD(audit_log), 0, 0, NULL, false},
    [OPT_KEEP_FINISHED_FOR] = {"--keep-finished-for", "keep_finished_for_s", T_SECONDS,
                               FIELD(keep_finished_for_s), 0, 100 * 365 * 86400.0, NULL, true},
    [OPT_KEEP_FINISHED_JOBS] = {"--keep-finished-jobs", "keep_finished_jobs", T_LONG,
                                FIELD(keep_finished_jobs), 0, 100000000, NULL, true},
    [OPT_MAX_CONNECTIONS] = {"--max-connections", "max_connections", T_LONG, FIELD(max_connections),
                             16, 1000000, NULL, false},
    [OPT_JOB_UIDS] = {"--job-uids", "job_uids", T_TEXT, FIELD(job_uids), 0, 0, NULL, false},
    [OPT_JOB_GROUPS] = {"--job-groups", "job_groups", T_TEXT, FIELD(job_groups), 0, 0, NULL, false},
    [OPT_JOB_MEMORY] = {"--job-memory-gb", "job_memory_gb", T_NUMBER, FIELD(job_memory_gb), 0, 1e7,
                        NULL, false},
    [OPT_MAX_JOB_MEMORY] = {"--max-job-memory-gb", "max_job_memory_gb", T_NUMBER,
                            FIELD(max_job_memory_gb), 0, 1e7, NULL, false},
    [OPT_JOB_PIDS] = {"--job-pids", "job_pids", T_LONG, FIELD(job_pids), 16, 4194304, NULL, false},
    [OPT_MAX_JOB_PIDS] = {"--max-job-pids", "max_job_pids", T_LONG, FIELD(max_job_pids), 16,
                          4194304, NULL, false},
    [OPT_JOB_DISK] = {"--job-disk-gb", "job_disk_gb", T_NUMBER, FIELD(job_disk_gb), 0.001, 1e9,
                      NULL, false},
    [OPT_MAX_JOB_DISK] = {"--max-job-disk-gb", "max_job_disk_gb", T_NUMBER, FIELD(max_job_disk_gb),
                          0.001, 1e9, NULL, false},
    [OPT_MAX_CHECKPOINT_FILES] = {"--max-checkpoint-files", "max_checkpoint_files", T_LONG,
                                  FIELD(max_checkpoint_files), 1, 10000000, NULL, false},
    [OPT_MAX_LOG_BYTES] = {"--max-log-bytes", "max_log_bytes", T_LONG, FIELD(max_log_bytes), 4096,
                           1e15, NULL, false},
    [OPT_MAX_EVENTS] = {"--max-events-per-s", "max_events_per_s", T_NUMBER, FIELD(max_events_per_s),
                        0, 1e6, NULL, false},
    [OPT_MAX_CONNECTIONS_PER_IP] = {"--max-connections-per-ip", "max_connections_per_ip", T_LONG,
                                    FIELD(max_connections_per_ip), 1, 1000000, NULL, false},
    [OPT_CONNECTION_TIMEOUT] = {"--connection-timeout", "connection_timeout_s", T_SECONDS,
                                FIELD(connection_timeout_s), 1, 86400, NULL, false},
    [OPT_MAX_SESSIONS] = {"--max-sessions-per-token", "max_sessions_per_token", T_LONG,
                          FIELD(max_sessions_per_token), 0, 1000000, NULL, true},
    [OPT_MAX_JOB_BYTES] = {"--max-job-bytes-per-token", "max_job_bytes_per_token", T_LONG,
                           FIELD(max_job_bytes_per_token), 0, 1e15, NULL, true},
    [OPT_INSECURE_CLUSTER] = {"--insecure-cluster", "insecure_cluster", T_BOOL,
                              FIELD(insecure_cluster), 0, 0, NULL, false},
};

/* command_jobs's programs, one at a time: an absolute path to an executable file. */
static int program_ok(const char *where, const char *p, td_err *err) {
    if (p[0] != '/')
        return td_fail(err, "%s \"%s\": expected an absolute path (or \"any\" or \"none\")", where,
                       p);
    if (strchr(p, ':'))
        return td_fail(err, "%s \"%s\": a path with ':' cannot be listed", where, p);
    if (access(p, X_OK) != 0)
        return td_fail(err, "%s \"%s\": %s", where, p,
                       errno == ENOENT ? "no such file" : "not an executable");
    return 0;
}

/* The text form ("any", "none", "/a:/b") checked and copied into out. */
static int set_programs(const char *flag, const char *v, char *out, size_t size, td_err *err) {
    if (strlen(v) >= size) return td_fail(err, "%s: longer than %zu characters", flag, size - 1);
    if (strcmp(v, "any") != 0 && strcmp(v, "none") != 0) {
        char copy[8192], *save = NULL;
        snprintf(copy, sizeof copy, "%s", v);
        if (!v[0] || v[0] == ':' || v[strlen(v) - 1] == ':' || strstr(v, "::"))
            return td_fail(err, "%s \"%s\": expected any, none or absolute paths joined by ':'",
                           flag, v);
        for (char *p = strtok_r(copy, ":", &save); p; p = strtok_r(NULL, ":", &save))
            if (program_ok(flag, p, err) != 0) return -1;
    }
    memcpy(out, v, strlen(v) + 1);
    return 0;
}

static void *field(daemon_options *o, daemon_option opt) {
    return (char *)o + OPTS[opt].offset;
}

static const void *cfield(const daemon_options *o, daemon_option opt) {
    return (const char *)o + OPTS[opt].offset;
}

/* Whether s is one of "a|b|c". */
static bool one_of(const char *choices, const char *s) {
    size_t n = strlen(s);
    for (const char *c = choices; *c;) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && strncmp(c, s, n) == 0 && n > 0) return true;
        c += len + (bar ? 1 : 0);
    }
    return false;
}

/* The command line's value v for option opt. -1 with the message in err. */
static int set_from_text(daemon_options *o, daemon_option opt, const char *v, bool first_root,
                         td_err *err) {
    const opt_info *in = &OPTS[opt];
    void *f = field(o, opt);
    switch (in->type) {
    case T_TEXT:
    case T_CHOICE:
        if (in->type == T_CHOICE && !one_of(in->choices, v))
            return td_fail(err, "%s \"%s\": expected one of %s", in->flag, v, in->choices);
        if (!v[0] && needs_text(opt)) return td_fail(err, "%s: needs a non-empty value", in->flag);
        if (strlen(v) >= in->size)
            return td_fail(err, "%s: longer than %zu characters", in->flag, in->size - 1);
        memcpy(f, v, strlen(v) + 1);
        return 0;
    case T_INT:
    case T_LONG: {
        long x;
        if (!td_parse_long(v, (long)in->min, (long)in->max, &x))
            return td_fail(err, "%s \"%s\": expected an integer in [%ld, %ld]", in->flag, v,
                           (long)in->min, (long)in->max);
        if (in->type == T_INT)
            *(int *)f = (int)x;
        else
            *(long *)f = x;
        return 0;
    }
    case T_SECONDS:
    case T_NUMBER: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !(x >= in->min && x <= in->max))
            return td_fail(err, "%s \"%s\": expected %s in [%g, %g]", in->flag, v,
                           in->type == T_SECONDS ? "seconds" : "a number", in->min, in->max);
        *(double *)f = x;
        return 0;
    }
    case T_PROGRAMS:
        return set_programs(in->flag, v, f, in->size, err);
    case T_ROOTS:
        if (!v[0]) return td_fail(err, "%s: needs a directory, not an empty string", in->flag);
        if (first_root) o->n_roots = 0; /* the command line's replace the file's */
        if (o->n_roots == DAEMON_MAX_ROOTS)
            return td_fail(err, "at most %d %s", DAEMON_MAX_ROOTS, in->flag);
        if (strlen(v) >= PATH_MAX) return td_fail(err, "%s: path too long", in->flag);
        snprintf(o->roots[o->n_roots++], PATH_MAX, "%s", v);
        return 0;
    case T_GPUS:
        return td_gpus_parse_list(v, o->gpus, &o->n_gpus, err);
    case T_BOOL:
        if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
            return td_fail(err, "%s \"%s\": expected true or false", in->flag, v);
        *(bool *)f = strcmp(v, "true") == 0;
        return 0;
    }
    return td_fail(err, "%s: unknown option type", in->flag);
}

/* Member opt.key of the config file's object c, when present. */
static int set_from_json(daemon_options *o, daemon_option opt, const json_t *c, td_err *err) {
    const opt_info *in = &OPTS[opt];
    const json_t *v = json_object_get(c, in->key);
    void *f = field(o, opt);
    if (!v) return 0;
    switch (in->type) {
    case T_TEXT:
        if (td_json_string(c, "", in->key, true, NULL, f, in->size, err) != 0) return -1;
        if (!((char *)f)[0] && needs_text(opt))
            return td_json_fail_found(err, in->key, "a non-empty string", v);
        break;
    case T_CHOICE: {
        int idx;
        if (td_json_choice(c, "", in->key, true, NULL, in->choices, &idx, err) != 0) return -1;
        if (json_string_length(v) >= in->size)
            return td_json_fail_found(err, in->key, "a shorter choice", v);
        memcpy(f, json_string_value(v), json_string_length(v) + 1);
        break;
    }
    case T_INT:
    case T_LONG: {
        long x;
        if (td_json_int(c, "", in->key, true, 0, (long)in->min, (long)in->max, &x, err) != 0)
            return -1;
        if (in->type == T_INT)
            *(int *)f = (int)x;
        else
            *(long *)f = x;
        break;
    }
    case T_SECONDS:
    case T_NUMBER:
        if (td_json_number(c, "", in->key, true, 0, in->min, in->max, f, err) != 0) return -1;
        break;
    case T_PROGRAMS: {
        char *text = f;
        if (json_is_string(v)) {
            const char *s = json_string_value(v);
            if (strcmp(s, "any") != 0 && strcmp(s, "none") != 0)
                return td_json_fail_found(err, in->key,
                                          "\"any\", \"none\" or an array of absolute paths", v);
            snprintf(text, in->size, "%s", s);
            break;
        }
        if (!json_is_array(v) || json_array_size(v) == 0)
            return td_json_fail_found(
                err, in->key, "\"any\", \"none\" or a non-empty array of absolute paths", v);
        size_t i, used = 0;
        const json_t *p;
        text[0] = 0;
        json_array_foreach(v, i, p) {
            char where[48];
            snprintf(where, sizeof where, "%s[%zu]", in->key, i);
            if (!json_is_string(p)) return td_json_fail_found(err, where, "a path", p);
            if (program_ok(where, json_string_value(p), err) != 0) return -1;
            size_t n = json_string_length(p);
            if (used + n + 2 > in->size) return td_fail(err, "%s: too many programs", in->key);
            if (used) text[used++] = ':';
            memcpy(text + used, json_string_value(p), n + 1);
            used += n;
        }
        break;
    }
    case T_ROOTS: {
        if (!json_is_array(v) || json_array_size(v) > DAEMON_MAX_ROOTS) {
            char what[64];
            snprintf(what, sizeof what, "an array of at most %d paths", DAEMON_MAX_ROOTS);
            return td_json_fail_found(err, in->key, what, v);
        }
        o->n_roots = 0;
        size_t i;
        const json_t *r;
        json_array_foreach(v, i, r) {
            char where[48];
            snprintf(where, sizeof where, "%s[%zu]", in->key, i);
            if (!json_is_string(r) || json_string_length(r) == 0 ||
                json_string_length(r) >= PATH_MAX)
                return td_json_fail_found(err, where, "a path (a non-empty string)", r);
            snprintf(o->roots[o->n_roots++], PATH_MAX, "%s", json_string_value(r));
        }
        break;
    }
    case T_GPUS:
        if (td_gpus_parse_json(v, in->key, o->gpus, &o->n_gpus, err) != 0) return -1;
        break;
    case T_BOOL:
        if (!json_is_boolean(v)) return td_json_fail_found(err, in->key, "true or false", v);
        *(bool *)f = json_is_true(v);
        break;
    }
    o->from[opt] = DAEMON_FROM_FILE;
    return 0;
}

/* The file's settings for whatever the command line left alone. -1 with "FILE: message". */
static int read_file(daemon_options *o, const char *path, td_err *err) {
    const char *keys[OPT_COUNT + 1];
    for (int i = 0; i < OPT_COUNT; i++) keys[i] = OPTS[i].key;
    keys[OPT_COUNT] = NULL;
    json_error_t je;
    json_t *c = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!c) {
        if (je.line < 1) return td_fail(err, "%s: %s", path, je.text);
        return td_fail(err, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    }
    int rc = 0;
    td_err e = {{0}};
    if (!json_is_object(c)) {
        td_json_fail_found(&e, "(the top level)", "a JSON object of settings", c);
        rc = -1;
    } else if (td_json_check_keys(c, "", keys, &e) != 0)
        rc = -1;
    for (int i = 0; rc == 0 && i < OPT_COUNT; i++)
        if (o->from[i] != DAEMON_FROM_ARGS && set_from_json(o, (daemon_option)i, c, &e) != 0)
            rc = -1;
    json_decref(c);
    if (rc != 0) return td_fail(err, "%s: %s", path, e.msg);
    return 0;
}

static void default_state_dir(char *out, size_t len) {
    const char *s = getenv("STATE_DIRECTORY"); /* systemd's StateDirectory= */
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (s && *s) {
        /* several directories are separated by ':'; traind's is the first */
        snprintf(out, len, "%.*s", (int)strcspn(s, ":"), s);
    } else if (getuid() == 0)
        snprintf(out, len, "/var/lib/traind");
    else if (xdg && *xdg)
        snprintf(out, len, "%s/traind", xdg);
    else
        snprintf(out, len, "%s/.local/state/traind", home && *home ? home : ".");
}

/* The directory this executable is in ("" when /proc/self/exe cannot be read). */
static void self_dir(char *out, size_t len) {
    ssize_t n = readlink("/proc/self/exe", out, len - 1);
    out[n > 0 ? n : 0] = 0;
    char *slash = strrchr(out, '/');
    if (slash) *slash = 0;
}

/* The dashboard's files: PREFIX/share/traind/web beside an installed traind (bin/), else the
 * source tree's web/ this binary was built from. */
static void default_web_root(char *out, size_t len) {
    char self[PATH_MAX - 64];
    self_dir(self, sizeof self);
    snprintf(out, len, "%s", TRAIND_WEB_ROOT);
    if (!self[0]) return;
    char installed[PATH_MAX];
    snprintf(installed, sizeof installed, "%s/../share/traind/web/index.html", self);
    if (access(installed, R_OK) == 0) snprintf(out, len, "%s/../share/traind/web", self);
}

static void default_worker(char *out, size_t len) {
    char self[PATH_MAX - 32];
    self_dir(self, sizeof self);
    if (!self[0])
        snprintf(out, len, "traind-worker");
    else
        snprintf(out, len, "%s/traind-worker", self);
}

/* Only what neither the command line nor the file gave ("data_roots": [] in the file stays
 * empty: the state directory alone). */
static void apply_defaults(daemon_options *o) {
    const daemon_source *from = o->from;
    if (from[OPT_LISTEN] == DAEMON_FROM_DEFAULT)
        snprintf(o->listen, sizeof o->listen, "127.0.0.1:8470");
    if (from[OPT_STATE_DIR] == DAEMON_FROM_DEFAULT)
        default_state_dir(o->state_dir, sizeof o->state_dir);
    if (from[OPT_WORKER] == DAEMON_FROM_DEFAULT) default_worker(o->worker, sizeof o->worker);
    if (from[OPT_SHEPHERD] == DAEMON_FROM_DEFAULT) {
        char self[PATH_MAX - 64];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = 0;
        td_shepherd_program(o->shepherd, sizeof o->shepherd, self);
    }
    if (from[OPT_WEB_ROOT] == DAEMON_FROM_DEFAULT)
        default_web_root(o->web_root, sizeof o->web_root);
    if (from[OPT_LOG_FORMAT] == DAEMON_FROM_DEFAULT)
        snprintf(o->log_format, sizeof o->log_format, "text");
    if (from[OPT_LOG_LEVEL] == DAEMON_FROM_DEFAULT)
        snprintf(o->log_level, sizeof o->log_level, "info");
    if (from[OPT_COMMAND_JOBS] == DAEMON_FROM_DEFAULT)
        snprintf(o->command_jobs, sizeof o->command_jobs, "any");
    if (from[OPT_AUDIT_LOG] == DAEMON_FROM_DEFAULT || !o->audit_log[0])
        snprintf(o->audit_log, sizeof o->audit_log, "%.*s/audit.log", PATH_MAX - 16, o->state_dir);
    if (from[OPT_JOB_UIDS] == DAEMON_FROM_DEFAULT) /* 0x70000000: above systemd-nspawn's */
        snprintf(o->job_uids, sizeof o->job_uids, "1879048192-1879113727");
    if (from[OPT_DATA_ROOTS] == DAEMON_FROM_DEFAULT) {
        o->n_roots = 0;
        snprintf(o->roots[o->n_roots++], PATH_MAX, "/usr/share/datasets");
    }
}

/* The table covers every option, in order: a gap would be a NULL flag at the first lookup. */
static int check_table(td_err *err) {
    for (int i = 0; i < OPT_COUNT; i++)
        if (!OPTS[i].flag || !OPTS[i].key || OPTS[i].size == 0)
            return td_fail(err, "internal: option %d has no row in daemon_config.c's table", i);
    return 0;
}

static void init(daemon_options *o) {
    *o = (daemon_options){.grace_s = 10,
                          .max_body = 1 << 20,
                          .heartbeat_s = 2,
                          .timeout_s = 10,
                          .orphan_timeout_s = 600,
                          .rate_limit_per_s = 200,
                          .max_streams_per_token = 64,
                          .max_queued_per_token = 1000,
                          /* a month and ten thousand: what a team looks back at, in a bounded
                           * disk (set both to 0 to keep every job) */
                          .keep_finished_for_s = 30 * 86400.0,
                          .keep_finished_jobs = 10000,
                          /* event streams hold one each: a thousand dashboards and scripts
                           * following jobs, with room for the requests beside them */
                          .max_connections = 4096,
                          /* one address holds at most this many: another still gets in */
                          .max_connections_per_ip = 128,
                          .connection_timeout_s = 30,
                          .max_sessions_per_token = 16,
                          /* sixty-four 1 MiB specs, or thousands of ordinary ones */
                          .max_job_bytes_per_token = 64L << 20,
                          .job_pids = 16384,
                          .max_job_pids = 65536,
                          .job_disk_gb = 100,
                          .max_job_disk_gb = 1000,
                          .max_checkpoint_files = 10000,
                          .max_log_bytes = 1L << 30,
                          .max_events_per_s = 200};
}

/* The command line into o (marking what it gave). *config: the --config value or NULL. exits:
 * --help and --version print and exit (the first load); a reload never meets them. */
static int parse_args(daemon_options *o, int argc, char **argv, const char **config, bool exits,
                      td_err *err) {
    *config = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (exits && (!strcmp(a, "--help") || !strcmp(a, "-h"))) {
            daemon_config_usage(stdout);
            exit(0);
        }
        if (exits && !strcmp(a, "--version")) {
            printf("traind %s\n", TRAIND_VERSION);
            exit(0);
        }
        if (!strcmp(a, "--print-config")) {
            o->print_config = true;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) return td_fail(err, "%s: unexpected argument", a);
        int opt = -1;
        for (int k = 0; k < OPT_COUNT && opt < 0; k++)
            if (!strcmp(a, OPTS[k].flag)) opt = k;
        if (opt < 0 && strcmp(a, "--config") != 0) return td_fail(err, "unknown option %s", a);
        if (i + 1 >= argc) return td_fail(err, "%s: needs a value", a);
        const char *v = argv[++i];
        if (opt < 0) {
            *config = v;
            continue;
        }
        bool first = o->from[opt] != DAEMON_FROM_ARGS;
        if (set_from_text(o, (daemon_option)opt, v, first, err) != 0) return -1;
        o->from[opt] = DAEMON_FROM_ARGS;
    }
    return 0;
}

/* The whole load; -1 with the message (no exit but --help and --version when exits). */
static int load(daemon_options *o, int argc, char **argv, bool exits, td_err *err) {
    init(o);
    if (check_table(err) != 0) return -1;
    const char *config;
    if (parse_args(o, argc, argv, &config, exits, err) != 0) return -1;
    if (!config) config = getenv("TRAIND_CONFIG"); /* NULL: the default file, if there is one */
    if (config && config[0]) {
        snprintf(o->config_path, sizeof o->config_path, "%s", config);
    } else if (!config && access(DAEMON_CONFIG_DEFAULT, F_OK) == 0)
        snprintf(o->config_path, sizeof o->config_path, "%s", DAEMON_CONFIG_DEFAULT);
    if (o->config_path[0] && read_file(o, o->config_path, err) != 0) return -1;
    apply_defaults(o);
    if (!o->tls_cert[0] != !o->tls_key[0])
        return td_fail(err, "%s without %s: HTTPS needs both the certificate and its key",
                       o->tls_cert[0] ? "tls_cert" : "tls_key",
                       o->tls_cert[0] ? "tls_key" : "tls_cert");
    if (o->heartbeat_s * 2 > o->timeout_s)
        return td_fail(err,
                       "heartbeat_s %g (%s) must be at most half of node_timeout_s %g (%s): "
                       "agents would be marked lost between two heartbeats",
                       o->heartbeat_s, daemon_config_source(o, OPT_HEARTBEAT), o->timeout_s,
                       daemon_config_source(o, OPT_NODE_TIMEOUT));
    return 0;
}

void daemon_config_load(daemon_options *o, int argc, char **argv) {
    td_err err = {{0}};
    if (load(o, argc, argv, true, &err) != 0) {
        fprintf(stderr, "traind: %s\n", err.msg);
        if (strstr(err.msg, "unknown option") || strstr(err.msg, "unexpected argument") ||
            strstr(err.msg, "needs a value"))
            fprintf(stderr, "(traind --help lists the options)\n");
        exit(2);
    }
}

int daemon_config_reload(daemon_options *next, const daemon_options *now, int argc, char **argv,
                         char *why, size_t len) {
    td_err err = {{0}};
    if (load(next, argc, argv, false, &err) != 0) {
        snprintf(why, len, "%s", err.msg);
        return -1;
    }
    /* the default file removed: falling back to the defaults would undo its settings silently */
    if (now->config_path[0] && strcmp(now->config_path, next->config_path) != 0) {
        snprintf(why, len, "%s: %s", now->config_path,
                 next->config_path[0] ? "another file is read now" : "the file is gone");
        return -1;
    }
    return 0;
}

/* The value as JSON text (allocated), for --print-config and reload messages. */
char *daemon_config_value(const daemon_options *o, daemon_option opt) {
    const void *f = cfield(o, opt);
    json_t *v = NULL;
    switch (OPTS[opt].type) {
    case T_TEXT:
    case T_CHOICE:
        v = json_string((const char *)f);
        break;
    case T_INT:
        v = *(const int *)f ? json_integer(*(const int *)f) : json_null(); /* 0: automatic */
        break;
    case T_LONG:
        v = json_integer(*(const long *)f);
        break;
    case T_SECONDS:
    case T_NUMBER:
        v = json_real(*(const double *)f);
        break;
    case T_PROGRAMS: {
        const char *s = f;
        if (strcmp(s, "any") == 0 || strcmp(s, "none") == 0) {
            v = json_string(s);
            break;
        }
        v = json_array();
        char copy[8192], *save = NULL;
        snprintf(copy, sizeof copy, "%s", s);
        for (char *p = strtok_r(copy, ":", &save); p; p = strtok_r(NULL, ":", &save))
            json_array_append_new(v, json_string(p));
        break;
    }
    case T_ROOTS:
        v = json_array();
        for (int i = 0; i < o->n_roots; i++) json_array_append_new(v, json_string(o->roots[i]));
        break;
    case T_GPUS:
        v = json_array();
        for (int i = 0; i < o->n_gpus; i++)
            json_array_append_new(v, json_integer(o->gpus[i].index));
        break;
    case T_BOOL:
        v = json_boolean(*(const bool *)f);
        break;
    }
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(v);
    return s ? s : strdup("?"); /* a path that is not UTF-8 has no JSON string */
}

const char *daemon_config_source(const daemon_options *o, daemon_option opt) {
    switch (o->from[opt]) {
    case DAEMON_FROM_ARGS:
        return "from the command line";
    case DAEMON_FROM_FILE:
        return o->config_path;
    default:
        return "the default";
    }
}

void daemon_config_print(const daemon_options *o, FILE *out) {
    fprintf(out,
            "# traind settings: the command line wins over the config file (%s), the file "
            "over the defaults\n",
            o->config_path[0] ? o->config_path : "none read");
    for (int i = 0; i < OPT_COUNT; i++) {
        char *v = daemon_config_value(o, (daemon_option)i);
        const char *auto_note = "";
        if (i == OPT_SLOTS && o->slots == 0) auto_note = ": one per GPU, else the core count";
        if (i == OPT_GPUS && o->n_gpus == 0) auto_note = ": every GPU the driver finds";
        char from[PATH_MAX + 32];
        if (o->from[i] == DAEMON_FROM_ARGS)
            snprintf(from, sizeof from, "command line %s", OPTS[i].flag);
        else if (o->from[i] == DAEMON_FROM_FILE)
            snprintf(from, sizeof from, "%s", o->config_path);
        else
            snprintf(from, sizeof from, "default%s", auto_note);
        fprintf(out, "%-20s %-32s # %s\n", OPTS[i].key, v ? v : "?", from);
        free(v);
    }
}

bool daemon_config_changed(const daemon_options *a, const daemon_options *b, daemon_option opt) {
    const void *fa = cfield(a, opt), *fb = cfield(b, opt);
    switch (OPTS[opt].type) {
    case T_TEXT:
    case T_CHOICE:
        return strcmp(fa, fb) != 0;
    case T_INT:
        return *(const int *)fa != *(const int *)fb;
    case T_LONG:
        return *(const long *)fa != *(const long *)fb;
    case T_SECONDS:
    case T_NUMBER:
        return *(const double *)fa != *(const double *)fb;
    case T_PROGRAMS:
        return strcmp(fa, fb) != 0;
    case T_ROOTS:
        if (a->n_roots != b->n_roots) return true;
        for (int i = 0; i < a->n_roots; i++)
            if (strcmp(a->roots[i], b->roots[i]) != 0) return true;
        return false;
    case T_GPUS:
        if (a->n_gpus != b->n_gpus) return true;
        for (int i = 0; i < a->n_gpus; i++)
            if (a->gpus[i].index != b->gpus[i].index ||
                strcmp(a->gpus[i].name, b->gpus[i].name) != 0 ||
                a->gpus[i].memory_bytes != b->gpus[i].memory_bytes)
                return true;
        return false;
    case T_BOOL:
        return *(const bool *)fa != *(const bool *)fb;
    }
    return true;
}

const char *daemon_config_key(daemon_option opt) {
    return OPTS[opt].key;
}

bool daemon_config_live(daemon_option opt) {
    return OPTS[opt].live;
}
