/* traind-shepherd's pipes: every process's output into its log, and rank 0's stdout into the
 * output file the daemon reads (its metric lines only) as well as its log, through appenders
 * that wait out a full disk. Apart from the control socket and the group: this is where the
 * job's bytes go, in order, none lost. */
#define _GNU_SOURCE /* pipe2 */
#include "programs/shepherd.h"

#include "base/td_error.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

/* The end of the last whole line in p[0, n): after its '\n', or its '\r' (a progress bar
 * redrawing its line); 0: none. */
static size_t whole_lines(const char *p, size_t n) {
    while (n > 0 && p[n - 1] != '\n' && p[n - 1] != '\r') n--;
    return n;
}

/* Whole lines of p into log (a line without its end waits in partial, up to 64 KiB: past that
 * it goes as it is); end: the pipe's end, the rest goes as it is. */
void lines_to(td_appender *log, td_buf *partial, const char *p, size_t n, bool end) {
    if (n) td_buf_append(partial, p, n);
    size_t whole = end ? partial->len : whole_lines(partial->data, partial->len);
    if (!whole && partial->len > 65536) whole = partial->len;
    if (!whole) return;
    td_appender_write(log, partial->data, whole);
    memmove(partial->data, partial->data + whole, partial->len - whole);
    partial->len -= whole;
}

/* The lines of p that may be metric lines (a JSON object: '{' first, after blanks) into the
 * output file the daemon reads, and those a metric pattern matches as the metric lines they make;
 * the rest (a script's text, a progress bar) is in the log only, so a job printing text makes
 * the daemon read nothing. end: the stream's end (its last partial line is judged as it is). */
static void metric_lines(td_appender *out, td_metric_patterns *patterns, td_buf *partial,
                         const char *p, size_t n, bool end) {
    if (n) td_buf_append(partial, p, n);
    if (!partial->len) return; /* (nothing yet: no buffer either) */
    size_t from = 0;
    for (;;) {
        char *nl = memchr(partial->data + from, '\n', partial->len - from);
        size_t to = nl ? (size_t)(nl - partial->data) + 1 : end ? partial->len : from;
        if (to == from) break;
        size_t b = from;
        while (b < to && (partial->data[b] == ' ' || partial->data[b] == '\t')) b++;
        char *made;
        if (b < to && partial->data[b] == '{') {
            td_appender_write(out, partial->data + from, to - from);
        } else if (patterns &&
                   (made = td_metric_patterns_match(patterns, partial->data + from, to - from))) {
            td_appender_write(out, made, strlen(made));
            free(made);
        }
        from = to;
        if (!nl) break;
    }
    memmove(partial->data, partial->data + from, partial->len - from);
    partial->len -= from;
    if (partial->len > (1u << 20)) partial->len = 0; /* a runaway line: the log has it */
}

/* Whether rank 0's log takes its stdout too (teed by the shepherd): then it has two writers. */
bool log0_teed(const shepherd *h) {
    return h->out.fd >= 0;
}

/* Moves what rank 0 wrote to its stdout into the output file (and its log); at its end closes
 * the pipe. True when more may wait (it stopped at PUMP_READS). */
bool pump(shepherd *h) {
    char buf[65536];
    bool more = true;
    for (int reads = 0; reads < PUMP_READS && more; reads++) {
        ssize_t k = read(h->pipe_fd, buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && errno == EAGAIN) more = false;
        if (k < 0 && errno == EAGAIN) break;
        if (k <= 0) {
            close(h->pipe_fd);
            h->pipe_fd = -1;
            lines_to(&h->logs[0], &h->tee_line, NULL, 0, true);
            metric_lines(&h->out, h->s.patterns, &h->out_line, NULL, 0, true);
            more = false;
            break;
        }
        /* the log first: a line in the output file is one the daemon may already have
         * handled, and it should be in the log by then (unless the log waits for disk space
         * while the output file still took it) */
        lines_to(&h->logs[0], &h->tee_line, buf, (size_t)k, false);
        /* a full disk does not stop the job (its own checkpoint writes will say so): the
         * lines wait and go in once there is room */
        metric_lines(&h->out, h->s.patterns, &h->out_line, buf, (size_t)k, false);
    }
    say_out(h);
    return more;
}

/* Moves what process i wrote to its log pipe into its log; at its end closes the pipe. True when
 * more may wait. */
bool pump_log(shepherd *h, int i) {
    char buf[65536];
    bool teed = i == 0 && log0_teed(h);
    for (int reads = 0; reads < PUMP_READS; reads++) {
        ssize_t k = read(h->log_pipes[i], buf, sizeof buf);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) return false; /* EAGAIN: all read */
        if (k == 0) {
            close(h->log_pipes[i]);
            h->log_pipes[i] = -1;
            if (teed) lines_to(&h->logs[0], &h->err_line, NULL, 0, true);
            return false;
        }
        if (teed)
            lines_to(&h->logs[0], &h->err_line, buf, (size_t)k, false);
        else
            td_appender_write(&h->logs[i], buf, (size_t)k);
    }
    return true;
}

/* Everything the pipes hold now into the logs and the output file. */
void drain_pipes(shepherd *h) {
    while (h->pipe_fd >= 0 && pump(h)) {
    }
    for (int i = 0; i < h->procs; i++)
        while (h->log_pipes[i] >= 0 && pump_log(h, i)) {
        }
}

/* What waits for disk space, tried again (every turn of the loop). */
void flush_waiting(shepherd *h) {
    if (td_appender_pending(&h->out)) {
        long long before = h->out.size;
        td_appender_flush(&h->out);
        if (h->out.size != before) say_out(h);
    }
    for (int i = 0; i < h->procs; i++)
        if (td_appender_pending(&h->logs[i])) td_appender_flush(&h->logs[i]);
}

/* The lines metrics.patterns had no time for, in rank 0's log where the job's owner looks. */
void say_patterns_skipped(shepherd *h) {
    long n = td_metric_patterns_skipped(h->s.patterns);
    if (n <= 0 || h->procs < 1 || h->logs[0].fd < 0) return;
    char note[256];
    int k = snprintf(note, sizeof note,
                     "[traind] metrics.patterns: %ld lines were not matched: matching them took "
                     "more than a fifth of the time (simpler patterns, or fewer lines)\n",
                     n);
    td_appender_write(&h->logs[0], note, (size_t)k);
}

/* Every process's output reaches its log through a pipe to here, none through a file of
 * its own: on a full disk the shepherd keeps what the log cannot take and writes it once
 * it can, where a process writing the file itself would lose it. Rank 0's stdout has a
 * pipe of its own (the output file and its log); every other stdout shares its process's
 * stderr pipe, as it shared its log file, in the order written. One difference: writers
 * sharing a pipe (a rank and the children it started) keep a write whole only up to
 * PIPE_BUF (4 KiB), where O_APPEND on the file kept any write whole. */
void open_logs(shepherd *h, int **err_fds_out, int **out_fds_out, int pipefd[2], char *start_error,
               size_t len) {
    int procs = h->s.launch.launch_self ? 1 : h->s.launch.nproc_per_node;
    h->procs = procs;
    /* a log and a pipe's two ends a process while they start: room for them, as far as the
     * hard limit allows (a pipe that cannot be made says so below) */
    struct rlimit rl;
    rlim_t need = (rlim_t)procs * 3 + 64;
    if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < need) {
        rl.rlim_cur = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > need ? need : rl.rlim_max;
        (void)setrlimit(RLIMIT_NOFILE, &rl);
    }
    h->logs = td_calloc((size_t)procs, sizeof *h->logs);
    h->log_pipes = td_calloc((size_t)procs, sizeof(int));
    int *err_fds = td_calloc((size_t)procs, sizeof(int));
    int *out_fds = td_calloc((size_t)procs, sizeof(int));
    *err_fds_out = err_fds;
    *out_fds_out = out_fds;
    td_err err = {{0}};
    if (h->out.fd >= 0 && pipe2(pipefd, O_CLOEXEC) != 0)
        snprintf(start_error, len, "pipe: %s", strerror(errno));
    for (int i = 0; i < procs; i++) h->logs[i].fd = h->log_pipes[i] = err_fds[i] = -1;
    size_t log_wait = LOGS_WAIT_MAX / (size_t)procs;
    if (log_wait < (1u << 20)) log_wait = 1u << 20;
    for (int i = 0; i < procs && !start_error[0]; i++) {
        int p[2];
        bool opened = td_appender_open(&h->logs[i], h->s.logs[i], log_wait, true, &err) == 0;
        if (opened) td_appender_limit(&h->logs[i], h->s.max_log_bytes, true, NULL);
        if (!opened) {
            snprintf(start_error, len, "%s", err.msg);
        } else if (pipe2(p, O_CLOEXEC) != 0) {
            snprintf(start_error, len, "pipe: %s", strerror(errno));
        } else {
            h->log_pipes[i] = p[0];
            err_fds[i] = p[1];
            fcntl(p[0], F_SETFL, O_NONBLOCK);
        }
        out_fds[i] = i == 0 && h->out.fd >= 0 ? pipefd[1] : err_fds[i];
    }
    h->s.launch.stdout_fds = out_fds;
    h->s.launch.stderr_fds = err_fds;
}
