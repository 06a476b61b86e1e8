/* traind-shepherd's group: starting the attempt's processes in the directory the job chose
 * (entered as the job), and stopping them once, for the first reason that comes (a request, the
 * deadline, the orphan timer, a signal). Apart from the loop that supervises them
 * (shepherd_supervise.c). */
#include "programs/shepherd.h"

#include "programs/shepherd_errors.h"

#include "service/run/td_jobfs.h"

#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

void stop_group(shepherd *h, const char *by, int sig, double grace, const char *reason) {
    if (h->stopped_by[0]) return; /* the first reason stands */
    snprintf(h->stopped_by, sizeof h->stopped_by, "%s", by);
    snprintf(h->stop_reason, sizeof h->stop_reason, "%s", reason);
    fprintf(stderr, "traind-shepherd: stopping the group (%s): %s\n", by, reason);
    if (!h->g.terminating) td_group_terminate(&h->g, sig, grace);
}

/* The directory the job chose to start in ("cwd"), opened as the job: beneath its directory
 * when it is below it (made there when missing), else as the job would open it. */
static void open_job_dir(spec *s, const char *jobdir, char *error, size_t len) {
    const td_identity *who = s->launch.user && s->launch.user->drop ? s->launch.user : NULL;
    td_identity with_groups; /* a run_as user's groups, as its processes will have them */
    if (who && who->lookup_groups) {
        with_groups = *who;
        int n = TD_IDENTITY_GROUPS;
        if (getgrouplist(who->name, who->gid, with_groups.groups, &n) < 0) n = 0;
        with_groups.n_groups = n;
        with_groups.lookup_groups = false;
        who = &with_groups;
    }
    td_err err = {{0}};
    size_t n = strlen(jobdir);
    if (strncmp(s->dir, jobdir, n) == 0 && s->dir[n] == '/') {
        int jfd = open(jobdir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        s->dir_fd = jfd < 0 ? -1 : td_jobfs_mkdirs(who, jfd, s->dir + n + 1, 0700, &err);
        if (jfd >= 0) close(jfd);
    } else {
        s->dir_fd = td_jobfs_open_path(who, jobdir, s->dir, O_RDONLY | O_DIRECTORY, &err);
    }
    if (s->dir_fd < 0)
        snprintf(error, len, "cannot enter the job's cwd %.300s: %.600s", s->dir,
                 err.msg[0] ? err.msg : strerror(errno));
    else
        s->launch.cwd_fd = &s->dir_fd;
}

/* Starts the attempt's processes: in the directory the job chose (entered as the job), with
 * their error files' directories made, after noting the SummaryWriter files already there
 * (an earlier attempt's); the socket interface chosen goes first into rank 0's log. */
void start_group(shepherd *h, char *start_error, size_t len) {
    static char jobdir[PATH_MAX], error_dir[PATH_MAX];
    snprintf(jobdir, sizeof jobdir, "%s", h->s.status_path);
    if (strrchr(jobdir, '/')) *strrchr(jobdir, '/') = 0;
    if (h->s.dir_as_job) open_job_dir(&h->s, jobdir, start_error, len);
    if (start_error[0]) return;
    shepherd_errors_prepare(&h->s.launch, h->s.attempt, jobdir, error_dir);
    if (h->out.fd >= 0) h->tboard = shepherd_tboard_new(&h->s.launch, h->s.tensorboard_dir);
    td_err err = {{0}};
    if (td_group_start(&h->g, &h->s.launch, h->s.attempt, &err) != 0) {
        snprintf(start_error, len, "%s", err.msg);
        return;
    }
    if (h->g.env_note[0] && h->logs[0].fd >= 0) {
        char note[sizeof h->g.env_note + 16];
        int k = snprintf(note, sizeof note, "[traind] %s\n", h->g.env_note);
        td_appender_write(&h->logs[0], note, (size_t)k);
    }
}
