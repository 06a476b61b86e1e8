/* What every subcommand shares (trainctl.h): its options, parsed from one table of names, and
 * how it prints the API's JSON. */
#include "trainctl.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* argv[*i] is --name (value in the next argument) or --name=value: the value, else NULL. Sets
 * *bad when the value is missing. */
static const char *value_of(int argc, char **argv, int *i, const char *name, bool *bad) {
    size_t n = strlen(name);
    const char *a = argv[*i];
    if (strncmp(a, name, n) != 0) return NULL;
    if (a[n] == '=') return a + n + 1;
    if (a[n] != 0) return NULL;
    if (*i + 1 >= argc) {
        *bad = true;
        tc_error("%s needs a value", name);
        return NULL;
    }
    return argv[++*i];
}

static bool long_arg(const char *text, long min, long max, long *out) {
    char *end;
    errno = 0;
    long v = strtol(text, &end, 10);
    if (errno || end == text || *end || v < min || v > max) return false;
    *out = v;
    return true;
}

/* Parses what every subcommand may take; allowed lists the option names the command accepts.
 * Returns 0, or an exit status after a message. */
int tc_parse(int argc, char **argv, const char *allowed, int max_pos, tc_args *a) {
    *a = (tc_args){.nproc = -1, .nnodes = -1, .limit = -1, .rank = 0, .step = -1};
    for (int i = 1; i < argc; i++) {
        const char *s = argv[i], *v;
        bool bad = false;
        char opt[64];
        snprintf(opt, sizeof opt, "%.*s", (int)strcspn(s, "="), s);
        if (strcmp(s, "-h") == 0 || strcmp(s, "--help") == 0) {
            a->help = true;
            continue;
        }
        if (s[0] == '-' && s[1] != 0) {
            char key[70];
            snprintf(key, sizeof key, " %s ",
                     strcmp(opt, "-f") == 0   ? "--follow"
                     : strcmp(opt, "-o") == 0 ? "--output"
                     : strcmp(opt, "-q") == 0 ? "--quiet"
                                              : opt);
            if (!strstr(allowed, key)) {
                tc_error("%s: unknown option %s", argv[0], opt);
                return tc_usage(argv[0], true);
            }
        }
        if (strcmp(s, "--json") == 0)
            a->json = true;
        else if (strcmp(s, "--csv") == 0)
            a->csv = true;
        else if (strcmp(s, "--follow") == 0 || strcmp(s, "-f") == 0)
            a->follow = true;
        else if (strcmp(s, "--cancel-on-interrupt") == 0)
            a->cancel_on_interrupt = true;
        else if (strcmp(s, "--quiet") == 0 || strcmp(s, "-q") == 0)
            a->quiet = true;
        else if (strcmp(s, "--download") == 0) /* its DIR, if any, is a positional argument */
            a->download = true;
        else if (strncmp(s, "--download=", 11) == 0) {
            a->download = true;
            a->dir = s + 11;
        } else if ((v = value_of(argc, argv, &i, "--name", &bad)))
            a->name = v;
        else if ((v = value_of(argc, argv, &i, "--state", &bad)))
            a->state = v;
        else if ((v = value_of(argc, argv, &i, "--output", &bad)) ||
                 (v = value_of(argc, argv, &i, "-o", &bad)))
            a->out = v;
        else if ((v = value_of(argc, argv, &i, "--file", &bad)))
            a->file = v;
        else if ((v = value_of(argc, argv, &i, "--set", &bad))) {
            if (a->n_sets == 64) return tc_error("at most 64 --set");
            a->sets[a->n_sets++] = v;
        } else if ((v = value_of(argc, argv, &i, "--nproc", &bad))) {
            if (!long_arg(v, 1, 4096, &a->nproc))
                return tc_error("--nproc \"%s\": expected an integer in [1, 4096]", v);
        } else if ((v = value_of(argc, argv, &i, "--nnodes", &bad))) {
            if (!long_arg(v, 1, 4096, &a->nnodes))
                return tc_error("--nnodes \"%s\": expected an integer in [1, 4096]", v);
        } else if ((v = value_of(argc, argv, &i, "--limit", &bad))) {
            if (!long_arg(v, 1, 500, &a->limit))
                return tc_error("--limit \"%s\": expected an integer in [1, 500]", v);
        } else if ((v = value_of(argc, argv, &i, "--rank", &bad))) {
            if (!long_arg(v, 0, 1 << 20, &a->rank))
                return tc_error("--rank \"%s\": expected a rank (0, 1, ...)", v);
        } else if ((v = value_of(argc, argv, &i, "--step", &bad))) {
            if (!long_arg(v, 0, 1L << 40, &a->step))
                return tc_error("--step \"%s\": expected a step (an integer >= 0)", v);
        } else if (bad) {
            return TC_EXIT_ERROR;
        } else if (s[0] == '-' && s[1] != 0) {
            return tc_error("%s: unknown option %s", argv[0], s);
        } else if (a->n_pos < max_pos) {
            a->pos[a->n_pos++] = s;
        } else {
            tc_error("%s: unexpected argument \"%s\"", argv[0], s);
            return tc_usage(argv[0], true);
        }
    }
    if (a->help) {
        tc_usage(argv[0], false);
        return -1; /* (exit 0) */
    }
    return 0;
}

void tc_print_json(json_t *o) {
    /* 15 digits: a number the daemon sent (at most 10) prints as it came, not as the 17 digits
     * that spell its double exactly (2.26932275, not 2.2693227500000002) */
    char *text = json_dumps(o, JSON_INDENT(2) | JSON_REAL_PRECISION(15));
    if (text) printf("%s\n", text);
    free(text);
}

const char *tc_str(json_t *o, const char *key, const char *def) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : def;
}

/* ---- submit -----------------------------------------------------------------------------------
 */
