/* The scheduler (service/sched/td_scheduler.h) without processes: the queue's order, gang placement
 * over nodes, backfilling with and without time limits, drained nodes, GPUs counted as slots,
 * and a start() that refuses. Each case describes nodes, what running jobs hold and a queue,
 * and reads what the scheduler started and why the rest wait. */
#include "service/sched/td_scheduler.h"

#include <criterion/criterion.h>
#include <string.h>

enum { MAX_EVENTS = 32 };

/* What one pass did: each start with its nodes, each wait with its reason. */
typedef struct record {
    long started[MAX_EVENTS];
    int nodes[MAX_EVENTS][8];
    bool local[MAX_EVENTS], backfill[MAX_EVENTS], in_time[MAX_EVENTS];
    int n_started;
    long waiting[MAX_EVENTS];
    td_sched_reason why[MAX_EVENTS];
    int n_waiting;
    long refuse; /* start() answers TD_SCHED_WAITS for this job id (GPUs held, say) */
    long fail;   /* and TD_SCHED_ENDED for this one (its checkpoint cannot be had) */
} record;

static td_sched_outcome on_start(void *ctx, const td_sched_job *job, const td_sched_start *w) {
    record *r = ctx;
    if (job->id == r->refuse) return TD_SCHED_WAITS;
    if (job->id == r->fail) return TD_SCHED_ENDED;
    int i = r->n_started++;
    r->started[i] = job->id;
    for (int k = 0; k < job->nnodes; k++) r->nodes[i][k] = w->nodes[k];
    r->local[i] = w->local;
    r->backfill[i] = w->ahead_of != NULL;
    r->in_time[i] = w->in_time;
    return TD_SCHED_STARTED;
}

/* A job's last word wins: a job behind the head is told it waits, then may start. */
static void on_waits(void *ctx, const td_sched_job *job, td_sched_reason why,
                     const td_sched_job *head, bool room_now) {
    (void)head, (void)room_now;
    record *r = ctx;
    r->waiting[r->n_waiting] = job->id;
    r->why[r->n_waiting++] = why;
}

static record run(const td_sched_node *nodes, int n, const td_sched_hold *holds, int n_holds,
                  const td_sched_job *queue, int n_queue, long refuse, long fail) {
    static record r;
    memset(&r, 0, sizeof r);
    r.refuse = refuse, r.fail = fail;
    td_sched_calls calls = {.start = on_start, .waits = on_waits, .ctx = &r};
    td_sched_run(nodes, n, holds, n_holds, queue, n_queue, 1000.0, &calls);
    return r;
}

static bool started(const record *r, long id) {
    for (int i = 0; i < r->n_started; i++)
        if (r->started[i] == id) return true;
    return false;
}

static td_sched_node one_node(int slots, int free) {
    return (td_sched_node){
        .name = "solo", .slots = slots, .free = free, .usable = true, .master = true};
}

Test(scheduler, priority_then_age_restarts_first) {
    td_sched_node node = one_node(4, 4);
    td_sched_job q[] = {{.id = 1, .nnodes = 1, .slots = 2},
                        {.id = 2, .priority = 5, .nnodes = 1, .slots = 2},
                        {.id = 3, .nnodes = 1, .slots = 2},
                        {.id = 9, .restart = true, .nnodes = 1, .slots = 1}};
    record r = run(&node, 1, NULL, 0, q, 4, 0, 0);
    cr_assert_eq(r.n_started, 2);
    cr_expect_eq(r.started[0], 9, "the restart first: it was running");
    cr_expect_eq(r.started[1], 2, "then the higher priority");
    cr_expect(r.local[1], "one node alone: a local start, as without a cluster");
    cr_assert_eq(r.n_waiting, 2);
    cr_expect_eq(r.waiting[0], 1, "job 1 is the head: 1 slot is left, it needs 2");
    cr_expect_eq(r.why[0], TD_SCHED_NO_ROOM);
    cr_expect_eq(r.waiting[1], 3);
    cr_expect_eq(r.why[1], TD_SCHED_BEHIND, "job 3 waits behind the head, not for room alone");
}

Test(scheduler, backfill_never_delays_the_head_without_time_limits) {
    /* 6 slots, 2 held by a job without a limit: the head (5) waits; a 1-slot job passes it (the
     * head still fits once the running job ends), a second 1-slot job would delay it */
    td_sched_node node = one_node(6, 4);
    td_sched_hold held = {.node = 0, .slots = 2};
    td_sched_job q[] = {{.id = 1, .nnodes = 1, .slots = 5},
                        {.id = 2, .nnodes = 1, .slots = 1},
                        {.id = 3, .nnodes = 1, .slots = 1}};
    record r = run(&node, 1, &held, 1, q, 3, 0, 0);
    cr_assert_eq(r.n_started, 1);
    cr_expect_eq(r.started[0], 2);
    cr_expect(r.backfill[0] && !r.in_time[0], "it uses room the head leaves free");
    cr_expect(!started(&r, 3), "a second one would leave the head 4 of its 5 slots");
}

Test(scheduler, backfill_by_time_limit_before_the_shadow_time) {
    /* 8 slots, 4 held until t+100: the head (6) can start at t+100. A job that ends by then
     * passes it whatever it uses; one without a limit only within the 2 slots the head leaves */
    td_sched_node node = one_node(8, 4);
    td_sched_hold held = {.node = 0, .slots = 4, .ends = 1100.0};
    td_sched_job q[] = {{.id = 1, .nnodes = 1, .slots = 6},
                        {.id = 2, .nnodes = 1, .slots = 2, .time_limit_s = 50},
                        {.id = 3, .nnodes = 1, .slots = 2},
                        {.id = 4, .nnodes = 1, .slots = 1, .time_limit_s = 500}};
    record r = run(&node, 1, &held, 1, q, 4, 0, 0);
    cr_assert_eq(r.n_started, 2);
    cr_expect_eq(r.started[0], 2);
    cr_expect(r.in_time[0], "its limit ends at t+50, before the head's t+100");
    cr_expect_eq(r.started[1], 3);
    cr_expect(!r.in_time[1], "no limit: it takes the 2 slots the head leaves at t+100");
    cr_expect(!started(&r, 4), "no room is left now");
}

Test(scheduler, a_limit_past_the_shadow_time_is_no_pass) {
    td_sched_node node = one_node(8, 4);
    td_sched_hold held = {.node = 0, .slots = 4, .ends = 1100.0};
    td_sched_job q[] = {{.id = 1, .nnodes = 1, .slots = 8},
                        {.id = 2, .nnodes = 1, .slots = 2, .time_limit_s = 200}};
    record r = run(&node, 1, &held, 1, q, 2, 0, 0);
    cr_expect_eq(r.n_started, 0, "ending at t+200, it would hold 2 of the head's 8 at t+100");
}

Test(scheduler, gang_placement_fullest_nodes_first_master_as_rank_0) {
    td_sched_node nodes[] = {
        {.name = "m0", .slots = 4, .free = 4, .usable = true, .master = true},
        {.name = "n1", .slots = 4, .free = 2, .usable = true},
        {.name = "n2", .slots = 4, .free = 4, .usable = true},
        {.name = "n3", .slots = 4, .free = 4, .usable = false}, /* drained */
    };
    td_sched_job q[] = {{.id = 1, .nnodes = 2, .slots = 2}, {.id = 2, .nnodes = 3, .slots = 2}};
    record r = run(nodes, 4, NULL, 0, q, 2, 0, 0);
    cr_assert_eq(r.n_started, 1);
    cr_expect_eq(r.nodes[0][0], 0, "the master's node is node rank 0");
    cr_expect_eq(r.nodes[0][1], 1, "n1, the fullest that fits, is taken before n2");
    cr_expect(!r.local[0]);
    cr_expect_eq(r.waiting[0], 2, "3 nodes with 2 free: m0 and n1 have 2 left, n2 4, n3 drained");
}

Test(scheduler, pinned_jobs_take_only_their_nodes) {
    const char *only_n2[] = {"n2", NULL};
    td_sched_node nodes[] = {
        {.name = "m0", .slots = 4, .free = 4, .usable = true, .master = true},
        {.name = "n2", .slots = 4, .free = 4, .usable = true},
    };
    td_sched_job q[] = {{.id = 1, .nnodes = 1, .slots = 1, .pin = only_n2}};
    record r = run(nodes, 2, NULL, 0, q, 1, 0, 0);
    cr_assert_eq(r.n_started, 1);
    cr_expect_eq(r.nodes[0][0], 1);
    cr_expect(!r.local[0], "a job that names its node runs there as a part, not locally");
}

Test(scheduler, a_refused_start_makes_the_head_an_ended_one_does_not) {
    /* GPUs a stopping job still holds: start() refuses job 1, which then holds its place */
    td_sched_node node = one_node(4, 4);
    td_sched_job q[] = {{.id = 1, .nnodes = 1, .slots = 4},
                        {.id = 2, .nnodes = 1, .slots = 1},
                        {.id = 3, .nnodes = 1, .slots = 1}};
    record r = run(&node, 1, NULL, 0, q, 3, 1, 0);
    cr_expect_eq(r.waiting[0], 1);
    cr_expect_eq(r.why[0], TD_SCHED_NO_ROOM);
    cr_expect_eq(r.n_started, 0, "the head needs all 4 slots: nothing may pass it");
    r = run(&node, 1, NULL, 0, q, 3, 0, 1);
    cr_expect(started(&r, 2) && started(&r, 3), "an ended job holds nothing and no place");
}

Test(scheduler, a_head_that_can_never_fit_blocks_the_queue) {
    const char *only_gone[] = {"gone", NULL};
    td_sched_node nodes[] = {
        {.name = "m0", .slots = 4, .free = 4, .usable = true, .master = true},
        {.name = "gone", .slots = 4, .free = 4, .usable = false},
    };
    td_sched_job q[] = {{.id = 1, .nnodes = 1, .slots = 1, .pin = only_gone},
                        {.id = 2, .nnodes = 1, .slots = 1}};
    record r = run(nodes, 2, NULL, 0, q, 2, 0, 0);
    cr_expect_eq(r.n_started, 0, "it waits for its node, and keeps its place in the queue");
}

Test(scheduler, this_pass_starts_count_in_the_shadow) {
    /* job 1 starts now with a 100 s limit, leaving 4 of 12 slots; the head (8) can start when
     * it ends, at t+100, so job 3, done by t+50, passes it and job 4, without a limit, finds
     * no room left */
    td_sched_node node = one_node(12, 12);
    td_sched_job q[] = {{.id = 1, .nnodes = 1, .slots = 8, .time_limit_s = 100},
                        {.id = 2, .nnodes = 1, .slots = 8},
                        {.id = 3, .nnodes = 1, .slots = 4, .time_limit_s = 50},
                        {.id = 4, .nnodes = 1, .slots = 1}};
    record r = run(&node, 1, NULL, 0, q, 4, 0, 0);
    cr_assert_eq(r.n_started, 2);
    cr_expect_eq(r.started[0], 1);
    cr_expect_eq(r.started[1], 3);
    cr_expect(r.in_time[1], "job 1's own limit set the head's shadow time");
    cr_expect(!started(&r, 4));
}

Test(scheduler, jobs_without_limits_end_one_at_a_time) {
    /* 3 slots, two running jobs of 1 without a limit: the head (2) needs one of them to end.
     * Counting both as ended would let a 1-slot job pass it, and then the head would wait for
     * two of the three to end */
    td_sched_node node = one_node(3, 1);
    td_sched_hold held[] = {{.node = 0, .slots = 1}, {.node = 0, .slots = 1}};
    td_sched_job q[] = {{.id = 2, .nnodes = 1, .slots = 2}, {.id = 4, .nnodes = 1, .slots = 1}};
    record r = run(&node, 1, held, 2, q, 2, 0, 0);
    cr_expect_eq(r.n_started, 0, "the idle slot stays idle: using it could delay the head");
    cr_expect_eq(r.why[1], TD_SCHED_BEHIND);
}
