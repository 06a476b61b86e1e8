/* The queue and the slots: which waiting job starts next (priority, then age, backfilling only
 * where the head of the queue cannot be delayed) and which slots (GPUs) it holds while it runs. */
#include "service/jobs/td_jobs_private.h"

#include "base/td_buf.h"
#include "base/td_strv.h"

#include <stdlib.h>
#include <string.h>

char **td_jobs_devices_strv(const td_jobs *j, const int *devices, int n_slots, int procs,
                            bool all) {
    char **out = td_strv_new(procs);
    int each = all ? n_slots : procs > 0 ? n_slots / procs : 0;
    for (int p = 0; p < procs; p++) {
        td_buf b = {0};
        for (int i = 0; i < each; i++)
            td_buf_printf(&b, "%s%d", i ? "," : "",
                          td_jobs_gpu_id(j, devices[all ? i : p * each + i]));
        out[p] = td_str_dup(b.data ? b.data : "");
        td_buf_free(&b);
    }
    return out;
}

void td_jobs_release_slots(td_jobs *j, job *jb) {
    if (jb->parts) {
        td_jobs_parts_release(j, jb);
        return;
    }
    j->used_slots -= td_jobs_slots(jb);
    if (jb->devices)
        for (int i = 0; i < td_jobs_slots(jb); i++) j->gpu_used[jb->devices[i]] = false;
    free(jb->devices);
    jb->devices = NULL;
    jb->active = false;
}

bool td_jobs_reserve_slots(td_jobs *j, job *jb) {
    int need = td_jobs_slots(jb);
    if (j->cfg.slots - j->used_slots < need) return false;
    j->used_slots += need;
    jb->active = true;
    if (j->cfg.gpus > 0) {
        jb->devices = td_calloc((size_t)need, sizeof(int));
        int k = 0;
        for (int i = 0; i < j->cfg.gpus && k < need; i++)
            if (!j->gpu_used[i]) j->gpu_used[i] = true, jb->devices[k++] = i;
        if (k < need) { /* GPUs held outside the slot count (a part still stopping): wait */
            for (int i = 0; i < k; i++) j->gpu_used[jb->devices[i]] = false;
            free(jb->devices);
            jb->devices = NULL;
            j->used_slots -= need;
            jb->active = false;
            return false;
        }
    }
    return true;
}

/* When the job's time limit ends (CLOCK_REALTIME seconds), or 0 without one. */
double td_jobs_deadline(const job *jb) {
    return jb->row.time_limit_s > 0 && jb->row.started_at > 0
               ? jb->row.started_at + jb->row.time_limit_s
               : 0;
}

/* Queue order: higher priority first, then submission order (placement on a cluster keeps it
 * too: td_job_place.c). */
bool td_jobs_runs_before(const job *a, const job *b) {
    return a->row.priority != b->row.priority ? a->row.priority > b->row.priority
                                              : a->row.id < b->row.id;
}

/* The earliest time the blocked job `head` could start, assuming each running job ends at its
 * time limit or, without one, at any moment (now): its "shadow" time, and how many slots would
 * be left over then. Backfilling into those spare slots, or with a job whose own limit ends
 * before the shadow time, cannot delay the head (EASY backfilling, as Slurm's backfill). */
static void head_shadow(td_jobs *j, const job *head, double now, double *shadow, int *spare) {
    int n = 0;
    double ends[j->n_live + 1]; /* + 1: never a VLA of 0 */
    int slots[j->n_live + 1];
    for (int i = 0; i < j->n_live; i++) {
        const job *jb = j->live[i];
        if (!jb->active) continue;
        double end = td_jobs_deadline(jb);
        int k = n++;
        for (; k > 0 && ends[k - 1] > (end > 0 ? end : now); k--)
            ends[k] = ends[k - 1], slots[k] = slots[k - 1];
        ends[k] = end > 0 ? end : now;
        slots[k] = td_jobs_slots(jb);
    }
    int free_slots = j->cfg.slots - j->used_slots;
    *shadow = now;
    for (int i = 0; i < n && free_slots < td_jobs_slots(head); i++) {
        free_slots += slots[i];
        *shadow = ends[i];
    }
    *spare = free_slots - td_jobs_slots(head);
}

/* Why the queue's first job does not start on this node. */
static void say_head_waits(td_jobs *j, job *jb) {
    int need = td_jobs_slots(jb), free_slots = j->cfg.slots - j->used_slots, running = 0;
    for (int i = 0; i < j->n_live; i++) running += j->live[i]->active;
    const char *what = j->cfg.gpus > 0 ? "GPUs" : "slots";
    if (free_slots >= need)
        td_jobs_waits(jb,
                      "waits for its %d GPUs: %d are free by count, but a job that is stopping "
                      "still holds some",
                      need, free_slots);
    else
        td_jobs_waits(jb,
                      "waits for %d free %s: %d of %d are free, the rest held by %d running "
                      "job%s",
                      need, what, free_slots, j->cfg.slots, running, running == 1 ? "" : "s");
}

/* Why a job behind the queue's first did not start ahead of it. */
static void say_behind(td_jobs *j, job *jb, const job *head) {
    int need = td_jobs_slots(jb), free_slots = j->cfg.slots - j->used_slots;
    td_jobs_waits(
        jb, "waits behind job %ld, first in the queue (%s); %s", head->row.id,
        head->row.priority != jb->row.priority ? "a higher priority" : "submitted earlier",
        free_slots < need ? "and for free slots"
                          : "starting now could delay that job (it could start first with a "
                            "time_limit_s that ends before that job can start)");
}

/* Recovered jobs first (they were running), then the queue by priority and age. The first job
 * that does not fit holds its place: a later one starts only where it cannot delay it. */
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
                              j->node_name, j->node_name);
        return;
    }
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        if (jb->state != RESTARTING || jb->active) continue;
        if (!td_jobs_reserve_slots(j, jb)) return;
        td_jobs_start_attempt(j, jb);
    }
    int n = 0;
    job *queue[j->n_live + 1];
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        if (jb->state != QUEUED) continue;
        int k = n++;
        for (; k > 0 && td_jobs_runs_before(jb, queue[k - 1]); k--) queue[k] = queue[k - 1];
        queue[k] = jb;
    }
    const job *head = NULL;
    double shadow = 0, now = td_clock_wall();
    int spare = 0;
    for (int i = 0; i < n; i++) {
        job *jb = queue[i];
        if (!head) {
            if (td_jobs_reserve_slots(j, jb)) {
                td_jobs_start_attempt(j, jb);
                continue;
            }
            head = jb;
            say_head_waits(j, jb);
            head_shadow(j, head, now, &shadow, &spare);
            continue;
        }
        say_behind(j, jb, head); /* unless it starts below */
        if (j->cfg.slots - j->used_slots < td_jobs_slots(jb)) continue;
        bool ends_in_time =
            jb->row.time_limit_s > 0 && shadow > now && now + jb->row.time_limit_s <= shadow;
        if (!ends_in_time && td_jobs_slots(jb) > spare) continue;
        if (!td_jobs_reserve_slots(j, jb)) continue; /* its GPUs are not all free yet */
        if (!ends_in_time) spare -= td_jobs_slots(jb);
        td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                  "job %ld starts ahead of job %ld (backfill: %s)", jb->row.id, head->row.id,
                  ends_in_time ? "its time limit ends before that job could start"
                               : "it uses slots that job would leave free");
        td_jobs_start_attempt(j, jb);
    }
}
