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
#include "service/jobs/td_jobs_private.h"

#include "service/run/td_checkpoint_files.h"
#include "base/td_sha256.h"
#include "base/td_strv.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <linux/fs.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
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

/* f's checkpoint at path as [{path: checkpoints/BASE[/NAME], size, sha256}]; NULL with err.
 * Every file is read through td_checkpoint_open (as the job, no link followed). */
static json_t *manifest(const td_job_files *f, const char *path, td_err *err) {
    td_checkpoint_file *list = NULL;
    int n = 0;
    if (td_checkpoint_list(f, path, &list, &n, err) != 0) return NULL; /* (a file: itself) */
    bool single = n == 1 && strcmp(list[0].name, base_of(path)) == 0;
    json_t *files = json_array();
    for (int i = 0; i < n && files; i++) {
        char rel[2 * PATH_MAX], hex[TD_SHA256_HEX];
        long long size = 0, expected;
        int fd;
        snprintf(rel, sizeof rel, "checkpoints/%s%s%s", base_of(path), single ? "" : "/",
                 single ? "" : list[i].name);
        int rc = td_checkpoint_open(f, path, list[i].name, &fd, &expected, err);
        if (rc == 0) {
            rc = td_sha256_fd(fd, list[i].name, hex, &size, err);
            close(fd);
        }
        if (rc != 0) {
            json_decref(files);
            files = NULL;
            break;
        }
        json_array_append_new(files, json_pack("{s:s, s:I, s:s}", "path", rel, "size",
                                               (json_int_t)size, "sha256", hex));
    }
    td_checkpoint_files_free(list, n);
    return files;
}

/* The bytes of src into fd: a clone where the filesystem shares blocks (FICLONE: btrfs, xfs),
 * else read and written; at most `size` of them (-1: to its end; else exactly that many). */
static int copy_bytes(int src, int fd, long long size, const char *name, td_err *err) {
    struct stat st;
    if (fstat(src, &st) == 0 && (size < 0 || (long long)st.st_size == size) &&
        ioctl(fd, FICLONE, src) == 0)
        return 0;
    enum { BUF = 1 << 20 };
    char *buf = td_malloc(BUF);
    off_t at = 0;
    int rc = 0;
    while (rc == 0 && (size < 0 || at < size)) {
        size_t want = size < 0 || size - at > BUF ? BUF : (size_t)(size - at);
        ssize_t got = pread(src, buf, want, at);
        if (got < 0 && errno == EINTR) continue;
        if (got == 0 && size < 0) break;
        if (got == 0)
            rc = td_fail(err, "%s is shorter than when it was opened", name);
        else if (got < 0 || write(fd, buf, (size_t)got) != got)
            rc = td_fail(err, "cannot copy into %s: %s", name, strerror(errno));
        at += got > 0 ? got : 0;
    }
    free(buf);
    return rc;
}

int td_jobs_copy_in(const td_identity *who, int src, int root, const char *rel, bool may_link,
                    long long size, td_err *err) {
    td_jobfs_put put;
    if (td_jobfs_put_begin(who, root, rel, "part", &put, err) != 0) return -1;
    char proc[64];
    snprintf(proc, sizeof proc, "/proc/self/fd/%d", src);
    td_identity_saved saved;
    bool linked = false;
    struct stat st;
    /* a link of another user's file would put a file that is not the job's in its tree */
    bool theirs = !who->drop || (fstat(src, &st) == 0 && st.st_uid == who->uid);
    if (may_link && theirs && td_identity_become(who, &saved, err) == 0) {
        unlinkat(put.dir, put.tmp, 0);
        linked = linkat(AT_FDCWD, proc, put.dir, put.tmp, AT_SYMLINK_FOLLOW) == 0;
        td_identity_return(&saved);
        if (!linked && td_identity_become(who, &saved, err) == 0) { /* made again */
            close(put.fd);
            put.fd = openat(put.dir, put.tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC,
                            0640);
            td_identity_return(&saved);
        }
    }
    if (linked) {
        close(put.fd);
        put.fd = -1;
        return td_jobfs_put_end(&put, true, err);
    }
    int rc = put.fd >= 0 ? copy_bytes(src, put.fd, size, put.tmp, err)
                         : td_fail(err, "cannot create %s: %s", put.tmp, strerror(errno));
    if (td_jobfs_put_end(&put, rc == 0, err) != 0) rc = -1;
    return rc;
}

/* f's checkpoint at src (files: its manifest) also in the directory dst_root of the job's (the
 * job's checkpoints/ or its own checkpoint.dir), under its name, file by file; a file already
 * there whole (the same SHA-256: shared storage, or an earlier copy) stays. */
static int place(const td_job_files *f, const char *src, const char *dst_root, json_t *files,
                 td_err *err) {
    int root = td_jobfs_open_path(&f->who, f->dir, dst_root, O_RDONLY | O_DIRECTORY, err);
    if (root < 0) return -1;
    size_t skip = strlen("checkpoints/");
    int rc = 0;
    size_t i;
    json_t *m;
    json_array_foreach(files, i, m) {
        const char *rel = json_string_value(json_object_get(m, "path"));
        const char *want = json_string_value(json_object_get(m, "sha256"));
        if (!rel || !want || strlen(rel) <= skip) {
            rc = td_fail(err, "a malformed manifest");
            break;
        }
        const char *below = rel + skip;                                   /* BASE[/NAME] */
        if (td_jobfs_has(&f->who, root, below, f->owner, want)) continue; /* the same file */
        const char *name = strchr(below, '/') ? strchr(below, '/') + 1 : below;
        int fd;
        long long size;
        if (td_checkpoint_open(f, src, name, &fd, &size, err) != 0) {
            rc = -1;
            break;
        }
        rc = td_jobs_copy_in(&f->who, fd, root, below, true, -1, err);
        close(fd);
        if (rc != 0) break;
    }
    close(root);
    return rc;
}

static int fail(td_jobs *j, job *jb, const char *what, const char *why) {
    char reason[800];
    snprintf(reason, sizeof reason, "could not start: its latest checkpoint (step %ld) %s: %.560s",
             jb->checkpoint_step, what, why);
    td_jobs_finish(j, jb, FAILED, -1, reason);
    return TD_RESUME_FAILED;
}

int td_jobs_resume_ready(td_jobs *j, job *jb, bool on_master) {
    if (!jb->checkpoint_path) return TD_RESUME_READY;
    if (jb->resume_error) return fail(j, jb, "cannot be read", jb->resume_error);
    if (jb->checkpoint_files && jb->checkpoint_placed) return TD_RESUME_READY;
    if (jb->checkpoint_files && jb->place_error) /* only the master's own ranks need that copy */
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
    if (!jb->checkpoint_path || jb->resume_error ||
        (jb->checkpoint_files && (jb->checkpoint_placed || jb->place_error)))
        return true;
    long id = jb->row.id, gen = jb->checkpoint_gen;
    char *path = td_str_dup(jb->checkpoint_path), dir[PATH_MAX], dst[2 * PATH_MAX + 8];
    json_t *files = jb->checkpoint_files ? json_incref(jb->checkpoint_files) : NULL;
    td_jobs_resume_dir(jb, dir, sizeof dir);
    snprintf(dst, sizeof dst, "%s%s%s", dir[0] == '/' ? "" : jb->dir, dir[0] == '/' ? "" : "/",
             dir);
    td_job_files f;
    td_runner_files_for(&j->runner, id, jb->row.uid, &f);
    td_identity who = td_jobs_identity(j, jb);
    char cwd[PATH_MAX + 16];
    td_err place_err = {{0}}, read_err = {{0}};
    /* its checkpoints/ (and work/) made the job's, as an attempt makes them */
    bool ready = td_runner_work_dir(&who, jb->dir, cwd, sizeof cwd, &place_err) == 0;
    jb->resume_busy = true; /* td_jobs_delete waits: the copy may go into the job's directory */
    pthread_mutex_unlock(&j->mu);
    if (ready && dir[0] == '/') ready = td_jobfs_mkdir_path(&who, dst, &place_err) == 0;
    json_t *made = files ? NULL : manifest(&f, path, &read_err);
    int placed =
        (files || made) && ready ? place(&f, path, dst, files ? files : made, &place_err) : -1;
    td_jobs_lock(j);
    jb = td_jobs_find(j, id);
    if (jb) jb->resume_busy = false;
    pthread_cond_broadcast(&j->changed);
    /* only what is still the job's latest checkpoint: a newer one may have been registered
     * meanwhile, even under the same path */
    if (jb && jb->checkpoint_path && jb->checkpoint_gen == gen) {
        if (made && !jb->checkpoint_files) jb->checkpoint_files = json_incref(made);
        if (!files && !made) {
            jb->resume_error = td_str_dup(read_err.msg);
            td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(id), "job %ld: its checkpoint %s: %s", id,
                      path, read_err.msg);
        } else if (placed != 0) {
            jb->place_error = td_str_dup(place_err.msg);
            td_log_at(j->log, TD_LOG_WARNING, TD_LOG_JOB(id), "job %ld: its checkpoint %s: %s", id,
                      path, place_err.msg);
        } else {
            jb->checkpoint_placed = true;
        }
    }
    json_decref(made);
    json_decref(files);
    free(path);
    return true;
}

void *td_jobs_resumer(void *arg) {
    td_jobs *j = arg;
    td_jobs_lock(j);
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
    if (!jb->checkpoint_path || !jb->checkpoint_files) return NULL;
    char dir[PATH_MAX];
    td_jobs_resume_dir(jb, dir, sizeof dir);
    return json_pack("{s:I, s:O, s:s, s:s}", "step", (json_int_t)jb->checkpoint_step, "files",
                     jb->checkpoint_files, "dir", dir, "base", base_of(jb->checkpoint_path));
}
