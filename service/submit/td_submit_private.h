/* The submission parser's own: td_submit_reply.c (refusals), below td_submit_command.c (a
 * command job's members), below td_submit.c (a submission, either kind); a file calls only the
 * ones before it; td_data_roots.c, whether a path is inside the data roots, is below them all. */
#ifndef TD_SUBMIT_PRIVATE_H
#define TD_SUBMIT_PRIVATE_H

#include "service/submit/td_submit.h"

/* What every job may have besides its kind's own keys: resources, restart, priority. */
extern const char *const TD_SUBMIT_SERVICE_KEYS[];
/* Refuses a member of obj (at path) in none of lists, naming it; note ends the message. */
int td_submit_keys_in(json_t *obj, const char *path, const char *const *const *lists,
                      const char *note, td_reply_error *e);
/* A command job's members into s (command, env, local_rank_arg, launch, metrics, cwd). */
int td_submit_parse_command(td_submission *s, json_t *root, const td_submit_rules *rules,
                            td_reply_error *e);

#endif
