/* The parts a previous daemon left running here for its master, found at start from their
 * attempt files' "part" notes: re-attached when their shepherds still run, else reported as
 * they ended. Apart from starting a part (td_node_part_start.c): nothing is started here, what the
 * notes say is taken as it is. */
#include "service/node/td_node_private.h"

#include <dirent.h>
#include <stdlib.h>
#include <string.h>

/* One node part from its attempt file's notes (a previous daemon's part). */
static void recover_node_part(td_node_parts *np, const char *base, json_t *n) {
    td_node_part *g = td_calloc(1, sizeof *g);
    g->out_fd = -1;
    g->sh.fd = -1;
    g->job = (long)json_integer_value(json_object_get(n, "job"));
    g->attempt = td_node_order_int(n, "attempt");
    g->node_rank = td_node_order_int(n, "node_rank");
    g->nnodes = td_node_order_int(n, "nnodes");
    g->nproc = td_node_order_int(n, "nproc");
    g->procs = td_node_order_int(n, "procs");
    g->slots = td_runner_notes_n_slots(n, 0);
    g->see_all_gpus = json_is_true(json_object_get(n, "see_all_gpus"));
    snprintf(g->kind, sizeof g->kind, "%s", td_node_order_string(n, "kind"));
    snprintf(g->dir, sizeof g->dir, "%s/jobs/%ld", np->runner->cfg->state_dir, g->job);
    g->uid = (long)json_integer_value(json_object_get(n, "uid"));
    if (g->procs < 1 || g->procs > 4096 || g->slots < 0 || g->slots > 4096 * 64) {
        free(g);
        return;
    }
    g->log_start = td_calloc((size_t)g->procs, sizeof *g->log_start);
    g->log_sent = td_calloc((size_t)g->procs, sizeof *g->log_sent);
    /* counted here on a master too: no placement of its knows this part until it ends */
    g->holds_slots = true;
    g->running = true;
    td_err err = {{0}};
    int rc = td_runner_attach(np->runner, base, n, g->procs, g->slots, &g->devices, g->log_start,
                              g->cgroup, sizeof g->cgroup, &g->sh, &err);
    td_node_parts_add(np, g);
    td_log_at(np->log, TD_LOG_INFO, TD_LOG_JOB(g->job), "job %ld attempt %d: node rank %d %s",
              g->job, g->attempt, g->node_rank,
              rc == 0   ? "still runs here: re-attached (reported to the master as it is)"
              : rc == 1 ? "ended here while no daemon ran: reporting how"
                        : "left an attempt file that cannot be read; reported as ended");
    if (rc < 0)
        td_log_at(np->log, TD_LOG_WARNING, TD_LOG_JOB(g->job), "job %ld: %s", g->job, err.msg);
    /* rc 1 or -1: ended in the supervisor's first turn (td_node_parts_tick) */
}

void td_node_parts_recover(td_node_parts *np) {
    char root[PATH_MAX];
    snprintf(root, sizeof root, "%s/jobs", np->runner->cfg->state_dir);
    DIR *d = opendir(root);
    struct dirent *e;
    while (d && (e = readdir(d))) {
        char dir[PATH_MAX / 2];
        if (e->d_name[0] == '.' ||
            snprintf(dir, sizeof dir, "%s/%s", root, e->d_name) >= (int)sizeof dir)
            continue;
        DIR *sub = opendir(dir);
        struct dirent *f;
        while (sub && (f = readdir(sub))) {
            int attempt, node_rank, used = 0;
            if (sscanf(f->d_name, "attempt-%d.node-%d.json%n", &attempt, &node_rank, &used) != 2 ||
                used != (int)strlen(f->d_name))
                continue;
            char base[PATH_MAX - 16];
            snprintf(base, sizeof base, "%s/attempt-%d.node-%d", dir, attempt, node_rank);
            json_t *notes = td_shepherd_notes(base);
            if (td_runner_notes_of_part(notes)) recover_node_part(np, base, notes);
            json_decref(notes);
        }
        if (sub) closedir(sub);
    }
    if (d) closedir(d);
}
