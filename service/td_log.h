/* The daemon's log lines: "traind: " and one message, written whole. The supervisor, the HTTP
 * threads, the cluster's sweeper and the agent all write to the same stream (stderr, the
 * journal under systemd), and a line built from several fprintf calls could otherwise be cut in
 * two by another thread's. */
#ifndef TD_LOG_H
#define TD_LOG_H

#include <stdio.h>

/* One line on log (nothing when log is NULL); the newline is added. */
void td_log_line(FILE *log, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
