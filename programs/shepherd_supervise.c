/* traind-shepherd's loop: it watches the signals, the control socket and the pipes, reaps the
 * group's processes (and whatever they leave behind: it is a child subreaper), and runs the
 * timers that stop the group (the job's deadline, and the orphan timer: no daemon connected
 * for orphan_timeout_s). Apart from what each of those does (shepherd_control.c,
 * shepherd_output.c, shepherd_group.c): this is only when. */
#define _GNU_SOURCE /* strsignal */
#include "programs/shepherd.h"

#include "base/td_clock.h"
#include "base/td_error.h"

#include <errno.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/signalfd.h>
#include <sys/wait.h>
#include <unistd.h>

/* A signal to the shepherd stops the group; SIGCHLD only wakes the loop to reap. */
static void read_signals(shepherd *h) {
    struct signalfd_siginfo si;
    while (read(h->sig_fd, &si, sizeof si) == (ssize_t)sizeof si)
        if (si.ssi_signo != SIGCHLD) {
            char why[64];
            snprintf(why, sizeof why, "the shepherd got signal %d (%s)", (int)si.ssi_signo,
                     strsignal((int)si.ssi_signo));
            stop_group(h, "signal", SIGTERM, h->s.launch.grace_s, why);
        }
}

/* Every process that ended: the group's, and what its ranks left behind. */
static void reap(shepherd *h) {
    for (;;) {
        int status;
        pid_t pid = waitpid(-1, &status, WNOHANG);
        if (pid <= 0) break;
        td_group_reaped(&h->g, pid, status, h->s.launch.grace_s);
    }
}

/* What comes with time: rank 0's SummaryWriter files (every 2 s), the job's deadline, and the
 * orphan timer (a removed daemon leaves nothing running for ever). */
static void tick(shepherd *h) {
    double now = td_clock_now();
    if (h->tboard && now >= h->tboard_next) {
        long long before = h->out.size;
        shepherd_tboard_poll(h->tboard, &h->out);
        if (h->out.size != before) say_out(h);
        h->tboard_next = now + 2;
    }
    if (h->s.deadline > 0 && td_clock_wall() >= h->s.deadline) {
        char why[96];
        snprintf(why, sizeof why, "the job reached its time limit");
        stop_group(h, "deadline", SIGTERM, h->s.launch.grace_s, why);
    }
    if (h->daemon_fd < 0 && h->orphan_since > 0 && now - h->orphan_since >= h->s.orphan_s) {
        char why[128];
        snprintf(why, sizeof why, "no traind was connected for %.0f s (orphan_timeout_s)",
                 h->s.orphan_s);
        stop_group(h, "orphaned", SIGTERM, h->s.launch.grace_s, why);
    }
}

void supervise(shepherd *h, const char *start_error) {
    int procs = h->procs;
    struct pollfd *fds = td_calloc((size_t)procs + 5, sizeof *fds);
    while (!start_error[0] || h->g.alive > 0) {
        int watched[5] = {h->sig_fd, h->listen_fd, h->daemon_fd, h->pipe_fd, h->pending_fd};
        for (int i = 0; i < 5 + procs; i++)
            fds[i] = (struct pollfd){i < 5 ? watched[i] : h->log_pipes[i - 5], POLLIN, 0};
        bool ticking = h->g.terminating || h->g.lingering || h->s.deadline > 0 || h->daemon_fd < 0;
        if (poll(fds, (nfds_t)procs + 5, ticking ? 100 : 1000) < 0 && errno != EINTR) {
            /* the group goes on; the loop must not end as if it were over */
            fprintf(stderr, "traind-shepherd: poll: %s\n", strerror(errno));
            continue;
        }
        flush_waiting(h); /* tried again every turn, at least every second */
        if (fds[3].revents) pump(h);
        for (int i = 0; i < procs; i++)
            if (fds[5 + i].revents && h->log_pipes[i] >= 0) pump_log(h, i);
        if (fds[2].revents && h->daemon_fd >= 0) read_daemon(h);
        if (fds[4].revents && h->pending_fd >= 0) read_pending(h);
        if (fds[1].revents) accept_daemon(h);
        if (fds[0].revents) read_signals(h);
        reap(h);
        /* the failed process's last words into its log before the failure is said: a master
         * reads them there for the job's reason (they were in the pipe when it was reaped) */
        if (h->g.first_failure != 0 && !h->failure_said) drain_pipes(h);
        say_failure(h);
        if (start_error[0]) continue;
        tick(h);
        td_group_tick(&h->g);
        if (td_group_over(&h->g)) break;
    }
    free(fds);
}
