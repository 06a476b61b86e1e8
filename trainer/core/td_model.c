#include "core/td_model.h"

#include "core/td_isa.h"
#include "core/td_parallel.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* Parameters start at multiples of TD_PARAM_ALIGN floats (32 bytes; 16 in bf16/fp16): GPU GEMMs
 * take their fast paths, and cuBLASLt its bias epilogue, only on 16-byte aligned operands. The
 * gaps stay zero (blocks are allocated zeroed and no op writes them), so norms, all-reduces and
 * optimizer steps over the whole block are unchanged. */
#define TD_PARAM_ALIGN 8

static td_param *add_tensor(td_param **list, int *count, size_t *floats, size_t align,
                            const td_node *node, const char *suffix, int ndim, const int *dims,
                            td_init init, td_dtype dtype) {
    *list = td_realloc(*list, (size_t)(*count + 1) * sizeof(td_param));
    td_param *p = &(*list)[(*count)++];
    memset(p, 0, sizeof *p);
    snprintf(p->name, sizeof p->name, "%s.%s", node->name, suffix);
    p->ndim = ndim;
    p->size = 1;
    for (int i = 0; i < ndim; i++) {
        p->dims[i] = dims[i];
        p->size *= (size_t)dims[i];
    }
    p->offset = (*floats + align - 1) / align * align;
    *floats = p->offset + p->size;
    p->init = init;
    p->dtype = dtype;
    return p;
}

td_param *td_model_add_param(td_model *model, td_node *node, const char *suffix, int ndim,
                             const int *dims, td_init init) {
    TD_ASSERT(node->n_params < TD_MAX_NODE_PARAMS, "raise TD_MAX_NODE_PARAMS");
    if (node->weight_from_param >= 0 && strcmp(suffix, "weight") == 0) {
        td_param *t = &model->params[node->weight_from_param];
        bool same = t->ndim == ndim;
        for (int d = 0; same && d < ndim; d++) same = t->dims[d] == dims[d];
        if (same) { /* the earlier node's own: no second tensor, one gradient */
            node->param_ids[node->n_params++] = node->weight_from_param;
            node->tie_state = 1;
            return t;
        }
        node->tie_state = 2; /* another shape: td_model_tie_check says so */
    }
    td_param *p = add_tensor(&model->params, &model->n_params, &model->param_floats, TD_PARAM_ALIGN,
                             node, suffix, ndim, dims, init, TD_F32);
    model->param_count += p->size;
    node->param_ids[node->n_params++] = model->n_params - 1;
    return p;
}

td_param *td_model_add_buffer(td_model *model, td_node *node, const char *suffix, int ndim,
                              const int *dims, float fill, td_dtype dtype) {
    TD_ASSERT(node->n_buffers < TD_MAX_NODE_PARAMS, "raise TD_MAX_NODE_PARAMS");
    td_param *p = add_tensor(&model->buffers, &model->n_buffers, &model->buffer_floats, 1, node,
                             suffix, ndim, dims, td_init_fill(fill), dtype);
    node->buffer_ids[node->n_buffers++] = model->n_buffers - 1;
    return p;
}

const td_param *td_model_find_param(const td_model *model, const char *name) {
    for (int i = 0; i < model->n_params; i++)
        if (strcmp(model->params[i].name, name) == 0) return &model->params[i];
    for (int i = 0; i < model->n_buffers; i++)
        if (strcmp(model->buffers[i].name, name) == 0) return &model->buffers[i];
    for (int i = 0; i < model->n_aliases; i++) /* a tied weight's second name */
        if (strcmp(model->aliases[i].name, name) == 0)
            return &model->params[model->aliases[i].param];
    return NULL;
}

static void init_tensor(td_param *p, td_rng *rng) {
    for (size_t j = 0; j < p->size; j++) {
        switch (p->init.kind) {
        case TD_INIT_FILL:
            p->data[j] = p->init.a;
            break;
        case TD_INIT_UNIFORM:
            p->data[j] = (2.0f * td_rng_uniform(rng) - 1.0f) * p->init.a;
            break;
        case TD_INIT_NORMAL:
            p->data[j] = (float)(td_rng_normal(rng) * p->init.a);
            break;
        }
    }
}

static void init_params(td_model *model, uint64_t seed) {
    td_rng rng;
    td_rng_seed_for(&rng, seed, "init", 0);
    for (int i = 0; i < model->n_params; i++) {
        td_param *p = &model->params[i];
        p->data = model->param_block + p->offset;
        p->grad = model->grad_block + p->offset;
        init_tensor(p, &rng);
    }
    for (int i = 0; i < model->n_buffers; i++) {
        td_param *p = &model->buffers[i];
        p->data = model->buffer_block + p->offset;
        p->grad = NULL;
        init_tensor(p, &rng);
    }
}

static int find_node(const td_model *model, int before, const char *name) {
    if (strcmp(name, "input") == 0) return TD_INPUT_NODE;
    for (int i = 0; i < before; i++)
        if (strcmp(model->nodes[i].name, name) == 0) return i;
    return -2;
}

static int link_nodes(td_model *model, const td_node_spec *specs, int n, td_err *err) {
    for (int i = 0; i < n; i++) {
        const td_node_spec *s = &specs[i];
        td_node *node = &model->nodes[i];
        snprintf(node->name, sizeof node->name, "%s", s->name);
        if (strcmp(s->name, "input") == 0)
            return td_fail(err, "model.nodes[%d].name: \"input\" is reserved for the batch", i);
        for (int j = 0; j < i; j++)
            if (strcmp(model->nodes[j].name, s->name) == 0)
                return td_fail(err, "model.nodes[%d].name: \"%s\" is already used by nodes[%d]", i,
                               s->name, j);
        TD_ASSERT(s->op, "td_model_build: a node without its op's code (td_spec_resolve_ops)");
        node->op = s->op;
        node->impl = s->op->variants ? s->op->variants[td_isa_active()] : s->op;
        node->max_n = model->max_n;
        node->threads = model->threads;
        node->segment = -1;
        node->index = i;
        memcpy(node->args, s->args, sizeof node->args);
        if (td_model_tie_resolve(model, s, node, err) != 0) return -1;
        if (s->n_inputs == 0) {
            node->n_inputs = 1;
            node->inputs[0] = i - 1; /* the previous node, or the batch (-1) for the first */
        } else {
            node->n_inputs = s->n_inputs;
            for (int j = 0; j < s->n_inputs; j++) {
                int k = find_node(model, i, s->inputs[j]);
                if (k == -2)
                    return td_fail(err,
                                   "model.nodes[%d].inputs[%d]: no earlier node is named \"%s\" "
                                   "(inputs must name a node above this one, or \"input\")",
                                   i, j, s->inputs[j]);
                node->inputs[j] = k;
            }
        }
        const td_op_sig *sig = s->op->sig;
        if (node->n_inputs < sig->min_inputs || node->n_inputs > sig->max_inputs)
            return td_fail(err, "model.nodes[%d] (\"%s\"): op %s takes %d to %d inputs, found %d",
                           i, node->name, sig->name, sig->min_inputs, sig->max_inputs,
                           node->n_inputs);
        for (int j = 0; j < node->n_inputs; j++)
            node->in_shape[j] = node->inputs[j] == TD_INPUT_NODE
                                    ? model->input_shape
                                    : model->nodes[node->inputs[j]].out_shape;
        if (node->impl->build(model, node, err) != 0)
            return td_fail_prefix(err, "model.nodes[%d] (\"%s\", %s)", i, node->name, sig->name);
        if (td_model_tie_check(model, s, node, err) != 0) return -1;
        if (node->scratch_floats > model->scratch_floats)
            model->scratch_floats = node->scratch_floats;
    }
    /* Every node but the last must feed a later one: an unused branch would silently receive no
     * gradient, which is never what the author of the spec meant. */
    for (int i = 0; i + 1 < n; i++) {
        bool used = false;
        for (int k = i + 1; k < n && !used; k++)
            for (int j = 0; j < model->nodes[k].n_inputs; j++)
                if (model->nodes[k].inputs[j] == i) used = true;
        if (!used)
            return td_fail(err,
                           "model.nodes[%d] (\"%s\"): its output is not used by any later node; "
                           "only the last node is the model's output",
                           i, model->nodes[i].name);
    }
    return 0;
}

/* Turns the specs' segment numbers into model->segments, in node order, and marks the nodes
 * whose outputs only their own segment reads. */
static int link_segments(td_model *model, const td_node_spec *specs, int n, td_err *err) {
    for (int i = 0; i < n; i++) {
        int id = specs[i].segment;
        if (id <= 0 || (i > 0 && specs[i - 1].segment == id)) continue;
        for (int j = 0; j < i; j++)
            if (specs[j].segment == id)
                return td_fail(err,
                               "model.nodes[%d] (\"%s\"): recompute segment %d also holds "
                               "nodes[%d] (\"%s\"), and a segment must be consecutive nodes",
                               i, specs[i].name, id, j, specs[j].name);
        int last = i;
        while (last + 1 < n && specs[last + 1].segment == id) last++;
        model->segments =
            td_realloc(model->segments, (size_t)(model->n_segments + 1) * sizeof(td_segment));
        model->segments[model->n_segments] = (td_segment){.first = i, .last = last};
        for (int k = i; k <= last; k++) model->nodes[k].segment = model->n_segments;
        model->n_segments++;
    }
    for (int i = 0; i < n; i++) {
        td_node *node = &model->nodes[i];
        /* the model's output is the loss's input, read after forward */
        node->dropped = node->segment >= 0 && i + 1 < n;
        for (int k = i + 1; k < n && node->dropped; k++)
            for (int j = 0; j < model->nodes[k].n_inputs; j++)
                if (model->nodes[k].inputs[j] == i && model->nodes[k].segment != node->segment)
                    node->dropped = false;
    }
    return 0;
}

/* A node's output (and its gradient) for the largest batch. */
static size_t out_bytes(const td_model *model, const td_node *node, size_t elem_bytes) {
    if (node->out_fused) return 0;
    return (size_t)model->max_n * td_shape_size(node->out_shape) * elem_bytes;
}

/* What of a node lives in the segments' shared region: a dropped output with its gradient, and
 * the saved state of any node in a segment unless it must outlive recomputation. */
static void push_recomputed(td_arena *arena, td_node *node, size_t bytes) {
    if (node->dropped) {
        node->out = bytes ? td_arena_push(arena, bytes) : NULL;
        node->grad = bytes ? td_arena_push(arena, bytes) : NULL;
    }
    if (node->segment >= 0 && !node->keep_saved)
        node->saved = node->saved_bytes ? td_arena_push(arena, node->saved_bytes) : NULL;
}

/* A segment's share of the region, carved from arena's start. */
static void push_segment(td_arena *arena, td_model *model, const td_segment *seg,
                         size_t elem_bytes) {
    for (int i = seg->first; i <= seg->last; i++)
        push_recomputed(arena, &model->nodes[i], out_bytes(model, &model->nodes[i], elem_bytes));
}

/* Carves activations, gradients and saved state out of one arena; decides which input
 * gradients are needed at all (none flow into the batch, nor into a parameter-free prefix) and
 * which consumer writes a gradient first in backward order, so the others add to it. */
static void layout(td_model *model, td_arena *arena, size_t elem_bytes, bool *needs_grad,
                   bool *written) {
    int n = model->n_nodes;
    size_t start = arena->used;
    /* The region is as large as the largest segment's share; each segment's share is carved
     * from its start, so segments overlap each other and nothing else. */
    size_t region = 0;
    model->dropped_bytes = 0;
    for (int s = 0; s < model->n_segments; s++) {
        td_arena count = {0};
        push_segment(&count, model, &model->segments[s], elem_bytes);
        /* whole 64-byte units, as pushes occupy them: the totals then add up exactly */
        size_t share = (count.used + 63) / 64 * 64;
        model->dropped_bytes += share;
        if (share > region) region = share;
    }
    for (int i = 0; i < n; i++) {
        td_node *node = &model->nodes[i];
        size_t out = out_bytes(model, node, elem_bytes);
        if (!node->dropped) {
            node->out = out ? td_arena_push(arena, out) : NULL;
            node->grad = out ? td_arena_push(arena, out) : NULL;
        }
        if (node->segment < 0 || node->keep_saved)
            node->saved = node->saved_bytes ? td_arena_push(arena, node->saved_bytes) : NULL;
        needs_grad[i] = node->n_params > 0;
        for (int j = 0; j < node->n_inputs; j++) {
            int k = node->inputs[j];
            if (k == TD_INPUT_NODE ? model->input_grad != NULL : needs_grad[k])
                needs_grad[i] = true;
        }
    }
    char *region_base = region ? td_arena_push(arena, region) : NULL;
    for (int s = 0; s < model->n_segments; s++) {
        td_arena share = {region_base, 0, region};
        push_segment(&share, model, &model->segments[s], elem_bytes);
    }
    model->region_bytes = region;
    model->activation_bytes = (arena->used - start + 63) / 64 * 64;
    model->scratch = td_arena_floats(arena, model->scratch_floats);
    for (int i = 0; i < n; i++) written[i] = false;
    bool input_written = false;
    for (int i = n - 1; i >= 0; i--) {
        td_node *node = &model->nodes[i];
        for (int j = 0; j < node->n_inputs; j++) {
            int k = node->inputs[j];
            /* a fused ReLU has no output: its reader reads, and sends its gradient to, the
             * ReLU's input (which fuse_relus made sure is a node) */
            if (j == 0 && node->relu_in) k = model->nodes[k].inputs[0];
            node->in[j] = k == TD_INPUT_NODE ? NULL : model->nodes[k].out;
            if (k == TD_INPUT_NODE && model->input_grad) {
                node->in_grad[j] = model->input_grad;
                node->in_grad_add[j] = input_written;
                input_written = true;
                continue;
            }
            if (k == TD_INPUT_NODE || !needs_grad[k]) {
                node->in_grad[j] = NULL;
                continue;
            }
            node->in_grad[j] = model->nodes[k].grad;
            node->in_grad_add[j] = written[k];
            written[k] = true;
        }
    }
}

td_node *td_model_only_reader(td_model *model, int k) {
    td_node *reader = NULL;
    for (int i = k + 1; i < model->n_nodes; i++)
        for (int j = 0; j < model->nodes[i].n_inputs; j++)
            if (model->nodes[i].inputs[j] == k) {
                if (reader) return NULL;
                reader = &model->nodes[i];
            }
    return reader;
}

/* Marks the ReLUs a reader absorbs on the CPU (td_node.relu_in): a RELU node whose only reader
 * ABSORBS_RELU, fed by a node (not the batch), in the reader's checkpoint segment (so which nodes
 * read across segments, and so what is dropped, stays as link_segments decided). */
static void fuse_relus(td_model *model) {
    for (int i = 0; i < model->n_nodes; i++) {
        td_node *node = &model->nodes[i];
        int k = node->inputs[0];
        if (!(node->op->traits & TD_OP_ABSORBS_RELU) || node->n_inputs != 1 || k < 0) continue;
        td_node *relu = &model->nodes[k];
        if (!(relu->op->traits & TD_OP_RELU) || relu->inputs[0] < 0 ||
            relu->segment != node->segment || td_model_only_reader(model, k) != node)
            continue;
        relu->out_fused = true;
        node->relu_in = true;
    }
}

int td_model_build(td_model *model, const td_node_spec *specs, int n_specs, td_shape input_shape,
                   int max_n, int threads, uint64_t seed, unsigned flags, td_err *err) {
    memset(model, 0, sizeof *model);
    TD_ASSERT(threads >= 1, "a model runs on at least one thread");
    model->threads = threads;
    if (threads > 1) td_par_blas_single(); /* the team calls OpenBLAS from each of its threads */
    if (n_specs <= 0) return td_fail(err, "model.nodes: expected at least one node");
    model->n_nodes = n_specs;
    model->nodes = td_calloc((size_t)n_specs, sizeof(td_node));
    model->input_shape = input_shape;
    model->max_n = max_n;
    if (link_nodes(model, specs, n_specs, err) != 0 ||
        link_segments(model, specs, n_specs, err) != 0) {
        td_model_free(model);
        return -1;
    }
    for (int i = 0; i < n_specs; i++) {
        td_node *node = &model->nodes[i];
        for (int j = 0; j < node->n_params; j++)
            node->params[j] = &model->params[node->param_ids[j]];
        for (int j = 0; j < node->n_buffers; j++)
            node->buffers[j] = &model->buffers[node->buffer_ids[j]];
    }
    td_model_tie_finish(model);
    model->param_block = td_aligned_alloc(model->param_floats * sizeof(float));
    model->grad_block = td_aligned_alloc(model->param_floats * sizeof(float));
    model->buffer_block = td_aligned_alloc(model->buffer_floats * sizeof(float));
    init_params(model, seed);
    if (flags & TD_MODEL_INPUT_GRAD)
        model->input_grad =
            td_aligned_alloc((size_t)max_n * td_shape_size(input_shape) * sizeof(float));

    if (flags & TD_MODEL_NO_ARENA) return 0; /* a device plans its own fusions */
    if (!(flags & TD_MODEL_UNFUSED)) fuse_relus(model);
    td_arena plan = {0};
    td_model_layout(model, &plan, sizeof(float));
    model->arena.cap = plan.used;
    model->arena.base = td_aligned_alloc(plan.used);
    td_model_layout(model, &model->arena, sizeof(float));
    return 0;
}

void td_model_layout(td_model *model, td_arena *arena, size_t elem_bytes) {
    bool *needs_grad = td_calloc((size_t)model->n_nodes, sizeof(bool));
    bool *written = td_calloc((size_t)model->n_nodes, sizeof(bool));
    layout(model, arena, elem_bytes, needs_grad, written);
    free(needs_grad);
    free(written);
}

double td_node_arg(const td_node *node, const char *name) {
    for (int i = 0; node->op->sig->args[i].name; i++)
        if (strcmp(node->op->sig->args[i].name, name) == 0) return node->args[i];
    td_die(__FILE__, __LINE__, name, "td_node_arg: the op has no argument of this name");
}

float *td_model_swap_grad_block(td_model *model, float *block) {
    float *old = model->grad_block;
    memcpy(block, old, model->param_floats * sizeof(float));
    model->grad_block = block;
    for (int i = 0; i < model->n_params; i++)
        model->params[i].grad = block + model->params[i].offset;
    return old;
}

void td_model_free(td_model *model) {
    free(model->input_grad);
    free(model->profile);
    free(model->nodes);
    free(model->params);
    free(model->buffers);
    free(model->segments);
    free(model->aliases);
    free(model->buffer_block);
    free(model->param_block);
    free(model->grad_block);
    free(model->arena.base);
    memset(model, 0, sizeof *model);
}

static double seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

void td_model_enable_profile(td_model *model) {
    if (!model->profile) model->profile = td_calloc(2 * (size_t)model->n_nodes, sizeof(double));
}

typedef struct profile_row {
    int node;
    double total;
} profile_row;

static int by_total_desc(const void *a, const void *b) {
    double x = ((const profile_row *)a)->total, y = ((const profile_row *)b)->total;
    return (x < y) - (x > y);
}

void td_model_print_profile(const td_model *model, long steps, FILE *out) {
    if (!model->profile || steps <= 0) return;
    profile_row *rows = td_calloc((size_t)model->n_nodes, sizeof *rows);
    double sum = 0;
    for (int i = 0; i < model->n_nodes; i++) {
        rows[i].node = i;
        rows[i].total = model->profile[2 * i] + model->profile[2 * i + 1];
        sum += rows[i].total;
    }
    qsort(rows, (size_t)model->n_nodes, sizeof *rows, by_total_desc);
    fprintf(out, "[traind] profile: ms per step (forward + backward), %.3f ms in the model\n",
            sum * 1e3 / (double)steps);
    for (int i = 0; i < model->n_nodes; i++) {
        int k = rows[i].node;
        const td_node *node = &model->nodes[k];
        if (node->out_fused) continue; /* timed in its reader, which names it */
        char name[2 * TD_NAME_MAX + 8], op[64];
        const td_node *relu = node->relu_in ? &model->nodes[node->inputs[0]] : NULL;
        snprintf(name, sizeof name, "%s%s%s", relu ? relu->name : "", relu ? "+" : "", node->name);
        snprintf(op, sizeof op, "%s%s%s", relu ? relu->op->sig->name : "", relu ? "+" : "",
                 node->op->sig->name);
        fprintf(out, "[traind]   %-20s %-14s %8.3f = %8.3f + %8.3f\n", name, op,
                rows[i].total * 1e3 / (double)steps, model->profile[2 * k] * 1e3 / (double)steps,
                model->profile[2 * k + 1] * 1e3 / (double)steps);
    }
    free(rows);
}

const float *td_model_forward(td_model *model, const float *x, const td_run *run) {
    TD_ASSERT(run->n > 0 && run->n <= model->max_n, "batch larger than the model was built for");
    td_run r = *run;
    r.scratch = model->scratch;
    for (int i = 0; i < model->n_nodes; i++) {
        td_node *node = &model->nodes[i];
        for (int j = 0; j < node->n_inputs; j++)
            if (node->inputs[j] == TD_INPUT_NODE) node->in[j] = (float *)x;
        if (node->segment >= 0 && model->segments[node->segment].first == i && r.rng)
            model->segments[node->segment].rng = *r.rng;
        if (node->out_fused) continue; /* its reader runs it (td_node.relu_in) */
        double t0 = model->profile ? seconds() : 0;
        node->impl->forward(node, &r);
        if (model->profile) model->profile[2 * i] += seconds() - t0;
    }
    return model->nodes[model->n_nodes - 1].out;
}

/* Rebuilds a segment's activations and saved state from its inputs (kept by forward), with the
 * dropout generator as the segment's first forward found it: the same masks, so backward sees
 * exactly the forward it differentiates. Timed as forward. */
static void recompute_segment(td_model *model, const td_segment *seg, const td_run *run) {
    if (!td_segment_runs_backward(model, seg)) return;
    td_run r = *run;
    td_rng rng = seg->rng;
    r.rng = run->rng ? &rng : NULL;
    r.recompute = true;
    for (int i = seg->first; i <= seg->last; i++) {
        if (model->nodes[i].out_fused) continue;
        double t0 = model->profile ? seconds() : 0;
        model->nodes[i].impl->forward(&model->nodes[i], &r);
        if (model->profile) model->profile[2 * i] += seconds() - t0;
    }
}

void td_model_backward(td_model *model, const float *dlogits, const td_run *run) {
    td_run r = *run;
    r.scratch = model->scratch;
    td_node *last = &model->nodes[model->n_nodes - 1];
    memcpy(last->grad, dlogits, (size_t)run->n * td_shape_size(last->out_shape) * sizeof(float));
    for (int i = model->n_nodes - 1; i >= 0; i--) {
        td_node *node = &model->nodes[i];
        if (node->segment >= 0 && model->segments[node->segment].last == i)
            recompute_segment(model, &model->segments[node->segment], &r);
        if (!td_node_runs_backward(node) || node->out_fused) continue;
        double t0 = model->profile ? seconds() : 0;
        if (node->grads_add) { /* a tied weight whose gradient a later node began */
            td_run add = r;
            add.accumulate_grads = true;
            node->impl->backward(node, &add);
        } else {
            node->impl->backward(node, &r);
        }
        if (model->profile) model->profile[2 * i + 1] += seconds() - t0;
        if (r.node_done && node->n_params > 0) r.node_done(r.node_done_ctx, node);
    }
}
