#include "core/td_fault.h"

#include "base/td_error.h"
#include "base/td_parse.h"

#include <limits.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static pthread_once_t once = PTHREAD_ONCE_INIT;
static char armed_point[32]; /* a point of td_fault.h; "" while none is armed here */
static long armed_at;        /* the arrival that dies, from 1 */
static atomic_long arrivals;

static bool names(const char *text, size_t len, const char *point) {
    return len == strlen(point) && strncmp(text, point, len) == 0;
}

/* Reads TRAIND_FAULT once: POINT:N or POINT:RANK:N (RANK compared with this process's RANK). */
static void arm(void) {
    const char *v = getenv(TD_FAULT_ENV);
    if (!v || !*v) return;
    const char *c1 = strchr(v, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
    size_t len = c1 ? (size_t)(c1 - v) : 0;
    long rank = -1, n = 0;
    bool ok = names(v, len, TD_FAULT_CHECKPOINT) || names(v, len, TD_FAULT_ALLREDUCE) ||
              names(v, len, TD_FAULT_SUPERVISOR);
    if (ok && c2)
        ok = td_parse_long_n(c1 + 1, (size_t)(c2 - c1 - 1), 0, INT_MAX, &rank) &&
             td_parse_long(c2 + 1, 1, LONG_MAX, &n);
    else if (ok)
        ok = td_parse_long(c1 + 1, 1, LONG_MAX, &n);
    if (!ok)
        td_die(__FILE__, __LINE__, "TRAIND_FAULT does not parse",
               "write POINT:N or POINT:RANK:N with a POINT of core/td_fault.h, as checkpoint:2 "
               "or allreduce:1:7");
    if (rank >= 0) { /* only the process launched as that rank */
        const char *mine = getenv("RANK");
        long r;
        if (!mine || !td_parse_long(mine, 0, INT_MAX, &r) || r != rank) return;
    }
    memcpy(armed_point, v, len);
    armed_at = n;
}

/* Whether this arrival at point is the armed one. */
static bool reached(const char *point) {
    pthread_once(&once, arm);
    if (!armed_point[0] || strcmp(point, armed_point) != 0) return false;
    return atomic_fetch_add(&arrivals, 1) + 1 == armed_at;
}

void td_fault_at(const char *point) {
    if (reached(point)) raise(SIGKILL);
}

void td_fault_hang_at(const char *point) {
    if (!reached(point)) return;
    fprintf(stderr, "fault injection: %s: this thread hangs here (TRAIND_FAULT)\n", point);
    for (;;) pause();
}
