/* The cluster's drained nodes in the state database: a drain outlives a master's restart.
 * Apart from the jobs' rows: they are the cluster's. */
#include "service/store/td_db_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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
