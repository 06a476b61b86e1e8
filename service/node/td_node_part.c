/* One part of the node's list: found, added, ended (its GPUs and slots given back) and freed;
 * and reading an order's members. The bottom of the module: the other files build on these. */
#include "service/node/td_node_private.h"

#include "base/td_strv.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

td_node_part *td_node_part_find(td_node_parts *np, long job_id, int attempt) {
    for (int i = 0; i < np->n_parts; i++)
        if (np->parts[i]->job == job_id && np->parts[i]->attempt == attempt) return np->parts[i];
    return NULL;
}

void td_node_parts_add(td_node_parts *np, td_node_part *g) {
    np->parts = td_realloc(np->parts, (size_t)(np->n_parts + 1) * sizeof *np->parts);
    np->parts[np->n_parts++] = g;
}

void td_node_part_free(td_node_part *g) {
    for (int i = 0; i < g->n_lines; i++) {
        free(g->lines[i].text);
        free(g->lines[i].checkpoint);
        json_decref(g->lines[i].files);
    }
    free(g->lines);
    free(g->devices);
    free(g->log_start);
    free(g->log_sent);
    td_shepherd_close(&g->sh);
    td_buf_free(&g->line);
    if (g->out_fd >= 0) close(g->out_fd);
    free(g);
}

void td_node_parts_free(td_node_parts *np) {
    for (int i = 0; i < np->n_parts; i++)
        td_node_part_free(np->parts[i]); /* their shepherds go on */
    free(np->parts);
    np->parts = NULL;
    np->n_parts = 0;
}

void td_node_part_end(td_node_parts *np, td_node_part *g, int code, const char *reason) {
    g->running = false;
    g->ended = true;
    g->exit_code = code;
    snprintf(g->reason, sizeof g->reason, "%s", reason);
    td_str_utf8_repair(g->reason); /* cut at a byte count; JSON carries only whole characters */
    td_runner_give_back_gpus(np->runner, g->devices, g->slots);
    if (g->holds_slots)
        np->runner->used_slots -= g->slots; /* else the master's placement holds them */
    g->holds_slots = false;
    free(g->devices);
    g->devices = NULL;
}

const char *td_node_order_string(json_t *o, const char *key) {
    const char *s = json_string_value(json_object_get(o, key));
    return s ? s : "";
}

int td_node_order_int(json_t *o, const char *key) {
    return (int)json_integer_value(json_object_get(o, key));
}
