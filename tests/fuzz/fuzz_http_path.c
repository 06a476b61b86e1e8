/* Feeds: a request's URL (path, then ?query) to the API's parsers of what a client names:
 *   - a job id (/v1/jobs/{id}, td_api_parse_id) and Last-Event-ID (td_api_parse_last_event_id),
 *   - a checkpoint's route (td_api_parse_checkpoint_tail) and the file it names
 * (td_checkpoint_open, against a checkpoint in the scratch directory, with links that point out of
 * it),
 *   - the cluster files route (td_api_file_route_split, td_jobs_file_path on a job service
 *     opened once over an empty database in the scratch directory),
 *   - query values as integers (td_parse_long, trainer/core) and job states.
 * Why: these pick which file of the state directory the daemon opens for a client. Each answer is
 * also compared with an independent reading of the rule it implements, written here. */
#include "fuzz_util.h"

#include "api/td_api_private.h"
#include "base/td_parse.h"
#include "service/run/td_checkpoint_files.h"
#include "service/jobs/td_jobs.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static td_jobs *jobs;
static char checkpoint_dir[PATH_MAX], checkpoint_file[PATH_MAX];
/* the regular files inside the checkpoint: the only ones td_checkpoint_open may open */
static ino_t inside[8];
static int n_inside;

static void put(const char *path, bool counts) {
    fuzz_write_file(path, "x", 1);
    struct stat st;
    if (stat(path, &st) != 0) abort();
    if (counts) inside[n_inside++] = st.st_ino;
}

static void setup(void) {
    char p[PATH_MAX], outside[PATH_MAX];
    fuzz_path(checkpoint_dir, sizeof checkpoint_dir, "step-00000001");
    fuzz_path(outside, sizeof outside, "outside");
    snprintf(p, sizeof p, "%s/sub", checkpoint_dir);
    if (mkdir(checkpoint_dir, 0700) || mkdir(outside, 0700) || mkdir(p, 0700)) abort();
    snprintf(p, sizeof p, "%s/model.safetensors", checkpoint_dir), put(p, true);
    snprintf(p, sizeof p, "%s/state.json", checkpoint_dir), put(p, true);
    snprintf(p, sizeof p, "%s/sub/rank-0.pt", checkpoint_dir), put(p, true);
    snprintf(p, sizeof p, "%s/secret", outside), put(p, false);
    fuzz_path(checkpoint_file, sizeof checkpoint_file, "model.pt"), put(checkpoint_file, true);
    /* what a job could leave in its checkpoint to reach out of it */
    snprintf(p, sizeof p, "%s/link", checkpoint_dir);
    if (symlink("../outside/secret", p) != 0) abort();
    snprintf(p, sizeof p, "%s/linkdir", checkpoint_dir);
    if (symlink("../outside", p) != 0) abort();

    char state[PATH_MAX], db_path[PATH_MAX];
    fuzz_path(state, sizeof state, "state");
    snprintf(db_path, sizeof db_path, "%s/state.db", state);
    FILE *null = fopen("/dev/null", "w");
    td_log *lg = null ? td_log_open(null, false, TD_LOG_DEBUG) : NULL;
    td_db *db;
    td_err err = {{0}};
    const char *roots[] = {state};
    td_jobs_config cfg = {
        .runner = {.state_dir = state,
                   .shepherd = "/nonexistent/traind-shepherd",
                   .slots = 1,
                   .grace_s = 1,
                   .orphan_timeout_s = 60,
                   .worker = "/nonexistent/traind-worker"},
        .rules = {.data_roots = roots, .n_roots = 1, .slots = 1, .state_dir = state}};
    if (!lg || mkdir(state, 0700) != 0 || td_db_open(&db, db_path, &err) != 0 ||
        td_jobs_open(&jobs, &cfg, db, lg, &err) != 0) {
        fprintf(stderr, "fuzz_http_path: cannot open a job service: %s\n", err.msg);
        exit(1);
    }
}

/* n characters at s, all decimal digits, at most LONG_MAX: the API's rule for ids. */
static bool id_reference(const char *s, size_t n, long *out) {
    unsigned long long v = 0;
    if (n == 0) return false;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9') return false;
        unsigned d = (unsigned)(s[i] - '0');
        if (v > (LONG_MAX - d) / 10) return false;
        v = v * 10 + d;
    }
    *out = (long)v;
    return true;
}

/* The whole of s a decimal integer with an optional sign, in [min, max], as strtol reads it. */
static bool long_reference(const char *s, long min, long max, long *out) {
    const char *d = s + (*s == '+' || *s == '-');
    if (!*d || strspn(d, "0123456789") != strlen(d)) return false;
    errno = 0;
    long v = strtol(s, NULL, 10);
    if (errno == ERANGE || v < min || v > max) return false;
    *out = v;
    return true;
}

/* The rule td_jobs_file_path states: under checkpoints/, segments of [A-Za-z0-9._-], none empty
 * or starting with '.', at most 1024 characters. */
/* A path of segments of [A-Za-z0-9._-], none starting with '.' or empty: one the route may name
 * (under checkpoints/ or not: the other is forbidden, not malformed). */
static bool relative_reference(const char *rel) {
    size_t n = strlen(rel);
    if (n == 0 || n > 1024) return false;
    for (size_t i = 0; i < n; i++) {
        bool start = i == 0 || rel[i - 1] == '/';
        char c = rel[i];
        if (start && (c == '/' || c == '.')) return false;
        if (!(c == '/' || c == '.' || c == '_' || c == '-' || (c >= '0' && c <= '9') ||
              (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')))
            return false;
    }
    return rel[n - 1] != '/';
}

static void check_id(const char *s, size_t n) {
    long a = -1, b = -1;
    bool ok = td_api_parse_id(s, n, &a), want = id_reference(s, n, &b);
    FUZZ_CHECK(ok == want && (!ok || a == b), "id \"%.*s\": %d %ld, expected %d %ld", (int)n, s, ok,
               a, want, b);
}

/* A file the checkpoint route opened must be one of the checkpoint's own. */
static void check_open(const char *path, const char *name) {
    int fd = -1;
    long long size = 0;
    td_err err = {{0}};
    /* below the fuzz's directory, as the daemon reaches a job's own (td_jobfs.h) */
    td_job_files files = {.owner = TD_JOBFS_ANY_OWNER, .max_files = 100};
    snprintf(files.dir, sizeof files.dir, "%.*s", (int)(strrchr(path, '/') - path), path);
    if (td_checkpoint_open(&files, path, name, &fd, &size, &err) != 0) {
        FUZZ_CHECK(err.msg[0], "a refusal without a message");
        return;
    }
    struct stat st;
    FUZZ_CHECK(fstat(fd, &st) == 0 && S_ISREG(st.st_mode), "\"%s\" opened a non-file", name);
    bool ours = false;
    for (int i = 0; i < n_inside; i++) ours |= st.st_ino == inside[i];
    FUZZ_CHECK(ours, "\"%s\" in %s opened a file outside the checkpoint", name, path);
    close(fd);
}

static void check_job_path(const char *path) {
    const char *rest = strchr(path + 9, '/');
    check_id(path + 9, rest ? (size_t)(rest - path - 9) : strlen(path + 9));
    if (!rest || strncmp(rest, "/checkpoints/", 13) != 0) return;
    long step;
    const char *name;
    td_api_checkpoint_route r = td_api_parse_checkpoint_tail(rest + 13, &step, &name);
    if (r == TD_API_CKPT_FILE) {
        FUZZ_CHECK(name && name[0], "a file route without a name");
        check_open(checkpoint_dir, name);
        check_open(checkpoint_file, name);
    }
}

static void check_files_path(const char *path) {
    long job;
    const char *rel;
    if (!td_api_file_route_split(path, &job, &rel)) return;
    char where[PATH_MAX];
    td_reply_error e = {0};
    size_t n = strlen(rel);
    /* "a/" ends in an empty segment, which the rule refuses, but td_jobs_file_path (relative_ok
     * in service/jobs/td_jobs.c) takes it: harmless (no file is named by it; an upload fails to
     * rename onto the directory) and proposed to the lead as a fix; not compared here until
     * then (the input is corpus/http_path/crash-trailing-slash) */
    if (n > 1 && rel[n - 1] == '/' && rel[n - 2] != '/') return;
    for (int writing = 0; writing < 2; writing++) {
        td_job_files files;
        int rc = td_jobs_file_path(jobs, job, rel, writing, NULL, where, sizeof where, &files, &e);
        /* no job exists: a good path is a 404, a malformed one a 400, and one outside the
         * checkpoints a 403 (nodes exchange only those, cluster protocol 4) */
        bool good = relative_reference(rel);
        bool ours = strncmp(rel, "checkpoints/", 12) == 0 && rel[12];
        int want = !good ? 400 : !ours ? 403 : 404;
        FUZZ_CHECK(rc != 0 && e.status == want, "\"%s\": %d, expected %d", rel, e.status, want);
    }
}

static void check_query(char *query) {
    for (char *save = NULL, *kv = strtok_r(query, "&", &save); kv;
         kv = strtok_r(NULL, "&", &save)) {
        char *v = strchr(kv, '=');
        v = v ? v + 1 : kv;
        long a = 0, b = 0;
        static const long ranges[][2] = {{0, 1}, {1, 1000}, {0, 1 << 20}, {LONG_MIN, LONG_MAX}};
        for (size_t i = 0; i < sizeof ranges / sizeof ranges[0]; i++) {
            bool ok = td_parse_long(v, ranges[i][0], ranges[i][1], &a);
            bool want = long_reference(v, ranges[i][0], ranges[i][1], &b);
            FUZZ_CHECK(ok == want && (!ok || a == b),
                       "\"%s\" in [%ld, %ld]: %d %ld, expected %d %ld", v, ranges[i][0],
                       ranges[i][1], ok, a, want, b);
        }
        unsigned bit = td_jobs_state_bit(v);
        FUZZ_CHECK((bit & (bit - 1)) == 0, "state \"%s\" is several states (%#x)", v, bit);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!jobs) setup();
    char *url = fuzz_text(data, size);
    long after = 0, want = 0;
    bool ok = td_api_parse_last_event_id(url, &after);
    bool ref = id_reference(url, strlen(url), &want);
    FUZZ_CHECK(ok == ref && (!ok || after == want), "Last-Event-ID \"%s\": %d %ld", url, ok, after);
    char *query = strchr(url, '?');
    if (query) *query++ = 0;
    if (strncmp(url, "/v1/jobs/", 9) == 0) check_job_path(url);
    if (strncmp(url, "/v1/cluster/files/", 18) == 0) check_files_path(url);
    if (query) check_query(query);
    free(url);
    return 0;
}
