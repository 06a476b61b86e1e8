/* The scheduler (td_scheduler.h): the queue's order, placement on nodes, and backfilling that
 * never delays the head of the queue. Pure: what it decides goes out through the caller's
 * start() and waits(). */
#include "service/sched/td_scheduler.h"

#include <stdlib.h>
#include <string.h>

bool td_sched_runs_before(const td_sched_job *a, const td_sched_job *b) {
    if (a->restart != b->restart) return a->restart;
    if (a->priority != b->priority) return a->priority > b->priority;
    return a->id < b->id;
}

static bool pinned_to(const td_sched_job *job, const char *node) {
    if (!job->pin) return true;
    for (int i = 0; job->pin[i]; i++)
        if (strcmp(job->pin[i], node) == 0) return true;
    return false;
}

/* Whether node i comes before node k among the nodes a job may take: the fuller first (less
 * room), then by name, the master's own node keeping its place among equals. */
static bool fuller(const td_sched_node *nodes, const int *room, int i, int k) {
    if (room[i] != room[k]) return room[i] < room[k];
    return !nodes[i].master && strcmp(nodes[k].name, nodes[i].name) > 0;
}

bool td_sched_place(const td_sched_job *job, const td_sched_node *nodes, int n_nodes,
                    const int *room, int *picked, bool *local) {
    *local = job->nnodes == 1 && !job->pin && n_nodes > 0 && nodes[0].master && nodes[0].usable &&
             room[0] >= job->slots;
    if (*local) {
        picked[0] = 0;
        return true;
    }
    int m = 0;
    int order[n_nodes + 1];
    for (int i = 0; i < n_nodes; i++) {
        if (!nodes[i].usable || room[i] < job->slots || !pinned_to(job, nodes[i].name)) continue;
        int k = m++;
        for (; k > 0 && fuller(nodes, room, i, order[k - 1]); k--) order[k] = order[k - 1];
        order[k] = i;
    }
    if (job->nnodes < 1 || m < job->nnodes) return false;
    for (int i = 0; i < job->nnodes; i++) picked[i] = order[i];
    for (int i = 1; i < job->nnodes; i++)
        if (nodes[picked[i]].master) {
            int t = picked[0];
            picked[0] = picked[i], picked[i] = t;
        }
    return true;
}

/* The head's shadow time and the room each node has then (*after): running jobs are taken to end
 * one at a time, the earliest first (at its time limit; one without a limit at any moment, now),
 * until the head can be placed. Only those: a job without a limit counts as ending now, but
 * not all of them at once, or a backfill could take the room the head needs of the ones that do
 * not end. A head that fits at no such moment gets now and the nodes' whole slots: then only a
 * job after which it would still fit on a node's whole room may pass it. */
static double head_shadow(const td_sched_job *head, const td_sched_node *nodes, int n_nodes,
                          const td_sched_hold *holds, int n_holds, const int *room, double now,
                          int *after) {
    int order[n_holds + 1];
    for (int h = 0; h < n_holds; h++) { /* insertion sort by end: stable, and short */
        double end = holds[h].ends > now ? holds[h].ends : now;
        int k = h;
        for (; k > 0 && (holds[order[k - 1]].ends > now ? holds[order[k - 1]].ends : now) > end;
             k--)
            order[k] = order[k - 1];
        order[k] = h;
    }
    int picked[head->nnodes > 0 ? head->nnodes : 1];
    bool local;
    memcpy(after, room, sizeof(int) * (size_t)n_nodes);
    if (td_sched_place(head, nodes, n_nodes, after, picked, &local)) return now;
    for (int i = 0; i < n_holds; i++) {
        const td_sched_hold *h = &holds[order[i]];
        after[h->node] += h->slots;
        if (td_sched_place(head, nodes, n_nodes, after, picked, &local))
            return h->ends > now ? h->ends : now;
    }
    for (int k = 0; k < n_nodes; k++) after[k] = nodes[k].slots;
    return now;
}

/* The pass's running state: the room now, and what jobs hold, this pass's starts included. */
typedef struct pass {
    const td_sched_node *nodes;
    int n_nodes;
    int *room;
    td_sched_hold *holds;
    int n_holds;
    double now;
    const td_sched_calls *calls;
} pass;

/* start() on a placement; the room it takes when it started. */
static td_sched_outcome start(pass *p, const td_sched_job *job, const td_sched_start *where) {
    td_sched_outcome out = p->calls->start(p->calls->ctx, job, where);
    if (out != TD_SCHED_STARTED) return out;
    for (int i = 0; i < job->nnodes; i++) {
        p->room[where->nodes[i]] -= job->slots;
        p->holds[p->n_holds++] =
            (td_sched_hold){.node = where->nodes[i],
                            .slots = job->slots,
                            .ends = job->time_limit_s > 0 ? p->now + job->time_limit_s : 0};
    }
    return out;
}

/* A job behind the head: started where it cannot delay it. after: the head's room at its shadow
 * time, less what earlier backfills took of it. */
static void try_backfill(pass *p, const td_sched_job *job, const td_sched_job *head, double shadow,
                         int *after) {
    int picked[job->nnodes > 0 ? job->nnodes : 1], head_picked[head->nnodes > 0 ? head->nnodes : 1];
    bool local, head_local;
    bool room_now = td_sched_place(job, p->nodes, p->n_nodes, p->room, picked, &local);
    p->calls->waits(p->calls->ctx, job, TD_SCHED_BEHIND, head, room_now); /* unless it starts */
    if (!room_now) return;
    bool in_time = job->time_limit_s > 0 && shadow > p->now && p->now + job->time_limit_s <= shadow;
    int trial[p->n_nodes + 1];
    memcpy(trial, after, sizeof(int) * (size_t)p->n_nodes);
    if (!in_time) {
        for (int i = 0; i < job->nnodes; i++) trial[picked[i]] -= job->slots;
        if (!td_sched_place(head, p->nodes, p->n_nodes, trial, head_picked, &head_local)) return;
    }
    td_sched_start where = {.nodes = picked, .local = local, .ahead_of = head, .in_time = in_time};
    if (start(p, job, &where) == TD_SCHED_STARTED && !in_time)
        memcpy(after, trial, sizeof(int) * (size_t)p->n_nodes);
}

void td_sched_run(const td_sched_node *nodes, int n_nodes, const td_sched_hold *holds, int n_holds,
                  const td_sched_job *queue, int n_queue, double now, const td_sched_calls *calls) {
    if (n_queue <= 0) return;
    int max_holds = n_holds;
    for (int i = 0; i < n_queue; i++) max_holds += queue[i].nnodes > 0 ? queue[i].nnodes : 0;
    int *order = malloc(sizeof(int) * (size_t)n_queue);
    int *room = malloc(sizeof(int) * (size_t)(n_nodes + 1));
    int *after = malloc(sizeof(int) * (size_t)(n_nodes + 1));
    td_sched_hold *all = malloc(sizeof(td_sched_hold) * (size_t)(max_holds + 1));
    if (!order || !room || !after || !all) { /* nothing starts this pass; the next one tries */
        free(order), free(room), free(after), free(all);
        return;
    }
    for (int i = 0; i < n_queue; i++) { /* insertion sort: stable, and queues are short */
        int k = i;
        for (; k > 0 && td_sched_runs_before(&queue[i], &queue[order[k - 1]]); k--)
            order[k] = order[k - 1];
        order[k] = i;
    }
    for (int k = 0; k < n_nodes; k++) room[k] = nodes[k].free;
    if (n_holds > 0) memcpy(all, holds, sizeof(td_sched_hold) * (size_t)n_holds);
    pass p = {nodes, n_nodes, room, all, n_holds, now, calls};
    const td_sched_job *head = NULL;
    double shadow = now;
    for (int q = 0; q < n_queue; q++) {
        const td_sched_job *job = &queue[order[q]];
        if (head) {
            try_backfill(&p, job, head, shadow, after);
            continue;
        }
        int picked[job->nnodes > 0 ? job->nnodes : 1];
        bool local;
        bool room_now = td_sched_place(job, nodes, n_nodes, room, picked, &local);
        if (room_now) {
            td_sched_start where = {.nodes = picked, .local = local};
            if (start(&p, job, &where) != TD_SCHED_WAITS) continue;
        }
        head = job;
        calls->waits(calls->ctx, job, TD_SCHED_NO_ROOM, NULL, room_now);
        shadow = head_shadow(head, nodes, n_nodes, p.holds, p.n_holds, room, now, after);
    }
    free(order), free(room), free(after), free(all);
}
