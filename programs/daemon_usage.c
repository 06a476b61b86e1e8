/* traind --help and the settings' reference (docs/settings.md), both written from the settings'
 * table (daemon_settings.def): a setting added there is in both, and neither can say a default
 * the daemon does not use. */
#include "daemon_config.h"

#include <ctype.h>
#include <string.h>

/* The sections, in order. */
static const struct {
    const char *title, *intro;
} SECTIONS[] = {
#define SECTION(title, intro) {title, intro},
#define SETTING(...)
#include "daemon_settings.def"
#undef SETTING
#undef SECTION
};

/* The settings, in order. */
static const struct {
    const char *key, *flag, *value, *def, *help, *kind;
    double min, max;
    daemon_apply reload;
} ROWS[] = {
#define SECTION(title, intro)
#define SETTING(id, key, ctype, dims, flag, value, kind, min, max, choices, reload, def, help)     \
    {#key, flag, value, def, help, #kind, min, max, DAEMON_##reload},
#include "daemon_settings.def"
#undef SETTING
#undef SECTION
};

/* Which section each row is in: the order of SECTION and SETTING lines in the table. The
 * preprocessor cannot count, so a third expansion lists them as they come. */
static const int ORDER[] = {
#define SECTION(title, intro) -1,
#define SETTING(...)          1,
#include "daemon_settings.def"
#undef SETTING
#undef SECTION
};

static int section_of(int row) {
    int section = -1, seen = 0;
    for (size_t i = 0; i < sizeof ORDER / sizeof ORDER[0]; i++) {
        if (ORDER[i] < 0)
            section++;
        else if (seen++ == row)
            return section;
    }
    return section;
}

/* text from column `at` on, wrapped at `width`, its later lines indented to `indent`. Written by
 * hand: a dozen lines, and no Debian library wraps text for C. */
static void wrap(FILE *out, const char *text, int at, int indent, int width) {
    int col = at;
    bool first = true;
    for (const char *w = text; *w;) {
        int n = (int)strcspn(w, " ");
        bool fits = col + (first ? 0 : 1) + n <= width;
        if (!fits && col > indent) {
            fprintf(out, "\n%*s", indent, "");
            col = indent;
        } else if (!first) {
            fputc(' ', out);
            col++;
        }
        fprintf(out, "%.*s", n, w);
        col += n;
        first = false;
        for (w += n; *w == ' ';) w++;
    }
    fputc('\n', out);
}

static void synopsis(FILE *out) {
    const char *start = "usage: traind";
    int col = (int)strlen(start);
    fputs(start, out);
    char item[96];
    const char *fixed[] = {"[--config FILE]", "[--print-config]"};
    for (size_t i = 0; i < 2 + sizeof ROWS / sizeof ROWS[0]; i++) {
        if (i < 2)
            snprintf(item, sizeof item, "%s", fixed[i]);
        else
            snprintf(item, sizeof item, "[%s %s]%s", ROWS[i - 2].flag, ROWS[i - 2].value,
                     strcmp(ROWS[i - 2].key, "data_roots") == 0 ? "..." : "");
        if (col + 1 + (int)strlen(item) > 80) {
            fprintf(out, "\n%14s", "");
            col = 14;
        } else {
            fputc(' ', out);
            col++;
        }
        fputs(item, out);
        col += (int)strlen(item);
    }
    fputc('\n', out);
}

/* "  --flag VALUE" and its help from column 22 (or after two spaces, when the flag is long). */
static void option(FILE *out, const char *flag, const char *value, const char *help,
                   const char *def) {
    char head[96], text[1024];
    int n = snprintf(head, sizeof head, "  %s%s%s", flag, value[0] ? " " : "", value);
    size_t len = strlen(help);
    if (!def || !def[0])
        snprintf(text, sizeof text, "%s", help);
    else if (len > 0 && help[len - 1] == ')') /* "(...; default X)", not "(...) (default X)" */
        snprintf(text, sizeof text, "%.*s; default %s)", (int)len - 1, help, def);
    else
        snprintf(text, sizeof text, "%s (default %s)", help, def);
    fputs(head, out);
    if (n < 21) {
        fprintf(out, "%*s", 22 - n, "");
        n = 22;
    } else {
        fputs("  ", out);
        n += 2;
    }
    wrap(out, text, n, 22, 80);
}

void daemon_config_usage(FILE *out) {
    synopsis(out);
    fputs("\nThe traind daemon: accepts training jobs over HTTP (API v1, see api/README.md),\n"
          "runs them on this node's slots, streams their metrics, stores their checkpoints.\n"
          "Every setting below is also a key of the config file (docs/settings.md).\n\n",
          out);
    option(out, "--config", "FILE",
           "the config file (default " DAEMON_CONFIG_DEFAULT ", read when it exists): a JSON "
           "object whose keys are the settings' names (listen, state_dir, data_roots, ...; "
           "traind --settings-reference lists them). The command line wins over it; an unknown "
           "key is an error. \"--config ''\": no file. Without --config, $TRAIND_CONFIG names the "
           "file when set (empty: none), as the tests set it.",
           NULL);
    option(out, "--print-config", "",
           "print every setting, its value and where it came from (command line, file, "
           "default), and exit",
           NULL);
    option(out, "--settings-reference", "",
           "print every setting's reference in Markdown (docs/settings.md), and exit", NULL);
    int last = -1;
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
        int s = section_of((int)i);
        if (s != last) {
            char intro[1024];
            snprintf(intro, sizeof intro, "%s. %s", SECTIONS[s].title, SECTIONS[s].intro);
            fputc('\n', out);
            wrap(out, intro, 0, 0, 80);
            last = s;
        }
        option(out, ROWS[i].flag, ROWS[i].value, ROWS[i].help, ROWS[i].def);
    }
    fputs("\nOn its first start traind writes a random admin API token to STATE_DIR/token\n"
          "(mode 0600; it is never printed); every endpoint but GET /v1/health needs\n"
          "\"Authorization: Bearer TOKEN\". Admins make tokens scoped read, submit or admin\n"
          "with POST /v1/tokens (the database keeps their SHA-256 only) and revoke them with\n"
          "DELETE /v1/tokens/ID. Once it serves it prints\n"
          "\"traind: listening on http://ADDR:PORT\" to stderr (and tells systemd it is\n"
          "ready when started as a Type=notify service). SIGHUP re-reads the config file:\n"
          "the settings marked live in docs/settings.md change at once; a change to another\n"
          "setting is reported and waits for a restart. SIGTERM or SIGINT stops it (see\n"
          "--keep-jobs-on-stop for its jobs).\n"
          "One traind per state directory (it holds a lock on STATE_DIR/traind.pid) and per\n"
          "address: a second one on either exits with status 1 and touches nothing.\n",
          out);
}

/* What a reload does with each part's settings, in the reference's words. */
static const char *on_reload(daemon_apply part) {
    return part == DAEMON_RESTART ? "takes a restart" : "live: a reload (SIGHUP) applies it";
}

void daemon_config_reference(FILE *out) {
    fputs("# traind's settings\n\n"
          "<!-- Generated: traind --settings-reference > docs/settings.md. The table is\n"
          "     programs/daemon_settings.def; a test fails when this file differs from it. -->\n\n"
          "Each setting is a command-line option of `traind` and a key of its config file\n"
          "(`--config FILE`, default `" DAEMON_CONFIG_DEFAULT "`: one JSON object). The command\n"
          "line wins over the file, the file over the defaults; `traind --print-config` shows\n"
          "every value and where it came from. `SIGHUP` (`systemctl reload traind`) reads the\n"
          "file again: a live setting changes at once, any other change is logged and waits\n"
          "for a restart. An unknown key, or a value out of its range, stops the daemon at\n"
          "start (exit status 2) with the file, the key and what was expected; a reload with\n"
          "one keeps the settings it runs with.\n",
          out);
    int last = -1;
    for (size_t i = 0; i < sizeof ROWS / sizeof ROWS[0]; i++) {
        int s = section_of((int)i);
        if (s != last) {
            fprintf(out, "\n## %s\n\n%s\n", SECTIONS[s].title, SECTIONS[s].intro);
            last = s;
        }
        fprintf(out, "\n### `%s`\n\n`%s %s`", ROWS[i].key, ROWS[i].flag, ROWS[i].value);
        if (ROWS[i].def && ROWS[i].def[0]) fprintf(out, " · default `%s`", ROWS[i].def);
        const char *kind = ROWS[i].kind;
        if (!strcmp(kind, "K_INT") || !strcmp(kind, "K_LONG") || !strcmp(kind, "K_SECONDS") ||
            !strcmp(kind, "K_NUMBER"))
            fprintf(out, " · from %.15g to %.15g", ROWS[i].min, ROWS[i].max);
        fprintf(out, " · %s\n\n", on_reload(ROWS[i].reload));
        char help[1024]; /* a sentence: capitalised, with its full stop */
        snprintf(help, sizeof help, "%c%s.", toupper((unsigned char)ROWS[i].help[0]),
                 ROWS[i].help + 1);
        wrap(out, help, 0, 0, 100);
    }
}
