#include "base/td_strv.h"

#include "base/td_error.h"

#include <stdbool.h>
#include <stdlib.h>
#include <string.h>

char *td_str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(td_malloc(n), s, n);
}

char **td_strv_new(int n) {
    return td_calloc((size_t)n + 1, sizeof(char *));
}

/* The length of the whole UTF-8 character at p, or 0 when p starts none. */
static int utf8_char(const unsigned char *p) {
    int n = *p < 0x80 ? 1 : (*p >> 5) == 0x6 ? 2 : (*p >> 4) == 0xe ? 3 : (*p >> 3) == 0x1e ? 4 : 0;
    bool whole = n > 0;
    for (int i = 1; whole && i < n; i++) whole = (p[i] >> 6) == 0x2;
    /* overlong 2-byte forms and surrogates are not UTF-8 either */
    if (whole && n == 2 && *p < 0xc2) whole = false;
    if (whole && n == 3 && *p == 0xed && p[1] >= 0xa0) whole = false;
    if (whole && n == 4 && (*p > 0xf4 || (*p == 0xf0 && p[1] < 0x90))) whole = false;
    if (whole && n == 3 && *p == 0xe0 && p[1] < 0xa0) whole = false;
    return whole ? n : 0;
}

void td_str_utf8_repair(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        int n = utf8_char(p);
        if (!n) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

void td_str_escape(const char *s, char *out, size_t len) {
    static const char HEX[] = "0123456789abcdef";
    const unsigned char *p = (const unsigned char *)s;
    size_t k = 0;
    while (*p && k + 1 < len) {
        int n = utf8_char(p);
        /* C0 and DEL, and C1 (U+0080 to U+009F: 0xc2 0x80..0x9f) */
        bool control = n == 1 ? (*p < 0x20 || *p == 0x7f) : n == 2 && *p == 0xc2 && p[1] < 0xa0;
        if (n && !control) {
            if (k + (size_t)n + 1 > len) break;
            memcpy(out + k, p, (size_t)n);
            k += (size_t)n;
            p += n;
            continue;
        }
        int bytes = control && n == 2 ? 2 : 1; /* a C1 character's two bytes, or one */
        for (int b = 0; b < bytes; b++, p++) {
            if (k + 5 > len) break;
            out[k++] = '\\', out[k++] = 'x', out[k++] = HEX[*p >> 4], out[k++] = HEX[*p & 15];
        }
    }
    out[k] = 0;
}

void td_strv_free(char **v) {
    if (!v) return;
    for (char **p = v; *p; p++) free(*p);
    free(v);
}
