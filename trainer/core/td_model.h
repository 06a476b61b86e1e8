/* The model: a list of named nodes run in order, each an op with its parameters and inputs.
 *
 * A node reads the outputs of earlier nodes (by default the one before it; "input" is the batch),
 * so residual graphs are a node with two inputs. All parameters live in one flat block and all
 * gradients in another (saving, zeroing, clipping and all-reducing become loops over one buffer);
 * all activations, their gradients and the ops' saved state live in one arena planned at build
 * time for the largest batch. Nothing is allocated while training.
 */
#ifndef TD_MODEL_H
#define TD_MODEL_H

#include "base/td_error.h"
#include "core/td_rng.h"
#include "core/td_tensor.h"

#include <stdint.h>
#include <stdio.h>

#define TD_MAX_INPUTS      4
#define TD_MAX_NODE_PARAMS 4
#define TD_MAX_OP_ARGS     8
#define TD_INPUT_NODE      (-1)

typedef struct td_model td_model;
typedef struct td_node td_node;

/* Everything a forward or backward call needs to know about the batch at hand. */
/* Sums across data-parallel ranks, for ops whose statistics span the global batch
 * (SyncBatchNorm). The model knows nothing of the transport: the trainer supplies it. A failed
 * reduction sets `failed`; the trainer checks it after each pass. */
typedef struct td_sync {
    int (*sum)(void *ctx, float *values, size_t n);
    void *ctx;
    bool failed;
} td_sync;

typedef struct td_run {
    int n;                 /* samples in this batch (<= the model's max batch) */
    bool training;         /* dropout active, BatchNorm batch statistics */
    bool accumulate_grads; /* add into parameter gradients (gradient accumulation) */
    float *scratch;        /* shared temporary of model->scratch_floats, valid during one call */
    td_rng *rng;           /* for dropout masks */
    td_sync *sync;         /* SyncBatchNorm across ranks; NULL: statistics of this batch alone */
    /* This forward repeats, in backward, one of the same batch (activation checkpointing): ops
     * must reproduce their outputs and saved state without side effects (no running-statistics
     * update; BatchNorm normalises by the statistics it saved). The generator is restored. */
    bool recompute;
    /* Called by backward after each node with parameters, whose gradients are then final (DDP's
     * reducer starts all-reducing them); NULL: none. */
    void (*node_done)(void *ctx, const td_node *node);
    void *node_done_ctx;
} td_run;

typedef enum td_arg_type { TD_ARG_INT, TD_ARG_FLOAT, TD_ARG_BOOL, TD_ARG_CHOICE } td_arg_type;

/* One field an op accepts in its JSON node, with its type, default and range. */
typedef struct td_op_arg {
    const char *name;
    td_arg_type type;
    bool required;
    double def;
    double min, max;     /* inclusive, for numbers */
    const char *choices; /* for TD_ARG_CHOICE: "none|tanh"; the value is the index */
} td_op_arg;

/* What a spec may say of an op: its name, how many inputs, its arguments. One per op, with no
 * code (ops/td_op_sigs.c): the spec's validator needs nothing else, so the daemon links no
 * kernel. */
typedef struct td_op_sig {
    const char *name; /* as written in the spec: "conv2d" */
    int min_inputs, max_inputs;
    const td_op_arg *args; /* terminated by an entry with name == NULL */
} td_op_sig;

/* What every op provides; the ops themselves, and the table of them, are ops/ (ops/td_ops.h). */
typedef struct td_op {
    const td_op_sig *sig; /* its name, inputs and arguments */
    /* From the input shapes (already set): the output shape, parameters, saved-state and scratch
     * needs. Returns -1 with a message when the shapes do not fit the op. */
    int (*build)(td_model *model, td_node *node, td_err *err);
    void (*forward)(td_node *node, const td_run *run);
    /* Gradients of the inputs (where in_grad[i] is set, overwriting or adding per in_grad_add[i])
     * and of the parameters, from node->grad. */
    void (*backward)(td_node *node, const td_run *run);
    /* The same op compiled for each instruction set, indexed by td_isa (core/td_isa.h), or NULL
     * when it has one implementation. */
    const struct td_op *const *variants;
    unsigned traits; /* TD_OP_RELU, TD_OP_ABSORBS_RELU: what the CPU model may fuse */
} td_op;

/* td_op.traits. RELU: y = max(x, 0) elementwise. ABSORBS_RELU: a node of this op whose input is
 * a RELU node may run that ReLU itself (td_node.relu_in), reading the ReLU's input instead. */
#define TD_OP_RELU         1u
#define TD_OP_ABSORBS_RELU 2u

struct td_node {
    char name[TD_NAME_MAX];
    const td_op *op;   /* what the node is (&td_op_conv2d): compare ops with this */
    const td_op *impl; /* the code that runs it: op's variant for the active instruction set */
    double args[TD_MAX_OP_ARGS]; /* in the order of op->sig->args */

    int n_inputs;
    int inputs[TD_MAX_INPUTS]; /* node indices, TD_INPUT_NODE for the batch */
    td_shape in_shape[TD_MAX_INPUTS];
    td_shape out_shape;

    int n_params;
    int param_ids[TD_MAX_NODE_PARAMS];    /* into model->params, stable while it grows */
    td_param *params[TD_MAX_NODE_PARAMS]; /* resolved once the model is built */
    int n_buffers;
    int buffer_ids[TD_MAX_NODE_PARAMS];
    td_param *buffers[TD_MAX_NODE_PARAMS];

    int max_n; /* the largest batch the buffers hold */
    /* The threads forward and backward split the work over (core/td_parallel.h), which scratch
     * is sized for: ops that give each thread its own part of it size it as threads parts. */
    int threads;
    size_t saved_bytes; /* what forward keeps for backward (pool argmax, dropout mask) */
    /* Set by build when forward computes saved state that a recomputing forward reads instead of
     * rewriting (BatchNorm's batch statistics): it then outlives activation checkpointing. */
    bool keep_saved;
    size_t scratch_floats; /* temporary need during one forward or backward call */

    /* Set when the model is allocated. */
    float *in[TD_MAX_INPUTS];
    float *in_grad[TD_MAX_INPUTS]; /* NULL: no gradient wanted (the batch itself) */
    bool in_grad_add[TD_MAX_INPUTS];
    float *out, *grad; /* [max_n, out size] */
    void *saved;
    /* Activation checkpointing: the segment this node belongs to (-1: none), and whether its
     * output and gradient are dropped after forward (only nodes of its own segment read it), to
     * live in the region all segments share. */
    int segment;
    bool dropped;
    /* Set by a device plan when the op that reads this node's output computes it inside its own
     * kernels (BatchNorm followed by ReLU on the GPU): the output and its gradient then never
     * exist, and the layout gives them no memory (out and grad stay NULL). */
    bool out_fused;
    /* On the CPU (td_model_build, unless TD_MODEL_UNFUSED): input 0 is a ReLU whose output is
     * fused into this node (that ReLU is out_fused). The node reads the ReLU's input and applies
     * ReLU itself; maxpool2d does, as max and ReLU commute: relu(max(x)) = max(relu(x)). */
    bool relu_in;
    /* On a GPU (td_gpu.h): the op's device plan (descriptors, chosen algorithms); the pointers
     * above then address device memory of the compute precision's element type. */
    void *gpu;
    int index; /* in model->nodes */
    /* Weight tying (td_model_tie.c): the earlier param this node's "weight" is (-1: none), and
     * whether its backward adds into parameter gradients a later node (earlier in backward)
     * already wrote. */
    int weight_from_param;
    int tie_state; /* 0: no tie or not yet; 1: the weight was taken; 2: shapes differ */
    bool grads_add;
};

/* How a node is described before the model is built (from JSON or a preset). */
typedef struct td_node_spec {
    char name[TD_NAME_MAX];
    const td_op_sig *sig; /* the op the spec names */
    /* the code that runs it: set from sig before the model is built (td_spec_resolve_ops), or by
     * hand */
    const td_op *op;
    double args[TD_MAX_OP_ARGS];
    int n_inputs; /* 0: the previous node (or the batch, for the first) */
    char inputs[TD_MAX_INPUTS][TD_NAME_MAX];
    /* Activation checkpointing: nodes with the same number > 0 form one segment (consecutive
     * nodes; see td_segments_assign); 0: none. */
    int segment;
    /* Weight tying: this node's "weight" is that earlier node's (GPT's lm_head and wte, as
     * nanoGPT ties them); empty: its own. */
    char weight_from[TD_NAME_MAX];
    /* > 0: the node's weight starts normal(0, init_std) and its bias at 0 (GPT-2's init) instead
     * of the op's PyTorch default. */
    double init_std;
} td_node_spec;

/* A run of consecutive nodes [first, last] recomputed in backward. Forward keeps only what
 * nodes outside the segment read (and BatchNorm's statistics); the rest of its activations,
 * their gradients and the ops' saved state live in one region every segment shares, rewritten
 * by recomputing the segment from its inputs when backward reaches it. Memory falls from the sum
 * over segments to the largest one; the price is a second forward of each segment. */
typedef struct td_segment {
    int first, last;
    td_rng rng; /* the dropout generator as the segment's forward found it */
} td_segment;

struct td_model {
    int n_nodes;
    td_node *nodes;
    td_shape input_shape;
    int max_n;
    int threads; /* every node's (td_node.threads) */

    int n_params;
    td_param *params;    /* in registration order: forward order, PyTorch's state_dict order */
    size_t param_floats; /* the block's length: parameters and the zero gaps aligning them */
    size_t param_count;  /* the parameters' values alone, as PyTorch counts them */
    float *param_block, *grad_block;

    int n_buffers;
    td_param *buffers; /* BatchNorm running statistics and counters */
    size_t buffer_floats;
    float *buffer_block;

    float *input_grad; /* NULL unless built with TD_MODEL_INPUT_GRAD */
    double *profile;   /* per node: forward and backward seconds; NULL unless profiling */

    int n_segments;
    td_segment *segments;
    size_t activation_bytes; /* the layout's total: activations, gradients, saved state */
    size_t dropped_bytes;    /* of which what checkpointing would otherwise keep, all segments */
    size_t region_bytes;     /* ... and the shared region that replaces it */

    size_t scratch_floats;
    td_arena arena;
    float *scratch;

    /* Tied weights' second names ("lm_head.weight" for "transformer.wte.weight"): checkpoints
     * write both, as PyTorch's state_dict does, and loading accepts both. */
    int n_aliases;
    struct td_alias {
        char name[TD_NAME_MAX + 32];
        int param;
    } * aliases;
};

/* Weight tying and init_std (td_model_tie.c), called by td_model_build. */
int td_model_tie_resolve(td_model *model, const td_node_spec *spec, td_node *node, td_err *err);
int td_model_tie_check(td_model *model, const td_node_spec *spec, td_node *node, td_err *err);
void td_model_tie_finish(td_model *model);
/* Whether node finishes p's gradient in backward: the last node (in backward order, the first
 * in the model) that uses it. DDP's reducer and the fused optimizer wait for that one. */
bool td_node_finishes(const td_node *node, const td_param *p);

/* td_model_build flags. INPUT_GRAD: backward also produces the gradient with respect to the
 * batch itself, in model->input_grad ([max_n, input size]), for gradient checks. */
#define TD_MODEL_INPUT_GRAD 1u
/* NO_ARENA: no host arena for activations; the model is to be attached to a device, which lays
 * out its own (td_model_layout). */
#define TD_MODEL_NO_ARENA 2u
/* UNFUSED: every node runs as its own op on the CPU; without it a ReLU read only by a max-pool
 * runs inside the pool (td_node.relu_in), which saves a pass over the larger tensor each way and
 * its memory. Tests compare the two. */
#define TD_MODEL_UNFUSED 4u

/* Builds and allocates the model for batches of up to max_n samples of input_shape, run on
 * `threads` threads (train.threads; 1 runs everything on the caller's). Parameters are
 * initialised as PyTorch initialises them by default, from the given seed. */
int td_model_build(td_model *model, const td_node_spec *specs, int n_specs, td_shape input_shape,
                   int max_n, int threads, uint64_t seed, unsigned flags, td_err *err);
void td_model_free(td_model *model);

/* Called by an op's build: registers parameter `suffix` of the node ("weight") with PyTorch's
 * shape and initial values. The pointer is valid until the next registration. */
td_param *td_model_add_param(td_model *model, td_node *node, const char *suffix, int ndim,
                             const int *dims, td_init init);
/* Registers a buffer ("running_mean"): saved and loaded with the parameters, never trained.
 * ndim 0 is a scalar, as PyTorch's num_batches_tracked. */
td_param *td_model_add_buffer(td_model *model, td_node *node, const char *suffix, int ndim,
                              const int *dims, float fill, td_dtype dtype);

/* Marks segments in specs (their `segment` numbers) from entries that each name one: a
 * module prefix (first set, last empty: "layer1.0" is every node called so or "layer1.0.<any>",
 * which must be consecutive) or a first and last node by name. Errors name the entry's index;
 * the caller prefixes its JSON path. */
typedef struct td_segment_name {
    char first[TD_NAME_MAX];
    char last[TD_NAME_MAX];
} td_segment_name;
int td_segments_assign(td_node_spec *specs, int n_specs, const td_segment_name *names, int n_names,
                       td_err *err);

/* Lays out every node's output, gradient and saved state in arena (a counting pass when its base
 * is NULL), elem_bytes per activation element, then the shared scratch; decides which input
 * gradients are needed and which consumer writes each first. */
void td_model_layout(td_model *model, td_arena *arena, size_t elem_bytes);

/* The one node that reads node k's output, or NULL when none or several do (fusions need one). */
td_node *td_model_only_reader(td_model *model, int k);

/* The value of a node's argument by its spec name ("stride"): code outside an op's own file (its
 * GPU side) reads arguments without depending on the op's private order. */
double td_node_arg(const td_node *node, const char *name);

/* Moves the gradients into block (param_floats, contents copied) and returns the block they
 * were in, which the caller now owns: DDP keeps gradients in memory the ranks share. */
float *td_model_swap_grad_block(td_model *model, float *block);

/* A parameter or buffer by its state_dict name; NULL if there is none. */
const td_param *td_model_find_param(const td_model *model, const char *name);

/* Starts timing every node's forward and backward (see td_model_print_profile). */
void td_model_enable_profile(td_model *model);
/* Prints per-node time per step, slowest first, for `steps` training steps. */
void td_model_print_profile(const td_model *model, long steps, FILE *out);

/* Runs the batch x ([n, input size]) through every node; returns the last node's output. */
const float *td_model_forward(td_model *model, const float *x, const td_run *run);
/* Backpropagates dlogits ([n, output size]) into the parameter gradients. */
void td_model_backward(td_model *model, const float *dlogits, const td_run *run);
/* Whether backward calls the node: it has parameters or some input wants a gradient. */
static inline bool td_node_runs_backward(const td_node *node) {
    bool any = node->n_params > 0;
    for (int j = 0; j < node->n_inputs; j++) any = any || node->in_grad[j];
    return any;
}
/* Whether backward must recompute the segment: some node of it runs backward. */
static inline bool td_segment_runs_backward(const td_model *m, const td_segment *seg) {
    bool any = false;
    for (int i = seg->first; i <= seg->last; i++) any = any || td_node_runs_backward(&m->nodes[i]);
    return any;
}
static inline td_shape td_model_output_shape(const td_model *m) {
    return m->nodes[m->n_nodes - 1].out_shape;
}

#endif
