/* Time, read one way everywhere: deadlines and durations from the monotonic clock (it never
 * jumps when the wall clock is set), records from the wall clock. */
#ifndef TD_CLOCK_H
#define TD_CLOCK_H

#include <stddef.h>
#include <time.h>

/* CLOCK_MONOTONIC in seconds: for deadlines, timeouts and rates. */
double td_clock_now(void);
/* CLOCK_REALTIME in seconds since 1970: for what is recorded and shown (job times). */
double td_clock_wall(void);
/* The CLOCK_MONOTONIC time s seconds from now, for pthread_cond_timedwait on a condition
 * variable set to that clock. */
void td_clock_deadline(struct timespec *ts, double s);
/* A wall-clock time as the API shows it: ISO 8601 in UTC with milliseconds
 * ("2026-11-29T10:04:05.123Z"); len >= 32. */
void td_clock_format(double t, char *out, size_t len);

#endif
