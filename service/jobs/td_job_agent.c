/* An agent's calls into the parts its node runs for its master (td_agent.c; the parts are
 * service/node/'s): each takes the jobs' lock, which guards the parts and the runner they share
 * with this node's own attempts, and wakes the supervisor where the parts changed, so that it
 * polls their shepherds. */
#include "service/jobs/td_jobs_private.h"

json_t *td_jobs_node_parts_report_locked(td_jobs *j) {
    td_jobs_lock(j);
    json_t *r = td_node_parts_report(&j->node, true);
    pthread_mutex_unlock(&j->mu);
    return r;
}

void td_jobs_node_parts_apply_locked(td_jobs *j, json_t *orders) {
    td_jobs_lock(j);
    td_node_parts_apply(&j->node, orders, true);
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j);
}

bool td_jobs_node_parts_next_upload(td_jobs *j, long *job_id, int *attempt, long *seq, char *path,
                                    size_t len, td_job_files *files) {
    td_jobs_lock(j);
    bool found = td_node_parts_next_upload(&j->node, job_id, attempt, seq, path, len, files);
    pthread_mutex_unlock(&j->mu);
    return found;
}

void td_jobs_node_parts_uploaded(td_jobs *j, long job_id, int attempt, long seq, json_t *files) {
    td_jobs_lock(j);
    td_node_parts_uploaded(&j->node, job_id, attempt, seq, files);
    pthread_mutex_unlock(&j->mu);
}

bool td_jobs_node_part_known(td_jobs *j, long job_id, int attempt) {
    td_jobs_lock(j);
    bool known = td_node_part_find(&j->node, job_id, attempt) != NULL;
    pthread_mutex_unlock(&j->mu);
    return known;
}

int td_jobs_order_files(td_jobs *j, long id, long uid, td_job_files *out, td_err *err) {
    td_jobs_lock(j);
    int rc = td_node_order_files(&j->node, id, uid, out, err);
    pthread_mutex_unlock(&j->mu);
    return rc;
}

bool td_jobs_node_parts_running(td_jobs *j) {
    td_jobs_lock(j);
    bool any = j->node.n_parts > 0;
    pthread_mutex_unlock(&j->mu);
    return any;
}

void td_jobs_node_parts_stop_all(td_jobs *j, const char *why) {
    td_jobs_lock(j);
    td_node_parts_stop_all(&j->node, why);
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j);
}
