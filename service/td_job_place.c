/* The cluster's master: placing jobs on nodes and following their parts.
 *
 * Placement is gang placement: a job starts only when nnodes nodes each have nproc_per_node free
 * slots, all at once, and nothing is held before that. The queue keeps one node's policy
 * (priority, then submission order); a job behind a blocked head starts only where the head
 * would still fit once every running job has ended, so backfilling never delays the head. A
 * one-node job that fits on the master's own node runs there exactly as without a cluster.
 *
 * Each node learns what to run from the reply to its heartbeat (td_cluster.c), and reports on
 * its parts in the next one (td_job_part.c): the master applies rank 0's lines in sequence,
 * appends the log bytes at their offsets, and ends the attempt once every part has ended (or its
 * node is lost). The first failure stops every other part and names its node and rank. */
#include "service/td_jobs_private.h"

#include "service/td_buf.h"
#include "service/td_cluster.h"
#include "service/td_strv.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* torchrun's default MASTER_PORT and the ports after it: one per job whose node rank 0 is on
 * the same node, reserved by the master so two jobs never collide. */
enum { PORT_FIRST = 29500, PORT_COUNT = 1000 };

bool td_jobs_clustered(td_jobs *j) {
    if (!j->cluster) return false;
    for (int i = 0; i < j->n_live; i++)
        if (j->live[i]->parts || (!td_jobs_final_state(j->live[i]->state) &&
                                  (j->live[i]->nnodes > 1 || j->live[i]->pin)))
            return true;
    td_cluster_node *nodes;
    int n = td_cluster_snapshot(j->cluster, &nodes);
    bool agents = false;
    for (int i = 1; i < n; i++) agents |= !nodes[i].lost;
    free(nodes);
    return agents;
}

static bool pinned_to(const job *jb, const char *node) {
    if (!jb->pin) return true;
    for (int i = 0; jb->pin[i]; i++)
        if (strcmp(jb->pin[i], node) == 0) return true;
    return false;
}

/* Slots each node has free now: its total less what placement holds there (and, for an agent,
 * less what it says it still uses: a part of an attempt the master ended may still be stopping). */
static void free_slots(td_jobs *j, const td_cluster_node *nodes, int n, int *free_now) {
    for (int i = 0; i < n; i++) {
        if (nodes[i].master) {
            free_now[i] = j->cfg.slots - j->used_slots;
            continue;
        }
        int held = 0;
        for (int k = 0; k < j->n_jobs; k++) {
            const job *jb = j->jobs[k];
            for (int p = 0; p < jb->n_parts; p++)
                if (strcmp(jb->parts[p].node, nodes[i].name) == 0) held += td_jobs_slots(jb);
        }
        free_now[i] =
            nodes[i].slots - (held > nodes[i].reported_used ? held : nodes[i].reported_used);
    }
}

/* Picks nnodes nodes with room for the job (indexes into nodes, node rank order) from cap;
 * false when they are not there. The fullest nodes that fit go first, to keep whole nodes free
 * for wide jobs; the master's own node, when chosen, is node rank 0 (its address is known to
 * every agent). */
static bool pick_nodes(const job *jb, const td_cluster_node *nodes, int n, const int *cap,
                       int *picked) {
    int m = 0;
    int order[n];
    for (int i = 0; i < n; i++) {
        if (nodes[i].lost || nodes[i].stale || nodes[i].drained || cap[i] < td_jobs_slots(jb) ||
            !pinned_to(jb, nodes[i].name))
            continue;
        int k = m++;
        for (; k > 0 && (cap[order[k - 1]] > cap[i] ||
                         (cap[order[k - 1]] == cap[i] && !nodes[i].master &&
                          strcmp(nodes[order[k - 1]].name, nodes[i].name) > 0));
             k--)
            order[k] = order[k - 1];
        order[k] = i;
    }
    if (m < jb->nnodes) return false;
    for (int i = 0; i < jb->nnodes; i++) picked[i] = order[i];
    for (int i = 1; i < jb->nnodes; i++)
        if (nodes[picked[i]].master) {
            int t = picked[0];
            picked[0] = picked[i], picked[i] = t;
        }
    return true;
}

static int reserve_port(td_jobs *j, const char *node) {
    for (int port = PORT_FIRST; port < PORT_FIRST + PORT_COUNT; port++) {
        bool taken = false;
        for (int i = 0; i < j->n_jobs && !taken; i++) {
            const job *jb = j->jobs[i];
            taken =
                jb->n_parts > 0 && jb->master_port == port && strcmp(jb->parts[0].node, node) == 0;
        }
        if (!taken) return port;
    }
    return 0;
}

/* Starts the job's next attempt on the nodes picked. */
static void start_parts(td_jobs *j, job *jb, const td_cluster_node *nodes, const int *picked) {
    int port = reserve_port(j, nodes[picked[0]].name);
    if (port == 0) return; /* every port of the range is reserved on that node: wait */
    jb->parts = td_calloc((size_t)jb->nnodes, sizeof *jb->parts);
    jb->n_parts = jb->nnodes;
    for (int i = 0; i < jb->nnodes; i++) {
        part *p = &jb->parts[i];
        const td_cluster_node *nd = &nodes[picked[i]];
        snprintf(p->node, sizeof p->node, "%s", nd->name);
        snprintf(p->address, sizeof p->address, "%s", nd->address);
        p->node_rank = i;
        p->local = nd->master;
        if (p->local) j->used_slots += td_jobs_slots(jb);
    }
    jb->master_port = port;
    json_decref(jb->resume_order);
    jb->resume_order = td_jobs_resume_order(jb); /* fixed for the attempt */
    char ckpt_dir[PATH_MAX];
    td_jobs_resume_dir(jb, ckpt_dir, sizeof ckpt_dir);
    free(jb->ckpt_dir);
    jb->ckpt_dir = td_str_dup(ckpt_dir);
    jb->active = true;
    jb->parts_stopping = false;
    jb->parts_code = 0;
    jb->parts_reason[0] = 0;
    jb->lines_in = 0;
    jb->last_step = jb->ckpt_step > 0 ? jb->ckpt_step : jb->last_step;
    int world = jb->nnodes * jb->row.nproc;
    free(jb->log_start);
    jb->log_start = td_calloc((size_t)world, sizeof *jb->log_start);
    if (mkdir(jb->dir, 0750) != 0 && errno != EEXIST)
        td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id), "cannot create %s: %s", jb->dir,
                  strerror(errno));
    for (int r = 0; r < world; r++) {
        if (jb->launch_self && r % jb->row.nproc != 0) continue; /* one process (log) a node */
        char path[PATH_MAX + 32];
        struct stat st;
        snprintf(path, sizeof path, "%s/rank-%d.log", jb->dir, r);
        int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
        if (fd >= 0 && fstat(fd, &st) == 0) jb->log_start[r] = (long long)st.st_size;
        if (fd >= 0) close(fd);
    }
    td_db_attempt *a = td_jobs_new_attempt(jb);
    a->started_at = td_clock_wall();
    if (jb->row.started_at <= 0) jb->row.started_at = a->started_at;
    td_jobs_set_state(jb, RUNNING);
    td_jobs_save_attempt(j, jb, a);
    td_jobs_emit_state(j, jb);
    /* where it runs, in the job's stream: followers see it, and a restarted master reads it back */
    json_t *where_json = td_jobs_placement_json(jb);
    json_t *nodes_json = json_object_get(where_json, "nodes");
    size_t i;
    json_t *nd;
    json_array_foreach(nodes_json, i, nd) {
        json_object_del(nd, "state");
        json_object_del(nd, "devices");
        json_object_del(nd, "processes");
    }
    json_object_set_new(where_json, "attempt", json_integer(a->attempt));
    td_jobs_emit(j, jb, TD_JOBS_EVENT_PLACEMENT, where_json, NULL, -1, false, NULL, 0);
    json_decref(where_json);
    char where[512] = "";
    for (int i = 0; i < jb->n_parts; i++)
        snprintf(where + strlen(where), sizeof where - strlen(where), "%s%s", i ? ", " : "",
                 jb->parts[i].node);
    td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
              "job %ld attempt %d placed on %d node%s (%s) × %d, rendezvous at %s:%d", jb->row.id,
              a->attempt, jb->n_parts, jb->n_parts == 1 ? "" : "s", where, jb->row.nproc,
              jb->parts[0].address, port);
}

void td_jobs_parts_release(td_jobs *j, job *jb) {
    json_decref(jb->last_placement);
    jb->last_placement = td_jobs_placement_json(jb); /* shown after the attempt too */
    for (int i = 0; i < jb->n_parts; i++)
        if (jb->parts[i].local) j->used_slots -= td_jobs_slots(jb);
    for (int i = 0; i < jb->n_parts; i++) free(jb->parts[i].proc_devices);
    free(jb->parts);
    jb->parts = NULL;
    jb->n_parts = 0;
    json_decref(jb->resume_order);
    jb->resume_order = NULL;
    jb->active = false;
    memset(&jb->end, 0, sizeof jb->end);
}

/* Where the job would go on cap: the master's own node alone (a one-node job that fits there
 * runs as without a cluster; *local), or the nodes picked. */
static bool choose(const job *jb, const td_cluster_node *nodes, int n, const int *cap, int *picked,
                   bool *local) {
    *local = jb->nnodes == 1 && !jb->pin && !nodes[0].drained && !nodes[0].lost &&
             cap[0] >= td_jobs_slots(jb);
    if (*local) {
        picked[0] = 0;
        return true;
    }
    return pick_nodes(jb, nodes, n, cap, picked);
}

/* Why jb fits on too few nodes now: how many it needs, with how many free slots, how many have
 * them. */
static void say_nodes_wait(job *jb, const td_cluster_node *nodes, int n, const int *cap) {
    int need = td_jobs_slots(jb), have = 0, alive = 0, drained = 0;
    for (int i = 0; i < n; i++) {
        if (nodes[i].lost || nodes[i].stale) continue;
        alive++;
        drained += nodes[i].drained;
        have += !nodes[i].drained && cap[i] >= need;
    }
    int want = jb->nnodes > 0 ? jb->nnodes : 1;
    td_jobs_waits(jb,
                  "waits for %d node%s with %d free slot%s each%s: %d of the %d node%s alive "
                  "ha%s them now%s",
                  want, want == 1 ? "" : "s", need, need == 1 ? "" : "s",
                  jb->pin ? " among resources.nodes" : "", have, alive, alive == 1 ? "" : "s",
                  have == 1 ? "s" : "ve", drained ? " (drained nodes take none)" : "");
}

/* What try_start did: nothing (it waits), started the job, or ended it (its checkpoint cannot
 * be had: failed, out of the queue, holding nothing). */
enum { TRY_WAITS, TRY_STARTED, TRY_ENDED };

/* Places (or starts locally) one job on cap. */
static int try_start(td_jobs *j, job *jb, td_cluster_node *nodes, int n, int *cap) {
    int picked[jb->nnodes];
    bool local;
    if (!choose(jb, nodes, n, cap, picked, &local)) {
        say_nodes_wait(jb, nodes, n, cap);
        return TRY_WAITS;
    }
    if (local) {
        if (!td_jobs_reserve_slots(j, jb)) return TRY_WAITS;
        cap[0] -= td_jobs_slots(jb);
        td_jobs_start_attempt(j, jb);
        return TRY_STARTED;
    }
    bool on_master = false;
    for (int i = 0; i < jb->nnodes; i++) on_master |= nodes[picked[i]].master;
    int resume = td_jobs_resume_ready(j, jb, on_master);
    if (resume == TD_RESUME_WAIT)
        td_jobs_waits(jb, "waits for its checkpoint to reach the nodes it was placed on");
    if (resume != TD_RESUME_READY) return resume == TD_RESUME_FAILED ? TRY_ENDED : TRY_WAITS;
    start_parts(j, jb, nodes, picked);
    if (!jb->parts) return TRY_WAITS;
    for (int i = 0; i < jb->nnodes; i++) cap[picked[i]] -= td_jobs_slots(jb);
    return TRY_STARTED;
}

void td_jobs_schedule_cluster(td_jobs *j) {
    td_cluster_node *nodes;
    int n = td_cluster_snapshot(j->cluster, &nodes);
    int cap[n];
    free_slots(j, nodes, n, cap);
    int n_queue = 0;
    job *queue[j->n_live + 1];
    for (int i = 0; i < j->n_live; i++) { /* restarts first: they were running */
        job *jb = j->live[i];
        if (jb->state == RESTARTING && !jb->active) queue[n_queue++] = jb;
    }
    int restarts = n_queue;
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        if (jb->state != QUEUED) continue;
        int k = n_queue++;
        for (; k > restarts && td_jobs_runs_before(jb, queue[k - 1]); k--) queue[k] = queue[k - 1];
        queue[k] = jb;
    }
    const job *head = NULL;
    int after[n]; /* the head's room once every running job has ended, less backfilled jobs */
    for (int i = 0; i < n_queue; i++) {
        job *jb = queue[i];
        if (!head) {
            if (try_start(j, jb, nodes, n, cap) != TRY_WAITS) continue;
            head = jb;
            for (int k = 0; k < n; k++) after[k] = nodes[k].slots;
            continue;
        }
        /* backfill only where the head still fits when everything running now has ended */
        td_jobs_waits(jb,
                      "waits behind job %ld, first in the queue (%s): it starts first only "
                      "where it cannot delay that job",
                      head->row.id,
                      head->row.priority != jb->row.priority ? "a higher priority"
                                                             : "submitted earlier");
        int trial[n], picked_head[head->nnodes > 0 ? head->nnodes : 1];
        int picked[jb->nnodes];
        bool local;
        if (!choose(jb, nodes, n, cap, picked, &local)) continue;
        memcpy(trial, after, sizeof trial);
        for (int k = 0; k < jb->nnodes; k++) trial[picked[k]] -= td_jobs_slots(jb);
        if (!pick_nodes(head, nodes, n, trial, picked_head)) continue;
        if (try_start(j, jb, nodes, n, cap) == TRY_STARTED) {
            memcpy(after, trial, sizeof after);
            td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                      "job %ld starts ahead of job %ld (backfill: it uses slots that job "
                      "would leave free)",
                      jb->row.id, head->row.id);
        }
    }
    free(nodes);
}

/* ---- orders ---------------------------------------------------------------------------------- */

/* What the job runs, as a node needs it: a train job's spec with the daemon's own checkpoint
 * directory made relative to the job's directory (every node has one of its own). */
static json_t *order_spec(job *jb) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/spec.json", jb->dir);
    json_t *spec = json_load_file(path, 0, NULL);
    json_t *ck = json_object_get(spec, "checkpoint");
    char ours[PATH_MAX + 16];
    snprintf(ours, sizeof ours, "%s/checkpoints", jb->dir);
    const char *dir = json_string_value(json_object_get(ck, "dir"));
    if (dir && strcmp(dir, ours) == 0) json_object_set_new(ck, "dir", json_string("checkpoints"));
    return spec ? spec : json_null();
}

static json_t *order(job *jb, const part *p) {
    json_t *argv = json_array(), *env = json_array();
    bool command = strcmp(jb->row.kind, "command") == 0;
    for (int i = 0; command && jb->argv[i]; i++)
        json_array_append_new(argv, json_string(jb->argv[i]));
    for (int i = 0; jb->env && jb->env[i]; i++) json_array_append_new(env, json_string(jb->env[i]));
    /* only a part about to start needs what it resumes from and what it runs */
    bool starting = p->state == PART_STARTING;
    json_t *resume = starting && jb->resume_order ? json_incref(jb->resume_order) : json_null();
    json_t *logs = json_array();
    for (int r = 0; r < td_jobs_procs(jb); r++) { /* each process's log */
        int rank = p->node_rank * jb->row.nproc + r;
        char path[PATH_MAX + 32];
        struct stat st;
        snprintf(path, sizeof path, "%s/rank-%d.log", jb->dir, rank);
        long long have = stat(path, &st) == 0 ? (long long)st.st_size - jb->log_start[rank] : 0;
        json_array_append_new(logs, json_integer(have > 0 ? have : 0));
    }
    bool stop = jb->parts_stopping || jb->cancel_requested || jb->timed_out;
    json_t *o = json_pack(
        "{s:I, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:s, s:i, s:i, s:i, s:s, s:o, "
        "s:s, s:o, s:o, s:o, s:o, s:b, s:I, s:o}",
        "job", (json_int_t)jb->row.id, "attempt", jb->n_attempts - 1, "node_rank", p->node_rank,
        "nnodes", jb->n_parts, "nproc", jb->row.nproc, "gpus_per_proc", jb->gpus_per_proc,
        "launch_self", jb->launch_self, "see_all_gpus", jb->see_all_gpus, "master_addr",
        jb->parts[0].address, "master_port", jb->master_port, "restart_count", jb->n_attempts - 1,
        "max_restarts", jb->row.max_restarts, "kind", jb->row.kind, "argv", argv, "local_rank_arg",
        jb->local_rank_arg, "env", env, "spec", command || !starting ? json_null() : order_spec(jb),
        "resume", resume, "checkpoint_dir",
        starting ? json_string(jb->ckpt_dir ? jb->ckpt_dir : "") : json_null(), "stop", stop,
        "acked_lines", (json_int_t)jb->lines_in, "acked_logs", logs);
    TD_ASSERT(o, "json_pack of a part's order failed");
    /* who its processes are on every node, and what they may use */
    json_object_set_new(o, "uid", json_integer((json_int_t)jb->row.uid));
    if (jb->metrics && p->node_rank == 0) /* rank 0's lines are the metrics */
        json_object_set(o, "metrics", jb->metrics);
    if (jb->cwd) json_object_set_new(o, "cwd", json_string(jb->cwd));
    json_object_set_new(
        o, "limits",
        json_pack("{s:I, s:I, s:i, s:I}", "memory_bytes", (json_int_t)jb->cg_limits.memory_bytes,
                  "pids", (json_int_t)jb->cg_limits.pids, "cpu_weight", jb->cg_limits.cpu_weight,
                  "disk_bytes", (json_int_t)jb->disk_bytes));
    return o;
}

/* ---- reports --------------------------------------------------------------------------------- */

static part *part_on(job *jb, const char *node) {
    for (int i = 0; i < jb->n_parts; i++)
        if (strcmp(jb->parts[i].node, node) == 0) return &jb->parts[i];
    return NULL;
}

int td_jobs_part_rank_on(job *jb, const char *node) {
    const part *p = jb->parts ? part_on(jb, node) : NULL;
    return p && p->state != PART_ENDED ? p->node_rank : -1;
}

/* A node's log bytes for one rank: appended where the master's copy ends, or dropped (already
 * here, or a gap to be resent). */
static bool apply_log(job *jb, const part *p, json_t *c) {
    int rank = (int)json_integer_value(json_object_get(c, "rank"));
    long long offset = (long long)json_integer_value(json_object_get(c, "offset"));
    const char *b64 = json_string_value(json_object_get(c, "data"));
    /* a node writes the logs of its own part's ranks only */
    if (!b64 || rank < p->node_rank * jb->row.nproc || rank >= (p->node_rank + 1) * jb->row.nproc)
        return false;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rank-%d.log", jb->dir, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return false;
    }
    long long have = (long long)st.st_size - jb->log_start[rank];
    size_t n = strlen(b64);
    unsigned char *raw = td_malloc(n / 4 * 3 + 3);
    int got = EVP_DecodeBlock(raw, (const unsigned char *)b64, (int)n);
    /* EVP_DecodeBlock counts the padding's zero bytes too */
    if (got > 0 && n >= 1 && b64[n - 1] == '=') got--;
    if (got > 0 && n >= 2 && b64[n - 2] == '=') got--;
    /* a chunk resent after a lost reply may overlap what is here: only its new bytes go on */
    bool applied = got >= 0 && offset <= have && offset + got >= have;
    if (applied && offset + got > have)
        applied = write(fd, raw + (have - offset), (size_t)(offset + got - have)) ==
                  (ssize_t)(offset + got - have);
    free(raw);
    close(fd);
    return applied;
}

/* The attempt is over when every part has ended; the first failure (by when it happened, as the
 * nodes' reports arrive in any order) is the attempt's. */
static void check_over(td_jobs *j, job *jb) {
    for (int i = 0; i < jb->n_parts; i++)
        if (jb->parts[i].state != PART_ENDED) return;
    td_jobs_attempt_over(j, jb);
}

/* Part p's first failure, which happened at `at` (wall clock as its node says; 0: now). The
 * attempt's failure is the earliest of its parts' by that time, in whatever order the nodes'
 * reports come (a heartbeat apart each; and a part whose ranks take the grace period to stop
 * ends long after the failure that stopped them); the first one heard of stops every part. */
static void part_failed(td_jobs *j, job *jb, part *p, int code, const char *reason, double at) {
    if (p->failed_at > 0) return; /* its first failure is known */
    p->failed_at = at > 0 ? at : td_clock_wall();
    bool first = true;
    for (int i = 0; i < jb->n_parts; i++)
        if (&jb->parts[i] != p && jb->parts[i].failed_at > 0 &&
            jb->parts[i].failed_at <= p->failed_at)
            first = false;
    if (first && !jb->cancel_requested && !jb->timed_out) {
        bool earlier = jb->parts_code != 0;
        jb->parts_code = code ? code : 1;
        snprintf(jb->parts_reason, sizeof jb->parts_reason, "%s", reason);
        td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                  earlier ? "job %ld: %s, before the failure heard of first"
                          : "job %ld: %s; stopping its ranks on every node",
                  jb->row.id, reason);
    }
    jb->parts_stopping = true;
}

/* Rank 0's lines its node dropped (a gap in their numbers): over max_events_per_s there, or more
 * than it holds for its master (td_job_part.c); counted as the master counts its own. */
static void lines_dropped(job *jb, long n) {
    jb->events_dropped += n;
    jb->dropped_unsaid += n;
    td_jobs_stale(jb);
}

static void apply_report(td_jobs *j, const char *node, json_t *e) {
    long id = (long)json_integer_value(json_object_get(e, "job"));
    int attempt = (int)json_integer_value(json_object_get(e, "attempt"));
    job *jb = td_jobs_find(j, id);
    if (!jb || !jb->parts || attempt != jb->n_attempts - 1) return;
    part *p = part_on(jb, node);
    if (!p || p->state == PART_ENDED) return;
    if (p->state == PART_STARTING) {
        p->state = PART_RUNNING;
        td_jobs_stale(jb);
    }
    /* a part's GPUs are fixed while it runs; a node reports none once it has ended them, and
     * the placement goes on showing what they were */
    const char *devices = json_string_value(json_object_get(e, "devices"));
    if (devices && *devices) snprintf(p->devices, sizeof p->devices, "%s", devices);
    json_t *each = json_object_get(e, "process_devices");
    if (json_array_size(each) > 0) {
        td_buf b = {0};
        size_t k;
        json_t *d;
        json_array_foreach(each, k, d) td_buf_printf(
            &b, "%s%s", k ? ";" : "", json_string_value(d) ? json_string_value(d) : "");
        free(p->proc_devices);
        p->proc_devices = td_buf_take(&b);
    }
    size_t i;
    json_t *c;
    bool logs_whole = true; /* every chunk is in: the report's "complete" can be believed */
    json_array_foreach(json_object_get(e, "logs"), i, c) logs_whole &= apply_log(jb, p, c);
    /* rank 0's lines come from node rank 0 only: another node's are not the job's metrics */
    json_array_foreach(p->node_rank == 0 ? json_object_get(e, "lines") : NULL, i, c) {
        long seq = (long)json_integer_value(json_object_get(c, "seq"));
        const char *text = json_string_value(json_object_get(c, "text"));
        if (seq < jb->lines_in || !text) continue; /* seen already */
        if (seq > jb->lines_in) lines_dropped(jb, seq - jb->lines_in);
        size_t n = strlen(text);
        char *line = td_malloc(n + 1);
        memcpy(line, text, n + 1);
        td_jobs_line_apply(j, jb, line, n, !p->local, json_object_get(c, "files"));
        free(line);
        jb->lines_in = seq + 1;
    }
    json_t *failure = json_object_get(e, "failure");
    double failed_at = json_number_value(json_object_get(failure, "at"));
    if (json_is_object(failure) && p->failed_at <= 0) { /* while the part still stops */
        const char *why = json_string_value(json_object_get(failure, "reason"));
        part_failed(j, jb, p, (int)json_integer_value(json_object_get(failure, "exit_code")),
                    why && *why ? why : "a rank failed without a message", failed_at);
    }
    long next = (long)json_integer_value(json_object_get(e, "next_seq"));
    bool ended = strcmp(json_string_value(json_object_get(e, "state"))
                            ? json_string_value(json_object_get(e, "state"))
                            : "",
                        "ended") == 0;
    if (!ended || !json_is_true(json_object_get(e, "complete")) || !logs_whole) return;
    if (p->node_rank == 0 && next > jb->lines_in) { /* its last lines dropped there */
        lines_dropped(jb, next - jb->lines_in);
        jb->lines_in = next;
    }
    p->state = PART_ENDED;
    td_jobs_stale(jb);
    p->exit_code = (int)json_integer_value(json_object_get(e, "exit_code"));
    const char *reason = json_string_value(json_object_get(e, "reason"));
    snprintf(p->reason, sizeof p->reason, "%s", reason ? reason : "");
    if (p->exit_code != 0) /* (said before it ended, or now) */
        part_failed(j, jb, p, p->exit_code,
                    p->reason[0] ? p->reason : "a rank failed without a message", failed_at);
}

void td_jobs_node_sync_locked(td_jobs *j, const char *node, bool registered, json_t *msg,
                              json_t *reply) {
    json_t *report = json_object_get(msg, "parts");
    size_t i;
    json_t *e;
    /* a master stopping its own node's parts (keep_jobs_on_stop false) leaves every attempt as
     * it is for its next start: no part's end is acted on meanwhile */
    bool frozen = j->stopping_jobs;
    if (!frozen) json_array_foreach(report, i, e) apply_report(j, node, e);
    json_t *orders = json_array();
    for (int k = 0; k < j->n_jobs; k++) {
        job *jb = j->jobs[k];
        part *p = jb->parts ? part_on(jb, node) : NULL;
        if (!p || p->state == PART_ENDED) continue;
        if (registered && p->state == PART_RUNNING && !frozen) {
            /* the node came back without this part: its traind restarted and found no shepherd
             * of it (or is an older traind, whose parts died with it) */
            bool still = false;
            json_array_foreach(report, i, e) still |=
                (long)json_integer_value(json_object_get(e, "job")) == jb->row.id;
            if (!still) {
                p->state = PART_ENDED;
                p->exit_code = -1;
                snprintf(p->reason, sizeof p->reason,
                         "node %s: its traind restarted while node rank %d ran there", node,
                         p->node_rank);
                part_failed(j, jb, p, -1, p->reason, 0);
                continue;
            }
        }
        json_array_append_new(orders, order(jb, p));
    }
    json_object_set_new(reply, "parts", orders);
    for (int k = 0; k < j->n_jobs && !frozen; k++)
        if (j->jobs[k]->parts) check_over(j, j->jobs[k]);
}

void td_jobs_node_sync(td_jobs *j, const char *node, bool registered, json_t *msg, json_t *reply) {
    td_jobs_lock(j);
    td_jobs_node_sync_locked(j, node, registered, msg, reply);
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j); /* the master's own parts may have orders too */
}

void td_jobs_node_lost(td_jobs *j, const char *node, const char *why) {
    td_jobs_lock(j);
    /* (a master stopping its jobs leaves every attempt as it is for its next start) */
    for (int k = 0; k < j->n_jobs && !j->stopping_jobs; k++) {
        job *jb = j->jobs[k];
        part *p = jb->parts ? part_on(jb, node) : NULL;
        if (!p || p->state == PART_ENDED) continue;
        p->state = PART_ENDED;
        p->exit_code = -1;
        snprintf(p->reason, sizeof p->reason, "%s (node rank %d, ranks %d to %d)", why,
                 p->node_rank, p->node_rank * jb->row.nproc,
                 (p->node_rank + 1) * jb->row.nproc - 1);
        part_failed(j, jb, p, -1, p->reason, 0);
        check_over(j, jb);
    }
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j);
}

/* The master's own node: its parts report and take orders in-process, every supervisor turn;
 * time limits of placed jobs are enforced here too. */
void td_jobs_parts_tick(td_jobs *j) {
    if (!j->cluster) return;
    double now = td_clock_wall();
    bool any = j->n_guests > 0;
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        if (!jb->parts) continue;
        any = true;
        double limit = td_jobs_deadline(jb);
        if (limit > 0 && !jb->timed_out && !jb->cancel_requested && now >= limit) {
            jb->timed_out = true;
            jb->parts_stopping = true;
            td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                      "job %ld reached its time limit of %g s: stopping it", jb->row.id,
                      jb->row.time_limit_s);
        }
        if (jb->cancel_requested) jb->parts_stopping = true;
    }
    if (!any) return;
    json_t *msg = json_pack("{s:o}", "parts", td_jobs_guests_report(j, false));
    json_t *reply = json_object();
    td_jobs_node_sync_locked(j, j->node_name, false, msg, reply);
    td_jobs_guests_apply(j, json_object_get(reply, "parts"), false);
    json_decref(msg);
    json_decref(reply);
}

/* ---- the cluster's hooks --------------------------------------------------------------------- */

static void sync_hook(void *ctx, const char *node, bool registered, json_t *msg, json_t *reply) {
    td_jobs_node_sync(ctx, node, registered, msg, reply);
}

static void lost_hook(void *ctx, const char *node, const char *why) {
    td_jobs_node_lost(ctx, node, why);
}

void td_jobs_set_cluster(td_jobs *j, struct td_cluster *cluster, const char *node_name) {
    td_jobs_lock(j);
    j->cluster = cluster;
    snprintf(j->node_name, sizeof j->node_name, "%s", node_name);
    j->cfg.rules.cluster = cluster != NULL;
    pthread_mutex_unlock(&j->mu);
    if (cluster) td_cluster_on_jobs(cluster, sync_hook, lost_hook, j);
}

/* The field to blame for a job that fits on too few nodes: the node count when the cluster has
 * too few nodes alive, else what one node must hold (a node's processes, or their GPUs). */
static const char *too_wide_field(const td_submission *s, int live) {
    if (live < s->nnodes) return s->nnodes > 1 ? "resources.nnodes" : "resources.nproc";
    if (s->gpus_per_proc > 1) return "resources.gpus_per_proc";
    return s->nnodes > 1 ? "resources.nproc_per_node" : "resources.nproc";
}

/* Whether the job can ever run on the nodes registered now (lost ones excepted); 400 with what
 * the cluster has when it cannot. */
int td_jobs_check_fit(td_jobs *j, const td_submission *s, td_reply_error *e) {
    if (!j->cluster) return 0;
    td_cluster_node *nodes;
    int n = td_cluster_snapshot(j->cluster, &nodes);
    int fit = 0, widest = 0, live = 0;
    for (int i = 0; i < n; i++) {
        if (nodes[i].lost) continue;
        live++;
        if (nodes[i].slots > widest) widest = nodes[i].slots;
        bool pinned = !s->nodes;
        for (int k = 0; s->nodes && s->nodes[k]; k++)
            pinned |= strcmp(s->nodes[k], nodes[i].name) == 0;
        if (pinned && nodes[i].slots >= s->nproc * s->gpus_per_proc) fit++;
    }
    int rc = 0;
    for (int k = 0; s->nodes && s->nodes[k] && rc == 0; k++) {
        bool known = false;
        for (int i = 0; i < n; i++)
            known |= !nodes[i].lost && strcmp(s->nodes[k], nodes[i].name) == 0;
        if (!known) {
            char field[64];
            snprintf(field, sizeof field, "resources.nodes[%d]", k);
            rc = td_reply_fail(e, 400, "invalid_spec", field,
                               "%s: there is no node \"%s\" in the cluster (GET /v1/nodes lists "
                               "them)",
                               field, s->nodes[k]);
        }
    }
    int need = s->nproc * s->gpus_per_proc;
    char each[64] = "";
    if (s->gpus_per_proc > 1) snprintf(each, sizeof each, " of %d GPUs (slots)", s->gpus_per_proc);
    if (rc == 0 && fit < s->nnodes && live == 1 && s->nnodes == 1 && !s->nodes)
        rc = td_reply_fail(e, 400, "invalid_spec",
                           s->gpus_per_proc > 1 ? "resources.gpus_per_proc" : "resources.nproc",
                           "resources: %d process%s%s need %d slots, but this node has %d",
                           s->nproc, s->nproc == 1 ? "" : "es", each, need, widest);
    else if (rc == 0 && fit < s->nnodes)
        rc = td_reply_fail(
            e, 400, "invalid_spec", too_wide_field(s, live),
            "resources: %d node%s × %d process%s%s can never run here: the cluster has %d node%s, "
            "%d of them with %d or more slots%s (the most on one node: %d)",
            s->nnodes, s->nnodes == 1 ? "" : "s", s->nproc, s->nproc == 1 ? "" : "es", each, live,
            live == 1 ? "" : "s", fit, need, s->nodes ? " among resources.nodes" : "", widest);
    free(nodes);
    return rc;
}

/* One node of a placement: its ranks, all its GPUs ("devices"), and each process the node
 * starts with the ranks it stands for and its CUDA_VISIBLE_DEVICES (proc_devices: theirs
 * separated by ';'; "" where the node has no GPUs). */
json_t *td_jobs_placement_node(const job *jb, const char *node, const char *address, int node_rank,
                               const char *devices, const char *proc_devices) {
    json_t *ranks = json_array(), *procs = json_array();
    for (int r = 0; r < jb->row.nproc; r++)
        json_array_append_new(ranks, json_integer(node_rank * jb->row.nproc + r));
    const char *d = proc_devices;
    for (int p = 0; p < td_jobs_procs(jb); p++) {
        json_t *mine = json_array();
        for (int r = 0; r < (jb->launch_self ? jb->row.nproc : 1); r++)
            json_array_append_new(mine, json_integer(node_rank * jb->row.nproc + p + r));
        size_t len = strcspn(d, ";");
        json_array_append_new(procs, json_pack("{s:o, s:s%}", "ranks", mine, "devices", d, len));
        d += len + (d[len] == ';');
    }
    return json_pack("{s:s, s:s, s:i, s:o, s:s, s:o}", "node", node, "address", address,
                     "node_rank", node_rank, "ranks", ranks, "devices", devices, "processes",
                     procs);
}

/* The placement in a job's JSON: each node, its node rank, global ranks and devices. */
json_t *td_jobs_placement_json(const job *jb) {
    if (!jb->parts) return jb->last_placement ? json_incref(jb->last_placement) : json_null();
    json_t *list = json_array();
    for (int i = 0; i < jb->n_parts; i++) {
        const part *p = &jb->parts[i];
        json_t *nd = td_jobs_placement_node(jb, p->node, p->address, p->node_rank, p->devices,
                                            p->proc_devices ? p->proc_devices : "");
        json_object_set_new(nd, "state",
                            json_string(p->state == PART_STARTING  ? "starting"
                                        : p->state == PART_RUNNING ? "running"
                                                                   : "ended"));
        json_array_append_new(list, nd);
    }
    return json_pack("{s:o, s:s, s:i}", "nodes", list, "master_addr", jb->parts[0].address,
                     "master_port", jb->master_port);
}
