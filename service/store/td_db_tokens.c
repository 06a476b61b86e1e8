/* The API's tokens in the state database: stored as digests, revoked, loaded as the daemon
 * starts (td_tokens.h keeps them in memory). Apart from the jobs' rows: they are the API's. */
#include "service/store/td_db_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
