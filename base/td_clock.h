/* Time, read one way everywhere: deadlines and durations from the monotonic clock (it never
 * jumps when the wall clock is set), records from the wall clock. */
#ifndef TD_CLOCK_H
#define TD_CLOCK_H

#include <time.h>

/* CLOCK_MONOTONIC in seconds: for deadlines, timeouts and rates. */
double td_clock_now(void);
/* CLOCK_REALTIME in seconds since 1970: for what is recorded and shown (job times). */
double td_clock_wall(void);
/* The CLOCK_MONOTONIC time s seconds from now, for pthread_cond_timedwait on a condition
 * variable set to that clock. */
void td_clock_deadline(struct timespec *ts, double s);

#endif
