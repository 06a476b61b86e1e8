/* A file appended to that keeps in memory what the disk cannot take yet.
 *
 * The shepherd writes each process's log and rank 0's output file through one of these: a full
 * filesystem (ENOSPC, EDQUOT) or any other write error does not stop the job and loses nothing
 * while it lasts, up to wait_max bytes; the bytes wait, in order, and go in first once the file
 * takes them again (td_appender_flush, called by the owner's loop). Past wait_max, bytes are
 * dropped and counted until what waits has gone in; a log appender then writes a line there
 * saying how many, so a reader sees the one gap instead of silently missing lines. */
#ifndef TD_APPENDER_H
#define TD_APPENDER_H

#include "base/td_error.h"
#include "base/td_buf.h"

#include <stdbool.h>
#include <stddef.h>

typedef struct td_appender {
    int fd;            /* O_APPEND; -1: closed */
    char *path;        /* for messages */
    td_buf wait;       /* what the file did not take yet, oldest first */
    size_t wait_max;   /* the most that waits; beyond it, bytes are dropped */
    long long size;    /* the file's size: what went in */
    long long dropped; /* bytes dropped in this outage (not yet said, or noted in the file) */
    long long dropped_total;
    bool note_drops; /* write a line about dropped bytes into the file (logs, not data) */
    bool ran_out;    /* the filesystem was full (ENOSPC/EDQUOT) at some point */
    bool failing;    /* the last write failed (said once an outage, on stderr) */
    int error;       /* that write's errno; 0: none */
    /* a bound on the file (0: none): past it a log is rotated (PATH.1, the one before it gone),
     * anything else takes nothing more; either way a marker line says so */
    long long max_bytes;
    bool rotate;
    const char *cap_marker; /* the line written where a file that does not rotate stops */
    bool capped;            /* it stopped */
    long long capped_bytes; /* bytes it did not take since */
} td_appender;

/* Opens (creates, 0640) path for appending. */
int td_appender_open(td_appender *a, const char *path, size_t wait_max, bool note_drops,
                     td_err *err);

/* Bounds the file at max_bytes (td_appender.max_bytes); marker: a file that does not rotate
 * ends with this line (with its newline). */
void td_appender_limit(td_appender *a, long long max_bytes, bool rotate, const char *marker);

/* Appends p after whatever waits; what the file does not take waits. True when nothing waits. */
bool td_appender_write(td_appender *a, const void *p, size_t n);

/* Tries again what waits. True when nothing waits. */
bool td_appender_flush(td_appender *a);

/* True when bytes wait or a drop is not yet said. */
bool td_appender_pending(const td_appender *a);

/* Closes the file and frees what waits (the caller flushed first, or gives up on it). */
void td_appender_close(td_appender *a);

#endif
