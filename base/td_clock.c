#include "base/td_clock.h"

#include <stdio.h>

static double seconds(clockid_t clock) {
    struct timespec t;
    clock_gettime(clock, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

double td_clock_now(void) {
    return seconds(CLOCK_MONOTONIC);
}

double td_clock_wall(void) {
    return seconds(CLOCK_REALTIME);
}

void td_clock_deadline(struct timespec *ts, double s) {
    double t = seconds(CLOCK_MONOTONIC) + s;
    ts->tv_sec = (time_t)t;
    ts->tv_nsec = (long)((t - (double)ts->tv_sec) * 1e9);
}

void td_clock_format(double t, char *out, size_t len) {
    time_t s = (time_t)t;
    struct tm tm;
    gmtime_r(&s, &tm);
    size_t n = strftime(out, len, "%Y-%m-%dT%H:%M:%S", &tm);
    snprintf(out + n, len - n, ".%03dZ", (int)((t - (double)s) * 1000.0));
}
