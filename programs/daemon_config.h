/* traind's settings, from one table (daemon_settings.def): each row gives a setting's field, its
 * command-line flag, its config-file key, its default and help, so none of them can drift apart.
 * The command line wins over the file, the file over the defaults; every setting remembers where it
 * came from (traind --print-config shows it), and a reload (SIGHUP) re-reads the file and says
 * which changes it applied and which need a restart. */
#ifndef DAEMON_CONFIG_H
#define DAEMON_CONFIG_H

#include "service/run/td_gpus.h"

#include <limits.h>
#include <stdbool.h>
#include <stdio.h>

#define DAEMON_CONFIG_DEFAULT "/etc/traind/traind.json"
#define DAEMON_MAX_ROOTS      16

/* Where a setting's value came from. */
typedef enum { DAEMON_FROM_DEFAULT, DAEMON_FROM_FILE, DAEMON_FROM_ARGS } daemon_source;

/* The settings' indexes into daemon_options.from[] (and the table, daemon_settings.def). */
typedef enum {
#define SECTION(title, intro)
#define SETTING(id, ...) OPT_##id,
#include "daemon_settings.def"
#undef SETTING
#undef SECTION
    OPT_COUNT
} daemon_option;

/* What a reload does with a changed setting: nothing until a restart, or hand it to one part of
 * the running daemon (daemon_main.c applies each). */
typedef enum {
    DAEMON_RESTART,
    DAEMON_APPLY_API,       /* the request body's limit */
    DAEMON_APPLY_LOG,       /* the log's format and level */
    DAEMON_APPLY_JOBS,      /* data roots, grace, the programs command jobs may run */
    DAEMON_APPLY_STOP,      /* what a stopping daemon does with its jobs */
    DAEMON_APPLY_RETENTION, /* how long finished jobs are kept */
    DAEMON_APPLY_TOKENS,    /* each token's limits */
    DAEMON_APPLY_COUNT
} daemon_apply;

typedef struct daemon_options {
    /* one field per setting, named as its config key */
#define SECTION(title, intro)
#define SETTING(id, key, ctype, dims, ...) ctype key dims;
#include "daemon_settings.def"
#undef SETTING
#undef SECTION
    int n_data_roots; /* data_roots' */
    int n_gpus;       /* gpus' declared; 0: every GPU the driver finds */

    /* not settings */
    daemon_source from[OPT_COUNT];
    char config_path[PATH_MAX]; /* the file read; "" when none */
    bool print_config;          /* --print-config: print the settings and exit */
} daemon_options;

/* The command line, then the config file (--config FILE, else DAEMON_CONFIG_DEFAULT when it
 * exists), then the defaults, into o. A bad option or file is a message on stderr naming the
 * option, or the file and key, and exit status 2; --help and --version print and exit 0. */
void daemon_config_load(daemon_options *o, int argc, char **argv);

/* traind --help's text, and the settings' reference in Markdown (docs/settings.md), both from
 * the table (daemon_usage.c). */
void daemon_config_usage(FILE *out);
void daemon_config_reference(FILE *out);

/* Every setting, its value and where it came from, one per line. */
void daemon_config_print(const daemon_options *o, FILE *out);

/* Reads the configuration again (the same command line, the file as it is now) into *next,
 * without exiting on an error: -1 with the message in why. */
int daemon_config_reload(daemon_options *next, const daemon_options *now, int argc, char **argv,
                         char *why, size_t len);

/* Whether option opt differs between a and b; its key ("data_roots") and whether a running
 * daemon can take the new value. */
bool daemon_config_changed(const daemon_options *a, const daemon_options *b, daemon_option opt);
const char *daemon_config_key(daemon_option opt);
daemon_apply daemon_config_reload_by(daemon_option opt);
/* The live settings of next (those a reload applies) into o, with where they came from. */
void daemon_config_take_live(daemon_options *o, const daemon_options *next);
/* opt's value as JSON text ("\"127.0.0.1:8470\"", 10, ["/data"]), allocated (free it). */
char *daemon_config_value(const daemon_options *o, daemon_option opt);
/* Where opt's value came from, for messages: "from the command line", the file, "the default". */
const char *daemon_config_source(const daemon_options *o, daemon_option opt);

#endif
