#include "service/td_strv.h"

#include "core/td_error.h"

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

void td_str_utf8_repair(char *s) {
    unsigned char *p = (unsigned char *)s;
    while (*p) {
        int n = *p < 0x80           ? 1
                : (*p >> 5) == 0x6  ? 2
                : (*p >> 4) == 0xe  ? 3
                : (*p >> 3) == 0x1e ? 4
                                    : 0;
        bool whole = n > 0;
        for (int i = 1; whole && i < n; i++) whole = (p[i] >> 6) == 0x2;
        /* overlong 2-byte forms and surrogates are not UTF-8 either */
        if (whole && n == 2 && *p < 0xc2) whole = false;
        if (whole && n == 3 && *p == 0xed && p[1] >= 0xa0) whole = false;
        if (whole && n == 4 && (*p > 0xf4 || (*p == 0xf0 && p[1] < 0x90))) whole = false;
        if (whole && n == 3 && *p == 0xe0 && p[1] < 0xa0) whole = false;
        if (!whole) {
            *p++ = '?';
            continue;
        }
        p += n;
    }
}

void td_strv_free(char **v) {
    if (!v) return;
    for (char **p = v; *p; p++) free(*p);
    free(v);
}
