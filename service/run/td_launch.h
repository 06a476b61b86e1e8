/* Launching and supervising a group of local worker processes with the torchrun environment:
 * traind-run and the daemon share it, so both start, stop and restart workers the same way.
 *
 * An attempt (a td_group) is nproc processes in one new process group, each with RANK,
 * LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, the
 * TORCHELASTIC_* variables (TORCHELASTIC_ERROR_FILE with an error_dir) and, with several nodes,
 * GLOO_SOCKET_IFNAME and NCCL_SOCKET_IFNAME unless the user set them (td_launch_env.c), and
 * PR_SET_PDEATHSIG so none outlives the thread that started it.
 * When one exits non-zero (or is killed) the rest get SIGTERM, then SIGKILL after the grace
 * period. Whatever they started themselves (mp.spawn's children, a data loader's workers)
 * belongs to the group too: signals go to the whole process group, and once the last of the
 * group's own processes has ended, anything left in it is killed. td_launch_run (traind-run) loops
 * over attempts, restarting the whole group while restarts remain; the daemon drives td_group
 * itself from its supervisor loop. */
#ifndef TD_LAUNCH_H
#define TD_LAUNCH_H

#include "base/td_clock.h"
#include "base/td_error.h"
#include "service/run/td_identity.h"

#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <sys/types.h>

struct td_group;

typedef struct td_launch_config {
    int nproc_per_node, nnodes, node_rank;
    char master_addr[256];
    int master_port; /* 0: a free port (one node only) */
    int max_restarts;
    char run_id[64];
    double grace_s; /* SIGTERM to SIGKILL */
    char *const *argv;
    /* set by a signal handler to forward SIGINT/SIGTERM to the group; may be NULL */
    volatile sig_atomic_t *stop_signal;

    /* for the daemon; zero values keep traind-run's behaviour */
    const char *cwd; /* the workers' directory; NULL: inherit */
    /* non-NULL: the workers enter this directory, open already (fchdir), not cwd by its name
     * (a directory the job chose, opened as the job: entering it by name as root could reach
     * what the job may not) */
    const int *cwd_fd;
    const int *stdout_fds;  /* [processes started] dup'ed onto each one's stdout; NULL: inherit */
    const int *stderr_fds;  /* likewise for stderr */
    char *const *extra_env; /* "NAME=value" entries added for every worker; NULL-terminated */
    /* CUDA_VISIBLE_DEVICES per process started (nproc_per_node, or 1 for launch_self), or
     * NULL; "0,1" gives a process two GPUs */
    const char *const *devices;
    /* "--local_rank" or "--local-rank": each worker's arguments end with OPTION=LOCAL_RANK, as
     * python -m torch.distributed.launch passed them; NULL or "": not */
    const char *local_rank_arg;
    /* true: the program starts the node's nproc_per_node processes itself (mp.spawn): one is
     * started, with LOCAL_RANK 0, RANK the node's first global rank, NODE_RANK, and the
     * node's LOCAL_WORLD_SIZE and WORLD_SIZE; devices[0] lists every GPU they may use */
    bool launch_self;
    /* true: leave the workers on every CPU the launcher may use. Otherwise each worker gets an
     * equal share of them (worker i the i-th slice, in CPU order) when there are at least as
     * many CPUs as workers: ranks that wait for each other at every step run best when none
     * is preempted by another rank's threads or moved away from its cache. */
    bool no_cpu_bind;
    /* non-NULL with drop: each process runs as that identity (the launcher must be root), with
     * no way back to more privileges (PR_SET_NO_NEW_PRIVS: a setuid program gains nothing) */
    const td_identity *user;
    /* a cgroup directory (cgroup v2) each process joins before exec, so that whatever they
     * start stays in it whatever it does (setsid, a double fork); NULL: none */
    const char *cgroup;
    /* RLIMIT_FSIZE of each process: no file it writes grows past this (0: unlimited) */
    long long max_file_bytes;
    /* with one, each rank's TORCHELASTIC_ERROR_FILE (where PyTorch's @record writes the
     * exception that ended it) is ERROR_DIR/attempt_N/LOCAL_RANK/error.json, torchrun's layout
     * (td_launch_error_file); td_launch_run makes the directories, other callers make them */
    const char *error_dir;
    /* td_launch_run only, both optional: called before each attempt starts (to open its log
     * files into stdout_fds/stderr_fds, which the caller owns; non-zero stops the run) and
     * after it is over, with its group (to report a failure, close its files) */
    int (*before_attempt)(void *arg, int attempt, td_err *err);
    void (*after_attempt)(void *arg, int attempt, const struct td_group *g);
    /* td_launch_run only, optional: called every 200 ms at most while an attempt runs; true
     * (with why) when another node's failure means this node's workers should stop (the
     * attempt then counts as failed) */
    bool (*watch)(void *arg, int attempt, const struct td_group *g, char *why, size_t len);
    void *watch_arg;
    void *hook_arg;
} td_launch_config;

/* One attempt's processes. */
typedef struct td_group {
    int n, alive;
    int rank_base;    /* the global rank of local rank 0 */
    bool launch_self; /* one launching process that starts the node's ranks itself */
    /* the group's own processes have ended, but what they started is still in the process
     * group: it was told to stop (SIGTERM) and is killed at kill_at */
    bool lingering;
    pid_t pgid;
    pid_t *pids;
    bool terminating;  /* SIGTERM sent: exits from now on are not failures */
    double kill_at;    /* CLOCK_MONOTONIC time for SIGKILL while terminating; 0: none */
    int first_failure; /* the first failing worker's status (128 + signal), 0: none */
    int failed_rank;   /* its global rank, -1: none */
    int failed_local;  /* its local rank, -1: none */
    pid_t failed_pid;
    double failed_at; /* when it was reaped (wall clock, seconds since the epoch) */
    char reason[256]; /* in words, for logs and the daemon's job record */
    /* once terminating: the first non-zero status of a worker told to stop (0: every one
     * stopped cleanly), and whether the grace period ran out (SIGKILL sent) */
    int stop_status;
    bool grace_expired;
    char grace_note[192]; /* "rank R (pid P) ignored SIGTERM ..." when a worker was SIGKILLed */
    double grace_s;
    /* the cgroup its processes joined (td_launch_config.cgroup), open; -1: none. With one,
     * signals reach every process in it, and the group is over only once it is empty */
    int cgroup_fd;
    /* what the launcher chose for the workers' environment that the log should show (the
     * socket interface of a multi-node job), or "" */
    char env_note[320];
} td_group;

/* Starts attempt `attempt` (TORCHELASTIC_RESTART_COUNT) of cfg's group. Safe in a multithreaded
 * process: everything the children need (environment, program path) is prepared before fork,
 * so a child only calls async-signal-safe functions until exec. -1 if it could not start (then
 * nothing is left running). */
int td_group_start(td_group *g, const td_launch_config *cfg, int attempt, td_err *err);
/* Records that child pid ended with wait status `status`. False if pid is not in the group. The
 * first failure starts termination of the rest (SIGTERM now, SIGKILL after grace_s). */
bool td_group_reaped(td_group *g, pid_t pid, int status, double grace_s);
/* Sends sig to the whole group and, unless it is SIGKILL, schedules SIGKILL after grace_s. */
void td_group_terminate(td_group *g, int sig, double grace_s);
/* The same, also once the group's own processes have ended (to what they left behind). */
void td_group_terminate_all(td_group *g, int sig, double grace_s);
/* Whether the attempt is over: its processes ended, and nothing they started is left in the
 * process group (or it was killed). Until then call td_group_tick now and then. */
bool td_group_over(const td_group *g);
/* SIGKILL to the group once its grace period is over. Call it now and then while terminating. */
void td_group_tick(td_group *g);
void td_group_free(td_group *g);

/* Runs the attempts; *exit_code is 0 when every process of an attempt succeeded, else the exit
 * status of the first process that failed (128 + signal for a signal). Returns -1 only when the
 * group could not be started at all. Blocks SIGCHLD while it runs. */
int td_launch_run(const td_launch_config *cfg, FILE *log, int *exit_code, td_err *err);

/* Local rank local_rank's TORCHELASTIC_ERROR_FILE in attempt `attempt`, or "" without an
 * error_dir. */
void td_launch_error_file(const td_launch_config *cfg, int attempt, int local_rank, char *out,
                          size_t len);

/* What a rank's error file (PyTorch's @record, torchrun's format) says of its failure. */
typedef struct td_rank_error {
    char message[1024];  /* "RuntimeError: what went wrong" */
    char *traceback;     /* the Python traceback (allocated), or NULL */
    long long timestamp; /* seconds since the epoch; 0: not given */
} td_rank_error;
/* Reads the error file open at fd (at most 1 MiB of it). -1 with err when it is not one. */
int td_rank_error_read(int fd, td_rank_error *e, td_err *err);
void td_rank_error_free(td_rank_error *e);
/* torchrun's failure summary ("NAME FAILED ... Root Cause (first observed failure): ...") for
 * g's first failure, e its error file's content (NULL: it wrote none; error_file is then
 * reported as not available). Allocated. */
char *td_launch_root_cause(const char *name, const td_group *g, const char *error_file,
                           const td_rank_error *e);

/* A free TCP port on the loopback interface (torchrun's choice for a single node). */
int td_launch_free_port(int *port, td_err *err);

#endif
