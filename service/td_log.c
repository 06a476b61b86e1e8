#include "service/td_log.h"

#include <stdarg.h>

void td_log_line(FILE *log, const char *fmt, ...) {
    if (!log) return;
    va_list ap;
    va_start(ap, fmt);
    flockfile(log); /* the stdio lock, held across the three writes */
    fputs("traind: ", log);
    vfprintf(log, fmt, ap);
    fputc('\n', log);
    fflush(log);
    funlockfile(log);
    va_end(ap);
}
