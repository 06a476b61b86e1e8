/* traind-shepherd's status file: how the attempt ended, written once as it exits, whole or
 * not at all, after the output it counts (a full disk is waited out). Apart from the rest: the
 * last thing the shepherd does, and the daemon's only account of an attempt whose shepherd it
 * never talked to again. Its members are service/run/td_shepherd_protocol.c's. */
#include "programs/shepherd.h"

#include "programs/shepherd_errors.h"

#include "service/run/td_shepherd_protocol.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <string.h>
#include <sys/statvfs.h>
#include <unistd.h>

/* Whether output waits for disk space (not for a file that fails otherwise). */
static bool waits_for_space(const shepherd *h) {
    for (int i = -1; i < h->procs; i++) {
        const td_appender *a = i < 0 ? &h->out : &h->logs[i];
        if (td_appender_pending(a) && (a->error == ENOSPC || a->error == EDQUOT)) return true;
    }
    return false;
}

/* The attempt's reason in words: why it could not start, or its first failure with the failed
 * rank's exception (torchrun's error file), and a full disk when there was one. */
static void status_reason(shepherd *h, const char *start_error, char *reason, size_t len) {
    snprintf(reason, len, "%s", start_error ? start_error : h->g.reason[0] ? h->g.reason : "");
    char jobdir[PATH_MAX];
    snprintf(jobdir, sizeof jobdir, "%s", h->s.status_path);
    if (strrchr(jobdir, '/')) *strrchr(jobdir, '/') = 0;
    struct statvfs vfs;
    bool full = h->out.ran_out || (statvfs(jobdir, &vfs) == 0 && vfs.f_bavail == 0);
    long long dropped = h->out.dropped_total;
    for (int i = 0; i < h->procs; i++) {
        full = full || h->logs[i].ran_out;
        dropped += h->logs[i].dropped_total;
    }
    if (!start_error)
        shepherd_errors_explain(&h->s.launch, h->s.attempt, &h->g, jobdir, reason, len);
    if (full && reason[0]) /* what failed may be a write the job could not make */
        snprintf(reason + strlen(reason), len - strlen(reason),
                 " (the filesystem of %s ran out of space while the job ran: No space left on "
                 "device%s)",
                 jobdir, dropped ? "; some output was dropped, see the logs" : "");
}

void write_status(shepherd *h, const char *start_error) {
    flush_waiting(h); /* a last try for what waited (the status write below waits too) */
    int code = start_error ? 1 : h->g.first_failure;
    if (!start_error && code == 0 && h->g.terminating) code = h->g.stop_status;
    char reason[sizeof h->g.reason + PATH_MAX + 128];
    status_reason(h, start_error, reason, sizeof reason);
    json_t *o = td_shepherd_status_json(&(td_shepherd_status){
        .attempt = h->s.attempt,
        .exit_code = code,
        .failed = start_error || h->g.first_failure != 0,
        .failed_rank = start_error ? -1 : h->g.failed_rank,
        .reason = reason,
        .stopped_by = h->stopped_by,
        .stop_reason = h->stop_reason,
        .grace_expired = h->g.grace_expired,
        .grace_note = h->g.grace_note,
    });
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", h->s.status_path);
    /* whole or absent: written aside, synced, renamed over. A full disk is waited out (an hour
     * at most): without its status, the daemon could only say the shepherd vanished */
    for (int tries = 0;; tries++) {
        /* the output and the logs first: output_bytes counts what is on disk, and the logs
         * hold the last words of the job's processes */
        if (tries) flush_waiting(h);
        bool ok = false, waiting = waits_for_space(h) && tries < 3600;
        int e = ENOSPC;
        if (!waiting) {
            if (h->out.fd >= 0 && fsync(h->out.fd) != 0)
                fprintf(stderr, "traind-shepherd: fsync %s: %s\n", h->s.output, strerror(errno));
            td_shepherd_status_output(o, h->out.size);
            FILE *f = fopen(tmp, "w");
            ok = f && json_dumpf(o, f, JSON_COMPACT) == 0 && fputc('\n', f) != EOF &&
                 fflush(f) == 0 && fsync(fileno(f)) == 0;
            e = errno;
            if (f) ok = fclose(f) == 0 && ok;
            if (!ok) e = errno ? errno : e;
        }
        if (ok && rename(tmp, h->s.status_path) == 0) break;
        if (!ok) unlink(tmp);
        bool no_space = e == ENOSPC || e == EDQUOT;
        if (tries == 0 || !no_space || tries == 3600)
            fprintf(stderr, "traind-shepherd: %s %s: %s%s\n",
                    waiting ? "the job's output waits for disk space before" : "cannot write",
                    h->s.status_path, strerror(e),
                    no_space && tries < 3600 ? " (tried again every second)" : "");
        if (!no_space || tries == 3600) break;
        sleep(1);
    }
    /* and the rename itself: the directory's entry */
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", h->s.status_path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd);
        close(dfd);
    }
    json_decref(o);
}
