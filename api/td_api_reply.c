/* The HTTP API's replies, each through td_api_respond so that every one carries its content type
 * and headers the same way and every error is one JSON object; and the small readers of a
 * request every handler uses (an id, a query number, the client's address). Apart from the
 * routes: what any handler answers with, not which one answers. */
#include "api/td_api_private.h"

#include "base/td_parse.h"

#include <arpa/inet.h>
#include <jansson.h>
#include <limits.h>
#include <netinet/in.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>

const char TD_API_JSON[] = "application/json";

enum MHD_Result td_api_respond(struct MHD_Connection *c, unsigned status, struct MHD_Response *r,
                               const char *type, ...) {
    if (!r) return MHD_NO;
    if (type) MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, type);
    va_list ap;
    va_start(ap, type);
    for (const char *name; (name = va_arg(ap, const char *));) {
        const char *value = va_arg(ap, const char *);
        MHD_add_response_header(r, name, value);
    }
    va_end(ap);
    enum MHD_Result ok = MHD_queue_response(c, status, r);
    MHD_destroy_response(r);
    return ok;
}

/* The body of a reply built in memory, handed to libmicrohttpd to free. */
struct MHD_Response *td_api_from_buf(td_buf *b) {
    size_t len = b->len;
    char *data = td_buf_take(b);
    struct MHD_Response *r = MHD_create_response_from_buffer(len, data, MHD_RESPMEM_MUST_FREE);
    if (!r) free(data);
    return r;
}

enum MHD_Result td_api_reply_buf(struct MHD_Connection *c, unsigned status, td_buf *b) {
    return td_api_respond(c, status, td_api_from_buf(b), TD_API_JSON, NULL);
}

enum MHD_Result td_api_error(struct MHD_Connection *c, const td_reply_error *e, const char *allow) {
    char retry[32] = "";
    if (e->retry_after_s > 0) /* whole seconds, rounded up (RFC 9110) */
        snprintf(retry, sizeof retry, "%ld", (long)e->retry_after_s + 1);
    json_t *o = json_pack("{s:{s:s, s:s, s:o}}", "error", "code", e->code, "message", e->message,
                          "field", e->field[0] ? json_string(e->field) : json_null());
    char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
    json_decref(o);
    td_buf b = {0};
    td_buf_puts(&b, text ? text
                         : "{\"error\":{\"code\":\"internal\",\"message\":\"?\",\"field\":null}}");
    free(text);
    struct MHD_Response *r = td_api_from_buf(&b);
    if (r && allow) MHD_add_response_header(r, MHD_HTTP_HEADER_ALLOW, allow);
    if (r && retry[0]) MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, retry);
    if (r && e->status == 401 && strcmp(e->code, "unauthorized") == 0) /* not the cluster's */
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer realm=\"traind\"");
    return td_api_respond(c, (unsigned)e->status, r, TD_API_JSON, NULL);
}

enum MHD_Result td_api_fail(struct MHD_Connection *c, int status, const char *code,
                            const char *field, const char *message) {
    td_reply_error e;
    td_reply_fail(&e, status, code, field, "%s", message);
    return td_api_error(c, &e, NULL);
}

bool td_api_parse_id(const char *s, size_t n, long *out) {
    return n > 0 && s[0] != '-' && s[0] != '+' && td_parse_long_n(s, n, 0, LONG_MAX, out);
}

bool td_api_query_long(struct MHD_Connection *c, const char *name, long min, long max, long *out,
                       bool *bad) {
    const char *v = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, name);
    if (!v) return false;
    if (!td_parse_long(v, min, max, out)) *bad = true;
    return !*bad;
}

void td_api_peer(struct MHD_Connection *c, char *out, size_t len) {
    const union MHD_ConnectionInfo *ci =
        MHD_get_connection_info(c, MHD_CONNECTION_INFO_CLIENT_ADDRESS);
    snprintf(out, len, "?");
    if (ci && ci->client_addr && ci->client_addr->sa_family == AF_INET)
        inet_ntop(AF_INET, &((const struct sockaddr_in *)ci->client_addr)->sin_addr, out,
                  (socklen_t)len);
}
