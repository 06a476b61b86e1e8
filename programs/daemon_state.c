/* The state directory: its lock, the secrets kept in it (node id, cluster secret, TLS key), the
 * data roots resolved against it, and what of it jobs may open. Apart from daemon_main.c: these
 * are the files a daemon trusts, and each is read or made with its own care. */
#define _GNU_SOURCE
#include "daemon_private.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

/* mkdir -p with mode 0700 for the directories it creates. */
void daemon_make_dirs(const char *path) {
    char p[PATH_MAX];
    snprintf(p, sizeof p, "%s", path);
    for (char *s = p + 1; *s; s++)
        if (*s == '/') {
            *s = 0;
            if (mkdir(p, 0700) != 0 && errno != EEXIST)
                daemon_die("cannot create %s: %s", p, strerror(errno));
            *s = '/';
        }
    if (mkdir(p, 0700) != 0 && errno != EEXIST)
        daemon_die("cannot create %s: %s", p, strerror(errno));
}

/* A secret's first line from the open file f (closed here): at least 16 characters, and a
 * warning when others may read the file. what names it in messages. */
static void read_secret(FILE *f, const char *path, const char *what, char *out, size_t len,
                        td_log *log) {
    if (!fgets(out, (int)len, f)) out[0] = 0;
    fclose(f);
    out[strcspn(out, "\r\n")] = 0;
    if (strlen(out) < 16)
        daemon_die("%s: the %s on its first line is shorter than 16 characters", path, what);
    struct stat st;
    if (stat(path, &st) == 0 && (st.st_mode & 077))
        td_log_warn(log, "warning: %s is readable by others (chmod 600 it)", path);
}

/* STATE_DIR/NAME: read, or created on the first start as 32 random bytes in hex (mode 0600):
 * the API token, the node id. */
void daemon_load_random(const char *dir, const char *name, const char *what, char *token,
                        size_t len, td_log *log) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "r");
    if (f) {
        read_secret(f, path, what, token, len, log);
        return;
    }
    unsigned char raw[32];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw)
        daemon_die("cannot read random bytes for the %s: %s", what, strerror(errno));
    for (size_t i = 0; i < sizeof raw && 2 * i + 2 < len; i++)
        snprintf(token + 2 * i, 3, "%02x", raw[i]);
    int fd = open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
    if (fd < 0) daemon_die("cannot create %s: %s", path, strerror(errno));
    size_t n = strlen(token);
    if (write(fd, token, n) != (ssize_t)n || write(fd, "\n", 1) != 1 || fsync(fd) != 0)
        daemon_die("cannot write %s: %s", path, strerror(errno));
    close(fd);
    /* never the token itself: under systemd stderr is the journal, which others may read */
    td_log_notice(log, "created a new %s in %s (mode 0600)%s", what, path,
                  strcmp(name, "token") == 0 ? "; clients read it there" : "");
}

/* The cluster secret, from --cluster-secret-file. */
void daemon_load_cluster_secret(const char *path, char *out, size_t len, td_log *log) {
    FILE *f = fopen(path, "r");
    if (!f)
        daemon_die(
            "--cluster-secret-file %s: %s (every node needs the same file; make one with: head -c "
            "32 /dev/urandom | od -An -tx1 | tr -d ' \\n' > FILE)",
            path, strerror(errno));
    read_secret(f, path, "cluster secret", out, len, log);
}

/* One daemon per state directory: an exclusive flock on STATE_DIR/traind.pid, held for the
 * daemon's life. Two daemons on one directory would each recover the other's running jobs as
 * interrupted and kill its workers. The kernel drops the lock when the process ends, SIGKILL
 * included, so a crash never leaves a stale lock behind; the file's content (the PID) only
 * serves the message a second daemon prints. The descriptor is close-on-exec: workers never
 * inherit it. */
int daemon_lock_state_dir(const char *dir, td_log *log) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/traind.pid", dir);
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
    if (fd < 0) daemon_die("cannot open %s: %s", path, strerror(errno));
    if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
        int e = errno;
        if (e != EWOULDBLOCK) daemon_die("cannot lock %s: %s", path, strerror(e));
        char pid[32] = "";
        ssize_t n = pread(fd, pid, sizeof pid - 1, 0);
        pid[n > 0 ? n : 0] = 0;
        pid[strcspn(pid, "\r\n")] = 0;
        td_log_error(log,
                     "the state directory %s is in use by another traind (pid %s, which holds "
                     "the lock on %s); stop that daemon first, or give this one another "
                     "--state-dir",
                     dir, pid[0] ? pid : "unknown", path);
        exit(1);
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    if (ftruncate(fd, 0) != 0 || pwrite(fd, pid, (size_t)n, 0) != n)
        daemon_die("cannot write %s: %s", path, strerror(errno));
    return fd;
}

/* The data roots resolved after symlinks (a missing one is skipped with a warning), then the
 * state directory, which always is one. Returns how many. */
int daemon_resolve_roots(const daemon_options *o, const char *state, td_log *log,
                         char (*resolved)[PATH_MAX], const char **roots) {
    int n = 0;
    for (int i = 0; i < o->n_data_roots; i++) {
        if (!realpath(o->data_roots[i], resolved[n])) {
            td_log_warn(log, "warning: data root %s: %s (skipped)", o->data_roots[i],
                        strerror(errno));
            continue;
        }
        roots[n] = resolved[n];
        n++;
    }
    snprintf(resolved[n], PATH_MAX, "%s", state);
    roots[n] = resolved[n];
    return n + 1;
}

/* A PEM file's text (certificate or key), at most 1 MiB; what names it in messages. A private
 * key others may read is said so. */
char *daemon_read_pem(const char *path, const char *what, bool secret, td_log *log) {
    FILE *f = fopen(path, "rb");
    if (!f) daemon_die("%s %s: %s", what, path, strerror(errno));
    setvbuf(f, NULL, _IONBF, 0); /* no stdio buffer holding a copy of a private key */
    struct stat st;
    if (secret && fstat(fileno(f), &st) == 0 && (st.st_mode & 077))
        td_log_warn(log, "warning: %s %s is readable by others (chmod 600 it)", what, path);
    char *text = malloc((1 << 20) + 1);
    if (!text) daemon_die("out of memory reading %s", path);
    size_t n = fread(text, 1, 1 << 20, f);
    bool more = fgetc(f) != EOF, failed = ferror(f);
    fclose(f);
    if (failed) daemon_die("%s %s: cannot read it", what, path);
    if (more) daemon_die("%s %s: larger than 1 MiB: not a PEM file", what, path);
    text[n] = 0;
    if (!strstr(text, "-----BEGIN "))
        daemon_die("%s %s: not PEM (no \"-----BEGIN\" line)", what, path);
    return text;
}

/* The state directory, for jobs run as other users: its directories let them through to their
 * job directories (o+x, not o+r: nothing is listed), and everything else in it is the
 * daemon's alone (the umask is 077; the database's -wal and -shm files take its mode). */
void daemon_open_for_jobs(const char *state, const char *db_path, bool others, td_log *log) {
    if (!others) return;
    char jobs_dir[PATH_MAX + 16];
    snprintf(jobs_dir, sizeof jobs_dir, "%s/jobs", state);
    const char *dirs[] = {state, jobs_dir};
    for (size_t i = 0; i < 2; i++) {
        if (mkdir(dirs[i], 0711) != 0 && errno != EEXIST)
            daemon_die("cannot create %s: %s", dirs[i], strerror(errno));
        if (chmod(dirs[i], 0711) != 0)
            daemon_die("%s: cannot let jobs through to their directories (chmod 0711): %s", dirs[i],
                       strerror(errno));
    }
    const char *suffix[] = {"", "-wal", "-shm"};
    for (size_t i = 0; i < 3; i++) {
        char p[PATH_MAX + 32];
        snprintf(p, sizeof p, "%s%s", db_path, suffix[i]);
        if (chmod(p, 0600) != 0 && errno != ENOENT)
            td_log_warn(log, "warning: chmod 600 %s: %s", p, strerror(errno));
    }
}
