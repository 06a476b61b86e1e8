/* TORCHELASTIC_ERROR_FILE for a job's ranks, and what the failing one wrote there. */
#include "programs/shepherd_errors.h"

#include "service/run/td_jobfs.h"

#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_ERROR_FILE = 1 << 20 };

/* The error files' path below jobdir: in its work directory ("work/.torchelastic") when the
 * job has one of its own, else in jobdir itself; "" for one launching process (its ranks are
 * its own children: torchrun's error file is a rank's). */
static void relative_dir(const td_launch_config *c, const char *jobdir, char *out, size_t len) {
    (void)jobdir;
    out[0] = 0;
    if (c->launch_self) return;
    snprintf(out, len, "%s", c->user && c->user->drop ? "work/.torchelastic" : ".torchelastic");
}

void shepherd_errors_prepare(td_launch_config *c, int attempt, const char *jobdir, char *dir) {
    char rel[64];
    relative_dir(c, jobdir, rel, sizeof rel);
    if (!rel[0]) return;
    int jfd = open(jobdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (jfd < 0) return;
    const td_identity *who = c->user && c->user->drop ? c->user : NULL;
    bool made = true;
    for (int r = 0; r < c->nproc_per_node && made; r++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/attempt_%d/%d", rel, attempt, r);
        td_err err = {{0}};
        int fd = td_jobfs_mkdirs(who, jfd, path, 0700, &err);
        if (fd < 0) {
            fprintf(stderr, "traind-shepherd: no error files for the ranks: %s\n", err.msg);
            made = false;
        } else { /* one left from an attempt of this number before (a requeue) is not ours */
            (void)unlinkat(fd, "error.json", 0);
            close(fd);
        }
    }
    close(jfd);
    if (!made) return;
    snprintf(dir, PATH_MAX, "%s/%s", jobdir, rel);
    c->error_dir = dir;
}

void shepherd_errors_explain(const td_launch_config *c, int attempt, const td_group *g,
                             const char *jobdir, char *reason, size_t len) {
    char rel[PATH_MAX];
    relative_dir(c, jobdir, rel, sizeof rel);
    if (!rel[0] || !c->error_dir || !g->first_failure || g->failed_local < 0) return;
    size_t n = strlen(rel);
    snprintf(rel + n, sizeof rel - n, "/attempt_%d/%d/error.json", attempt, g->failed_local);
    int jfd = open(jobdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (jfd < 0) return;
    const td_identity *who = c->user && c->user->drop ? c->user : NULL;
    td_err err = {{0}};
    int fd = td_jobfs_openat(who, jfd, rel, O_RDONLY, 0, &err);
    close(jfd);
    if (fd < 0) return; /* it wrote none: the exit code says all there is */
    td_rank_error e;
    struct stat st;
    uid_t owner = who ? who->uid : TD_JOBFS_ANY_OWNER;
    bool read =
        td_jobfs_check(fd, "the rank's error file", false, owner, MAX_ERROR_FILE, &st, &err) == 0 &&
        td_rank_error_read(fd, &e, &err) == 0;
    close(fd);
    if (!read) {
        fprintf(stderr, "traind-shepherd: %s: %s\n", rel, err.msg);
        return;
    }
    size_t used = strlen(reason);
    if (e.message[0]) snprintf(reason + used, len - used, ": %s", e.message);
    td_rank_error_free(&e);
}
