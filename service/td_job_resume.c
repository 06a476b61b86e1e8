/* What an attempt across nodes resumes from: the latest checkpoint, listed with each file's size
 * and SHA-256 (what a node checks a fetched copy against), and put where the job's ranks look for
 * it. That place is the same on every node: a train job's checkpoint.dir (traind-worker resumes
 * from the newest checkpoint there), or for a command the job's checkpoints/ directory, which
 * TRAIND_LATEST_CHECKPOINT names. Agents fetch it there before their ranks start (td_agent.c);
 * the master's own node gets a copy here when the checkpoint lies elsewhere on it (an agent's
 * upload lands in the job's checkpoints/, a custom checkpoint.dir is elsewhere).
 *
 * Hashing and copying a checkpoint of gigabytes takes seconds, so a thread of its own does it
 * with the jobs' lock released (td_jobs_resumer): the supervisor, the API and the heartbeats
 * never wait for it, and the attempt starts once it is done. */
#include "service/td_jobs_private.h"

#include "service/td_ckpt.h"
#include "service/td_sha256.h"
#include "service/td_strv.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void td_jobs_resume_dir(const job *jb, char *out, size_t len) {
    snprintf(out, len, "checkpoints");
    if (strcmp(jb->row.kind, "command") == 0) return;
    char path[PATH_MAX + 16], ours[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/spec.json", jb->dir);
    snprintf(ours, sizeof ours, "%s/checkpoints", jb->dir);
    json_t *spec = json_load_file(path, 0, NULL);
    const char *dir =
        json_string_value(json_object_get(json_object_get(spec, "checkpoint"), "dir"));
    if (dir && dir[0] == '/' && strcmp(dir, ours) != 0) snprintf(out, len, "%s", dir);
    json_decref(spec);
}

static const char *base_of(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

/* The checkpoint at path as [{path: checkpoints/BASE[/NAME], size, sha256}]; NULL with err. */
static json_t *manifest(const char *path, uid_t owner, td_err *err) {
    struct stat st;
    if (stat(path, &st) != 0) {
        td_fail(err, "%s: %s", path, strerror(errno));
        return NULL;
    }
    td_ckpt_file *list = NULL;
    int n = 0;
    bool dir = S_ISDIR(st.st_mode);
    if (td_ckpt_list(path, owner, &list, &n, err) != 0) return NULL; /* (a file: itself) */
    json_t *files = json_array();
    for (int i = 0; i < n; i++) {
        char file[2 * PATH_MAX], rel[2 * PATH_MAX], hex[TD_SHA256_HEX];
        long long size = 0;
        snprintf(file, sizeof file, "%s%s%s", path, dir ? "/" : "", dir ? list[i].name : "");
        snprintf(rel, sizeof rel, "checkpoints/%s%s%s", base_of(path), dir ? "/" : "",
                 dir ? list[i].name : "");
        if (td_sha256_file(file, hex, &size, err) != 0) {
            json_decref(files);
            files = NULL;
            break;
        }
        json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", rel, "size",
                                               (json_int_t)size, "sha256", hex));
    }
    td_ckpt_files_free(list, n);
    return files;
}

/* mkdir -p of path's parent directories. */
static int make_parents(const td_jobs *j, char *path, td_err *err) {
    for (char *p = path + 1; (p = strchr(p, '/')); p++) {
        *p = 0;
        bool made = mkdir(path, 0750) == 0;
        if (made) td_jobs_give(j, path); /* what the daemon made, never what was there */
        int rc = made || errno == EEXIST ? 0 : -1;
        if (rc != 0) td_fail(err, "cannot create %s: %s", path, strerror(errno));
        *p = '/';
        if (rc != 0) return -1;
    }
    return 0;
}

/* src to dst through dst.part: a hard link where both lie on one filesystem (no bytes move),
 * else a copy that is synced before it takes the name. */
static int copy_file(const char *src, const char *dst, td_err *err) {
    char tmp[3 * PATH_MAX + 8];
    snprintf(tmp, sizeof tmp, "%s.part", dst);
    unlink(tmp);
    if (link(src, tmp) != 0) {
        int in = open(src, O_RDONLY | O_CLOEXEC);
        int out = in < 0 ? -1 : open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0640);
        if (in < 0 || out < 0) {
            int e = errno;
            if (in >= 0) close(in);
            return td_fail(err, "cannot copy %s to %s: %s", src, tmp, strerror(e));
        }
        enum { BUF = 1 << 20 };
        char *buf = td_malloc(BUF);
        ssize_t got;
        int rc = 0;
        while (rc == 0 && (got = read(in, buf, BUF)) != 0) {
            if (got < 0 && errno == EINTR) continue;
            if (got < 0 || write(out, buf, (size_t)got) != got) rc = -1;
        }
        if (rc == 0 && fsync(out) != 0) rc = -1;
        int e = errno;
        free(buf);
        close(in);
        if (close(out) != 0 && rc == 0) rc = -1, e = errno;
        if (rc != 0) {
            unlink(tmp);
            return td_fail(err, "cannot copy %s to %s: %s", src, tmp, strerror(e));
        }
    }
    if (rename(tmp, dst) != 0) {
        int e = errno;
        unlink(tmp);
        return td_fail(err, "cannot rename %s: %s", tmp, strerror(e));
    }
    return 0;
}

/* The checkpoint at dst (files: its manifest, skip: the length of its names' prefix) made the
 * job's user's. An agent's upload lands where the master's own ranks look (the job's
 * checkpoints/), written by the daemon (root's, 0600): ranks running as run_as could not read
 * it, and traind-worker then resumed from an older checkpoint of its own while the other nodes'
 * ranks resumed from this one (found by chaos.py: the ranks diverged, and the job spent its
 * restarts). */
static void give_all(const td_jobs *j, const char *dst, json_t *files, size_t skip) {
    td_jobs_give(j, dst);
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        const char *rel = json_string_value(json_object_get(f, "path"));
        char to[3 * PATH_MAX];
        if (rel && strlen(rel) > skip &&
            snprintf(to, sizeof to, "%s%s", dst, rel + skip) < (int)sizeof to)
            td_jobs_give(j, to);
    }
}

/* The checkpoint at src (files: its manifest) also at dst, file by file; a file already there
 * whole (the same SHA-256: shared storage, or an earlier copy) stays. */
static int place(const td_jobs *j, const char *src, const char *dst, json_t *files, td_err *err) {
    char a[PATH_MAX], b[PATH_MAX];
    size_t skip = strlen("checkpoints/") + strlen(base_of(src));
    if (realpath(src, a) && realpath(dst, b) && strcmp(a, b) == 0) {
        give_all(j, dst, files, skip); /* already where the ranks look */
        return 0;
    }
    size_t i;
    json_t *f;
    json_array_foreach(files, i, f) {
        const char *rel = json_string_value(json_object_get(f, "path"));
        const char *want = json_string_value(json_object_get(f, "sha256"));
        if (!rel || !want || strlen(rel) < skip) return td_fail(err, "a malformed manifest");
        char from[3 * PATH_MAX], to[3 * PATH_MAX], hex[TD_SHA256_HEX];
        long long size;
        td_err ignored = {{0}};
        if (snprintf(from, sizeof from, "%s%s", src, rel + skip) >= (int)sizeof from ||
            snprintf(to, sizeof to, "%s%s", dst, rel + skip) >= (int)sizeof to)
            return td_fail(err, "a path longer than %d bytes under %s", (int)sizeof to, dst);
        if (td_sha256_file(to, hex, &size, &ignored) == 0 && strcmp(hex, want) == 0) continue;
        if (make_parents(j, to, err) != 0 || copy_file(from, to, err) != 0) return -1;
        td_jobs_give(j, to);
    }
    return 0;
}

static int fail(td_jobs *j, job *jb, const char *what, const char *why) {
    char reason[800];
    snprintf(reason, sizeof reason, "could not start: its latest checkpoint (step %ld) %s: %.560s",
             jb->ckpt_step, what, why);
    td_jobs_finish(j, jb, FAILED, -1, reason);
    return TD_RESUME_FAILED;
}

int td_jobs_resume_ready(td_jobs *j, job *jb, bool on_master) {
    if (!jb->ckpt_path) return TD_RESUME_READY;
    if (jb->resume_error) return fail(j, jb, "cannot be read", jb->resume_error);
    if (jb->ckpt_files && jb->ckpt_placed) return TD_RESUME_READY;
    if (jb->ckpt_files && jb->place_error) /* only the master's own ranks need that copy */
        return on_master ? fail(j, jb, "cannot be put where this node's ranks look for it",
                                jb->place_error)
                         : TD_RESUME_READY;
    if (!jb->resume_wanted) {
        jb->resume_wanted = true;
        pthread_cond_signal(&j->resume_wake);
    }
    return TD_RESUME_WAIT;
}

/* One checkpoint asked for, listed and placed; false when none is asked for. The lock is held
 * on entry and on return, released while files are read and copied. */
static bool prepare_one(td_jobs *j) {
    job *jb = NULL;
    for (int i = 0; i < j->n_jobs && !jb; i++)
        if (j->jobs[i]->resume_wanted) jb = j->jobs[i];
    if (!jb) return false;
    jb->resume_wanted = false;
    if (!jb->ckpt_path || jb->resume_error ||
        (jb->ckpt_files && (jb->ckpt_placed || jb->place_error)))
        return true;
    long id = jb->row.id, gen = jb->ckpt_gen;
    char *path = td_str_dup(jb->ckpt_path), dir[PATH_MAX], dst[2 * PATH_MAX + 8];
    json_t *files = jb->ckpt_files ? json_incref(jb->ckpt_files) : NULL;
    td_jobs_resume_dir(jb, dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s%s%s/%s", dir[0] == '/' ? "" : jb->dir, dir[0] == '/' ? "" : "/",
             dir, base_of(path));
    jb->resume_busy = true; /* td_jobs_delete waits: the copy may go into the job's directory */
    pthread_mutex_unlock(&j->mu);
    td_err read_err = {{0}}, place_err = {{0}};
    json_t *made = files ? NULL : manifest(path, td_jobs_files_owner(j), &read_err);
    int placed = files || made ? place(j, path, dst, files ? files : made, &place_err) : -1;
    pthread_mutex_lock(&j->mu);
    jb = td_jobs_find(j, id);
    if (jb) jb->resume_busy = false;
    pthread_cond_broadcast(&j->changed);
    /* only what is still the job's latest checkpoint: a newer one may have been registered
     * meanwhile, even under the same path */
    if (jb && jb->ckpt_path && jb->ckpt_gen == gen) {
        if (made && !jb->ckpt_files) jb->ckpt_files = json_incref(made);
        if (!files && !made) {
            jb->resume_error = td_str_dup(read_err.msg);
            td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(id), "job %ld: its checkpoint %s: %s", id,
                      path, read_err.msg);
        } else if (placed != 0) {
            jb->place_error = td_str_dup(place_err.msg);
            td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(id), "job %ld: its checkpoint %s: %s", id,
                      path, place_err.msg);
        } else {
            jb->ckpt_placed = true;
        }
    }
    json_decref(made);
    json_decref(files);
    free(path);
    return true;
}

void *td_jobs_resumer(void *arg) {
    td_jobs *j = arg;
    pthread_mutex_lock(&j->mu);
    while (!j->stopping) {
        if (prepare_one(j)) {
            td_jobs_wake(j); /* the supervisor starts the attempt on its next turn */
            continue;
        }
        pthread_cond_wait(&j->resume_wake, &j->mu);
    }
    pthread_mutex_unlock(&j->mu);
    return NULL;
}

json_t *td_jobs_resume_order(const job *jb) {
    if (!jb->ckpt_path || !jb->ckpt_files) return NULL;
    char dir[PATH_MAX];
    td_jobs_resume_dir(jb, dir, sizeof dir);
    return json_pack("{s:I, s:O, s:s, s:s}", "step", (json_int_t)jb->ckpt_step, "files",
                     jb->ckpt_files, "dir", dir, "base", base_of(jb->ckpt_path));
}

void td_jobs_resume_forget(job *jb) {
    json_decref(jb->ckpt_files);
    jb->ckpt_files = NULL;
    jb->ckpt_placed = false;
    free(jb->resume_error);
    jb->resume_error = NULL;
    free(jb->place_error);
    jb->place_error = NULL;
}
