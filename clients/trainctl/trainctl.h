/* trainctl: the command-line client of traind's API v1 (api/README.md). One module: where the
 * server and token come from (tc_config.c), requests and downloads (tc_http.c), the job's event
 * stream with its reconnection (tc_events.c), how a followed job is shown (tc_follow.c), the
 * subcommands (tc_commands.c, tc_files.c, tc_main.c) and the experiments' (tc_experiments.c).
 * Everything but the subcommands' output goes through these; nothing is global but the
 * interrupt flag a signal handler sets. */
#ifndef TRAINCTL_H
#define TRAINCTL_H

#include <curl/curl.h>
#include <jansson.h>
#include <signal.h>
#include <stdbool.h>
#include <stddef.h>

#define TC_VERSION "0.1.0"

/* Exit statuses: what a followed job ended as, or that trainctl could not do its work. */
enum { TC_EXIT_OK = 0, TC_EXIT_FAILED = 1, TC_EXIT_CANCELLED = 2, TC_EXIT_ERROR = 3 };

/* ---- tc_config.c: which server, with which token ---- */
typedef struct tc_conn {
    char url[512];          /* http://HOST:PORT, no trailing slash */
    char token[256];        /* "": none found */
    char token_from[2048];  /* where the token came from, or every place looked at */
    char config_path[1024]; /* the client config file looked at */
    char cacert[1024];      /* CA certificates (PEM) for an https:// URL; "": the system's */
} tc_conn;

typedef struct tc_options {
    const char *url, *token, *token_file, *cacert; /* from the command line, or NULL */
} tc_options;

/* The server and token: --url / TRAIND_URL, --token / TRAIND_TOKEN / --token-file, then the
 * client config file ($XDG_CONFIG_HOME/traind/client.json or ~/.config/traind/client.json:
 * {"url", "token" | "token_file", "cacert"}), then the local daemon's default address and its
 * token file
 * when readable. 0, or -1 with the reason in err (a malformed config file). */
int tc_config_resolve(tc_conn *c, const tc_options *o, char *err, size_t len);

/* ---- tc_http.c ---- */
typedef struct tc_reply {
    long status; /* 0: no answer (err says why) */
    char *body;  /* NUL-terminated; NULL when none */
    size_t len;
} tc_reply;

/* METHOD url+path with the token (body: JSON or NULL). Returns the status, 0 when no answer
 * came (why in err). */
long tc_request(const tc_conn *c, const char *method, const char *path, const char *body,
                tc_reply *r, char *err, size_t len);
void tc_reply_free(tc_reply *r);
/* A libcurl handle for url+path with the token (its header in *hdr, which the caller sets and
 * frees), errors into why (CURL_ERROR_SIZE); NULL when libcurl cannot make one. */
CURL *tc_handle(const tc_conn *c, const char *path, struct curl_slist **hdr, char *why);
/* A libcurl write callback that appends to the tc_reply ctx's body. */
size_t tc_collect(char *p, size_t size, size_t n, void *ctx);
/* The reply as JSON, or NULL. */
json_t *tc_reply_json(const tc_reply *r);
/* "trainctl: " and what went wrong: the API's error message (with its field), or the status,
 * or why no answer came; with a hint for a missing or refused token. Returns TC_EXIT_ERROR. */
int tc_fail_reply(const tc_conn *c, const tc_reply *r, const char *err);
/* GET path and parse it: the JSON, or NULL after tc_fail_reply. */
json_t *tc_get_json(const tc_conn *c, const char *path);
/* Streams GET url+path to out as it arrives (logs); stops when *stop is set. */
int tc_stream(const tc_conn *c, const char *path, FILE *out, volatile sig_atomic_t *stop);
/* Downloads url+path to file, resuming a partial file with Range; size: what the whole is (-1:
 * unknown). A progress bar on stderr when progress. Returns an exit status. */
int tc_download(const tc_conn *c, const char *path, const char *file, long long size, bool progress,
                volatile sig_atomic_t *stop);

/* ---- tc_events.c: a job's Server-Sent Events ---- */
/* Called for each event; returns true to stop (the job reached a final state). */
typedef bool (*tc_event_fn)(void *ctx, long id, const char *event, const char *data);
/* Follows job's events from after *last_id (-1: from the start), reconnecting with
 * Last-Event-ID when the stream drops until fn says stop: nothing is missed or seen twice.
 * notice(ctx, text) is told of lost and regained connections. Returns 0 when fn stopped it, 1
 * when *stop was set, TC_EXIT_ERROR when the server stayed unreachable for give_up_s or refused
 * (printed). */
typedef void (*tc_notice_fn)(void *ctx, const char *text);
int tc_events_follow(const tc_conn *c, long job, long *last_id, tc_event_fn fn, tc_notice_fn notice,
                     void *ctx, volatile sig_atomic_t *stop, double give_up_s);

/* "rank 3" or "ranks 0-3" for a placement's array of ranks (tc_follow.c). */
void tc_rank_range(json_t *ranks, char *out, size_t len);

/* ---- tc_follow.c: a followed job on screen ---- */
typedef struct tc_follow_options {
    bool json;                /* one JSON event per line, not the progress line */
    bool cancel_on_interrupt; /* Ctrl-C cancels the job */
} tc_follow_options;
/* Follows job to its end: on a terminal one progress line updated in place with events above
 * it; else (or with json) one JSON object per event. The job's final state as an exit status;
 * 130 after Ctrl-C (or the cancelled status with cancel_on_interrupt). */
int tc_follow(const tc_conn *c, long job, const tc_follow_options *o);

/* ---- tc_args.c: what the subcommands share ---- */
/* The options any subcommand may take (each says which, in parse's `allowed`). */
typedef struct tc_args {
    const char *pos[4]; /* positional arguments (ID, NODE) */
    int n_pos;
    bool json, csv, follow, cancel_on_interrupt, help, quiet;
    bool download; /* --download[=DIR] (exp best) */
    const char *name, *state, *out, *file, *dir;
    long nproc, nnodes, limit, rank, step;
    const char *sets[64];
    int n_sets;
} tc_args;
/* Parses argv; allowed lists the option names the command accepts (" --json --follow ").
 * 0, -1 after --help (exit 0), or an exit status after a message. */
int tc_parse(int argc, char **argv, const char *allowed, int max_pos, tc_args *a);
#define TC_PARSE(allowed, max_pos, want_pos)                                                       \
    tc_args a;                                                                                     \
    int parsed_ = tc_parse(argc, argv, allowed, max_pos, &a);                                      \
    if (parsed_ == -1) return 0;                                                                   \
    if (parsed_ != 0) return parsed_;                                                              \
    if (a.n_pos < (want_pos)) {                                                                    \
        tc_error("%s: missing argument", argv[0]);                                                 \
        return tc_usage(argv[0], true);                                                            \
    }
/* The API's JSON as it prints for scripts (--json). */
void tc_print_json(json_t *o);
/* A string member of o, or def. */
const char *tc_str(json_t *o, const char *key, const char *def);

/* ---- tc_commands.c: the subcommands; argv[0] is the subcommand ---- */
int tc_cmd_submit(const tc_conn *c, int argc, char **argv);
int tc_cmd_ls(const tc_conn *c, int argc, char **argv);
int tc_cmd_show(const tc_conn *c, int argc, char **argv);
int tc_cmd_follow(const tc_conn *c, int argc, char **argv);
int tc_cmd_logs(const tc_conn *c, int argc, char **argv);
int tc_cmd_cancel(const tc_conn *c, int argc, char **argv);
int tc_cmd_metrics(const tc_conn *c, int argc, char **argv);
int tc_cmd_download(const tc_conn *c, int argc, char **argv);
int tc_cmd_nodes(const tc_conn *c, int argc, char **argv);
int tc_cmd_drain(const tc_conn *c, int argc, char **argv); /* drain and undrain */
int tc_cmd_version(const tc_conn *c, int argc, char **argv);
/* ---- tc_files.c ---- */
int tc_cmd_tensorboard(const tc_conn *c, int argc, char **argv);
int tc_cmd_delete(const tc_conn *c, int argc, char **argv);
/* ---- tc_experiments.c: `trainctl exp COMMAND`; argv[0] is "exp COMMAND" (tc_main.c) ---- */
int tc_cmd_exp(const tc_conn *c, int argc, char **argv); /* exp alone, or an unknown command */
int tc_cmd_exp_create(const tc_conn *c, int argc, char **argv);
int tc_cmd_exp_ls(const tc_conn *c, int argc, char **argv);
int tc_cmd_exp_show(const tc_conn *c, int argc, char **argv);
int tc_cmd_exp_act(const tc_conn *c, int argc, char **argv); /* cancel, pause, resume */
int tc_cmd_exp_rm(const tc_conn *c, int argc, char **argv);
int tc_cmd_exp_best(const tc_conn *c, int argc, char **argv);
/* An experiment on screen (tc_exp_view.c): a member as a number (0 when absent), the counts of
 * its trials in words, its best trial's lines, all its trials as a table, and --follow: the
 * table redrawn until it ends (its exit status: 0 succeeded, 1 failed, 2 cancelled). */
long long tc_exp_int(json_t *o, const char *key);
double tc_exp_num(json_t *o, const char *key);
void tc_exp_counts_text(json_t *x, char *text, size_t len);
void tc_exp_best_lines(json_t *x);
void tc_exp_trials_table(json_t *x);
int tc_exp_follow(const tc_conn *c, long id, bool json);

/* ---- tc_main.c ---- */
extern volatile sig_atomic_t tc_interrupted; /* set by SIGINT/SIGTERM */
/* Prints the subcommand's help (stdout) and returns 0, or to stderr with a usage error and
 * returns TC_EXIT_ERROR. */
int tc_usage(const char *command, bool error);
/* "trainctl: " + message on stderr; returns TC_EXIT_ERROR. */
int tc_error(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
/* A job id argument, or -1 after an error message. */
long tc_job_id(const char *text);

#endif
