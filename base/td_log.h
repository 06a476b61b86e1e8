/* The daemon's log: one line per event on one stream (stderr, the journal under systemd), written
 * whole, whichever thread writes it (the supervisor, the HTTP threads, the cluster's sweeper and
 * the agent all log). Two formats: text, "traind: " and a sentence, for people and journalctl;
 * json, one object per line ({"time", "level", "msg"} and "job", "node", "rank" where they
 * apply), for log shippers. The format and the level can change while the daemon runs
 * (SIGHUP). */
#ifndef TD_LOG_H
#define TD_LOG_H

#include <stdbool.h>
#include <stdio.h>

/* NOTICE: the few lines that say what the daemon is (its slots, "listening on ...", stopping,
 * a reload's summary), written whatever the level: scripts and people wait for them. */
typedef enum {
    TD_LOG_ERROR,
    TD_LOG_WARNING,
    TD_LOG_NOTICE,
    TD_LOG_INFO,
    TD_LOG_DEBUG
} td_log_level;

typedef struct td_log td_log;

/* A log writing to stream (not closed by td_log_close); NULL when out of memory. */
td_log *td_log_open(FILE *stream, bool json, td_log_level level);
void td_log_close(td_log *lg);
/* Takes effect for the next line; safe from any thread. */
void td_log_configure(td_log *lg, bool json, td_log_level level);
/* "error", "warning", "notice", "info", "debug"; false for anything else. */
bool td_log_level_parse(const char *name, td_log_level *out);

/* Where a line belongs: job 0, node NULL and rank -1 are "none". */
typedef struct td_log_where {
    long job;
    const char *node;
    int rank;
} td_log_where;

/* One line at `level` (dropped when above the configured level, or when lg is NULL). */
void td_log_at(td_log *lg, td_log_level level, td_log_where where, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* The usual shapes. */
#define TD_LOG_NOWHERE         ((td_log_where){0, NULL, -1})
#define TD_LOG_JOB(id)         ((td_log_where){(id), NULL, -1})
#define TD_LOG_NODE(name)      ((td_log_where){0, (name), -1})
#define TD_LOG_JOB_NODE(id, n) ((td_log_where){(id), (n), -1})
#define td_log_info(lg, ...)   td_log_at((lg), TD_LOG_INFO, TD_LOG_NOWHERE, __VA_ARGS__)
#define td_log_notice(lg, ...) td_log_at((lg), TD_LOG_NOTICE, TD_LOG_NOWHERE, __VA_ARGS__)
#define td_log_warn(lg, ...)   td_log_at((lg), TD_LOG_WARNING, TD_LOG_NOWHERE, __VA_ARGS__)
#define td_log_error(lg, ...)  td_log_at((lg), TD_LOG_ERROR, TD_LOG_NOWHERE, __VA_ARGS__)

#endif
