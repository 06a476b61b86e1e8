/* A job submission, checked before anything is stored: the body as JSON, the members the
 * daemon adds to a worker spec (resources, restart) or a command job's (command, env), the spec
 * itself through the worker's own validator, and every file path against the data roots. An
 * error names the JSON path at fault, so a client can point at the field. */
#ifndef TD_SUBMIT_H
#define TD_SUBMIT_H

#include "base/td_error.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>

/* An error bound for an HTTP reply. */
typedef struct td_reply_error {
    int status;       /* 400, 404, ... */
    const char *code; /* "invalid_spec", ... */
    char message[1536];
    char field[256];      /* JSON path; "" when none */
    double retry_after_s; /* > 0: a 429's or 503's Retry-After (td_reply_fail sets 0) */
} td_reply_error;

/* A JSON kit error (td_json.h) as a 400 "invalid_spec" whose field is the JSON path its message
 * begins with. */
int td_submit_spec_error(td_reply_error *e, const td_err *err);
int td_reply_fail(td_reply_error *e, int status, const char *code, const char *field,
                  const char *fmt, ...) __attribute__((format(printf, 5, 6)));

/* What a job may use unless it says (resources.*), and the most it may ask for; 0: no limit. */
typedef struct td_job_limits {
    double memory_gb, max_memory_gb; /* GiB */
    long pids, max_pids;
    double disk_gb, max_disk_gb; /* GiB */
} td_job_limits;

typedef struct td_submit_rules {
    const char *const *data_roots; /* resolved directories */
    int n_roots;
    int slots; /* the node's; nproc above it can never run */
    const char *state_dir;
    /* true on a cluster's master: whether the job fits is the cluster's to say (td_jobs checks
     * it against the registered nodes), not this node's slots */
    bool cluster;
    /* command jobs: NULL or "any": allowed; "none": refused (403); else the executables they may
     * run, absolute paths joined by ':' (compared after symlinks) */
    const char *command_jobs;
    /* resources.memory_gb, pids and disk_gb may not ask for more than these (NULL: any) */
    const td_job_limits *limits;
} td_submit_rules;

typedef struct td_submission {
    char name[128];
    bool command;
    json_t *spec;            /* train jobs: the worker spec (without resources/restart) */
    char **argv;             /* command jobs: NULL-terminated */
    char **env;              /* command jobs: "NAME=value", NULL-terminated (may be empty) */
    int nproc, max_restarts; /* nproc: per node (resources.nproc or nproc_per_node) */
    int nnodes;              /* resources.nnodes, 1 unless given (or the length of nodes) */
    char **nodes;            /* resources.nodes: the only nodes it may run on; NULL: any */
    int priority;            /* higher first; then submission order */
    double time_limit_s;     /* resources.time_limit_s; 0: none */
    /* command jobs: "cwd", where every node's processes start: an absolute path inside a data
     * root (the same on every node: shared storage), or a relative one below each node's work
     * directory; "": the work directory */
    char cwd[1024];
    char local_rank_arg[16]; /* command jobs: "--local_rank" or "--local-rank" appended =N to
                                each process's arguments; "": none */
    int gpus_per_proc;       /* resources.gpus_per_proc: slots (GPUs) each process holds */
    bool launch_self;        /* command jobs, "launch": "self": one process per node, which
                                starts nproc itself (mp.spawn) with all the node's share */
    bool see_all_gpus;       /* resources.visible_gpus "job": every process of a node sees all
                                the job's GPUs there, in local rank order ("own": its own) */
    /* resources.memory_gb, pids, cpu_weight, disk_gb; 0: not given (the daemon's default) */
    double memory_gb, disk_gb;
    long pids;
    int cpu_weight;
    /* command jobs: metrics, checked and with its defaults ({"patterns": [...] when given,
     * "tensorboard_dir": "runs" unless given}); NULL for a train job */
    json_t *metrics;
} td_submission;

int td_submission_parse(td_submission *s, const char *body, size_t len,
                        const td_submit_rules *rules, td_reply_error *e);
void td_submission_free(td_submission *s);

/* The placement members of a stored job body (already checked when it was submitted): nnodes,
 * the pinned nodes (NULL: any; free with td_strv_free), GPUs per process, the launch and which
 * GPUs a process sees. */
void td_submission_placement(const char *body, int *nnodes, char ***nodes, int *gpus_per_proc,
                             bool *launch_self, bool *see_all_gpus);

/* The resource limits of a stored job body (checked when it was submitted; 0: not given). */
void td_submission_limits(const char *body, double *memory_gb, long *pids, int *cpu_weight,
                          double *disk_gb);

/* Whether path resolves (after symlinks; a path that does not exist yet by its nearest existing
 * parent) inside one of the roots. */
bool td_path_inside_roots(const char *path, const char *const *roots, int n_roots);

#endif
