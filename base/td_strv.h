/* NULL-terminated string vectors (argv, environments), as the launcher, the submission parser
 * and the job table all hold them. Allocation failure stops the process, as td_malloc does. */
#ifndef TD_STRV_H
#define TD_STRV_H

#include <stddef.h>

char *td_str_dup(const char *s);
/* n + 1 slots, all NULL. */
char **td_strv_new(int n);
void td_strv_free(char **v);
/* Replaces, in place, every byte that is not part of a whole UTF-8 character with '?': a text cut
 * at a byte count, or a log line of any bytes, becomes a string JSON can carry. */
void td_str_utf8_repair(char *s);
/* s for a log line or an audit record, into out (len bytes, always terminated): every control
 * character (C0, DEL and C1: a line break, an escape sequence) and every byte that is not part
 * of a whole UTF-8 character written as \xNN, so that what a client or a job chose can neither
 * start a line of its own nor rewrite a terminal. */
void td_str_escape(const char *s, char *out, size_t len);

#endif
