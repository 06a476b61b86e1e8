#define _GNU_SOURCE /* O_PATH */
#include "service/run/td_cgroup.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* A small file of a cgroup directory, read whole (at most len - 1 bytes); -1 when it cannot. */
static ssize_t read_at(int dir, const char *name, char *out, size_t len) {
    int fd = openat(dir, name, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = read(fd, out, len - 1);
    close(fd);
    out[n > 0 ? n : 0] = 0;
    return n;
}

static int write_at(int dir, const char *name, const char *text) {
    int fd = openat(dir, name, O_WRONLY | O_CLOEXEC);
    if (fd < 0) return -1;
    ssize_t n = write(fd, text, strlen(text));
    int e = errno;
    close(fd);
    errno = e;
    return n == (ssize_t)strlen(text) ? 0 : -1;
}

static int write_path(const char *dir, const char *name, const char *text) {
    int d = open(dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (d < 0) return -1;
    int rc = write_at(d, name, text);
    int e = errno;
    close(d);
    errno = e;
    return rc;
}

bool td_cgroup_populated(int dir) {
    char text[256];
    if (read_at(dir, "cgroup.events", text, sizeof text) <= 0) return false;
    const char *p = strstr(text, "populated ");
    return p && p[10] == '1';
}

void td_cgroup_signal(int dir, int sig) {
    int fd = openat(dir, "cgroup.procs", O_RDONLY | O_CLOEXEC);
    if (fd < 0) return;
    FILE *f = fdopen(fd, "r");
    if (!f) {
        close(fd);
        return;
    }
    long pid;
    while (fscanf(f, "%ld", &pid) == 1)
        if (pid > 1) kill((pid_t)pid, sig);
    fclose(f);
}

void td_cgroup_kill(int dir) {
    if (write_at(dir, "cgroup.kill", "1") != 0) td_cgroup_signal(dir, SIGKILL); /* before 5.14 */
}

int td_cgroup_enter(const char *path, td_err *err) {
    if (write_path(path, "cgroup.procs", "0") != 0)
        return td_fail(err, "cannot enter the cgroup %s: %s", path, strerror(errno));
    return 0;
}

/* ---- the daemon's subtree ------------------------------------------------------------------ */

/* Where cgroup v2 is mounted (the unified hierarchy; /sys/fs/cgroup/unified on a hybrid host). */
static bool find_mount(char *out, size_t len) {
    FILE *f = fopen("/proc/self/mountinfo", "re");
    if (!f) return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f)) {
        char *dash = strstr(line, " - cgroup2 ");
        if (!dash) continue;
        /* id parent major:minor root MOUNTPOINT options ... */
        char *save = NULL, *field = strtok_r(line, " ", &save);
        for (int i = 0; field && i < 4; i++) field = strtok_r(NULL, " ", &save);
        if (field && !strchr(field, '\\')) { /* (an escaped space: not ours to guess) */
            snprintf(out, len, "%s", field);
            found = true;
        }
    }
    fclose(f);
    return found;
}

/* This process's cgroup in the unified hierarchy ("0::/path"). */
static bool own_cgroup(char *out, size_t len) {
    FILE *f = fopen("/proc/self/cgroup", "re");
    if (!f) return false;
    char line[4096];
    bool found = false;
    while (!found && fgets(line, sizeof line, f))
        if (strncmp(line, "0::", 3) == 0) {
            line[strcspn(line, "\n")] = 0;
            snprintf(out, len, "%s", line + 3);
            found = true;
        }
    fclose(f);
    return found;
}

/* Whether this process is the only one in the cgroup at dir. */
static bool alone_in(const char *dir) {
    char path[PATH_MAX + 16];
    if (snprintf(path, sizeof path, "%s/cgroup.procs", dir) >= (int)sizeof path) return false;
    FILE *f = fopen(path, "re");
    if (!f) return false;
    long pid;
    bool alone = true;
    while (fscanf(f, "%ld", &pid) == 1) alone = alone && pid == (long)getpid();
    fclose(f);
    return alone;
}

static const struct {
    unsigned bit;
    const char *name;
} CONTROLLERS[] = {{TD_CG_MEMORY, "memory"}, {TD_CG_PIDS, "pids"}, {TD_CG_CPU, "cpu"}};

/* Enables for dir's children the controllers of `want` that dir has; the ones enabled. */
static unsigned enable(const char *dir, unsigned want) {
    char path[PATH_MAX + 32], have[512] = "";
    snprintf(path, sizeof path, "%s/cgroup.controllers", dir);
    FILE *f = fopen(path, "re");
    if (f) {
        if (!fgets(have, sizeof have, f)) have[0] = 0;
        fclose(f);
    }
    unsigned got = 0;
    for (size_t i = 0; i < sizeof CONTROLLERS / sizeof *CONTROLLERS; i++) {
        if (!(want & CONTROLLERS[i].bit)) continue;
        char word[32];
        snprintf(word, sizeof word, " %s ", CONTROLLERS[i].name);
        char padded[520];
        snprintf(padded, sizeof padded, " %.*s ", (int)strcspn(have, "\n"), have);
        if (!strstr(padded, word)) continue;
        snprintf(word, sizeof word, "+%s", CONTROLLERS[i].name);
        if (write_path(dir, "cgroup.subtree_control", word) == 0) got |= CONTROLLERS[i].bit;
    }
    return got;
}

static void names_of(unsigned set, char *out, size_t len) {
    out[0] = 0;
    for (size_t i = 0; i < sizeof CONTROLLERS / sizeof *CONTROLLERS; i++)
        if (set & CONTROLLERS[i].bit)
            snprintf(out + strlen(out), len - strlen(out), "%s%s", out[0] ? ", " : "",
                     CONTROLLERS[i].name);
}

void td_cgroups_setup(td_cgroups *cg, const char *hint, char *note, size_t len) {
    memset(cg, 0, sizeof *cg);
    char mount[PATH_MAX], own[PATH_MAX], dir[2 * PATH_MAX + 8];
    if (!find_mount(mount, sizeof mount) || !own_cgroup(own, sizeof own)) {
        snprintf(note, len,
                 "no cgroup v2 here: a job's processes are tracked by their process group "
                 "(one that leaves it with setsid can outlive the job), and resources.memory_gb, "
                 "pids and cpu_weight are not enforced");
        return;
    }
    snprintf(dir, sizeof dir, "%s%s", mount, strcmp(own, "/") == 0 ? "" : own);
    /* Under systemd with Delegate=yes the service's cgroup is ours: the daemon moves into a
     * leaf of it, so that controllers can be enabled for the jobs beside it (a cgroup holding
     * processes cannot give its children controllers). Run by hand, its cgroup may hold other
     * processes (a shell): a subtree of its own is made there, without controllers then. */
    char base[sizeof dir + 64];
    bool moved = false;
    if (strcmp(own, "/") != 0 && alone_in(dir)) {
        char leaf[sizeof dir + 16];
        snprintf(leaf, sizeof leaf, "%s/daemon", dir);
        td_err err = {{0}};
        moved = (mkdir(leaf, 0755) == 0 || errno == EEXIST) && td_cgroup_enter(leaf, &err) == 0;
    }
    if (moved)
        snprintf(base, sizeof base, "%s/jobs", dir);
    else
        snprintf(base, sizeof base, "%s/traind-%s", dir, hint);
    if ((mkdir(base, 0755) != 0 && errno != EEXIST) || access(base, W_OK) != 0) {
        snprintf(note, len,
                 "cgroup v2 at %s is not writable (%s): a job's processes are tracked by their "
                 "process group, and resources.memory_gb, pids and cpu_weight are not enforced "
                 "(under systemd: Delegate=yes)",
                 dir, strerror(errno));
        return;
    }
    unsigned want = TD_CG_MEMORY | TD_CG_PIDS | TD_CG_CPU;
    unsigned got = enable(dir, want);
    got = enable(base, got);
    if (snprintf(cg->subtree, sizeof cg->subtree, "%s", base) >= (int)sizeof cg->subtree) {
        cg->subtree[0] = 0;
        snprintf(note, len, "cgroup v2: %s is too long a path; no cgroups for jobs", base);
        return;
    }
    cg->controllers = got;
    char on[64], off[64];
    names_of(got, on, sizeof on);
    names_of(want & ~got, off, sizeof off);
    snprintf(
        note, len,
        "each attempt runs in a cgroup of its own under %s (cgroup.kill ends all of it)%s%s%s%s",
        base, got ? "; limits: " : "", on, got != want ? "; not available here (" : "", off);
    if (got != want)
        snprintf(note + strlen(note), len - strlen(note),
                 "): the matching resources are not enforced");
}

int td_cgroups_make(const td_cgroups *cg, const char *name, const td_cgroup_limits *lim, char *path,
                    size_t len, td_err *err) {
    if (!cg->subtree[0]) return td_fail(err, "no cgroup v2 subtree");
    if (snprintf(path, len, "%s/%s", cg->subtree, name) >= (int)len)
        return td_fail(err, "%s/%s: too long a path", cg->subtree, name);
    if (mkdir(path, 0755) != 0 && errno != EEXIST)
        return td_fail(err, "cannot create the cgroup %s: %s", path, strerror(errno));
    int d = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (d < 0) return td_fail(err, "%s: %s", path, strerror(errno));
    /* one left by a daemon that died while making it: nothing of it may run on */
    int old = openat(d, "ranks", O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (old >= 0) td_cgroup_kill(old), close(old);
    unsigned on = cg->controllers ? enable(path, cg->controllers) : 0;
    int rc = 0;
    static const char *const LEAVES[] = {"shepherd", "ranks"};
    for (int i = 0; i < 2 && rc == 0; i++)
        if (mkdirat(d, LEAVES[i], 0755) != 0 && errno != EEXIST)
            rc = td_fail(err, "cannot create the cgroup %s/%s: %s", path, LEAVES[i],
                         strerror(errno));
    int ranks = rc == 0 ? openat(d, "ranks", O_PATH | O_DIRECTORY | O_CLOEXEC) : -1;
    char v[32];
    if (ranks >= 0 && (on & TD_CG_MEMORY) && lim->memory_bytes > 0) {
        snprintf(v, sizeof v, "%lld", lim->memory_bytes);
        if (write_at(ranks, "memory.max", v) != 0)
            rc = td_fail(err, "%s/ranks: memory.max %s: %s", path, v, strerror(errno));
        (void)write_at(ranks, "memory.oom.group", "1"); /* one rank killed: all of them */
    }
    if (ranks >= 0 && rc == 0 && (on & TD_CG_PIDS) && lim->pids > 0) {
        snprintf(v, sizeof v, "%ld", lim->pids);
        if (write_at(ranks, "pids.max", v) != 0)
            rc = td_fail(err, "%s/ranks: pids.max %s: %s", path, v, strerror(errno));
    }
    if (ranks >= 0 && rc == 0 && (on & TD_CG_CPU) && lim->cpu_weight > 0) {
        snprintf(v, sizeof v, "%d", lim->cpu_weight);
        if (write_at(ranks, "cpu.weight", v) != 0)
            rc = td_fail(err, "%s/ranks: cpu.weight %s: %s", path, v, strerror(errno));
    }
    if (ranks >= 0) close(ranks);
    close(d);
    return rc;
}

bool td_cgroups_remove(const char *path) {
    if (!path || !path[0]) return true;
    int d = open(path, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (d < 0) return errno == ENOENT;
    /* a shepherd still in it is an attempt still going (or just starting: its shepherd is
     * moved in before its ranks' cgroup is used) */
    int leaf = openat(d, "shepherd", O_PATH | O_DIRECTORY | O_CLOEXEC);
    bool busy = leaf >= 0 && td_cgroup_populated(leaf);
    if (leaf >= 0) close(leaf);
    leaf = openat(d, "ranks", O_PATH | O_DIRECTORY | O_CLOEXEC);
    busy = busy || (leaf >= 0 && td_cgroup_populated(leaf));
    if (leaf >= 0) close(leaf);
    if (!busy) {
        unlinkat(d, "ranks", AT_REMOVEDIR);
        unlinkat(d, "shepherd", AT_REMOVEDIR);
    }
    close(d);
    return !busy && rmdir(path) == 0;
}

void td_cgroups_sweep(const td_cgroups *cg) {
    if (!cg->subtree[0]) return;
    DIR *d = opendir(cg->subtree);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        if (strncmp(e->d_name, "job-", 4) != 0) continue;
        char path[PATH_MAX + 300];
        snprintf(path, sizeof path, "%s/%s", cg->subtree, e->d_name);
        td_cgroups_remove(path);
    }
    if (d) closedir(d);
}

void td_cgroups_release(const td_cgroups *cg) {
    if (!cg->subtree[0]) return;
    td_cgroups_sweep(cg);
    (void)rmdir(cg->subtree); /* EBUSY: an attempt left running keeps it, for the next start */
}
