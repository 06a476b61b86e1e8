/* The jobs in figures, for others to show: which process holds each GPU and the slots used (the
 * cluster's node listing, heartbeats) and the jobs' Prometheus series (GET /metrics). Apart from
 * the API on single jobs (td_jobs.c): these read every live job at once. */
#include "service/jobs/td_jobs_private.h"

#include <string.h>

json_t *td_jobs_gpu_users(td_jobs *j) {
    json_t *users = json_object();
    td_jobs_lock(j);
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        if (!jb->active) continue;
        json_t *pl = td_jobs_placement_json(jb), *nd, *pr;
        size_t a, b;
        json_array_foreach(json_object_get(pl, "nodes"), a, nd) {
            const char *name = json_string_value(json_object_get(nd, "node"));
            const char *state = json_string_value(json_object_get(nd, "state"));
            if (state && strcmp(state, "ended") == 0) continue; /* its GPUs are free again */
            json_t *mine = json_object_get(users, name ? name : "");
            if (!mine) json_object_set_new(users, name ? name : "", mine = json_object());
            json_array_foreach(json_object_get(nd, "processes"), b, pr) {
                const char *d = json_string_value(json_object_get(pr, "devices"));
                int k = 0, per = td_jobs_slots(jb) / td_jobs_procs(jb);
                for (; d && *d; d += strcspn(d, ",") + (d[strcspn(d, ",")] == ','), k++) {
                    /* where every process sees all, the b-th holds the b-th share of them */
                    if (jb->see_all_gpus && k / per != (int)b) continue;
                    char key[16];
                    snprintf(key, sizeof key, "%.*s", (int)strcspn(d, ","), d);
                    json_object_set_new(mine, key,
                                        json_pack("{s:I, s:O}", "job", (json_int_t)jb->row.id,
                                                  "ranks", json_object_get(pr, "ranks")));
                }
            }
        }
        json_decref(pl);
    }
    pthread_mutex_unlock(&j->mu);
    return users;
}

/* A job's labels: its id and name, escaped as the format wants. */
static void job_labels(td_buf *out, const job *jb) {
    td_buf_printf(out, "{job=\"%ld\",name=\"", jb->row.id);
    td_buf_label_value(out, jb->row.name);
    td_buf_puts(out, "\"}");
}

/* A running job's figure from its latest train line, when it has that member as a number. */
static void job_gauge(td_buf *out, const job *jb, const char *metric, const char *member) {
    json_t *v = json_object_get(jb->latest_train, member);
    if (!json_is_number(v)) return;
    td_buf_puts(out, metric);
    job_labels(out, jb);
    td_buf_printf(out, " %.9g\n", json_number_value(v));
}

void td_jobs_prometheus(td_jobs *j, double now, td_buf *out) {
    td_jobs_lock(j);
    int by_state[N_STATES] = {0}, queued = 0;
    double oldest = 0;
    for (int i = 0; i < j->n_jobs; i++) {
        const job *jb = j->jobs[i];
        by_state[jb->state]++;
        if (jb->state == QUEUED) {
            queued++;
            if (jb->row.created_at > 0 && now - jb->row.created_at > oldest)
                oldest = now - jb->row.created_at;
        }
    }
    td_buf_puts(out, "# HELP traind_jobs Jobs by state.\n# TYPE traind_jobs gauge\n");
    for (int s = 0; s < N_STATES; s++)
        td_buf_printf(out, "traind_jobs{state=\"%s\"} %d\n", td_jobs_state_names[s], by_state[s]);
    td_buf_printf(out,
                  "# HELP traind_queue_length Jobs waiting to start.\n"
                  "# TYPE traind_queue_length gauge\ntraind_queue_length %d\n"
                  "# HELP traind_queue_oldest_wait_seconds How long the longest-waiting job has "
                  "waited (0: none waits).\n# TYPE traind_queue_oldest_wait_seconds gauge\n"
                  "traind_queue_oldest_wait_seconds %.3f\n"
                  "# HELP traind_job_restarts_total Attempts restarted since this daemon "
                  "started (a counter: deleting a job does not lower it).\n"
                  "# TYPE traind_job_restarts_total counter\ntraind_job_restarts_total %lld\n"
                  "# HELP traind_jobs_expired_total Finished jobs removed by retention "
                  "(keep_finished_for_s, keep_finished_jobs) since this daemon started.\n"
                  "# TYPE traind_jobs_expired_total counter\ntraind_jobs_expired_total %lld\n",
                  queued, oldest, j->restarts_total, j->expired_total);
    static const char *const GAUGES[][3] = {
        {"traind_job_step", "step", "The step of a running job's latest metric."},
        {"traind_job_loss", "loss", "A running job's latest training loss."},
        {"traind_job_samples_per_second", "samples_per_s",
         "A running job's training throughput (its latest train line)."}};
    for (int g = 0; g < 3; g++) {
        td_buf_printf(out, "# HELP %s %s\n# TYPE %s gauge\n", GAUGES[g][0], GAUGES[g][2],
                      GAUGES[g][0]);
        for (int i = 0; i < j->n_live; i++) {
            const job *jb = j->live[i];
            if (jb->state != RUNNING) continue;
            if (g == 0) {
                td_buf_puts(out, GAUGES[g][0]);
                job_labels(out, jb);
                td_buf_printf(out, " %ld\n", jb->last_step);
            } else {
                job_gauge(out, jb, GAUGES[g][0], GAUGES[g][1]);
            }
        }
    }
    td_buf_puts(out, "# HELP traind_job_last_metric_age_seconds Since a running job's latest "
                     "metric arrived.\n# TYPE traind_job_last_metric_age_seconds gauge\n");
    for (int i = 0; i < j->n_live; i++) {
        const job *jb = j->live[i];
        if (jb->state != RUNNING || jb->last_metric_at <= 0) continue;
        td_buf_puts(out, "traind_job_last_metric_age_seconds");
        job_labels(out, jb);
        td_buf_printf(out, " %.3f\n", now - jb->last_metric_at);
    }
    pthread_mutex_unlock(&j->mu);
}

int td_jobs_slots_used(td_jobs *j) {
    td_jobs_lock(j);
    int used = j->runner.used_slots;
    pthread_mutex_unlock(&j->mu);
    return used;
}
