/* API tokens with scopes, and what each may spend: the registry the HTTP server checks every
 * request against.
 *
 * A token is 32 random bytes in hex, shown once when it is made; the database keeps only its
 * SHA-256. Scopes nest: read (every GET), submit (read, submit jobs, cancel and delete its own),
 * admin (everything: any job, nodes, tokens). The first start writes an admin token to
 * STATE_DIR/token (mode 0600) for the operator and clients on the host; revoking that one removes
 * the file. A revoked token is refused from the moment the revocation is answered.
 *
 * Per token, the limits a reload may change: requests per second (a bucket of twice that many,
 * refilled continuously), concurrent event streams and followed logs, queued jobs and the bytes
 * of its jobs' specs (td_jobs counts those), dashboard sessions (the API's). */
#ifndef TD_TOKENS_H
#define TD_TOKENS_H

#include "base/td_buf.h"
#include "service/store/td_db.h"
#include "base/td_log.h"
#include "service/submit/td_submit.h" /* td_reply_error */

#include <stdbool.h>

typedef enum { TD_SCOPE_NONE, TD_SCOPE_READ, TD_SCOPE_SUBMIT, TD_SCOPE_ADMIN } td_scope;

/* Who a request comes from: its token. */
typedef struct td_principal {
    long id; /* 0: nobody (no token) */
    char name[64];
    td_scope scope;
} td_principal;

typedef struct td_tokens td_tokens;

typedef struct td_tokens_limits {
    double requests_per_s; /* 0: no limit */
    int streams;           /* concurrent event streams and followed logs per token; 0: none */
    int queued;            /* queued jobs per token (td_jobs checks it); 0: no limit */
    long long job_bytes;   /* bytes of job specs its jobs hold until deleted (td_jobs) */
    int sessions;          /* dashboard sessions per token (the API keeps them) */
} td_tokens_limits;

/* Loads the tokens from db. bootstrap_path (STATE_DIR/token): a token found there that the
 * database does not know is stored as the admin token "bootstrap" (a daemon older than scopes
 * wrote it); none there while no admin token is live makes one. */
int td_tokens_open(td_tokens **out, td_db *db, const char *bootstrap_path, td_log *log,
                   td_err *err);
void td_tokens_close(td_tokens *t);
void td_tokens_set_limits(td_tokens *t, const td_tokens_limits *limits);
td_tokens_limits td_tokens_get_limits(td_tokens *t);

/* Whether secret is a live token; *who filled when it is. */
bool td_tokens_check(td_tokens *t, const char *secret, td_principal *who);
/* Whether token id is still live (a browser session's token); *who filled when it is. */
bool td_tokens_live(td_tokens *t, long id, td_principal *who);

/* POST /v1/tokens {"name", "scope"}: 201 with the token (its only showing) in out. by: the
 * admin making it. */
int td_tokens_create(td_tokens *t, const char *body, size_t len, const td_principal *by,
                     td_buf *out, td_reply_error *e);
/* DELETE /v1/tokens/{id}: 404 for no such live token. */
int td_tokens_revoke(td_tokens *t, long id, const td_principal *by, td_reply_error *e);
/* GET /v1/tokens: every token, live and revoked, without secrets. */
void td_tokens_list(td_tokens *t, td_buf *out);

/* One request of token id at monotonic time now: false (and *retry_after_s) when over its rate. */
bool td_tokens_admit(td_tokens *t, long id, double now, double *retry_after_s);
/* An event stream opening (false: the token holds its limit of them) and closing. */
bool td_tokens_stream_begin(td_tokens *t, long id);
void td_tokens_stream_end(td_tokens *t, long id);

const char *td_scope_name(td_scope s);

#endif
