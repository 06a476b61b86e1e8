/* The state database opened (td_db.h): its schema, the columns later releases added, and
 * whether its disk is full. td_db_private.h lists the other files. */
#include "service/store/td_db_private.h"

#include <limits.h>
#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/statvfs.h>
#include <time.h>

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
    /* API tokens: only their SHA-256 (service/store/td_tokens.c says why a plain hash is enough) */
    "CREATE TABLE IF NOT EXISTS tokens ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, scope TEXT NOT NULL,"
    "  hash TEXT NOT NULL UNIQUE, created_at REAL NOT NULL, created_by INTEGER NOT NULL,"
    "  revoked_at REAL);"
    /* experiments (service/exp/): each one's body and state; its trials are jobs whose
     * experiment column names it */
    "CREATE TABLE IF NOT EXISTS experiments ("
    "  id INTEGER PRIMARY KEY AUTOINCREMENT, name TEXT NOT NULL, spec TEXT NOT NULL,"
    "  state TEXT NOT NULL, created_at REAL NOT NULL, finished_at REAL, reason TEXT,"
    "  owner INTEGER NOT NULL, owner_name TEXT NOT NULL);";

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
    {"jobs", "experiment", "INTEGER NOT NULL DEFAULT 0"},
    {"jobs", "trial", "INTEGER NOT NULL DEFAULT -1"},
    {"jobs", "stop_at_step", "INTEGER NOT NULL DEFAULT 0"},
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
