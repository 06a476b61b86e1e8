/* Each attempt's files, in torchrun's layout: BASE/attempt_N/LOCAL_RANK/{error.json,
 * stdout.log, stderr.log}, BASE being --log-dir/RUN_ID_xxxxxx or a temporary directory. The
 * error files are always there (TORCHELASTIC_ERROR_FILE; PyTorch's @record writes them): after a
 * failed attempt, the failing rank's is read for torchrun's "Root Cause" summary. --redirects
 * sends a rank's stdout and/or stderr to its files only, --tee to its files and the console,
 * each line prefixed "[defaultR]:" as torchrun prefixes them. */
#define _GNU_SOURCE /* pipe2 */
#include "programs/run_options.h"

#include "base/td_strv.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum { MAX_RANKS = 1024, STREAMS = 2 };

/* One teed stream: the pipe the rank writes, the file and console it is copied to. */
typedef struct tee_stream {
    int read_fd, file_fd, console_fd, rank;
    char partial[4096]; /* the start of a line not yet ended */
    size_t n_partial;
} tee_stream;

struct run_files {
    run_options *o;
    const char *name;
    FILE *log;
    char base[4096];
    bool temporary;  /* made here without --log-dir: removed at the end unless logs */
    bool logs;       /* --redirects or --tee wrote files there */
    bool kept_error; /* a failure summary names an error file there: it stays */
    unsigned char redirect[MAX_RANKS], tee[MAX_RANKS]; /* bit 0 stdout, bit 1 stderr */
    int stdout_fds[MAX_RANKS], stderr_fds[MAX_RANKS];
    tee_stream *streams; /* this attempt's teed streams */
    int n_streams;
    pthread_t thread;
    bool thread_running;
};

/* "3" (every rank) or "0:1,2:3" (per local rank) into bits[nproc]. */
static void parse_streams(const char *option, const char *v, int nproc, unsigned char *bits) {
    memset(bits, 0, (size_t)nproc);
    if (!v) return;
    if (strchr(v, ':') == NULL) {
        char *end;
        long b = strtol(v, &end, 10);
        if (*v && !*end && b >= 0 && b <= 3) {
            memset(bits, (int)b, (size_t)nproc);
            return;
        }
    } else {
        for (const char *p = v; *p;) {
            char *end;
            long r = strtol(p, &end, 10), b;
            if (end == p || *end != ':' || r < 0 || r >= nproc) break;
            p = end + 1;
            b = strtol(p, &end, 10);
            if (end == p || b < 0 || b > 3 || (*end && *end != ',')) break;
            bits[r] = (unsigned char)b;
            p = *end ? end + 1 : end;
            if (!*p) return;
        }
    }
    fprintf(stderr,
            "traind-run: %s %s: expected 0 (none), 1 (stdout), 2 (stderr) or 3 (both), or "
            "LOCAL_RANK:N pairs separated by commas (0:1,1:3) for local ranks below %d\n",
            option, v, nproc);
    exit(2);
}

/* Writes whole lines of s to its console, each prefixed with its rank; an unended line waits. */
static void console_lines(tee_stream *s, const char *p, size_t n, bool end) {
    char prefix[32];
    int plen = snprintf(prefix, sizeof prefix, "[default%d]:", s->rank);
    for (size_t i = 0; i < n; i++) {
        if (s->n_partial < sizeof s->partial) s->partial[s->n_partial++] = p[i];
        if (p[i] == '\n' || s->n_partial == sizeof s->partial) {
            (void)!write(s->console_fd, prefix, (size_t)plen);
            (void)!write(s->console_fd, s->partial, s->n_partial);
            s->n_partial = 0;
        }
    }
    if (end && s->n_partial) {
        (void)!write(s->console_fd, prefix, (size_t)plen);
        (void)!write(s->console_fd, s->partial, s->n_partial);
        (void)!write(s->console_fd, "\n", 1);
        s->n_partial = 0;
    }
}

/* Copies every teed stream to its file and console until each has ended (its writers gone). */
static void *tee_thread(void *arg) {
    run_files *f = arg;
    struct pollfd pfd[2 * MAX_RANKS];
    int open_streams = f->n_streams;
    for (int i = 0; i < f->n_streams; i++)
        pfd[i] = (struct pollfd){f->streams[i].read_fd, POLLIN, 0};
    char buf[65536];
    while (open_streams > 0) {
        if (poll(pfd, (nfds_t)f->n_streams, -1) < 0 && errno != EINTR) break;
        for (int i = 0; i < f->n_streams; i++) {
            if (pfd[i].fd < 0 || !pfd[i].revents) continue;
            tee_stream *s = &f->streams[i];
            ssize_t k = read(s->read_fd, buf, sizeof buf);
            if (k > 0) {
                (void)!write(s->file_fd, buf, (size_t)k);
                console_lines(s, buf, (size_t)k, false);
            } else if (k == 0 || (errno != EINTR && errno != EAGAIN)) {
                console_lines(s, "", 0, true);
                pfd[i].fd = -1;
                open_streams--;
            }
        }
    }
    return NULL;
}

static int open_log(run_files *f, int attempt, int rank, const char *stream, td_err *err) {
    char path[4200];
    snprintf(path, sizeof path, "%s/attempt_%d/%d/%s.log", f->base, attempt, rank, stream);
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) td_fail(err, "cannot make %s: %s", path, strerror(errno));
    return fd;
}

/* This attempt's log files and tee pipes, into the launcher's stdout_fds and stderr_fds. */
static int before_attempt(void *arg, int attempt, td_err *err) {
    run_files *f = arg;
    int nproc = f->o->launch.nproc_per_node;
    f->n_streams = 0;
    f->streams = td_calloc((size_t)(2 * nproc), sizeof *f->streams);
    for (int r = 0; r < nproc; r++)
        for (int s = 0; s < STREAMS; s++) {
            int *fds = s == 0 ? f->stdout_fds : f->stderr_fds;
            int bit = 1 << s;
            fds[r] = -1;
            if (!((f->redirect[r] | f->tee[r]) & bit)) continue;
            int file = open_log(f, attempt, r, s == 0 ? "stdout" : "stderr", err);
            if (file < 0) return -1;
            if (!(f->tee[r] & bit)) {
                fds[r] = file;
                continue;
            }
            int pipe_fds[2];
            if (pipe2(pipe_fds, O_CLOEXEC) != 0) {
                close(file);
                return td_fail(err, "pipe: %s", strerror(errno));
            }
            fds[r] = pipe_fds[1];
            f->streams[f->n_streams++] = (tee_stream){
                .read_fd = pipe_fds[0], .file_fd = file, .console_fd = s == 0 ? 1 : 2, .rank = r};
        }
    if (f->n_streams > 0) {
        if (pthread_create(&f->thread, NULL, tee_thread, f) != 0)
            return td_fail(err, "cannot start the thread that tees the workers' output");
        f->thread_running = true;
    }
    return 0;
}

/* The failing rank's story, as torchrun prints it. */
static void report_failure(run_files *f, int attempt, const td_group *g) {
    char file[4096];
    td_launch_error_file(&f->o->launch, attempt, g->failed_local, file, sizeof file);
    td_rank_error e;
    bool have = false;
    int fd = open(file, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd >= 0) {
        td_err err = {{0}};
        have = td_rank_error_read(fd, &e, &err) == 0;
        if (!have) fprintf(f->log, "[traind-run] %s: %s\n", file, err.msg);
        close(fd);
        f->kept_error = true;
    }
    char *text = td_launch_root_cause(f->name, g, file, have ? &e : NULL);
    fprintf(f->log, "%s", text);
    free(text);
    if (have) td_rank_error_free(&e);
}

static void after_attempt(void *arg, int attempt, const td_group *g) {
    run_files *f = arg;
    int nproc = f->o->launch.nproc_per_node;
    for (int r = 0; r < nproc; r++) { /* our ends: the tee sees the end of each stream */
        if (f->stdout_fds[r] >= 0) close(f->stdout_fds[r]);
        if (f->stderr_fds[r] >= 0) close(f->stderr_fds[r]);
        f->stdout_fds[r] = f->stderr_fds[r] = -1;
    }
    if (f->thread_running) pthread_join(f->thread, NULL);
    f->thread_running = false;
    for (int i = 0; i < f->n_streams; i++) {
        close(f->streams[i].read_fd);
        close(f->streams[i].file_fd);
    }
    free(f->streams);
    f->streams = NULL;
    f->n_streams = 0;
    if (g->first_failure && g->failed_local >= 0) report_failure(f, attempt, g);
}

run_files *run_files_setup(run_options *o, const char *name, FILE *log) {
    run_files *f = td_calloc(1, sizeof *f);
    f->o = o;
    f->name = name;
    f->log = log;
    int nproc = o->launch.nproc_per_node;
    if (nproc > MAX_RANKS) nproc = MAX_RANKS;
    parse_streams("--redirects", o->redirects, nproc, f->redirect);
    parse_streams("--tee", o->tee, nproc, f->tee);
    for (int r = 0; r < nproc; r++) f->logs = f->logs || f->redirect[r] || f->tee[r];
    if (o->log_dir) {
        if (mkdir(o->log_dir, 0755) != 0 && errno != EEXIST) {
            fprintf(stderr, "traind-run: --log-dir %s: %s\n", o->log_dir, strerror(errno));
            exit(1);
        }
        snprintf(f->base, sizeof f->base, "%s/%s_XXXXXX", o->log_dir, o->launch.run_id);
    } else {
        const char *tmp = getenv("TMPDIR");
        snprintf(f->base, sizeof f->base, "%s/traind-run-XXXXXX", tmp && *tmp ? tmp : "/tmp");
        f->temporary = true;
    }
    if (!mkdtemp(f->base)) {
        fprintf(stderr, "traind-run: cannot make %s: %s\n", f->base, strerror(errno));
        exit(1);
    }
    if (o->log_dir || f->logs) fprintf(log, "[traind-run] the workers' files: %s\n", f->base);
    o->launch.error_dir = f->base;
    o->launch.before_attempt = before_attempt;
    o->launch.after_attempt = after_attempt;
    o->launch.hook_arg = f;
    for (int r = 0; r < MAX_RANKS; r++) f->stdout_fds[r] = f->stderr_fds[r] = -1;
    if (f->logs) {
        o->launch.stdout_fds = f->stdout_fds;
        o->launch.stderr_fds = f->stderr_fds;
    }
    return f;
}

/* Removes the temporary directory's attempt_N/R/error.json files and directories (made by us;
 * only a worker's own error file is in them). */
static void remove_tree(const char *dir) {
    char path[4200];
    for (int a = 0;; a++) {
        snprintf(path, sizeof path, "%s/attempt_%d", dir, a);
        struct stat st;
        if (lstat(path, &st) != 0) break;
        for (int r = 0; r < MAX_RANKS; r++) {
            snprintf(path, sizeof path, "%s/attempt_%d/%d/error.json", dir, a, r);
            unlink(path);
            snprintf(path, sizeof path, "%s/attempt_%d/%d", dir, a, r);
            if (rmdir(path) != 0 && errno == ENOENT) break;
        }
        snprintf(path, sizeof path, "%s/attempt_%d", dir, a);
        rmdir(path);
    }
    rmdir(dir);
}

void run_files_finish(run_files *f) {
    if (f->temporary && !f->logs && !f->kept_error) remove_tree(f->base);
    free(f);
}
