/* Following an attempt this node runs, whichever way it was asked for: rank 0's output file read
 * by whole lines, as it grows and to its end; a failed rank's own words from its log; whether a
 * process group saved before a restart is still the attempt's. */
#include "service/run/td_runner.h"

#include "base/td_clock.h"
#include "base/td_error.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* The whole lines in line (the file read up to read_to) to fn; false when fn said to stop (what
 * follows stays in line for the next call). */
static bool hand_lines(td_buf *line, long long read_to, td_runner_line_fn fn, void *ctx) {
    char *start = line->data, *nl;
    bool go_on = true;
    while (go_on && line->len &&
           (nl = memchr(start, '\n', line->len - (size_t)(start - line->data)))) {
        *nl = 0;
        /* the offset just past this line: what remains in the buffer after it is unread */
        long long end = read_to - (long long)(line->len - (size_t)(nl + 1 - line->data));
        go_on = fn(ctx, start, (size_t)(nl - start), end);
        start = nl + 1;
    }
    size_t rest = line->len - (size_t)(start - line->data);
    if (line->len) memmove(line->data, start, rest);
    line->len = rest;
    if (line->data) line->data[rest] = 0;
    /* a runaway line: the log has it (the shepherd wrote it there); not the memory */
    if (go_on && rest > (1u << 20)) line->len = 0;
    return go_on;
}

bool td_runner_read_lines(int fd, long long *read_to, long long until, bool final, long long budget,
                          td_buf *line, td_runner_line_fn fn, void *ctx) {
    char buf[65536];
    if (final && until < 0) {
        struct stat st;
        until = fd >= 0 && fstat(fd, &st) == 0 ? (long long)st.st_size : *read_to;
    }
    /* what an earlier call left when it was told to stop, first */
    if (!hand_lines(line, *read_to, fn, ctx)) return true;
    long long stop = budget > 0 && until - *read_to > budget ? *read_to + budget : until;
    while (fd >= 0 && *read_to < stop) {
        size_t want =
            stop - *read_to < (long long)sizeof buf ? (size_t)(stop - *read_to) : sizeof buf;
        ssize_t k = pread(fd, buf, want, (off_t)*read_to);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) { /* shorter than said: a disk that filled up; what is there is read */
            stop = until = *read_to;
            break;
        }
        td_buf_append(line, buf, (size_t)k);
        *read_to += k;
        if (!hand_lines(line, *read_to, fn, ctx)) return true;
    }
    bool more = fd >= 0 && *read_to < until;
    if (final && !more && line->len) {
        fn(ctx, line->data, line->len, *read_to);
        line->len = 0;
    }
    return more;
}

void td_runner_rank_message(const char *dir, int rank, long long from, bool command, char *out,
                            size_t len) {
    static const char PREFIX[] = "traind-worker: error: ";
    out[0] = 0;
    if (rank < 0) return;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rank-%d.log", dir, rank);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return;
    }
    const long long cap = 1 << 20; /* the attempt's last MiB holds its end */
    long long size = (long long)st.st_size;
    if (size - from > cap) from = size - cap;
    if (size <= from) {
        close(fd);
        return;
    }
    char *text = td_malloc((size_t)(size - from) + 1);
    ssize_t got = pread(fd, text, (size_t)(size - from), (off_t)from);
    close(fd);
    text[got > 0 ? got : 0] = 0;
    const char *last = NULL;
    size_t last_len = 0;
    for (char *line = text, *next; *line; line = next) {
        char *nl = strchr(line, '\n');
        next = nl ? nl + 1 : line + strlen(line);
        size_t n = (size_t)(next - line) - (nl ? 1 : 0);
        while (n && (line[n - 1] == '\r' || line[n - 1] == ' ')) n--;
        if (n > sizeof PREFIX - 1 && strncmp(line, PREFIX, sizeof PREFIX - 1) == 0) {
            snprintf(out, len, "%.*s", (int)(n - (sizeof PREFIX - 1)), line + sizeof PREFIX - 1);
            free(text);
            return;
        }
        if (n && line[0] != '{') last = line, last_len = n;
    }
    if (last && command) snprintf(out, len, "%.*s", (int)last_len, last);
    free(text);
}

bool td_runner_group_of(pid_t pgid, const char *dir) {
    char link[64], cwd[PATH_MAX];
    snprintf(link, sizeof link, "/proc/%d/cwd", (int)pgid);
    ssize_t n = readlink(link, cwd, sizeof cwd - 1);
    if (n <= 0) return false;
    cwd[n] = 0;
    size_t len = strlen(dir);
    return strncmp(cwd, dir, len) == 0 && (cwd[len] == 0 || cwd[len] == '/');
}

bool td_runner_rate_admit(const td_runner *n, td_rate_bucket *b) {
    double rate = n->cfg->max_events_per_s;
    if (rate <= 0) return true;
    double now = td_clock_now(), burst = 10 * rate;
    if (b->at <= 0) b->tokens = burst; /* its first line */
    b->tokens += (now - b->at) * rate;
    if (b->tokens > burst) b->tokens = burst;
    b->at = now;
    if (b->tokens < 1) return false;
    b->tokens -= 1;
    return true;
}

int td_runner_open_output(td_log *log, long job_id, const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 && errno != ENOENT) /* absent: nothing written yet (or never started) */
        td_log_at(log, TD_LOG_WARNING, TD_LOG_JOB(job_id), "job %ld: cannot read %s: %s", job_id,
                  path, strerror(errno));
    return fd;
}
