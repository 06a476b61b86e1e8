/* Metrics from a script's SummaryWriter: the TensorBoard event files a command job's rank 0
 * writes below its working directory (metrics.tensorboard_dir, "runs" by default, as
 * SummaryWriter's own default) are read as they grow, and each scalar becomes a metric line
 * ({"event": "train", "step": STEP, TAG: VALUE}, TAG as the script named it) in the attempt's
 * output, as if the script had printed it.
 *
 * The directory is the job's: every name is opened as the job, one component at a time beneath
 * the working directory, never through a link (td_jobfs), within bounds (4 levels, 256 files,
 * 4 MiB read per poll). Files that were there when the attempt started are read from their end:
 * a restart does not report the last attempt's scalars again. */
#ifndef SHEPHERD_TBOARD_H
#define SHEPHERD_TBOARD_H

#include "service/run/td_appender.h"
#include "service/run/td_launch.h"

typedef struct shepherd_tboard shepherd_tboard;

/* For processes of c running in c->cwd (their user c->user), watching dir below it; NULL when
 * dir is "". Notes what is there already. */
shepherd_tboard *shepherd_tboard_new(const td_launch_config *c, const char *dir);
/* Reads what the files gained since the last call into out. */
void shepherd_tboard_poll(shepherd_tboard *t, td_appender *out);
void shepherd_tboard_free(shepherd_tboard *t);

#endif
