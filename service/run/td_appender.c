#include "service/run/td_appender.h"

#include "base/td_strv.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

int td_appender_open(td_appender *a, const char *path, size_t wait_max, bool note_drops,
                     td_err *err) {
    memset(a, 0, sizeof *a);
    a->fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    if (a->fd < 0) return td_fail(err, "cannot open %s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(a->fd, &st) == 0) a->size = (long long)st.st_size;
    a->path = td_str_dup(path);
    a->wait_max = wait_max;
    a->note_drops = note_drops;
    return 0;
}

/* How much of p went in before a failure (errno says why). */
static size_t write_some(int fd, const char *p, size_t n) {
    size_t done = 0;
    while (done < n) {
        ssize_t k = write(fd, p + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            if (k == 0) errno = ENOSPC; /* a regular file takes nothing only when it is full */
            break;
        }
        done += (size_t)k;
    }
    return done;
}

/* Writes what waits, then the note of what was dropped after it (logs); a failure is said once
 * an outage, and the recovery once, with what was dropped meanwhile. */
static void drain(td_appender *a) {
    for (;;) {
        if (!a->wait.len && a->dropped) {
            fprintf(stderr, "traind-shepherd: %s: written again; %lld bytes were dropped\n",
                    a->path, a->dropped);
            if (a->note_drops) /* the gap, where it is: the log's reader sees what is missing */
                td_buf_printf(&a->wait,
                              "\n[traind-shepherd: %lld bytes of this output were dropped here: "
                              "the filesystem was full and %zu bytes waited already]\n",
                              a->dropped, a->wait_max);
            a->dropped = 0;
            a->failing = false;
        }
        if (!a->wait.len) return;
        size_t done = write_some(a->fd, a->wait.data, a->wait.len);
        int e = errno;
        a->size += (long long)done;
        memmove(a->wait.data, a->wait.data + done, a->wait.len - done);
        a->wait.len -= done;
        a->wait.data[a->wait.len] = 0;
        if (a->wait.len) {
            if (e == ENOSPC || e == EDQUOT) a->ran_out = true;
            a->error = e;
            if (!a->failing)
                fprintf(stderr,
                        "traind-shepherd: %s: %s: what the file cannot take waits in memory "
                        "(up to %zu bytes) and is written once it can be\n",
                        a->path, strerror(e), a->wait_max);
            a->failing = true;
            return;
        }
        if (a->failing && !a->dropped) {
            fprintf(stderr, "traind-shepherd: %s: written again, nothing lost\n", a->path);
            a->failing = false;
        }
        a->error = 0;
    }
}

void td_appender_limit(td_appender *a, long long max_bytes, bool rotate, const char *marker) {
    a->max_bytes = max_bytes;
    a->rotate = rotate;
    a->cap_marker = marker;
}

/* Whether n more bytes may go in: a log past its bound is rotated first (renamed to PATH.1 and
 * begun again, with a line saying where the rest is); a file that does not rotate takes its
 * marker and nothing more. Only when nothing waits: rotation does not reorder what waits. */
static bool room_for(td_appender *a, size_t n) {
    if (a->max_bytes <= 0 || a->size + (long long)n <= a->max_bytes || a->size == 0) return true;
    if (a->capped) {
        a->capped_bytes += (long long)n;
        return false;
    }
    if (!a->rotate) {
        const char *m = a->cap_marker ? a->cap_marker : "[traind] this file reached its limit\n";
        a->size += (long long)write_some(a->fd, m, strlen(m));
        a->capped = true;
        a->capped_bytes += (long long)n;
        fprintf(stderr,
                "traind-shepherd: %s reached its limit of %lld bytes: nothing more goes in\n",
                a->path, a->max_bytes);
        return false;
    }
    char old[4200];
    snprintf(old, sizeof old, "%s.1", a->path);
    int fd = -1;
    if (rename(a->path, old) == 0)
        fd = open(a->path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0640);
    if (fd < 0) return true; /* it grows on: a log is not lost for want of a rename */
    close(a->fd);
    a->fd = fd;
    a->size = 0;
    char note[4400];
    int k = snprintf(note, sizeof note,
                     "[traind] this log reached max_log_bytes (%lld bytes) and was rotated: the "
                     "part before is in %s (what came before that is gone)\n",
                     a->max_bytes, old);
    a->size += (long long)write_some(a->fd, note, (size_t)k);
    return true;
}

bool td_appender_write(td_appender *a, const void *p, size_t n) {
    if (a->fd < 0) return true;
    if (n && !a->wait.len && !room_for(a, n)) return true;
    if (n && a->wait.len) {
        /* once something is dropped, everything is until what waits has gone in: the gap is
         * then one, at one place, and the note says where */
        if (a->dropped || a->wait.len + n > a->wait_max) {
            if (!a->dropped)
                fprintf(stderr,
                        "traind-shepherd: %s: %zu bytes wait for the disk already; more are "
                        "dropped and counted until they are written\n",
                        a->path, a->wait.len);
            a->dropped += (long long)n;
            a->dropped_total += (long long)n;
        } else {
            td_buf_append(&a->wait, p, n);
        }
        n = 0;
    }
    if (n) {
        size_t done = write_some(a->fd, p, n);
        a->size += (long long)done;
        if (done < n) td_buf_append(&a->wait, (const char *)p + done, n - done);
        /* the failure's errno is lost by the append; drain tries once more and says why */
    }
    drain(a);
    return a->wait.len == 0;
}

bool td_appender_flush(td_appender *a) {
    if (a->fd >= 0) drain(a);
    return a->wait.len == 0;
}

bool td_appender_pending(const td_appender *a) {
    return a->fd >= 0 && (a->wait.len > 0 || a->dropped > 0);
}

void td_appender_close(td_appender *a) {
    if (a->wait.len || a->dropped)
        fprintf(stderr, "traind-shepherd: %s: %zu bytes that waited for the disk are lost\n",
                a->path ? a->path : "?", a->wait.len + (size_t)a->dropped);
    if (a->fd >= 0) close(a->fd);
    a->fd = -1;
    free(a->path);
    a->path = NULL;
    td_buf_free(&a->wait);
}
