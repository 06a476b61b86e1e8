/* A checkpoint's files, as the daemon serves them: a registered checkpoint is a directory (a
 * traind-worker step-N/ with model.safetensors, optimizer.safetensors and state.json, or
 * whatever a command job wrote) or a single file (a command's torch.save). Files are named
 * relative to the checkpoint, "/" between directories; symbolic links are neither listed nor
 * followed, so a download never leaves the checkpoint.
 *
 * td_ckpt_tar streams the whole checkpoint as one POSIX tar archive (libarchive), a block at a
 * time, so a checkpoint of gigabytes is served without a copy on disk or in memory. */
#ifndef TD_CKPT_H
#define TD_CKPT_H

#include "service/td_buf.h"
#include "core/td_error.h"

#include <stdbool.h>
#include <sys/types.h>

/* A checkpoint's files must belong to this user: the one its job ran as, when the daemon runs
 * jobs as another user than itself (run_as), so that a job cannot name a file of the daemon's
 * (say /etc, or a link planted in its own directory) as its checkpoint and have the daemon serve
 * or copy it; TD_CKPT_ANY_OWNER: any (the daemon's own files, jobs run as the daemon's user). */
#define TD_CKPT_ANY_OWNER ((uid_t)-1)

typedef struct td_ckpt_file {
    char *name; /* relative to the checkpoint */
    long long size;
} td_ckpt_file;

/* The regular files of the checkpoint at path, sorted by name; an error names a file owned by
 * another user than owner. */
int td_ckpt_list(const char *path, uid_t owner, td_ckpt_file **files, int *n, td_err *err);
void td_ckpt_files_free(td_ckpt_file *files, int n);

/* Opens file `name` of the checkpoint at path for reading. 0 on success; -1 with err when the
 * name is malformed (ENOENT-like: it names no file of the checkpoint) or the file is gone. */
int td_ckpt_open(const char *path, const char *name, uid_t owner, int *fd, long long *size,
                 td_err *err);

typedef struct td_ckpt_tar td_ckpt_tar;

/* An archive of the checkpoint at path whose members are prefixed by `top` (e.g. "step-400/"). */
int td_ckpt_tar_open(td_ckpt_tar **out, const char *path, const char *top, uid_t owner,
                     td_err *err);
/* Appends the archive's next bytes to out; *done once it is complete. -1 when a file could not
 * be read (then the download must fail rather than end short). */
int td_ckpt_tar_next(td_ckpt_tar *t, td_buf *out, bool *done, td_err *err);
void td_ckpt_tar_close(td_ckpt_tar *t);

#endif
