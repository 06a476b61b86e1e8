/* What this node says of the parts it runs for its master (td_node_parts.c runs them): rank 0's
 * lines, held until the master acknowledges them (on an agent a checkpoint line's files are
 * uploaded first), the new bytes of every rank's log, and each part's state and first failure
 * in words. Apart from running the parts because it is the message, bounded in what it holds
 * and sends, and resent from sequence numbers and offsets after a drop. */
#include "service/node/td_node_private.h"

#include "base/td_strv.h"
#include "train/td_metrics.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

enum {
    REPORT_LINES = 256,     /* rank 0's lines per message at most */
    REPORT_LOG = 64 * 1024, /* bytes of one rank's log per message at most */
    /* bytes of lines and logs in one message, all parts together: well under the API's smallest
     * body limit; the rest goes in the next message, sent at once */
    REPORT_BUDGET = 384 * 1024,
    /* rank 0's lines a node holds for its master at most (bytes): minutes of any real job's
     * metrics; a flood beyond it waits in no memory */
    NODE_PART_BACKLOG_BYTES = 16 * 1024 * 1024
};

/* ---- output ---------------------------------------------------------------------------------- */

/* A line of rank 0: kept until the master acknowledges it. On an agent a checkpoint line waits
 * for its files to be uploaded first (td_agent.c), so the master registers only what it has. */
static void keep_line(td_node_parts *np, td_node_part *g, const char *line, size_t n) {
    /* (rank 0's log has it already: the shepherd writes every line there) */
    json_t *o = json_loadb(line, n, 0, NULL);
    const char *ev = json_string_value(json_object_get(o, "event"));
    const char *path = json_string_value(json_object_get(o, "path"));
    bool checkpoint = ev && strcmp(ev, TD_EVENT_CHECKPOINT) == 0;
    bool done = ev && strcmp(ev, TD_EVENT_DONE) == 0;
    /* held here until the master has it: bounded as the master bounds what it stores, and in
     * bytes, so a job printing faster than the master takes its lines cannot fill this node's
     * memory (the master is told how many were dropped) */
    bool keep = done || (g->backlog_bytes + (long long)n <= NODE_PART_BACKLOG_BYTES &&
                         td_runner_rate_admit(np->runner,
                                              checkpoint ? &g->checkpoint_rate : &g->metric_rate));
    long seq = g->next_seq++;
    if (!keep) {
        json_decref(o);
        return;
    }
    if (g->n_lines == g->cap_lines) {
        g->cap_lines = g->cap_lines ? 2 * g->cap_lines : 64;
        g->lines = td_realloc(g->lines, (size_t)g->cap_lines * sizeof *g->lines);
    }
    struct td_node_part_line *l = &g->lines[g->n_lines++];
    *l = (struct td_node_part_line){.seq = seq};
    l->text = td_malloc(n + 1);
    memcpy(l->text, line, n);
    l->text[n] = 0;
    g->backlog_bytes += (long long)n;
    if (!np->on_master && checkpoint && path) { /* an agent: its files go up first */
        char full[2 * PATH_MAX], cwd[PATH_MAX];
        td_identity who = td_runner_identity_of(np->runner, g->job, g->uid);
        td_runner_cwd_of(&who, g->dir, cwd, sizeof cwd);
        snprintf(full, sizeof full, "%s%s%s", path[0] == '/' ? "" : cwd, path[0] == '/' ? "" : "/",
                 path);
        l->checkpoint = td_str_dup(full);
    }
    json_decref(o);
}

typedef struct part_ctx {
    td_node_parts *np;
    td_node_part *g;
} part_ctx;

static bool node_part_line(void *ctx, char *line, size_t n, long long end) {
    (void)end; /* a line's place is its sequence number: the lines of BASE.out from its start */
    part_ctx *c = ctx;
    keep_line(c->np, c->g, line, n);
    return true;
}

/* Rank 0's output on to what the shepherd said (final: to until, < 0 the file's end). */
void td_node_part_output(td_node_parts *np, td_node_part *g, bool final, long long until) {
    if (g->node_rank != 0) return;
    if (g->out_fd < 0) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s.out", g->sh.base);
        g->out_fd = td_runner_open_output(np->log, g->job, path);
    }
    part_ctx ctx = {np, g};
    td_runner_read_lines(g->out_fd, &g->out_read, final ? until : g->sh.out_size, final, 0,
                         &g->line, node_part_line, &ctx);
}

void td_node_parts_read(td_node_parts *np, td_node_part *g) {
    td_shepherd_read(&g->sh);
    td_node_part_output(np, g, false, 0);
}

/* A failure of rank `rank` (what: the shepherd's words) as the master shows it: naming this
 * node, with the rank's own error line from its log. */
void td_node_part_failure(td_node_parts *np, const td_node_part *g, int rank, const char *what,
                          char *out, size_t len) {
    char own[340]; /* (a cascade's error ends with the job's first failure: keep it whole) */
    int local = rank - g->node_rank * g->nproc;
    td_runner_rank_message(g->dir, rank, local >= 0 && local < g->procs ? g->log_start[local] : 0,
                           strcmp(g->kind, "command") == 0, own, sizeof own);
    if (own[0] && strstr(what, own)) own[0] = 0; /* its error file said it already */
    snprintf(out, len, "node %s: %.100s%s%s", np->name, what, own[0] ? ": " : "", own);
    td_str_utf8_repair(out); /* cut at a byte count; JSON carries only whole characters */
}

/* ---- the report ------------------------------------------------------------------------------ */

static json_t *log_chunk(const td_node_part *g, int r, bool *whole, size_t *budget) {
    char path[PATH_MAX + 32];
    int rank = g->node_rank * g->nproc + r;
    snprintf(path, sizeof path, "%s/rank-%d.log", g->dir, rank);
    struct stat st;
    if (stat(path, &st) != 0) return NULL;
    long long have = (long long)st.st_size - g->log_start[r] - g->log_sent[r];
    if (have <= 0) return NULL;
    size_t cap = *budget * 3 / 4 < REPORT_LOG ? *budget * 3 / 4 : REPORT_LOG; /* base64: 4/3 */
    size_t n = (long long)cap < have ? cap : (size_t)have;
    if ((long long)n < have) *whole = false;
    if (n == 0) return NULL;
    *budget -= 4 * ((n + 2) / 3);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    unsigned char *raw = td_malloc(n);
    ssize_t got = pread(fd, raw, n, (off_t)(g->log_start[r] + g->log_sent[r]));
    close(fd);
    if (got <= 0) {
        free(raw);
        return NULL;
    }
    /* base64: a log is bytes, and JSON strings must be UTF-8 */
    char *b64 = td_malloc(4 * (((size_t)got + 2) / 3) + 1);
    EVP_EncodeBlock((unsigned char *)b64, raw, (int)got);
    free(raw);
    json_t *o = json_pack("{s:i, s:I, s:s}", "rank", rank, "offset", (json_int_t)g->log_sent[r],
                          "data", b64);
    free(b64);
    return o;
}

json_t *td_node_parts_report(td_node_parts *np, bool remote) {
    json_t *list = json_array();
    size_t budget = REPORT_BUDGET;
    for (int i = 0; i < np->n_parts; i++) {
        td_node_part *g = np->parts[i];
        bool whole = !g->running && g->out_fd < 0;
        json_t *lines = json_array();
        int k = 0;
        for (; k < g->n_lines && k < REPORT_LINES; k++) {
            struct td_node_part_line *l = &g->lines[k];
            if (l->checkpoint && remote) break; /* its files first */
            size_t size = strlen(l->text) + 64;
            if (remote && size > budget && k > 0) break;
            budget = size > budget ? 0 : budget - size;
            json_t *e = json_pack("{s:I, s:s}", "seq", (json_int_t)l->seq, "text", l->text);
            if (!e)
                e = json_pack("{s:I, s:s}", "seq", (json_int_t)l->seq, "text",
                              "(a line that is not UTF-8)");
            if (l->files) json_object_set(e, "files", l->files);
            json_array_append_new(lines, e);
        }
        if (k < g->n_lines) whole = false;
        json_t *logs = json_array();
        for (int r = 0; remote && r < g->procs; r++) {
            json_t *c = log_chunk(g, r, &whole, &budget);
            if (c) json_array_append_new(logs, c);
        }
        char devices[128] = "";
        for (int r = 0; g->devices && r < g->slots; r++)
            snprintf(devices + strlen(devices), sizeof devices - strlen(devices), "%s%d",
                     r ? "," : "", td_runner_gpu_id(np->runner, g->devices[r]));
        json_t *each = json_array();
        char **per = g->devices ? td_runner_devices_strv(np->runner, g->devices, g->slots, g->procs,
                                                         g->see_all_gpus)
                                : NULL;
        for (int p = 0; per && per[p]; p++) json_array_append_new(each, json_string(per[p]));
        td_strv_free(per);
        json_t *e =
            json_pack("{s:I, s:i, s:s, s:i, s:s, s:o, s:o, s:I, s:b, s:s, s:o}", "job",
                      (json_int_t)g->job, "attempt", g->attempt, "state",
                      g->running ? "running" : "ended", "exit_code", g->exit_code, "reason",
                      g->reason, "lines", lines, "logs", logs, "next_seq", (json_int_t)g->next_seq,
                      "complete", whole, "devices", devices, "process_devices", each);
        TD_ASSERT(e, "json_pack of a part's report failed");
        if (g->sh.failed) {
            /* as soon as the shepherd says so, with when it happened: the master tells the
             * first failure from the cascade it caused on other nodes by that time, not by
             * which part's end it hears of first (a part whose stopped rank holds it for the
             * grace period ends last, though its failure came first) */
            char words[sizeof g->reason];
            if (g->running)
                td_node_part_failure(np, g, g->sh.failed_rank, g->sh.failed_reason, words,
                                     sizeof words);
            json_object_set_new(e, "failure",
                                json_pack("{s:i, s:s, s:f}", "exit_code",
                                          g->sh.failed_code ? g->sh.failed_code : 1, "reason",
                                          g->running ? words : g->reason, "at", g->sh.failed_at));
        }
        json_array_append_new(list, e);
    }
    return list;
}

/* ---- checkpoint uploads (an agent's) --------------------------------------------------------- */

bool td_node_parts_next_upload(td_node_parts *np, long *job_id, int *attempt, long *seq, char *path,
                               size_t len, td_job_files *files) {
    bool found = false;
    for (int i = 0; i < np->n_parts && !found; i++) {
        td_node_part *g = np->parts[i];
        for (int k = 0; k < g->n_lines && !found; k++)
            if (g->lines[k].checkpoint &&
                g->stop) { /* an ended attempt's: never into the job's store */
                free(g->lines[k].checkpoint);
                g->lines[k].checkpoint = NULL;
            } else if (g->lines[k].checkpoint) {
                *job_id = g->job, *attempt = g->attempt, *seq = g->lines[k].seq;
                snprintf(path, len, "%s", g->lines[k].checkpoint);
                td_runner_files_for(np->runner, g->job, g->uid, files);
                found = true;
            }
    }
    return found;
}

void td_node_parts_uploaded(td_node_parts *np, long job_id, int attempt, long seq, json_t *files) {
    td_node_part *g = td_node_part_find(np, job_id, attempt);
    int k = 0;
    while (g && k < g->n_lines && g->lines[k].seq != seq) k++;
    if (g && k < g->n_lines) {
        free(g->lines[k].checkpoint);
        g->lines[k].checkpoint = NULL;
        json_decref(g->lines[k].files);
        g->lines[k].files = json_incref(files);
    }
}
