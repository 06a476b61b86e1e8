/* The parts this node runs for its master (td_node.h says what a part is and how orders work):
 * the orders applied, each part followed to its shepherd's end, an order's files made ready. */
#define _GNU_SOURCE /* pipe2 */
#include "service/node/td_node_private.h"

#include "base/td_strv.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- applying orders ------------------------------------------------------------------------- */

static void stop_node_part(td_node_parts *np, td_node_part *g) {
    if (g->running && !g->stop) /* (without a connection now: td_node_parts_tick, later) */
        td_shepherd_stop(&g->sh, SIGTERM, np->runner->cfg->grace_s,
                         g->cut_off[0] ? g->cut_off : "the master stopped this part");
    g->stop = true;
}

void td_node_parts_apply(td_node_parts *np, json_t *orders, bool remote) {
    size_t n = json_is_array(orders) ? json_array_size(orders) : 0;
    bool wanted[np->n_parts + 1];
    for (int i = 0; i < np->n_parts; i++) wanted[i] = false;
    int before = np->n_parts;
    for (size_t k = 0; k < n; k++) {
        json_t *o = json_array_get(orders, k);
        long id = (long)json_integer_value(json_object_get(o, "job"));
        int attempt = td_node_order_int(o, "attempt");
        td_node_part *g = td_node_part_find(np, id, attempt);
        if (!g) {
            if (json_is_true(json_object_get(o, "stop"))) continue;
            /* an earlier attempt of the job still stopping here holds its slots and port */
            bool busy = false;
            for (int i = 0; i < np->n_parts; i++)
                busy |= np->parts[i]->job == id && np->parts[i]->running;
            if (!busy) td_node_part_start(np, o, remote);
            continue;
        }
        for (int i = 0; i < before; i++)
            if (np->parts[i] == g) wanted[i] = true;
        if (json_is_true(json_object_get(o, "stop"))) stop_node_part(np, g);
        /* the master has what it acknowledges: forget it */
        long acked = (long)json_integer_value(json_object_get(o, "acked_lines"));
        int drop = 0;
        /* (a checkpoint line is acknowledged only after its upload, or when a restarted daemon
         * read it again: the master has it either way) */
        while (drop < g->n_lines && g->lines[drop].seq < acked) drop++;
        for (int i = 0; i < drop; i++) {
            g->backlog_bytes -= (long long)strlen(g->lines[i].text);
            free(g->lines[i].text);
            free(g->lines[i].checkpoint);
            json_decref(g->lines[i].files);
        }
        if (drop > 0) /* lines is NULL before the first line */
            memmove(g->lines, g->lines + drop, (size_t)(g->n_lines - drop) * sizeof *g->lines);
        g->n_lines -= drop;
        json_t *logs = json_object_get(o, "acked_logs");
        for (int r = 0; r < g->procs && json_is_array(logs); r++) {
            json_t *v = json_array_get(logs, (size_t)r);
            if (json_is_integer(v)) g->log_sent[r] = (long long)json_integer_value(v);
        }
    }
    /* what the master no longer wants: stopped, and forgotten once it has ended */
    for (int i = 0; i < before; i++) {
        td_node_part *g = np->parts[i];
        if (!wanted[i]) {
            if (g->running) {
                if (!g->stop)
                    td_log_at(np->log, TD_LOG_INFO, TD_LOG_JOB(g->job),
                              "job %ld attempt %d is no longer this node's to run (the "
                              "master ended it or does not know it): stopping its processes",
                              g->job, g->attempt);
                stop_node_part(np, g);
            }
            if (!g->running) {
                td_shepherd_forget(g->sh.base); /* the master knows how it ended */
                td_runner_cgroup_ended(np->runner, g->cgroup);
                td_node_part_free(g);
                np->parts[i] = NULL;
            }
        }
    }
    int k = 0;
    for (int i = 0; i < np->n_parts; i++)
        if (np->parts[i]) np->parts[k++] = np->parts[i];
    np->n_parts = k;
}

/* An agent cut off from its master: nothing of its must train on (the master has ended those
 * attempts, or will); the parts are stopped and forgotten. */
void td_node_parts_stop_all(td_node_parts *np, const char *why) {
    for (int i = 0; i < np->n_parts; i++) {
        td_node_part *g = np->parts[i];
        if (g->running && !g->stop) {
            td_log_at(np->log, TD_LOG_WARNING, TD_LOG_JOB(g->job),
                      "job %ld attempt %d: stopping its processes here: %s", g->job, g->attempt,
                      why);
            stop_node_part(np, g);
            /* not the master's order: if the master still waits for this part, it failed */
            snprintf(g->cut_off, sizeof g->cut_off, "node %s: %s", np->name, why);
        }
    }
}

/* ---- the supervisor's side ------------------------------------------------------------------- */

void td_node_parts_poll(td_node_parts *np, struct pollfd *fds, int *n, int max,
                        td_node_part **owner) {
    for (int i = 0; i < np->n_parts && *n < max; i++)
        if (np->parts[i]->running && np->parts[i]->sh.fd >= 0) {
            owner[*n] = np->parts[i];
            fds[(*n)++] = (struct pollfd){np->parts[i]->sh.fd, POLLIN, 0};
        }
}

bool td_node_parts_connected(const td_node_parts *np) {
    for (int i = 0; i < np->n_parts; i++)
        if (np->parts[i]->running && np->parts[i]->sh.fd >= 0) return true;
    return false;
}

void td_node_parts_stop_for_exit(td_node_parts *np, const char *why) {
    for (int i = 0; i < np->n_parts; i++) {
        td_node_part *g = np->parts[i];
        if (!g->running) continue;
        g->sh.stop_sent = false; /* this stop's words are the ones that count */
        td_shepherd_stop(&g->sh, SIGTERM, np->runner->cfg->grace_s, why);
    }
}

/* Its shepherd's connection ended: the part is over (or the shepherd died, or dropped a slow
 * daemon: connected to again). */
static void node_part_gone(td_node_parts *np, td_node_part *g) {
    td_err err = {{0}};
    if (!g->sh.over) {
        td_shepherd again;
        if (td_shepherd_attach(&again, g->sh.base, &err) == 0) {
            /* a stop it was sent may be among what it dropped: td_node_parts_tick sends it
             * again (the shepherd keeps the first reason it got) */
            again.pid = g->sh.pid;
            g->sh = again;
            return;
        }
    }
    td_shepherd_end e;
    int rc = td_shepherd_end_read(g->sh.base, &e, &err);
    td_node_part_output(np, g, true, rc == 1 ? e.output_bytes : -1);
    if (g->out_fd >= 0) close(g->out_fd);
    g->out_fd = -1;
    char reason[sizeof g->reason] = "";
    int code;
    if (rc != 1) {
        /* what its processes left (they die with it); only a group still this part's: an id
         * from before a restart may be another's by now */
        if (g->sh.pgid > 0 && td_runner_group_of(g->sh.pgid, g->dir)) killpg(g->sh.pgid, SIGKILL);
        td_runner_cgroup_ended(np->runner, g->cgroup);
        char words[200];
        td_shepherd_last_words(g->sh.base, words, sizeof words);
        code = -1;
        snprintf(reason, sizeof reason,
                 "node %s: the shepherd of node rank %d ended without a "
                 "status%s%.200s",
                 np->name, g->node_rank, words[0] ? ": " : "", words);
    } else if (e.failed) {
        code = e.exit_code ? e.exit_code : 1;
        td_node_part_failure(np, g, e.failed_rank, e.reason, reason, sizeof reason);
    } else if (g->cut_off[0]) {
        code = 1;
        snprintf(reason, sizeof reason, "%s", g->cut_off);
    } else if (g->stop) {
        code = 0;                 /* the master's own stop */
    } else if (e.stopped_by[0]) { /* without the master's word: its daemon was away, or stops */
        code = e.exit_code ? e.exit_code : 1;
        const char *words = e.stop_reason;
        if (strncmp(words, TD_RUNNER_STOP_DAEMON, strlen(TD_RUNNER_STOP_DAEMON)) == 0)
            words += strlen(TD_RUNNER_STOP_DAEMON);
        snprintf(reason, sizeof reason, "node %s: node rank %d was stopped: %.300s", np->name,
                 g->node_rank, words);
    } else {
        code = e.exit_code;
    }
    g->sh.fd = -1;
    td_node_part_end(np, g, code, reason);
    td_log_at(np->log, TD_LOG_INFO, TD_LOG_JOB(g->job),
              "job %ld attempt %d: node rank %d ended here%s%s", g->job, g->attempt, g->node_rank,
              reason[0] ? ": " : "", reason);
    pthread_cond_broadcast(np->ended); /* a stopping daemon waits for its shepherds */
}

void td_node_parts_tick(td_node_parts *np, bool stopping_jobs) {
    for (int i = 0; i < np->n_parts; i++) {
        td_node_part *g = np->parts[i];
        if (g->running && g->sh.fd < 0) node_part_gone(np, g);
        /* a stop not sent (no connection then), or dropped with a connection since */
        if (!g->running || g->sh.fd < 0 || g->sh.stop_sent) continue;
        if (stopping_jobs)
            td_shepherd_stop(&g->sh, SIGTERM, np->runner->cfg->grace_s,
                             TD_RUNNER_STOP_DAEMON_WORDS);
        else if (g->stop)
            td_shepherd_stop(&g->sh, SIGTERM, np->runner->cfg->grace_s,
                             g->cut_off[0] ? g->cut_off : "the master stopped this part");
    }
}

/* ---- an order's files ------------------------------------------------------------------------ */

int td_node_order_files(td_node_parts *np, long id, long uid, td_job_files *out, td_err *err) {
    int rc = 0;
    if (!td_runner_uid_ok(np->runner, uid))
        rc = td_fail(err,
                     "the master gives job %ld uid %ld, which is not one of this node's "
                     "job_uids (give every node the same job_uids)",
                     id, uid);
    td_runner_files_for(np->runner, id, uid, out);
    char cwd[PATH_MAX + 16];
    if (rc == 0 && mkdir(out->dir, 0750) != 0 && errno != EEXIST)
        rc = td_fail(err, "cannot create %s: %s", out->dir, strerror(errno));
    if (rc == 0) rc = td_runner_work_dir(&out->who, out->dir, cwd, sizeof cwd, err);
    return rc;
}
