#define _GNU_SOURCE /* O_DIRECTORY, O_NOFOLLOW with openat */
#include "service/td_ckpt.h"

#include <archive.h>
#include <archive_entry.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define MAX_DEPTH 8 /* a checkpoint's own subdirectories, not a file system */
#define MAX_FILES 100000

typedef struct file_list {
    td_ckpt_file *v;
    int n, cap;
    uid_t owner;
} file_list;

static int owner_check(uid_t owner, const struct stat *st, const char *name, td_err *err) {
    if (owner == TD_CKPT_ANY_OWNER || st->st_uid == owner) return 0;
    return td_fail(err,
                   "%s belongs to uid %u, not to the user the job ran as (uid %u): a checkpoint "
                   "holds only its job's own files",
                   name, (unsigned)st->st_uid, (unsigned)owner);
}

static void add_file(file_list *l, const char *name, long long size) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = td_realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    l->v[l->n].name = td_strdup(name);
    l->v[l->n++].size = size;
}

/* Walks the directory open at fd (consumed), adding regular files as prefix + name. */
static int walk(int fd, const char *prefix, int depth, file_list *l, td_err *err) {
    DIR *d = fdopendir(fd);
    if (!d) {
        close(fd);
        return td_fail(err, "%s: cannot list: %s", prefix[0] ? prefix : ".", strerror(errno));
    }
    int rc = 0;
    struct dirent *e;
    while (rc == 0 && (e = readdir(d))) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, "..")) continue;
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue; /* gone */
        char name[PATH_MAX];
        if (snprintf(name, sizeof name, "%s%s", prefix, e->d_name) >= (int)sizeof name) continue;
        if (S_ISREG(st.st_mode)) {
            if (owner_check(l->owner, &st, name, err) != 0) {
                rc = -1;
                break;
            }
            if (l->n == MAX_FILES)
                rc = td_fail(err, "more than %d files: not a checkpoint", MAX_FILES);
            else
                add_file(l, name, (long long)st.st_size);
        } else if (S_ISDIR(st.st_mode) && depth < MAX_DEPTH) {
            int sub = openat(dirfd(d), e->d_name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
            if (sub < 0) continue;
            snprintf(name + strlen(name), sizeof name - strlen(name), "/");
            rc = walk(sub, name, depth + 1, l, err);
        }
    }
    closedir(d);
    return rc;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const td_ckpt_file *)a)->name, ((const td_ckpt_file *)b)->name);
}

int td_ckpt_list(const char *path, uid_t owner, td_ckpt_file **files, int *n, td_err *err) {
    *files = NULL;
    *n = 0;
    struct stat st;
    if (lstat(path, &st) != 0) return td_fail(err, "%s: %s", path, strerror(errno));
    file_list l = {.owner = owner};
    if (S_ISREG(st.st_mode)) {
        if (owner_check(owner, &st, path, err) != 0) return -1;
        const char *base = strrchr(path, '/');
        add_file(&l, base ? base + 1 : path, (long long)st.st_size);
    } else if (S_ISDIR(st.st_mode)) {
        int fd = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (fd < 0) return td_fail(err, "%s: %s", path, strerror(errno));
        if (walk(fd, "", 0, &l, err) != 0) {
            td_ckpt_files_free(l.v, l.n);
            return td_fail_prefix(err, "%s", path);
        }
        if (l.n) qsort(l.v, (size_t)l.n, sizeof *l.v, by_name);
    } else {
        return td_fail(err, "%s: neither a file nor a directory", path);
    }
    *files = l.v;
    *n = l.n;
    return 0;
}

void td_ckpt_files_free(td_ckpt_file *files, int n) {
    for (int i = 0; i < n; i++) free(files[i].name);
    free(files);
}

int td_ckpt_open(const char *path, const char *name, uid_t owner, int *fd, long long *size,
                 td_err *err) {
    struct stat st;
    if (lstat(path, &st) != 0)
        return td_fail(err, "the checkpoint is no longer on disk (%s)", strerror(errno));
    int cur;
    if (S_ISREG(st.st_mode)) {
        const char *base = strrchr(path, '/');
        if (strcmp(name, base ? base + 1 : path) != 0)
            return td_fail(err, "the checkpoint is the single file %s", base ? base + 1 : path);
        cur = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    } else {
        /* one component at a time, never through a link: "..", "." and empty parts name
         * nothing here, whatever the file system would make of them */
        cur = open(path, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        char copy[PATH_MAX];
        snprintf(copy, sizeof copy, "%s", name);
        char *save = NULL, *part = strtok_r(copy, "/", &save);
        if (!part || name[0] == '/' || strstr(name, "//") || name[strlen(name) - 1] == '/') {
            if (cur >= 0) close(cur);
            return td_fail(err, "\"%s\" is not a file name of the checkpoint", name);
        }
        while (cur >= 0 && part) {
            char *next = strtok_r(NULL, "/", &save);
            if (!strcmp(part, ".") || !strcmp(part, "..")) {
                close(cur);
                return td_fail(err, "\"%s\" is not a file name of the checkpoint", name);
            }
            int fd2 =
                openat(cur, part, O_RDONLY | O_NOFOLLOW | O_CLOEXEC | (next ? O_DIRECTORY : 0));
            close(cur);
            cur = fd2;
            part = next;
        }
    }
    if (cur < 0) return td_fail(err, "%s: %s", name, strerror(errno));
    if (fstat(cur, &st) != 0 || !S_ISREG(st.st_mode)) {
        close(cur);
        return td_fail(err, "%s: not a regular file of the checkpoint", name);
    }
    if (owner_check(owner, &st, name, err) != 0) { /* what it is now, not what was listed */
        close(cur);
        return -1;
    }
    *fd = cur;
    *size = (long long)st.st_size;
    return 0;
}

/* ---- tar ------------------------------------------------------------------------------------ */

struct td_ckpt_tar {
    struct archive *a;
    char *path, *top;
    uid_t owner;
    td_ckpt_file *files;
    int n, next; /* files[next] is the one to begin after the current */
    int fd;      /* the member being written, -1: between members */
    long long left;
    const char *member;
    td_buf *out; /* where libarchive's output goes during td_ckpt_tar_next */
    bool closed;
};

static la_ssize_t to_buffer(struct archive *a, void *cls, const void *data, size_t len) {
    (void)a;
    td_ckpt_tar *t = cls;
    td_buf_append(t->out, (const char *)data, len);
    return (la_ssize_t)len;
}

int td_ckpt_tar_open(td_ckpt_tar **out, const char *path, const char *top, uid_t owner,
                     td_err *err) {
    td_ckpt_tar *t = td_calloc(1, sizeof *t);
    t->fd = -1;
    t->owner = owner;
    if (td_ckpt_list(path, owner, &t->files, &t->n, err) != 0) {
        free(t);
        return -1;
    }
    t->path = td_strdup(path);
    t->top = td_strdup(top);
    t->a = archive_write_new();
    TD_CHECK_ALLOC(t->a, "starting a tar archive");
    /* pax: names of any length and sizes beyond 8 GiB; every tar reads it */
    if (archive_write_set_format_pax_restricted(t->a) != ARCHIVE_OK ||
        archive_write_set_bytes_per_block(t->a, 0) != ARCHIVE_OK ||
        archive_write_open2(t->a, t, NULL, to_buffer, NULL, NULL) != ARCHIVE_OK) {
        td_fail(err, "tar: %s", archive_error_string(t->a));
        td_ckpt_tar_close(t);
        return -1;
    }
    *out = t;
    return 0;
}

static int begin_member(td_ckpt_tar *t, td_err *err) {
    const td_ckpt_file *f = &t->files[t->next++];
    if (td_ckpt_open(t->path, f->name, t->owner, &t->fd, &t->left, err) != 0)
        return td_fail_prefix(err, "checkpoint %s", t->path);
    char name[2 * PATH_MAX];
    snprintf(name, sizeof name, "%s%s", t->top, f->name);
    struct stat st;
    struct archive_entry *e = archive_entry_new();
    TD_CHECK_ALLOC(e, "for a tar entry");
    archive_entry_set_pathname(e, name);
    archive_entry_set_size(e, t->left);
    archive_entry_set_filetype(e, AE_IFREG);
    archive_entry_set_perm(e, 0644);
    if (fstat(t->fd, &st) == 0) archive_entry_set_mtime(e, st.st_mtime, 0);
    int rc = archive_write_header(t->a, e);
    archive_entry_free(e);
    if (rc != ARCHIVE_OK) return td_fail(err, "tar: %s", archive_error_string(t->a));
    t->member = f->name;
    return 0;
}

int td_ckpt_tar_next(td_ckpt_tar *t, td_buf *out, bool *done, td_err *err) {
    t->out = out;
    *done = false;
    char chunk[65536];
    while (out->len < sizeof chunk && !*done) {
        if (t->fd < 0 && t->next == t->n) {
            if (!t->closed && archive_write_close(t->a) != ARCHIVE_OK)
                return td_fail(err, "tar: %s", archive_error_string(t->a));
            t->closed = true;
            *done = true;
        } else if (t->fd < 0) {
            if (begin_member(t, err) != 0) return -1;
        } else if (t->left == 0) {
            close(t->fd);
            t->fd = -1;
        } else {
            size_t want = t->left < (long long)sizeof chunk ? (size_t)t->left : sizeof chunk;
            ssize_t k = read(t->fd, chunk, want);
            if (k <= 0)
                return td_fail(err, "%s: %s while archiving it", t->member,
                               k == 0 ? "the file shrank" : strerror(errno));
            if (archive_write_data(t->a, chunk, (size_t)k) != k)
                return td_fail(err, "tar: %s", archive_error_string(t->a));
            t->left -= k;
        }
    }
    return 0;
}

void td_ckpt_tar_close(td_ckpt_tar *t) {
    if (!t) return;
    if (t->fd >= 0) close(t->fd);
    td_buf scratch = {0}; /* freeing closes too: what that writes goes nowhere */
    t->out = &scratch;
    if (t->a) archive_write_free(t->a);
    td_buf_free(&scratch);
    td_ckpt_files_free(t->files, t->n);
    free(t->path);
    free(t->top);
    free(t);
}
