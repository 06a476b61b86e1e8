/* Inside the state database (td_db.h), shared by its files:
 *   td_db.c         opening it: the schema, migrations, a full disk
 *   td_db_jobs.c    writing a job's rows: the job, its attempts, events, metrics, checkpoints,
 *                   and deleting them (retention)
 *   td_db_read.c    reading them back: the jobs at start, events, metrics and checkpoints
 *   td_db_tokens.c  the API's tokens
 *   td_db_nodes.c   the drained nodes
 *   td_db_experiments.c  experiments (their trials are jobs rows)
 * The helpers below are static inline: each file uses only some of them. */
#ifndef TD_DB_PRIVATE_H
#define TD_DB_PRIVATE_H

#include "service/store/td_db.h"

#include <pthread.h>
#include <sqlite3.h>
#include <stdatomic.h>
#include <stdio.h>

struct td_db {
    sqlite3 *db;
    pthread_mutex_t mu;
    atomic_bool full; /* the last write failed for want of disk space */
};

static inline int db_fail(td_db *db, td_err *err, const char *what) {
    bool full = sqlite3_errcode(db->db) == SQLITE_FULL;
    atomic_store(&db->full, full);
    return td_fail(err, "state database: %s: %s%s", what, sqlite3_errmsg(db->db),
                   full ? " (the state directory's filesystem has no space left)" : "");
}

/* Runs a prepared statement to completion under the lock held by the caller. */
static inline int step_done(td_db *db, sqlite3_stmt *s, td_err *err, const char *what) {
    int rc = sqlite3_step(s);
    sqlite3_finalize(s);
    return rc == SQLITE_DONE ? 0 : db_fail(db, err, what);
}

static inline sqlite3_stmt *prepare(td_db *db, const char *sql) {
    sqlite3_stmt *s = NULL;
    if (sqlite3_prepare_v2(db->db, sql, -1, &s, NULL) != SQLITE_OK) return NULL;
    return s;
}

static inline void copy_text(sqlite3_stmt *s, int col, char *out, size_t len) {
    const unsigned char *t = sqlite3_column_text(s, col);
    snprintf(out, len, "%s", t ? (const char *)t : "");
}

static inline double column_time(sqlite3_stmt *s, int col) {
    return sqlite3_column_type(s, col) == SQLITE_NULL ? 0 : sqlite3_column_double(s, col);
}

#endif
