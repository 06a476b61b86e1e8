/* Activation checkpointing's segments named in a spec (train.recompute): which consecutive nodes
 * each entry covers, checked against the spec's nodes before any model exists. Apart from the
 * model (td_model.c) because the spec's validator needs it, and the daemon links no model. */
#include "core/td_model.h"

#include "base/td_error.h"

#include <stdbool.h>
#include <string.h>

static bool in_module(const char *name, const char *prefix) {
    size_t len = strlen(prefix);
    return strncmp(name, prefix, len) == 0 && (name[len] == '\0' || name[len] == '.');
}

static int spec_index(const td_node_spec *specs, int n, const char *name) {
    for (int i = 0; i < n; i++)
        if (strcmp(specs[i].name, name) == 0) return i;
    return -1;
}

int td_segments_assign(td_node_spec *specs, int n_specs, const td_segment_name *names, int n_names,
                       td_err *err) {
    for (int i = 0; i < n_specs; i++) specs[i].segment = 0;
    for (int k = 0; k < n_names; k++) {
        const td_segment_name *e = &names[k];
        int first, last;
        if (e->last[0]) {
            first = spec_index(specs, n_specs, e->first);
            last = spec_index(specs, n_specs, e->last);
            if (first < 0 || last < 0)
                return td_fail(err, "[%d].%s: no node is named \"%s\"", k,
                               first < 0 ? "first" : "last", first < 0 ? e->first : e->last);
            if (first > last)
                return td_fail(err,
                               "[%d]: first (\"%s\", nodes[%d]) comes after last (\"%s\", "
                               "nodes[%d]); expected first at or before last",
                               k, e->first, first, e->last, last);
        } else {
            first = last = -1;
            for (int i = 0; i < n_specs; i++) {
                if (!in_module(specs[i].name, e->first)) continue;
                if (first < 0) first = i;
                last = i;
            }
            if (first < 0)
                return td_fail(err,
                               "[%d]: no node is named \"%s\" or \"%s.<name>\"; expected a "
                               "module prefix such as \"layer1.0\", or {\"first\": node, "
                               "\"last\": node}",
                               k, e->first, e->first);
            for (int i = first; i <= last; i++)
                if (!in_module(specs[i].name, e->first))
                    return td_fail(err,
                                   "[%d] (\"%s\"): its nodes are not consecutive: nodes[%d] "
                                   "(\"%s\") lies between nodes[%d] (\"%s\") and nodes[%d] "
                                   "(\"%s\"); a segment is a run of consecutive nodes",
                                   k, e->first, i, specs[i].name, first, specs[first].name, last,
                                   specs[last].name);
        }
        for (int i = first; i <= last; i++) {
            if (specs[i].segment)
                return td_fail(err,
                               "[%d]: overlaps entry [%d] at nodes[%d] (\"%s\"); segments "
                               "must not share nodes",
                               k, specs[i].segment - 1, i, specs[i].name);
            specs[i].segment = k + 1;
        }
    }
    return 0;
}
