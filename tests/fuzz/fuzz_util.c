/* The harnesses' shared helpers (fuzz_util.h). Per-process state only: the scratch directory's
 * name, made once. */
#define _GNU_SOURCE /* memfd_create, nftw's FTW_PHYS */
#include "fuzz_util.h"

#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

void fuzz_fail(const char *file, int line, const char *cond, const char *fmt, ...) {
    fprintf(stderr, "%s:%d: invariant broken: %s: ", file, line, cond);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort(); /* libFuzzer's deadly signal: the input is saved as a crash */
}

bool fuzz_debug(void) {
    static int on = -1;
    if (on < 0) on = getenv("FUZZ_DEBUG") != NULL;
    return on;
}

static char scratch[PATH_MAX - 64];
static pid_t scratch_owner; /* a child that inherited it must not remove it */

static int remove_one(const char *path, const struct stat *st, int flag, struct FTW *ftw) {
    (void)st, (void)ftw;
    if (flag == FTW_DP)
        rmdir(path);
    else
        unlink(path);
    return 0;
}

static void remove_scratch(void) {
    if (scratch[0] && getpid() == scratch_owner)
        nftw(scratch, remove_one, 16, FTW_DEPTH | FTW_PHYS);
}

const char *fuzz_dir(void) {
    if (scratch[0]) return scratch;
    /* tmpfs unless told otherwise: some harnesses rewrite a file per input, and on ext4 each
     * close of a rewritten file starts a writeback */
    const char *tmp = getenv("TMPDIR");
    if (!tmp || !*tmp) tmp = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
    snprintf(scratch, sizeof scratch, "%s/traind-fuzz-XXXXXX", tmp);
    if (!mkdtemp(scratch)) {
        fprintf(stderr, "fuzz: cannot make a scratch directory %s: %s\n", scratch, strerror(errno));
        exit(1);
    }
    scratch_owner = getpid();
    atexit(remove_scratch);
    return scratch;
}

void fuzz_path(char *path, size_t len, const char *name) {
    if ((size_t)snprintf(path, len, "%s/%s", fuzz_dir(), name) >= len) {
        fprintf(stderr, "fuzz: path %s/%s too long\n", fuzz_dir(), name);
        exit(1);
    }
}

static void write_all(int fd, const void *data, size_t n, const char *what) {
    for (size_t done = 0; done < n;) {
        ssize_t k = write(fd, (const char *)data + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {
            fprintf(stderr, "fuzz: writing %s: %s\n", what, strerror(errno));
            exit(1);
        }
        done += (size_t)k;
    }
}

void fuzz_write_file(const char *path, const void *data, size_t n) {
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) {
        fprintf(stderr, "fuzz: cannot create %s: %s\n", path, strerror(errno));
        exit(1);
    }
    write_all(fd, data, n, path);
    if (close(fd) != 0) {
        fprintf(stderr, "fuzz: closing %s: %s\n", path, strerror(errno));
        exit(1);
    }
}

void fuzz_file_open(fuzz_file *f, const char *name) {
    f->fd = memfd_create(name, MFD_CLOEXEC);
    if (f->fd < 0) {
        fprintf(stderr, "fuzz: memfd_create: %s\n", strerror(errno));
        exit(1);
    }
    snprintf(f->path, sizeof f->path, "/proc/self/fd/%d", f->fd);
}

void fuzz_file_set(fuzz_file *f, const void *data, size_t n) {
    if (ftruncate(f->fd, 0) != 0 || lseek(f->fd, 0, SEEK_SET) != 0) {
        fprintf(stderr, "fuzz: resetting %s: %s\n", f->path, strerror(errno));
        exit(1);
    }
    write_all(f->fd, data, n, f->path);
}

char *fuzz_text(const uint8_t *data, size_t size) {
    char *t = malloc(size + 1);
    if (!t) {
        fprintf(stderr, "fuzz: out of memory\n");
        exit(1);
    }
    if (size) memcpy(t, data, size);
    t[size] = 0;
    return t;
}

void fuzz_split(const uint8_t *data, size_t size, const char *sep, const uint8_t **a, size_t *na,
                const uint8_t **b, size_t *nb) {
    size_t k = strlen(sep);
    const uint8_t *at = k && size >= k ? memmem(data, size, sep, k) : NULL;
    *a = data;
    if (!at) {
        *na = size, *b = data + size, *nb = 0;
        return;
    }
    *na = (size_t)(at - data);
    *b = at + k;
    *nb = size - *na - k;
}
