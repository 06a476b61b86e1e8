#define _GNU_SOURCE /* prctl, sigtimedwait */
#include "td_launch.h"

#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
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

static void set_int_env(const char *name, int v) {
    char buf[32];
    snprintf(buf, sizeof buf, "%d", v);
    setenv(name, buf, 1);
}

/* In the child: the torchrun environment, death with the parent, then the command. */
static void exec_worker(const td_launch_config *cfg, int local_rank, int attempt, pid_t pgid) {
    setpgid(0, pgid);
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    if (getppid() == 1) _exit(127); /* the launcher died before prctl took effect */
    int world = cfg->nnodes * cfg->nproc_per_node;
    set_int_env("RANK", cfg->node_rank * cfg->nproc_per_node + local_rank);
    set_int_env("LOCAL_RANK", local_rank);
    set_int_env("WORLD_SIZE", world);
    set_int_env("LOCAL_WORLD_SIZE", cfg->nproc_per_node);
    set_int_env("GROUP_RANK", cfg->node_rank);
    setenv("MASTER_ADDR", cfg->master_addr, 1);
    set_int_env("MASTER_PORT", cfg->master_port);
    setenv("TORCHELASTIC_RUN_ID", cfg->run_id, 1);
    set_int_env("TORCHELASTIC_RESTART_COUNT", attempt);
    set_int_env("TORCHELASTIC_MAX_RESTARTS", cfg->max_restarts);
    /* as torchrun: one OpenMP thread per process unless the user chose otherwise */
    if (cfg->nproc_per_node > 1 && !getenv("OMP_NUM_THREADS")) setenv("OMP_NUM_THREADS", "1", 1);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, NULL);
    execvp(cfg->argv[0], cfg->argv);
    fprintf(stderr, "traind-run: cannot run %s: %s\n", cfg->argv[0], strerror(errno));
    _exit(127);
}

static int status_code(int status) {
    if (WIFEXITED(status)) return WEXITSTATUS(status);
    if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
    return 1;
}

/* Waits for a child until the deadline (CLOCK_MONOTONIC seconds); 0 when none exited. */
static pid_t wait_child(int *status, double deadline) {
    for (;;) {
        pid_t pid = waitpid(-1, status, WNOHANG);
        if (pid != 0) return pid; /* a child, or -1 when there are none */
        struct timespec now;
        clock_gettime(CLOCK_MONOTONIC, &now);
        double left = deadline - ((double)now.tv_sec + (double)now.tv_nsec * 1e-9);
        if (left <= 0) return 0;
        /* SIGCHLD (blocked) wakes us as soon as a child changes state */
        sigset_t chld;
        sigemptyset(&chld);
        sigaddset(&chld, SIGCHLD);
        struct timespec ts = {(time_t)left, (long)((left - (double)(time_t)left) * 1e9)};
        if (left > 0.2) ts = (struct timespec){0, 200 * 1000 * 1000}; /* see stop_signal */
        sigtimedwait(&chld, NULL, &ts);
        return 0;
    }
}

static double mono(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

/* One attempt: start the group, wait for it; returns the first failure's code (0: success). */
static int run_attempt(const td_launch_config *cfg, int attempt, FILE *log, bool *stopped,
                       td_err *err) {
    int n = cfg->nproc_per_node, alive = 0, first_failure = 0, failed_rank = -1;
    pid_t *pids = td_calloc((size_t)n, sizeof(pid_t));
    pid_t pgid = 0;
    for (int i = 0; i < n; i++) {
        pid_t pid = fork();
        if (pid < 0) {
            td_fail(err, "fork: %s", strerror(errno));
            if (pgid) killpg(pgid, SIGKILL);
            free(pids);
            return -1;
        }
        if (pid == 0) exec_worker(cfg, i, attempt, pgid);
        if (!pgid) pgid = pid;
        setpgid(pid, pgid); /* both sides set it: whichever runs first wins the race */
        pids[i] = pid;
        alive++;
    }
    double kill_at = 0;
    bool terminating = false;
    while (alive > 0) {
        if (cfg->stop_signal && *cfg->stop_signal && !terminating) {
            fprintf(log, "[traind-run] forwarding signal %d to the workers\n",
                    (int)*cfg->stop_signal);
            killpg(pgid, (int)*cfg->stop_signal);
            terminating = true;
            *stopped = true;
            kill_at = mono() + cfg->grace_s;
        }
        int status;
        pid_t pid = wait_child(&status, terminating ? kill_at : mono() + 3600);
        if (pid < 0) break;
        if (pid == 0) {
            if (terminating && mono() >= kill_at) {
                killpg(pgid, SIGKILL);
                kill_at = mono() + 3600;
            }
            continue;
        }
        int local = -1;
        for (int i = 0; i < n; i++)
            if (pids[i] == pid) local = i;
        if (local < 0) continue;
        alive--;
        int code = status_code(status);
        if (code != 0 && !terminating) {
            first_failure = code;
            failed_rank = cfg->node_rank * n + local;
            fprintf(log,
                    "[traind-run] rank %d (local %d, pid %d) failed with %s %d; stopping the "
                    "other workers\n",
                    failed_rank, local, (int)pid, WIFSIGNALED(status) ? "signal" : "exit code",
                    WIFSIGNALED(status) ? WTERMSIG(status) : code);
            killpg(pgid, SIGTERM);
            terminating = true;
            kill_at = mono() + cfg->grace_s;
        }
    }
    free(pids);
    return first_failure;
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
