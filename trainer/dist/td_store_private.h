/* The rendezvous store's wire protocol and its server, shared by the client (td_store.c) and the
 * server (td_store_server.c). Messages: request = op (1 byte), key length (4, little-endian), key,
 * value length (8), value; reply = status (1 byte), length (8), payload. HELLO, READY and ABORT
 * carry the namespace as their key, the others "<namespace>/<key>". */
#ifndef TD_STORE_PRIVATE_H
#define TD_STORE_PRIVATE_H

#include "dist/td_store.h"

enum { OP_HELLO = 1, OP_SET, OP_GET, OP_ADD, OP_READY, OP_ABORT };
enum {
    REPLY_OK = 0,
    REPLY_REFUSED = 1, /* this call only: a stale attempt, a late abort */
    REPLY_FAILED = 2   /* the rendezvous failed; the payload says why */
};

#define MAX_KEY     4096
#define MAX_VALUE   (64u << 20)
#define MAX_CLIENTS 1024

/* Rank 0's server: listening on host:*port (0: a free port, written back) for namespace_. */
typedef struct td_store_server td_store_server;
int td_store_server_start(td_store_server **out, const char *host, int *port,
                          const char *namespace_, td_err *err);
/* Answers the GETs still waiting (so ranks hear why rank 0 left), then closes every connection. */
void td_store_server_stop(td_store_server *s);

#endif
