/* The token registry (td_tokens.h). Tokens are kept as SHA-256 digests: a token is 32 random bytes,
 * so nobody can search its digest backwards, and a slow password hash (bcrypt, scrypt) would
 * only cost every request time; passwords need those because people choose them. */
#include "service/store/td_tokens.h"

#include "base/td_clock.h"
#include "base/td_json.h"
#include "base/td_sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

typedef struct entry {
    td_db_token row;
    td_scope scope;
    double level, refilled; /* the rate bucket: requests left, and when it was last topped up */
    int streams;            /* event streams open now */
} entry;

struct td_tokens {
    pthread_mutex_t mu;
    td_db *db;
    td_log *log;
    entry *list;
    int n, cap;
    td_tokens_limits limits;
    char bootstrap_path[4096];
    long bootstrap_id; /* the token in bootstrap_path; 0: none */
};

static const char *const SCOPES[] = {"", "read", "submit", "admin"};

const char *td_scope_name(td_scope s) {
    return s >= TD_SCOPE_READ && s <= TD_SCOPE_ADMIN ? SCOPES[s] : "none";
}

static td_scope scope_of(const char *name) {
    for (int s = TD_SCOPE_READ; s <= TD_SCOPE_ADMIN; s++)
        if (strcmp(name, SCOPES[s]) == 0) return (td_scope)s;
    return TD_SCOPE_NONE;
}

static void digest(const char *secret, char hex[TD_SHA256_HEX]) {
    td_sha256 *h = td_sha256_new();
    td_sha256_update(h, secret, strlen(secret));
    td_sha256_finish(h, hex);
}

/* Constant time: how much of a digest matched says nothing to whoever is guessing. */
static bool same_digest(const char *a, const char *b) {
    unsigned char diff = 0;
    for (int i = 0; i < TD_SHA256_HEX - 1; i++) diff |= (unsigned char)(a[i] ^ b[i]);
    return diff == 0;
}

static bool random_token(char out[65]) {
    unsigned char raw[32];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) return false;
    for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return true;
}

static void add_entry(td_tokens *t, const td_db_token *row) {
    if (t->n == t->cap) {
        t->cap = t->cap ? 2 * t->cap : 8;
        t->list = td_realloc(t->list, (size_t)t->cap * sizeof *t->list);
    }
    entry *e = &t->list[t->n++];
    /* a full bucket: the first request's refill tops it up to whatever the rate is by then */
    *e = (entry){.row = *row, .scope = scope_of(row->scope), .level = 1e300};
}

static void loaded(void *ctx, const td_db_token *row) {
    add_entry(ctx, row);
}

static entry *by_id(td_tokens *t, long id) {
    for (int i = 0; i < t->n; i++)
        if (t->list[i].row.id == id) return &t->list[i];
    return NULL;
}

static int live_admins(const td_tokens *t) {
    int n = 0;
    for (int i = 0; i < t->n; i++)
        n += t->list[i].scope == TD_SCOPE_ADMIN && t->list[i].row.revoked_at == 0;
    return n;
}

static int store(td_tokens *t, const char *name, td_scope scope, const char *secret, long by,
                 long *id, td_err *err) {
    td_db_token row = {.created_at = td_clock_wall(), .created_by = by};
    snprintf(row.name, sizeof row.name, "%s", name);
    snprintf(row.scope, sizeof row.scope, "%s", td_scope_name(scope));
    digest(secret, row.hash);
    if (td_db_insert_token(t->db, &row, err) != 0) return -1;
    add_entry(t, &row);
    *id = row.id;
    return 0;
}

/* The first-start token file: read (its first line, at least 16 characters), or made when no
 * admin token is live. */
static int bootstrap(td_tokens *t, td_err *err) {
    const char *path = t->bootstrap_path;
    char secret[256] = "";
    FILE *f = fopen(path, "r");
    if (f) {
        if (!fgets(secret, sizeof secret, f)) secret[0] = 0;
        fclose(f);
        secret[strcspn(secret, "\r\n")] = 0;
        if (strlen(secret) < 16)
            return td_fail(err, "%s: the API token on its first line is shorter than 16 characters",
                           path);
        struct stat st;
        if (stat(path, &st) == 0 && (st.st_mode & 077))
            td_log_warn(t->log, "warning: %s is readable by others (chmod 600 it)", path);
        char hex[TD_SHA256_HEX];
        digest(secret, hex);
        for (int i = 0; i < t->n; i++)
            if (same_digest(t->list[i].row.hash, hex)) {
                if (t->list[i].row.revoked_at > 0) {
                    td_log_warn(t->log,
                                "warning: %s holds token %ld (\"%s\"), which was revoked: it "
                                "opens nothing (remove the file)",
                                path, t->list[i].row.id, t->list[i].row.name);
                    return 0;
                }
                t->bootstrap_id = t->list[i].row.id;
                return 0;
            }
        /* written by a traind from before scopes, or by the operator: it stays an admin's */
        return store(t, "bootstrap", TD_SCOPE_ADMIN, secret, 0, &t->bootstrap_id, err);
    }
    if (errno != ENOENT) return td_fail(err, "cannot read %s: %s", path, strerror(errno));
    if (live_admins(t) > 0) return 0; /* the operator revoked it on purpose: not again */
    if (!random_token(secret)) return td_fail(err, "no random bytes for the API token");
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) return td_fail(err, "cannot create %s: %s", path, strerror(errno));
    size_t n = strlen(secret);
    bool ok = write(fd, secret, n) == (ssize_t)n && write(fd, "\n", 1) == 1 && fsync(fd) == 0;
    int e = errno;
    close(fd);
    if (!ok) {
        unlink(path);
        return td_fail(err, "cannot write %s: %s", path, strerror(e));
    }
    if (store(t, "bootstrap", TD_SCOPE_ADMIN, secret, 0, &t->bootstrap_id, err) != 0) {
        unlink(path);
        return -1;
    }
    /* never the token itself: under systemd stderr is the journal, which others may read */
    td_log_notice(t->log, "created an admin API token in %s (mode 0600); clients read it there",
                  path);
    return 0;
}

int td_tokens_open(td_tokens **out, td_db *db, const char *bootstrap_path, td_log *log,
                   td_err *err) {
    td_tokens *t = td_calloc(1, sizeof *t);
    pthread_mutex_init(&t->mu, NULL);
    t->db = db;
    t->log = log;
    snprintf(t->bootstrap_path, sizeof t->bootstrap_path, "%s", bootstrap_path);
    if (td_db_load_tokens(db, loaded, t, err) != 0 || bootstrap(t, err) != 0) {
        td_tokens_close(t);
        return -1;
    }
    *out = t;
    return 0;
}

void td_tokens_close(td_tokens *t) {
    if (!t) return;
    pthread_mutex_destroy(&t->mu);
    free(t->list);
    free(t);
}

void td_tokens_set_limits(td_tokens *t, const td_tokens_limits *limits) {
    pthread_mutex_lock(&t->mu);
    t->limits = *limits;
    for (int i = 0; i < t->n; i++) /* a lower rate takes effect at once */
        if (limits->requests_per_s > 0 && t->list[i].level > 2 * limits->requests_per_s)
            t->list[i].level = 2 * limits->requests_per_s;
    pthread_mutex_unlock(&t->mu);
}

td_tokens_limits td_tokens_get_limits(td_tokens *t) {
    pthread_mutex_lock(&t->mu);
    td_tokens_limits l = t->limits;
    pthread_mutex_unlock(&t->mu);
    return l;
}

static void fill_who(const entry *e, td_principal *who) {
    who->id = e->row.id;
    snprintf(who->name, sizeof who->name, "%s", e->row.name);
    who->scope = e->scope;
}

bool td_tokens_check(td_tokens *t, const char *secret, td_principal *who) {
    char hex[TD_SHA256_HEX];
    digest(secret, hex);
    bool found = false;
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n; i++)
        if (same_digest(t->list[i].row.hash, hex) && t->list[i].row.revoked_at == 0) {
            fill_who(&t->list[i], who);
            found = true;
        }
    pthread_mutex_unlock(&t->mu);
    return found;
}

bool td_tokens_live(td_tokens *t, long id, td_principal *who) {
    pthread_mutex_lock(&t->mu);
    entry *e = by_id(t, id);
    bool live = e && e->row.revoked_at == 0;
    if (live) fill_who(e, who);
    pthread_mutex_unlock(&t->mu);
    return live;
}

static json_t *token_json(const entry *e) {
    return json_pack("{s:I, s:s, s:s, s:f, s:I, s:o}", "id", (json_int_t)e->row.id, "name",
                     e->row.name, "scope", e->row.scope, "created_at", e->row.created_at,
                     "created_by", (json_int_t)e->row.created_by, "revoked_at",
                     e->row.revoked_at > 0 ? json_real(e->row.revoked_at) : json_null());
}

/* A token's name: what the audit log and job records show, so letters, digits and ._@- only. */
static bool name_ok(const char *s) {
    size_t n = strlen(s);
    if (n == 0 || n > 63) return false;
    for (const char *p = s; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == '-' || *p == '@'))
            return false;
    return true;
}

int td_tokens_create(td_tokens *t, const char *body, size_t len, const td_principal *by,
                     td_buf *out, td_reply_error *e) {
    json_error_t je;
    json_t *o = json_loadb(body, len, JSON_REJECT_DUPLICATES, &je);
    if (!json_is_object(o)) {
        json_decref(o);
        return td_reply_fail(e, 400, "bad_request", NULL,
                             "the body must be a JSON object {\"name\": ..., \"scope\": "
                             "\"read\"|\"submit\"|\"admin\"}%s%s",
                             o ? "" : ": ", o ? "" : je.text);
    }
    static const char *const KEYS[] = {"name", "scope", NULL};
    td_err err = {{0}};
    char name[64] = "", scope[16] = "";
    int idx = 0;
    int rc = 0;
    if (td_json_check_keys(o, "", KEYS, &err) != 0 ||
        td_json_string(o, "", "name", true, NULL, name, sizeof name, &err) != 0 ||
        td_json_choice(o, "", "scope", true, NULL, "read|submit|admin", &idx, &err) != 0) {
        rc = td_reply_fail(e, 400, "bad_request", NULL, "%s", err.msg);
    } else if (!name_ok(name)) {
        rc = td_reply_fail(e, 400, "bad_request", "name",
                           "name \"%s\": expected 1 to 63 letters, digits, '.', '_', '@' or '-'",
                           name);
    }
    if (rc == 0)
        snprintf(scope, sizeof scope, "%s", json_string_value(json_object_get(o, "scope")));
    json_decref(o);
    if (rc != 0) return rc;
    char secret[65];
    if (!random_token(secret)) return td_reply_fail(e, 500, "internal", NULL, "no random bytes");
    pthread_mutex_lock(&t->mu);
    long id = 0;
    if (store(t, name, scope_of(scope), secret, by->id, &id, &err) != 0) {
        pthread_mutex_unlock(&t->mu);
        return td_reply_fail(e, 503, "unavailable", NULL, "cannot store the token: %s", err.msg);
    }
    json_t *r = token_json(by_id(t, id));
    pthread_mutex_unlock(&t->mu);
    json_object_set_new(r, "token", json_string(secret));
    char *text = json_dumps(r, JSON_COMPACT);
    json_decref(r);
    TD_CHECK_ALLOC(text, "a token's reply");
    td_buf_puts(out, text);
    td_buf_puts(out, "\n");
    free(text);
    td_log_notice(t->log, "token %ld (\"%s\", %s) created by token %ld (\"%s\")", id, name, scope,
                  by->id, by->name);
    return 0;
}

int td_tokens_revoke(td_tokens *t, long id, const td_principal *by, td_reply_error *e) {
    pthread_mutex_lock(&t->mu);
    entry *en = by_id(t, id);
    int rc = 0;
    if (!en || en->row.revoked_at > 0) {
        rc = td_reply_fail(e, 404, "not_found", NULL,
                           "no live token %ld (GET /v1/tokens lists them)", id);
    } else if (en->scope == TD_SCOPE_ADMIN && live_admins(t) == 1) {
        rc = td_reply_fail(e, 409, "conflict", NULL,
                           "token %ld is the last live admin token: create another admin token "
                           "first (POST /v1/tokens), or nobody could manage tokens again",
                           id);
    } else {
        double now = td_clock_wall();
        td_err err = {{0}};
        if (td_db_revoke_token(t->db, id, now, &err) < 0)
            rc = td_reply_fail(e, 503, "unavailable", NULL, "cannot store the revocation: %s",
                               err.msg);
        else
            en->row.revoked_at = now; /* from here on, td_tokens_check refuses it */
    }
    bool was_bootstrap = rc == 0 && id == t->bootstrap_id;
    char name[64];
    snprintf(name, sizeof name, "%s", en ? en->row.name : "");
    pthread_mutex_unlock(&t->mu);
    if (rc != 0) return rc;
    if (was_bootstrap && unlink(t->bootstrap_path) != 0 && errno != ENOENT)
        td_log_warn(t->log, "warning: cannot remove %s (a revoked token): %s", t->bootstrap_path,
                    strerror(errno));
    td_log_notice(t->log, "token %ld (\"%s\") revoked by token %ld (\"%s\")%s", id, name, by->id,
                  by->name, was_bootstrap ? "; its file is removed" : "");
    return 0;
}

void td_tokens_list(td_tokens *t, td_buf *out) {
    json_t *a = json_array();
    pthread_mutex_lock(&t->mu);
    for (int i = 0; i < t->n; i++) json_array_append_new(a, token_json(&t->list[i]));
    pthread_mutex_unlock(&t->mu);
    json_t *o = json_pack("{s:o}", "tokens", a);
    char *text = json_dumps(o, JSON_COMPACT);
    json_decref(o);
    TD_CHECK_ALLOC(text, "the token list");
    td_buf_puts(out, text);
    td_buf_puts(out, "\n");
    free(text);
}

bool td_tokens_admit(td_tokens *t, long id, double now, double *retry_after_s) {
    pthread_mutex_lock(&t->mu);
    entry *e = by_id(t, id);
    double rate = t->limits.requests_per_s;
    bool ok = true;
    if (e && rate > 0) {
        double cap = 2 * rate; /* two seconds' worth: a page load's burst passes */
        if (e->level < cap) e->level += (now - e->refilled) * rate;
        if (e->level > cap) e->level = cap;
        e->refilled = now;
        if (e->level >= 1) {
            e->level -= 1;
        } else {
            ok = false;
            *retry_after_s = (1 - e->level) / rate;
        }
    }
    pthread_mutex_unlock(&t->mu);
    return ok;
}

bool td_tokens_stream_begin(td_tokens *t, long id) {
    pthread_mutex_lock(&t->mu);
    entry *e = by_id(t, id);
    bool ok = !e || t->limits.streams <= 0 || e->streams < t->limits.streams;
    if (e && ok) e->streams++;
    pthread_mutex_unlock(&t->mu);
    return ok;
}

void td_tokens_stream_end(td_tokens *t, long id) {
    pthread_mutex_lock(&t->mu);
    entry *e = by_id(t, id);
    if (e && e->streams > 0) e->streams--;
    pthread_mutex_unlock(&t->mu);
}
