/* A growing byte buffer for building responses (JSON, SSE records). Always NUL-terminated. */
#ifndef TD_BUF_H
#define TD_BUF_H

#include <stddef.h>

typedef struct td_buf {
    char *data;
    size_t len, cap;
} td_buf;

void td_buf_append(td_buf *b, const char *s, size_t n);
void td_buf_puts(td_buf *b, const char *s);
void td_buf_printf(td_buf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Hands the bytes over (the caller frees them) and leaves b empty. */
char *td_buf_take(td_buf *b);
/* s as a Prometheus label value: \, " and newlines escaped, as its text format wants them. */
void td_buf_label_value(td_buf *b, const char *s);
void td_buf_free(td_buf *b);

#endif
