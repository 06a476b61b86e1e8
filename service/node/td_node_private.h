/* Inside the node module (td_node.h), shared by its files:
 *   td_node_part.c          one part: found, added, ended, freed; an order's members
 *   td_node_part_start.c    starting a part, in steps
 *   td_node_part_recover.c  the parts a previous daemon left, at start
 *   td_node_part_report.c   what the node reports of its parts (rank 0's lines, logs, failures)
 *   td_node_parts.c         the parts: orders applied, each followed to its end
 * A file calls only the ones listed before it (tests/style/call_graph.py checks). Every function
 * here runs with the owner's lock held, as td_node.h's do. */
#ifndef TD_NODE_PRIVATE_H
#define TD_NODE_PRIVATE_H

#include "service/node/td_node.h"

/* ---- td_node_part.c ---- */
void td_node_part_free(td_node_part *g); /* its shepherd goes on */
/* g has ended (code, reason: what its report says): its GPUs and slots are free. */
void td_node_part_end(td_node_parts *np, td_node_part *g, int code, const char *reason);
/* Adds g to the list. */
void td_node_parts_add(td_node_parts *np, td_node_part *g);

/* ---- td_node_part_start.c ---- */
/* Starts the part order o describes (remote: the order came from another node), listed in
 * np->parts even when it cannot start: then ended, with why. */
void td_node_part_start(td_node_parts *np, json_t *o, bool remote);

/* ---- td_node_part_report.c ---- */
/* Rank 0's output on to what the shepherd said (final: to until, < 0 the file's end). */
void td_node_part_output(td_node_parts *np, td_node_part *g, bool final, long long until);
/* A failure of rank `rank` (what: the shepherd's words) as the master shows it: naming this
 * node, with the rank's own error line from its log. */
void td_node_part_failure(td_node_parts *np, const td_node_part *g, int rank, const char *what,
                          char *out, size_t len);

#endif
