/* The agent's mover thread: the checkpoints rank 0 wrote on this node go up to the master, and
 * those a part resumes from come down before it starts, every file as the job, checked by
 * size and SHA-256. Apart from the agent thread so that heartbeats never wait for a transfer (a
 * node whose heartbeats stopped for a big checkpoint would be marked lost). */
#include "service/agent/td_agent_private.h"

#include "base/td_clock.h"
#include "service/run/td_checkpoint_files.h"
#include "service/run/td_jobfs.h"
#include "base/td_log.h"
#include "base/td_sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Uploads file `name` of f's checkpoint at checkpoint as rel; its manifest entry in files. The file
 * is opened as the job, without following a link (td_checkpoint_open), and hashed and sent from
 * that one descriptor: what the job swaps in under the name meanwhile is never read. */
static int upload_file(td_agent *a, long job, const td_job_files *f, const char *checkpoint,
                       const char *name, const char *rel, json_t *files) {
    char hex[TD_SHA256_HEX], why[512] = "";
    long long size = 0;
    int fd = -1;
    td_err err = {{0}};
    if (td_checkpoint_open(f, checkpoint, name, &fd, &size, &err) != 0 ||
        td_sha256_fd(fd, name, hex, &size, &err) != 0) {
        td_log_at(a->cfg.log, TD_LOG_WARNING, TD_LOG_JOB(job),
                  "job %ld: cannot upload its checkpoint: %s", job, err.msg);
        if (fd >= 0) close(fd);
        return -3; /* not a file of the job's: never sent */
    }
    FILE *in = fdopen(fd, "rb");
    if (!in) {
        close(fd);
        return -1;
    }
    char url[4600];
    snprintf(url, sizeof url, "%s/%ld/%.4000s?sha256=%s", a->url_files, job, rel, hex);
    long status = td_agent_transfer(a, url, in, size, true, why, sizeof why);
    fclose(in);
    if (status >= 400 && status < 500 && status != 401 && status != 408 && status != 429) {
        /* the master will never take it (a name it refuses): announce the checkpoint without
         * it, so the master registers nothing rather than waiting for ever */
        td_log_at(a->cfg.log, TD_LOG_WARNING, TD_LOG_JOB(job),
                  "job %ld: the master refused %s (%s); its checkpoint stays here only", job, rel,
                  why);
        return -2;
    }
    if (status != 200) {
        td_log_at(a->cfg.log, TD_LOG_WARNING, TD_LOG_JOB(job),
                  "job %ld: uploading %s to the master failed (%s); retrying", job, rel, why);
        return -1;
    }
    json_array_append_new(
        files, json_pack("{s:s, s:I, s:s}", "path", rel, "size", (json_int_t)size, "sha256", hex));
    return 0;
}

/* Every checkpoint rank 0 wrote here that the master does not have yet: its files go up before
 * the line that announces it. False when an upload failed (tried again next time). */
static bool upload_checkpoints(td_agent *a) {
    long job, seq;
    int attempt;
    char path[4096];
    td_job_files f;
    while (td_jobs_node_parts_next_upload(a->jobs, &job, &attempt, &seq, path, sizeof path, &f)) {
        const char *slash = strrchr(path, '/');
        const char *base = slash ? slash + 1 : path;
        json_t *files = json_array();
        td_checkpoint_file *list = NULL;
        int n = 0;
        td_err err = {{0}};
        int rc = td_checkpoint_list(&f, path, &list, &n, &err);
        bool single = rc == 0 && n == 1 && strcmp(list[0].name, base) == 0;
        if (rc != 0) { /* gone, or not the job's own: announced without files (registers
                        * nothing), never tried again: a job could hold its lines for ever */
            td_log_at(a->cfg.log, TD_LOG_WARNING, TD_LOG_JOB(job),
                      "job %ld: its checkpoint %s is not sent to the master: %s", job, path,
                      err.msg);
            rc = -3;
        }
        for (int i = 0; rc == 0 && i < n; i++) {
            char rel[4400];
            snprintf(rel, sizeof rel, "checkpoints/%s%s%s", base, single ? "" : "/",
                     single ? "" : list[i].name);
            rc = upload_file(a, job, &f, path, list[i].name, rel, files);
        }
        td_checkpoint_files_free(list, n);
        if (rc != 0 && rc != -1) { /* announced without files: not registered */
            json_decref(files);
            files = json_array();
            rc = 0;
        }
        if (rc != 0) {
            json_decref(files);
            return false;
        }
        td_jobs_node_parts_uploaded(a->jobs, job, attempt, seq, files);
        json_decref(files);
    }
    return true;
}

/* One file of the order into the directory open at root as the job (below: its path there),
 * made aside and kept only when its SHA-256 is want's. NULL, or why not. */
static const char *fetch_file(td_agent *a, const td_identity *who, int root, long job,
                              const char *rel, const char *below, const char *want, char *why,
                              size_t why_len) {
    td_jobfs_put put;
    td_err err = {{0}};
    char suffix[96];
    snprintf(suffix, sizeof suffix, "part-%s", a->name); /* shared storage: per node */
    if (td_jobfs_put_begin(who, root, below, suffix, &put, &err) != 0) {
        snprintf(why, why_len, "%.700s", err.msg);
        return why;
    }
    int copy = dup(put.fd);
    FILE *out = copy >= 0 ? fdopen(copy, "wb") : NULL;
    char url[8500], failure[512] = "", hex[TD_SHA256_HEX];
    snprintf(url, sizeof url, "%s/%ld/%s", a->url_files, job, rel);
    long status = out ? td_agent_transfer(a, url, out, 0, false, failure, sizeof failure) : 0;
    const char *wrong = NULL;
    if (!out)
        wrong = strerror(errno);
    else if (fclose(out) != 0)
        wrong = strerror(errno);
    else if (status != 200)
        wrong = failure;
    if (!out && copy >= 0) close(copy);
    if (!wrong) { /* what was written, read back as the job from the file itself */
        int in = td_jobfs_openat(who, put.dir, put.tmp, O_RDONLY, 0, &err);
        if (in < 0 || td_sha256_fd(in, put.tmp, hex, NULL, &err) != 0)
            wrong = err.msg;
        else if (strcmp(hex, want) != 0)
            wrong = "its SHA-256 differs";
        if (in >= 0) close(in);
    }
    if (td_jobfs_put_end(&put, !wrong, &err) != 0 && !wrong) wrong = err.msg;
    if (!wrong) return NULL;
    snprintf(why, why_len, "fetching %.300s from the master: %.300s", rel, wrong);
    return why;
}

/* Fetches the checkpoint a part resumes from to where the part's ranks look for it (the job's
 * checkpoints/ here, or a train job's own checkpoint.dir), each file checked by size and SHA-256
 * (a file already there and whole is kept: an earlier fetch, or shared storage). Everything is
 * written as the job (its uid from the order), beneath that place, never through a link the job
 * planted (td_jobfs.h). False with why. */
static bool fetch_checkpoint(td_agent *a, long job, long uid, json_t *resume, int *fetched,
                             char *why, size_t why_len) {
    *fetched = 0;
    const char *dir = json_string_value(json_object_get(resume, "dir"));
    if (!dir || !*dir || strstr(dir, "..")) {
        snprintf(why, why_len, "the master's order names no place for the checkpoint");
        return false;
    }
    td_job_files f;
    td_err err = {{0}};
    if (td_jobs_order_files(a->jobs, job, uid, &f, &err) != 0) {
        snprintf(why, why_len, "%.700s", err.msg);
        return false;
    }
    char root_path[2 * PATH_MAX];
    int n = dir[0] == '/' ? snprintf(root_path, sizeof root_path, "%s", dir)
                          : snprintf(root_path, sizeof root_path, "%s/%s", f.dir, dir);
    if (n < 0 || n >= (int)sizeof root_path) {
        snprintf(why, why_len, "the checkpoint's place here is too long a path");
        return false;
    }
    if (dir[0] == '/' && td_jobfs_mkdir_path(&f.who, root_path, &err) != 0) {
        snprintf(why, why_len, "%.700s", err.msg);
        return false;
    }
    int root = td_jobfs_open_path(&f.who, f.dir, root_path, O_RDONLY | O_DIRECTORY, &err);
    if (root < 0) {
        snprintf(why, why_len, "%.700s", err.msg);
        return false;
    }
    bool ok = true;
    size_t i;
    json_t *file;
    json_array_foreach(json_object_get(resume, "files"), i, file) {
        const char *rel = json_string_value(json_object_get(file, "path"));
        const char *want = json_string_value(json_object_get(file, "sha256"));
        static const char PREFIX[] = "checkpoints/";
        if (!rel || !want || strncmp(rel, PREFIX, strlen(PREFIX)) != 0) {
            snprintf(why, why_len, "a malformed file in the master's order: %.200s",
                     rel ? rel : "(no path)");
            ok = false;
            break;
        }
        const char *below = rel + strlen(PREFIX);
        if (td_jobfs_has(&f.who, root, below, f.owner, want)) continue;
        if (fetch_file(a, &f.who, root, job, rel, below, want, why, why_len)) {
            ok = false;
            break;
        }
        ++*fetched;
    }
    close(root);
    return ok;
}

/* The master's orders, less the parts whose checkpoint the mover has not fetched yet (they
 * start after a later exchange), applied. */
void td_agent_take_orders(td_agent *a, json_t *orders) {
    if (!json_is_array(orders)) orders = NULL;
    json_t *ready = json_array();
    size_t i;
    json_t *o;
    json_array_foreach(orders, i, o) {
        long job = (long)json_integer_value(json_object_get(o, "job"));
        int attempt = (int)json_integer_value(json_object_get(o, "attempt"));
        json_t *resume = json_object_get(o, "resume");
        if (!json_is_true(json_object_get(o, "stop")) && json_is_object(resume) &&
            !td_jobs_node_part_known(a->jobs, job, attempt)) {
            char key[48];
            snprintf(key, sizeof key, "%ld/%d", job, attempt);
            pthread_mutex_lock(&a->mu);
            json_t *f = json_object_get(a->fetches, key);
            bool fetched = f && json_is_true(json_object_get(f, "ready"));
            double since = json_number_value(json_object_get(f, "failing_since"));
            const char *error = json_string_value(json_object_get(f, "error"));
            if (!fetched && error && since > 0 && td_clock_now() - since >= a->fetch_limit_s) {
                /* the part starts only to fail at once, saying why: the master ends the
                 * attempt and restarts the job under its policy instead of waiting for ever */
                char why[800];
                snprintf(why, sizeof why,
                         "its checkpoint (step %ld) could not be fetched from the master for "
                         "%.0f s: %.600s",
                         (long)json_integer_value(json_object_get(resume, "step")),
                         td_clock_now() - since, error);
                json_t *failed = json_deep_copy(o);
                json_object_set_new(failed, "fetch_error", json_string(why));
                json_array_append_new(ready, failed);
                pthread_mutex_unlock(&a->mu);
                continue;
            }
            if (!f) {
                json_object_set_new(a->fetches, key,
                                    json_pack("{s:I, s:I, s:O, s:b}", "job", (json_int_t)job, "uid",
                                              json_integer_value(json_object_get(o, "uid")),
                                              "resume", resume, "ready", false));
                pthread_cond_broadcast(&a->moved);
            }
            pthread_mutex_unlock(&a->mu);
            if (!fetched) continue;
        }
        json_array_append(ready, o);
    }
    td_jobs_node_parts_apply_locked(a->jobs, ready);
    json_decref(ready);
    /* fetches of parts that started, or that the master no longer orders, are done with */
    pthread_mutex_lock(&a->mu);
    const char *key;
    json_t *f, *tmp;
    json_object_foreach_safe(a->fetches, tmp, key, f) {
        bool ordered = false;
        json_array_foreach(orders, i, o) {
            char k[48];
            snprintf(k, sizeof k, "%ld/%d", (long)json_integer_value(json_object_get(o, "job")),
                     (int)json_integer_value(json_object_get(o, "attempt")));
            ordered |= strcmp(k, key) == 0 && !json_is_true(json_object_get(o, "stop"));
        }
        if (!ordered) json_object_del(a->fetches, key);
    }
    pthread_mutex_unlock(&a->mu);
}

/* The mover: uploads the checkpoints rank 0 wrote here, fetches the ones parts resume from. */
void *td_agent_mover_loop(void *arg) {
    td_agent *a = arg;
    pthread_mutex_lock(&a->mu);
    while (!a->stopping) {
        json_t *todo = json_array();
        const char *key;
        json_t *f;
        json_object_foreach(a->fetches, key, f) if (!json_is_true(json_object_get(f, "ready")))
            json_array_append_new(todo, json_pack("{s:s, s:O}", "key", key, "fetch", f));
        pthread_mutex_unlock(&a->mu);
        upload_checkpoints(a);
        size_t i;
        json_t *t;
        json_array_foreach(todo, i, t) {
            json_t *fe = json_object_get(t, "fetch");
            long job = (long)json_integer_value(json_object_get(fe, "job"));
            const char *key = json_string_value(json_object_get(t, "key"));
            char why[800] = "";
            int fetched = 0;
            /* a fetch under way is not failing, however long it takes */
            pthread_mutex_lock(&a->mu);
            json_t *now = json_object_get(a->fetches, key);
            if (now) json_object_del(now, "error");
            pthread_mutex_unlock(&a->mu);
            long uid = (long)json_integer_value(json_object_get(fe, "uid"));
            bool ok = fetch_checkpoint(a, job, uid, json_object_get(fe, "resume"), &fetched, why,
                                       sizeof why);
            pthread_mutex_lock(&a->mu);
            now = json_object_get(a->fetches, key);
            if (now && ok) {
                json_object_set_new(now, "ready", json_true());
            } else if (now) { /* tried again next turn; failing for too long without a file
                                 arriving fails the part */
                if (!json_object_get(now, "failing_since") || fetched > 0)
                    json_object_set_new(now, "failing_since", json_real(td_clock_now()));
                const char *before = json_string_value(json_object_get(now, "logged"));
                if (!before || strcmp(before, why) != 0) /* once per new reason */
                    td_log_at(a->cfg.log, TD_LOG_INFO, TD_LOG_JOB(job),
                              "job %ld: %s; the part waits", job, why);
                json_object_set_new(now, "logged", json_string(why));
                json_object_set_new(now, "error", json_string(why));
            }
            pthread_mutex_unlock(&a->mu);
        }
        json_decref(todo);
        pthread_mutex_lock(&a->mu);
        if (a->stopping) break;
        struct timespec ts;
        td_clock_deadline(&ts, BUSY_INTERVAL_S);
        pthread_cond_timedwait(&a->moved, &a->mu, &ts);
    }
    pthread_mutex_unlock(&a->mu);
    return NULL;
}
