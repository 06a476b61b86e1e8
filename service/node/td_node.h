/* The node's parts: what this node runs for its master, on an agent and on the master's own node
 * alike (a td_node_part each: one node's group of an attempt across nodes). The master's orders
 * say which parts should run (the jobs module builds them on the master, td_job_sync.c; an
 * agent's heartbeat carries them); td_node_parts_apply has what is missing started through the
 * runner every attempt on a node starts through (service/run/td_runner.h), stops what is no
 * longer wanted, and each part is followed to its end and reported: running or ended (with its
 * first failure in words), rank 0's lines not yet acknowledged, and, from an agent, the tail of
 * every rank's log. The parts a previous daemon left are found again at start.
 *
 * Orders are the whole wanted state, not commands: a lost reply, a master restart or a node back
 * from a partition converges on the next exchange, and a part the master no longer knows is
 * stopped at once. A part's lines carry sequence numbers within the attempt and logs their byte
 * offsets, so resending after a drop can neither lose nor repeat anything.
 *
 * This module knows parts by job id, uid and directory, never the job table: the jobs module sits
 * above it and owns the lock that guards a td_node_parts and the runner they share (td_jobs'
 * mutex); every function here runs with that lock held. */
#ifndef TD_NODE_H
#define TD_NODE_H

#include "base/td_buf.h"
#include "base/td_error.h"
#include "base/td_log.h"
#include "service/run/td_runner.h"

#include <jansson.h>
#include <limits.h>
#include <poll.h>
#include <pthread.h>
#include <stdbool.h>

/* One group this node runs for its master: the node-side twin of the master's placement. */
typedef struct td_node_part {
    long job;
    long uid;                   /* the job's, as the master's order says */
    td_cgroup_limits cg_limits; /* and its limits */
    long long disk_bytes;
    char cgroup[PATH_MAX];                 /* its cgroup here (td_cgroup.h); "": none */
    int attempt, node_rank, nnodes, nproc; /* nproc: ranks on this node */
    int procs, slots;  /* processes it starts (1 for launch "self"), slots (GPUs) it holds */
    bool see_all_gpus; /* every process sees all of them */
    bool holds_slots;  /* counted in the runner's used_slots (an agent's; on a master, placement
                          counts them, but not for a part a restarted master found running) */
    char dir[PATH_MAX];
    char kind[16];
    td_shepherd sh; /* its shepherd (sh.base: where its files are) */
    bool running, ended, stop;
    int exit_code;
    char reason[512];
    char cut_off[256]; /* stopped by this node itself (cut off from the master), why */
    int *devices;
    int out_fd;         /* rank 0's output file (node rank 0 only); -1: not open */
    long long out_read; /* its bytes read so far */
    td_buf line;
    /* rank 0's lines not yet acknowledged by the master, in order; a line's seq is its place
     * among the lines of the output file (from 0), so a line dropped here leaves a gap that the
     * master counts as dropped, and a daemon that reads the file again after a restart numbers
     * every line as before */
    struct td_node_part_line {
        long seq;
        char *text;
        char *checkpoint; /* a checkpoint line's path until its files are uploaded; else NULL */
        json_t *files;    /* the uploaded files' manifest */
    } * lines;
    int n_lines, cap_lines;
    long next_seq; /* the next line's */
    /* what this node holds of them is bounded: lines over max_events_per_s (as the master
     * cuts them) or beyond a backlog in bytes are dropped here, and the master counts the gap */
    td_rate_bucket metric_rate, checkpoint_rate;
    long long backlog_bytes;
    long long *log_start, *log_sent; /* [procs] per process it started */
} td_node_part;

typedef struct td_node_parts {
    td_runner *runner; /* the node's slots, GPUs and identities, shared with its own attempts */
    td_log *log;
    char name[64]; /* this node's, for its parts' reasons */
    /* this node is the master's: its placement holds the parts' slots, and a checkpoint rank 0
     * writes is already where the master registers it (an agent uploads it first) */
    bool on_master;
    pthread_cond_t *ended; /* broadcast when a part ends: a stopping daemon waits for them */
    td_node_part **parts;
    int n_parts;
} td_node_parts;

/* ---- the orders (td_node_parts.c) ---- */
/* Applies the master's orders (remote: they came from another node): starts what is missing,
 * stops what is no longer wanted or told to stop, forgets what the master acknowledged. */
void td_node_parts_apply(td_node_parts *np, json_t *orders, bool remote);
/* Stops every running part of this node's own accord (an agent cut off from its master: why). */
void td_node_parts_stop_all(td_node_parts *np, const char *why);
/* Asks every running part's shepherd to stop (the daemon stops and keeps no job). */
void td_node_parts_stop_for_exit(td_node_parts *np, const char *why);
td_node_part *td_node_part_find(td_node_parts *np, long job_id, int attempt); /* NULL: none */
/* Frees the parts; their shepherds go on (they stop their groups after orphan_timeout_s unless
 * a daemon comes back for them). */
void td_node_parts_free(td_node_parts *np);
/* The files of job id as a master's order gives it (its uid): the job's directory made ready
 * for it here, so that a checkpoint can be fetched into it before its part starts. -1 with err
 * for a uid this node does not give jobs. */
int td_node_order_files(td_node_parts *np, long id, long uid, td_job_files *out, td_err *err);
/* A member of an order (or of an attempt file's notes): "" or 0 when it is not there. */
const char *td_node_order_string(json_t *o, const char *key);
int td_node_order_int(json_t *o, const char *key);

/* ---- the supervisor's side (td_node_parts.c, td_node_part_report.c) ---- */
/* The connected parts' shepherds into fds (at most max in all), each with its part in owner. */
void td_node_parts_poll(td_node_parts *np, struct pollfd *fds, int *n, int max,
                        td_node_part **owner);
void td_node_parts_read(td_node_parts *np, td_node_part *g); /* its shepherd said something */
/* Ends the parts whose shepherds went, and sends the stops not sent yet (stopping_jobs: the
 * daemon stops and stops its jobs). */
void td_node_parts_tick(td_node_parts *np, bool stopping_jobs);
bool td_node_parts_connected(const td_node_parts *np); /* a part's shepherd is still connected */

/* ---- the report (td_node_part_report.c) ---- */
/* The "parts" member of a message to the master (remote: from an agent, which sends logs and
 * holds a checkpoint line back until its files are uploaded). */
json_t *td_node_parts_report(td_node_parts *np, bool remote);
/* The first checkpoint rank 0 wrote here that still has to be uploaded, and its job's files. */
bool td_node_parts_next_upload(td_node_parts *np, long *job_id, int *attempt, long *seq, char *path,
                               size_t len, td_job_files *files);
/* Its upload is done: the line goes to the master with the files' manifest. */
void td_node_parts_uploaded(td_node_parts *np, long job_id, int attempt, long seq, json_t *files);

/* ---- at start (td_node_part_recover.c) ---- */
/* The parts a previous daemon left (attempt files with a "part" note under jobs/): running ones
 * re-attached, ended ones reported as they ended. */
void td_node_parts_recover(td_node_parts *np);

#endif
