#define _GNU_SOURCE /* prctl, sigtimedwait, pthread_timedjoin_np */
#include "service/run/td_launch_private.h"

#include "dist/td_dist.h"
#include "dist/td_store.h"
#include "service/run/td_cgroup.h"
#include "base/td_strv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <netinet/in.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

int td_launch_free_port(int *port, td_err *err) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    if (fd < 0) return td_fail(err, "socket: %s", strerror(errno));
    struct sockaddr_in a = {
        .sin_family = AF_INET, .sin_port = 0, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        int e = errno;
        close(fd);
        return td_fail(err, "cannot find a free port: %s", strerror(e));
    }
    close(fd);
    *port = ntohs(a.sin_port);
    return 0;
}

/* execvp's PATH search, done before fork (it allocates). */
static int resolve_program(const td_launch_config *cfg, const char *name, char *out, size_t len,
                           td_err *err) {
    if (strchr(name, '/')) { /* a relative one is the workers' cwd's, where they exec it */
        char full[4096];
        snprintf(full, sizeof full, "%s/%s", cfg->cwd ? cfg->cwd : ".", name);
        bool ok = name[0] == '/' ? access(name, X_OK) == 0
                  : cfg->cwd_fd  ? faccessat(*cfg->cwd_fd, name, X_OK, 0) == 0
                                 : access(full, X_OK) == 0;
        if (!ok) return td_fail(err, "cannot run %s: %s", name, strerror(errno));
        snprintf(out, len, "%s", name);
        return 0;
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        const char *colon = strchr(p, ':');
        size_t dl = colon ? (size_t)(colon - p) : strlen(p);
        /* only absolute entries: a relative one ("", ".") would be each worker's cwd, which
         * command_jobs' check (td_submit_command.c) cannot see */
        snprintf(out, len, "%.*s/%s", (int)dl, p, name);
        if (dl > 0 && p[0] == '/' && access(out, X_OK) == 0) return 0;
        p += dl + (colon ? 1 : 0);
    }
    return td_fail(err, "cannot run %s: not found in PATH (%s)", name, path);
}

/* What a child needs that must be made before fork (the daemon has threads: a child may not
 * allocate or take a lock): the groups it gets, the cgroup it joins. */
typedef struct child_setup {
    gid_t groups[256];
    int n_groups;
    int cgroup_procs; /* the cgroup's cgroup.procs, open for writing; -1: none */
} child_setup;

static void child_fail(const char *msg, size_t len) {
    (void)!write(STDERR_FILENO, msg, len);
    _exit(127);
}
#define CHILD_FAIL(text) child_fail(text, sizeof text - 1)

/* The identity and limits of a child: the cgroup first (as root: a job may not move itself),
 * then the file size limit, then groups, group and user (each needs the privilege the next
 * gives up), and no way back (no_new_privs). A process that cannot do any of it does not run. */
static void drop_privileges(const td_launch_config *cfg, const child_setup *cs) {
    if (cs->cgroup_procs >= 0 && write(cs->cgroup_procs, "0\n", 2) != 2)
        CHILD_FAIL("traind: cannot enter the job's cgroup\n");
    if (cfg->max_file_bytes > 0) {
        struct rlimit rl = {(rlim_t)cfg->max_file_bytes, (rlim_t)cfg->max_file_bytes};
        if (setrlimit(RLIMIT_FSIZE, &rl) != 0)
            CHILD_FAIL("traind: cannot set the job's file size limit\n");
    }
    /* a launcher given capabilities to keep (a non-root daemon's ambient set) passes none on:
     * exec keeps the ambient set, whatever the user */
    if (prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0 && errno != EINVAL)
        CHILD_FAIL("traind: cannot clear the ambient capabilities for the job\n");
    if (cfg->user && cfg->user->drop &&
        (setgroups((size_t)cs->n_groups, cs->groups) != 0 || setgid(cfg->user->gid) != 0 ||
         setuid(cfg->user->uid) != 0 || setuid(0) == 0))
        CHILD_FAIL("traind: cannot switch to the job's user (run_as)\n");
    if (cfg->user && prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0)
        CHILD_FAIL("traind: cannot set no_new_privs for the job\n");
}

/* In the child, between fork and exec: async-signal-safe calls only (the daemon has threads). */
static void exec_worker(const td_launch_config *cfg, int r, const char *program, char **argv,
                        char **env, pid_t pgid, const cpu_set_t *cpus, const child_setup *cs) {
    setpgid(0, pgid);
    if (cpus) (void)sched_setaffinity(0, sizeof *cpus, cpus); /* a failure only costs speed */
    if (cfg->stdout_fds && cfg->stdout_fds[r] >= 0) dup2(cfg->stdout_fds[r], STDOUT_FILENO);
    if (cfg->stderr_fds && cfg->stderr_fds[r] >= 0) dup2(cfg->stderr_fds[r], STDERR_FILENO);
    if (cfg->cwd_fd ? fchdir(*cfg->cwd_fd) != 0 : cfg->cwd && chdir(cfg->cwd) != 0)
        CHILD_FAIL("traind: cannot enter the job directory\n");
    drop_privileges(cfg, cs);
    /* after the switch: a change of user clears the parent-death signal */
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) _exit(127); /* the launcher died before prctl took effect */
    /* an ignored signal stays ignored across exec: a worker must not inherit the launcher's
     * SIG_IGN for SIGPIPE (or a starter's for SIGINT/SIGHUP) */
    struct sigaction dfl = {.sa_handler = SIG_DFL};
    static const int RESET[] = {SIGPIPE, SIGINT, SIGQUIT, SIGTERM, SIGHUP, SIGCHLD, SIGXFSZ};
    for (size_t i = 0; i < sizeof RESET / sizeof *RESET; i++) sigaction(RESET[i], &dfl, NULL);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execve(program, argv, env);
    CHILD_FAIL("traind: exec failed\n");
}

/* The groups of cfg's user and its cgroup's cgroup.procs, looked up and opened before fork. */
static int prepare_child(const td_launch_config *cfg, child_setup *cs, td_err *err) {
    cs->n_groups = 0;
    cs->cgroup_procs = -1;
    const td_identity *u = cfg->user;
    if (u && u->drop && u->lookup_groups) { /* NSS allocates and may open files */
        cs->n_groups = (int)(sizeof cs->groups / sizeof cs->groups[0]);
        if (getgrouplist(u->name, u->gid, cs->groups, &cs->n_groups) < 0) {
            cs->n_groups = 1; /* more than 256: the primary group alone */
            cs->groups[0] = u->gid;
        }
    } else if (u && u->drop) {
        for (int i = 0; i < u->n_groups && i < 256; i++) cs->groups[cs->n_groups++] = u->groups[i];
    }
    if (cfg->cgroup) {
        char path[4096];
        snprintf(path, sizeof path, "%s/cgroup.procs", cfg->cgroup);
        cs->cgroup_procs = open(path, O_WRONLY | O_CLOEXEC);
        if (cs->cgroup_procs < 0) return td_fail(err, "cannot open %s: %s", path, strerror(errno));
    }
    return 0;
}

/* The CPUs of worker i: the i-th of n equal slices of the launcher's own, in CPU order; false
 * when not binding (asked not to, or fewer CPUs than workers: nothing to share out). */
static bool worker_cpus(const td_launch_config *cfg, int i, int n, cpu_set_t *out) {
    cpu_set_t all;
    if (cfg->no_cpu_bind || sched_getaffinity(0, sizeof all, &all) != 0) return false;
    int total = CPU_COUNT(&all);
    if (total < n || n < 2) return false;
    int share = total / n, seen = 0;
    CPU_ZERO(out);
    for (int c = 0; c < CPU_SETSIZE && seen < (i + 1) * share; c++)
        if (CPU_ISSET(c, &all)) {
            if (seen >= i * share) CPU_SET(c, out);
            seen++;
        }
    return true;
}

int td_group_start(td_group *g, const td_launch_config *cfg, int attempt, td_err *err) {
    int n = cfg->launch_self ? 1 : cfg->nproc_per_node;
    memset(g, 0, sizeof *g);
    g->cgroup_fd = cfg->cgroup ? open(cfg->cgroup, O_PATH | O_DIRECTORY | O_CLOEXEC) : -1;
    if (cfg->cgroup && g->cgroup_fd < 0)
        return td_fail(err, "cannot open the cgroup %s: %s", cfg->cgroup, strerror(errno));
    g->n = n;
    g->launch_self = cfg->launch_self;
    g->rank_base = cfg->node_rank * cfg->nproc_per_node;
    g->failed_rank = g->failed_local = -1;
    td_launch_shared shared;
    td_launch_shared_init(cfg, &shared, g->env_note, sizeof g->env_note);
    char program[4096];
    if (resolve_program(cfg, cfg->argv[0], program, sizeof program, err) != 0) return -1;
    char **envs[n], **argvs[n];
    int argc = 0;
    while (cfg->argv[argc]) argc++;
    bool rank_arg = cfg->local_rank_arg && cfg->local_rank_arg[0];
    cpu_set_t *cpus = td_calloc((size_t)n, sizeof *cpus);
    bool bind = true;
    for (int i = 0; i < n; i++) { /* made before fork: the child may not allocate */
        envs[i] = td_launch_worker_env(cfg, &shared, i, attempt);
        argvs[i] = td_strv_new(argc + 1);
        for (int a = 0; a < argc; a++) argvs[i][a] = td_str_dup(cfg->argv[a]);
        if (rank_arg) {
            char arg[64];
            snprintf(arg, sizeof arg, "%.32s=%d", cfg->local_rank_arg, i);
            argvs[i][argc] = td_str_dup(arg);
        }
        bind = bind && worker_cpus(cfg, i, n, &cpus[i]);
    }
    child_setup cs;
    if (prepare_child(cfg, &cs, err) != 0) {
        for (int i = 0; i < n; i++) td_strv_free(envs[i]), td_strv_free(argvs[i]);
        free(cpus);
        return -1;
    }
    g->pids = td_calloc((size_t)n, sizeof(pid_t));
    int rc = 0;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            rc = td_fail(err, "fork: %s", strerror(errno));
            if (g->pgid) {
                killpg(g->pgid, SIGKILL);
                g->terminating = true;
            }
            break;
        }
        if (pid == 0)
            exec_worker(cfg, i, program, argvs[i], envs[i], g->pgid, bind ? &cpus[i] : NULL, &cs);
        if (!g->pgid) g->pgid = pid;
        setpgid(pid, g->pgid); /* both sides set it: whichever runs first wins the race */
        g->pids[i] = pid;
        g->alive++;
    }
    for (int i = 0; i < n; i++) td_strv_free(envs[i]), td_strv_free(argvs[i]);
    free(cpus);
    if (cs.cgroup_procs >= 0) close(cs.cgroup_procs);
    return rc;
}

static int status_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

/* Whether anything of the group is left: in its process group, or (what left that with setsid)
 * in its cgroup. */
static bool td_group_leftovers(const td_group *g) {
    return (g->pgid > 0 && killpg(g->pgid, 0) == 0) ||
           (g->cgroup_fd >= 0 && td_cgroup_populated(g->cgroup_fd));
}

/* sig to every process of the group: its process group, and all of its cgroup. */
static void signal_all(const td_group *g, int sig) {
    if (g->pgid > 0) killpg(g->pgid, sig); /* never 0: that is our own group */
    if (g->cgroup_fd >= 0) {
        if (sig == SIGKILL)
            td_cgroup_kill(g->cgroup_fd);
        else
            td_cgroup_signal(g->cgroup_fd, sig);
    }
}

bool td_group_reaped(td_group *g, pid_t pid, int status, double grace_s) {
    int local = -1;
    for (int i = 0; i < g->n; i++)
        if (g->pids[i] == pid) local = i;
    if (local < 0) return false;
    g->pids[local] = 0;
    g->alive--;
    int code = status_code(status);
    if (code != 0 && g->terminating && !g->stop_status) g->stop_status = code;
    if (g->grace_expired && !g->grace_note[0] && WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL)
        snprintf(g->grace_note, sizeof g->grace_note,
                 "%s %d (pid %d) did not stop within the %g s grace period after SIGTERM and "
                 "was killed with SIGKILL (exit status 137)",
                 g->launch_self ? "the launching process of ranks from" : "rank",
                 g->rank_base + local, (int)pid, g->grace_s);
    if (code != 0 && !g->terminating) {
        g->first_failure = code;
        g->failed_rank = g->rank_base + local;
        g->failed_local = local;
        g->failed_pid = pid;
        struct timespec now;
        clock_gettime(CLOCK_REALTIME, &now);
        g->failed_at = (double)now.tv_sec + now.tv_nsec * 1e-9;
        if (g->launch_self && WIFSIGNALED(status))
            snprintf(g->reason, sizeof g->reason,
                     "the launching process of ranks from %d (pid %d) failed with signal %d (%s)",
                     g->rank_base, (int)pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
        else if (g->launch_self)
            snprintf(g->reason, sizeof g->reason,
                     "the launching process of ranks from %d (pid %d) failed with exit code %d",
                     g->rank_base, (int)pid, code);
        else if (WIFSIGNALED(status))
            snprintf(g->reason, sizeof g->reason,
                     "rank %d (local %d, pid %d) failed with signal %d (%s)", g->failed_rank, local,
                     (int)pid, WTERMSIG(status), strsignal(WTERMSIG(status)));
        else
            snprintf(g->reason, sizeof g->reason,
                     "rank %d (local %d, pid %d) failed with exit code %d", g->failed_rank, local,
                     (int)pid, code);
        if (g->alive > 0) td_group_terminate(g, SIGTERM, grace_s);
    }
    /* what the group's own processes left behind in it (a spawned child whose parent died, a
     * loader's worker) ends with them, so none outlives the job: told to stop now unless it
     * was, killed when the grace period is over, and waited for until then (td_group_tick) */
    if (g->alive == 0 && g->pgid > 0 && td_group_leftovers(g)) {
        if (!g->terminating) td_group_terminate_all(g, SIGTERM, grace_s);
        g->lingering = true;
    }
    return true;
}

void td_group_terminate_all(td_group *g, int sig, double grace_s) {
    signal_all(g, sig);
    g->terminating = true;
    g->grace_s = grace_s;
    g->kill_at = sig == SIGKILL ? 0 : td_clock_now() + grace_s;
}

void td_group_terminate(td_group *g, int sig, double grace_s) {
    if (g->alive > 0) {
        td_group_terminate_all(g, sig, grace_s);
        return;
    }
    g->terminating = true;
    g->grace_s = grace_s;
    g->kill_at = sig == SIGKILL ? 0 : td_clock_now() + grace_s;
}

bool td_group_over(const td_group *g) {
    return g->alive == 0 && !g->lingering;
}

void td_group_tick(td_group *g) {
    if (g->lingering) {
        /* the daemon is the leftovers' subreaper and reaps them, so an empty group is gone */
        if (!td_group_leftovers(g)) {
            g->lingering = false;
        } else if (g->kill_at == 0 || td_clock_now() >= g->kill_at) {
            signal_all(g, SIGKILL);
            g->kill_at = 0;
            /* nothing survives SIGKILL; with a cgroup its emptying is waited for all the same
             * (the attempt is over only when it is empty) */
            if (g->cgroup_fd < 0) g->lingering = false;
        }
        return;
    }
    if (g->terminating && g->kill_at > 0 && g->alive > 0 && td_clock_now() >= g->kill_at) {
        signal_all(g, SIGKILL);
        g->kill_at = 0;
        g->grace_expired = true; /* who was still there is told by td_group_reaped */
    }
}

void td_group_free(td_group *g) {
    free(g->pids);
    g->pids = NULL;
    if (g->cgroup_fd >= 0) close(g->cgroup_fd);
    g->cgroup_fd = -1;
}

/* Waits for a child for at most 200 ms (so stop_signal and kill deadlines are seen); 0 when
 * none exited, -1 when there are none. */
static pid_t wait_child(int *status) {
    pid_t pid = waitpid(-1, status, WNOHANG);
    if (pid != 0) return pid;
    sigset_t chld; /* SIGCHLD (blocked) wakes us as soon as a child changes state */
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    struct timespec ts = {0, 200 * 1000 * 1000};
    sigtimedwait(&chld, NULL, &ts);
    return 0;
}

/* A note for the master's rendezvous store, sent from a thread of its own: connecting to a host
 * that drops packets can block far beyond any deadline, and the launcher must go on reaping and
 * killing its workers meanwhile. The thread and tell_master share it; the last one out frees it. */
typedef struct master_note {
    char host[256];
    int port;
    char namespace_[256];
    char why[400];
    bool failed;
    int rc;
    td_err err;
    atomic_int owners;
} master_note;

/* 1.5 s: a refused connection is retried until then (the master may still be starting), but
 * mostly it means the store is gone with rank 0, and the node's own exit waits on this. */
static void *send_note(void *p) {
    master_note *n = p;
    n->rc = td_store_abort_at(n->host, n->port, n->namespace_, n->why, 1.5, &n->failed, &n->err);
    if (atomic_fetch_sub(&n->owners, 1) == 1) free(n);
    return NULL;
}

/* --nnodes > 1, before the job has begun: the other nodes' ranks would wait for this node's
 * until their timeout, and for ever if a worker died before it reached the rendezvous store. So
 * the store (at the master, hosted by rank 0) hears why now and fails every rank with it; once
 * every rank has joined it ignores this, and the collectives report the failure instead. Best
 * effort, a few seconds at most, before this node's workers are stopped (rank 0 may be one). */
static void tell_master(const td_launch_config *cfg, int attempt, const char *what, FILE *log) {
    master_note *n = td_calloc(1, sizeof *n);
    snprintf(n->host, sizeof n->host, "%s", cfg->master_addr);
    n->port = cfg->master_port;
    td_dist_namespace(n->namespace_, sizeof n->namespace_, cfg->run_id, attempt);
    snprintf(n->why, sizeof n->why, "node %d: %.300s before the job began", cfg->node_rank, what);
    atomic_init(&n->owners, 2);
    pthread_t th;
    if (pthread_create(&th, NULL, send_note, n) != 0) {
        free(n);
        return;
    }
    struct timespec until;
    clock_gettime(CLOCK_REALTIME, &until);
    until.tv_sec += 4;
    if (pthread_timedjoin_np(th, NULL, &until) != 0) {
        pthread_detach(th);
        fprintf(log, "[traind-run] the rendezvous store at %s:%d did not answer in time\n",
                cfg->master_addr, cfg->master_port);
        if (atomic_fetch_sub(&n->owners, 1) == 1) free(n);
        return;
    }
    /* silent when it could not: mostly the store is gone already, with rank 0 */
    if (n->rc == 0 && n->failed)
        fprintf(log, "[traind-run] told the rendezvous store at %s:%d: %s\n", cfg->master_addr,
                cfg->master_port, n->why);
    free(n);
}

/* Worker pid of g ended with `status`, not yet recorded in g: if that is this node's first
 * failure, tells the master (with several nodes). Not for rank 0: the store went with it. */
static void report_failure(const td_launch_config *cfg, int attempt, const td_group *g, pid_t pid,
                           int status, FILE *log) {
    if (cfg->nnodes < 2 || g->terminating || status_code(status) == 0) return;
    int local = -1;
    for (int i = 0; i < g->n; i++)
        if (g->pids[i] == pid) local = i;
    int rank = g->rank_base + local;
    if (local < 0 || rank == 0) return;
    char what[160];
    if (WIFSIGNALED(status))
        snprintf(what, sizeof what, "rank %d was killed by signal %d (%s)", rank, WTERMSIG(status),
                 strsignal(WTERMSIG(status)));
    else
        snprintf(what, sizeof what, "rank %d failed with exit code %d", rank, status_code(status));
    tell_master(cfg, attempt, what, log);
}

/* One attempt: start the group, wait for it; returns the first failure's code (0: success). */
static int run_attempt(const td_launch_config *cfg, int attempt, FILE *log, bool *stopped,
                       td_err *err) {
    td_group g;
    if (td_group_start(&g, cfg, attempt, err) != 0) {
        while (g.alive > 0) {
            int status;
            pid_t pid = waitpid(-1, &status, 0);
            if (pid < 0) break;
            td_group_reaped(&g, pid, status, 0);
        }
        td_group_free(&g);
        return -1;
    }
    if (attempt == 0 && g.env_note[0]) fprintf(log, "[traind-run] %s\n", g.env_note);
    bool peer_failed = false;
    while (!td_group_over(&g)) {
        if (cfg->stop_signal && *cfg->stop_signal && !g.terminating) {
            fprintf(log, "[traind-run] forwarding signal %d to the workers\n",
                    (int)*cfg->stop_signal);
            td_group_terminate(&g, (int)*cfg->stop_signal, cfg->grace_s);
            *stopped = true;
            if (cfg->nnodes > 1 && cfg->node_rank > 0) { /* node 0's store goes with rank 0 */
                char what[96];
                snprintf(what, sizeof what, "traind-run was stopped by signal %d (%s)",
                         (int)*cfg->stop_signal, strsignal((int)*cfg->stop_signal));
                tell_master(cfg, attempt, what, log);
            }
        }
        char why[512];
        if (cfg->watch && cfg->watch(cfg->watch_arg, attempt, &g, why, sizeof why) &&
            !g.terminating) { /* another node failed: its ranks' peers here stop too */
            fprintf(log, "[traind-run] %s; stopping this node's workers\n", why);
            td_group_terminate(&g, SIGTERM, cfg->grace_s);
            peer_failed = true;
        }
        int status;
        pid_t pid = wait_child(&status);
        if (pid < 0) { /* no child left to wait for: what lingers is not ours to reap */
            if (g.lingering) signal_all(&g, SIGKILL);
            break;
        }
        td_group_tick(&g);
        if (pid == 0) continue;
        report_failure(cfg, attempt, &g, pid, status, log);
        int failed_before = g.failed_rank;
        if (td_group_reaped(&g, pid, status, cfg->grace_s) && g.failed_rank != failed_before)
            fprintf(log, "[traind-run] %s%s\n", g.reason,
                    g.alive > 0 ? "; stopping the other workers" : "");
    }
    /* stopped for another node's failure: this attempt failed too (a restart, if any left) */
    int code = g.first_failure ? g.first_failure : peer_failed ? 1 : 0;
    if (cfg->after_attempt) cfg->after_attempt(cfg->hook_arg, attempt, &g);
    td_group_free(&g);
    return code;
}

/* The directories of each rank's error file in attempt `attempt` (td_launch_error_file), empty:
 * a file left by an earlier run would be taken for this one's. */
static int make_error_dirs(const td_launch_config *cfg, int attempt, td_err *err) {
    if (!cfg->error_dir || !cfg->error_dir[0]) return 0;
    for (int r = 0; r < cfg->nproc_per_node; r++) {
        char file[4096];
        td_launch_error_file(cfg, attempt, r, file, sizeof file);
        for (char *slash = strchr(file + 1, '/'); slash; slash = strchr(slash + 1, '/')) {
            *slash = 0;
            if (mkdir(file, 0755) != 0 && errno != EEXIST)
                return td_fail(err, "cannot make %s: %s", file, strerror(errno));
            *slash = '/';
        }
        if (unlink(file) != 0 && errno != ENOENT)
            return td_fail(err, "cannot remove the old %s: %s", file, strerror(errno));
    }
    return 0;
}

int td_launch_run(const td_launch_config *cfg, FILE *log, int *exit_code, td_err *err) {
    sigset_t chld, old;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    sigprocmask(SIG_BLOCK, &chld, &old);
    int rc = 0;
    *exit_code = 0;
    for (int attempt = 0; attempt <= cfg->max_restarts; attempt++) {
        bool stopped = false;
        if (attempt > 0)
            fprintf(log, "[traind-run] restarting the group (attempt %d of %d)\n", attempt + 1,
                    cfg->max_restarts + 1);
        if (make_error_dirs(cfg, attempt, err) != 0 ||
            (cfg->before_attempt && cfg->before_attempt(cfg->hook_arg, attempt, err) != 0)) {
            rc = -1;
            break;
        }
        int code = run_attempt(cfg, attempt, log, &stopped, err);
        if (code < 0) {
            rc = -1;
            break;
        }
        *exit_code = code;
        if (code == 0 || stopped) break;
    }
    sigprocmask(SIG_SETMASK, &old, NULL);
    return rc;
}
