/* A job's TensorBoard event files: every number of its metric events (a train line's loss, lr and
 * samples_per_s; an eval line's val_loss and val_acc; any number a command job prints) becomes a
 * scalar of that name at the event's step, in JOB_DIR/tensorboard/, so that
 * `tensorboard --logdir` on the job's directory (or on GET /v1/jobs/{id}/tensorboard unpacked)
 * draws the same curves as GET /v1/jobs/{id}/metrics (less the done event, a summary that
 * repeats the last values). The events are written after the database
 * has them: a daemon killed in between loses a point from the file, never duplicates one. */
#include "service/jobs/td_jobs_private.h"

#include "service/run/td_tboard.h"

#include <string.h>
#include <sys/stat.h>

/* Members that place an event rather than measure anything. */
static bool placing(const char *key) {
    return strcmp(key, "step") == 0 || strcmp(key, "epoch") == 0 || strcmp(key, "time") == 0 ||
           strcmp(key, "rank") == 0;
}

void td_jobs_tboard_event(td_jobs *j, job *jb, json_t *event, long step) {
    if (!jb->tboard && !jb->tboard_failed) {
        char dir[PATH_MAX + 16];
        snprintf(dir, sizeof dir, "%s/tensorboard", jb->dir);
        td_err err = {{0}};
        struct stat st;
        /* the job's processes write in its directory: a link they put there must not aim the
         * daemon's writes elsewhere */
        if (lstat(dir, &st) == 0 && !S_ISDIR(st.st_mode)) {
            td_fail(&err, "%s is not a directory (a job's file or link is in the way)", dir);
        } else {
            /* named after the job's creation, not this start: a daemon that restarts appends
             * to the same file (after cutting off a record it was killed inside) */
            td_tboard_open(&jb->tboard, dir, j->node.name[0] ? j->node.name : "traind",
                           jb->row.created_at, &err);
        }
        if (!jb->tboard) {
            /* the job goes on without its event files; said once, not per line */
            td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id),
                      "job %ld: no TensorBoard event files: %s", jb->row.id, err.msg);
            jb->tboard_failed = true;
            return;
        }
    }
    if (!jb->tboard) return;
    double now = td_clock_wall();
    const char *key;
    json_t *v;
    json_object_foreach(event, key, v) {
        if (!json_is_number(v) || placing(key)) continue;
        td_err err = {{0}};
        if (td_tboard_scalar(jb->tboard, key, step, now, json_number_value(v), &err) != 0) {
            /* a full disk fails every line: said when it starts, and again after a success */
            if (!jb->tboard_warned)
                td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(jb->row.id),
                          "job %ld: TensorBoard event file: %s (its scalars are lost until "
                          "writing works again)",
                          jb->row.id, err.msg);
            jb->tboard_warned = true;
            return;
        }
        jb->tboard_warned = false;
    }
}

/* Closed, not synced: each record reached the file as it was written, and an fdatasync here
 * (under the jobs' mutex) could stall every request on a slow disk. */
void td_jobs_tboard_close(td_jobs *j, job *jb) {
    (void)j;
    td_tboard_close(jb->tboard);
    jb->tboard = NULL;
}
