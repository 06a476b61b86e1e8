/* The cluster's master: placing jobs on nodes.
 *
 * Placement is gang placement: a job starts only when nnodes nodes each have nproc_per_node free
 * slots, all at once, and nothing is held before that. The scheduler (td_scheduler.h) is one
 * node's too: restarts, then priority, then submission order, and backfilling (time limits
 * included) that never delays the head. A one-node job that fits on the master's own node runs
 * there exactly as without a cluster.
 *
 * Following the parts once they are placed (orders out, reports in) is td_job_sync.c's. */
#include "service/jobs/td_jobs_private.h"

#include "service/cluster/td_cluster.h"
#include "service/sched/td_scheduler.h"
#include "base/td_strv.h"

#include <errno.h>
#include <fcntl.h>
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

/* Slots each node has free now: its total less what placement holds there (and, for an agent,
 * less what it says it still uses: a part of an attempt the master ended may still be stopping). */
static void free_slots(td_jobs *j, const td_cluster_node *nodes, int n, int *free_now) {
    for (int i = 0; i < n; i++) {
        if (nodes[i].master) {
            free_now[i] = j->cfg.runner.slots - j->runner.used_slots;
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
        if (p->local) j->runner.used_slots += td_jobs_slots(jb);
    }
    jb->master_port = port;
    json_decref(jb->resume_order);
    jb->resume_order = td_jobs_resume_order(jb); /* fixed for the attempt */
    char checkpoint_dir[PATH_MAX];
    td_jobs_resume_dir(jb, checkpoint_dir, sizeof checkpoint_dir);
    free(jb->checkpoint_dir);
    jb->checkpoint_dir = td_str_dup(checkpoint_dir);
    jb->active = true;
    jb->parts_stopping = false;
    jb->parts_code = 0;
    jb->parts_reason[0] = 0;
    jb->lines_in = 0;
    jb->last_step = jb->checkpoint_step > 0 ? jb->checkpoint_step : jb->last_step;
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

/* One pass of the scheduler over the cluster's nodes (td_scheduler.h): its queue's jobs by
 * index, and the nodes as the registry listed them. */
typedef struct cluster_pass {
    td_jobs *j;
    job **jobs; /* parallel to queue */
    const td_sched_job *queue;
    const td_cluster_node *nodes;
    int n_nodes;
} cluster_pass;

/* Starts a placed job: on the master's own node as without a cluster, or as parts on the nodes
 * picked once its checkpoint can reach them. */
static td_sched_outcome start_placed(void *ctx, const td_sched_job *sj, const td_sched_start *w) {
    cluster_pass *p = ctx;
    td_jobs *j = p->j;
    job *jb = p->jobs[sj - p->queue];
    if (w->local) {
        if (!td_jobs_reserve_slots(j, jb)) return TD_SCHED_WAITS;
        td_jobs_start_attempt(j, jb);
    } else {
        bool on_master = false;
        for (int i = 0; i < jb->nnodes; i++) on_master |= p->nodes[w->nodes[i]].master;
        int resume = td_jobs_resume_ready(j, jb, on_master);
        if (resume == TD_RESUME_WAIT)
            td_jobs_waits(jb, "waits for its checkpoint to reach the nodes it was placed on");
        if (resume != TD_RESUME_READY)
            return resume == TD_RESUME_FAILED ? TD_SCHED_ENDED : TD_SCHED_WAITS;
        start_parts(j, jb, p->nodes, w->nodes);
        if (!jb->parts) return TD_SCHED_WAITS;
    }
    if (w->ahead_of)
        td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                  "job %ld starts ahead of job %ld (backfill: %s)", jb->row.id, w->ahead_of->id,
                  w->in_time ? "its time limit ends before that job could start"
                             : "it uses slots that job would leave free");
    return TD_SCHED_STARTED;
}

static void waits_placed(void *ctx, const td_sched_job *sj, td_sched_reason why,
                         const td_sched_job *head, bool room_now) {
    cluster_pass *p = ctx;
    job *jb = p->jobs[sj - p->queue];
    if (why == TD_SCHED_BEHIND) {
        const job *first = p->jobs[head - p->queue];
        td_jobs_waits(jb,
                      "waits behind job %ld, first in the queue (%s): it starts first only "
                      "where it cannot delay that job",
                      first->row.id,
                      first->state == RESTARTING                ? "a restart: it was running"
                      : first->row.priority != jb->row.priority ? "a higher priority"
                                                                : "submitted earlier");
        return;
    }
    if (room_now) return; /* start_placed said why (its checkpoint, its GPUs) */
    int cap[p->n_nodes + 1];
    free_slots(p->j, p->nodes, p->n_nodes, cap);
    say_nodes_wait(jb, p->nodes, p->n_nodes, cap);
}

/* What running jobs hold on each node, and until when: parts where they were placed, jobs that
 * run on the master's own node as without a cluster there. */
static int holds_of(td_jobs *j, const td_cluster_node *nodes, int n, td_sched_hold *holds) {
    int n_holds = 0;
    for (int k = 0; k < j->n_jobs; k++) {
        const job *jb = j->jobs[k];
        for (int p = 0; p < jb->n_parts; p++)
            for (int i = 0; i < n; i++)
                if (strcmp(jb->parts[p].node, nodes[i].name) == 0)
                    holds[n_holds++] = (td_sched_hold){
                        .node = i, .slots = td_jobs_slots(jb), .ends = td_jobs_deadline(jb)};
        if (!jb->parts && jb->active && n > 0 && nodes[0].master)
            holds[n_holds++] = (td_sched_hold){
                .node = 0, .slots = td_jobs_slots(jb), .ends = td_jobs_deadline(jb)};
    }
    return n_holds;
}

void td_jobs_schedule_cluster(td_jobs *j) {
    td_cluster_node *nodes;
    int n = td_cluster_snapshot(j->cluster, &nodes);
    int cap[n + 1], max_holds = 1;
    free_slots(j, nodes, n, cap);
    td_sched_node sched_nodes[n + 1];
    for (int i = 0; i < n; i++)
        sched_nodes[i] =
            (td_sched_node){.name = nodes[i].name,
                            .slots = nodes[i].slots,
                            .free = cap[i],
                            .usable = !nodes[i].lost && !nodes[i].stale && !nodes[i].drained,
                            .master = nodes[i].master};
    for (int k = 0; k < j->n_jobs; k++) max_holds += j->jobs[k]->n_parts + 1;
    td_sched_hold *holds = td_calloc((size_t)max_holds, sizeof *holds);
    int n_holds = holds_of(j, nodes, n, holds), n_queue = 0;
    job *jobs[j->n_live + 1];
    td_sched_job queue[j->n_live + 1];
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        bool restart = jb->state == RESTARTING && !jb->active;
        if (!restart && jb->state != QUEUED) continue;
        jobs[n_queue] = jb;
        queue[n_queue++] = td_jobs_sched_job(jb);
    }
    cluster_pass p = {j, jobs, queue, nodes, n};
    td_sched_calls calls = {.start = start_placed, .waits = waits_placed, .ctx = &p};
    td_sched_run(sched_nodes, n, holds, n_holds, queue, n_queue, td_clock_wall(), &calls);
    free(holds);
    free(nodes);
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

td_sched_job td_jobs_sched_job(const job *jb) {
    return (td_sched_job){.id = jb->row.id,
                          .priority = jb->row.priority,
                          .restart = jb->state == RESTARTING && !jb->active,
                          .nnodes = jb->nnodes,
                          .slots = td_jobs_slots(jb),
                          .time_limit_s = jb->row.time_limit_s,
                          .pin = (const char *const *)jb->pin};
}
