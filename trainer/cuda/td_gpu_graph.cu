// CUDA graphs: a whole training step (forward, loss, backward, the DDP all-reduces, the
// optimizer) captured once and replayed, so a step costs one launch instead of hundreds. What
// changes between steps lives in device memory the graph reads at replay: the batch (copied in
// before the launch), the learning rate (a pinned scalar copied by a captured memcpy), the
// dropout counter and the fp16 loss scale (advanced by captured kernels).
#include "td_gpu_internal.h"

#include <stdio.h>

static void queue_step(td_gpu *g, td_model *m, const td_gpu_step_args *a) {
    td_run run = {};
    run.n = a->n;
    run.training = true;
    td_err ignored;
    if (a->ddp && m->buffer_floats) td_gpu_ddp_broadcast_params(g, m, true, &ignored);
    td_gpu_forward(g, m, &run);
    td_gpu_loss(g, m, a->loss, a->n, 1.0f, true, 1.0f / (float)a->n);
    if (a->ddp) td_gpu_ddp_begin(g, &run);
    td_gpu_backward(g, m, &run);
    if (a->ddp) td_gpu_ddp_finish(g, &ignored);
    td_gpu_optim_step(g, m, a->lr, a->max_norm);
}

static int capture(td_gpu *g, td_model *m, const td_gpu_step_args *a, td_err *err) {
    cudaError_t e = cudaStreamBeginCapture(g->stream, cudaStreamCaptureModeThreadLocal);
    if (e != cudaSuccess) return td_fail(err, "cudaStreamBeginCapture: %s", cudaGetErrorString(e));
    queue_step(g, m, a);
    cudaGraph_t graph = NULL;
    e = cudaStreamEndCapture(g->stream, &graph);
    if (g->failed || e != cudaSuccess) {
        // an op that cannot be captured: report it and let the trainer go on eagerly
        td_fail(err, "capture failed: %s", g->failed ? g->msg : cudaGetErrorString(e));
        g->failed = false;
        cudaGetLastError(); // clear the capture error so eager work starts clean
        if (graph) cudaGraphDestroy(graph);
        return -1;
    }
    e = cudaGraphInstantiate(&g->graph, graph, 0);
    cudaGraphDestroy(graph);
    if (e != cudaSuccess) {
        g->graph = NULL;
        cudaGetLastError();
        return td_fail(err, "cudaGraphInstantiate: %s", cudaGetErrorString(e));
    }
    g->graph_n = a->n;
    g->graph_ddp = a->ddp;
    return 0;
}

extern "C" int td_gpu_graph_step(td_gpu *g, td_model *m, const td_gpu_step_args *a, td_err *err) {
    if (g->graph && (g->graph_n != a->n || g->graph_ddp != a->ddp)) {
        cudaGraphExecDestroy(g->graph);
        g->graph = NULL;
    }
    // The replay before this one may not have copied its learning rate yet.
    if (td_gpu_ddp_wait_event(g, g->step_done, err) != 0) return -1;
    bool first = g->graph == NULL;
    if (first && capture(g, m, a, err) != 0) return -1;
    // capture queued nothing: the first replay is the first execution
    *g->lr_host = a->lr;
    TD_CUDA_RET(g, cudaGraphLaunch(g->graph, g->stream), td_gpu_check(g, err));
    TD_CUDA_RET(g, cudaEventRecord(g->step_done, g->stream), td_gpu_check(g, err));
    return 0;
}
