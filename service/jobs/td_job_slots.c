/* The slots (GPUs on a GPU node) a job's attempt holds while it runs, on this node alone or, placed
 * across nodes, as its placement's parts: taken before the attempt starts, given back once every
 * process of it has ended. Apart from the queue because attempts give them back as they end, and
 * the queue (td_job_queue.c) and placement (td_job_place.c) take them. */
#include "service/jobs/td_jobs_private.h"

#include <stdlib.h>
#include <string.h>

bool td_jobs_reserve_slots(td_jobs *j, job *jb) {
    int need = td_jobs_slots(jb);
    if (j->cfg.runner.slots - j->runner.used_slots < need) return false;
    j->runner.used_slots += need;
    jb->active = true;
    if (j->cfg.runner.gpus > 0) {
        jb->devices = td_runner_take_gpus(&j->runner, need);
        if (!jb->devices) { /* GPUs held outside the slot count (a part still stopping): wait */
            j->runner.used_slots -= need;
            jb->active = false;
            return false;
        }
    }
    return true;
}

void td_jobs_release_slots(td_jobs *j, job *jb) {
    if (jb->parts) {
        td_jobs_parts_release(j, jb);
        return;
    }
    j->runner.used_slots -= td_jobs_slots(jb);
    td_runner_give_back_gpus(&j->runner, jb->devices, td_jobs_slots(jb));
    free(jb->devices);
    jb->devices = NULL;
    jb->active = false;
}

void td_jobs_parts_release(td_jobs *j, job *jb) {
    json_decref(jb->last_placement);
    jb->last_placement = td_jobs_placement_json(jb); /* shown after the attempt too */
    for (int i = 0; i < jb->n_parts; i++)
        if (jb->parts[i].local) j->runner.used_slots -= td_jobs_slots(jb);
    for (int i = 0; i < jb->n_parts; i++) free(jb->parts[i].proc_devices);
    free(jb->parts);
    jb->parts = NULL;
    jb->n_parts = 0;
    json_decref(jb->resume_order);
    jb->resume_order = NULL;
    jb->active = false;
    memset(&jb->end, 0, sizeof jb->end);
}
