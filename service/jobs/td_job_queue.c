/* The queue: which waiting job starts next (priority, then age, backfilling only where the head
 * of the queue cannot be delayed), on this node alone (a cluster of one) or, on a master with
 * agents, on the cluster's nodes (td_job_place.c); the slots it takes are td_job_slots.c's. */
#include "service/jobs/td_jobs_private.h"
#include "service/sched/td_scheduler.h"

#include "base/td_buf.h"
#include "base/td_strv.h"

#include <stdlib.h>
#include <string.h>

/* Why the queue's first job does not start on this node. */
static void say_head_waits(td_jobs *j, job *jb) {
    int need = td_jobs_slots(jb), free_slots = j->cfg.runner.slots - j->runner.used_slots,
        running = 0;
    for (int i = 0; i < j->n_live; i++) running += j->live[i]->active;
    const char *what = j->cfg.runner.gpus > 0 ? "GPUs" : "slots";
    if (free_slots >= need)
        td_jobs_waits(jb,
                      "waits for its %d GPUs: %d are free by count, but a job that is stopping "
                      "still holds some",
                      need, free_slots);
    else
        td_jobs_waits(jb,
                      "waits for %d free %s: %d of %d are free, the rest held by %d running "
                      "job%s",
                      need, what, free_slots, j->cfg.runner.slots, running,
                      running == 1 ? "" : "s");
}

/* Why a job behind the queue's first did not start ahead of it. */
static void say_behind(td_jobs *j, job *jb, const job *head) {
    int need = td_jobs_slots(jb), free_slots = j->cfg.runner.slots - j->runner.used_slots;
    td_jobs_waits(jb, "waits behind job %ld, first in the queue (%s); %s", head->row.id,
                  head->state == RESTARTING                ? "a restart: it was running"
                  : head->row.priority != jb->row.priority ? "a higher priority"
                                                           : "submitted earlier",
                  free_slots < need
                      ? "and for free slots"
                      : "starting now could delay that job (it could start first with a "
                        "time_limit_s that ends before that job can start)");
}

/* One pass of the scheduler over this node (td_scheduler.h): its queue's jobs by index. */
typedef struct node_pass {
    td_jobs *j;
    job **jobs; /* parallel to queue */
    const td_sched_job *queue;
} node_pass;

static td_sched_outcome start_here(void *ctx, const td_sched_job *sj, const td_sched_start *w) {
    node_pass *p = ctx;
    job *jb = p->jobs[sj - p->queue];
    if (!td_jobs_reserve_slots(p->j, jb)) return TD_SCHED_WAITS; /* GPUs a stopping job holds */
    if (w->ahead_of)
        td_log_at(p->j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                  "job %ld starts ahead of job %ld (backfill: %s)", jb->row.id, w->ahead_of->id,
                  w->in_time ? "its time limit ends before that job could start"
                             : "it uses slots that job would leave free");
    td_jobs_start_attempt(p->j, jb);
    return TD_SCHED_STARTED;
}

static void waits_here(void *ctx, const td_sched_job *sj, td_sched_reason why,
                       const td_sched_job *head, bool room_now) {
    (void)room_now;
    node_pass *p = ctx;
    job *jb = p->jobs[sj - p->queue];
    if (why == TD_SCHED_NO_ROOM)
        say_head_waits(p->j, jb);
    else
        say_behind(p->j, jb, p->jobs[head - p->queue]);
}

/* This node alone, a cluster of one: restarts first (they were running), then the queue by
 * priority and age; the first job that does not fit holds its place, and a later one starts
 * only where it cannot delay it (td_scheduler.h). */
void td_jobs_schedule(td_jobs *j) {
    if (td_jobs_clustered(j)) {
        td_jobs_schedule_cluster(j);
        return;
    }
    if (j->draining) { /* a drained node starts nothing, restarts included */
        for (int i = 0; i < j->n_live; i++)
            if (j->live[i]->state == QUEUED)
                td_jobs_waits(j->live[i],
                              "waits for this node (%s) to be undrained (POST "
                              "/v1/nodes/%s/undrain): a drained node starts no job",
                              j->node.name, j->node.name);
        return;
    }
    int n = 0, n_holds = 0;
    job *jobs[j->n_live + 1];
    td_sched_job queue[j->n_live + 1];
    td_sched_hold holds[j->n_live + 1];
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        if (jb->active)
            holds[n_holds++] = (td_sched_hold){
                .node = 0, .slots = td_jobs_slots(jb), .ends = td_jobs_deadline(jb)};
        bool restart = jb->state == RESTARTING && !jb->active;
        if (!restart && jb->state != QUEUED) continue;
        jobs[n] = jb;
        queue[n] = td_jobs_sched_job(jb);
        queue[n].nnodes = 1; /* this node alone: a job names no other */
        queue[n++].pin = NULL;
    }
    td_sched_node node = {.name = j->node.name,
                          .slots = j->cfg.runner.slots,
                          .free = j->cfg.runner.slots - j->runner.used_slots,
                          .usable = true,
                          .master = true};
    node_pass p = {j, jobs, queue};
    td_sched_calls calls = {.start = start_here, .waits = waits_here, .ctx = &p};
    td_sched_run(&node, 1, holds, n_holds, queue, n, td_clock_wall(), &calls);
}
