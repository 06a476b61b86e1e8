/* Feeds: a config file (/etc/traind/traind.json's JSON) to the daemon's option loader
 * (programs/daemon_config.c, compiled into this harness), through its public entry point
 * daemon_config_reload with "--config FILE", as SIGHUP reads it. Why: the file is edited by hand
 * and read again on every reload of a running daemon, which must refuse a bad one with a message
 * rather than crash or half-apply it. Each input is written to one file in the scratch
 * directory. What a load accepts is printed (--print-config) and compared with the defaults, as
 * a reload does. (A setting may differ from its default without the file naming it: a default
 * derived from another setting, as a path under state_dir.) */
#include "fuzz_util.h"

#include "daemon_config.h"

#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static char path[PATH_MAX];
static FILE *sink;
static daemon_options defaults; /* no file: what the comparisons start from */

static void setup(void) {
    fuzz_path(path, sizeof path, "traind.json");
    sink = fopen("/dev/null", "w");
    char none[] = "traind", flag[] = "--config", empty[] = "", why[1024];
    char *argv[] = {none, flag, empty, NULL};
    daemon_options now = {0};
    if (!sink || daemon_config_reload(&defaults, &now, 3, argv, why, sizeof why) != 0) {
        fprintf(stderr, "fuzz_daemon_config: the defaults do not load: %s\n", why);
        exit(1);
    }
}

static bool terminated(const char *s, size_t n) {
    return memchr(s, 0, n) != NULL;
}

static void check_accepted(const daemon_options *o) {
    FUZZ_CHECK(o->n_data_roots >= 0 && o->n_data_roots <= DAEMON_MAX_ROOTS, "%d roots",
               o->n_data_roots);
    FUZZ_CHECK(o->n_gpus >= 0 && o->n_gpus <= TD_GPUS_MAX, "%d GPUs", o->n_gpus);
    FUZZ_CHECK(o->slots >= 0 && o->slots <= 4096, "slots %d", o->slots);
    FUZZ_CHECK(o->max_body_bytes >= 1, "max_body_bytes %ld", o->max_body_bytes);
    FUZZ_CHECK(o->grace_s >= 0 && o->grace_s <= 3600, "grace %g", o->grace_s);
    FUZZ_CHECK(o->heartbeat_s > 0 && o->heartbeat_s * 2 <= o->node_timeout_s,
               "heartbeat %g timeout %g", o->heartbeat_s, o->node_timeout_s);
    FUZZ_CHECK(o->orphan_timeout_s >= 1, "orphan timeout %g", o->orphan_timeout_s);
    FUZZ_CHECK(o->listen[0] && o->state_dir[0] && o->worker[0] && o->shepherd[0],
               "an empty required setting");
    FUZZ_CHECK(!strcmp(o->log_format, "text") || !strcmp(o->log_format, "json"), "log_format %s",
               o->log_format);
    FUZZ_CHECK(terminated(o->listen, sizeof o->listen) &&
                   terminated(o->node_name, sizeof o->node_name) &&
                   terminated(o->advertise, sizeof o->advertise) &&
                   terminated(o->metrics_listen, sizeof o->metrics_listen),
               "unterminated text");
    for (int i = 0; i < o->n_data_roots; i++)
        FUZZ_CHECK(o->data_roots[i][0], "data root %d is empty", i);
    for (int i = 0; i < o->n_gpus; i++) {
        FUZZ_CHECK(o->gpus[i].index >= 0, "GPU %d has ordinal %d", i, o->gpus[i].index);
        for (int k = 0; k < i; k++)
            FUZZ_CHECK(o->gpus[k].index != o->gpus[i].index, "GPU %d listed twice",
                       o->gpus[i].index);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!sink) setup();
    fuzz_write_file(path, data, size);
    char none[] = "traind", flag[] = "--config", why[1024] = "";
    char *argv[] = {none, flag, path, NULL};
    daemon_options next;
    if (daemon_config_reload(&next, &defaults, 3, argv, why, sizeof why) != 0) {
        FUZZ_CHECK(why[0], "a refusal without a message");
        return 0;
    }
    check_accepted(&next);
    daemon_config_print(&next, sink);
    for (int i = 0; i < OPT_COUNT; i++) {
        (void)daemon_config_changed(&defaults, &next, (daemon_option)i); /* as a reload asks */
        char *v = daemon_config_value(&next, (daemon_option)i);
        FUZZ_CHECK(v && v[0], "no value text for %s", daemon_config_key((daemon_option)i));
        free(v);
    }
    return 0;
}
