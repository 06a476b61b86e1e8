// The collectives of data parallelism on the GPU, through the communicator of td_gpu_nccl.cu
// (whose opening comment has the design): each gradient bucket all-reduced on the communication
// stream as soon as backward has produced it, the all-reduce of host values, the broadcast of
// rank 0's parameters, SyncBatchNorm's sums, and the trainer's host waits under the watchdog.
#include "gpu/cuda/td_gpu_nccl.h"

extern "C" {
#include "base/td_error.h"
}

#include <string.h>

// Sends out bucket b: the communication stream waits (on the device) for the compute stream's
// work so far, which includes the backward of every parameter in the bucket.
static bool launch_bucket(td_gpu_ddp *d, int b) {
    td_gpu *g = d->g;
    const td_bucket *k = &d->plan.bucket[b];
    TD_CUDA_RET(g, cudaEventRecord(d->ready[b], g->stream), false);
    TD_CUDA_RET(g, cudaStreamWaitEvent(d->stream, d->ready[b], 0), false);
    return td_gpu_ddp_collective(d, OP_ALLREDUCE, g->grads + k->lo, k->hi - k->lo, ncclFloat,
                                 ncclAvg, "a gradient bucket's all-reduce") == 0;
}

static void launch(td_gpu_ddp *d, int b) {
    if (!launch_bucket(d, b)) d->launch_failed = true; // finish reports it
}

// Launches every complete bucket from `next` on, in bucket order: NCCL needs the same order of
// collectives on every rank, and a bucket that completes early (its other parameters' nodes
// came first) waits for the ones before it.
static void launch_ready(td_gpu_ddp *d) {
    while (d->next < d->plan.n && d->pending[d->next] <= 0) launch(d, d->next++);
}

// Backward's hook after each node with parameters, whose gradients are then queued.
static void node_done(void *ctx, const td_node *node) {
    td_gpu_ddp *d = (td_gpu_ddp *)ctx;
    // a tied weight counts once, at the node that finishes its gradient (the last in backward)
    for (int j = 0; j < node->n_params; j++)
        if (td_node_finishes(node, node->params[j]))
            d->pending[d->plan.bucket_of[node->param_ids[j]]]--;
    launch_ready(d);
}

static void reset_buckets(td_gpu_ddp *d) {
    for (int i = 0; i < d->plan.n; i++) d->pending[i] = d->plan.bucket[i].params;
    d->next = 0;
    d->launch_failed = false;
}

void td_gpu_ddp_begin(td_gpu *g, td_run *run) {
    td_gpu_ddp *d = g->ddp;
    if (!d) return;
    reset_buckets(d);
    d->in_backward = true;
    run->node_done = node_done;
    run->node_done_ctx = d;
}

int td_gpu_ddp_finish(td_gpu *g, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) return td_fail(err, "DDP: td_gpu_ddp_finish without td_gpu_ddp_start");
    if (!d->in_backward) reset_buckets(d); // no hook ran: every bucket goes out now
    d->in_backward = false;
    // parameters whose node had no backward in this pass still take part, as on every rank
    while (d->next < d->plan.n) launch(d, d->next++);
    TD_CUDA_RET(g, cudaEventRecord(d->join, d->stream), td_gpu_ddp_error(d, err));
    TD_CUDA_RET(g, cudaStreamWaitEvent(g->stream, d->join, 0), td_gpu_ddp_error(d, err));
    if (d->launch_failed || td_gpu_ddp_aborted(d)) return td_gpu_ddp_error(d, err);
    return 0;
}

int td_gpu_ddp_allreduce_host(td_gpu *g, float *values, size_t n, bool average, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) return td_fail(err, "DDP: all-reduce without td_gpu_ddp_start");
    for (size_t off = 0; off < n; off += HOST_FLOATS) {
        size_t k = n - off < HOST_FLOATS ? n - off : HOST_FLOATS;
        memcpy(d->host_pinned, values + off, k * sizeof(float));
        // after the compute stream's work so far, as the CPU reducer orders td_reducer_sum
        // behind the buckets
        TD_CUDA_RET(g, cudaEventRecord(d->fork, g->stream), td_gpu_ddp_error(d, err));
        TD_CUDA_RET(g, cudaStreamWaitEvent(d->stream, d->fork, 0), td_gpu_ddp_error(d, err));
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(d->host_dev, d->host_pinned, k * sizeof(float),
                                    cudaMemcpyHostToDevice, d->stream),
                    td_gpu_ddp_error(d, err));
        if (td_gpu_ddp_collective(d, OP_ALLREDUCE, d->host_dev, k, ncclFloat,
                                  average ? ncclAvg : ncclSum, "an all-reduce of host values") != 0)
            return td_gpu_ddp_error(d, err);
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(d->host_pinned, d->host_dev, k * sizeof(float),
                                    cudaMemcpyDeviceToHost, d->stream),
                    td_gpu_ddp_error(d, err));
        TD_CUDA_RET(g, cudaEventRecord(d->host_done, d->stream), td_gpu_ddp_error(d, err));
        if (td_gpu_ddp_poll_event(d, d->host_done, "an all-reduce of host values", err) != 0)
            return -1;
        memcpy(values + off, d->host_pinned, k * sizeof(float));
    }
    return 0;
}

int td_gpu_ddp_broadcast_params(td_gpu *g, td_model *m, bool buffers_only, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) return td_fail(err, "DDP: broadcast without td_gpu_ddp_start");
    TD_CUDA_RET(g, cudaEventRecord(d->fork, g->stream), td_gpu_ddp_error(d, err));
    TD_CUDA_RET(g, cudaStreamWaitEvent(d->stream, d->fork, 0), td_gpu_ddp_error(d, err));
    if (!buffers_only && m->param_floats &&
        td_gpu_ddp_collective(d, OP_BROADCAST, g->params, m->param_floats, ncclFloat, ncclSum,
                              "the broadcast of rank 0's parameters") != 0)
        return td_gpu_ddp_error(d, err);
    if (m->buffer_floats &&
        td_gpu_ddp_collective(d, OP_BROADCAST, g->buffers, m->buffer_floats, ncclFloat, ncclSum,
                              "the broadcast of rank 0's buffers") != 0)
        return td_gpu_ddp_error(d, err);
    TD_CUDA_RET(g, cudaEventRecord(d->join, d->stream), td_gpu_ddp_error(d, err));
    TD_CUDA_RET(g, cudaStreamWaitEvent(g->stream, d->join, 0), td_gpu_ddp_error(d, err));
    // the 16-bit compute copy follows the new fp32 masters
    if (!buffers_only && g->prec != TD_PREC_FP32)
        td_gpu_refresh_half(g, m->param_floats, g->stream);
    if (g->failed) return td_gpu_ddp_error(d, err);
    return 0;
}

bool td_gpu_ddp_syncs_batchnorm(const td_gpu *g) {
    return g->ddp && g->ddp->sync_bn;
}

void td_gpu_ddp_sum(td_gpu *g, double *values, size_t n, cudaStream_t compute) {
    td_gpu_ddp *d = g->ddp;
    if (!d) {
        td_gpu_fail(g, __FILE__, __LINE__, "SyncBatchNorm", "no data-parallel communicator",
                    "td_gpu_ddp_start(..., sync_bn = true) comes first");
        return;
    }
    // after the compute stream's work so far (the sums), before its next (what reads them)
    TD_CUDA(g, cudaEventRecord(d->sync_fork, compute));
    TD_CUDA(g, cudaStreamWaitEvent(d->stream, d->sync_fork, 0));
    if (td_gpu_ddp_collective(d, OP_ALLREDUCE, values, n, ncclDouble, ncclSum,
                              "a SyncBatchNorm all-reduce") != 0)
        return; // failure recorded: the passes stop at the next node
    TD_CUDA(g, cudaEventRecord(d->sync_join, d->stream));
    TD_CUDA(g, cudaStreamWaitEvent(compute, d->sync_join, 0));
}

int td_gpu_ddp_buckets(const td_gpu *g) {
    return g->ddp ? g->ddp->plan.n : 0;
}

// The trainer's synchronisations: waits on the host for ev (already recorded) by polling under
// the watchdog's deadline, so a collective that never completes ends as an error return.
// Without DDP it is a plain synchronisation.
int td_gpu_ddp_wait_event(td_gpu *g, cudaEvent_t ev, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) {
        TD_CUDA_RET(g, cudaEventSynchronize(ev), td_gpu_error(g, err));
        return g->failed ? td_gpu_error(g, err) : 0;
    }
    if (td_gpu_ddp_poll_event(
            d, ev, "the GPU work queued before a synchronisation (gradient all-reduces among it)",
            err) != 0)
        return -1;
    return g->failed ? td_gpu_ddp_error(d, err) : 0;
}

// The same for everything queued on s so far.
int td_gpu_ddp_wait(td_gpu *g, cudaStream_t s, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) {
        TD_CUDA_RET(g, cudaStreamSynchronize(s), td_gpu_error(g, err));
        return g->failed ? td_gpu_error(g, err) : 0;
    }
    TD_CUDA_RET(g, cudaEventRecord(d->wait_done, s), td_gpu_ddp_error(d, err));
    return td_gpu_ddp_wait_event(g, d->wait_done, err);
}
