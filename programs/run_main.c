/* traind-run: a torchrun-compatible launcher. Starts --nproc-per-node copies of a command with
 * the torchrun environment, stops them all when one fails, restarts the group while restarts
 * remain, forwards SIGINT and SIGTERM, and exits with the failing worker's status. */
#include "core/td_parse.h"
#include "service/td_launch.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

static volatile sig_atomic_t stop_signal;

static void on_signal(int sig) {
    stop_signal = sig;
}

static void usage(FILE *out) {
    fprintf(out,
            "usage: traind-run --nproc-per-node N [--nnodes M --node-rank K]\n"
            "                  [--master-addr A] [--master-port P] [--max-restarts R]\n"
            "                  [--run-id ID] [--grace-period S] [--no-cpu-bind]\n"
            "                  -- COMMAND [ARGS...]\n"
            "\n"
            "Runs N copies of COMMAND with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE,\n"
            "GROUP_RANK, MASTER_ADDR, MASTER_PORT and TORCHELASTIC_RUN_ID /\n"
            "TORCHELASTIC_RESTART_COUNT set, as torchrun does. When a worker fails the others\n"
            "get SIGTERM (SIGKILL after the grace period, default 10 s) and, with restarts left,\n"
            "the group starts again; traind-worker then resumes from its latest checkpoint.\n"
            "Defaults: one node, MASTER_ADDR 127.0.0.1, a free MASTER_PORT, no restarts.\n"
            "The run id (TORCHELASTIC_RUN_ID) names the job in the rendezvous: without --run-id\n"
            "it is \"traind-run-ADDR-PORT\" with --nnodes above 1, from --master-addr and\n"
            "--master-port, so every node started with the same ones agrees (nodes that disagree\n"
            "all stop at once, saying so), and unique to this launcher with one node.\n"
            "Each worker is bound to an equal share of the CPUs traind-run may use (worker i to\n"
            "the i-th slice) when there are at least as many CPUs as workers: ranks that wait\n"
            "for each other every step run best undisturbed. --no-cpu-bind leaves them free.\n"
            "Underscores are accepted in option names (--nproc_per_node), as torchrun does.\n"
            "Exit status: 0, or the first failing worker's (128 + signal for a signal).\n");
}

/* Without --run-id, as torchrun's fixed default rendezvous id ("none"): the nodes of one job must
 * agree on it, so with several it comes only from what every node is given (the same master);
 * one node keeps a run of its own. The master's address is cut short to fit run_id, the same on
 * every node. */
static void default_run_id(td_launch_config *cfg) {
    if (cfg->nnodes > 1)
        snprintf(cfg->run_id, sizeof cfg->run_id, "traind-run-%.40s-%d", cfg->master_addr,
                 cfg->master_port);
    else
        snprintf(cfg->run_id, sizeof cfg->run_id, "run-%ld-%d", (long)time(NULL), (int)getpid());
}

/* "--nproc_per_node" and "--nproc-per-node" alike; "--opt=value" or "--opt value". */
static const char *option(int argc, char **argv, int *i, const char *name) {
    char norm[64];
    const char *a = argv[*i];
    size_t k = 0;
    for (; a[k] && a[k] != '=' && k + 1 < sizeof norm; k++) norm[k] = a[k] == '_' ? '-' : a[k];
    norm[k] = 0;
    if (strcmp(norm, name) != 0) return NULL;
    if (a[k] == '=') return a + k + 1;
    if (*i + 1 >= argc) {
        fprintf(stderr, "traind-run: %s needs a value\n", name);
        exit(2);
    }
    return argv[++*i];
}

static int int_value(const char *name, const char *v, int min, int max) {
    long x;
    if (!td_parse_long(v, min, max, &x)) {
        fprintf(stderr, "traind-run: %s \"%s\": expected an integer in [%d, %d]\n", name, v, min,
                max);
        exit(2);
    }
    return (int)x;
}

int main(int argc, char **argv) {
    td_launch_config cfg = {.nproc_per_node = 0, .nnodes = 1, .master_port = 0, .grace_s = 10};
    snprintf(cfg.master_addr, sizeof cfg.master_addr, "127.0.0.1");
    bool run_id_given = false;
    int i = 1;
    for (; i < argc; i++) {
        const char *v;
        if (strcmp(argv[i], "--") == 0) {
            i++;
            break;
        } else if (strcmp(argv[i], "--help") == 0 || strcmp(argv[i], "-h") == 0) {
            usage(stdout);
            return 0;
        } else if (strcmp(argv[i], "--version") == 0) {
            printf("traind-run %s\n", TRAIND_VERSION);
            return 0;
        } else if ((v = option(argc, argv, &i, "--nproc-per-node"))) {
            cfg.nproc_per_node = int_value("--nproc-per-node", v, 1, 1024);
        } else if ((v = option(argc, argv, &i, "--nnodes"))) {
            cfg.nnodes = int_value("--nnodes", v, 1, 1 << 16);
        } else if ((v = option(argc, argv, &i, "--node-rank"))) {
            cfg.node_rank = int_value("--node-rank", v, 0, 1 << 16);
        } else if ((v = option(argc, argv, &i, "--master-addr"))) {
            snprintf(cfg.master_addr, sizeof cfg.master_addr, "%s", v);
        } else if ((v = option(argc, argv, &i, "--master-port"))) {
            cfg.master_port = int_value("--master-port", v, 1, 65535);
        } else if ((v = option(argc, argv, &i, "--max-restarts"))) {
            cfg.max_restarts = int_value("--max-restarts", v, 0, 1000);
        } else if ((v = option(argc, argv, &i, "--run-id"))) {
            snprintf(cfg.run_id, sizeof cfg.run_id, "%s", v);
            run_id_given = true;
        } else if ((v = option(argc, argv, &i, "--grace-period"))) {
            cfg.grace_s = int_value("--grace-period", v, 0, 3600);
        } else if (strcmp(argv[i], "--no-cpu-bind") == 0 || strcmp(argv[i], "--no_cpu_bind") == 0) {
            cfg.no_cpu_bind = true;
        } else if (argv[i][0] == '-') {
            fprintf(stderr, "traind-run: unknown option %s\n", argv[i]);
            usage(stderr);
            return 2;
        } else {
            break; /* the command, without "--" */
        }
    }
    if (i >= argc || cfg.nproc_per_node == 0) {
        fprintf(stderr, "traind-run: %s\n",
                cfg.nproc_per_node == 0 ? "--nproc-per-node is required" : "no command given");
        usage(stderr);
        return 2;
    }
    if (cfg.node_rank >= cfg.nnodes) {
        fprintf(stderr, "traind-run: --node-rank %d is not below --nnodes %d\n", cfg.node_rank,
                cfg.nnodes);
        return 2;
    }
    td_err err = {{0}};
    if (cfg.master_port == 0) {
        if (cfg.nnodes > 1) {
            fprintf(stderr,
                    "traind-run: with --nnodes %d every node must be given the same "
                    "--master-port\n",
                    cfg.nnodes);
            return 2;
        }
        if (td_launch_free_port(&cfg.master_port, &err) != 0) {
            fprintf(stderr, "traind-run: %s\n", err.msg);
            return 1;
        }
    }
    if (!run_id_given) default_run_id(&cfg);
    cfg.argv = argv + i;
    cfg.stop_signal = &stop_signal;
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    /* the workers' own children are handed to us when their parent dies, so td_launch_run
     * reaps them and sees when the attempt's process group is empty */
    if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
        fprintf(stderr, "traind-run: prctl(PR_SET_CHILD_SUBREAPER): %s\n", strerror(errno));
    int code;
    if (td_launch_run(&cfg, stderr, &code, &err) != 0) {
        fprintf(stderr, "traind-run: %s\n", err.msg);
        return 1;
    }
    return code;
}
