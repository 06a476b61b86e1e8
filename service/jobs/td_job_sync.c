/* The cluster's master following the parts it placed (td_job_place.c places them): apart from
 * placement because it is the other half of a node's heartbeat, what the master hears and says.
 *
 * Each node learns what to run from the reply to its heartbeat (td_cluster.c), and reports on
 * its parts in the next one (td_job_part_report.c): the master applies rank 0's lines in sequence,
 * appends the log bytes at their offsets, and ends the attempt once every part has ended (or its
 * node is lost). The first failure stops every other part and names its node and rank. The
 * master's own node takes part in-process, every supervisor turn (td_jobs_parts_tick). */
#include "service/jobs/td_jobs_private.h"

#include "base/td_buf.h"
#include "service/cluster/td_cluster.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- orders ---------------------------------------------------------------------------------- */

/* What the job runs, as a node needs it: a train job's spec with the daemon's own checkpoint
 * directory made relative to the job's directory (every node has one of its own). */
static json_t *order_spec(job *jb) {
    char path[PATH_MAX + 16];
    snprintf(path, sizeof path, "%s/spec.json", jb->dir);
    json_t *spec = json_load_file(path, 0, NULL);
    json_t *ck = json_object_get(spec, "checkpoint");
    char ours[PATH_MAX + 16];
    snprintf(ours, sizeof ours, "%s/checkpoints", jb->dir);
    const char *dir = json_string_value(json_object_get(ck, "dir"));
    if (dir && strcmp(dir, ours) == 0) json_object_set_new(ck, "dir", json_string("checkpoints"));
    return spec ? spec : json_null();
}

static json_t *order(job *jb, const part *p) {
    json_t *argv = json_array(), *env = json_array();
    bool command = strcmp(jb->row.kind, "command") == 0;
    for (int i = 0; command && jb->argv[i]; i++)
        json_array_append_new(argv, json_string(jb->argv[i]));
    for (int i = 0; jb->env && jb->env[i]; i++) json_array_append_new(env, json_string(jb->env[i]));
    /* only a part about to start needs what it resumes from and what it runs */
    bool starting = p->state == PART_STARTING;
    json_t *resume = starting && jb->resume_order ? json_incref(jb->resume_order) : json_null();
    json_t *logs = json_array();
    for (int r = 0; r < td_jobs_procs(jb); r++) { /* each process's log */
        int rank = p->node_rank * jb->row.nproc + r;
        char path[PATH_MAX + 32];
        struct stat st;
        snprintf(path, sizeof path, "%s/rank-%d.log", jb->dir, rank);
        long long have = stat(path, &st) == 0 ? (long long)st.st_size - jb->log_start[rank] : 0;
        json_array_append_new(logs, json_integer(have > 0 ? have : 0));
    }
    bool stop = jb->parts_stopping || jb->cancel_requested || jb->timed_out;
    json_t *o = json_pack(
        "{s:I, s:i, s:i, s:i, s:i, s:i, s:b, s:b, s:s, s:i, s:i, s:i, s:s, s:o, "
        "s:s, s:o, s:o, s:o, s:o, s:b, s:I, s:o}",
        "job", (json_int_t)jb->row.id, "attempt", jb->n_attempts - 1, "node_rank", p->node_rank,
        "nnodes", jb->n_parts, "nproc", jb->row.nproc, "gpus_per_proc", jb->gpus_per_proc,
        "launch_self", jb->launch_self, "see_all_gpus", jb->see_all_gpus, "master_addr",
        jb->parts[0].address, "master_port", jb->master_port, "restart_count", jb->n_attempts - 1,
        "max_restarts", jb->row.max_restarts, "kind", jb->row.kind, "argv", argv, "local_rank_arg",
        jb->local_rank_arg, "env", env, "spec", command || !starting ? json_null() : order_spec(jb),
        "resume", resume, "checkpoint_dir",
        starting ? json_string(jb->checkpoint_dir ? jb->checkpoint_dir : "") : json_null(), "stop",
        stop, "acked_lines", (json_int_t)jb->lines_in, "acked_logs", logs);
    TD_ASSERT(o, "json_pack of a part's order failed");
    /* who its processes are on every node, and what they may use */
    json_object_set_new(o, "uid", json_integer((json_int_t)jb->row.uid));
    json_object_set_new(o, "stop_at_step", json_integer((json_int_t)jb->row.stop_at_step));
    if (jb->metrics && p->node_rank == 0) /* rank 0's lines are the metrics */
        json_object_set(o, "metrics", jb->metrics);
    if (jb->cwd) json_object_set_new(o, "cwd", json_string(jb->cwd));
    json_object_set_new(
        o, "limits",
        json_pack("{s:I, s:I, s:i, s:I}", "memory_bytes", (json_int_t)jb->cg_limits.memory_bytes,
                  "pids", (json_int_t)jb->cg_limits.pids, "cpu_weight", jb->cg_limits.cpu_weight,
                  "disk_bytes", (json_int_t)jb->disk_bytes));
    return o;
}

/* ---- reports --------------------------------------------------------------------------------- */

static part *part_on(job *jb, const char *node) {
    for (int i = 0; i < jb->n_parts; i++)
        if (strcmp(jb->parts[i].node, node) == 0) return &jb->parts[i];
    return NULL;
}

int td_jobs_part_rank_on(job *jb, const char *node) {
    const part *p = jb->parts ? part_on(jb, node) : NULL;
    return p && p->state != PART_ENDED ? p->node_rank : -1;
}

/* A node's log bytes for one rank: appended where the master's copy ends, or dropped (already
 * here, or a gap to be resent). */
static bool apply_log(job *jb, const part *p, json_t *c) {
    int rank = (int)json_integer_value(json_object_get(c, "rank"));
    long long offset = (long long)json_integer_value(json_object_get(c, "offset"));
    const char *b64 = json_string_value(json_object_get(c, "data"));
    /* a node writes the logs of its own part's ranks only */
    if (!b64 || rank < p->node_rank * jb->row.nproc || rank >= (p->node_rank + 1) * jb->row.nproc)
        return false;
    char path[PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/rank-%d.log", jb->dir, rank);
    int fd = open(path, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0640);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0) {
        if (fd >= 0) close(fd);
        return false;
    }
    long long have = (long long)st.st_size - jb->log_start[rank];
    size_t n = strlen(b64);
    unsigned char *raw = td_malloc(n / 4 * 3 + 3);
    int got = EVP_DecodeBlock(raw, (const unsigned char *)b64, (int)n);
    /* EVP_DecodeBlock counts the padding's zero bytes too */
    if (got > 0 && n >= 1 && b64[n - 1] == '=') got--;
    if (got > 0 && n >= 2 && b64[n - 2] == '=') got--;
    /* a chunk resent after a lost reply may overlap what is here: only its new bytes go on */
    bool applied = got >= 0 && offset <= have && offset + got >= have;
    if (applied && offset + got > have)
        applied = write(fd, raw + (have - offset), (size_t)(offset + got - have)) ==
                  (ssize_t)(offset + got - have);
    free(raw);
    close(fd);
    return applied;
}

/* The attempt is over when every part has ended; the first failure (by when it happened, as the
 * nodes' reports arrive in any order) is the attempt's. */
static void check_over(td_jobs *j, job *jb) {
    for (int i = 0; i < jb->n_parts; i++)
        if (jb->parts[i].state != PART_ENDED) return;
    td_jobs_attempt_over(j, jb);
}

/* Part p's first failure, which happened at `at` (wall clock as its node says; 0: now). The
 * attempt's failure is the earliest of its parts' by that time, in whatever order the nodes'
 * reports come (a heartbeat apart each; and a part whose ranks take the grace period to stop
 * ends long after the failure that stopped them); the first one heard of stops every part. */
static void part_failed(td_jobs *j, job *jb, part *p, int code, const char *reason, double at) {
    if (p->failed_at > 0) return; /* its first failure is known */
    p->failed_at = at > 0 ? at : td_clock_wall();
    bool first = true;
    for (int i = 0; i < jb->n_parts; i++)
        if (&jb->parts[i] != p && jb->parts[i].failed_at > 0 &&
            jb->parts[i].failed_at <= p->failed_at)
            first = false;
    if (first && !jb->cancel_requested && !jb->hold_requested && !jb->timed_out) {
        bool earlier = jb->parts_code != 0;
        jb->parts_code = code ? code : 1;
        snprintf(jb->parts_reason, sizeof jb->parts_reason, "%s", reason);
        td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                  earlier ? "job %ld: %s, before the failure heard of first"
                          : "job %ld: %s; stopping its ranks on every node",
                  jb->row.id, reason);
    }
    jb->parts_stopping = true;
}

/* Rank 0's lines its node dropped (a gap in their numbers): over max_events_per_s there, or more
 * than it holds for its master (td_job_part_report.c); counted as the master counts its own. */
static void lines_dropped(job *jb, long n) {
    jb->events_dropped += n;
    jb->dropped_unsaid += n;
    td_jobs_stale(jb);
}

static void apply_report(td_jobs *j, const char *node, json_t *e) {
    long id = (long)json_integer_value(json_object_get(e, "job"));
    int attempt = (int)json_integer_value(json_object_get(e, "attempt"));
    job *jb = td_jobs_find(j, id);
    if (!jb || !jb->parts || attempt != jb->n_attempts - 1) return;
    part *p = part_on(jb, node);
    if (!p || p->state == PART_ENDED) return;
    if (p->state == PART_STARTING) {
        p->state = PART_RUNNING;
        td_jobs_stale(jb);
    }
    /* a part's GPUs are fixed while it runs; a node reports none once it has ended them, and
     * the placement goes on showing what they were */
    const char *devices = json_string_value(json_object_get(e, "devices"));
    if (devices && *devices) snprintf(p->devices, sizeof p->devices, "%s", devices);
    json_t *each = json_object_get(e, "process_devices");
    if (json_array_size(each) > 0) {
        td_buf b = {0};
        size_t k;
        json_t *d;
        json_array_foreach(each, k, d) td_buf_printf(
            &b, "%s%s", k ? ";" : "", json_string_value(d) ? json_string_value(d) : "");
        free(p->proc_devices);
        p->proc_devices = td_buf_take(&b);
    }
    size_t i;
    json_t *c;
    bool logs_whole = true; /* every chunk is in: the report's "complete" can be believed */
    json_array_foreach(json_object_get(e, "logs"), i, c) logs_whole &= apply_log(jb, p, c);
    /* rank 0's lines come from node rank 0 only: another node's are not the job's metrics */
    json_array_foreach(p->node_rank == 0 ? json_object_get(e, "lines") : NULL, i, c) {
        long seq = (long)json_integer_value(json_object_get(c, "seq"));
        const char *text = json_string_value(json_object_get(c, "text"));
        if (seq < jb->lines_in || !text) continue; /* seen already */
        if (seq > jb->lines_in) lines_dropped(jb, seq - jb->lines_in);
        size_t n = strlen(text);
        char *line = td_malloc(n + 1);
        memcpy(line, text, n + 1);
        td_jobs_line_apply(j, jb, line, n, !p->local, json_object_get(c, "files"));
        free(line);
        jb->lines_in = seq + 1;
    }
    json_t *failure = json_object_get(e, "failure");
    double failed_at = json_number_value(json_object_get(failure, "at"));
    if (json_is_object(failure) && p->failed_at <= 0) { /* while the part still stops */
        const char *why = json_string_value(json_object_get(failure, "reason"));
        part_failed(j, jb, p, (int)json_integer_value(json_object_get(failure, "exit_code")),
                    why && *why ? why : "a rank failed without a message", failed_at);
    }
    long next = (long)json_integer_value(json_object_get(e, "next_seq"));
    bool ended = strcmp(json_string_value(json_object_get(e, "state"))
                            ? json_string_value(json_object_get(e, "state"))
                            : "",
                        "ended") == 0;
    if (!ended || !json_is_true(json_object_get(e, "complete")) || !logs_whole) return;
    if (p->node_rank == 0 && next > jb->lines_in) { /* its last lines dropped there */
        lines_dropped(jb, next - jb->lines_in);
        jb->lines_in = next;
    }
    p->state = PART_ENDED;
    td_jobs_stale(jb);
    p->exit_code = (int)json_integer_value(json_object_get(e, "exit_code"));
    const char *reason = json_string_value(json_object_get(e, "reason"));
    snprintf(p->reason, sizeof p->reason, "%s", reason ? reason : "");
    if (p->exit_code != 0) /* (said before it ended, or now) */
        part_failed(j, jb, p, p->exit_code,
                    p->reason[0] ? p->reason : "a rank failed without a message", failed_at);
}

void td_jobs_node_sync_locked(td_jobs *j, const char *node, bool registered, json_t *msg,
                              json_t *reply) {
    json_t *report = json_object_get(msg, "parts");
    size_t i;
    json_t *e;
    /* a master stopping its own node's parts (keep_jobs_on_stop false) leaves every attempt as
     * it is for its next start: no part's end is acted on meanwhile */
    bool frozen = j->stopping_jobs;
    if (!frozen) json_array_foreach(report, i, e) apply_report(j, node, e);
    json_t *orders = json_array();
    for (int k = 0; k < j->n_jobs; k++) {
        job *jb = j->jobs[k];
        part *p = jb->parts ? part_on(jb, node) : NULL;
        if (!p || p->state == PART_ENDED) continue;
        if (registered && p->state == PART_RUNNING && !frozen) {
            /* the node came back without this part: its traind restarted and found no shepherd
             * of it (or is an older traind, whose parts died with it) */
            bool still = false;
            json_array_foreach(report, i, e) still |=
                (long)json_integer_value(json_object_get(e, "job")) == jb->row.id;
            if (!still) {
                p->state = PART_ENDED;
                p->exit_code = -1;
                snprintf(p->reason, sizeof p->reason,
                         "node %s: its traind restarted while node rank %d ran there", node,
                         p->node_rank);
                part_failed(j, jb, p, -1, p->reason, 0);
                continue;
            }
        }
        json_array_append_new(orders, order(jb, p));
    }
    json_object_set_new(reply, "parts", orders);
    for (int k = 0; k < j->n_jobs && !frozen; k++)
        if (j->jobs[k]->parts) check_over(j, j->jobs[k]);
}

void td_jobs_node_sync(td_jobs *j, const char *node, bool registered, json_t *msg, json_t *reply) {
    td_jobs_lock(j);
    td_jobs_node_sync_locked(j, node, registered, msg, reply);
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j); /* the master's own parts may have orders too */
}

void td_jobs_node_lost(td_jobs *j, const char *node, const char *why) {
    td_jobs_lock(j);
    /* (a master stopping its jobs leaves every attempt as it is for its next start) */
    for (int k = 0; k < j->n_jobs && !j->stopping_jobs; k++) {
        job *jb = j->jobs[k];
        part *p = jb->parts ? part_on(jb, node) : NULL;
        if (!p || p->state == PART_ENDED) continue;
        p->state = PART_ENDED;
        p->exit_code = -1;
        snprintf(p->reason, sizeof p->reason, "%s (node rank %d, ranks %d to %d)", why,
                 p->node_rank, p->node_rank * jb->row.nproc,
                 (p->node_rank + 1) * jb->row.nproc - 1);
        part_failed(j, jb, p, -1, p->reason, 0);
        check_over(j, jb);
    }
    pthread_mutex_unlock(&j->mu);
    td_jobs_wake(j);
}

/* The master's own node: its parts report and take orders in-process, every supervisor turn;
 * time limits of placed jobs are enforced here too. */
void td_jobs_parts_tick(td_jobs *j) {
    if (!j->cluster) return;
    double now = td_clock_wall();
    bool any = j->node.n_parts > 0;
    for (int i = 0; i < j->n_live; i++) {
        job *jb = j->live[i];
        if (!jb->parts) continue;
        any = true;
        double limit = td_jobs_deadline(jb);
        if (limit > 0 && !jb->timed_out && !jb->cancel_requested && now >= limit) {
            jb->timed_out = true;
            jb->parts_stopping = true;
            td_log_at(j->log, TD_LOG_INFO, TD_LOG_JOB(jb->row.id),
                      "job %ld reached its time limit of %g s: stopping it", jb->row.id,
                      jb->row.time_limit_s);
        }
        if (jb->cancel_requested || jb->hold_requested) jb->parts_stopping = true;
    }
    if (!any) return;
    json_t *msg = json_pack("{s:o}", "parts", td_node_parts_report(&j->node, false));
    json_t *reply = json_object();
    td_jobs_node_sync_locked(j, j->node.name, false, msg, reply);
    td_node_parts_apply(&j->node, json_object_get(reply, "parts"), false);
    json_decref(msg);
    json_decref(reply);
}

/* ---- the cluster's hooks --------------------------------------------------------------------- */

static void sync_hook(void *ctx, const char *node, bool registered, json_t *msg, json_t *reply) {
    td_jobs_node_sync(ctx, node, registered, msg, reply);
}

static void lost_hook(void *ctx, const char *node, const char *why) {
    td_jobs_node_lost(ctx, node, why);
}

void td_jobs_set_cluster(td_jobs *j, struct td_cluster *cluster, const char *node_name) {
    td_jobs_lock(j);
    j->cluster = cluster;
    snprintf(j->node.name, sizeof j->node.name, "%s", node_name);
    j->node.on_master = cluster != NULL;
    j->cfg.rules.cluster = cluster != NULL;
    pthread_mutex_unlock(&j->mu);
    if (cluster) td_cluster_on_jobs(cluster, sync_hook, lost_hook, j);
}
