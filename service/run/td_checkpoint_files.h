/* A checkpoint's files, as the daemon serves them: a registered checkpoint is a directory (a
 * traind-worker step-N/ with model.safetensors, optimizer.safetensors and state.json, or
 * whatever a command job wrote) or a single file (a command's torch.save). Files are named
 * relative to the checkpoint, "/" between directories. Everything is reached through
 * td_jobfs.h as the job that wrote it: symbolic links, FIFOs, sockets and devices are neither
 * listed nor followed nor opened, and only the job's own files count, so a download never
 * leaves the checkpoint and never blocks.
 *
 * td_checkpoint_tar streams the whole checkpoint as one POSIX tar archive (libarchive), a block at
 * a time, so a checkpoint of gigabytes is served without a copy on disk or in memory. */
#ifndef TD_CHECKPOINT_FILES_H
#define TD_CHECKPOINT_FILES_H

#include "base/td_error.h"
#include "base/td_buf.h"
#include "service/run/td_jobfs.h"

#include <stdbool.h>
#include <sys/types.h>

typedef struct td_checkpoint_file {
    char *name; /* relative to the checkpoint */
    long long size;
} td_checkpoint_file;

/* The regular files of f's checkpoint at path, sorted by name: at most f->max_files (more is an
 * error, as is a file owned by another user than f->owner). */
int td_checkpoint_list(const td_job_files *f, const char *path, td_checkpoint_file **files, int *n,
                       td_err *err);
void td_checkpoint_files_free(td_checkpoint_file *files, int n);

/* Opens file `name` of f's checkpoint at path for reading. 0 on success; -1 with err when the
 * name is malformed (it names no file of the checkpoint), the file is gone, is not a regular
 * file of the job's, or is reached through a link. */
int td_checkpoint_open(const td_job_files *f, const char *path, const char *name, int *fd,
                       long long *size, td_err *err);

typedef struct td_checkpoint_tar td_checkpoint_tar;

/* An archive of f's checkpoint at path whose members are prefixed by `top` ("step-400/"). */
int td_checkpoint_tar_open(td_checkpoint_tar **out, const td_job_files *f, const char *path,
                           const char *top, td_err *err);
/* Appends the archive's next bytes to out; *done once it is complete. -1 when a file could not
 * be read (then the download must fail rather than end short). */
int td_checkpoint_tar_next(td_checkpoint_tar *t, td_buf *out, bool *done, td_err *err);
void td_checkpoint_tar_close(td_checkpoint_tar *t);

#endif
