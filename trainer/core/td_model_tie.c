/* Weight tying and a node's own initialisation, as GPT-2 and nanoGPT use them.
 *
 * A node with weight_from reuses an earlier node's "weight" tensor (nanoGPT's
 * `transformer.wte.weight = lm_head.weight`): one tensor in the parameter block, one gradient,
 * one optimizer state; its second name is an alias that checkpoints also write. In backward the
 * later node runs first and writes the gradient; the earlier one adds to it (grads_add), and only
 * the earlier one finishes it (td_node_finishes), which is when DDP's reducer may send it and the
 * fused optimizer may step it. A node whose backward adds is allowed one parameter only, so that
 * "add" never reaches a gradient nobody wrote this step.
 *
 * init_std > 0 sets the node's weight to normal(0, init_std) and its bias to 0 (GPT-2's
 * _init_weights, and its residual projections' std / sqrt(2 · n_layer)). */
#include "core/td_model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int td_model_tie_resolve(td_model *model, const td_node_spec *spec, td_node *node, td_err *err) {
    node->weight_from_param = -1;
    if (!spec->weight_from[0]) return 0;
    char want[TD_NAME_MAX + 16];
    snprintf(want, sizeof want, "%s.weight", spec->weight_from);
    for (int i = 0; i < model->n_params; i++)
        if (strcmp(model->params[i].name, want) == 0) {
            node->weight_from_param = i;
            return 0;
        }
    return td_fail(err,
                   "model.nodes[%d].weight_from: no earlier node \"%s\" has a weight (a node may "
                   "tie its weight to one above it)",
                   node->index, spec->weight_from);
}

/* The node whose parameter `param` is (the tie's source). */
static const td_node *owner(const td_model *model, int before, int param) {
    for (int i = 0; i < before; i++)
        for (int j = 0; j < model->nodes[i].n_params; j++)
            if (model->nodes[i].param_ids[j] == param) return &model->nodes[i];
    return NULL;
}

int td_model_tie_check(td_model *model, const td_node_spec *spec, td_node *node, td_err *err) {
    if (node->weight_from_param >= 0) {
        const td_node *src = owner(model, node->index, node->weight_from_param);
        const char *why = node->tie_state == 2 ? "its weight would have another shape than"
                          : node->tie_state == 0
                              ? "its op has no weight to share with"
                              : "a weight is shared only with a node that has no other "
                                "parameter (an embedding, a linear without bias), unlike";
        if (node->tie_state != 1 || !src || src->n_params != 1)
            return td_fail(err, "model.nodes[%d].weight_from: \"%s\": %s \"%s\"", node->index,
                           node->name, why, spec->weight_from);
        model->aliases =
            td_realloc(model->aliases, (size_t)(model->n_aliases + 1) * sizeof *model->aliases);
        struct td_alias *a = &model->aliases[model->n_aliases++];
        snprintf(a->name, sizeof a->name, "%s.weight", node->name);
        a->param = node->weight_from_param;
    }
    if (spec->init_std > 0)
        for (int j = 0; j < node->n_params; j++) {
            td_param *p = &model->params[node->param_ids[j]];
            size_t len = strlen(p->name);
            if (len >= 5 && strcmp(p->name + len - 5, ".bias") == 0)
                p->init = td_init_fill(0.0f);
            else
                p->init = td_init_normal((float)spec->init_std);
        }
    return 0;
}

/* Which node finishes each parameter's gradient, and which nodes add into one already begun. */
void td_model_tie_finish(td_model *model) {
    for (int i = 0; i < model->n_params; i++) model->params[i].final_node = -1;
    /* backward runs from the last node: the first to touch a param writes, later ones add */
    for (int i = model->n_nodes - 1; i >= 0; i--) {
        td_node *node = &model->nodes[i];
        for (int j = 0; j < node->n_params; j++) {
            td_param *p = node->params[j];
            if (p->final_node >= 0) node->grads_add = true;
            p->final_node = i;
        }
    }
}

bool td_node_finishes(const td_node *node, const td_param *p) {
    return p->final_node == node->index;
}
