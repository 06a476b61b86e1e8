/* Reading the state database back: every job as the daemon starts, and a job's events, metrics
 * and checkpoints as the API asks. Apart from the writes (td_db_jobs.c): nothing here changes a
 * row. */
#include "service/store/td_db_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
                    "uid, experiment, trial, stop_at_step FROM jobs "
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
        j.experiment = (long)sqlite3_column_int64(s, 21);
        j.trial = sqlite3_column_int(s, 22);
        j.stop_at_step = (long)sqlite3_column_int64(s, 23);
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
