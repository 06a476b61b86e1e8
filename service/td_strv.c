#include "service/td_strv.h"

#include "core/td_error.h"

#include <stdlib.h>
#include <string.h>

char *td_str_dup(const char *s) {
    size_t n = strlen(s) + 1;
    return memcpy(td_malloc(n), s, n);
}

char **td_strv_new(int n) {
    return td_calloc((size_t)n + 1, sizeof(char *));
}

void td_strv_free(char **v) {
    if (!v) return;
    for (char **p = v; *p; p++) free(*p);
    free(v);
}
