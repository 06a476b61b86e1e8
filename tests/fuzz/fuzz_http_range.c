/* Feeds: a Range header to td_api_parse_range (api/td_api_checkpoint.c), against a file size
 * taken from the input's first 8 bytes (little-endian, below 2^48) so that both ends of the size
 * range are reached. Why: a client's header picks which bytes of a checkpoint the daemon reads
 * and sends; a range it accepts must lie inside the file. Its answer is also compared with an
 * independent reading of RFC 9110's single byte range written here, so that a parse that is
 * memory-safe but wrong (a range past the end accepted, a good one refused) is a finding too. */
#include "fuzz_util.h"

#include "api/td_api_private.h"

#include <limits.h>
#include <stdlib.h>
#include <string.h>

/* A run of decimal digits at *p as a value <= LONG_MAX (what td_api_parse_id allows); false on
 * none or overflow. */
static bool digits(const char **p, const char *end, unsigned long long *v) {
    const char *s = *p;
    *v = 0;
    while (*p < end && **p >= '0' && **p <= '9') {
        if (*v > (unsigned long long)(LONG_MAX - (**p - '0')) / 10) return false;
        *v = *v * 10 + (unsigned long long)(**p - '0');
        ++*p;
    }
    return *p > s;
}

/* "bytes=" then "A-B", "A-" or "-N" (N > 0), nothing else; against size n. */
static bool reference(const char *h, uint64_t n, uint64_t *from, uint64_t *to) {
    if (strncmp(h, "bytes=", 6) != 0) return false;
    const char *p = h + 6, *end = h + strlen(h);
    unsigned long long a, b;
    if (*p == '-') {
        p++;
        if (!digits(&p, end, &b) || p != end || b == 0 || n == 0) return false;
        *from = b >= n ? 0 : n - b;
        *to = n - 1;
        return true;
    }
    if (!digits(&p, end, &a) || *p++ != '-') return false;
    bool open = p == end;
    if (!open && (!digits(&p, end, &b) || p != end || b < a)) return false;
    if (a >= n) return false;
    *from = a;
    *to = open || b >= n ? n - 1 : b;
    return true;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 8) return 0;
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | data[i];
    n &= (1ull << 48) - 1;
    char *h = fuzz_text(data + 8, size - 8);
    uint64_t from = 0, to = 0, rfrom = 0, rto = 0;
    bool ok = td_api_parse_range(h, n, &from, &to);
    bool want = reference(h, n, &rfrom, &rto);
    FUZZ_CHECK(ok == want, "\"%s\" against %llu bytes: parsed %d, expected %d", h,
               (unsigned long long)n, ok, want);
    if (ok) {
        FUZZ_CHECK(from <= to && to < n, "\"%s\": [%llu, %llu] of %llu bytes", h,
                   (unsigned long long)from, (unsigned long long)to, (unsigned long long)n);
        FUZZ_CHECK(from == rfrom && to == rto, "\"%s\": [%llu, %llu], expected [%llu, %llu]", h,
                   (unsigned long long)from, (unsigned long long)to, (unsigned long long)rfrom,
                   (unsigned long long)rto);
    }
    free(h);
    return 0;
}
