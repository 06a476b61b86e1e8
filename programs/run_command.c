/* What traind-run executes: torchrun runs "PYTHON -u SCRIPT ARGS" (or "-m MODULE"), and
 * "PROGRAM ARGS" with --no-python. A command torchrun would hand to Python but Python cannot
 * read (an ELF program, a script for another interpreter, a command found on PATH such as sh or
 * traind-worker) runs as it is: every command line torchrun accepts means the same here. */
#include "programs/run_options.h"

#include "base/td_strv.h"

#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* Whether `name` is found on PATH as an executable file (written into out). */
static bool on_path(const char *name, char *out, size_t len) {
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    for (const char *p = path; *p;) {
        const char *colon = strchr(p, ':');
        size_t dl = colon ? (size_t)(colon - p) : strlen(p);
        snprintf(out, len, "%.*s/%s", (int)dl, dl ? p : ".", name);
        struct stat st;
        if (stat(out, &st) == 0 && S_ISREG(st.st_mode) && access(out, X_OK) == 0) return true;
        p += dl + (colon ? 1 : 0);
    }
    return false;
}

/* Whether the command is for Python: a .py file, or a file whose first line does not say it is
 * an ELF program or a script of another interpreter; a name that is no file but a program on
 * PATH is not (torchrun would fail on it). */
static bool for_python(const char *command) {
    size_t n = strlen(command);
    if (n > 3 && strcmp(command + n - 3, ".py") == 0) return true;
    int fd = open(command, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) {
        char found[4096];
        /* not on PATH either: Python says what is wrong with it, as under torchrun */
        return strchr(command, '/') || !on_path(command, found, sizeof found);
    }
    char head[256] = "";
    ssize_t k = read(fd, head, sizeof head - 1);
    close(fd);
    head[k > 0 ? k : 0] = 0;
    static const char elf[] = {0x7f, 'E', 'L', 'F'};
    if (k >= 4 && memcmp(head, elf, 4) == 0) return false;
    if (k >= 2 && head[0] == '#' && head[1] == '!') {
        char *end = strchr(head, '\n');
        if (end) *end = 0;
        return strstr(head, "python") != NULL;
    }
    return true;
}

/* Whether `python` can import torch (run once, quietly). */
static bool imports_torch(const char *python) {
    pid_t pid = fork();
    if (pid == 0) {
        int null = open("/dev/null", O_RDWR);
        if (null >= 0) dup2(null, 1), dup2(null, 2);
        execl(python, python, "-c", "import torch", (char *)NULL);
        _exit(127);
    }
    int status;
    return pid > 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) &&
           WEXITSTATUS(status) == 0;
}

/* The interpreter: $TRAIND_PYTHON, $PYTHON, the first python3 on PATH that imports torch, the
 * first python3 on PATH, or "python3"; why says which rule chose it. */
static void choose_python(char *out, size_t len, char *why, size_t why_len) {
    const char *vars[] = {"TRAIND_PYTHON", "PYTHON"};
    for (size_t i = 0; i < 2; i++) {
        const char *v = getenv(vars[i]);
        if (v && *v) {
            snprintf(out, len, "%s", v);
            snprintf(why, why_len, "$%s", vars[i]);
            return;
        }
    }
    const char *path = getenv("PATH");
    if (!path || !*path) path = "/usr/local/bin:/usr/bin:/bin";
    char first[4096] = "";
    for (const char *p = path; *p;) {
        const char *colon = strchr(p, ':');
        size_t dl = colon ? (size_t)(colon - p) : strlen(p);
        char candidate[4096];
        snprintf(candidate, sizeof candidate, "%.*s/python3", (int)dl, dl ? p : ".");
        p += dl + (colon ? 1 : 0);
        if (access(candidate, X_OK) != 0) continue;
        if (!first[0]) snprintf(first, sizeof first, "%s", candidate);
        if (imports_torch(candidate)) {
            snprintf(out, len, "%s", candidate);
            snprintf(why, why_len, "the first python3 on PATH that can import torch");
            return;
        }
    }
    snprintf(out, len, "%s", first[0] ? first : "python3");
    snprintf(why, why_len, "%s",
             first[0] ? "no python3 on PATH can import torch" : "no python3 on PATH");
}

char **run_command(const run_options *o, FILE *log) {
    int argc = 0;
    while (o->command[argc]) argc++;
    /* a program run as it is needs no word: torchrun would have refused it */
    if (o->no_python || (!o->module && !for_python(o->command[0]))) {
        char **argv = td_strv_new(argc);
        for (int i = 0; i < argc; i++) argv[i] = td_str_dup(o->command[i]);
        return argv;
    }
    char python[4096], chose[128];
    choose_python(python, sizeof python, chose, sizeof chose);
    fprintf(log, "[traind-run] running %s%s with %s (%s)\n", o->module ? "-m " : "", o->command[0],
            python, chose);
    char **argv = td_strv_new(argc + 3);
    int k = 0;
    argv[k++] = td_str_dup(python);
    argv[k++] = td_str_dup("-u"); /* as torchrun: each line reaches the log as it is printed */
    if (o->module) argv[k++] = td_str_dup("-m");
    for (int i = 0; i < argc; i++) argv[k++] = td_str_dup(o->command[i]);
    return argv;
}
