#define _GNU_SOURCE /* syscall */
#include "service/run/td_identity.h"

#include <errno.h>
#include <grp.h>
#include <stdio.h>
#include <string.h>
#include <sys/fsuid.h>
#include <sys/syscall.h>
#include <unistd.h>

td_identity td_identity_of_job(long job, uid_t uid, const gid_t *groups, int n_groups) {
    td_identity who = {.drop = true, .uid = uid, .gid = (gid_t)uid};
    snprintf(who.name, sizeof who.name, "traind-job-%ld", job);
    if (n_groups > TD_IDENTITY_GROUPS) n_groups = TD_IDENTITY_GROUPS;
    for (int i = 0; i < n_groups; i++) who.groups[i] = groups[i];
    who.n_groups = n_groups;
    return who;
}

bool td_identity_can_switch(void) {
    return geteuid() == 0;
}

/* setgroups(2) itself: glibc's wrapper changes every thread of the process (POSIX wants that),
 * the system call only the one that makes it, which is what acting as a job for one open needs. */
static int thread_groups(size_t n, const gid_t *groups) {
    return (int)syscall(SYS_setgroups, n, groups);
}

int td_identity_become(const td_identity *who, td_identity_saved *saved, td_err *err) {
    saved->switched = false;
    if (!who || !who->drop || !td_identity_can_switch()) return 0;
    saved->fsuid = (uid_t)setfsuid((uid_t)-1); /* -1 changes nothing and says what it is */
    saved->fsgid = (gid_t)setfsgid((gid_t)-1);
    /* groups first: with the fsuid switched, this thread could no longer change them */
    if (thread_groups((size_t)(who->lookup_groups ? 0 : who->n_groups), who->groups) != 0)
        return td_fail(err, "cannot act as %s (setgroups): %s", who->name, strerror(errno));
    setfsgid(who->gid);
    setfsuid(who->uid);
    if ((uid_t)setfsuid((uid_t)-1) != who->uid || (gid_t)setfsgid((gid_t)-1) != who->gid) {
        setfsuid(saved->fsuid);
        setfsgid(saved->fsgid);
        thread_groups(0, NULL);
        return td_fail(err, "cannot act as %s (uid %u): setfsuid was refused", who->name,
                       (unsigned)who->uid);
    }
    saved->switched = true;
    return 0;
}

void td_identity_return(const td_identity_saved *saved) {
    if (!saved->switched) return;
    setfsuid(saved->fsuid); /* back to 0: the file capabilities return with it */
    setfsgid(saved->fsgid);
    thread_groups(0, NULL); /* the daemon keeps none (daemon_main.c drops them at start) */
}
