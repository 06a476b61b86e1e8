/* Which server trainctl talks to, and with which token (trainctl.h, tc_config_resolve). The
 * token is looked for in order, and every place looked at is remembered, so that a missing or
 * refused token can be explained exactly. */
#include "trainctl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define DEFAULT_URL "http://127.0.0.1:8470"

static void note(tc_conn *c, const char *fmt, const char *what) {
    size_t n = strlen(c->token_from);
    snprintf(c->token_from + n, sizeof c->token_from - n, fmt, n ? "; " : "", what);
}

/* The first line of path into c->token; false when it cannot be read (noted). */
static bool read_token(tc_conn *c, const char *path) {
    FILE *f = fopen(path, "r");
    char line[256] = "";
    if (!f) {
        char what[1100];
        snprintf(what, sizeof what, "%s (%s)", path, strerror(errno));
        note(c, "%s%s", what);
        return false;
    }
    bool ok = fgets(line, sizeof line, f) != NULL;
    fclose(f);
    line[strcspn(line, "\r\n")] = 0;
    if (!ok || !line[0]) {
        note(c, "%s%s (empty)", path);
        return false;
    }
    snprintf(c->token, sizeof c->token, "%s", line);
    snprintf(c->token_from, sizeof c->token_from, "%s", path);
    return true;
}

static void set_url(tc_conn *c, const char *url) {
    bool scheme = strncmp(url, "http://", 7) == 0 || strncmp(url, "https://", 8) == 0;
    snprintf(c->url, sizeof c->url, "%s%s", scheme ? "" : "http://", url);
    size_t n = strlen(c->url);
    while (n > 0 && c->url[n - 1] == '/') c->url[--n] = 0;
}

int tc_config_resolve(tc_conn *c, const tc_options *o, char *err, size_t len) {
    memset(c, 0, sizeof *c);
    const char *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    if (xdg && *xdg)
        snprintf(c->config_path, sizeof c->config_path, "%s/traind/client.json", xdg);
    else
        snprintf(c->config_path, sizeof c->config_path, "%s/.config/traind/client.json",
                 home && *home ? home : ".");
    json_t *cfg = NULL;
    if (access(c->config_path, F_OK) == 0) {
        json_error_t je;
        cfg = json_load_file(c->config_path, JSON_REJECT_DUPLICATES, &je);
        if (!cfg || !json_is_object(cfg)) {
            snprintf(err, len, "%s:%d:%d: %s", c->config_path, cfg ? 1 : je.line,
                     cfg ? 1 : je.column,
                     cfg ? "expected a JSON object with \"url\" and \"token\" or \"token_file\""
                         : je.text);
            json_decref(cfg);
            return -1;
        }
        const char *keys[] = {"url", "token", "token_file", "cacert"};
        const char *key;
        json_t *v;
        json_object_foreach(cfg, key, v) {
            bool known = false;
            for (int i = 0; i < 4; i++) known |= strcmp(key, keys[i]) == 0;
            if (!known || !json_is_string(v)) {
                snprintf(err, len, "%s: %s: %s", c->config_path, key,
                         known ? "expected a string"
                               : "unknown key; expected one of: url, token, token_file, cacert");
                json_decref(cfg);
                return -1;
            }
        }
    }
    const char *env_url = getenv("TRAIND_URL"), *env_token = getenv("TRAIND_TOKEN");
    const char *cfg_url = json_string_value(json_object_get(cfg, "url"));
    set_url(c, o->url                ? o->url
               : env_url && *env_url ? env_url
               : cfg_url && *cfg_url ? cfg_url
                                     : DEFAULT_URL);
    const char *env_ca = getenv("TRAIND_CACERT");
    const char *cfg_ca = json_string_value(json_object_get(cfg, "cacert"));
    snprintf(c->cacert, sizeof c->cacert, "%s",
             o->cacert           ? o->cacert
             : env_ca && *env_ca ? env_ca
             : cfg_ca && *cfg_ca ? cfg_ca
                                 : "");
    const char *cfg_token = json_string_value(json_object_get(cfg, "token"));
    const char *cfg_file = json_string_value(json_object_get(cfg, "token_file"));
    if (o->token) {
        snprintf(c->token, sizeof c->token, "%s", o->token);
        snprintf(c->token_from, sizeof c->token_from, "--token");
    } else if (o->token_file) {
        read_token(c, o->token_file);
    } else if (env_token && *env_token) {
        snprintf(c->token, sizeof c->token, "%s", env_token);
        snprintf(c->token_from, sizeof c->token_from, "TRAIND_TOKEN");
    } else if (cfg_token && *cfg_token) {
        snprintf(c->token, sizeof c->token, "%s", cfg_token);
        snprintf(c->token_from, sizeof c->token_from, "%s (\"token\")", c->config_path);
    } else if (cfg_file && *cfg_file) {
        read_token(c, cfg_file);
    } else {
        /* the local daemon's own token file, where traind writes it (readable by its owner) */
        char path[1100];
        const char *state = getenv("XDG_STATE_HOME");
        if (state && *state)
            snprintf(path, sizeof path, "%s/traind/token", state);
        else
            snprintf(path, sizeof path, "%s/.local/state/traind/token", home && *home ? home : ".");
        if (!read_token(c, path)) read_token(c, "/var/lib/traind/token");
    }
    json_decref(cfg);
    return 0;
}
