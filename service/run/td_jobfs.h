/* The one way into the files a job controls: its work and checkpoint directories under
 * STATE/jobs/ID, and a train job's own checkpoint.dir wherever it is.
 *
 * A job owns every byte and every name in those directories and may swap any of them for a
 * symbolic link, a FIFO or a device at any moment. So the daemon (master, agent or one node)
 * never opens, creates, renames, hashes, lists or serves anything there by a path name:
 *   - it starts from a directory the job cannot replace (STATE/jobs/ID is the daemon's), or, for
 *     a path of the job's own choosing outside it, from that path opened as the job would open
 *     it (td_identity_become: the job's own rights, so it reaches nothing the job could not);
 *   - below that, each name is resolved by openat2 with RESOLVE_BENEATH, RESOLVE_NO_SYMLINKS and
 *     RESOLVE_NO_MAGICLINKS (one component at a time with O_NOFOLLOW where the kernel lacks
 *     openat2, Linux before 5.6), never above the start and never through a link;
 *   - every open adds O_NONBLOCK (a FIFO never blocks the thread) and O_CLOEXEC, is done as the
 *     job, and what it opened is checked on the descriptor (td_jobfs_check: a regular file or a
 *     directory, owned by the job, within a size), and all later work uses that descriptor,
 *     never the name again. */
#ifndef TD_JOBFS_H
#define TD_JOBFS_H

#include "base/td_error.h"
#include "service/run/td_identity.h"

#include <limits.h>
#include <stdbool.h>
#include <sys/stat.h>
#include <sys/types.h>

/* Files of any owner pass td_jobfs_check (the daemon runs jobs as itself: no one to tell). */
#define TD_JOBFS_ANY_OWNER ((uid_t)-1)

/* A job's files as the daemon reaches them: its directory (STATE/jobs/ID, the daemon's), who it
 * runs as (everything is opened as that identity), whose files count as its own, and how many
 * files one of its checkpoints may hold (max_checkpoint_files). */
typedef struct td_job_files {
    char dir[PATH_MAX];
    td_identity who;
    uid_t owner;
    int max_files;
} td_job_files;

/* Opens rel ("a/b/c": relative, no "." or ".." component, no empty one) beneath the directory
 * open at dirfd, as who (NULL: as the daemon). flags: the open's access and creation flags
 * (O_RDONLY, O_DIRECTORY, O_PATH, O_WRONLY | O_CREAT | O_EXCL, ...); O_NOFOLLOW, O_CLOEXEC and,
 * but with O_PATH, O_NONBLOCK are added. The descriptor, or -1 with err naming rel and why ("a
 * symbolic link: not followed"). */
int td_jobfs_openat(const td_identity *who, int dirfd, const char *rel, int flags, mode_t mode,
                    td_err *err);

/* An absolute path of the job's (a checkpoint it registered, its checkpoint.dir): below the
 * job's directory job_dir, opened from there by td_jobfs_openat; anywhere else, opened as who
 * (through links, with who's rights only). flags as for td_jobfs_openat. */
int td_jobfs_open_path(const td_identity *who, const char *job_dir, const char *path, int flags,
                       td_err *err);

/* What an opened file must be: a directory (dir) or a regular file, owned by owner (unless
 * TD_JOBFS_ANY_OWNER), of at most max_size bytes (0: any). st gets its fstat. name: for the
 * message. */
int td_jobfs_check(int fd, const char *name, bool dir, uid_t owner, long long max_size,
                   struct stat *st, td_err *err);

/* Creates the directories of rel below dirfd as who (each made with mode, or already there and
 * a directory that is no link), and returns the last one open (O_DIRECTORY), or -1 with err. */
int td_jobfs_mkdirs(const td_identity *who, int dirfd, const char *rel, mode_t mode, td_err *err);

/* Removes name (a file, or a directory and everything in it) from the directory at dirfd,
 * descending through descriptors only: a link is removed, never followed. 0, or -1 with err
 * naming what is left. */
int td_jobfs_remove(int dirfd, const char *name, td_err *err);

/* A file written into a job's directory as the job: made aside under a name of its own
 * (NAME.SUFFIX, O_EXCL, in the directories of rel made as needed), written by the caller through
 * fd, and given its name only when whole (td_jobfs_put_end keep: synced, then renamed over
 * whatever had the name, a link included, which is replaced, never followed). */
typedef struct td_jobfs_put {
    const td_identity *who;
    int dir;       /* the directory it goes into */
    int fd;        /* write here */
    char tmp[256]; /* its name while written */
    char name[256];
} td_jobfs_put;
int td_jobfs_put_begin(const td_identity *who, int root, const char *rel, const char *suffix,
                       td_jobfs_put *p, td_err *err);
/* keep: the file takes its name (-1 with err when it cannot); else it is removed. */
int td_jobfs_put_end(td_jobfs_put *p, bool keep, td_err *err);
/* Whether the file at rel below root is there, a regular file of owner's, with that SHA-256. */
bool td_jobfs_has(const td_identity *who, int root, const char *rel, uid_t owner,
                  const char *sha256_hex);

/* The disk space the tree at path takes (its files' and directories' allocated blocks, as du
 * counts them), walked through descriptors without following a link; at most max_entries
 * entries are looked at (*entries: how many there were, max_entries + 1 when it stopped). */
int td_jobfs_usage(const char *path, long long *bytes, long *entries, long max_entries,
                   td_err *err);

/* mkdir -p of an absolute path of the job's choosing (its checkpoint.dir), as who: through links
 * with who's rights, as the job itself would. */
int td_jobfs_mkdir_path(const td_identity *who, const char *path, td_err *err);

/* realpath(3) of path as who would resolve it (its rights, its view of links). */
int td_jobfs_realpath(const td_identity *who, const char *path, char *out, td_err *err);

/* Lexically: dir + "/" + path when path is relative, "." components and repeated slashes gone,
 * ".." taking away the component before it (never above "/"); false when it does not fit. */
bool td_jobfs_normalize(const char *dir, const char *path, char *out, size_t len);

/* Whether path (normalized) is dir or below it; *rel: what follows dir + "/" ("" for dir). */
bool td_jobfs_below(const char *path, const char *dir, const char **rel);

/* For tests: resolve one component at a time even where openat2 exists. */
void td_jobfs_force_fallback(bool on);

#endif
