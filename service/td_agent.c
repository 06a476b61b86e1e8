/* The agent thread (td_agent.h): register, heartbeat, retry, over libcurl. */
#include "service/td_agent.h"

#include "base/td_clock.h"
#include "dist/td_net.h"
#include "base/td_buf.h"
#include "base/td_log.h"
#include "service/td_ckpt.h"
#include "service/td_cluster.h" /* TD_CLUSTER_PROTOCOL */
#include "service/td_jobfs.h"
#include "service/td_jobs.h"
#include "base/td_sha256.h"

#include <curl/curl.h>
#include <jansson.h>
#include <pthread.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <string.h>
#include <unistd.h>

enum { BACKOFF_MAX_S = 10 };
/* how often a node running parts talks to its master: their lines and exits go up, stop orders
 * come down, within this */
static const double BUSY_INTERVAL_S = 0.25;

struct td_agent {
    td_agent_config cfg;
    char master[256], secret[256], name[64], node_id[65], address[64], version[32];
    char url_register[320], url_heartbeat[320], url_files[320], auth[300], state_dir[4096];
    /* "Authorization: Node NAME:CREDENTIAL": what the master gave at the last registration,
     * for heartbeats and files ("" until it registered); the secret (auth) only registers */
    char node_auth[200];
    char tls_ca[4096];            /* "": plain HTTP to the master */
    td_node_gpu gpu[TD_GPUS_MAX]; /* cfg.gpus of them (cfg.gpu is the caller's) */
    pthread_mutex_t mu;
    pthread_cond_t wake; /* monotonic clock */
    pthread_t thread, mover;
    bool started, stopping, refused;
    /* checkpoints to fetch before a part starts, by "job/attempt": {"job", "resume", "ready"};
     * the mover thread moves files so that heartbeats never wait for a transfer (a node whose
     * heartbeats stopped for a big checkpoint would be marked lost) */
    json_t *fetches;
    pthread_cond_t moved;
    double fetch_limit_s; /* how long a failing fetch may go on: the master's node timeout */
    td_jobs *jobs;
};

static size_t collect(char *p, size_t size, size_t n, void *ctx) {
    td_buf_append(ctx, p, size * n);
    return size * n;
}

/* Runs request h (its own options set; NULL when curl_easy_init failed) to url with the cluster
 * secret and hdr's headers, then frees both: the HTTP status, 0 when no answer came (with why). */
static long perform(td_agent *a, CURL *h, const char *url, struct curl_slist *hdr, char *why,
                    size_t why_len) {
    if (!h) {
        curl_slist_free_all(hdr);
        snprintf(why, why_len, "curl_easy_init failed");
        return 0;
    }
    /* the shared secret goes to registration only: everything else carries the node's own */
    if (strcmp(url, a->url_register) == 0) {
        hdr = curl_slist_append(hdr, a->auth);
    } else {
        char node_auth[sizeof a->node_auth];
        pthread_mutex_lock(&a->mu);
        snprintf(node_auth, sizeof node_auth, "%s", a->node_auth);
        pthread_mutex_unlock(&a->mu);
        hdr = curl_slist_append(hdr, node_auth);
        explicit_bzero(node_auth, sizeof node_auth);
    }
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* a thread of a daemon: no SIGALRM */
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    if (a->tls_ca[0]) { /* the master is trusted for what this CA signed, nothing else */
        curl_easy_setopt(h, CURLOPT_CAINFO, a->tls_ca);
        curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    }
    long status = 0;
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else
        snprintf(why, why_len, "%s", err[0] ? err : curl_easy_strerror(rc));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return status;
}

/* POSTs body to url; the HTTP status (0 when no answer came, with why) and the reply. */
static long post(td_agent *a, const char *url, const char *body, td_buf *reply, char *why,
                 size_t why_len) {
    CURL *h = curl_easy_init();
    if (h) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, reply);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    }
    return perform(a, h, url, curl_slist_append(NULL, "Content-Type: application/json"), why,
                   why_len);
}

/* Moves one file to or from the master (PUT when up); the HTTP status, 0 with why when none
 * came, and the master's words when it is not 200. */
static long transfer(td_agent *a, const char *url, FILE *f, long long size, bool up, char *why,
                     size_t why_len) {
    CURL *h = curl_easy_init();
    td_buf reply = {0};
    if (h) {
        /* a slow link moves big checkpoints: give up only when it stalls */
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 10L);
        if (up) {
            curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(h, CURLOPT_READDATA, f);
            curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)size);
            curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
            curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
        } else {
            curl_easy_setopt(h, CURLOPT_WRITEDATA, f); /* libcurl's default writer: fwrite */
        }
    }
    long status = perform(a, h, url, NULL, why, why_len);
    if (status != 0 && status != 200)
        snprintf(why, why_len, "HTTP %ld: %.300s", status, reply.data ? reply.data : "");
    td_buf_free(&reply);
    return status;
}

/* Uploads file `name` of f's checkpoint at ckpt as rel; its manifest entry in files. The file is
 * opened as the job, without following a link (td_ckpt_open), and hashed and sent from that one
 * descriptor: what the job swaps in under the name meanwhile is never read. */
static int upload_file(td_agent *a, long job, const td_job_files *f, const char *ckpt,
                       const char *name, const char *rel, json_t *files) {
    char hex[TD_SHA256_HEX], why[512] = "";
    long long size = 0;
    int fd = -1;
    td_err err = {{0}};
    if (td_ckpt_open(f, ckpt, name, &fd, &size, &err) != 0 ||
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
    long status = transfer(a, url, in, size, true, why, sizeof why);
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
    while (td_jobs_guests_next_upload(a->jobs, &job, &attempt, &seq, path, sizeof path, &f)) {
        const char *slash = strrchr(path, '/');
        const char *base = slash ? slash + 1 : path;
        json_t *files = json_array();
        td_ckpt_file *list = NULL;
        int n = 0;
        td_err err = {{0}};
        int rc = td_ckpt_list(&f, path, &list, &n, &err);
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
        td_ckpt_files_free(list, n);
        if (rc != 0 && rc != -1) { /* announced without files: not registered */
            json_decref(files);
            files = json_array();
            rc = 0;
        }
        if (rc != 0) {
            json_decref(files);
            return false;
        }
        td_jobs_guests_uploaded(a->jobs, job, attempt, seq, files);
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
    long status = out ? transfer(a, url, out, 0, false, failure, sizeof failure) : 0;
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
static void take_orders(td_agent *a, json_t *orders) {
    if (!json_is_array(orders)) orders = NULL;
    json_t *ready = json_array();
    size_t i;
    json_t *o;
    json_array_foreach(orders, i, o) {
        long job = (long)json_integer_value(json_object_get(o, "job"));
        int attempt = (int)json_integer_value(json_object_get(o, "attempt"));
        json_t *resume = json_object_get(o, "resume");
        if (!json_is_true(json_object_get(o, "stop")) && json_is_object(resume) &&
            !td_jobs_guest_known(a->jobs, job, attempt)) {
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
    td_jobs_guests_apply_locked(a->jobs, ready);
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
static void *mover_loop(void *arg) {
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

/* The "message" of the master's JSON error, or the reply itself; its "code" in code. */
static void error_message(const td_buf *reply, char *out, size_t len, char *code, size_t code_len) {
    json_t *o = reply->data ? json_loads(reply->data, 0, NULL) : NULL;
    json_t *e = json_object_get(o, "error");
    const char *m = json_string_value(json_object_get(e, "message"));
    const char *c = json_string_value(json_object_get(e, "code"));
    snprintf(out, len, "%s", m ? m : reply->data ? reply->data : "(no reply)");
    out[strcspn(out, "\n")] = 0;
    if (code) snprintf(code, code_len, "%s", c ? c : "");
    json_decref(o);
}

/* Waits s seconds or until stopped; true when stopping. */
static bool pause_for(td_agent *a, double s) {
    struct timespec ts;
    td_clock_deadline(&ts, s);
    pthread_mutex_lock(&a->mu);
    while (!a->stopping && pthread_cond_timedwait(&a->wake, &a->mu, &ts) == 0) {
    }
    bool stop = a->stopping;
    pthread_mutex_unlock(&a->mu);
    return stop;
}

/* A refusal no retry cures: say so and end the daemon. */
static void refuse(td_agent *a, long status, const td_buf *reply) {
    char msg[1024], code[64];
    error_message(reply, msg, sizeof msg, code, sizeof code);
    static const char *const OURS[] = {"cluster_secret",   "cluster_closed", "duplicate_node",
                                       "protocol_version", "bad_request",    "not_master"};
    bool ours = false;
    for (size_t i = 0; i < sizeof OURS / sizeof *OURS; i++) ours |= strcmp(code, OURS[i]) == 0;
    if (ours)
        td_log_at(a->cfg.log, TD_LOG_ERROR, TD_LOG_NOWHERE,
                  "the master at %s refused this node (HTTP %ld): %s", a->master, status, msg);
    else /* a traind from before the cluster answers its routes as a user's */
        td_log_at(a->cfg.log, TD_LOG_ERROR, TD_LOG_NOWHERE,
                  "the master at %s does not speak the cluster protocol (HTTP %ld: %s): is it an "
                  "older traind? Run the same traind version on every node",
                  a->master, status, msg);
    pthread_mutex_lock(&a->mu);
    a->refused = true;
    pthread_mutex_unlock(&a->mu);
    kill(getpid(), SIGTERM);
}

static void *agent_loop(void *arg) {
    td_agent *a = arg;
    bool joined = false, ever = false, unreachable = false;
    double heartbeat_s = 2, timeout_s = 10, backoff = 1, last_ok = td_clock_now();
    for (;;) {
        td_buf reply = {0};
        char why[CURL_ERROR_SIZE + 64] = "";
        long status;
        /* (a checkpoint's line goes up only once the mover has uploaded its files) */
        json_t *msg = joined
                          ? json_pack("{s:s, s:s}", "name", a->name, "node_id", a->node_id)
                          : json_pack("{s:i, s:s, s:s, s:s, s:i, s:o, s:s}", "protocol",
                                      TD_CLUSTER_PROTOCOL, "name", a->name, "node_id", a->node_id,
                                      "address", a->address, "slots", a->cfg.slots, "gpus",
                                      td_gpus_json(a->gpu, a->cfg.gpus), "version", a->version);
        if (msg) json_object_set_new(msg, "slots_used", json_integer(td_jobs_slots_used(a->jobs)));
        if (msg) json_object_set_new(msg, "parts", td_jobs_guests_report_locked(a->jobs));
        char *text = msg ? json_dumps(msg, JSON_COMPACT) : NULL;
        json_decref(msg);
        if (text)
            status =
                post(a, joined ? a->url_heartbeat : a->url_register, text, &reply, why, sizeof why);
        else
            status = 0, snprintf(why, sizeof why, "out of memory");
        free(text);
        if (status == 200) {
            json_t *o = json_loads(reply.data ? reply.data : "", 0, NULL);
            double h = json_number_value(json_object_get(o, "heartbeat_s"));
            double t = json_number_value(json_object_get(o, "timeout_s"));
            const char *cred = json_string_value(json_object_get(o, "credential"));
            if (!joined && cred) { /* this node's own from now on */
                pthread_mutex_lock(&a->mu);
                snprintf(a->node_auth, sizeof a->node_auth, "Authorization: Node %s:%s", a->name,
                         cred);
                pthread_mutex_unlock(&a->mu);
            }
            /* no "parts" at all (a master on its way out): no new orders, not "run nothing" */
            if (json_object_get(o, "parts")) take_orders(a, json_object_get(o, "parts"));
            json_decref(o);
            last_ok = td_clock_now();
            if (h > 0) heartbeat_s = h;
            if (t > 0) timeout_s = t;
            pthread_mutex_lock(&a->mu);
            a->fetch_limit_s = timeout_s;
            pthread_mutex_unlock(&a->mu);
            if (!joined)
                td_log_at(
                    a->cfg.log, TD_LOG_INFO, TD_LOG_NOWHERE,
                    "%s the cluster at %s as node %s (advertising %s; a heartbeat every %g s)",
                    ever ? "joined again" : "joined", a->master, a->name, a->address, heartbeat_s);
            else if (unreachable)
                td_log_at(a->cfg.log, TD_LOG_INFO, TD_LOG_NOWHERE, "the master at %s answers again",
                          a->master);
            joined = ever = true, unreachable = false, backoff = 1;
            td_buf_free(&reply);
            bool busy = td_jobs_guests_running(a->jobs);
            if (pause_for(a, busy && BUSY_INTERVAL_S < heartbeat_s ? BUSY_INTERVAL_S : heartbeat_s))
                break;
            continue;
        }
        /* the master forgot this node (it restarted, or marked it lost), or no longer takes
         * its credential: register again */
        if ((status == 404 || status == 401) && joined) {
            char msg[512];
            error_message(&reply, msg, sizeof msg, NULL, 0);
            td_log_at(a->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE, "the master at %s says: %s",
                      a->master, msg);
            joined = false;
            td_buf_free(&reply);
            continue;
        }
        if (status == 400 || status == 401 || status == 403 || status == 409) {
            refuse(a, status, &reply);
            td_buf_free(&reply);
            break;
        }
        /* no answer, or one a retry may cure (5xx): back off */
        if (!unreachable) {
            char msg[512];
            if (status) error_message(&reply, msg, sizeof msg, NULL, 0);
            /* no answer at all: most often a master still on its default loopback address */
            td_log_at(a->cfg.log, TD_LOG_WARNING, TD_LOG_NOWHERE,
                      "cannot reach the master at %s: %s; retrying with back-off up to %d s%s",
                      a->master, status ? msg : why, BACKOFF_MAX_S,
                      status
                          ? ""
                          : " (HINT: is the master running, and listening on an address this node "
                            "reaches? Its --listen defaults to 127.0.0.1)");
        }
        unreachable = true;
        joined = false; /* a master back from a restart knows no node: register */
        td_buf_free(&reply);
        if (td_clock_now() - last_ok >= timeout_s && td_jobs_guests_running(a->jobs)) {
            char stop_why[160];
            snprintf(stop_why, sizeof stop_why,
                     "this node has not reached its master for %.0f s (the node timeout): the "
                     "master has ended the attempt",
                     td_clock_now() - last_ok);
            td_jobs_guests_stop_all(a->jobs, stop_why);
        }
        /* cut off while running parts: try again soon, to stop them within the timeout */
        double wait = backoff;
        if (td_jobs_guests_running(a->jobs) && wait > timeout_s / 4) wait = timeout_s / 4;
        if (pause_for(a, wait)) break;
        backoff = backoff * 2 > BACKOFF_MAX_S ? BACKOFF_MAX_S : backoff * 2;
    }
    return NULL;
}

int td_agent_open(td_agent **out, const td_agent_config *cfg, td_err *err) {
    char host[256];
    const char *colon = strrchr(cfg->master, ':');
    long port = colon ? strtol(colon + 1, NULL, 10) : 0;
    if (!colon || colon == cfg->master || (size_t)(colon - cfg->master) >= sizeof host ||
        port < 1 || port > 65535)
        return td_fail(err, "--join \"%s\": expected the master's ADDR:PORT, e.g. 10.0.0.1:8470",
                       cfg->master);
    snprintf(host, sizeof host, "%.*s", (int)(colon - cfg->master), cfg->master);
    td_agent *a = td_calloc(1, sizeof *a);
    a->cfg = *cfg;
    a->fetch_limit_s = 10;
    if (a->cfg.gpus > TD_GPUS_MAX) a->cfg.gpus = TD_GPUS_MAX;
    for (int i = 0; i < a->cfg.gpus; i++)
        a->gpu[i] = cfg->gpu ? cfg->gpu[i] : (td_node_gpu){.index = i};
    a->cfg.gpu = a->gpu;
    if (cfg->advertise && *cfg->advertise)
        snprintf(a->address, sizeof a->address, "%s", cfg->advertise);
    else if (td_net_route_address(host, "the master (--join)", a->address, sizeof a->address,
                                  err) != 0) {
        free(a);
        return -1;
    }
    snprintf(a->master, sizeof a->master, "%s", cfg->master);
    snprintf(a->secret, sizeof a->secret, "%s", cfg->secret);
    snprintf(a->name, sizeof a->name, "%s", cfg->name);
    snprintf(a->node_id, sizeof a->node_id, "%s", cfg->node_id);
    snprintf(a->version, sizeof a->version, "%s", cfg->version);
    snprintf(a->tls_ca, sizeof a->tls_ca, "%s", cfg->tls_ca ? cfg->tls_ca : "");
    const char *scheme = a->tls_ca[0] ? "https" : "http";
    snprintf(a->url_register, sizeof a->url_register, "%s://%s/v1/cluster/register", scheme,
             a->master);
    snprintf(a->url_heartbeat, sizeof a->url_heartbeat, "%s://%s/v1/cluster/heartbeat", scheme,
             a->master);
    snprintf(a->url_files, sizeof a->url_files, "%s://%s/v1/cluster/files", scheme, a->master);
    snprintf(a->state_dir, sizeof a->state_dir, "%s", cfg->state_dir ? cfg->state_dir : ".");
    snprintf(a->auth, sizeof a->auth, "Authorization: Cluster %s", a->secret);
    pthread_condattr_t ca;
    pthread_condattr_init(&ca);
    pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
    pthread_cond_init(&a->wake, &ca);
    pthread_cond_init(&a->moved, &ca);
    pthread_condattr_destroy(&ca);
    a->fetches = json_object();
    pthread_mutex_init(&a->mu, NULL);
    *out = a;
    return 0;
}

int td_agent_start(td_agent *a, td_jobs *jobs, td_err *err) {
    a->jobs = jobs;
    int rc = pthread_create(&a->mover, NULL, mover_loop, a);
    if (rc != 0) return td_fail(err, "cannot start the agent's file mover: %s", strerror(rc));
    rc = pthread_create(&a->thread, NULL, agent_loop, a);
    if (rc != 0) {
        pthread_mutex_lock(&a->mu);
        a->stopping = true;
        pthread_cond_broadcast(&a->moved);
        pthread_mutex_unlock(&a->mu);
        pthread_join(a->mover, NULL);
        return td_fail(err, "cannot start the agent thread: %s", strerror(rc));
    }
    a->started = true;
    return 0;
}

bool td_agent_refused(td_agent *a) {
    if (!a) return false;
    pthread_mutex_lock(&a->mu);
    bool r = a->refused;
    pthread_mutex_unlock(&a->mu);
    return r;
}

void td_agent_stop(td_agent *a) {
    if (!a) return;
    pthread_mutex_lock(&a->mu);
    a->stopping = true;
    pthread_cond_broadcast(&a->wake);
    pthread_cond_broadcast(&a->moved);
    pthread_mutex_unlock(&a->mu);
    if (a->started) {
        pthread_join(a->thread, NULL);
        pthread_join(a->mover, NULL);
    }
    json_decref(a->fetches);
    pthread_cond_destroy(&a->moved);
    pthread_cond_destroy(&a->wake);
    pthread_mutex_destroy(&a->mu);
    /* the secret and the node's credential, not left in freed memory */
    explicit_bzero(a->secret, sizeof a->secret);
    explicit_bzero(a->auth, sizeof a->auth);
    explicit_bzero(a->node_auth, sizeof a->node_auth);
    free(a);
}
