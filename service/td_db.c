#include "service/td_db.h"

#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

struct td_db {
    sqlite3 *db;
    pthread_mutex_t mu;
    atomic_bool full; /* the last write failed for want of disk space */
};

static const char SCHEMA[] =
    /* retention deletes old jobs' rows: freed pages can then be given back (td_db_delete_jobs);
     * it takes effect only in a database that has no table yet */
    "PRAGMA auto_vacuum = INCREMENTAL;"
    "PRAGMA journal_mode = WAL;"
    "PRAGMA synchronous = NORMAL;" /* WAL + NORMAL: durable across a process crash */
    "PRAGMA foreign_keys = ON;"
    "CREATE TABLE IF NOT EXISTS jobs ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, kind TEXT NOT NULL,"
    "  spec TEXT NOT NULL, nproc INTEGER NOT NULL, max_restarts INTEGER NOT NULL,"
    "  restarts INTEGER NOT NULL, state TEXT NOT NULL, created_at REAL NOT NULL,"
    "  started_at REAL, finished_at REAL, exit_code INTEGER, reason TEXT,"
    "  pgid INTEGER NOT NULL DEFAULT 0, last_seq INTEGER NOT NULL DEFAULT 0,"
    "  priority INTEGER NOT NULL DEFAULT 0, time_limit REAL NOT NULL DEFAULT 0);"
    "CREATE TABLE IF NOT EXISTS attempts ("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), attempt INTEGER NOT NULL,"
    "  started_at REAL, finished_at REAL, exit_code INTEGER, reason TEXT,"
    "  PRIMARY KEY (job_id, attempt));"
    "CREATE TABLE IF NOT EXISTS events ("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), seq INTEGER NOT NULL, type TEXT NOT NULL,"
    "  data TEXT NOT NULL, PRIMARY KEY (job_id, seq));"
    "CREATE TABLE IF NOT EXISTS metrics ("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), event TEXT NOT NULL, step INTEGER NOT NULL,"
    "  data TEXT NOT NULL, seq INTEGER NOT NULL DEFAULT 0, PRIMARY KEY (job_id, event, step));"
    "CREATE TABLE IF NOT EXISTS checkpoints ("
    "  job_id INTEGER NOT NULL REFERENCES jobs(id), step INTEGER NOT NULL, path TEXT NOT NULL,"
    "  size INTEGER NOT NULL, created_at REAL NOT NULL, PRIMARY KEY (job_id, step));"
    "CREATE TABLE IF NOT EXISTS drained_nodes (name TEXT PRIMARY KEY, since REAL NOT NULL);"
    /* API tokens: only their SHA-256 (service/td_tokens.c says why a plain hash is enough) */
    "CREATE TABLE IF NOT EXISTS tokens ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, scope TEXT NOT NULL,"
    "  hash TEXT NOT NULL UNIQUE, created_at REAL NOT NULL, created_by INTEGER NOT NULL,"
    "  revoked_at REAL);";

static int db_fail(td_db *db, td_err *err, const char *what) {
    bool full = sqlite3_errcode(db->db) == SQLITE_FULL;
    atomic_store(&db->full, full);
    return td_fail(err, "state database: %s: %s%s", what, sqlite3_errmsg(db->db),
                   full ? " (the state directory's filesystem has no space left)" : "");
}

bool td_db_full(td_db *db) {
    return atomic_load(&db->full);
}

/* Columns added after the first release: a database written by an older traind gets them (with
 * their defaults) the first time a newer one opens it. */
static const struct {
    const char *table, *column, *decl;
} ADDED_COLUMNS[] = {
    {"jobs", "priority", "INTEGER NOT NULL DEFAULT 0"},
    {"jobs", "time_limit", "REAL NOT NULL DEFAULT 0"},
    {"metrics", "seq", "INTEGER NOT NULL DEFAULT 0"},
    {"jobs", "out_offset", "INTEGER NOT NULL DEFAULT 0"},
    {"jobs", "owner", "INTEGER NOT NULL DEFAULT 0"},
    {"jobs", "owner_name", "TEXT NOT NULL DEFAULT ''"},
    {"jobs", "uid", "INTEGER NOT NULL DEFAULT 0"},
};

static int has_column(sqlite3 *db, const char *table, const char *column) {
    char sql[128];
    snprintf(sql, sizeof sql, "PRAGMA table_info(%s)", table);
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db, sql, -1, &s, NULL) != SQLITE_OK) return -1;
    int found = 0;
    while (sqlite3_step(s) == SQLITE_ROW)
        if (strcmp((const char *)sqlite3_column_text(s, 1), column) == 0) found = 1;
    sqlite3_finalize(s);
    return found;
}

static int migrate(td_db *db, const char *path, td_err *err) {
    for (size_t i = 0; i < sizeof ADDED_COLUMNS / sizeof ADDED_COLUMNS[0]; i++) {
        int has = has_column(db->db, ADDED_COLUMNS[i].table, ADDED_COLUMNS[i].column);
        if (has < 0) return db_fail(db, err, "reading the schema");
        if (has) continue;
        char sql[256];
        snprintf(sql, sizeof sql, "ALTER TABLE %s ADD COLUMN %s %s", ADDED_COLUMNS[i].table,
                 ADDED_COLUMNS[i].column, ADDED_COLUMNS[i].decl);
        if (sqlite3_exec(db->db, sql, NULL, NULL, NULL) != SQLITE_OK)
            return td_fail(err, "state database %s: cannot add %s.%s: %s", path,
                           ADDED_COLUMNS[i].table, ADDED_COLUMNS[i].column, sqlite3_errmsg(db->db));
    }
    return 0;
}

/* Whether the last failure was a full disk: SQLite says so, or says "disk I/O error" (a journal
 * it could not create) while the directory's filesystem has no free block left. */
static bool full_disk(td_db *db, const char *path) {
    int code = sqlite3_extended_errcode(db->db) & 0xff;
    if (code == SQLITE_FULL) return true;
    if (code != SQLITE_IOERR) return false;
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    struct statvfs st;
    return statvfs(slash ? (dir[0] ? dir : "/") : ".", &st) == 0 &&
           (st.f_bavail == 0 || st.f_bfree == 0);
}

int td_db_open(td_db **out, const char *path, td_err *err) {
    td_db *db = td_calloc(1, sizeof *db);
    pthread_mutex_init(&db->mu, NULL);
    if (sqlite3_open_v2(path, &db->db, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, NULL) !=
        SQLITE_OK) {
        td_fail(err, "cannot open the state database %s: %s", path,
                db->db ? sqlite3_errmsg(db->db) : "out of memory");
        td_db_close(db);
        return -1;
    }
    sqlite3_busy_timeout(db->db, 5000);
    char *msg = NULL;
    if (sqlite3_exec(db->db, SCHEMA, NULL, NULL, &msg) != SQLITE_OK) {
        if (full_disk(db, path))
            td_fail(err,
                    "state database %s: the filesystem it is on is full (%s): free space there, "
                    "then start traind again",
                    path, msg ? msg : "?");
        else
            td_fail(err, "state database %s: %s (is it another program's file?)", path,
                    msg ? msg : "?");
        sqlite3_free(msg);
        td_db_close(db);
        return -1;
    }
    if (migrate(db, path, err) != 0) {
        td_db_close(db);
        return -1;
    }
    /* GET /metrics?since=S (a chart polling for news) reads a range of steps: without this
     * index it went through every metric of the job (after migrate: it names a column an
     * older database gains there) */
    if (sqlite3_exec(db->db,
                     "CREATE INDEX IF NOT EXISTS metrics_by_step ON metrics (job_id, step, seq)",
                     NULL, NULL, &msg) != SQLITE_OK) {
        td_fail(err, "state database %s: creating an index: %s", path, msg ? msg : "?");
        sqlite3_free(msg);
        td_db_close(db);
        return -1;
    }
    *out = db;
    return 0;
}

void td_db_close(td_db *db) {
    if (!db) return;
    sqlite3_close(db->db);
    pthread_mutex_destroy(&db->mu);
    free(db);
}

static void bind_time(sqlite3_stmt *s, int i, double t) {
    if (t > 0)
        sqlite3_bind_double(s, i, t);
    else
        sqlite3_bind_null(s, i);
}

static void bind_code(sqlite3_stmt *s, int i, int code) {
    if (code >= 0)
        sqlite3_bind_int(s, i, code);
    else
        sqlite3_bind_null(s, i);
}

/* Runs a prepared statement to completion under the lock held by the caller. */
static int step_done(td_db *db, sqlite3_stmt *s, td_err *err, const char *what) {
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : db_fail(db, err, what);
}

static sqlite3_stmt *prepare(td_db *db, const char *sql) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db->db, sql, -1, &s, NULL) != SQLITE_OK) return NULL;
    return s;
}

int td_db_insert_job(td_db *db, td_db_job *job, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    sqlite3_stmt *s =
        prepare(db, "INSERT INTO jobs (name, kind, spec, nproc, max_restarts, restarts, state, "
                    "created_at, priority, time_limit, owner, owner_name, uid) "
                    "VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)");
    if (!s) {
        db_fail(db, err, "preparing a job insert");
        goto out;
    }
    sqlite3_bind_text(s, 1, job->name, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 2, job->kind, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 3, job->spec, -1, SQLITE_STATIC);
    sqlite3_bind_int(s, 4, job->nproc);
    sqlite3_bind_int(s, 5, job->max_restarts);
    sqlite3_bind_int(s, 6, job->restarts);
    sqlite3_bind_text(s, 7, job->state, -1, SQLITE_STATIC);
    sqlite3_bind_double(s, 8, job->created_at);
    sqlite3_bind_int(s, 9, job->priority);
    sqlite3_bind_double(s, 10, job->time_limit_s);
    sqlite3_bind_int64(s, 11, job->owner);
    sqlite3_bind_text(s, 12, job->owner_name, -1, SQLITE_STATIC);
    sqlite3_bind_int64(s, 13, job->uid);
    if (step_done(db, s, err, "inserting a job") != 0) goto out;
    job->id = (long)sqlite3_last_insert_rowid(db->db);
    rc = 0;
out:
    pthread_mutex_unlock(&db->mu);
    return rc;
}

static int update_job_locked(td_db *db, const td_db_job *job, td_err *err) {
    sqlite3_stmt *s = prepare(db, "UPDATE jobs SET restarts=?, state=?, started_at=?, "
                                  "finished_at=?, exit_code=?, reason=?, pgid=?, last_seq=?, "
                                  "out_offset=?, uid=? WHERE id=?");
    if (!s) return db_fail(db, err, "preparing a job update");
    sqlite3_bind_int(s, 1, job->restarts);
    sqlite3_bind_text(s, 2, job->state, -1, SQLITE_STATIC);
    bind_time(s, 3, job->started_at);
    bind_time(s, 4, job->finished_at);
    bind_code(s, 5, job->exit_code);
    if (job->reason[0])
        sqlite3_bind_text(s, 6, job->reason, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 6);
    sqlite3_bind_int64(s, 7, job->pgid);
    sqlite3_bind_int64(s, 8, job->last_seq);
    sqlite3_bind_int64(s, 9, job->out_offset);
    sqlite3_bind_int64(s, 10, job->uid);
    sqlite3_bind_int64(s, 11, job->id);
    return step_done(db, s, err, "updating a job");
}

int td_db_update_job(td_db *db, const td_db_job *job, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = update_job_locked(db, job, err);
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_save_attempt(td_db *db, long job_id, const td_db_attempt *a, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    sqlite3_stmt *s = prepare(db, "INSERT OR REPLACE INTO attempts (job_id, attempt, "
                                  "started_at, finished_at, exit_code, reason) "
                                  "VALUES (?,?,?,?,?,?)");
    if (!s) {
        db_fail(db, err, "preparing an attempt");
        goto out;
    }
    sqlite3_bind_int64(s, 1, job_id);
    sqlite3_bind_int(s, 2, a->attempt);
    bind_time(s, 3, a->started_at);
    bind_time(s, 4, a->finished_at);
    bind_code(s, 5, a->exit_code);
    if (a->reason[0])
        sqlite3_bind_text(s, 6, a->reason, -1, SQLITE_STATIC);
    else
        sqlite3_bind_null(s, 6);
    rc = step_done(db, s, err, "saving an attempt");
out:
    pthread_mutex_unlock(&db->mu);
    return rc;
}

static int exec_locked(td_db *db, const char *sql, td_err *err) {
    return sqlite3_exec(db->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : db_fail(db, err, sql);
}

/* One event's rows (the transaction is the caller's). */
static int insert_event_locked(td_db *db, const td_db_event *ev, td_err *err) {
    sqlite3_stmt *s = prepare(db, "INSERT INTO events (job_id, seq, type, data) VALUES (?,?,?,?)");
    if (!s) return db_fail(db, err, "preparing an event");
    sqlite3_bind_int64(s, 1, ev->job_id);
    sqlite3_bind_int64(s, 2, ev->seq);
    sqlite3_bind_text(s, 3, ev->type, -1, SQLITE_STATIC);
    sqlite3_bind_text(s, 4, ev->data, -1, SQLITE_STATIC);
    if (step_done(db, s, err, "adding an event") != 0) return -1;
    if (ev->metric && ev->step >= 0) {
        /* a restarted attempt runs some steps again: its values replace the earlier ones */
        s = prepare(db, "INSERT OR REPLACE INTO metrics (job_id, event, step, data, seq) "
                        "VALUES (?,?,?,?,?)");
        if (!s) return db_fail(db, err, "preparing a metric");
        sqlite3_bind_int64(s, 1, ev->job_id);
        sqlite3_bind_text(s, 2, ev->type, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 3, ev->step);
        sqlite3_bind_text(s, 4, ev->data, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 5, ev->seq);
        if (step_done(db, s, err, "adding a metric") != 0) return -1;
    }
    if (ev->checkpoint_path) {
        s = prepare(db, "INSERT OR REPLACE INTO checkpoints (job_id, step, path, size, "
                        "created_at) VALUES (?,?,?,?,strftime('%s','now'))");
        if (!s) return db_fail(db, err, "preparing a checkpoint");
        sqlite3_bind_int64(s, 1, ev->job_id);
        sqlite3_bind_int64(s, 2, ev->step);
        sqlite3_bind_text(s, 3, ev->checkpoint_path, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 4, ev->checkpoint_size);
        if (step_done(db, s, err, "adding a checkpoint") != 0) return -1;
    }
    return 0;
}

int td_db_add_events(td_db *db, const td_db_event *evs, int n, const td_db_job *job, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    if (exec_locked(db, "BEGIN IMMEDIATE", err) != 0) goto out;
    for (int i = 0; i < n; i++)
        if (insert_event_locked(db, &evs[i], err) != 0) goto rollback;
    if (job && update_job_locked(db, job, err) != 0) goto rollback;
    if (exec_locked(db, "COMMIT", err) != 0) goto rollback;
    rc = 0;
    goto out;
rollback:
    sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
out:
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_add_event(td_db *db, const td_db_event *ev, const td_db_job *job, td_err *err) {
    return td_db_add_events(db, ev, 1, job, err);
}

static void copy_text(sqlite3_stmt *s, int col, char *out, size_t len) {
    const unsigned char *t = sqlite3_column_text(s, col);
    snprintf(out, len, "%s", t ? (const char *)t : "");
}

static double column_time(sqlite3_stmt *s, int col) {
    return sqlite3_column_type(s, col) == SQLITE_NULL ? 0 : sqlite3_column_double(s, col);
}

static int column_code(sqlite3_stmt *s, int col) {
    return sqlite3_column_type(s, col) == SQLITE_NULL ? -1 : sqlite3_column_int(s, col);
}

int td_db_load_jobs(td_db *db, td_db_job_fn fn, void *ctx, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    sqlite3_stmt *s =
        prepare(db, "SELECT id, name, kind, spec, nproc, max_restarts, restarts, "
                    "state, created_at, started_at, finished_at, exit_code, "
                    "reason, pgid, last_seq, priority, time_limit, out_offset, owner, owner_name, "
                    "uid FROM jobs "
                    "ORDER BY id");
    sqlite3_stmt *a = prepare(db, "SELECT attempt, started_at, finished_at, exit_code, reason "
                                  "FROM attempts WHERE job_id=? ORDER BY attempt");
    if (!s || !a) {
        db_fail(db, err, "loading jobs");
        goto out;
    }
    int step;
    while ((step = sqlite3_step(s)) == SQLITE_ROW) {
        td_db_job j = {0};
        j.id = (long)sqlite3_column_int64(s, 0);
        copy_text(s, 1, j.name, sizeof j.name);
        copy_text(s, 2, j.kind, sizeof j.kind);
        const unsigned char *spec = sqlite3_column_text(s, 3);
        j.spec = td_strdup(spec ? (const char *)spec : "{}");
        j.nproc = sqlite3_column_int(s, 4);
        j.max_restarts = sqlite3_column_int(s, 5);
        j.restarts = sqlite3_column_int(s, 6);
        copy_text(s, 7, j.state, sizeof j.state);
        j.created_at = column_time(s, 8);
        j.started_at = column_time(s, 9);
        j.finished_at = column_time(s, 10);
        j.exit_code = column_code(s, 11);
        copy_text(s, 12, j.reason, sizeof j.reason);
        j.pgid = (long)sqlite3_column_int64(s, 13);
        j.last_seq = (long)sqlite3_column_int64(s, 14);
        j.priority = sqlite3_column_int(s, 15);
        j.time_limit_s = sqlite3_column_double(s, 16);
        j.out_offset = (long long)sqlite3_column_int64(s, 17);
        j.owner = (long)sqlite3_column_int64(s, 18);
        copy_text(s, 19, j.owner_name, sizeof j.owner_name);
        j.uid = (long)sqlite3_column_int64(s, 20);
        int n = 0, cap = 4;
        td_db_attempt *list = td_calloc((size_t)cap, sizeof *list);
        sqlite3_reset(a);
        sqlite3_bind_int64(a, 1, j.id);
        while (sqlite3_step(a) == SQLITE_ROW) {
            if (n == cap) {
                cap *= 2;
                list = td_realloc(list, (size_t)cap * sizeof *list);
            }
            td_db_attempt *t = &list[n++];
            t->attempt = sqlite3_column_int(a, 0);
            t->started_at = column_time(a, 1);
            t->finished_at = column_time(a, 2);
            t->exit_code = column_code(a, 3);
            copy_text(a, 4, t->reason, sizeof t->reason);
        }
        fn(ctx, &j, list, n);
        free(list);
    }
    if (step != SQLITE_DONE)
        db_fail(db, err, "loading jobs");
    else
        rc = 0;
out:
    sqlite3_finalize(s);
    sqlite3_finalize(a);
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_events(td_db *db, long job_id, long after, int limit, td_db_event_fn fn, void *ctx,
                 td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = 0;
    sqlite3_stmt *s = prepare(db, "SELECT seq, type, data FROM events WHERE job_id=? AND seq>? "
                                  "ORDER BY seq LIMIT ?");
    if (!s) {
        rc = db_fail(db, err, "reading events");
        goto out;
    }
    sqlite3_bind_int64(s, 1, job_id);
    sqlite3_bind_int64(s, 2, after);
    sqlite3_bind_int(s, 3, limit);
    while (sqlite3_step(s) == SQLITE_ROW)
        fn(ctx, (long)sqlite3_column_int64(s, 0), (const char *)sqlite3_column_text(s, 1),
           (const char *)sqlite3_column_text(s, 2));
    sqlite3_finalize(s);
out:
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_metrics(td_db *db, long job_id, long since, td_db_metric_fn fn, void *ctx, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = 0;
    /* within a step, in the order the events happened (train, eval, done), not by name */
    sqlite3_stmt *s = prepare(db, "SELECT data FROM metrics WHERE job_id=? AND step>? "
                                  "ORDER BY step, seq");
    if (!s) {
        rc = db_fail(db, err, "reading metrics");
        goto out;
    }
    sqlite3_bind_int64(s, 1, job_id);
    sqlite3_bind_int64(s, 2, since);
    while (sqlite3_step(s) == SQLITE_ROW) fn(ctx, (const char *)sqlite3_column_text(s, 0));
    sqlite3_finalize(s);
out:
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_checkpoints(td_db *db, long job_id, long step, td_db_checkpoint_fn fn, void *ctx,
                      td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = 0;
    sqlite3_stmt *s = prepare(db, "SELECT step, path, size, created_at FROM checkpoints "
                                  "WHERE job_id=? AND (?<0 OR step=?) ORDER BY step");
    if (!s) {
        rc = db_fail(db, err, "reading checkpoints");
        goto out;
    }
    sqlite3_bind_int64(s, 1, job_id);
    sqlite3_bind_int64(s, 2, step);
    sqlite3_bind_int64(s, 3, step);
    /* rows are copied out first: the callback reads the file system, not under this lock */
    int n = 0, cap = 0;
    td_db_checkpoint *rows = NULL;
    while (sqlite3_step(s) == SQLITE_ROW) {
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            rows = td_realloc(rows, (size_t)cap * sizeof *rows);
        }
        td_db_checkpoint *c = &rows[n++];
        c->step = (long)sqlite3_column_int64(s, 0);
        copy_text(s, 1, c->path, sizeof c->path);
        c->size = (long long)sqlite3_column_int64(s, 2);
        c->created_at = sqlite3_column_double(s, 3);
    }
    sqlite3_finalize(s);
    pthread_mutex_unlock(&db->mu);
    for (int i = 0; i < n; i++) fn(ctx, &rows[i]);
    free(rows);
    return 0;
out:
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_checkpoint_path(td_db *db, long job_id, long step, char *path, size_t len, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = 0;
    sqlite3_stmt *s = prepare(db, "SELECT path FROM checkpoints WHERE job_id=? AND step=?");
    if (!s) {
        rc = db_fail(db, err, "reading a checkpoint");
        goto out;
    }
    sqlite3_bind_int64(s, 1, job_id);
    sqlite3_bind_int64(s, 2, step);
    if (sqlite3_step(s) == SQLITE_ROW) {
        copy_text(s, 0, path, len);
        rc = 1;
    }
    sqlite3_finalize(s);
out:
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_delete_jobs(td_db *db, const long *ids, int n, td_err *err) {
    static const char *const SQL[] = {
        "DELETE FROM events WHERE job_id=?",
        "DELETE FROM metrics WHERE job_id=?",
        "DELETE FROM checkpoints WHERE job_id=?",
        "DELETE FROM attempts WHERE job_id=?",
        "DELETE FROM jobs WHERE id=?",
    };
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    if (exec_locked(db, "BEGIN IMMEDIATE", err) != 0) goto out;
    for (size_t i = 0; i < sizeof SQL / sizeof SQL[0]; i++) {
        sqlite3_stmt *s = prepare(db, SQL[i]);
        if (!s) {
            db_fail(db, err, "preparing a job's deletion");
            goto rollback;
        }
        for (int k = 0; k < n; k++) {
            sqlite3_reset(s);
            sqlite3_bind_int64(s, 1, ids[k]);
            int r = sqlite3_step(s);
            if (r != SQLITE_DONE) {
                db_fail(db, err, "deleting a job");
                sqlite3_finalize(s);
                goto rollback;
            }
        }
        sqlite3_finalize(s);
    }
    if (exec_locked(db, "COMMIT", err) != 0) goto rollback;
    /* the pages freed go back to the filesystem (a database made with auto_vacuum incremental;
     * an older one reuses them for new rows instead): a no-op when nothing is free */
    sqlite3_exec(db->db, "PRAGMA incremental_vacuum", NULL, NULL, NULL);
    rc = 0;
    goto out;
rollback:
    sqlite3_exec(db->db, "ROLLBACK", NULL, NULL, NULL);
out:
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_set_drained(td_db *db, const char *name, bool drained, td_err *err) {
    pthread_mutex_lock(&db->mu);
    sqlite3_stmt *s = prepare(db, drained ? "INSERT OR IGNORE INTO drained_nodes (name, since) "
                                            "VALUES (?, ?)"
                                          : "DELETE FROM drained_nodes WHERE name=?");
    int rc = -1;
    if (!s) {
        db_fail(db, err, "preparing a node's drain");
    } else {
        sqlite3_bind_text(s, 1, name, -1, SQLITE_TRANSIENT);
        if (drained) sqlite3_bind_double(s, 2, (double)time(NULL));
        rc = step_done(db, s, err, drained ? "draining a node" : "undraining a node");
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_drained_nodes(td_db *db, td_db_name_fn fn, void *ctx, td_err *err) {
    pthread_mutex_lock(&db->mu);
    sqlite3_stmt *s = prepare(db, "SELECT name FROM drained_nodes ORDER BY name");
    int rc = -1;
    if (!s) {
        db_fail(db, err, "reading the drained nodes");
    } else {
        int step;
        while ((step = sqlite3_step(s)) == SQLITE_ROW)
            fn(ctx, (const char *)sqlite3_column_text(s, 0));
        rc = step == SQLITE_DONE ? 0 : db_fail(db, err, "reading the drained nodes");
        sqlite3_finalize(s);
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_insert_token(td_db *db, td_db_token *t, td_err *err) {
    pthread_mutex_lock(&db->mu);
    sqlite3_stmt *s = prepare(db, "INSERT INTO tokens (name, scope, hash, created_at, created_by) "
                                  "VALUES (?,?,?,?,?)");
    int rc = -1;
    if (!s) {
        db_fail(db, err, "preparing a token insert");
    } else {
        sqlite3_bind_text(s, 1, t->name, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, t->scope, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, t->hash, -1, SQLITE_STATIC);
        sqlite3_bind_double(s, 4, t->created_at);
        sqlite3_bind_int64(s, 5, t->created_by);
        rc = step_done(db, s, err, "storing a token");
        if (rc == 0) t->id = (long)sqlite3_last_insert_rowid(db->db);
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_revoke_token(td_db *db, long id, double at, td_err *err) {
    pthread_mutex_lock(&db->mu);
    sqlite3_stmt *s =
        prepare(db, "UPDATE tokens SET revoked_at=? WHERE id=? AND revoked_at IS NULL");
    int rc = -1;
    if (!s) {
        db_fail(db, err, "preparing a token's revocation");
    } else {
        sqlite3_bind_double(s, 1, at);
        sqlite3_bind_int64(s, 2, id);
        rc = step_done(db, s, err, "revoking a token");
        if (rc == 0) rc = sqlite3_changes(db->db) > 0;
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_load_tokens(td_db *db, td_db_token_fn fn, void *ctx, td_err *err) {
    pthread_mutex_lock(&db->mu);
    sqlite3_stmt *s = prepare(db, "SELECT id, name, scope, hash, created_at, created_by, "
                                  "revoked_at FROM tokens ORDER BY id");
    int rc = -1;
    if (!s) {
        db_fail(db, err, "reading the tokens");
    } else {
        int step;
        while ((step = sqlite3_step(s)) == SQLITE_ROW) {
            td_db_token t = {.id = (long)sqlite3_column_int64(s, 0)};
            copy_text(s, 1, t.name, sizeof t.name);
            copy_text(s, 2, t.scope, sizeof t.scope);
            copy_text(s, 3, t.hash, sizeof t.hash);
            t.created_at = column_time(s, 4);
            t.created_by = (long)sqlite3_column_int64(s, 5);
            t.revoked_at = column_time(s, 6);
            fn(ctx, &t);
        }
        rc = step == SQLITE_DONE ? 0 : db_fail(db, err, "reading the tokens");
        sqlite3_finalize(s);
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}
