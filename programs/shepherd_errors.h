/* The shepherd's side of torchrun's error files: each rank of a job's attempt gets
 * TORCHELASTIC_ERROR_FILE in the job's work directory (WORK/.torchelastic/attempt_A/R/
 * error.json, made as the job), and when a rank fails, the exception PyTorch's @record wrote
 * there goes into the attempt's reason (read as the job, beneath the job's directory, never
 * through a link, within 1 MiB: the job controls every name and byte there). */
#ifndef SHEPHERD_ERRORS_H
#define SHEPHERD_ERRORS_H

#include "service/run/td_launch.h"

#include <stddef.h>

/* Before the group starts: sets c->error_dir (kept in dir, PATH_MAX bytes) and makes attempt
 * `attempt`'s directories, when the processes run in a "work" directory of jobdir (the job's
 * directory, the daemon's) and are ranks, not one launching process; otherwise no error files. */
void shepherd_errors_prepare(td_launch_config *c, int attempt, const char *jobdir, char *dir);
/* After a failure: the failing rank's exception, as @record wrote it, appended to reason
 * ("rank 1 (...) failed with exit code 1: RuntimeError: ..."); nothing without an error file
 * (the daemon then quotes the rank's last log line). */
void shepherd_errors_explain(const td_launch_config *c, int attempt, const td_group *g,
                             const char *jobdir, char *reason, size_t len);

#endif
