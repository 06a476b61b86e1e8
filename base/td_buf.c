#include "base/td_buf.h"

#include "base/td_error.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void reserve(td_buf *b, size_t more) {
    if (b->len + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->len + more + 1) cap *= 2;
    char *p = td_realloc(b->data, cap);
    b->data = p;
    b->cap = cap;
}

void td_buf_append(td_buf *b, const char *s, size_t n) {
    reserve(b, n);
    memcpy(b->data + b->len, s, n);
    b->len += n;
    b->data[b->len] = 0;
}

void td_buf_puts(td_buf *b, const char *s) {
    td_buf_append(b, s, strlen(s));
}

void td_buf_printf(td_buf *b, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    TD_ASSERT(n >= 0, "vsnprintf failed on a response format");
    reserve(b, (size_t)n);
    va_start(ap, fmt);
    vsnprintf(b->data + b->len, (size_t)n + 1, fmt, ap);
    va_end(ap);
    b->len += (size_t)n;
}

char *td_buf_take(td_buf *b) {
    if (!b->data) reserve(b, 0), b->data[0] = 0;
    char *p = b->data;
    *b = (td_buf){0};
    return p;
}

void td_buf_free(td_buf *b) {
    free(b->data);
    *b = (td_buf){0};
}

void td_buf_label_value(td_buf *b, const char *s) {
    for (; *s; s++) {
        if (*s == '\\' || *s == '"')
            td_buf_printf(b, "\\%c", *s);
        else if (*s == '\n')
            td_buf_puts(b, "\\n");
        else
            td_buf_append(b, s, 1);
    }
}
