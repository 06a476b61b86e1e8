/* The launcher's own (td_launch.c, td_launch_env.c, td_launch_error.c): how a worker's
 * environment is made. */
#ifndef TD_LAUNCH_PRIVATE_H
#define TD_LAUNCH_PRIVATE_H

#include "service/run/td_launch.h"

/* What every worker of one attempt shares, worked out once before the workers are made. */
typedef struct td_launch_shared {
    /* the interface GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME get; "": neither is set */
    char socket_ifname[64];
} td_launch_shared;

/* Works out sh for cfg; note gets a line for the log when it chose something ("" otherwise). */
void td_launch_shared_init(const td_launch_config *cfg, td_launch_shared *sh, char *note,
                           size_t note_len);
/* Local rank r's whole environment for attempt `attempt`: the inherited one without the names
 * the launcher sets, then those. Allocated (td_strv_free); made before fork. */
char **td_launch_worker_env(const td_launch_config *cfg, const td_launch_shared *sh, int r,
                            int attempt);

#endif
