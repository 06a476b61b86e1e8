/* Experiments' rows in the state database (service/exp/ keeps them): the body as submitted and
 * the state. Their trials are jobs rows (td_db_jobs.c) whose experiment column names them, so a
 * trial and its place in the experiment are stored in one insert. */
#include "service/store/td_db_private.h"

#include <stdlib.h>
#include <string.h>

int td_db_insert_experiment(td_db *db, td_db_experiment *e, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    sqlite3_stmt *s = prepare(db, "INSERT INTO experiments (name, spec, state, created_at, owner, "
                                  "owner_name) VALUES (?,?,?,?,?,?)");
    if (!s) {
        db_fail(db, err, "preparing an experiment insert");
    } else {
        sqlite3_bind_text(s, 1, e->name, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 2, e->spec, -1, SQLITE_STATIC);
        sqlite3_bind_text(s, 3, e->state, -1, SQLITE_STATIC);
        sqlite3_bind_double(s, 4, e->created_at);
        sqlite3_bind_int64(s, 5, e->owner);
        sqlite3_bind_text(s, 6, e->owner_name, -1, SQLITE_STATIC);
        rc = step_done(db, s, err, "inserting an experiment");
        if (rc == 0) e->id = (long)sqlite3_last_insert_rowid(db->db);
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_update_experiment(td_db *db, const td_db_experiment *e, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    sqlite3_stmt *s =
        prepare(db, "UPDATE experiments SET state=?, finished_at=?, reason=? WHERE id=?");
    if (!s) {
        db_fail(db, err, "preparing an experiment update");
    } else {
        sqlite3_bind_text(s, 1, e->state, -1, SQLITE_STATIC);
        if (e->finished_at > 0)
            sqlite3_bind_double(s, 2, e->finished_at);
        else
            sqlite3_bind_null(s, 2);
        sqlite3_bind_text(s, 3, e->reason, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 4, e->id);
        rc = step_done(db, s, err, "updating an experiment");
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_delete_experiment(td_db *db, long id, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    sqlite3_stmt *s = prepare(db, "DELETE FROM experiments WHERE id=?");
    if (!s) {
        db_fail(db, err, "preparing an experiment's removal");
    } else {
        sqlite3_bind_int64(s, 1, id);
        rc = step_done(db, s, err, "removing an experiment");
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_load_experiments(td_db *db, td_db_experiment_fn fn, void *ctx, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    sqlite3_stmt *s = prepare(db, "SELECT id, name, spec, state, created_at, finished_at, reason, "
                                  "owner, owner_name FROM experiments ORDER BY id");
    if (!s) {
        db_fail(db, err, "loading experiments");
    } else {
        int step;
        while ((step = sqlite3_step(s)) == SQLITE_ROW) {
            td_db_experiment e = {0};
            e.id = (long)sqlite3_column_int64(s, 0);
            copy_text(s, 1, e.name, sizeof e.name);
            const unsigned char *spec = sqlite3_column_text(s, 2);
            e.spec = td_strdup(spec ? (const char *)spec : "{}");
            copy_text(s, 3, e.state, sizeof e.state);
            e.created_at = column_time(s, 4);
            e.finished_at = column_time(s, 5);
            copy_text(s, 6, e.reason, sizeof e.reason);
            e.owner = (long)sqlite3_column_int64(s, 7);
            copy_text(s, 8, e.owner_name, sizeof e.owner_name);
            fn(ctx, &e);
        }
        rc = step == SQLITE_DONE ? 0 : db_fail(db, err, "loading experiments");
        sqlite3_finalize(s);
    }
    pthread_mutex_unlock(&db->mu);
    return rc;
}
