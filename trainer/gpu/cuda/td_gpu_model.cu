// A model's life on the device context (td_gpu_context.cu): the op table through which each node
// finds its GPU side, attaching (plans, parameter blocks, the activation arena) and detaching,
// transfers between host and device, batches, and forward, loss and backward.
#include "gpu/cuda/td_gpu_internal.h"

#include <stdlib.h>
#include <string.h>

// Failures during open and attach go straight to err (there is no step to check afterwards).
static int take_failure(td_gpu *g, td_err *err) {
    if (!g->failed) return 0;
    td_fail(err, "%s", g->msg);
    return -1;
}

// ---- the op table -----------------------------------------------------------------------------

// Every op of ops/td_ops.def by its GPU side. The references are weak: an op that has no
// td_gpu_op_<name> (yet) is a null entry here, which plan_nodes reports for a model that uses it,
// instead of an undefined symbol that would keep the library from loading for every model.
extern "C" {
#define TD_OP(name) extern const td_gpu_op td_gpu_op_##name __attribute__((weak));
#include "ops/td_ops.def"
}

static const td_gpu_op *const gpu_ops[] = {
#define TD_OP(name) &td_gpu_op_##name,
#include "ops/td_ops.def"
};

static const td_gpu_op *gpu_op_for(const td_op *op) {
    for (size_t i = 0; i < sizeof gpu_ops / sizeof gpu_ops[0]; i++)
        if (gpu_ops[i] && gpu_ops[i]->op == op) return gpu_ops[i];
    return NULL;
}

// ---- attaching a model ------------------------------------------------------------------------

static size_t input_elems(const td_model *m) {
    return (size_t)m->max_n * td_shape_size(m->input_shape);
}

// Labels of a full batch: one per sample, or a language model's one per position (its logits
// are a sequence [T, vocabulary]).
static size_t label_count(const td_model *m) {
    td_shape out = m->nodes[m->n_nodes - 1].out_shape;
    return (size_t)m->max_n * (td_shape_is_seq(out) ? out.h : 1);
}

// The embedding that reads the batch (its token ids), or NULL.
static const td_node *ids_reader(const td_model *m) {
    for (int i = 0; i < m->n_nodes; i++)
        if (m->nodes[i].op == &td_op_embedding && m->nodes[i].inputs[0] == TD_INPUT_NODE)
            return &m->nodes[i];
    return NULL;
}

td_node *td_gpu_fused_relu(const td_gpu *g, td_model *m, const td_node *node) {
    if (!g->fusion || (node->op != &td_op_batchnorm2d && node->op != &td_op_batchnorm1d &&
                       node->op != &td_op_add))
        return NULL;
    td_node *reader = td_model_only_reader(m, (int)(node - m->nodes));
    if (!reader || reader->op != &td_op_relu || reader->segment != node->segment) return NULL;
    return reader;
}

static int plan_nodes(td_gpu *g, td_model *m, td_err *err) {
    g->ops = (const td_gpu_op **)td_calloc((size_t)m->n_nodes, sizeof *g->ops);
    m->scratch_floats = 0;
    for (int i = 0; i < m->n_nodes; i++) {
        td_node *node = &m->nodes[i];
        const td_gpu_op *op = gpu_op_for(node->op);
        if (!op)
            return td_fail(err, "model.nodes[%d] (\"%s\"): op %s has no GPU implementation yet", i,
                           node->name, node->op->sig->name);
        // a node fused into the one it reads: that one's plan, earlier, found it its only reader
        int k = node->n_inputs == 1 ? node->inputs[0] : TD_INPUT_NODE;
        if (k != TD_INPUT_NODE && m->nodes[k].out_fused) op = &td_gpu_op_fused;
        g->ops[i] = op;
        node->saved_bytes = 0; // the CPU's needs are not the device's
        node->scratch_floats = 0;
        node->out_fused = false; // until the op's plan says otherwise
        if (op->plan(g, m, node, err) != 0)
            return td_fail_prefix(err, "model.nodes[%d] (\"%s\", %s) on the GPU", i, node->name,
                                  node->op->sig->name);
        if (take_failure(g, err) != 0)
            return td_fail_prefix(err, "model.nodes[%d] (\"%s\", %s) on the GPU", i, node->name,
                                  node->op->sig->name);
        if (node->scratch_floats > m->scratch_floats) m->scratch_floats = node->scratch_floats;
    }
    return 0;
}

static int alloc_blocks(td_gpu *g, td_model *m, td_err *err) {
    size_t pbytes = m->param_floats * sizeof(float), bbytes = m->buffer_floats * sizeof(float);
    g->params = (float *)td_gpu_malloc(g, pbytes, "parameters");
    g->grads = (float *)td_gpu_malloc(g, pbytes, "gradients");
    g->buffers = (float *)td_gpu_malloc(g, bbytes, "buffers");
    if (g->prec != TD_PREC_FP32)
        g->params_half = td_gpu_malloc(g, m->param_floats * 2, "16-bit parameters");
    if (take_failure(g, err) != 0) return -1;
    for (int i = 0; i < m->n_params; i++) {
        m->params[i].dev_data = g->params + m->params[i].offset;
        m->params[i].dev_grad = g->grads + m->params[i].offset;
    }
    for (int i = 0; i < m->n_buffers; i++)
        m->buffers[i].dev_data = g->buffers + m->buffers[i].offset;
    TD_CUDA_RET(g, cudaMemsetAsync(g->grads, 0, pbytes, g->stream), take_failure(g, err));

    // One arena: every activation, activation gradient and saved tensor, then the workspace.
    size_t elem = td_gpu_elem(g->prec);
    td_arena plan = {};
    td_model_layout(m, &plan, elem);
    g->arena_bytes = plan.used;
    g->arena = td_gpu_malloc(g, g->arena_bytes, "activations");
    if (take_failure(g, err) != 0) return -1;
    td_arena arena = {(char *)g->arena, 0, g->arena_bytes};
    td_model_layout(m, &arena, elem);
    g->workspace = m->scratch;
    g->workspace_bytes = m->scratch_floats * sizeof(float);

    size_t in = input_elems(m), labels = label_count(m);
    g->positions = (int)(labels / (size_t)m->max_n);
    g->input = td_gpu_malloc(g, in * elem, "the input batch");
    g->input_next = (float *)td_gpu_malloc(g, in * sizeof(float), "the next input batch");
    g->labels = (int32_t *)td_gpu_malloc(g, labels * sizeof(int32_t), "labels");
    g->labels_next = (int32_t *)td_gpu_malloc(g, labels * sizeof(int32_t), "the next labels");
    const td_node *first = ids_reader(m);
    if (first) {
        g->ids = (int32_t *)td_gpu_malloc(g, in * sizeof(int32_t), "the batch's token ids");
        g->ids_vocab = first->params[0]->dims[0];
    }
    g->totals = (double *)td_gpu_malloc(g, 2 * sizeof(double), "loss totals");
    g->rng_slots = 2 + (size_t)m->n_segments;
    g->rng_offset = (unsigned long long *)td_gpu_malloc(
        g, g->rng_slots * sizeof(unsigned long long), "the dropout counters");
    g->recompute_offset = g->rng_offset ? g->rng_offset + 1 : NULL;
    g->segment_offsets = g->rng_offset ? g->rng_offset + 2 : NULL;
    if (take_failure(g, err) != 0) return -1;
    TD_CUDA_RET(g, cudaMallocHost((void **)&g->input_staging, in * sizeof(float)),
                take_failure(g, err));
    TD_CUDA_RET(g, cudaMallocHost((void **)&g->labels_staging, labels * sizeof(int32_t)),
                take_failure(g, err));
    TD_CUDA_RET(g, cudaMemsetAsync(g->totals, 0, 2 * sizeof(double), g->stream),
                take_failure(g, err));
    TD_CUDA_RET(
        g, cudaMemsetAsync(g->rng_offset, 0, g->rng_slots * sizeof(unsigned long long), g->stream),
        take_failure(g, err));
    return td_gpu_loss_alloc(g, labels, err);
}

extern "C" void td_gpu_set_deterministic(td_gpu *g, bool on) {
    g->deterministic = on;
}

extern "C" int td_gpu_attach(td_gpu *g, td_model *m, td_precision prec, uint64_t seed,
                             td_err *err) {
    if (m->arena.base)
        return td_fail(err, "td_gpu_attach: the model was built with a host arena; build it "
                            "with TD_MODEL_NO_ARENA");
    if (g->model) return td_fail(err, "td_gpu_attach: a model is attached to this GPU already");
    g->model = m;
    g->prec = prec;
    g->seed = seed;
    const char *fusion = getenv("TRAIND_GPU_FUSION");
    g->fusion = !(fusion && strcmp(fusion, "0") == 0);
    if (plan_nodes(g, m, err) != 0 || alloc_blocks(g, m, err) != 0 ||
        td_gpu_upload(g, m, NULL, err) != 0) {
        td_gpu_detach(g, m);
        return -1;
    }
    return 0;
}

extern "C" void td_gpu_detach(td_gpu *g, td_model *m) {
    if (g->model != m) return;
    // The graph first: NCCL (2.26 on) will not destroy, or even finish aborting, a communicator
    // while a graph that captured its collectives lives. Destroying one in flight is allowed
    // (it is freed when it completes), so this never waits.
    if (g->graph) cudaGraphExecDestroy(g->graph);
    g->graph = NULL;
    td_gpu_ddp_stop(g); // before any wait: a dead peer must not hang the teardown
    cudaStreamSynchronize(g->stream);
    cudaStreamSynchronize(g->copy_stream);
    td_gpu_optim_free(g);
    td_gpu_loss_free(g);
    for (int i = 0; i < m->n_nodes; i++) {
        if (g->ops && g->ops[i] && g->ops[i]->release && m->nodes[i].gpu)
            g->ops[i]->release(&m->nodes[i]);
        m->nodes[i].gpu = NULL;
        m->nodes[i].in[0] = m->nodes[i].out = m->nodes[i].grad = NULL;
        m->nodes[i].out_fused = false; // the device's plan; a host layout gives it memory again
    }
    for (int i = 0; i < m->n_params; i++) m->params[i].dev_data = m->params[i].dev_grad = NULL;
    for (int i = 0; i < m->n_buffers; i++) m->buffers[i].dev_data = NULL;
    size_t in = input_elems(m), pbytes = m->param_floats * sizeof(float);
    size_t labels = label_count(m);
    td_gpu_free(g, g->input_next, in * sizeof(float));
    td_gpu_free(g, g->input, in * td_gpu_elem(g->prec));
    td_gpu_free(g, g->ids, in * sizeof(int32_t));
    td_gpu_free(g, g->labels_next, labels * sizeof(int32_t));
    td_gpu_free(g, g->labels, labels * sizeof(int32_t));
    td_gpu_free(g, g->totals, 2 * sizeof(double));
    td_gpu_free(g, g->rng_offset, g->rng_slots * sizeof(unsigned long long));
    if (g->input_staging) cudaFreeHost(g->input_staging);
    if (g->labels_staging) cudaFreeHost(g->labels_staging);
    td_gpu_free(g, g->arena, g->arena_bytes);
    td_gpu_free(g, g->params_half, m->param_floats * 2);
    td_gpu_free(g, g->buffers, m->buffer_floats * sizeof(float));
    td_gpu_free(g, g->grads, pbytes);
    td_gpu_free(g, g->params, pbytes);
    free(g->ops);
    g->ops = NULL;
    g->input = g->input_next = g->input_staging = NULL;
    g->labels = g->labels_next = g->labels_staging = g->ids = NULL;
    g->totals = NULL;
    g->rng_offset = g->recompute_offset = g->segment_offsets = NULL;
    g->rng_slots = 0;
    g->arena = g->params_half = NULL;
    g->params = g->grads = g->buffers = NULL;
    g->model = NULL;
}

// ---- transfers --------------------------------------------------------------------------------

extern "C" int td_gpu_upload(td_gpu *g, td_model *m, const td_optim *opt, td_err *err) {
    TD_CUDA_RET(g,
                cudaMemcpyAsync(g->params, m->param_block, m->param_floats * sizeof(float),
                                cudaMemcpyHostToDevice, g->stream),
                take_failure(g, err));
    TD_CUDA_RET(g,
                cudaMemcpyAsync(g->buffers, m->buffer_block, m->buffer_floats * sizeof(float),
                                cudaMemcpyHostToDevice, g->stream),
                take_failure(g, err));
    if (g->prec != TD_PREC_FP32) td_gpu_refresh_half(g, m->param_floats, g->stream);
    if (opt && g->optim_ready && td_gpu_optim_upload(g, opt, err) != 0) return -1;
    if (td_gpu_ddp_wait(g, g->stream, err) != 0) return -1;
    return take_failure(g, err);
}

extern "C" int td_gpu_download(td_gpu *g, td_model *m, td_optim *opt, td_err *err) {
    if (td_gpu_ddp_wait(g, g->stream, err) != 0) return -1;
    TD_CUDA_RET(g,
                cudaMemcpyAsync(m->param_block, g->params, m->param_floats * sizeof(float),
                                cudaMemcpyDeviceToHost, g->stream),
                take_failure(g, err));
    TD_CUDA_RET(g,
                cudaMemcpyAsync(m->buffer_block, g->buffers, m->buffer_floats * sizeof(float),
                                cudaMemcpyDeviceToHost, g->stream),
                take_failure(g, err));
    if (td_gpu_ddp_wait(g, g->stream, err) != 0) return -1;
    if (opt && g->optim_ready && td_gpu_optim_download(g, opt, err) != 0) return -1;
    return take_failure(g, err);
}

static float half_bits_to_float(td_precision p, uint16_t bits) {
    if (p == TD_PREC_BF16) {
        uint32_t u = (uint32_t)bits << 16;
        float f;
        memcpy(&f, &u, sizeof f);
        return f;
    }
    __half_raw raw;
    raw.x = bits;
    return __half2float(__half(raw));
}

extern "C" int td_gpu_read(td_gpu *g, const void *dev, size_t elems, float *host, td_err *err) {
    size_t elem = td_gpu_elem(g->prec);
    if (td_gpu_ddp_wait(g, g->stream, err) != 0) return -1;
    if (elem == 4) {
        TD_CUDA_RET(g, cudaMemcpy(host, dev, elems * 4, cudaMemcpyDeviceToHost),
                    take_failure(g, err));
        return 0;
    }
    // 16-bit values land in the second half of the caller's buffer, then widen in place from
    // the front (element i is read before anything is written at or beyond its own index)
    uint16_t *bits = (uint16_t *)(host + elems) - elems;
    TD_CUDA_RET(g, cudaMemcpy(bits, dev, elems * 2, cudaMemcpyDeviceToHost), take_failure(g, err));
    for (size_t i = 0; i < elems; i++) host[i] = half_bits_to_float(g->prec, bits[i]);
    return 0;
}

extern "C" int td_gpu_read_grads(td_gpu *g, const td_model *m, float *host, td_err *err) {
    if (td_gpu_ddp_wait(g, g->stream, err) != 0) return -1;
    TD_CUDA_RET(g,
                cudaMemcpy(host, g->grads, m->param_floats * sizeof(float), cudaMemcpyDeviceToHost),
                take_failure(g, err));
    return 0;
}

extern "C" int td_gpu_benchmark_convolutions(td_gpu *g, td_model *m, int *timed, td_err *err) {
    *timed = 0;
    if (g->model != m) return td_fail(err, "cuDNN benchmark: the model is not attached here");
    for (int i = 0; i < m->n_nodes; i++) {
        if (g->ops[i] != &td_gpu_op_conv2d) continue;
        int rc = td_gpu_conv_benchmark(g, &m->nodes[i]);
        if (rc < 0 || g->failed) {
            take_failure(g, err);
            return td_fail_prefix(err,
                                  "train.cudnn_benchmark: timing model.nodes[%d] (\"%s\")'s "
                                  "algorithms (set it false to use cuDNN's heuristics)",
                                  i, m->nodes[i].name);
        }
        *timed += rc;
    }
    // the searches wrote over the gradients: training starts from zeroed ones, as after attach
    TD_CUDA_RET(g, cudaMemsetAsync(g->grads, 0, m->param_floats * sizeof(float), g->stream),
                take_failure(g, err));
    TD_CUDA_RET(g, cudaStreamSynchronize(g->stream), take_failure(g, err));
    return take_failure(g, err);
}

// The batch's trip to the device, overlapped with the step queued before it:
//   host:        wait staging_free, fill the pinned staging buffers
//   copy_stream: wait input_taken (the previous batch left input_next), copy staging ->
//                input_next / labels_next, record staging_free and input_ready
//   stream:      wait input_ready, take the batch into input / labels (a device copy, or the
//                conversion to 16 bits: ~0.1 ms where the host copy of a ResNet-50 batch is
//                several), record input_taken
// so only the take-over is on the compute stream's path, and the host copy of batch k runs
// while step k-1 computes. Neither stream ever waits for the host. The price is one more fp32
// input batch on the device (input_next; 16-bit runs had it already, for the conversion).
extern "C" int td_gpu_set_batch(td_gpu *g, td_model *m, const float *x, const int32_t *labels,
                                int n, td_err *err) {
    if (n <= 0 || n > m->max_n)
        return td_fail(err, "td_gpu_set_batch: %d samples, the model holds 1..%d", n, m->max_n);
    size_t elems = (size_t)n * td_shape_size(m->input_shape);
    size_t label_bytes = (size_t)n * g->positions * sizeof(int32_t);
    // the previous batch's copy must have left the pinned buffers before they are refilled
    if (td_gpu_ddp_wait_event(g, g->staging_free, err) != 0) return -1;
    memcpy(g->input_staging, x, elems * sizeof(float));
    if (labels) memcpy(g->labels_staging, labels, label_bytes);
    cudaStream_t cs = g->copy_stream;
    TD_CUDA_RET(g, cudaStreamWaitEvent(cs, g->input_taken, 0), take_failure(g, err));
    TD_CUDA_RET(g,
                cudaMemcpyAsync(g->input_next, g->input_staging, elems * sizeof(float),
                                cudaMemcpyHostToDevice, cs),
                take_failure(g, err));
    if (labels)
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(g->labels_next, g->labels_staging, label_bytes,
                                    cudaMemcpyHostToDevice, cs),
                    take_failure(g, err));
    TD_CUDA_RET(g, cudaEventRecord(g->staging_free, cs), take_failure(g, err));
    TD_CUDA_RET(g, cudaEventRecord(g->input_ready, cs), take_failure(g, err));

    TD_CUDA_RET(g, cudaStreamWaitEvent(g->stream, g->input_ready, 0), take_failure(g, err));
    if (g->prec == TD_PREC_FP32)
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(g->input, g->input_next, elems * sizeof(float),
                                    cudaMemcpyDeviceToDevice, g->stream),
                    take_failure(g, err));
    else
        td_gpu_convert_in(g, g->input_next, g->input, elems, g->stream);
    td_gpu_take_ids(g, g->input_next, elems, g->stream);
    if (labels)
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(g->labels, g->labels_next, label_bytes,
                                    cudaMemcpyDeviceToDevice, g->stream),
                    take_failure(g, err));
    TD_CUDA_RET(g, cudaEventRecord(g->input_taken, g->stream), take_failure(g, err));
    return take_failure(g, err);
}

// ---- forward, loss, backward ------------------------------------------------------------------

static td_gpu_run gpu_run_of(td_gpu *g, const td_run *run) {
    td_gpu_run r = {};
    r.g = g;
    r.n = run->n;
    r.training = run->training;
    r.accumulate_grads = run->accumulate_grads;
    r.stream = g->stream;
    r.rng_offset = g->rng_offset;
    r.node_done = run->node_done;
    r.node_done_ctx = run->node_done_ctx;
    return r;
}

extern "C" void td_gpu_forward(td_gpu *g, td_model *m, const td_run *run) {
    td_gpu_run r = gpu_run_of(g, run);
    for (int i = 0; i < m->n_nodes && !g->failed; i++) {
        td_node *node = &m->nodes[i];
        for (int j = 0; j < node->n_inputs; j++)
            if (node->inputs[j] == TD_INPUT_NODE) node->in[j] = (float *)g->input;
        if (node->segment >= 0 && m->segments[node->segment].first == i && r.training)
            TD_CUDA(g, cudaMemcpyAsync(g->segment_offsets + node->segment, g->rng_offset,
                                       sizeof(unsigned long long), cudaMemcpyDeviceToDevice,
                                       r.stream));
        g->ops[i]->forward(g, node, &r);
    }
}

// Activation checkpointing: rebuilds a segment's dropped activations and saved state from its
// inputs, drawing dropout from the counter its forward started at (the same masks), as the
// CPU's td_model_backward does.
static void recompute_segment(td_gpu *g, td_model *m, int s, const td_gpu_run *run) {
    const td_segment *seg = &m->segments[s];
    if (!td_segment_runs_backward(m, seg)) return;
    td_gpu_run r = *run;
    r.recompute = true;
    r.rng_offset = g->recompute_offset;
    TD_CUDA(g, cudaMemcpyAsync(g->recompute_offset, g->segment_offsets + s,
                               sizeof(unsigned long long), cudaMemcpyDeviceToDevice, r.stream));
    for (int i = seg->first; i <= seg->last && !g->failed; i++)
        g->ops[i]->forward(g, &m->nodes[i], &r);
}

extern "C" void td_gpu_loss(td_gpu *g, td_model *m, const td_loss *loss, int n, float grad_scale,
                            bool backward, float total_weight) {
    td_node *last = &m->nodes[m->n_nodes - 1];
    const float *loss_scale = g->prec == TD_PREC_FP16 ? td_gpu_loss_scale_ptr(g) : NULL;
    // a language model's loss is the mean over every position: rows of logits, a label each
    // (total_weight then weighs each row's loss: the trainer counts rows, not samples)
    int rows = n * g->positions;
    td_gpu_loss_run(g, loss, last->out, g->labels, rows, last->out_shape.c,
                    backward ? (void *)last->grad : NULL, grad_scale, loss_scale, total_weight,
                    g->stream);
}

extern "C" void td_gpu_backward(td_gpu *g, td_model *m, const td_run *run) {
    td_gpu_run r = gpu_run_of(g, run);
    for (int i = m->n_nodes - 1; i >= 0 && !g->failed; i--) {
        td_node *node = &m->nodes[i];
        if (node->segment >= 0 && m->segments[node->segment].last == i)
            recompute_segment(g, m, node->segment, &r);
        if (!td_node_runs_backward(node)) continue;
        if (node->grads_add) { // a tied weight whose gradient a later node began (the LM head's)
            td_gpu_run add = r;
            add.accumulate_grads = true;
            g->ops[i]->backward(g, node, &add);
        } else {
            g->ops[i]->backward(g, node, &r);
        }
        if (r.node_done && node->n_params > 0) r.node_done(r.node_done_ctx, node);
    }
}

extern "C" int td_gpu_seek_dropout(td_gpu *g, unsigned long long draws, td_err *err) {
    unsigned long long *pinned = NULL;
    TD_CUDA_RET(g, cudaMallocHost((void **)&pinned, sizeof *pinned), take_failure(g, err));
    *pinned = draws;
    cudaError_t e =
        cudaMemcpyAsync(g->rng_offset, pinned, sizeof *pinned, cudaMemcpyHostToDevice, g->stream);
    int rc = e == cudaSuccess ? td_gpu_ddp_wait(g, g->stream, err) : -1;
    cudaFreeHost(pinned);
    if (e != cudaSuccess)
        return td_fail(err, "setting the dropout counter: %s", cudaGetErrorString(e));
    return rc;
}

extern "C" int td_gpu_take_totals(td_gpu *g, double *loss_sum, double *hits, td_err *err) {
    double t[2];
    // wait first, under the watchdog: a copy into pageable memory would block in CUDA
    if (td_gpu_ddp_wait(g, g->stream, err) != 0) return -1;
    TD_CUDA_RET(g, cudaMemcpyAsync(t, g->totals, sizeof t, cudaMemcpyDeviceToHost, g->stream),
                take_failure(g, err));
    TD_CUDA_RET(g, cudaMemsetAsync(g->totals, 0, sizeof t, g->stream), take_failure(g, err));
    if (td_gpu_ddp_wait(g, g->stream, err) != 0) return -1;
    *loss_sum = t[0];
    *hits = t[1];
    return take_failure(g, err);
}
