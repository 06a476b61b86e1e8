/* traind-run's command line: torchrun's options (with its defaults and both spellings,
 * --nproc-per-node and --nproc_per_node), mapped onto a td_launch_config, plus traind-run's own.
 * One table in run_options.c lists them; the help text is made from it. */
#ifndef RUN_OPTIONS_H
#define RUN_OPTIONS_H

#include "service/run/td_launch.h"

#include <stdbool.h>
#include <stdio.h>

typedef struct run_options {
    td_launch_config launch;
    bool standalone, no_python, module, run_id_given, port_given, addr_given;
    const char *nproc;           /* as given: a number, "auto", "cpu" or "gpu" */
    const char *log_dir;         /* --log-dir, or NULL */
    const char *redirects, *tee; /* "3", "0:1,1:2", or NULL */
    const char *rdzv_backend;    /* "static" (default) or "c10d" */
    const char *rdzv_endpoint;   /* HOST[:PORT], or NULL */
    const char *local_rank_arg;  /* "--local_rank" or "--local-rank", or NULL */
    const char *rdzv_conf;       /* "key=value,...", or NULL */
    bool node_rank_given;
    char **command; /* the script (or module, or program) and its arguments */
} run_options;

/* Parses argv into o. Exits with status 2 and a message on bad input, 0 after --help or
 * --version. Works out everything torchrun derives (the node count, the rendezvous, the number
 * of processes, the run id, the master port) but the command, which run_command.c makes. */
void run_options_parse(int argc, char **argv, run_options *o);
void run_options_usage(FILE *out);

/* The interpreter, argv and log lines of the command (run_command.c): as torchrun, the script
 * runs with "PYTHON -u script args" (or "-m module") unless --no-python; a program that is no
 * Python script (an ELF binary, a script for another interpreter, a command found on PATH) runs
 * as it is. Returns the argv to launch (allocated) and prints what it chose to log. Exits with
 * status 2 on a contradiction (-m with --no-python). */
char **run_command(const run_options *o, FILE *log);

/* The launchers' own rendezvous (run_rendezvous.c), for --rdzv-backend c10d with --nnodes above
 * 1, as torchrun's agents meet at the c10d endpoint: the launcher on the endpoint's host (or
 * the one given --node-rank 0) listens there, every launcher joins, and once --nnodes have
 * joined each gets its node rank (its --node-rank, else in the order they joined, the host's 0)
 * and the workers' MASTER_PORT (a free port on the host; MASTER_ADDR is the endpoint's host).
 * While the job runs, a node whose workers fail tells the host, which tells the others: their
 * workers are stopped 5 s later if they have not ended by then (most fail at once, in their
 * collectives, with the cause), and their attempt counts as failed. A launcher that vanishes is
 * a failure too. Runs the whole time in a thread of the host's launcher. */
typedef struct run_rendezvous run_rendezvous;
/* NULL unless o asks for it; else joins (exits 1 saying why when it fails: another run id, a
 * node rank twice, a different --nproc-per-node, no host within the join timeout) and sets
 * o->launch's node_rank, master_port and watch hook. */
run_rendezvous *run_rendezvous_join(run_options *o, FILE *log);
/* Tells the host how this node ended (code 0: done) and closes; r may be NULL. */
void run_rendezvous_finish(run_rendezvous *r, int code);

/* The per-attempt files of a run (run_files.c): error files, --log-dir, --redirects, --tee,
 * and torchrun's failure summary after a failed attempt. */
typedef struct run_files run_files;
/* Sets o->launch's error_dir and attempt hooks; exits 2 on a bad --redirects or --tee, 1 when
 * the directory cannot be made. `name` titles the failure summary (the script). */
run_files *run_files_setup(run_options *o, const char *name, FILE *log);
/* Removes what only this run needed (a temporary directory without logs). */
void run_files_finish(run_files *f);

#endif
