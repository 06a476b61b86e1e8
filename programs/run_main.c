/* traind-run: a drop-in for torchrun. Starts --nproc-per-node copies of a script (with Python)
 * or a program with torchrun's environment, stops them all when one fails and says why as
 * torchrun does, restarts the group while restarts remain, forwards SIGINT and SIGTERM, and
 * exits with the failing worker's status. Options: run_options.c; the command: run_command.c;
 * each attempt's files: run_files.c; the process group: service/run/td_launch.c. */
#include "programs/run_options.h"

#include "base/td_strv.h"

#include <arpa/inet.h>
#include <errno.h>
#include <libgen.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) {
    stop_signal = sig;
}

/* One node and a port taken already (torchrun's default 29500 by another job, mostly): every
 * worker would fail on it, each in its own words, so say it once, before any starts. */
static void check_port(const run_options *o) {
    if (o->launch.nnodes > 1) return;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return;
    struct sockaddr_in a = {.sin_family = AF_INET,
                            .sin_port = htons((uint16_t)o->launch.master_port),
                            .sin_addr.s_addr = htonl(INADDR_ANY)};
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    bool taken = bind(fd, (struct sockaddr *)&a, sizeof a) != 0 && errno == EADDRINUSE;
    close(fd);
    if (!taken) return;
    fprintf(stderr,
            "traind-run: the master port %d is in use on this machine (another job?): give "
            "--standalone for a free one, or another --master-port\n",
            o->launch.master_port);
    exit(1);
}

int main(int argc, char **argv) {
    run_options o;
    run_options_parse(argc, argv, &o);
    td_err err = {{0}};
    if (o.launch.master_port == 0) { /* --standalone */
        if (td_launch_free_port(&o.launch.master_port, &err) != 0) {
            fprintf(stderr, "traind-run: %s\n", err.msg);
            return 1;
        }
    } else {
        check_port(&o);
    }
    run_rendezvous *rdzv = run_rendezvous_join(&o, stderr);
    char **command = run_command(&o, stderr);
    o.launch.argv = command;
    char name[256];
    snprintf(name, sizeof name, "%s", o.command[0]);
    run_files *files = run_files_setup(&o, basename(name), stderr);
    o.launch.stop_signal = &stop_signal;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* the workers' own children are handed to us when their parent dies, so td_launch_run
     * reaps them and sees when the attempt's process group is empty */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        fprintf(stderr, "traind-run: prctl(PR_SET_CHILD_SUBREAPER): %s\n", strerror(errno));
    int code;
    int rc = td_launch_run(&o.launch, stderr, &code, &err);
    run_files_finish(files);
    run_rendezvous_finish(rdzv, rc == 0 ? code : 1);
    td_strv_free(command);
    if (rc != 0) {
        fprintf(stderr, "traind-run: %s\n", err.msg);
        return 1;
    }
    return code;
}
