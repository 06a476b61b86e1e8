/* SHA-256 (td_sha256.h) over OpenSSL's EVP interface. */
#include "base/td_sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <openssl/evp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

struct td_sha256 {
    EVP_MD_CTX *ctx;
};

td_sha256 *td_sha256_new(void) {
    td_sha256 *h = td_calloc(1, sizeof *h);
    h->ctx = EVP_MD_CTX_new();
    TD_CHECK_ALLOC(h->ctx, "a SHA-256 context");
    TD_ASSERT(EVP_DigestInit_ex(h->ctx, EVP_sha256(), NULL) == 1, "SHA-256 is not available");
    return h;
}

void td_sha256_update(td_sha256 *h, const void *data, size_t n) {
    if (n) EVP_DigestUpdate(h->ctx, data, n);
}

void td_sha256_finish(td_sha256 *h, char hex[TD_SHA256_HEX]) {
    unsigned char md[EVP_MAX_MD_SIZE];
    unsigned int n = 0;
    EVP_DigestFinal_ex(h->ctx, md, &n);
    for (unsigned int i = 0; i < n && i < 32; i++) snprintf(hex + 2 * i, 3, "%02x", md[i]);
    hex[64] = 0;
    EVP_MD_CTX_free(h->ctx);
    free(h);
}

int td_sha256_fd(int fd, const char *name, char hex[TD_SHA256_HEX], long long *size, td_err *err) {
    td_sha256 *h = td_sha256_new();
    char buf[1 << 16];
    long long total = 0;
    for (;;) {
        ssize_t k = pread(fd, buf, sizeof buf, (off_t)total);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            int e = errno;
            td_sha256_finish(h, hex);
            return td_fail(err, "cannot read %s: %s", name, strerror(e));
        }
        if (k == 0) break;
        td_sha256_update(h, buf, (size_t)k);
        total += k;
    }
    td_sha256_finish(h, hex);
    if (size) *size = total;
    return 0;
}

int td_sha256_file(const char *path, char hex[TD_SHA256_HEX], long long *size, td_err *err) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return td_fail(err, "cannot open %s: %s", path, strerror(errno));
    int rc = td_sha256_fd(fd, path, hex, size, err);
    close(fd);
    return rc;
}
