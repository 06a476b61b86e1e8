/* Inside the HTTP API (td_api.h), shared by its files:
 *   td_api.c             the server, authentication, the route table, the job routes
 *   td_api_stream.c      the responses that stay open: Server-Sent Events and followed logs
 *   td_api_checkpoint.c  checkpoint listings, files with Range, and whole checkpoints as tar
 *   td_api_files.c       a job's files between its master and its nodes (cluster secret)
 * Every reply goes out through td_api_respond, so each carries its content type and headers the
 * same way, and every error is td_api_error's JSON object. */
#ifndef TD_API_PRIVATE_H
#define TD_API_PRIVATE_H

#include "api/td_api.h"

#include <microhttpd.h>
#include <stdbool.h>
#include <stdint.h>

struct td_api {
    td_api_config cfg;
    char token[128];
    char master[256]; /* cfg.master's copy */
    td_jobs *jobs;
    struct MHD_Daemon *daemon;
    int port;
};

extern const char TD_API_JSON[]; /* "application/json" */

/* Sets the content type and any further headers (name, value, ..., NULL), queues r and releases
 * it. r NULL (out of memory) drops the connection: nothing else is left to do. */
enum MHD_Result td_api_respond(struct MHD_Connection *c, unsigned status, struct MHD_Response *r,
                               const char *type, ...);
/* b's bytes as the body (b is emptied). */
enum MHD_Result td_api_reply_buf(struct MHD_Connection *c, unsigned status, td_buf *b);
/* {"error": {"code", "message", "field"}} with e's status; Allow when given. */
enum MHD_Result td_api_error(struct MHD_Connection *c, const td_reply_error *e, const char *allow);
enum MHD_Result td_api_fail(struct MHD_Connection *c, int status, const char *code,
                            const char *field, const char *message);

/* A non-negative decimal of n characters; false for anything else (signs, spaces, overflow). */
bool td_api_parse_id(const char *s, size_t n, long *out);
/* Query parameter `name` in [min, max]: true when given and good, *bad when given and not. */
bool td_api_query_long(struct MHD_Connection *c, const char *name, long min, long max, long *out,
                       bool *bad);

/* Bytes made ahead of what libmicrohttpd has asked for (SSE records, tar blocks). */
typedef struct td_api_pending {
    td_buf buf;
    size_t off;
} td_api_pending;
/* Copies what is pending into buf, at most max; 0 when nothing is, and then the buffer is
 * emptied for the caller to make more. */
size_t td_api_pending_take(td_api_pending *p, char *buf, size_t max);

/* GET /v1/jobs/{id}/events and /logs (td_api_stream.c) */
enum MHD_Result td_api_events(td_api *api, struct MHD_Connection *c, long id);
enum MHD_Result td_api_logs(td_api *api, struct MHD_Connection *c, long id);
/* GET /v1/jobs/{id}/checkpoints and .../checkpoints/{tail} (td_api_checkpoint.c) */
enum MHD_Result td_api_checkpoints(td_api *api, struct MHD_Connection *c, long id);
enum MHD_Result td_api_checkpoint(td_api *api, struct MHD_Connection *c, long id, const char *tail);

/* Node-to-node files of a job (td_api_files.c): an upload streams through begin, chunk and end
 * (abandon drops it when the connection ends first). */
struct td_sha256;
typedef struct td_api_upload {
    char path[8192], tmp[8300];
    int fd;
    struct td_sha256 *hash;
    long long size;
    td_reply_error error; /* status 0: none so far */
} td_api_upload;
bool td_api_is_file_upload(const char *url, const char *method);
void td_api_upload_begin(td_api *api, struct MHD_Connection *c, const char *url, td_api_upload *u);
void td_api_upload_chunk(td_api_upload *u, const char *data, size_t n);
enum MHD_Result td_api_upload_end(struct MHD_Connection *c, td_api_upload *u);
void td_api_upload_abandon(td_api_upload *u);
enum MHD_Result td_api_file_get(td_api *api, struct MHD_Connection *c, const char *url);

#endif
