/* SHA-256 of files and of byte streams, in lowercase hex: how a checkpoint that crosses the
 * network between nodes is checked to have arrived whole (OpenSSL's libcrypto computes it). */
#ifndef TD_SHA256_H
#define TD_SHA256_H

#include "base/td_error.h"

#include <stddef.h>

#define TD_SHA256_HEX 65 /* 64 digits and the NUL */

typedef struct td_sha256 td_sha256;

td_sha256 *td_sha256_new(void);
void td_sha256_update(td_sha256 *h, const void *data, size_t n);
/* Writes the digest and frees h. */
void td_sha256_finish(td_sha256 *h, char hex[TD_SHA256_HEX]);

/* The digest of a whole file, and its size. */
int td_sha256_file(const char *path, char hex[TD_SHA256_HEX], long long *size, td_err *err);
/* The same of the file open at fd, read from its start (pread: the offset stays); name for the
 * message. */
int td_sha256_fd(int fd, const char *name, char hex[TD_SHA256_HEX], long long *size, td_err *err);

#endif
