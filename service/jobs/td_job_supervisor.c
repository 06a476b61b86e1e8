/* The supervisor thread: one poll over the wake-up eventfd, the SIGCHLD signalfd and every running
 * job's stdout pipe; it reaps processes, enforces grace periods and time limits, and schedules.
 * The mutex is let go only while it waits. */
#define _GNU_SOURCE /* pipe2, signalfd */
#include "service/jobs/td_jobs_private.h"

#include "core/td_fault.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

/* The shepherds this daemon started are its children: their exits are collected here (what
 * ended is learnt from their connections and status files, td_jobs_shepherd_gone). */
static void reap(void) {
    for (;;) {
        int status;
        if (waitpid(-1, &status, WNOHANG) <= 0) return;
    }
}

/* A local job's stop, when one is due (a cancel, its quota, its experiment's pause, its time
 * limit, the daemon stopping its jobs), and its end once its shepherd has gone. */
static void stop_if_due(td_jobs *j, job *jb) {
    double limit = td_jobs_deadline(jb);
    if (limit > 0 && !jb->timed_out && !jb->cancel_requested && td_clock_wall() >= limit) {
        jb->timed_out = true;
        td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                  "job %ld reached its time limit of %g s: stopping it", jb->row.id,
                  jb->row.time_limit_s);
    }
    char quota_stop[sizeof jb->quota_reason + 16];
    snprintf(quota_stop, sizeof quota_stop, TD_RUNNER_STOP_QUOTA "%s", jb->quota_reason);
    if (jb->cancel_requested && !jb->sh.stop_sent)
        td_shepherd_stop(&jb->sh, SIGTERM, j->cfg.runner.grace_s,
                         TD_RUNNER_STOP_CANCEL "cancelled by request");
    else if (jb->over_quota && !jb->sh.stop_sent)
        td_shepherd_stop(&jb->sh, SIGTERM, j->cfg.runner.grace_s, quota_stop);
    else if (jb->hold_requested && !jb->sh.stop_sent)
        td_shepherd_stop(&jb->sh, SIGTERM, j->cfg.runner.grace_s,
                         TD_RUNNER_STOP_HOLD "its experiment was paused");
    else if (jb->timed_out && !jb->sh.stop_sent)
        td_shepherd_stop(&jb->sh, SIGTERM, j->cfg.runner.grace_s,
                         TD_RUNNER_STOP_TIME_LIMIT "the job reached its time limit");
    else if (j->stopping_jobs && !jb->sh.stop_sent) /* connected again meanwhile */
        td_shepherd_stop(&jb->sh, SIGTERM, j->cfg.runner.grace_s, TD_RUNNER_STOP_DAEMON_WORDS);
    if (jb->sh.fd < 0) td_jobs_shepherd_gone(j, jb);
}

void *td_jobs_supervise(void *arg) {
    td_jobs *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stopping) {
        td_jobs_live_compact(j);
        if (!j->stopping_jobs) td_jobs_schedule(j); /* nothing new while the jobs stop */
        /* sized by the running jobs, not all of them: the arrays are on the stack, and a daemon
         * keeps a hundred thousand finished jobs */
        int n = 0, n_active = 0;
        for (int i = 0; i < j->n_live; i++) n_active += j->live[i]->active;
        int max = 2 + n_active + j->node.n_parts;
        struct pollfd fds[max];
        job *owner[max];
        td_node_part *part_owner[max];
        fds[n++] = (struct pollfd){j->wake_fd, POLLIN, 0};
        fds[n++] = (struct pollfd){j->sig_fd, POLLIN, 0};
        bool ticking = false, due = false, behind = false;
        double now = td_clock_wall(), next_limit = 0;
        for (int i = 0; i < j->n_live; i++) {
            job *jb = j->live[i];
            if (!jb->active) continue;
            double limit = td_jobs_deadline(jb);
            if (limit > 0 && !jb->timed_out && (next_limit == 0 || limit < next_limit))
                next_limit = limit;
            if (!jb->parts && jb->sh.fd >= 0)
                owner[n] = jb, fds[n++] = (struct pollfd){jb->sh.fd, POLLIN, 0};
            else if (!jb->parts && !jb->left)
                due = true; /* its shepherd ended while no daemon ran: handled below at once */
            behind |= jb->out_behind;     /* its output is read a slice a turn */
            ticking |= jb->parts != NULL; /* the master's own parts sync every turn */
        }
        int first_part = n;
        for (int i = 0; i < n; i++) part_owner[i] = NULL;
        td_node_parts_poll(&j->node, fds, &n, max, part_owner);
        for (int i = first_part; i < n; i++) owner[i] = NULL;
        /* time limits are the only things without a file descriptor to wake us (a shepherd
         * keeps its group's grace periods) */
        /* a job read a slice at a time: on at once (those waiting for the lock first) */
        int timeout_ms = due || behind ? 0 : ticking ? 100 : -1;
        if (next_limit > 0) {
            double ms = (next_limit - now) * 1000.0 + 1.0;
            int until = ms < 0 ? 0 : ms > 60000 ? 60000 : (int)ms;
            if (timeout_ms < 0 || until < timeout_ms) timeout_ms = until;
        }
        for (int i = 0; i < j->n_live; i++) /* events the database refused: tried every second */
            if (j->live[i]->n_pending > 0 && (timeout_ms < 0 || timeout_ms > 1000))
                timeout_ms = 1000;
        if (j->runner.n_cg_ended > 0 && (timeout_ms < 0 || timeout_ms > 1000)) timeout_ms = 1000;
        if (j->cfg.on_turn && j->cfg.turn_every_s > 0) {
            int every = (int)(j->cfg.turn_every_s * 1000.0);
            if (every < 1) every = 1;
            if (timeout_ms < 0 || every < timeout_ms) timeout_ms = every;
        }
        pthread_mutex_unlock(&j->mu);
        /* without the mutex: the ping is a blocking send, and a hang here (the fault point)
         * leaves the API answering while only the watchdog can tell */
        td_fault_hang_at(TD_FAULT_SUPERVISOR);
        if (j->cfg.on_turn) j->cfg.on_turn(j->cfg.turn_ctx);
        int rc = poll(fds, (nfds_t)n, timeout_ms);
        /* whoever waits for the lock has it first (5 ms at most): a job printing as fast as
         * it can keeps the supervisor turning without a pause */
        for (int spins = 0; atomic_load(&j->waiting) > 0 && spins < 50; spins++) usleep(100);
        pthread_mutex_lock(&j->mu);
        if (rc < 0 && errno != EINTR) {
            td_log_at(j->log, TD_LOG_WARNING, TD_LOG_NOWHERE, "poll: %s", strerror(errno));
            continue;
        }
        if (fds[0].revents) {
            uint64_t v;
            (void)!read(j->wake_fd, &v, sizeof v);
        }
        if (fds[1].revents) {
            struct signalfd_siginfo si;
            while (read(j->sig_fd, &si, sizeof si) == (ssize_t)sizeof si) {
            }
        }
        reap();
        for (int i = 2; i < first_part; i++) {
            job *jb = owner[i];
            if ((!fds[i].revents && !jb->out_behind) || jb->sh.fd < 0) continue;
            if (fds[i].revents) td_shepherd_read(&jb->sh);
            if (jb->sh.pgid > 0) jb->row.pgid = jb->sh.pgid;
            if (jb->sh.fd >= 0) td_jobs_read_output(j, jb, false, 0);
        }
        for (int i = first_part; i < n; i++) {
            td_node_part *g = part_owner[i];
            bool still = false; /* a part may have been forgotten by now */
            for (int k = 0; k < j->node.n_parts; k++) still |= j->node.parts[k] == g;
            if (fds[i].revents && still && g->sh.fd >= 0) td_node_parts_read(&j->node, g);
        }
        for (int i = 0; i < j->n_live; i++) {
            job *jb = j->live[i];
            if (jb->n_pending == 0 || !td_jobs_store_pending(j, jb)) continue;
            if (jb->active && jb->sh.fd >= 0) td_jobs_read_output(j, jb, false, 0); /* on */
        }
        td_node_parts_tick(&j->node, j->stopping_jobs);
        td_jobs_parts_tick(j);
        td_runner_cgroups_tidy(&j->runner);
        for (int i = 0; i < j->n_live; i++) {
            job *jb = j->live[i];
            if (jb->active && !jb->parts && !jb->left) stop_if_due(j, jb);
        }
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}
