/* The subcommands about a finished job's files (trainctl.h): its TensorBoard archive, and
 * deleting it with all its files. */
#include "trainctl.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

int tc_cmd_tensorboard(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" --output ", 1, 1);
    long id = tc_job_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    char path[64], out[1024];
    snprintf(path, sizeof path, "/v1/jobs/%ld/tensorboard", id);
    snprintf(out, sizeof out, "%s", a.out ? a.out : "");
    if (!a.out) snprintf(out, sizeof out, "job-%ld-tensorboard.tar", id);
    /* a snapshot made at each request: one left from an earlier one is not continued */
    if (unlink(out) != 0 && errno != ENOENT)
        return tc_error("cannot replace %s: %s", out, strerror(errno));
    int rc = tc_download(c, path, out, -1, isatty(STDERR_FILENO), NULL);
    if (rc == 0)
        printf("%s: job %ld's TensorBoard event files; tar xf %s && tensorboard --logdir "
               "job-%ld-tensorboard\n",
               out, id, out, id);
    return rc;
}

int tc_cmd_delete(const tc_conn *c, int argc, char **argv) {
    TC_PARSE(" ", 1, 1);
    long id = tc_job_id(a.pos[0]);
    if (id < 0) return TC_EXIT_ERROR;
    char path[64], err[512] = "";
    snprintf(path, sizeof path, "/v1/jobs/%ld", id);
    tc_reply r;
    tc_request(c, "DELETE", path, NULL, &r, err, sizeof err);
    int rc = r.status == 204 ? 0 : tc_fail_reply(c, &r, err);
    tc_reply_free(&r);
    if (rc == 0) printf("job %ld deleted\n", id);
    return rc;
}
