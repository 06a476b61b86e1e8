/* The dashboard's side of the server: its static files (the page, its script and style from
 * the web root, the chart library from where Debian installs it) and browser sessions.
 *
 * A browser signs in once with the API token (POST /v1/session) and gets a session cookie
 * (HttpOnly: scripts cannot read it; SameSite=Strict: other sites' pages cannot send it) and a
 * CSRF token. Requests with the cookie act as the token would, but a request that changes
 * anything (POST, PUT, DELETE) must also carry the CSRF token in X-CSRF-Token, which only the
 * page itself knows: a forged form or fetch from elsewhere is refused even if a browser sent the
 * cookie. Sessions live in memory: a restarted daemon asks for the token again. Every file goes
 * out with a Content-Security-Policy that allows scripts and styles from this server only (no
 * inline script, no eval), and forbids framing. */
#include "api/td_api_private.h"

#include "core/td_clock.h"

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

int td_api_session_auth(td_api *api, struct MHD_Connection *c, const char *method) {
    pthread_mutex_lock(&api->session_mu);
    int at = find_session(api, c);
    bool csrf_ok = false;
    if (at >= 0) {
        const char *given = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-CSRF-Token");
        csrf_ok = given && same(api->sessions[at].csrf, given);
    }
    pthread_mutex_unlock(&api->session_mu);
    if (at < 0) return 0;
    bool safe = strcmp(method, "GET") == 0 || strcmp(method, "HEAD") == 0;
    return safe || csrf_ok ? 1 : -1;
}

static enum MHD_Result reply_session(struct MHD_Connection *c, unsigned status, const char *csrf,
                                     const char *cookie) {
    td_buf b = {0};
    td_buf_printf(&b, "{\"csrf\":\"%s\"}\n", csrf);
    char *data = td_buf_take(&b);
    struct MHD_Response *r =
        MHD_create_response_from_buffer(strlen(data), data, MHD_RESPMEM_MUST_FREE);
    if (!r) free(data);
    return td_api_respond(c, status, r, TD_API_JSON, "Cache-Control", "no-store",
                          cookie ? MHD_HTTP_HEADER_SET_COOKIE : NULL, cookie, NULL);
}

enum MHD_Result td_api_session_route(td_api *api, struct MHD_Connection *c, const char *method,
                                     const char *body, size_t len, bool token_ok) {
    if (strcmp(method, "POST") == 0) { /* sign in: {"token": "..."} */
        json_t *o = json_loadb(body ? body : "", len, 0, NULL);
        const char *token = json_string_value(json_object_get(o, "token"));
        bool ok = token && same(api->token, token);
        json_decref(o);
        if (!ok)
            return td_api_fail(c, 401, "unauthorized", "token",
                               "that is not this daemon's API token (it is in STATE_DIR/token)");
        td_api_session s = {.last_used = td_clock_now()};
        if (!random_hex(s.id) || !random_hex(s.csrf))
            return td_api_fail(c, 500, "internal", NULL, "no random bytes for a session");
        pthread_mutex_lock(&api->session_mu);
        int at = api->n_sessions < TD_API_SESSIONS_MAX ? api->n_sessions++ : 0;
        for (int i = 0; i < api->n_sessions; i++) /* full: the one unused the longest goes */
            if (api->sessions[i].last_used < api->sessions[at].last_used) at = i;
        api->sessions[at] = s;
        pthread_mutex_unlock(&api->session_mu);
        char cookie[160];
        snprintf(cookie, sizeof cookie, COOKIE "=%s; Path=/; HttpOnly; SameSite=Strict", s.id);
        return reply_session(c, 200, s.csrf, cookie);
    }
    pthread_mutex_lock(&api->session_mu);
    int at = find_session(api, c);
    char csrf[65] = "";
    if (at >= 0) snprintf(csrf, sizeof csrf, "%s", api->sessions[at].csrf);
    bool given = false;
    if (at >= 0 && strcmp(method, "DELETE") == 0) {
        const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "X-CSRF-Token");
        given = h && same(csrf, h);
        if (given) api->sessions[at] = api->sessions[--api->n_sessions];
    }
    pthread_mutex_unlock(&api->session_mu);
    if (strcmp(method, "GET") == 0) { /* the page, loaded again: is it still signed in? */
        if (at < 0)
            return td_api_fail(c, 401, "unauthorized", NULL,
                               token_ok ? "a bearer token has no session: sign in with POST"
                                        : "not signed in");
        return reply_session(c, 200, csrf, NULL);
    }
    if (strcmp(method, "DELETE") == 0) { /* sign out */
        if (at < 0) return td_api_fail(c, 401, "unauthorized", NULL, "not signed in");
        if (!given)
            return td_api_fail(c, 403, "csrf", NULL,
                               "signing out needs the session's X-CSRF-Token header");
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
