/* traind's settings: one table of options, each with its command-line flag and its config-file
 * key, so the two can never drift apart. The command line wins over the file, the file over the
 * defaults; every setting remembers where it came from (traind --print-config shows it), and a
 * reload (SIGHUP) re-reads the file and says which changes it applied and which need a
 * restart. */
#ifndef DAEMON_CONFIG_H
#define DAEMON_CONFIG_H

#include "service/td_gpus.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>

#define DAEMON_CONFIG_DEFAULT "/etc/traind/traind.json"
#define DAEMON_MAX_ROOTS      16

/* Where a setting's value came from. */
typedef enum { DAEMON_FROM_DEFAULT, DAEMON_FROM_FILE, DAEMON_FROM_ARGS } daemon_source;

/* The options' indexes into daemon_options.from[] (and the table in daemon_config.c). */
typedef enum {
    OPT_LISTEN,
    OPT_STATE_DIR,
    OPT_SLOTS,
    OPT_GPUS,
    OPT_DATA_ROOTS,
    OPT_GRACE,
    OPT_MAX_BODY,
    OPT_WORKER,
    OPT_WEB_ROOT,
    OPT_LOG_FORMAT,
    OPT_LOG_LEVEL,
    OPT_SECRET,
    OPT_JOIN,
    OPT_NODE_NAME,
    OPT_ADVERTISE,
    OPT_HEARTBEAT,
    OPT_NODE_TIMEOUT,
    OPT_TLS_CERT,
    OPT_TLS_KEY,
    OPT_TLS_CA,
    OPT_KEEP_JOBS,
    OPT_ORPHAN_TIMEOUT,
    OPT_SHEPHERD,
    OPT_METRICS_LISTEN,
    OPT_RUN_AS,
    OPT_COMMAND_JOBS,
    OPT_RATE_LIMIT,
    OPT_MAX_STREAMS,
    OPT_MAX_QUEUED,
    OPT_AUDIT_LOG,
    OPT_KEEP_FINISHED_FOR,
    OPT_KEEP_FINISHED_JOBS,
    OPT_MAX_CONNECTIONS,
    OPT_JOB_UIDS,
    OPT_JOB_GROUPS,
    OPT_JOB_MEMORY,
    OPT_MAX_JOB_MEMORY,
    OPT_JOB_PIDS,
    OPT_MAX_JOB_PIDS,
    OPT_JOB_DISK,
    OPT_MAX_JOB_DISK,
    OPT_MAX_CHECKPOINT_FILES,
    OPT_MAX_LOG_BYTES,
    OPT_MAX_EVENTS,
    OPT_MAX_CONNECTIONS_PER_IP,
    OPT_CONNECTION_TIMEOUT,
    OPT_MAX_SESSIONS,
    OPT_MAX_JOB_BYTES,
    OPT_INSECURE_CLUSTER,
    OPT_COUNT
} daemon_option;

typedef struct daemon_options {
    char listen[256];
    char state_dir[PATH_MAX];
    int slots;                     /* 0: the core count */
    td_node_gpu gpus[TD_GPUS_MAX]; /* declared; n_gpus 0: discovered */
    int n_gpus;
    char roots[DAEMON_MAX_ROOTS][PATH_MAX];
    int n_roots;
    double grace_s;
    long max_body;
    char worker[PATH_MAX];
    char web_root[PATH_MAX];
    char log_format[8]; /* "text" or "json" */
    char log_level[8];  /* "error", "warning", "info" or "debug" */
    /* the cluster */
    char secret_file[PATH_MAX];    /* "": a master that accepts no agents */
    char join[256];                /* "": this traind is a master */
    char node_name[64];            /* "": the hostname */
    char advertise[64];            /* "": the listen address (master) or the route (agent) */
    double heartbeat_s, timeout_s; /* a master's: what agents keep, when they are lost */
    /* TLS: this node's certificate chain and key (PEM files; both or neither), and the CA an
     * agent checks its master's certificate against ("": plain HTTP to the master) */
    char tls_cert[PATH_MAX], tls_key[PATH_MAX], tls_ca[PATH_MAX];
    /* restarts: whether a stopping daemon leaves its jobs running for the next one, and how
     * long a job's shepherd waits for a daemon before it stops the job */
    bool keep_jobs_on_stop;
    double orphan_timeout_s;
    char shepherd[PATH_MAX];  /* traind-shepherd */
    char metrics_listen[256]; /* "": GET /metrics on the API port only (with the token) */
    /* security: who a root daemon runs jobs as ("dynamic": a uid of job_uids each; a user's
     * name; "root"), the supplementary groups jobs get (names joined by ','), the programs
     * command jobs may run ("any", "none", or absolute paths joined by ':'), each token's limits
     * (0: none), and the audit log's file */
    char run_as[64];
    char job_uids[64];
    char job_groups[1024];
    char command_jobs[8192];
    double rate_limit_per_s;
    long max_streams_per_token, max_queued_per_token;
    char audit_log[PATH_MAX];
    /* retention: finished jobs are removed this long after they finished, and beyond the
     * newest keep_finished_jobs of them (0: no limit of that kind) */
    double keep_finished_for_s;
    long keep_finished_jobs;
    long max_connections; /* the API's connections at once (each a thread) */
    long max_connections_per_ip;
    double connection_timeout_s; /* a connection silent this long is closed */
    long max_sessions_per_token, max_job_bytes_per_token;
    /* what a job may use unless it says, and the most it may ask for (0: the node's memory
     * less a reserve for the system; pids and disk: a number each) */
    double job_memory_gb, max_job_memory_gb;
    long job_pids, max_job_pids;
    double job_disk_gb, max_job_disk_gb;
    long max_checkpoint_files; /* files in one checkpoint */
    long max_log_bytes;        /* one rank's log before it is rotated */
    double max_events_per_s;   /* a job's events stored per second (bursts of 10 s of them) */
    bool insecure_cluster;     /* cluster traffic in clear beyond loopback, said at start */

    /* not settings */
    daemon_source from[OPT_COUNT];
    char config_path[PATH_MAX]; /* the file read; "" when none */
    bool print_config;          /* --print-config: print the settings and exit */
} daemon_options;

/* The command line, then the config file (--config FILE, else DAEMON_CONFIG_DEFAULT when it
 * exists), then the defaults, into o. A bad option or file is a message on stderr naming the
 * option, or the file and key, and exit status 2; --help and --version print and exit 0. */
void daemon_config_load(daemon_options *o, int argc, char **argv);

/* traind --help's text (daemon_usage.c). */
void daemon_config_usage(FILE *out);

/* Every setting, its value and where it came from, one per line. */
void daemon_config_print(const daemon_options *o, FILE *out);

/* Reads the configuration again (the same command line, the file as it is now) into *next,
 * without exiting on an error: -1 with the message in why. */
int daemon_config_reload(daemon_options *next, const daemon_options *now, int argc, char **argv,
                         char *why, size_t len);

/* Whether option opt differs between a and b; its key ("data_roots") and whether a running
 * daemon can take the new value. */
bool daemon_config_changed(const daemon_options *a, const daemon_options *b, daemon_option opt);
const char *daemon_config_key(daemon_option opt);
bool daemon_config_live(daemon_option opt);
/* opt's value as JSON text ("\"127.0.0.1:8470\"", 10, ["/data"]), allocated (free it). */
char *daemon_config_value(const daemon_options *o, daemon_option opt);
/* Where opt's value came from, for messages: "from the command line", the file, "the default". */
const char *daemon_config_source(const daemon_options *o, daemon_option opt);

#endif
