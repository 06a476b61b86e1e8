/* Writing a job's rows in the state database: the job, its attempts, its events with the
 * metrics and checkpoints they carry (one transaction with the job's row), and deleting a job's
 * rows for retention. Apart from reading them back (td_db_read.c): every change here is
 * committed before the caller announces it. */
#include "service/store/td_db_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

static int exec_locked(td_db *db, const char *sql, td_err *err) {
    return sqlite3_exec(db->db, sql, NULL, NULL, NULL) == SQLITE_OK ? 0 : db_fail(db, err, sql);
}

int td_db_insert_job(td_db *db, td_db_job *job, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    sqlite3_stmt *s =
        prepare(db, "INSERT INTO jobs (name, kind, spec, nproc, max_restarts, restarts, state, "
                    "created_at, priority, time_limit, owner, owner_name, uid, experiment, "
                    "trial, stop_at_step) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)");
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
    sqlite3_bind_int64(s, 14, job->experiment);
    sqlite3_bind_int(s, 15, job->experiment > 0 ? job->trial : -1);
    sqlite3_bind_int64(s, 16, job->stop_at_step);
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
                                  "out_offset=?, uid=?, stop_at_step=? WHERE id=?");
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
    sqlite3_bind_int64(s, 11, job->stop_at_step);
    sqlite3_bind_int64(s, 12, job->id);
    return step_done(db, s, err, "updating a job");
}

int td_db_update_job(td_db *db, const td_db_job *job, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = update_job_locked(db, job, err);
    pthread_mutex_unlock(&db->mu);
    return rc;
}

int td_db_update_job_spec(td_db *db, long id, const char *spec, td_err *err) {
    pthread_mutex_lock(&db->mu);
    int rc = -1;
    sqlite3_stmt *s = prepare(db, "UPDATE jobs SET spec=? WHERE id=?");
    if (s) {
        sqlite3_bind_text(s, 1, spec, -1, SQLITE_STATIC);
        sqlite3_bind_int64(s, 2, id);
        rc = step_done(db, s, err, "updating a job's body");
    } else {
        db_fail(db, err, "preparing a job's body update");
    }
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
