/* The daemon's side of traind-shepherd: starting one, connecting to one again, reading what it
 * says and asking it to stop (td_shepherd.h); the lines and files themselves are encoded and
 * decoded in td_shepherd_protocol.c. */
#define _GNU_SOURCE /* getrandom's header */
#include "service/run/td_shepherd.h"

#include "base/td_json.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

extern char **environ;

void td_shepherd_base(char *out, size_t len, const char *dir, int attempt, int node_rank) {
    snprintf(out, len, "%s/attempt-%d.node-%d", dir, attempt, node_rank);
}

void td_shepherd_program(char *out, size_t len, const char *self) {
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", self);
    char *slash = strrchr(dir, '/');
    if (!slash) {
        snprintf(out, len, "traind-shepherd");
        return;
    }
    *slash = 0;
    snprintf(out, len, "%s/traind-shepherd", dir);
    if (access(out, X_OK) == 0) return;
    /* installed: PREFIX/bin/traind and PREFIX/lib/traind/traind-shepherd (not on PATH: only
     * the daemon runs it) */
    char *up = strrchr(dir, '/');
    if (up) *up = 0;
    snprintf(out, len, "%s/lib/traind/traind-shepherd", up ? dir : ".");
}

static void path_of(char *out, size_t len, const td_shepherd *s, const char *ext) {
    snprintf(out, len, "%s.%s", s->base, ext);
}

/* Writes o to path whole or not at all: aside, synced, renamed over, the directory synced. */
static int write_durably(const char *path, json_t *o, td_err *err) {
    char tmp[PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd < 0) return td_fail(err, "cannot create %s: %s", tmp, strerror(errno));
    char *text = json_dumps(o, JSON_INDENT(2));
    size_t n = text ? strlen(text) : 0, done = 0;
    int rc = text ? 0 : -1;
    while (rc == 0 && done < n) {
        ssize_t k = write(fd, text + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0)
            rc = -1;
        else
            done += (size_t)k;
    }
    if (rc == 0 && fsync(fd) != 0) rc = -1;
    int saved = errno;
    close(fd);
    free(text);
    if (rc != 0 || rename(tmp, path) != 0) {
        if (rc == 0) saved = errno;
        unlink(tmp);
        return td_fail(err, "cannot write %s: %s", path, strerror(saved));
    }
    char dir[PATH_MAX];
    snprintf(dir, sizeof dir, "%s", path);
    char *slash = strrchr(dir, '/');
    if (slash) *slash = 0;
    int dfd = open(slash ? dir : ".", O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        (void)fsync(dfd); /* the rename itself; a failure here loses nothing yet written */
        close(dfd);
    }
    return 0;
}

/* This boot's id: a shepherd's status file missing after a reboot means the machine went down,
 * not that the shepherd was killed. "" when unreadable. */
static void boot_id(char *out, size_t len) {
    out[0] = 0;
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "re");
    if (!f) return;
    if (fgets(out, (int)len, f)) out[strcspn(out, "\n")] = 0;
    fclose(f);
}

/* A Unix stream socket and the address of path in *a; -1 with the message in err. */
static int unix_socket(const char *path, struct sockaddr_un *a, td_err *err) {
    *a = (struct sockaddr_un){.sun_family = AF_UNIX};
    if (strlen(path) >= sizeof a->sun_path)
        return td_fail(err, "%s: the path is too long for a Unix socket (%zu bytes at most)", path,
                       sizeof a->sun_path - 1);
    snprintf(a->sun_path, sizeof a->sun_path, "%s", path);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return td_fail(err, "socket: %s", strerror(errno));
    return fd;
}

int td_shepherd_listen(const char *path, td_err *err) {
    struct sockaddr_un a;
    int fd = unix_socket(path, &a, err);
    if (fd < 0) return -1;
    unlink(path); /* an earlier try at this attempt's (it never started) */
    /* owner only (a chmod, not the umask: that is the whole process's, other threads' files
     * too); the uid check and the token guard it besides */
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || chmod(path, 0600) != 0 ||
        listen(fd, 4) != 0) {
        int e = errno;
        close(fd);
        return td_fail(err, "cannot listen on %s: %s", path, strerror(e));
    }
    return fd;
}

int td_shepherd_start(td_shepherd *s, const char *program, const char *base, json_t *spec,
                      td_err *err) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    snprintf(s->base, sizeof s->base, "%s", base);
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        return td_fail(err, "getrandom: %s", strerror(errno));
    char token[2 * sizeof raw + 1], boot[64];
    for (size_t i = 0; i < sizeof raw; i++) snprintf(token + 2 * i, 3, "%02x", raw[i]);
    boot_id(boot, sizeof boot);
    char path[PATH_MAX], log_path[PATH_MAX], spec_path[PATH_MAX];
    path_of(log_path, sizeof log_path, s, "log");
    unlink(log_path); /* its existence says a shepherd ran (td_shepherd_ran) */
    path_of(path, sizeof path, s, "status");
    unlink(path);
    td_shepherd_spec_fill(spec, s->base, token, boot);
    path_of(path, sizeof path, s, "sock");
    path_of(spec_path, sizeof spec_path, s, "json");

    int pair[2] = {-1, -1}, listener = td_shepherd_listen(path, err);
    if (listener < 0) return -1;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0) {
        close(listener);
        unlink(path);
        return td_fail(err, "socketpair: %s", strerror(errno));
    }
    /* above the numbers they are given in the child (0 to 4): a dup2 onto 3 must not close
     * the listener, nor one onto 4 the connection */
    int fds[3] = {listener, pair[0], pair[1]};
    for (int i = 0; i < 3; i++)
        if (fds[i] <= TD_SHEPHERD_LISTEN_FD) {
            int moved = fcntl(fds[i], F_DUPFD_CLOEXEC, TD_SHEPHERD_LISTEN_FD + 1);
            if (moved >= 0) close(fds[i]), fds[i] = moved;
        }
    listener = fds[0], pair[0] = fds[1], pair[1] = fds[2];
    if (write_durably(spec_path, spec, err) != 0) {
        close(listener);
        close(pair[0]);
        close(pair[1]);
        unlink(path);
        return -1;
    }
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t attr;
    posix_spawn_file_actions_init(&fa);
    posix_spawnattr_init(&attr);
    posix_spawn_file_actions_addopen(&fa, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_addopen(&fa, 1, log_path, O_WRONLY | O_CREAT | O_APPEND, 0640);
    posix_spawn_file_actions_adddup2(&fa, 1, 2);
    /* dup2 clears close-on-exec */
    posix_spawn_file_actions_adddup2(&fa, pair[1], TD_SHEPHERD_DAEMON_FD);
    posix_spawn_file_actions_adddup2(&fa, listener, TD_SHEPHERD_LISTEN_FD);
    /* the daemon blocks SIGCHLD (its signalfd) and ignores SIGPIPE: neither is the shepherd's */
    sigset_t none, all;
    sigemptyset(&none);
    sigfillset(&all);
    posix_spawnattr_setsigmask(&attr, &none);
    posix_spawnattr_setsigdefault(&attr, &all);
    posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
    char *argv[] = {(char *)program, spec_path, NULL};
    int rc = posix_spawn(&s->pid, program, &fa, &attr, argv, environ);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&attr);
    close(pair[1]);
    close(listener); /* the shepherd's now (or nobody's: the file goes below) */
    if (rc != 0) {
        close(pair[0]);
        s->pid = 0;
        td_shepherd_forget(base);
        return td_fail(err, "cannot start %s: %s", program, strerror(rc));
    }
    fcntl(pair[0], F_SETFL, O_NONBLOCK);
    s->fd = pair[0];
    /* into the attempt's cgroup at once (it moves itself there too, as it starts): from now on
     * the cgroup is in use, and no sweep of empty ones takes it away (td_cgroups_remove) */
    const char *cgroup = json_string_value(json_object_get(spec, "cgroup"));
    if (cgroup && cgroup[0]) {
        char leaf[PATH_MAX + 16], pid[32];
        snprintf(leaf, sizeof leaf, "%s/shepherd/cgroup.procs", cgroup);
        snprintf(pid, sizeof pid, "%ld", (long)s->pid);
        int fd = open(leaf, O_WRONLY | O_CLOEXEC);
        if (fd < 0 || write(fd, pid, strlen(pid)) != (ssize_t)strlen(pid)) {
            (void)0; /* the shepherd enters it itself; its log says when it cannot */
        }
        if (fd >= 0) close(fd);
    }
    return 0;
}

bool td_shepherd_ran(const char *base) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.log", base);
    return access(path, F_OK) == 0;
}

bool td_shepherd_other_boot(const char *base) {
    char path[PATH_MAX], now[64];
    snprintf(path, sizeof path, "%s.json", base);
    json_t *o = json_load_file(path, 0, NULL);
    const char *then = json_string_value(json_object_get(o, "boot_id"));
    boot_id(now, sizeof now);
    bool other = then && then[0] && now[0] && strcmp(then, now) != 0;
    json_decref(o);
    return other;
}

static int read_token(const char *spec_path, char *token, size_t len, td_err *err) {
    json_error_t je;
    json_t *o = json_load_file(spec_path, 0, &je);
    if (!o) return td_fail(err, "%s:%d: %s", spec_path, je.line, je.text);
    const char *t = json_string_value(json_object_get(o, "token"));
    int rc = 0;
    if (!t || strlen(t) >= len)
        rc = td_fail(err, "%s: token: expected a string", spec_path);
    else
        snprintf(token, len, "%s", t);
    json_decref(o);
    return rc;
}

json_t *td_shepherd_notes(const char *base) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.json", base);
    json_t *o = json_load_file(path, 0, NULL);
    json_t *notes = json_incref(json_object_get(o, "daemon"));
    json_decref(o);
    return notes;
}

int td_shepherd_attach(td_shepherd *s, const char *base, td_err *err) {
    memset(s, 0, sizeof *s);
    s->fd = -1;
    snprintf(s->base, sizeof s->base, "%s", base);
    char path[PATH_MAX], token[128];
    path_of(path, sizeof path, s, "json");
    if (read_token(path, token, sizeof token, err) != 0) return -1;
    path_of(path, sizeof path, s, "sock");
    struct sockaddr_un a;
    int fd = unix_socket(path, &a, err);
    if (fd < 0) return -1;
    if (connect(fd, (struct sockaddr *)&a, sizeof a) != 0) {
        int e = errno;
        close(fd);
        if (e == ENOENT || e == ECONNREFUSED) return 1; /* nobody listens: it has ended */
        return td_fail(err, "cannot connect to %s: %s", path, strerror(e));
    }
    char hello[160]; /* it answers with its pid and out lines */
    int n = td_shepherd_hello_line(hello, sizeof hello, token);
    if (send(fd, hello, (size_t)n, MSG_NOSIGNAL) != n) {
        close(fd);
        return 1; /* it went away as we came */
    }
    fcntl(fd, F_SETFL, O_NONBLOCK);
    s->fd = fd;
    return 0;
}

void td_shepherd_read(td_shepherd *s) {
    while (s->fd >= 0) {
        ssize_t k = recv(s->fd, s->in + s->in_len, sizeof s->in - 1 - s->in_len, 0);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) return;
        if (k <= 0) { /* it ended (or died) */
            td_shepherd_close(s);
            return;
        }
        s->in_len += (size_t)k;
        s->in[s->in_len] = 0;
        char *start = s->in, *nl;
        while ((nl = strchr(start, '\n'))) {
            *nl = 0;
            td_shepherd_said(s, start);
            start = nl + 1;
        }
        size_t rest = s->in_len - (size_t)(start - s->in);
        if (rest == sizeof s->in - 1) rest = 0; /* no line of its is this long */
        memmove(s->in, start, rest);
        s->in_len = rest;
    }
}

bool td_shepherd_stop(td_shepherd *s, int sig, double grace_s, const char *reason) {
    if (s->fd < 0 || s->stop_sent) return false;
    char line[700];
    int n = td_shepherd_stop_line(line, sizeof line, sig, grace_s, reason);
    /* a few hundred bytes into an empty socket buffer: it does not block */
    if (send(s->fd, line, (size_t)n, MSG_NOSIGNAL) != n) return false;
    s->stop_sent = true;
    return true;
}

void td_shepherd_last_words(const char *base, char *out, size_t len) {
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.log", base);
    out[0] = 0;
    FILE *f = fopen(path, "re");
    if (!f) return;
    char line[1024];
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        if (line[0]) snprintf(out, len, "%s", line);
    }
    fclose(f);
}

void td_shepherd_close(td_shepherd *s) {
    if (s->fd >= 0) close(s->fd);
    s->fd = -1;
    s->in_len = 0;
}

void td_shepherd_forget(const char *base) {
    if (!base[0]) return; /* an attempt that never had files */
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s.json", base);
    unlink(path);
    snprintf(path, sizeof path, "%s.sock", base);
    unlink(path);
}
