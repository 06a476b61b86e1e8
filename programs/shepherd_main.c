/* traind-shepherd: owns one attempt's processes on one node, so that they outlive the daemon
 * that asked for them (a crash, kill -9, a restart, a package upgrade) and no process of a job
 * outlives the job.
 *
 *   traind-shepherd SPEC.json
 *
 * What it exchanges with the daemon (the spec, the control socket's lines, the files it writes,
 * how a daemon attaches again) is service/run/td_shepherd_protocol.h's. The shepherd:
 *   - starts the group in a process group of its own and reaps it (a child subreaper: what the
 *     ranks leave behind is reaped here too), with td_group's rules: the first failure stops
 *     the rest, SIGTERM then SIGKILL after the grace period (shepherd_group.c,
 *     shepherd_supervise.c);
 *   - answers one daemon at a time on its Unix socket, and stops the group when asked, when the
 *     deadline passes, or when no daemon has been connected for the orphan limit (a removed
 *     daemon leaves nothing running for ever) (shepherd_control.c, shepherd_supervise.c);
 *   - is told by its daemon of a first connection already made ("daemon_fd": a socketpair's
 *     end) and of its control socket already listening ("listen_fd"), so that no daemon ever
 *     waits for a socket to appear; it ignores the spec's "daemon" member (the daemon's own
 *     notes about the attempt) (shepherd_spec.c);
 *   - appends rank 0's stdout to its log (logs[0]) as well as to the output file: the log
 *     holds each line once, whatever daemons come and go; every process's stderr (and stdout)
 *     reaches its log through a pipe to the shepherd too, so that a full disk loses no line:
 *     what a file cannot take waits in memory, in order, and goes in once it can
 *     (service/run/td_appender.h, shepherd_output.c);
 *   - when the group is over, writes the status file (JSON: exit code, failed rank, reason,
 *     why it was stopped) atomically, tells the connected daemon, and exits 0
 *     (shepherd_status.c).
 * Exit status: 0 once the status file is written, 2 for a spec it cannot use (said on stderr),
 * 1 when it could not start the group (the status file says so too). */
#define _GNU_SOURCE /* signalfd */
#include "programs/shepherd.h"

#include "base/td_clock.h"
#include "service/run/td_cgroup.h"
#include "service/run/td_shepherd.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <unistd.h>

/* The connection the starting daemon made, before any worker is started: none of them may
 * hold it. */
static void take_daemon_fd(shepherd *h) {
    if (h->s.daemon_fd >= 0) {
        if (fcntl(h->s.daemon_fd, F_SETFD, FD_CLOEXEC) != 0 ||
            fcntl(h->s.daemon_fd, F_SETFL, O_NONBLOCK) != 0)
            fprintf(stderr, "traind-shepherd: daemon_fd %d: %s (waiting for a daemon to connect)\n",
                    h->s.daemon_fd, strerror(errno));
        else
            h->daemon_fd = h->s.daemon_fd;
    }
}

/* Out of the daemon's process group and cgroup, and the reaper of what the ranks leave. */
static void leave_daemon(shepherd *h) {
    /* out of the daemon's process group: a terminal's ^C or the daemon's own group signals do
     * not reach the job. Not a session of its own: the kernel's autogroup scheduling gives each
     * session an equal share of the CPUs, so a job in its own would take as much as the daemon
     * and everything else in its session together, and its ranks would preempt the daemon's
     * API (the ranks' process group, td_launch's, is what signals go to) */
    if (setpgid(0, 0) != 0)
        fprintf(stderr, "traind-shepherd: setpgid: %s (still in its starter's process group)\n",
                strerror(errno));
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        fprintf(stderr, "traind-shepherd: prctl(PR_SET_CHILD_SUBREAPER): %s\n", strerror(errno));
    /* out of the daemon's cgroup, into the attempt's (the daemon's stays the daemon's, and a
     * stopped service's cgroup is not the job's to hold) */
    if (h->s.cgroup[0]) {
        char mine[PATH_MAX + 16];
        td_err cerr = {{0}};
        snprintf(mine, sizeof mine, "%s/shepherd", h->s.cgroup);
        if (td_cgroup_enter(mine, &cerr) != 0) fprintf(stderr, "traind-shepherd: %s\n", cerr.msg);
    }
}

/* Signals come through a signalfd, read in the loop. */
static void block_signals(shepherd *h) {
    sigset_t set;
    sigemptyset(&set);
    sigaddset(&set, SIGCHLD);
    sigaddset(&set, SIGTERM);
    sigaddset(&set, SIGINT);
    sigaddset(&set, SIGHUP);
    sigprocmask(SIG_BLOCK, &set, NULL);
    signal(SIGPIPE, SIG_IGN); /* a daemon gone mid-send; the workers get SIG_DFL back */
    signal(SIGCHLD, SIG_DFL); /* an ignored SIGCHLD from a starter would hide exits */
    h->sig_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
}

/* The control socket and the output file; a spec whose files cannot be had ends it here. */
static void open_files(shepherd *h) {
    /* the daemon's socket (bound before it wrote the spec: a daemon that comes back finds it
     * listening as long as this shepherd lives), or one of its own */
    td_err err = {{0}};
    h->listen_fd = h->s.listen_fd >= 0 && fcntl(h->s.listen_fd, F_SETFD, FD_CLOEXEC) == 0
                       ? h->s.listen_fd
                       : td_shepherd_listen(h->s.socket_path, &err);
    if (h->listen_fd < 0) fail_spec("%s", err.msg);
    fcntl(h->listen_fd, F_SETFL, O_NONBLOCK);
    if (h->sig_fd < 0 || h->listen_fd < 0)
        fail_spec("cannot set up (%s): %s", h->s.socket_path, strerror(errno));
    if (h->s.output[0] && td_appender_open(&h->out, h->s.output, OUT_WAIT_MAX, false, &err) != 0)
        fail_spec("%s", err.msg);
    /* the output file stops at max_log_bytes with a line the daemon shows as an event; the
     * logs rotate there (td_appender.h) */
    static char capped[256];
    snprintf(capped, sizeof capped,
             "{\"event\": \"" TD_EVENT_OUTPUT_CAPPED
             "\", \"reason\": \"rank 0's metric lines reached "
             "max_log_bytes (%lld bytes): the rest are in its log only\"}\n",
             h->s.max_log_bytes);
    if (h->s.output[0]) td_appender_limit(&h->out, h->s.max_log_bytes, false, capped);
}

/* The logs, their pipes and the group; start_error says what failed. The pipes' write ends are
 * the processes' now: closed here. */
static void start_processes(shepherd *h, int **err_fds, int **out_fds, char *start_error,
                            size_t len) {
    int pipefd[2] = {-1, -1};
    open_logs(h, err_fds, out_fds, pipefd, start_error, len);
    if (!start_error[0]) start_group(h, start_error, len);
    if (pipefd[1] >= 0) close(pipefd[1]);
    for (int i = 0; i < h->procs; i++)
        if ((*err_fds)[i] >= 0) close((*err_fds)[i]);
    h->pipe_fd = pipefd[0];
    if (h->pipe_fd >= 0) fcntl(h->pipe_fd, F_SETFL, O_NONBLOCK);
}

/* The group is over: the rest of its output in, the status file written, the daemon told. */
static void finish(shepherd *h, const char *start_error) {
    /* what is left in the pipe; then it is closed, even if a process that left the group
     * (setsid) still holds it: the job is over */
    drain_pipes(h);
    for (int i = 0; i < h->procs; i++) {
        if (h->log_pipes[i] >= 0) close(h->log_pipes[i]);
        h->log_pipes[i] = -1;
    }
    if (h->pipe_fd >= 0) close(h->pipe_fd);
    h->pipe_fd = -1;
    /* rank 0's partial last lines, as they are, and its last scalars */
    if (h->procs > 0 && log0_teed(h)) {
        lines_to(&h->logs[0], &h->tee_line, NULL, 0, true);
        lines_to(&h->logs[0], &h->err_line, NULL, 0, true);
    }
    say_patterns_skipped(h);
    if (h->tboard) {
        shepherd_tboard_poll(h->tboard, &h->out);
        say_out(h);
        shepherd_tboard_free(h->tboard);
    }
    write_status(h, start_error[0] ? start_error : NULL);
    say(h, "%s", TD_SHEPHERD_OVER);
    unlink(h->s.socket_path);
    td_appender_close(&h->out);
    for (int i = 0; i < h->procs; i++) td_appender_close(&h->logs[i]);
}

int main(int argc, char **argv) {
    if (argc != 2 || argv[1][0] == '-') {
        fprintf(stderr, "usage: traind-shepherd SPEC.json (started by traind, one per attempt "
                        "and node)\n");
        return 2;
    }
    static shepherd h;
    h.daemon_fd = h.pipe_fd = h.pending_fd = h.out.fd = -1;
    read_spec(&h.s, argv[1]);
    take_daemon_fd(&h);
    leave_daemon(&h);
    block_signals(&h);
    open_files(&h);
    int *err_fds, *out_fds;
    char start_error[1024] = "";
    start_processes(&h, &err_fds, &out_fds, start_error, sizeof start_error);
    h.orphan_since = td_clock_now(); /* until the daemon connects */
    if (h.daemon_fd >= 0) {          /* the daemon that started it: already connected */
        h.orphan_since = 0;
        say_pids(&h);
        say_out(&h);
    }
    supervise(&h, start_error);
    finish(&h, start_error);
    free(h.logs);
    free(h.log_pipes);
    free(err_fds);
    free(out_fds);
    return start_error[0] ? 1 : 0;
}
