/* The dashboard's side of the server: its static files (the page, its script and style from
 * the web root, the chart library from where Debian installs it) and browser sessions.
 *
 * A browser signs in once with the API token (POST /v1/session) and gets a session cookie
 * (HttpOnly: scripts cannot read it; SameSite=Strict: other sites' pages cannot send it) and a
 * CSRF token, given out only then. Every request with the cookie must also carry that token
 * (X-CSRF-Token, or ?csrf= where a browser cannot set headers: EventSource, download links):
 * browsers send a host's cookies to every port of it, so a page served by any other service on
 * this host could make a browser send the cookie, or read it outright; the token, kept in the
 * page's own sessionStorage (which is per port), it cannot. Sessions live in memory: a restarted
 * daemon asks for the token again. Every file goes
 * out with a Content-Security-Policy that allows scripts and styles from this server only (no
 * inline script, no eval), and forbids framing. */
#include "api/td_api_private.h"

#include "base/td_clock.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#define COOKIE         "traind_session"
#define SESSION_IDLE_S (12 * 3600.0) /* a session unused this long is over */
static const char CSP[] = "default-src 'self'; script-src 'self'; style-src 'self'; "
                          "img-src 'self' data:; connect-src 'self'; object-src 'none'; "
                          "frame-ancestors 'none'; base-uri 'none'; form-action 'self'";

static bool same(const char *a, const char *b) { /* constant time in the secret's length */
    size_t n = strlen(a), m = strlen(b);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++) diff |= (unsigned char)(a[i] ^ (i < m ? b[i] : 0));
    return diff == 0;
}

static bool random_hex(char out[65]) {
    unsigned char raw[32];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return false;
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return true;
}

/* The session of the request's cookie, or -1 (api->session_mu held). */
static int find_session(td_api *api, struct MHD_Connection *c) {
    const char *id = MHD_lookup_connection_value(c, MHD_COOKIE_KIND, COOKIE);
    if (!id) return -1;
    double now = td_clock_now();
    for (int i = 0; i < api->n_sessions; i++) {
        td_api_session *s = &api->sessions[i];
        if (now - s->last_used > SESSION_IDLE_S) continue;
        if (same(s->id, id)) {
            s->last_used = now;
            return i;
        }
    }
    return -1;
}

/* The CSRF token the request carries: the header, else the query parameter. */
static const char *csrf_of(struct MHD_Connection *c) {
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-CSRF-Token");
    return h ? h : MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "csrf");
}

int td_api_session_auth(td_api *api, struct MHD_Connection *c, const char *method, long *token) {
    (void)method; /* every method: reads too (see above) */
    pthread_mutex_lock(&api->session_mu);
    int at = find_session(api, c);
    const char *given = at >= 0 ? csrf_of(c) : NULL;
    bool csrf_ok = given && same(api->sessions[at].csrf, given);
    if (at >= 0) *token = api->sessions[at].token;
    pthread_mutex_unlock(&api->session_mu);
    if (at < 0) return 0;
    return csrf_ok ? 1 : -1;
}

/* {"signed_in": true}, with the CSRF token when it is given out (at sign-in only). */
static enum MHD_Result reply_session(struct MHD_Connection *c, unsigned status, const char *csrf,
                                     const char *cookie) {
    td_buf b = {0};
    if (csrf)
        td_buf_printf(&b, "{\"signed_in\":true,\"csrf\":\"%s\"}\n", csrf);
    else
        td_buf_puts(&b, "{\"signed_in\":true}\n");
    char *data = td_buf_take(&b);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(data), data, MHD_RESPMEM_MUST_FREE);
    if (!r) free(data);
    return td_api_respond(c, status, r, TD_API_JSON, "Cache-Control", "no-store",
                          cookie ? MHD_HTTP_HEADER_SET_COOKIE : NULL, cookie, NULL);
}

enum MHD_Result td_api_session_route(td_api *api, struct MHD_Connection *c, const char *method,
                                     const char *body, size_t len, bool bearer, td_principal *who) {
    if (strcmp(method, "POST") == 0) { /* sign in: {"token": "..."} */
        json_t *o = json_loadb(body ? body : "", len, 0, NULL);
        const char *token = json_string_value(json_object_get(o, "token"));
        bool ok = token && td_tokens_check(api->cfg.tokens, token, who);
        json_decref(o);
        if (!ok)
            return td_api_fail(c, 401, "unauthorized", "token",
                               "that is not a live API token of this daemon (an admin's is in "
                               "STATE_DIR/token; POST /v1/tokens makes others)");
        td_api_session s = {
            .last_used = td_clock_now(), .signed_in = td_clock_now(), .token = who->id};
        if (!random_hex(s.id) || !random_hex(s.csrf))
            return td_api_fail(c, 500, "internal", NULL, "no random bytes for a session");
        /* a token's own sessions are bounded (max_sessions_per_token: its oldest goes); another
         * token's are never ended by a sign-in, and a full table refuses one instead */
        int cap = td_tokens_get_limits(api->cfg.tokens).sessions;
        pthread_mutex_lock(&api->session_mu);
        int at = -1, mine = 0, oldest = -1;
        double now = td_clock_now();
        for (int i = 0; i < api->n_sessions; i++) {
            td_api_session *x = &api->sessions[i];
            if (now - x->last_used > SESSION_IDLE_S) at = at < 0 ? i : at; /* over: reusable */
            if (x->token != who->id || now - x->last_used > SESSION_IDLE_S) continue;
            mine++;
            if (oldest < 0 || x->signed_in < api->sessions[oldest].signed_in) oldest = i;
        }
        if (cap > 0 && mine >= cap)
            at = oldest;
        else if (at < 0 && api->n_sessions < TD_API_SESSIONS_MAX)
            at = api->n_sessions++;
        if (at >= 0) api->sessions[at] = s;
        pthread_mutex_unlock(&api->session_mu);
        if (at < 0)
            return td_api_fail(c, 503, "unavailable", NULL,
                               "the dashboard holds as many sessions as it keeps: sign in again "
                               "once some have ended (12 h unused, or signed out)");
        char cookie[160];
        /* Secure over HTTPS: the browser then never sends the session in clear */
        snprintf(cookie, sizeof cookie, COOKIE "=%s; Path=/; HttpOnly; SameSite=Strict%s", s.id,
                 api->cfg.tls_cert_pem ? "; Secure" : "");
        return reply_session(c, 200, s.csrf, cookie);
    }
    pthread_mutex_lock(&api->session_mu);
    int at = find_session(api, c);
    const char *h = at >= 0 ? csrf_of(c) : NULL;
    bool given = h && same(api->sessions[at].csrf, h);
    long token = at >= 0 ? api->sessions[at].token : 0;
    if (given && strcmp(method, "DELETE") == 0) { /* the slot is refilled by the last one */
        api->sessions[at] = api->sessions[--api->n_sessions];
        memset(&api->sessions[api->n_sessions], 0, sizeof *api->sessions);
    }
    pthread_mutex_unlock(&api->session_mu);
    if (token) td_tokens_live(api->cfg.tokens, token, who); /* for the audit of a sign-out */
    if (at < 0)
        return td_api_fail(c, 401, "unauthorized", NULL,
                           bearer && strcmp(method, "GET") == 0
                               ? "a bearer token has no session: sign in with POST"
                               : "not signed in");
    if (!given)
        return td_api_fail(c, 403, "csrf", NULL, "the session's X-CSRF-Token header is missing");
    if (strcmp(method, "GET") == 0) /* the page, loaded again: is it still signed in? */
        return reply_session(c, 200, NULL, NULL);
    if (strcmp(method, "DELETE") == 0) { /* sign out */
        return td_api_respond(c, 204,
                              MHD_create_response_from_buffer(0, "", MHD_RESPMEM_PERSISTENT), NULL,
                              MHD_HTTP_HEADER_SET_COOKIE,
                              COOKIE "=; Path=/; HttpOnly; SameSite=Strict; Max-Age=0", NULL);
    }
    td_reply_error e;
    td_reply_fail(&e, 405, "method_not_allowed", NULL, "%s /v1/session: use GET, POST or DELETE",
                  method);
    return td_api_error(c, &e, "GET, POST, DELETE");
}

/* ---- static files ------------------------------------------------------------------------ */

static const char *content_type(const char *path) {
    static const char *const TYPES[][2] = {{".html", "text/html; charset=utf-8"},
                                           {".js", "text/javascript; charset=utf-8"},
                                           {".css", "text/css; charset=utf-8"},
                                           {".svg", "image/svg+xml"},
                                           {".png", "image/png"},
                                           {".json", "application/json"},
                                           {".ico", "image/x-icon"}};
    const char *dot = strrchr(path, '.');
    for (size_t i = 0; dot && i < sizeof TYPES / sizeof TYPES[0]; i++)
        if (strcmp(dot, TYPES[i][0]) == 0) return TYPES[i][1];
    return "application/octet-stream";
}

/* rel (segments of [A-Za-z0-9._-], none starting with '.') under root, as an open file. */
static enum MHD_Result send_file(struct MHD_Connection *c, const char *root, const char *rel) {
    bool ok = *rel != 0;
    for (const char *p = rel; ok && *p; p++) {
        bool start = p == rel || p[-1] == '/';
        ok = (start ? *p != '.' && *p != '/' : true) &&
             (*p == '/' || *p == '.' || *p == '_' || *p == '-' || (*p >= '0' && *p <= '9') ||
              (*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z'));
    }
    char path[PATH_MAX * 2];
    int fd = -1;
    struct stat st;
    if (ok && snprintf(path, sizeof path, "%s/%s", root, rel) < (int)sizeof path)
        fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        char msg[PATH_MAX + 64];
        snprintf(msg, sizeof msg, "no file %s in %s", rel, root);
        return td_api_fail(c, 404, "not_found", NULL, msg);
    }
    struct MHD_Response *r = MHD_create_response_from_fd((uint64_t)st.st_size, fd);
    if (!r) close(fd);
    return td_api_respond(c, 200, r, content_type(rel), "Content-Security-Policy", CSP,
                          "X-Content-Type-Options", "nosniff", "Referrer-Policy", "no-referrer",
                          "X-Frame-Options", "DENY", "Cache-Control", "no-cache", NULL);
}

enum MHD_Result td_api_web_file(td_api *api, struct MHD_Connection *c, const char *url) {
    if (strcmp(url, "/") == 0 || strcmp(url, "/ui/") == 0 || strcmp(url, "/ui") == 0)
        return send_file(c, api->cfg.web_root, "index.html");
    static const char LIB[] = "/ui/lib/dygraphs/";
    if (strncmp(url, LIB, sizeof LIB - 1) == 0)
        return send_file(c, api->cfg.chart_root, url + sizeof LIB - 1);
    return send_file(c, api->cfg.web_root, url + 4); /* after "/ui/" */
}
