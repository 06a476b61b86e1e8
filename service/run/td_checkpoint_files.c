#define _GNU_SOURCE /* O_DIRECTORY, O_NOFOLLOW with openat */
#include "service/run/td_checkpoint_files.h"

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
/* Entries of any kind a walk looks at, per file max_checkpoint_files allows: room for a
 * directory per file and some, not for a million links that are no files at all. */
#define ENTRIES_PER_FILE 4

typedef struct file_list {
    td_checkpoint_file *v;
    int n, cap, max;
    long seen; /* entries of any kind: links and directories cost a walk as much as files */
    uid_t owner;
} file_list;

static void add_file(file_list *l, const char *name, long long size) {
    if (l->n == l->cap) {
        l->cap = l->cap ? 2 * l->cap : 16;
        l->v = td_realloc(l->v, (size_t)l->cap * sizeof *l->v);
    }
    l->v[l->n].name = td_strdup(name);
    l->v[l->n++].size = size;
}

/* Walks the directory open at fd (consumed), adding regular files as prefix + name. Every entry
 * is looked at without following it (fstatat, AT_SYMLINK_NOFOLLOW) and every subdirectory
 * opened from its parent's descriptor with O_NOFOLLOW: a link, a FIFO or a device is passed
 * over, never reached. */
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
        if (l->max > 0 && ++l->seen > (long)ENTRIES_PER_FILE * l->max) {
            rc = td_fail(err,
                         "more than %ld entries (files, directories, links), the limit of one "
                         "checkpoint (%d times max_checkpoint_files)",
                         (long)ENTRIES_PER_FILE * l->max, ENTRIES_PER_FILE);
            break;
        }
        struct stat st;
        if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue; /* gone */
        char name[PATH_MAX];
        if (snprintf(name, sizeof name, "%s%s", prefix, e->d_name) >= (int)sizeof name) continue;
        if (S_ISREG(st.st_mode)) {
            if (l->owner != TD_JOBFS_ANY_OWNER && st.st_uid != l->owner)
                rc = td_fail(err,
                             "%s belongs to uid %u, not to the user the job ran as (uid %u): a "
                             "checkpoint holds only its job's own files",
                             name, (unsigned)st.st_uid, (unsigned)l->owner);
            else if (l->max > 0 && l->n == l->max)
                rc = td_fail(err,
                             "more than %d files, the limit of one checkpoint "
                             "(max_checkpoint_files)",
                             l->max);
            else
                add_file(l, name, (long long)st.st_size);
        } else if (S_ISDIR(st.st_mode) && depth < MAX_DEPTH) {
            int sub = openat(dirfd(d), e->d_name,
                             O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
            if (sub < 0) continue;
            snprintf(name + strlen(name), sizeof name - strlen(name), "/");
            rc = walk(sub, name, depth + 1, l, err);
        }
    }
    closedir(d);
    return rc;
}

static int by_name(const void *a, const void *b) {
    return strcmp(((const td_checkpoint_file *)a)->name, ((const td_checkpoint_file *)b)->name);
}

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

int td_checkpoint_list(const td_job_files *f, const char *path, td_checkpoint_file **files, int *n,
                       td_err *err) {
    *files = NULL;
    *n = 0;
    int fd = td_jobfs_open_path(&f->who, f->dir, path, O_RDONLY, err);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return fd < 0 ? -1 : td_fail(err, "%s: %s", path, strerror(errno));
    }
    file_list l = {.owner = f->owner, .max = f->max_files};
    if (S_ISREG(st.st_mode)) {
        int rc = td_jobfs_check(fd, path, false, f->owner, 0, NULL, err);
        close(fd);
        if (rc != 0) return -1;
        add_file(&l, base_of(path), (long long)st.st_size);
    } else { /* a directory (td_jobfs opens nothing else) */
        if (walk(fd, "", 0, &l, err) != 0) {
            td_checkpoint_files_free(l.v, l.n);
            return td_fail_prefix(err, "%s", path);
        }
        if (l.n) qsort(l.v, (size_t)l.n, sizeof *l.v, by_name);
    }
    *files = l.v;
    *n = l.n;
    return 0;
}

void td_checkpoint_files_free(td_checkpoint_file *files, int n) {
    for (int i = 0; i < n; i++) free(files[i].name);
    free(files);
}

int td_checkpoint_open(const td_job_files *f, const char *path, const char *name, int *fd,
                       long long *size, td_err *err) {
    int root = td_jobfs_open_path(&f->who, f->dir, path, O_RDONLY, err);
    if (root < 0) return td_fail_prefix(err, "the checkpoint is no longer there");
    struct stat st;
    int cur = -1;
    if (fstat(root, &st) == 0 && S_ISREG(st.st_mode)) {
        if (strcmp(name, base_of(path)) != 0) {
            close(root);
            return td_fail(err, "the checkpoint is the single file %s", base_of(path));
        }
        cur = root; /* itself */
    } else {
        /* a name of plain components below the checkpoint: "..", "." and empty parts name
         * nothing here, whatever the file system would make of them */
        cur = td_jobfs_openat(&f->who, root, name, O_RDONLY, 0, err);
        close(root);
        if (cur < 0) return td_fail_prefix(err, "\"%s\" is not a file of the checkpoint", name);
    }
    /* what it is now, not what was listed */
    if (td_jobfs_check(cur, name, false, f->owner, 0, &st, err) != 0) {
        close(cur);
        return -1;
    }
    /* served with blocking reads: the descriptor is a regular file's */
    fcntl(cur, F_SETFL, fcntl(cur, F_GETFL) & ~O_NONBLOCK);
    *fd = cur;
    *size = (long long)st.st_size;
    return 0;
}

/* ---- tar ------------------------------------------------------------------------------------ */

struct td_checkpoint_tar {
    struct archive *a;
    char *path, *top;
    td_job_files files_of;
    td_checkpoint_file *files;
    int n, next; /* files[next] is the one to begin after the current */
    int fd;      /* the member being written, -1: between members */
    long long left;
    const char *member;
    td_buf *out; /* where libarchive's output goes during td_checkpoint_tar_next */
    bool closed;
};

static la_ssize_t to_buffer(struct archive *a, void *cls, const void *data, size_t len) {
    (void)a;
    td_checkpoint_tar *t = cls;
    td_buf_append(t->out, (const char *)data, len);
    return (la_ssize_t)len;
}

int td_checkpoint_tar_open(td_checkpoint_tar **out, const td_job_files *f, const char *path,
                           const char *top, td_err *err) {
    td_checkpoint_tar *t = td_calloc(1, sizeof *t);
    t->fd = -1;
    t->files_of = *f;
    if (td_checkpoint_list(f, path, &t->files, &t->n, err) != 0) {
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
        td_checkpoint_tar_close(t);
        return -1;
    }
    *out = t;
    return 0;
}

static int begin_member(td_checkpoint_tar *t, td_err *err) {
    const td_checkpoint_file *f = &t->files[t->next++];
    if (td_checkpoint_open(&t->files_of, t->path, f->name, &t->fd, &t->left, err) != 0)
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

int td_checkpoint_tar_next(td_checkpoint_tar *t, td_buf *out, bool *done, td_err *err) {
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

void td_checkpoint_tar_close(td_checkpoint_tar *t) {
    if (!t) return;
    if (t->fd >= 0) close(t->fd);
    td_buf scratch = {0}; /* freeing closes too: what that writes goes nowhere */
    t->out = &scratch;
    if (t->a) archive_write_free(t->a);
    td_buf_free(&scratch);
    td_checkpoint_files_free(t->files, t->n);
    free(t->path);
    free(t->top);
    free(t);
}
