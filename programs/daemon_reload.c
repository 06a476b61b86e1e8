/* SIGHUP: the settings read again, each change said, and the live ones handed to the part of the
 * daemon that uses them (daemon_settings.def names the part of each). */
#define _GNU_SOURCE
#include "daemon_private.h"

#include "base/td_clock.h"

#include <stdlib.h>
#include <string.h>
#include <systemd/sd-daemon.h>

td_log_level daemon_log_level(const daemon_options *o) {
    td_log_level lv = TD_LOG_INFO;
    td_log_level_parse(o->log_level, &lv);
    return lv;
}

td_tokens_limits daemon_token_limits(const daemon_options *o) {
    return (td_tokens_limits){.requests_per_s = o->rate_limit_per_s,
                              .streams = (int)o->max_streams_per_token,
                              .queued = (int)o->max_queued_per_token,
                              .job_bytes = o->max_job_bytes_per_token,
                              .sessions = (int)o->max_sessions_per_token};
}

/* One part takes its settings' values from o (each setter takes its whole group at once). */
static void apply(daemon_apply part, const daemon_options *o, const daemon_running *r) {
    switch (part) {
    case DAEMON_APPLY_JOBS: {
        static char resolved[MAX_ROOTS + 1][PATH_MAX];
        const char *roots[MAX_ROOTS + 1];
        int n_roots = daemon_resolve_roots(o, r->state, r->log, resolved, roots);
        td_jobs_set_limits(r->jobs, roots, n_roots, o->grace_s);
        td_jobs_set_command_jobs(r->jobs, o->command_jobs);
        break;
    }
    case DAEMON_APPLY_STOP:
        td_jobs_set_stop_policy(r->jobs, o->keep_jobs_on_stop, o->orphan_timeout_s);
        break;
    case DAEMON_APPLY_API:
        td_api_set_max_body(r->api, (size_t)o->max_body_bytes);
        break;
    case DAEMON_APPLY_RETENTION:
        td_jobs_set_retention(r->jobs, o->keep_finished_for_s, o->keep_finished_jobs);
        break;
    case DAEMON_APPLY_TOKENS: {
        td_tokens_limits limits = daemon_token_limits(o);
        td_tokens_set_limits(r->tokens, &limits);
        break;
    }
    case DAEMON_APPLY_LOG:
        td_log_configure(r->log, strcmp(o->log_format, "json") == 0, daemon_log_level(o));
        break;
    case DAEMON_RESTART:
    case DAEMON_APPLY_COUNT:
        break;
    }
}

/* Says each change of next from o: applied now, or waiting for a restart; *applied and
 * *waiting count them. */
static void tell_changes(const daemon_options *o, const daemon_options *next, td_log *log,
                         int *applied, int *waiting) {
    for (int i = 0; i < OPT_COUNT; i++) {
        if (!daemon_config_changed(o, next, (daemon_option)i)) continue;
        char *was = daemon_config_value(o, (daemon_option)i);
        char *now = daemon_config_value(next, (daemon_option)i);
        daemon_apply part = daemon_config_reload_by((daemon_option)i);
        if (part != DAEMON_RESTART) {
            td_log_info(log, "reload: %s is now %s (was %s)", daemon_config_key(i), now, was);
            (*applied)++;
        } else {
            td_log_warn(log,
                        "reload: %s changed to %s, which needs a restart: it stays %s until then",
                        daemon_config_key(i), now, was);
            (*waiting)++;
        }
        free(was);
        free(now);
    }
}

/* SIGHUP: the configuration again. What a running daemon can take (data roots, grace, body
 * limit, logging, ...: daemon_settings.def says) changes now; any other change is named and
 * waits for a restart. */
void daemon_reload(daemon_options *o, int argc, char **argv, const daemon_running *r) {
    /* MONOTONIC_USEC: systemd (253 on) pairs it with the reload it asked for */
    sd_notifyf(0, "RELOADING=1\nSTATUS=reloading the configuration\nMONOTONIC_USEC=%llu",
               (unsigned long long)(td_clock_now() * 1e6));
    daemon_options *next = malloc(sizeof *next);
    char why[1024];
    if (!next) {
        td_log_error(r->log, "reload: out of memory; the configuration is unchanged");
    } else if (daemon_config_reload(next, o, argc, argv, why, sizeof why) != 0) {
        td_log_error(r->log, "reload failed, the configuration is unchanged: %s", why);
    } else {
        int applied = 0, waiting = 0;
        tell_changes(o, next, r->log, &applied, &waiting);
        /* the live ones into o; the others keep the values this daemon runs with */
        daemon_config_take_live(o, next);
        /* every part, changed or not (the data roots are resolved again: a link among them may
         * point elsewhere now), but the log's, which goes last: the summary is written in the
         * format and at the level it was asked in */
        for (int part = DAEMON_RESTART + 1; part < DAEMON_APPLY_COUNT; part++)
            if (part != DAEMON_APPLY_LOG) apply((daemon_apply)part, o, r);
        td_log_notice(r->log, "reloaded %s: %d change%s applied, %d waiting for a restart",
                      o->config_path[0] ? o->config_path : "(no config file)", applied,
                      applied == 1 ? "" : "s", waiting);
        apply(DAEMON_APPLY_LOG, o, r);
    }
    free(next);
    sd_notify(0, "READY=1\nSTATUS=serving");
}
