#define _GNU_SOURCE /* O_PATH, syscall, fdopendir */
#include "service/run/td_jobfs.h"

#include "base/td_sha256.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/openat2.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

static atomic_bool force_fallback;

void td_jobfs_force_fallback(bool on) {
    atomic_store(&force_fallback, on);
}

/* Whether rel is "a/b/c" with no empty, "." or ".." component and no leading "/". */
static bool relative_ok(const char *rel) {
    if (!rel || !*rel || rel[0] == '/') return false;
    for (const char *p = rel; *p;) {
        size_t n = strcspn(p, "/");
        if (n == 0 || (n == 1 && p[0] == '.') || (n == 2 && p[0] == '.' && p[1] == '.'))
            return false;
        p += n;
        if (*p == '/' && !*++p) return false; /* a trailing "/" */
    }
    return true;
}

static const char *why_not(int e) {
    switch (e) {
    case ELOOP:
        return "a symbolic link in the way (not followed)";
    case EXDEV:
        return "it leads outside its directory";
    case ENOTDIR:
        return "a part of it is not a directory (or is a symbolic link)";
    default:
        return strerror(e);
    }
}

/* One component at a time, for kernels without openat2 (and tests): every directory on the way
 * opened O_PATH | O_DIRECTORY | O_NOFOLLOW (a link there is ENOTDIR), the last with
 * O_NOFOLLOW. rel is checked already, so no ".." can climb. */
static int open_by_parts(int dirfd, const char *rel, int flags, mode_t mode) {
    char copy[PATH_MAX];
    if (snprintf(copy, sizeof copy, "%s", rel) >= (int)sizeof copy) return errno = ENAMETOOLONG, -1;
    int cur = dirfd;
    char *save = NULL, *part = strtok_r(copy, "/", &save);
    while (part) {
        char *next = strtok_r(NULL, "/", &save);
        int fd = next ? openat(cur, part, O_PATH | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                      : openat(cur, part, flags, mode);
        int e = errno;
        if (cur != dirfd) close(cur);
        if (fd < 0) return errno = e, -1;
        cur = fd;
        part = next;
    }
    return cur;
}

static int open_beneath(int dirfd, const char *rel, int flags, mode_t mode) {
    if (!atomic_load(&force_fallback)) {
        struct open_how how = {.flags = (unsigned long long)flags,
                               .mode = flags & O_CREAT ? mode : 0,
                               .resolve =
                                   RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS};
        long fd = syscall(SYS_openat2, dirfd, rel, &how, sizeof how);
        if (fd >= 0 || (errno != ENOSYS && errno != EPERM)) return (int)fd;
        /* ENOSYS: a kernel before 5.6; EPERM: a seccomp filter that does not know openat2 */
    }
    return open_by_parts(dirfd, rel, flags, mode);
}

/* A plain open by a path, as who (the job's own rights). */
static int open_as(const td_identity *who, int dirfd, const char *path, int flags, mode_t mode,
                   bool beneath, td_err *err) {
    td_identity_saved saved;
    if (td_identity_become(who, &saved, err) != 0) return -1;
    int fd = beneath ? open_beneath(dirfd, path, flags, mode) : openat(dirfd, path, flags, mode);
    int e = errno;
    td_identity_return(&saved);
    if (fd < 0) td_fail(err, "%s: %s", path, why_not(e));
    errno = e;
    return fd;
}

/* A file opened O_PATH (which opens nothing: no FIFO blocks, no device acts) reopened for
 * reading once fstat says it is a regular file or a directory. */
static int reopen(const td_identity *who, int path_fd, const char *name, int flags, td_err *err) {
    struct stat st;
    if (fstat(path_fd, &st) != 0) {
        td_fail(err, "%s: %s", name, strerror(errno));
        close(path_fd);
        return -1;
    }
    if (!S_ISREG(st.st_mode) && !S_ISDIR(st.st_mode)) {
        td_fail(err, "%s: %s, not a regular file (not opened)", name,
                S_ISFIFO(st.st_mode)   ? "a FIFO"
                : S_ISSOCK(st.st_mode) ? "a socket"
                : S_ISLNK(st.st_mode)  ? "a symbolic link"
                                       : "a device");
        close(path_fd);
        return -1;
    }
    /* (the magic link is the file itself, found already: followed on purpose) */
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", path_fd);
    flags &= ~O_NOFOLLOW;
    int fd = open_as(who, AT_FDCWD, proc, flags, 0, false, err);
    close(path_fd);
    if (fd < 0) td_fail(err, "%s: cannot open it: %s", name, strerror(errno));
    return fd;
}

int td_jobfs_openat(const td_identity *who, int dirfd, const char *rel, int flags, mode_t mode,
                    td_err *err) {
    if (!relative_ok(rel))
        return td_fail(err, "\"%s\": expected a relative path of plain names (no \"..\")", rel);
    flags |= O_NOFOLLOW | O_CLOEXEC;
    /* reading: opened O_PATH first and looked at, so that only a regular file or a directory
     * is ever really opened (a job can make FIFOs; a job run as root could make devices) */
    bool look_first =
        !(flags & (O_PATH | O_CREAT | O_DIRECTORY)) && (flags & O_ACCMODE) == O_RDONLY;
    if (look_first) {
        int p = open_as(who, dirfd, rel, O_PATH | O_NOFOLLOW | O_CLOEXEC, 0, true, err);
        return p < 0 ? -1 : reopen(who, p, rel, (flags & ~O_NOFOLLOW) | O_NONBLOCK, err);
    }
    if (!(flags & O_PATH)) flags |= O_NONBLOCK;
    return open_as(who, dirfd, rel, flags, mode, true, err);
}

bool td_jobfs_below(const char *path, const char *dir, const char **rel) {
    size_t n = strlen(dir);
    while (n > 1 && dir[n - 1] == '/') n--;
    if (strncmp(path, dir, n) != 0 || (path[n] != 0 && path[n] != '/')) return false;
    *rel = path[n] ? path + n + 1 : path + n;
    return true;
}

int td_jobfs_open_path(const td_identity *who, const char *job_dir, const char *path, int flags,
                       td_err *err) {
    char norm[PATH_MAX];
    if (path[0] != '/' || !td_jobfs_normalize("/", path, norm, sizeof norm))
        return td_fail(err, "\"%s\": expected an absolute path", path);
    const char *rel;
    if (job_dir && td_jobfs_below(norm, job_dir, &rel) && *rel) {
        /* the job's directory is the daemon's: what is below it, never through a link */
        int root = open(job_dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
        if (root < 0) return td_fail(err, "%s: %s", job_dir, strerror(errno));
        int fd = td_jobfs_openat(who, root, rel, flags, 0, err);
        close(root);
        return fd;
    }
    /* anywhere else: the job's own rights decide, as they would for the job */
    if (!(flags & (O_PATH | O_CREAT | O_DIRECTORY)) && (flags & O_ACCMODE) == O_RDONLY) {
        int p = open_as(who, AT_FDCWD, norm, O_PATH | O_CLOEXEC, 0, false, err);
        return p < 0 ? -1 : reopen(who, p, norm, flags | O_CLOEXEC | O_NONBLOCK, err);
    }
    return open_as(who, AT_FDCWD, norm, flags | O_CLOEXEC | (flags & O_PATH ? 0 : O_NONBLOCK), 0,
                   false, err);
}

int td_jobfs_check(int fd, const char *name, bool dir, uid_t owner, long long max_size,
                   struct stat *st, td_err *err) {
    struct stat own;
    if (!st) st = &own;
    if (fstat(fd, st) != 0) return td_fail(err, "%s: %s", name, strerror(errno));
    if (dir ? !S_ISDIR(st->st_mode) : !S_ISREG(st->st_mode))
        return td_fail(err, "%s: not a %s", name, dir ? "directory" : "regular file");
    if (owner != TD_JOBFS_ANY_OWNER && st->st_uid != owner)
        return td_fail(err,
                       "%s belongs to uid %u, not to the user the job ran as (uid %u): a job's "
                       "files are its own",
                       name, (unsigned)st->st_uid, (unsigned)owner);
    if (max_size > 0 && (long long)st->st_size > max_size)
        return td_fail(err, "%s: %lld bytes, over the limit of %lld", name, (long long)st->st_size,
                       max_size);
    return 0;
}

int td_jobfs_mkdirs(const td_identity *who, int dirfd, const char *rel, mode_t mode, td_err *err) {
    if (!relative_ok(rel))
        return td_fail(err, "\"%s\": expected a relative path of plain names (no \"..\")", rel);
    char copy[PATH_MAX];
    if (snprintf(copy, sizeof copy, "%s", rel) >= (int)sizeof copy)
        return td_fail(err, "%s: too long a path", rel);
    int cur = dirfd;
    char *save = NULL;
    for (char *part = strtok_r(copy, "/", &save); part; part = strtok_r(NULL, "/", &save)) {
        td_identity_saved saved;
        if (td_identity_become(who, &saved, err) != 0) break;
        int rc = mkdirat(cur, part, mode);
        int e = errno;
        int next = rc == 0 || e == EEXIST
                       ? openat(cur, part, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC)
                       : -1;
        if (next < 0 && rc == 0) e = errno;
        if (next < 0 && rc != 0 && e == EEXIST) e = errno;
        td_identity_return(&saved);
        if (cur != dirfd) close(cur);
        cur = -1;
        if (next < 0) {
            td_fail(err, "cannot create %s (at %s): %s", rel, part, why_not(e));
            break;
        }
        cur = next;
    }
    return cur == dirfd ? -1 : cur;
}

enum { REMOVE_DEPTH = 64 };

/* Empties the directory at dfd; directories deeper than REMOVE_DEPTH are moved up into top
 * (under a name of their own) rather than descended into, so that a tree of any depth is removed
 * with a bounded stack and REMOVE_DEPTH descriptors at most. *found: something was there. */
static int clear_dir(int top, int dfd, int depth, unsigned *moved, bool *found, td_err *err) {
    int again = dup(dfd);
    DIR *d = again >= 0 ? fdopendir(again) : NULL;
    if (!d) {
        if (again >= 0) close(again);
        return td_fail(err, "cannot list a directory: %s", strerror(errno));
    }
    rewinddir(d); /* a dup shares the offset an earlier pass left at the end */
    int rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        *found = true;
        struct stat st;
        if (fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue; /* gone */
        if (!S_ISDIR(st.st_mode)) {
            if (unlinkat(dfd, e->d_name, 0) != 0 && errno != ENOENT)
                rc = td_fail(err, "cannot remove %s: %s", e->d_name, strerror(errno));
            continue;
        }
        if (depth >= REMOVE_DEPTH) {
            char name[64];
            snprintf(name, sizeof name, ".traind-deep-%u", (*moved)++);
            if (renameat(dfd, e->d_name, top, name) != 0)
                rc = td_fail(err, "cannot move %s up: %s", e->d_name, strerror(errno));
            continue;
        }
        int sub = openat(dfd, e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
        if (sub < 0) continue; /* gone, or swapped for a link: the next pass sees it */
        bool inner = false;
        if (clear_dir(top, sub, depth + 1, moved, &inner, err) != 0) rc = -1;
        close(sub);
        if (unlinkat(dfd, e->d_name, AT_REMOVEDIR) != 0 && errno != ENOENT)
            rc = td_fail(err, "cannot remove %s: %s", e->d_name, strerror(errno));
    }
    closedir(d);
    return rc;
}

int td_jobfs_remove(int dirfd, const char *name, td_err *err) {
    struct stat st;
    if (fstatat(dirfd, name, &st, AT_SYMLINK_NOFOLLOW) != 0)
        return errno == ENOENT ? 0 : td_fail(err, "%s: %s", name, strerror(errno));
    if (!S_ISDIR(st.st_mode)) {
        if (unlinkat(dirfd, name, 0) != 0 && errno != ENOENT)
            return td_fail(err, "cannot remove %s: %s", name, strerror(errno));
        return 0;
    }
    int root = openat(dirfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (root < 0) return td_fail(err, "cannot open %s: %s", name, strerror(errno));
    unsigned moved = 0;
    int rc = 0;
    /* passes until a pass finds it empty: what was moved up is removed by the next one */
    for (int pass = 0; pass < 1 << 20; pass++) {
        bool found = false;
        rc = clear_dir(root, root, 0, &moved, &found, err);
        if (!found || rc != 0) break;
    }
    close(root);
    if (rc == 0 && unlinkat(dirfd, name, AT_REMOVEDIR) != 0)
        rc = td_fail(err, "cannot remove %s: %s", name, strerror(errno));
    return rc;
}

int td_jobfs_put_begin(const td_identity *who, int root, const char *rel, const char *suffix,
                       td_jobfs_put *p, td_err *err) {
    memset(p, 0, sizeof *p);
    p->who = who;
    p->dir = p->fd = -1;
    if (!relative_ok(rel))
        return td_fail(err, "\"%s\": expected a relative path of plain names (no \"..\")", rel);
    const char *slash = strrchr(rel, '/');
    const char *base = slash ? slash + 1 : rel;
    if (strlen(base) + strlen(suffix) + 2 > sizeof p->tmp)
        return td_fail(err, "%s: too long a name", rel);
    if (slash) {
        char parents[PATH_MAX];
        snprintf(parents, sizeof parents, "%.*s", (int)(slash - rel), rel);
        p->dir = td_jobfs_mkdirs(who, root, parents, 0750, err);
        if (p->dir < 0) return -1;
    } else {
        p->dir = fcntl(root, F_DUPFD_CLOEXEC, 0);
        if (p->dir < 0) return td_fail(err, "dup: %s", strerror(errno));
    }
    snprintf(p->name, sizeof p->name, "%s", base);
    snprintf(p->tmp, sizeof p->tmp, "%s.%s", base, suffix);
    td_identity_saved saved;
    if (td_identity_become(who, &saved, err) != 0) goto fail;
    unlinkat(p->dir, p->tmp, 0); /* an earlier try's */
    p->fd = openat(p->dir, p->tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0640);
    int e = errno;
    td_identity_return(&saved);
    if (p->fd >= 0) return 0;
    td_fail(err, "cannot create %s: %s", p->tmp, why_not(e));
fail:
    close(p->dir);
    p->dir = -1;
    return -1;
}

int td_jobfs_put_end(td_jobfs_put *p, bool keep, td_err *err) {
    int rc = 0;
    if (p->fd >= 0) {
        if (keep && fsync(p->fd) != 0) rc = td_fail(err, "%s: %s", p->tmp, strerror(errno));
        if (close(p->fd) != 0 && keep && rc == 0)
            rc = td_fail(err, "%s: %s", p->tmp, strerror(errno));
        p->fd = -1;
    }
    if (p->dir < 0) return keep ? -1 : 0;
    td_identity_saved saved;
    td_err ignored = {{0}};
    bool became = td_identity_become(p->who, &saved, keep ? err : &ignored) == 0;
    if (keep && rc == 0 && became && renameat(p->dir, p->tmp, p->dir, p->name) != 0)
        rc = td_fail(err, "cannot rename %s: %s", p->tmp, strerror(errno));
    if (!keep || rc != 0) unlinkat(p->dir, p->tmp, 0);
    if (became && keep && rc == 0) (void)fsync(p->dir); /* the name, on disk too */
    if (became) td_identity_return(&saved);
    if (!became) rc = -1;
    close(p->dir);
    p->dir = -1;
    return rc;
}

bool td_jobfs_has(const td_identity *who, int root, const char *rel, uid_t owner,
                  const char *sha256_hex) {
    td_err err = {{0}};
    int fd = td_jobfs_openat(who, root, rel, O_RDONLY, 0, &err);
    if (fd < 0) return false;
    char hex[TD_SHA256_HEX];
    bool same = td_jobfs_check(fd, rel, false, owner, 0, NULL, &err) == 0 &&
                td_sha256_fd(fd, rel, hex, NULL, &err) == 0 && strcmp(hex, sha256_hex) == 0;
    close(fd);
    return same;
}

enum { USAGE_DEPTH = 64 }; /* deeper directories are counted by their own size only */

static void usage_of(int dfd, int depth, long long *bytes, long *entries, long max) {
    DIR *d = fdopendir(dfd);
    if (!d) {
        close(dfd);
        return;
    }
    struct dirent *e;
    while (*entries <= max && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
        ++*entries;
        *bytes += (long long)st.st_blocks * 512;
        if (S_ISDIR(st.st_mode) && depth < USAGE_DEPTH) {
            int sub = openat(dirfd(d), e->d_name,
                             O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            if (sub >= 0) usage_of(sub, depth + 1, bytes, entries, max);
        }
    }
    closedir(d);
}

int td_jobfs_usage(const char *path, long long *bytes, long *entries, long max_entries,
                   td_err *err) {
    *bytes = 0;
    *entries = 0;
    int fd = open(path, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
    if (fd < 0) return td_fail(err, "%s: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) == 0) *bytes += (long long)st.st_blocks * 512;
    usage_of(fd, 0, bytes, entries, max_entries);
    return 0;
}

int td_jobfs_mkdir_path(const td_identity *who, const char *path, td_err *err) {
    char p[PATH_MAX];
    if (snprintf(p, sizeof p, "%s", path) >= (int)sizeof p)
        return td_fail(err, "%s: too long a path", path);
    td_identity_saved saved;
    if (td_identity_become(who, &saved, err) != 0) return -1;
    int rc = 0;
    for (char *s = p + 1;; s++) {
        bool end = *s == 0;
        if (*s != '/' && !end) continue;
        *s = 0;
        if (mkdir(p, 0750) != 0 && errno != EEXIST) {
            rc = td_fail(err, "cannot create %s: %s", p, strerror(errno));
            break;
        }
        if (end) break;
        *s = '/';
    }
    td_identity_return(&saved);
    return rc;
}

int td_jobfs_realpath(const td_identity *who, const char *path, char *out, td_err *err) {
    td_identity_saved saved;
    if (td_identity_become(who, &saved, err) != 0) return -1;
    char *r = realpath(path, out);
    int e = errno;
    td_identity_return(&saved);
    return r ? 0 : td_fail(err, "%s: %s", path, strerror(e));
}

bool td_jobfs_normalize(const char *dir, const char *path, char *out, size_t len) {
    char joined[2 * PATH_MAX];
    if (snprintf(joined, sizeof joined, "%s/%s", path[0] == '/' ? "" : dir, path) >=
        (int)sizeof joined)
        return false;
    size_t n = 0;
    if (len < 2) return false;
    out[n++] = '/';
    for (const char *p = joined; *p;) {
        while (*p == '/') p++;
        size_t k = strcspn(p, "/");
        if (k == 0) break;
        if (k == 1 && p[0] == '.') {
        } else if (k == 2 && p[0] == '.' && p[1] == '.') {
            while (n > 1 && out[n - 1] != '/') n--; /* the component before, */
            if (n > 1) n--;                         /* and its slash */
        } else {
            if (n > 1) out[n++] = '/';
            if (n + k + 1 > len) return false;
            memcpy(out + n, p, k);
            n += k;
        }
        p += k;
        if (n + 1 > len) return false;
    }
    out[n] = 0;
    return true;
}
