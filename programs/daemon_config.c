/* traind's options: the command line, the config file and the defaults, from one table. */
#include "daemon_config.h"

#include "base/td_json.h"
#include "base/td_parse.h"
#include "service/run/td_shepherd.h"

#include <errno.h>
#include <jansson.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef enum {
    K_TEXT,
    K_INT,
    K_LONG,
    K_SECONDS,
    K_ROOTS,
    K_GPUS,
    K_CHOICE,
    K_BOOL,
    K_NUMBER,  /* like K_SECONDS, in other words */
    K_PROGRAMS /* "any", "none", or executables: a ':'-joined text, or a JSON array */
} setting_kind;

typedef struct setting {
    const char *flag, *key;
    setting_kind type;
    size_t offset, size; /* the field in daemon_options */
    double min, max;     /* numbers */
    const char *choices; /* K_CHOICE: "a|b|c" */
    daemon_apply reload; /* DAEMON_RESTART: a change needs a restart */
    const char *def;     /* the default, as the command line gives it; NULL: none or computed */
} setting;

/* Text options whose empty value means nothing (an empty one for join, node_name, advertise or
 * cluster_secret_file means "none"). */
static bool needs_text(daemon_option opt) {
    return opt == OPT_LISTEN || opt == OPT_STATE_DIR || opt == OPT_WORKER || opt == OPT_WEB_ROOT ||
           opt == OPT_SHEPHERD;
}

#define FIELD(f) offsetof(daemon_options, f), sizeof(((daemon_options *)0)->f)

static const setting OPTS[OPT_COUNT] = {
#define SECTION(title, intro)
#define SETTING(id, key, ctype, dims, flag, value, kind, min, max, choices, reload, def, help)     \
    [OPT_##id] = {flag, #key, kind, FIELD(key), min, max, choices, DAEMON_##reload, def},
#include "daemon_settings.def"
#undef SETTING
#undef SECTION
};

/* command_jobs's programs, one at a time: an absolute path to an executable file. */
static int program_ok(const char *where, const char *p, td_err *err) {
    if (p[0] != '/')
        return td_fail(err, "%s \"%s\": expected an absolute path (or \"any\" or \"none\")", where,
                       p);
    if (strchr(p, ':'))
        return td_fail(err, "%s \"%s\": a path with ':' cannot be listed", where, p);
    if (access(p, X_OK) != 0)
        return td_fail(err, "%s \"%s\": %s", where, p,
                       errno == ENOENT ? "no such file" : "not an executable");
    return 0;
}

/* The text form ("any", "none", "/a:/b") checked and copied into out. */
static int set_programs(const char *flag, const char *v, char *out, size_t size, td_err *err) {
    if (strlen(v) >= size) return td_fail(err, "%s: longer than %zu characters", flag, size - 1);
    if (strcmp(v, "any") != 0 && strcmp(v, "none") != 0) {
        char copy[8192], *save = NULL;
        snprintf(copy, sizeof copy, "%s", v);
        if (!v[0] || v[0] == ':' || v[strlen(v) - 1] == ':' || strstr(v, "::"))
            return td_fail(err, "%s \"%s\": expected any, none or absolute paths joined by ':'",
                           flag, v);
        for (char *p = strtok_r(copy, ":", &save); p; p = strtok_r(NULL, ":", &save))
            if (program_ok(flag, p, err) != 0) return -1;
    }
    memcpy(out, v, strlen(v) + 1);
    return 0;
}

static void *field(daemon_options *o, daemon_option opt) {
    return (char *)o + OPTS[opt].offset;
}

static const void *cfield(const daemon_options *o, daemon_option opt) {
    return (const char *)o + OPTS[opt].offset;
}

/* Whether s is one of "a|b|c". */
static bool one_of(const char *choices, const char *s) {
    size_t n = strlen(s);
    for (const char *c = choices; *c;) {
        const char *bar = strchr(c, '|');
        size_t len = bar ? (size_t)(bar - c) : strlen(c);
        if (len == n && strncmp(c, s, n) == 0 && n > 0) return true;
        c += len + (bar ? 1 : 0);
    }
    return false;
}

/* The command line's value v for option opt. -1 with the message in err. */
static int set_from_text(daemon_options *o, daemon_option opt, const char *v, bool first_root,
                         td_err *err) {
    const setting *in = &OPTS[opt];
    void *f = field(o, opt);
    switch (in->type) {
    case K_TEXT:
    case K_CHOICE:
        if (in->type == K_CHOICE && !one_of(in->choices, v))
            return td_fail(err, "%s \"%s\": expected one of %s", in->flag, v, in->choices);
        if (!v[0] && needs_text(opt)) return td_fail(err, "%s: needs a non-empty value", in->flag);
        if (strlen(v) >= in->size)
            return td_fail(err, "%s: longer than %zu characters", in->flag, in->size - 1);
        memcpy(f, v, strlen(v) + 1);
        return 0;
    case K_INT:
    case K_LONG: {
        long x;
        if (!td_parse_long(v, (long)in->min, (long)in->max, &x))
            return td_fail(err, "%s \"%s\": expected an integer in [%ld, %ld]", in->flag, v,
                           (long)in->min, (long)in->max);
        if (in->type == K_INT)
            *(int *)f = (int)x;
        else
            *(long *)f = x;
        return 0;
    }
    case K_SECONDS:
    case K_NUMBER: {
        char *end;
        errno = 0;
        double x = strtod(v, &end);
        if (errno || end == v || *end || !(x >= in->min && x <= in->max))
            return td_fail(err, "%s \"%s\": expected %s in [%g, %g]", in->flag, v,
                           in->type == K_SECONDS ? "seconds" : "a number", in->min, in->max);
        *(double *)f = x;
        return 0;
    }
    case K_PROGRAMS:
        return set_programs(in->flag, v, f, in->size, err);
    case K_ROOTS:
        if (!v[0]) return td_fail(err, "%s: needs a directory, not an empty string", in->flag);
        if (first_root) o->n_data_roots = 0; /* the command line's replace the file's */
        if (o->n_data_roots == DAEMON_MAX_ROOTS)
            return td_fail(err, "at most %d %s", DAEMON_MAX_ROOTS, in->flag);
        if (strlen(v) >= PATH_MAX) return td_fail(err, "%s: path too long", in->flag);
        snprintf(o->data_roots[o->n_data_roots++], PATH_MAX, "%s", v);
        return 0;
    case K_GPUS:
        return td_gpus_parse_list(v, o->gpus, &o->n_gpus, err);
    case K_BOOL:
        if (strcmp(v, "true") != 0 && strcmp(v, "false") != 0)
            return td_fail(err, "%s \"%s\": expected true or false", in->flag, v);
        *(bool *)f = strcmp(v, "true") == 0;
        return 0;
    }
    return td_fail(err, "%s: unknown option type", in->flag);
}

/* Member opt.key of the config file's object c, when present. */
static int set_from_json(daemon_options *o, daemon_option opt, const json_t *c, td_err *err) {
    const setting *in = &OPTS[opt];
    const json_t *v = json_object_get(c, in->key);
    void *f = field(o, opt);
    if (!v) return 0;
    switch (in->type) {
    case K_TEXT:
        if (td_json_string(c, "", in->key, true, NULL, f, in->size, err) != 0) return -1;
        if (!((char *)f)[0] && needs_text(opt))
            return td_json_fail_found(err, in->key, "a non-empty string", v);
        break;
    case K_CHOICE: {
        int idx;
        if (td_json_choice(c, "", in->key, true, NULL, in->choices, &idx, err) != 0) return -1;
        if (json_string_length(v) >= in->size)
            return td_json_fail_found(err, in->key, "a shorter choice", v);
        memcpy(f, json_string_value(v), json_string_length(v) + 1);
        break;
    }
    case K_INT:
    case K_LONG: {
        long x;
        if (td_json_int(c, "", in->key, true, 0, (long)in->min, (long)in->max, &x, err) != 0)
            return -1;
        if (in->type == K_INT)
            *(int *)f = (int)x;
        else
            *(long *)f = x;
        break;
    }
    case K_SECONDS:
    case K_NUMBER:
        if (td_json_number(c, "", in->key, true, 0, in->min, in->max, f, err) != 0) return -1;
        break;
    case K_PROGRAMS: {
        char *text = f;
        if (json_is_string(v)) {
            const char *s = json_string_value(v);
            if (strcmp(s, "any") != 0 && strcmp(s, "none") != 0)
                return td_json_fail_found(err, in->key,
                                          "\"any\", \"none\" or an array of absolute paths", v);
            snprintf(text, in->size, "%s", s);
            break;
        }
        if (!json_is_array(v) || json_array_size(v) == 0)
            return td_json_fail_found(
                err, in->key, "\"any\", \"none\" or a non-empty array of absolute paths", v);
        size_t i, used = 0;
        const json_t *p;
        text[0] = 0;
        json_array_foreach(v, i, p) {
            char where[48];
            snprintf(where, sizeof where, "%s[%zu]", in->key, i);
            if (!json_is_string(p)) return td_json_fail_found(err, where, "a path", p);
            if (program_ok(where, json_string_value(p), err) != 0) return -1;
            size_t n = json_string_length(p);
            if (used + n + 2 > in->size) return td_fail(err, "%s: too many programs", in->key);
            if (used) text[used++] = ':';
            memcpy(text + used, json_string_value(p), n + 1);
            used += n;
        }
        break;
    }
    case K_ROOTS: {
        if (!json_is_array(v) || json_array_size(v) > DAEMON_MAX_ROOTS) {
            char what[64];
            snprintf(what, sizeof what, "an array of at most %d paths", DAEMON_MAX_ROOTS);
            return td_json_fail_found(err, in->key, what, v);
        }
        o->n_data_roots = 0;
        size_t i;
        const json_t *r;
        json_array_foreach(v, i, r) {
            char where[48];
            snprintf(where, sizeof where, "%s[%zu]", in->key, i);
            if (!json_is_string(r) || json_string_length(r) == 0 ||
                json_string_length(r) >= PATH_MAX)
                return td_json_fail_found(err, where, "a path (a non-empty string)", r);
            snprintf(o->data_roots[o->n_data_roots++], PATH_MAX, "%s", json_string_value(r));
        }
        break;
    }
    case K_GPUS:
        if (td_gpus_parse_json(v, in->key, o->gpus, &o->n_gpus, err) != 0) return -1;
        break;
    case K_BOOL:
        if (!json_is_boolean(v)) return td_json_fail_found(err, in->key, "true or false", v);
        *(bool *)f = json_is_true(v);
        break;
    }
    o->from[opt] = DAEMON_FROM_FILE;
    return 0;
}

/* The file's settings for whatever the command line left alone. -1 with "FILE: message". */
static int read_file(daemon_options *o, const char *path, td_err *err) {
    const char *keys[OPT_COUNT + 1];
    for (int i = 0; i < OPT_COUNT; i++) keys[i] = OPTS[i].key;
    keys[OPT_COUNT] = NULL;
    json_error_t je;
    json_t *c = json_load_file(path, JSON_REJECT_DUPLICATES, &je);
    if (!c) {
        if (je.line < 1) return td_fail(err, "%s: %s", path, je.text);
        return td_fail(err, "%s:%d:%d: %s", path, je.line, je.column, je.text);
    }
    int rc = 0;
    td_err e = {{0}};
    if (!json_is_object(c)) {
        td_json_fail_found(&e, "(the top level)", "a JSON object of settings", c);
        rc = -1;
    } else if (td_json_check_keys(c, "", keys, &e) != 0)
        rc = -1;
    for (int i = 0; rc == 0 && i < OPT_COUNT; i++)
        if (o->from[i] != DAEMON_FROM_ARGS && set_from_json(o, (daemon_option)i, c, &e) != 0)
            rc = -1;
    json_decref(c);
    if (rc != 0) return td_fail(err, "%s: %s", path, e.msg);
    return 0;
}

static void default_state_dir(char *out, size_t len) {
    const char *s = getenv("STATE_DIRECTORY"); /* systemd's StateDirectory= */
    const char *xdg = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    if (s && *s) {
        /* several directories are separated by ':'; traind's is the first */
        snprintf(out, len, "%.*s", (int)strcspn(s, ":"), s);
    } else if (getuid() == 0)
        snprintf(out, len, "/var/lib/traind");
    else if (xdg && *xdg)
        snprintf(out, len, "%s/traind", xdg);
    else
        snprintf(out, len, "%s/.local/state/traind", home && *home ? home : ".");
}

/* The directory this executable is in ("" when /proc/self/exe cannot be read). */
static void self_dir(char *out, size_t len) {
    ssize_t n = readlink("/proc/self/exe", out, len - 1);
    out[n > 0 ? n : 0] = 0;
    char *slash = strrchr(out, '/');
    if (slash) *slash = 0;
}

/* The dashboard's files: PREFIX/share/traind/web beside an installed traind (bin/), else the
 * source tree's web/ this binary was built from. */
static void default_web_root(char *out, size_t len) {
    char self[PATH_MAX - 64];
    self_dir(self, sizeof self);
    snprintf(out, len, "%s", TRAIND_WEB_ROOT);
    if (!self[0]) return;
    char installed[PATH_MAX];
    snprintf(installed, sizeof installed, "%s/../share/traind/web/index.html", self);
    if (access(installed, R_OK) == 0) snprintf(out, len, "%s/../share/traind/web", self);
}

static void default_worker(char *out, size_t len) {
    char self[PATH_MAX - 32];
    self_dir(self, sizeof self);
    if (!self[0])
        snprintf(out, len, "traind-worker");
    else
        snprintf(out, len, "%s/traind-worker", self);
}

/* The defaults that depend on where traind runs, for what neither the command line nor the file
 * gave (the table's own defaults were set before either was read). */
static void apply_computed_defaults(daemon_options *o) {
    const daemon_source *from = o->from;
    if (from[OPT_STATE_DIR] == DAEMON_FROM_DEFAULT)
        default_state_dir(o->state_dir, sizeof o->state_dir);
    if (from[OPT_WORKER] == DAEMON_FROM_DEFAULT) default_worker(o->worker, sizeof o->worker);
    if (from[OPT_SHEPHERD] == DAEMON_FROM_DEFAULT) {
        char self[PATH_MAX - 64];
        ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
        self[n > 0 ? n : 0] = 0;
        td_shepherd_program(o->shepherd, sizeof o->shepherd, self);
    }
    if (from[OPT_WEB_ROOT] == DAEMON_FROM_DEFAULT)
        default_web_root(o->web_root, sizeof o->web_root);
    if (from[OPT_AUDIT_LOG] == DAEMON_FROM_DEFAULT || !o->audit_log[0])
        snprintf(o->audit_log, sizeof o->audit_log, "%.*s/audit.log", PATH_MAX - 16, o->state_dir);
}

/* The table's defaults, read as the command line's values are: a default out of its own range
 * is a bug said at start, not a value used. */
static int init(daemon_options *o, td_err *err) {
    *o = (daemon_options){0};
    for (int i = 0; i < OPT_COUNT; i++) {
        if (!OPTS[i].flag || !OPTS[i].key || OPTS[i].size == 0)
            return td_fail(err, "internal: setting %d has no row in daemon_settings.def", i);
        td_err e = {{0}};
        if (OPTS[i].def && set_from_text(o, (daemon_option)i, OPTS[i].def, true, &e) != 0)
            return td_fail(err, "internal: %s's default: %s", OPTS[i].key, e.msg);
    }
    return 0;
}

/* The command line into o (marking what it gave). *config: the --config value or NULL. exits:
 * --help and --version print and exit (the first load); a reload never meets them. */
static int parse_args(daemon_options *o, int argc, char **argv, const char **config, bool exits,
                      td_err *err) {
    *config = NULL;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (exits && (!strcmp(a, "--help") || !strcmp(a, "-h"))) {
            daemon_config_usage(stdout);
            exit(0);
        }
        if (exits && !strcmp(a, "--settings-reference")) {
            daemon_config_reference(stdout);
            exit(0);
        }
        if (exits && !strcmp(a, "--version")) {
            printf("traind %s\n", TRAIND_VERSION);
            exit(0);
        }
        if (!strcmp(a, "--print-config")) {
            o->print_config = true;
            continue;
        }
        if (strncmp(a, "--", 2) != 0) return td_fail(err, "%s: unexpected argument", a);
        int opt = -1;
        for (int k = 0; k < OPT_COUNT && opt < 0; k++)
            if (!strcmp(a, OPTS[k].flag)) opt = k;
        if (opt < 0 && strcmp(a, "--config") != 0) return td_fail(err, "unknown option %s", a);
        if (i + 1 >= argc) return td_fail(err, "%s: needs a value", a);
        const char *v = argv[++i];
        if (opt < 0) {
            *config = v;
            continue;
        }
        bool first = o->from[opt] != DAEMON_FROM_ARGS;
        if (set_from_text(o, (daemon_option)opt, v, first, err) != 0) return -1;
        o->from[opt] = DAEMON_FROM_ARGS;
    }
    return 0;
}

/* The whole load; -1 with the message (no exit but --help and --version when exits). */
static int load(daemon_options *o, int argc, char **argv, bool exits, td_err *err) {
    if (init(o, err) != 0) return -1;
    const char *config;
    if (parse_args(o, argc, argv, &config, exits, err) != 0) return -1;
    if (!config) config = getenv("TRAIND_CONFIG"); /* NULL: the default file, if there is one */
    if (config && config[0]) {
        snprintf(o->config_path, sizeof o->config_path, "%s", config);
    } else if (!config && access(DAEMON_CONFIG_DEFAULT, F_OK) == 0)
        snprintf(o->config_path, sizeof o->config_path, "%s", DAEMON_CONFIG_DEFAULT);
    if (o->config_path[0] && read_file(o, o->config_path, err) != 0) return -1;
    apply_computed_defaults(o);
    if (!o->tls_cert[0] != !o->tls_key[0])
        return td_fail(err, "%s without %s: HTTPS needs both the certificate and its key",
                       o->tls_cert[0] ? "tls_cert" : "tls_key",
                       o->tls_cert[0] ? "tls_key" : "tls_cert");
    if (o->heartbeat_s * 2 > o->node_timeout_s)
        return td_fail(err,
                       "heartbeat_s %g (%s) must be at most half of node_timeout_s %g (%s): "
                       "agents would be marked lost between two heartbeats",
                       o->heartbeat_s, daemon_config_source(o, OPT_HEARTBEAT), o->node_timeout_s,
                       daemon_config_source(o, OPT_NODE_TIMEOUT));
    return 0;
}

void daemon_config_load(daemon_options *o, int argc, char **argv) {
    td_err err = {{0}};
    if (load(o, argc, argv, true, &err) != 0) {
        fprintf(stderr, "traind: %s\n", err.msg);
        if (strstr(err.msg, "unknown option") || strstr(err.msg, "unexpected argument") ||
            strstr(err.msg, "needs a value"))
            fprintf(stderr, "(traind --help lists the options)\n");
        exit(2);
    }
}

int daemon_config_reload(daemon_options *next, const daemon_options *now, int argc, char **argv,
                         char *why, size_t len) {
    td_err err = {{0}};
    if (load(next, argc, argv, false, &err) != 0) {
        snprintf(why, len, "%s", err.msg);
        return -1;
    }
    /* the default file removed: falling back to the defaults would undo its settings silently */
    if (now->config_path[0] && strcmp(now->config_path, next->config_path) != 0) {
        snprintf(why, len, "%s: %s", now->config_path,
                 next->config_path[0] ? "another file is read now" : "the file is gone");
        return -1;
    }
    return 0;
}

/* The value as JSON text (allocated), for --print-config and reload messages. */
char *daemon_config_value(const daemon_options *o, daemon_option opt) {
    const void *f = cfield(o, opt);
    json_t *v = NULL;
    switch (OPTS[opt].type) {
    case K_TEXT:
    case K_CHOICE:
        v = json_string((const char *)f);
        break;
    case K_INT:
        v = *(const int *)f ? json_integer(*(const int *)f) : json_null(); /* 0: automatic */
        break;
    case K_LONG:
        v = json_integer(*(const long *)f);
        break;
    case K_SECONDS:
    case K_NUMBER:
        v = json_real(*(const double *)f);
        break;
    case K_PROGRAMS: {
        const char *s = f;
        if (strcmp(s, "any") == 0 || strcmp(s, "none") == 0) {
            v = json_string(s);
            break;
        }
        v = json_array();
        char copy[8192], *save = NULL;
        snprintf(copy, sizeof copy, "%s", s);
        for (char *p = strtok_r(copy, ":", &save); p; p = strtok_r(NULL, ":", &save))
            json_array_append_new(v, json_string(p));
        break;
    }
    case K_ROOTS:
        v = json_array();
        for (int i = 0; i < o->n_data_roots; i++)
            json_array_append_new(v, json_string(o->data_roots[i]));
        break;
    case K_GPUS:
        v = json_array();
        for (int i = 0; i < o->n_gpus; i++)
            json_array_append_new(v, json_integer(o->gpus[i].index));
        break;
    case K_BOOL:
        v = json_boolean(*(const bool *)f);
        break;
    }
    char *s = v ? json_dumps(v, JSON_ENCODE_ANY | JSON_COMPACT | JSON_REAL_PRECISION(10)) : NULL;
    json_decref(v);
    return s ? s : strdup("?"); /* a path that is not UTF-8 has no JSON string */
}

const char *daemon_config_source(const daemon_options *o, daemon_option opt) {
    switch (o->from[opt]) {
    case DAEMON_FROM_ARGS:
        return "from the command line";
    case DAEMON_FROM_FILE:
        return o->config_path;
    default:
        return "the default";
    }
}

void daemon_config_print(const daemon_options *o, FILE *out) {
    fprintf(out,
            "# traind settings: the command line wins over the config file (%s), the file "
            "over the defaults\n",
            o->config_path[0] ? o->config_path : "none read");
    for (int i = 0; i < OPT_COUNT; i++) {
        char *v = daemon_config_value(o, (daemon_option)i);
        const char *auto_note = "";
        if (i == OPT_SLOTS && o->slots == 0) auto_note = ": one per GPU, else the core count";
        if (i == OPT_GPUS && o->n_gpus == 0) auto_note = ": every GPU the driver finds";
        char from[PATH_MAX + 32];
        if (o->from[i] == DAEMON_FROM_ARGS)
            snprintf(from, sizeof from, "command line %s", OPTS[i].flag);
        else if (o->from[i] == DAEMON_FROM_FILE)
            snprintf(from, sizeof from, "%s", o->config_path);
        else
            snprintf(from, sizeof from, "default%s", auto_note);
        fprintf(out, "%-20s %-32s # %s\n", OPTS[i].key, v ? v : "?", from);
        free(v);
    }
}

bool daemon_config_changed(const daemon_options *a, const daemon_options *b, daemon_option opt) {
    const void *fa = cfield(a, opt), *fb = cfield(b, opt);
    switch (OPTS[opt].type) {
    case K_TEXT:
    case K_CHOICE:
        return strcmp(fa, fb) != 0;
    case K_INT:
        return *(const int *)fa != *(const int *)fb;
    case K_LONG:
        return *(const long *)fa != *(const long *)fb;
    case K_SECONDS:
    case K_NUMBER:
        return *(const double *)fa != *(const double *)fb;
    case K_PROGRAMS:
        return strcmp(fa, fb) != 0;
    case K_ROOTS:
        if (a->n_data_roots != b->n_data_roots) return true;
        for (int i = 0; i < a->n_data_roots; i++)
            if (strcmp(a->data_roots[i], b->data_roots[i]) != 0) return true;
        return false;
    case K_GPUS:
        if (a->n_gpus != b->n_gpus) return true;
        for (int i = 0; i < a->n_gpus; i++)
            if (a->gpus[i].index != b->gpus[i].index ||
                strcmp(a->gpus[i].name, b->gpus[i].name) != 0 ||
                a->gpus[i].memory_bytes != b->gpus[i].memory_bytes)
                return true;
        return false;
    case K_BOOL:
        return *(const bool *)fa != *(const bool *)fb;
    }
    return true;
}

const char *daemon_config_key(daemon_option opt) {
    return OPTS[opt].key;
}

daemon_apply daemon_config_reload_by(daemon_option opt) {
    return OPTS[opt].reload;
}

void daemon_config_take_live(daemon_options *o, const daemon_options *next) {
    for (int i = 0; i < OPT_COUNT; i++) {
        if (OPTS[i].reload == DAEMON_RESTART) continue;
        memcpy(field(o, (daemon_option)i), cfield(next, (daemon_option)i), OPTS[i].size);
        o->from[i] = next->from[i];
        if (i == OPT_DATA_ROOTS) o->n_data_roots = next->n_data_roots;
    }
}
