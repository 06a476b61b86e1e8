// CUDA graphs: a whole training step (forward, loss, backward, the DDP all-reduces, the
// optimizer) captured once and replayed, so a step costs one launch instead of hundreds. What
// changes between steps lives in device memory the graph reads at replay: the batch (taken over
// in-stream before the launch), the learning rate (written in-stream by a one-thread kernel
// before the launch, its value a launch argument), the dropout counter and the fp16 loss scale
// (advanced by captured kernels). Nothing the graph reads lives on the host, so the host never
// waits for a replay before queuing the next: the GPU goes from one step to the next without
// a gap.
#include "gpu/cuda/td_gpu_internal.h"

#include <stdio.h>

static void queue_step(td_gpu *g, td_model *m, const td_gpu_step_args *a) {
    td_run run = {};
    run.n = a->n;
    run.training = true;
    td_err ignored;
    // DDP's broadcast_buffers, as the eager step does it (not under SyncBatchNorm)
    if (a->ddp && m->buffer_floats && !td_gpu_ddp_syncs_batchnorm(g))
        td_gpu_ddp_broadcast_params(g, m, true, &ignored);
    td_gpu_forward(g, m, &run);
    td_gpu_loss(g, m, a->loss, a->n, 1.0f, true, 1.0f / ((float)a->n * (float)g->positions));
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
    char msg[TD_ERR_MAX];
    bool failed = td_gpu_take_failure(g, msg, sizeof msg);
    if (failed || e != cudaSuccess) {
        // an op that cannot be captured: report it and let the trainer go on eagerly
        td_fail(err, "capture failed: %s", failed ? msg : cudaGetErrorString(e));
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

// The recorded failure into err; returns `rc`.
static int step_failed(td_gpu *g, int rc, td_err *err) {
    td_gpu_check(g, err);
    return rc;
}

extern "C" int td_gpu_graph_step(td_gpu *g, td_model *m, const td_gpu_step_args *a, td_err *err) {
    if (g->graph && (g->graph_n != a->n || g->graph_ddp != a->ddp)) {
        cudaGraphExecDestroy(g->graph);
        g->graph = NULL;
    }
    if (!g->graph) {
        int rc = capture(g, m, a, err);
        // NCCL requires whether a collective is graph-captured to be the same on every rank: a
        // rank whose capture failed makes them all train op by op. The failures are summed, not
        // averaged: NCCL's float average adds fl(1/world) world times, which misses 1.0 at
        // world sizes such as 12, and the ranks would never agree on a good capture.
        if (a->ddp) {
            float failures = rc == 0 ? 0.0f : 1.0f;
            td_err agree = {{0}};
            int arc = td_gpu_ddp_allreduce_host(g, &failures, 1, false, &agree);
            if ((arc != 0 || failures > 0.5f) && g->graph) {
                cudaGraphExecDestroy(g->graph);
                g->graph = NULL;
            }
            if (arc != 0) {
                td_fail(err, "agreeing on CUDA graphs: %s", agree.msg);
                return TD_GPU_GRAPH_FATAL;
            }
            if (rc == 0 && failures > 0.5f)
                return td_fail(err, "capture failed on another rank (its log says why); every "
                                    "rank trains op by op");
        }
        if (rc != 0) return -1;
    }
    // Past the agreement a failure cannot fall back alone under DDP: this rank would run the
    // step's collectives op by op while its peers replay theirs. Alone, the trainer runs the step
    // op by op, once (td_gpu_check does not wait once a failure is recorded).
    int fail = a->ddp ? TD_GPU_GRAPH_FATAL : -1;
    // capture queued nothing: the first replay is the first execution
    td_gpu_optim_set_lr(g, a->lr, g->stream);
    if (g->failed) return step_failed(g, fail, err);
    TD_CUDA_RET(g, cudaGraphLaunch(g->graph, g->stream), step_failed(g, fail, err));
    return 0;
}
