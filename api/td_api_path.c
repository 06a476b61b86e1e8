/* Whether a path as the client sent it may be routed at all: refused before anything else is
 * looked at. Apart, to be fuzzed on its own (tests/fuzz/fuzz_http_path.c). */
#include "api/td_api_private.h"

#include <ctype.h>
#include <string.h>

/* Whether the path as the client sent it (before unescaping) is one a route may be found for:
 * no NUL, no encoded '/' (which unescaped would split a segment in two), no control character
 * raw or encoded. *why: what is wrong. */
bool td_api_raw_path_ok(const char *raw, const char **why) {
    size_t n = strcspn(raw, "?");
    for (size_t i = 0; i < n; i++) {
        unsigned char ch = (unsigned char)raw[i];
        if (ch < 0x20 || ch == 0x7f) return *why = "a control character", false;
        if (ch != '%') continue;
        int hi = i + 2 < n ? raw[i + 1] : 0, lo = i + 2 < n ? raw[i + 2] : 0;
        if (!isxdigit(hi) || !isxdigit(lo)) continue;
        int v = (isdigit(hi) ? hi - '0' : (tolower(hi) - 'a' + 10)) * 16 +
                (isdigit(lo) ? lo - '0' : (tolower(lo) - 'a' + 10));
        if (v == 0) return *why = "an encoded NUL (%00)", false;
        if (v == '/') return *why = "an encoded '/' (%2F)", false;
        if (v < 0x20 || v == 0x7f) return *why = "an encoded control character", false;
    }
    return true;
}

bool td_api_path_refused(struct MHD_Connection *c, const char *raw, enum MHD_Result *answer) {
    const char *why;
    if (td_api_raw_path_ok(raw, &why)) return false;
    td_reply_error e;
    td_reply_fail(&e, 400, "bad_request", NULL,
                  "the path holds %s: no route has one (paths are plain segments)", why);
    *answer = td_api_error(c, &e, NULL);
    return true;
}
