/* trainctl: submit, follow and manage traind jobs from a shell (trainctl.h). */
#include "trainctl.h"

#include <curl/curl.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

volatile sig_atomic_t tc_interrupted;

static const char MAIN_HELP[] =
    "Usage: trainctl [--url URL] [--token TOKEN | --token-file FILE] [--cacert FILE]\n"
    "                COMMAND [ARGS]\n"
    "\n"
    "The command-line client of traind, the distributed training service: submit jobs, follow\n"
    "them live, read their logs and metrics, download their checkpoints, manage the nodes.\n"
    "\n"
    "Commands:\n"
    "  submit SPEC|-      submit a job spec (a file, or - for stdin); --follow to watch it\n"
    "  ls                 list jobs, newest first\n"
    "  show ID            a job's state, attempts, placement and latest metrics\n"
    "  follow ID          follow a job to its end with a live progress line\n"
    "  logs ID            a rank's log (--rank R, -f to follow)\n"
    "  cancel ID          stop a job\n"
    "  metrics ID         a job's metrics as a table, --csv or --json\n"
    "  download ID        download a checkpoint's file (resumes a partial one)\n"
    "  tensorboard ID     download the job's TensorBoard event files (a tar archive)\n"
    "  delete ID          remove a finished job and its files\n"
    "  exp COMMAND        experiments, hyperparameter searches whose trials are jobs:\n"
    "                     exp create FILE, ls, show ID, best ID, cancel ID, rm ID\n"
    "  nodes              the cluster's nodes, their slots and GPUs\n"
    "  drain NODE         stop placing jobs on a node (running ones finish)\n"
    "  undrain NODE       place jobs on it again\n"
    "  version            trainctl's version and the server's\n"
    "\n"
    "Options:\n"
    "  --url URL          the traind API (default: $TRAIND_URL, else \"url\" in the client\n"
    "                     config file, else http://127.0.0.1:8470)\n"
    "  --token TOKEN      the API token (default: $TRAIND_TOKEN, else \"token\" or\n"
    "                     \"token_file\" in the client config file, else the local\n"
    "                     daemon's token file: ~/.local/state/traind/token or\n"
    "                     /var/lib/traind/token, when readable)\n"
    "  --token-file FILE  read the token from FILE's first line\n"
    "  --cacert FILE      for an https:// URL: the CA certificates (PEM) the daemon's\n"
    "                     certificate must chain to (default: $TRAIND_CACERT, else\n"
    "                     \"cacert\" in the client config file, else the system's)\n"
    "  -h, --help         this help; COMMAND --help for a command's\n"
    "  --version          trainctl's version\n"
    "\n"
    "The client config file is $XDG_CONFIG_HOME/traind/client.json (or\n"
    "~/.config/traind/client.json): {\"url\": \"https://gpu1:8470\", \"token_file\": \"/path\",\n"
    "\"cacert\": \"/path/ca.pem\"}.\n"
    "\n"
    "Exit status: 0 a followed job succeeded (or the command did its work), 1 it failed,\n"
    "2 it was cancelled, 3 the server could not be reached or refused, or bad usage;\n"
    "130 when Ctrl-C stopped following (the job goes on).\n";

typedef struct command {
    const char *name;
    int (*run)(const tc_conn *c, int argc, char **argv);
    const char *help;
} command;

static const command COMMANDS[] = {
    {"submit", tc_cmd_submit,
     "Usage: trainctl submit SPEC|- [--name NAME] [--nproc N] [--nnodes N]\n"
     "                       [--set PATH=VALUE]... [--follow] [--json] [--cancel-on-interrupt]\n"
     "\n"
     "Submits the job spec in SPEC (a JSON file; - reads stdin) and prints\n"
     "\"job ID submitted: NAME, STATE\" (with --quiet, the id alone).\n"
     "  --name NAME          the job's name\n"
     "  --nproc N            processes per node (resources.nproc, or nproc_per_node across\n"
     "                       nodes)\n"
     "  --nnodes N           nodes (resources.nnodes)\n"
     "  --set PATH=VALUE     set any field of the spec by its JSON path, e.g.\n"
     "                       --set train.optimizer.lr=0.01 --set data.train.files[0]=a.npy;\n"
     "                       VALUE is JSON when it parses as JSON, else a string (repeatable)\n"
     "  --follow             then follow it as `trainctl follow` does (exit status: its end)\n"
     "  --json               print the job (or, with --follow, its events) as JSON\n"
     "  -q, --quiet          print the job's id alone, as id=$(trainctl submit -q SPEC) wants\n"
     "  --cancel-on-interrupt  with --follow: Ctrl-C cancels the job\n"},
    {"ls", tc_cmd_ls,
     "Usage: trainctl ls [--state STATE[,STATE...]] [--limit N] [--json]\n"
     "\n"
     "Lists jobs, newest first (50 unless --limit), as a table: id, name, state, kind,\n"
     "nodes x processes, latest step, loss and val_acc, and when it was submitted.\n"
     "  --state STATE   only jobs in these states: queued, running, restarting, succeeded,\n"
     "                  failed, cancelled\n"},
    {"show", tc_cmd_show,
     "Usage: trainctl show ID [--json]\n"
     "\n"
     "A job: state and reason, attempts, placement across nodes, latest metrics, checkpoints.\n"},
    {"follow", tc_cmd_follow,
     "Usage: trainctl follow ID [--json] [--cancel-on-interrupt]\n"
     "\n"
     "Follows a job to its end. On a terminal: one progress line updated in place (epoch, step\n"
     "of total, a bar, loss, latest val_acc, samples/s, elapsed and ETA), with evaluations,\n"
     "checkpoints, restarts, placement and the final state printed above it. Not on a\n"
     "terminal, or with --json: one JSON object per event ({\"id\", \"event\", \"data\"}).\n"
     "A dropped connection is resumed from the last event seen (nothing missed or repeated).\n"
     "Ctrl-C stops following and leaves the job running, unless --cancel-on-interrupt.\n"
     "Exit status: 0 succeeded, 1 failed, 2 cancelled, 3 unreachable; 130 after Ctrl-C.\n"},
    {"logs", tc_cmd_logs,
     "Usage: trainctl logs ID [--rank R] [-f|--follow]\n"
     "\n"
     "Prints rank R's log (default 0; any rank, on any node); -f follows it until the job\n"
     "ends.\n"},
    {"cancel", tc_cmd_cancel,
     "Usage: trainctl cancel ID [--json]\n"
     "\n"
     "Stops a job (SIGTERM, SIGKILL after the daemon's grace period) on every node; returns\n"
     "when none of its processes is left.\n"},
    {"metrics", tc_cmd_metrics,
     "Usage: trainctl metrics ID [--csv | --json]\n"
     "\n"
     "A job's metric events (train, eval, done, a command's own) as a table, as CSV (one\n"
     "column per field, for spreadsheets) or as the API's JSON.\n"},
    {"download", tc_cmd_download,
     "Usage: trainctl download ID [--step S] [--file NAME] [-o FILE]\n"
     "\n"
     "Downloads a file of a checkpoint: the latest on disk unless --step, its weights\n"
     "(model.safetensors) unless --file, to jobID-stepS-NAME unless -o. A partial FILE is\n"
     "resumed where it stopped (HTTP Range); the size is checked at the end. A progress bar\n"
     "on a terminal.\n"},
    {"tensorboard", tc_cmd_tensorboard,
     "Usage: trainctl tensorboard ID [-o FILE]\n"
     "\n"
     "Downloads the job's TensorBoard event files as a tar archive (to job-ID-tensorboard.tar\n"
     "unless -o), for tensorboard --logdir once unpacked; of a running job, a snapshot.\n"},
    {"delete", tc_cmd_delete,
     "Usage: trainctl delete ID\n"
     "\n"
     "Removes a finished job with its records, metrics, logs and checkpoints (those in a\n"
     "checkpoint.dir of its own elsewhere stay); a job not finished is refused.\n"},
    {"exp", tc_cmd_exp,
     "Usage: trainctl exp COMMAND [ARGS]\n"
     "\n"
     "Experiments: hyperparameter searches whose trials are jobs (api/README.md,\n"
     "\"Experiments\"). Commands:\n"
     "  create FILE|-      create one from a JSON file; --follow to watch its trials\n"
     "  ls                 list experiments, newest first\n"
     "  show ID            an experiment and its trials, best first\n"
     "  best ID            its best trial; --download [DIR] its checkpoint's archive\n"
     "  cancel ID          stop making trials and stop the unfinished ones\n"
     "  rm ID              remove an ended experiment with its trials' jobs\n"
     "trainctl exp COMMAND --help gives each one's options.\n"},
    {"exp create", tc_cmd_exp_create,
     "Usage: trainctl exp create FILE|- [--follow] [--json] [-q]\n"
     "\n"
     "Creates the experiment in FILE (JSON: name, job, space, searcher, max_concurrent, seed,\n"
     "priority; - reads stdin) and prints \"experiment ID created: ...\".\n"
     "  --follow      then follow it to its end: on a terminal a table of its trials (trial,\n"
     "                job, state, steps, best metric, hyperparameters), best first, redrawn\n"
     "                every second; elsewhere a line for each trial that changes state and\n"
     "                the table at the end; then the best trial. Ctrl-C stops following (the\n"
     "                experiment goes on). Exit status: 0 it succeeded, 1 it failed, 2 it was\n"
     "                cancelled, 3 unreachable; 130 after Ctrl-C.\n"
     "  --json        print the experiment as JSON (with --follow: as it ended)\n"
     "  -q, --quiet   print its id alone\n"},
    {"exp ls", tc_cmd_exp_ls,
     "Usage: trainctl exp ls [--json]\n"
     "\n"
     "Lists experiments, newest first: id, name, state, searcher, trials ended of all,\n"
     "trials running, the metric and its mode, the best value (and its trial), created.\n"},
    {"exp show", tc_cmd_exp_show,
     "Usage: trainctl exp show ID [--json]\n"
     "\n"
     "An experiment: state and reason, owner, times, its trials by state, its limits, the\n"
     "space, the best trial; then every trial (job, state, steps, best metric,\n"
     "hyperparameters), best first.\n"},
    {"exp best", tc_cmd_exp_best,
     "Usage: trainctl exp best ID [--download [DIR]] [--json]\n"
     "\n"
     "The best trial: its number, job, metric value and step, hyperparameters (as JSON) and\n"
     "checkpoint (the one at the step of its best value, else the last before, else the\n"
     "first after).\n"
     "  --download [DIR]  download that checkpoint as a tar archive to\n"
     "                    DIR/exp-ID-best-step-S.tar (DIR: . unless given; made if missing)\n"},
    {"exp cancel", tc_cmd_exp_act,
     "Usage: trainctl exp cancel ID [--json]\n"
     "\n"
     "Stops making trials and stops the unfinished ones; the experiment ends cancelled once\n"
     "they have. An experiment that has ended is refused.\n"},
    {"exp pause", tc_cmd_exp_act,
     "Usage: trainctl exp pause ID [--json]\n"
     "\n"
     "Pauses an experiment: no trial is made or promoted, its queued trials are paused and its\n"
     "running ones stopped and paused, each to go on from its latest checkpoint (the steps\n"
     "after it are trained again). Paused trials hold no slot. Kept across restarts.\n"},
    {"exp resume", tc_cmd_exp_act,
     "Usage: trainctl exp resume ID [--json]\n"
     "\n"
     "Resumes a paused experiment: its paused trials go on first, then its searcher.\n"},
    {"exp rm", tc_cmd_exp_rm,
     "Usage: trainctl exp rm ID\n"
     "\n"
     "Removes an ended experiment with its trials' jobs and their files; a running one is\n"
     "refused (trainctl exp cancel ID first).\n"},
    {"nodes", tc_cmd_nodes,
     "Usage: trainctl nodes [--json]\n"
     "\n"
     "The cluster's nodes: name, role, state (ready, draining, lost), address, slots used of\n"
     "total, the last heartbeat and the GPUs (CUDA ordinal, name, memory).\n"},
    {"drain", tc_cmd_drain,
     "Usage: trainctl drain NODE [--json]\n"
     "\n"
     "Stops placing new jobs on NODE; jobs running there finish. Kept across restarts.\n"},
    {"undrain", tc_cmd_drain,
     "Usage: trainctl undrain NODE [--json]\n"
     "\n"
     "Places jobs on a drained NODE again.\n"},
    {"version", tc_cmd_version,
     "Usage: trainctl version [--json]\n"
     "\n"
     "trainctl's version, and the version of the traind it talks to.\n"},
};
enum { N_COMMANDS = sizeof COMMANDS / sizeof COMMANDS[0] };

int tc_error(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    fflush(stdout);
    fprintf(stderr, "trainctl: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n");
    va_end(ap);
    return TC_EXIT_ERROR;
}

int tc_usage(const char *name, bool error) {
    FILE *out = error ? stderr : stdout;
    const char *help = MAIN_HELP;
    for (int i = 0; name && i < N_COMMANDS; i++)
        if (strcmp(COMMANDS[i].name, name) == 0) help = COMMANDS[i].help;
    fputs(help, out);
    return error ? TC_EXIT_ERROR : 0;
}

long tc_job_id(const char *text) {
    char *end;
    errno = 0;
    long id = strtol(text, &end, 10);
    if (errno || end == text || *end || id < 1) {
        tc_error("\"%s\": expected a job id (a positive integer, as trainctl ls shows)", text);
        return -1;
    }
    return id;
}

static void on_signal(int sig) {
    (void)sig;
    tc_interrupted = 1;
}

int main(int argc, char **argv) {
    tc_options o = {0};
    int i = 1;
    for (; i < argc && argv[i][0] == '-'; i++) {
        const char *a = argv[i];
        const char **slot = !strcmp(a, "--url")          ? &o.url
                            : !strcmp(a, "--token")      ? &o.token
                            : !strcmp(a, "--token-file") ? &o.token_file
                            : !strcmp(a, "--cacert")     ? &o.cacert
                                                         : NULL;
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) return tc_usage(NULL, false);
        if (!strcmp(a, "--help-all")) { /* every help text at once: the man page's source */
            fputs(MAIN_HELP, stdout);
            for (int k = 0; k < N_COMMANDS; k++) printf("\n%s", COMMANDS[k].help);
            return 0;
        }
        if (!strcmp(a, "--version")) {
            printf("trainctl %s\n", TC_VERSION);
            return 0;
        }
        if (!slot) {
            tc_error("unknown option %s", a);
            return tc_usage(NULL, true);
        }
        if (i + 1 >= argc) return tc_error("%s needs a value", a);
        *slot = argv[++i];
    }
    if (i >= argc) {
        tc_error("no command given");
        return tc_usage(NULL, true);
    }
    const command *cmd = NULL;
    for (int k = 0; k < N_COMMANDS; k++)
        if (strcmp(COMMANDS[k].name, argv[i]) == 0) cmd = &COMMANDS[k];
    if (!cmd) {
        tc_error("unknown command \"%s\"", argv[i]);
        return tc_usage(NULL, true);
    }
    /* a command of a group ("exp create"): its own entry, named by both words, which is then
     * its argv[0] (what its messages and --help name) */
    char both[96];
    snprintf(both, sizeof both, "%s %s", argv[i], i + 1 < argc ? argv[i + 1] : "");
    for (int k = 0; k < N_COMMANDS && i + 1 < argc; k++)
        if (strcmp(COMMANDS[k].name, both) == 0) {
            cmd = &COMMANDS[k];
            argv[++i] = (char *)cmd->name;
            break;
        }
    tc_conn c;
    char err[1200];
    if (tc_config_resolve(&c, &o, err, sizeof err) != 0) return tc_error("%s", err);
    /* Ctrl-C ends what is under way (a follow, a download) through a flag libcurl's progress
     * callback reads, so the command can say what state it leaves behind */
    struct sigaction sa = {.sa_handler = on_signal};
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    signal(SIGPIPE, SIG_IGN);
    if (curl_global_init(CURL_GLOBAL_DEFAULT) != 0) return tc_error("cannot initialise libcurl");
    int rc = cmd->run(&c, argc - i, argv + i);
    curl_global_cleanup();
    return rc;
}
