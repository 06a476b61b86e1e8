/* What runs the model: one training batch on the CPU or on the GPU (the optimizer stepping at
 * the last batch of a gradient-accumulation group), and one evaluation pass over data.val. */
#include "train/td_train_private.h"

#include "ops/td_ops.h"

#include <math.h>
#include <stdint.h>

int td_train_diverged(td_err *err, double loss, long step, int epoch) {
    return td_fail(err,
                   "the training loss became %g at step %ld (epoch %d); lower "
                   "train.optimizer.lr or set train.clip_grad_norm",
                   loss, step, epoch);
}

/* The optimizer inside backward: each node's parameters are updated as soon as its backward has
 * made their gradients (nothing later in backward reads them), while those gradients are still
 * in cache, instead of in a pass over the whole block afterwards that reads them back from
 * memory (the MLP's 2.7 MB of gradients, weights and momentum each). Only where nothing has to
 * see every gradient first: one process (no all-reduce), no gradient clipping (it needs the
 * global norm), no accumulation over batches. td_optim_step_part keeps every bit of the result.
 * TRAIND_FUSE_OPTIMIZER=0 turns it off (td_train.c). */
typedef struct fused_step {
    trainer *t;
    float lr;
    double seconds; /* TRAIND_PROFILE: the updates' time, shown as the optimizer's */
} fused_step;

static void step_node(void *ctx, const td_node *node) {
    fused_step *f = ctx;
    trainer *t = f->t;
    double t0 = t->profiling ? td_clock_now() : 0;
    for (int i = 0; i < node->n_params; i++) {
        const td_param *p = node->params[i];
        if (!td_node_finishes(node, p)) continue; /* a tied weight: its other node steps it */
        td_optim_step_part(&t->optim, t->model.param_block, t->model.grad_block, f->lr, p->offset,
                           p->offset + p->size);
    }
    if (t->profiling) f->seconds += td_clock_now() - t0;
}

/* On the CPU, with DDP: gradient buckets are all-reduced while backward goes on (the loss riding
 * with them), and SyncBatchNorm's sums go through the same thread (td_train_dist.c). */
int td_train_cpu_batch(trainer *t, const td_batch *b, td_run *run, float lr, int group, int micro,
                       double *loss, td_err *err) {
    const td_job *job = t->job;
    run->n = b->n;
    run->accumulate_grads = micro > 0;
    if (t->profiling) td_model_enable_profile(&t->model);
    double t0 = t->profiling ? td_clock_now() : 0;
    /* DDP's broadcast_buffers: BatchNorm statistics follow rank 0's */
    if (t->comm && !run->sync && t->model.buffer_floats &&
        td_comm_broadcast(t->comm, t->model.buffer_block, t->model.buffer_floats, 0, err) != 0)
        return td_train_collective_failed(t, err);
    td_train_phase(t, &t->phase.broadcast, &t0);
    const float *logits = td_model_forward(&t->model, b->x, run);
    td_train_phase(t, &t->phase.forward, &t0);
    if (micro == 0) t->group_loss = 0; /* a group's first batch opens its sum */
    /* each batch of a group carries 1/group of the step's gradient */
    /* a text batch's rows are its positions: the mean over every predicted token */
    int rows = b->n * t->positions;
    t->group_loss += td_loss_compute(&job->train.loss, logits, b->labels, rows, t->classes,
                                     t->dlogits, 1.0f / (float)group, NULL) /
                     rows;
    td_train_phase(t, &t->phase.loss, &t0);
    /* no_sync for all but the group's last batch; on the last, buckets of gradients are
     * all-reduced while backward goes on, the loss riding with them */
    bool sync_now = t->reducer && micro + 1 == group;
    bool fused = t->fuse_optimizer && !t->reducer && group == 1 && job->train.clip_grad_norm <= 0;
    fused_step f = {t, lr, 0};
    run->node_done = NULL;
    if (sync_now) td_reducer_begin(t->reducer, (float)(t->group_loss / group), run);
    if (fused) { /* the loss is known before any update: a diverged one updates nothing */
        if (!isfinite(t->group_loss))
            return td_train_diverged(err, t->group_loss, t->state.step + 1, t->state.epoch + 1);
        run->node_done = step_node;
        run->node_done_ctx = &f;
    }
    td_model_backward(&t->model, t->dlogits, run);
    run->node_done = NULL;
    td_train_phase(t, &t->phase.backward, &t0);
    t->phase.backward -= f.seconds;
    t->phase.optimizer += f.seconds;
    if (t->sync.failed) {
        td_fail(err, "rank %d: a SyncBatchNorm reduction failed (a peer is gone?)", t->dist->rank);
        return td_train_collective_failed(t, err);
    }
    if (micro + 1 < group) return 0; /* no_sync: gradients accumulate locally */
    *loss = t->group_loss / group;
    if (sync_now) { /* gradients and loss averaged over the replicas */
        float l;
        if (td_reducer_finish(t->reducer, &l, err) != 0) return td_train_collective_failed(t, err);
        *loss = l; /* the mean over ranks, the same on every rank */
        td_train_phase(t, &t->phase.reduce_tail, &t0);
    }
    if (!isfinite(*loss))
        return td_train_diverged(err, *loss, t->state.step + 1, t->state.epoch + 1);
    if (job->train.clip_grad_norm > 0)
        td_grad_clip(t->model.grad_block, t->model.param_floats, job->train.clip_grad_norm);
    if (fused)
        td_optim_step_end(&t->optim);
    else
        td_optim_step(&t->optim, t->model.param_block, t->model.grad_block, lr);
    td_train_phase(t, &t->phase.optimizer, &t0);
    t->state.interval_loss += *loss;
    return 0;
}

/* One batch on the GPU: the whole step as one CUDA graph where it can be, else op by op. The
 * loss stays on the device (see td_train_gpu_flush_loss). */
int td_train_gpu_batch(trainer *t, const td_batch *b, td_run *run, float lr, int group, int micro,
                       td_err *err) {
    const td_job *job = t->job;
    if (t->gpu_api->set_batch(t->gpu, &t->model, b->x, b->labels, b->n, err) != 0) return -1;
    bool last = micro + 1 == group;
    bool full = group == 1 && b->n == job->train.batch_size;
    if (!t->graph_off && full && t->graph_warm) {
        td_gpu_step_args args = {&job->train.loss, b->n, lr, job->train.clip_grad_norm, t->gpu_ddp};
        int rc = t->gpu_api->graph_step(t->gpu, &t->model, &args, err);
        if (rc == 0) return 0;
        if (rc == TD_GPU_GRAPH_FATAL) return td_train_collective_failed(t, err);
        if (t->rank0)
            fprintf(t->log, "[traind] CUDA graph: %s; training op by op from here\n", err->msg);
        t->graph_off = true;
    }
    run->n = b->n;
    run->accumulate_grads = micro > 0;
    run->node_done = NULL;
    /* DDP's broadcast_buffers, needless under SyncBatchNorm (every rank's statistics agree) */
    if (t->gpu_ddp && !job->train.sync_bn && t->model.buffer_floats &&
        t->gpu_api->ddp_broadcast_params(t->gpu, &t->model, true, err) != 0)
        return td_train_collective_failed(t, err);
    t->gpu_api->forward(t->gpu, &t->model, run);
    /* the totals weigh each row: a language model's mean is over every position */
    t->gpu_api->loss(t->gpu, &t->model, &job->train.loss, b->n, 1.0f / (float)group, true,
                     1.0f / ((float)b->n * (float)t->positions * (float)group));
    if (last && t->gpu_ddp) t->gpu_api->ddp_begin(t->gpu, run);
    t->gpu_api->backward(t->gpu, &t->model, run);
    if (last && t->gpu_ddp && t->gpu_api->ddp_finish(t->gpu, err) != 0)
        return td_train_collective_failed(t, err);
    if (last) t->gpu_api->optim_step(t->gpu, &t->model, lr, job->train.clip_grad_norm);
    t->graph_warm = t->graph_warm || full;
    return 0;
}

/* On the GPU the training loss accumulates on the device (reading it back every step would stall
 * the queue): at each log line, checkpoint and evaluation it is added to the interval's, averaged
 * over the ranks. The device sums each step's mean loss in double, so the interval's value is the
 * CPU's. A checkpoint flushes mid-interval, so the sum must not be rounded to float on its way:
 * a resumed run's first log line would then differ from the straight run's in the last digit.
 * Alone it is added as it is; over the ranks (a float all-reduce) it travels as two floats, the
 * second holding what the first rounded off (about 48 bits in all). */
int td_train_gpu_flush_loss(trainer *t, td_err *err) {
    double sum, hits;
    if (t->gpu_api->take_totals(t->gpu, &sum, &hits, err) != 0) return -1;
    if (!t->gpu_ddp) {
        t->state.interval_loss += sum;
        return 0;
    }
    float v[2] = {(float)sum, 0.0f};
    v[1] = (float)(sum - (double)v[0]);
    if (td_train_allreduce(t, v, 2, true, err) != 0) return -1;
    t->state.interval_loss += (double)v[0] + (double)v[1];
    return 0;
}

/* Where the GPU's dropout counter stands after `batches` training batches: one draw per dropout
 * node and batch (what a resumed run must continue from). */
int td_train_gpu_seek_dropout(trainer *t, long batches, td_err *err) {
    long nodes = 0;
    for (int i = 0; i < t->model.n_nodes; i++)
        if (t->model.nodes[i].op == &td_op_dropout && td_node_arg(&t->model.nodes[i], "p") > 0)
            nodes++;
    return t->gpu_api->seek_dropout(t->gpu, (unsigned long long)(batches * nodes), err);
}

/* Sums over the first `cap` batches (0: all) of the loader's epoch, on this rank: the loss, the
 * correct predictions and the predictions made (a text sample makes one per position). */
static int pass_sums(trainer *t, td_loader *ld, long cap, float sums[3], td_err *err) {
    td_run run = {.training = false, .rng = &t->state.dropout_rng};
    double *profile = t->model.profile; /* only training steps are profiled */
    t->model.profile = NULL;
    double loss = 0;
    long correct = 0, seen = 0, batches = 0;
    td_batch b;
    if (t->gpu) { /* the training loss pending on the device must not mix with these sums */
        if (td_train_gpu_flush_loss(t, err) != 0) return -1;
        while ((!cap || batches++ < cap) && td_loader_next(ld, &b)) {
            run.n = b.n;
            if (t->gpu_api->set_batch(t->gpu, &t->model, b.x, b.labels, b.n, err) != 0) return -1;
            t->gpu_api->forward(t->gpu, &t->model, &run);
            t->gpu_api->loss(t->gpu, &t->model, &t->job->train.loss, b.n, 1.0f, false, 1.0f);
            seen += (long)b.n * t->positions; /* text: every position's prediction counts */
        }
        double hits;
        if (t->gpu_api->take_totals(t->gpu, &loss, &hits, err) != 0) return -1;
        correct = (long)hits;
    }
    while (!t->gpu && (!cap || batches++ < cap) && td_loader_next(ld, &b)) {
        run.n = b.n;
        const float *logits = td_model_forward(&t->model, b.x, &run);
        int hits, rows = b.n * t->positions; /* text: every position's prediction counts */
        loss += td_loss_compute(&t->job->train.loss, logits, b.labels, rows, t->classes, NULL, 1,
                                &hits);
        correct += hits;
        seen += rows;
    }
    t->model.profile = profile;
    sums[0] = (float)loss;
    sums[1] = (float)correct;
    sums[2] = (float)seen;
    return 0;
}

int td_train_eval_pass(trainer *t, double *val_loss, double *val_acc, td_err *err) {
    float sums[3];
    td_loader_start_epoch(t->val_loader, 0, 0);
    if (pass_sums(t, t->val_loader, t->job->train.eval_iters, sums, err) != 0) return -1;
    /* every validation sample counted once, over all ranks */
    if (td_train_allreduce(t, sums, 3, false, err) != 0) return -1;
    *val_loss = sums[0] / sums[2];
    *val_acc = sums[1] / sums[2];
    return 0;
}

int td_train_estimate_loss(trainer *t, double *loss, td_err *err) {
    *loss = NAN;
    if (!t->estimate_loader) return 0;
    /* the epoch is the step: other windows at each evaluation, the same ones after a resume */
    float sums[3];
    td_loader_start_epoch(t->estimate_loader, (int)(t->state.step % INT32_MAX), 0);
    if (pass_sums(t, t->estimate_loader, t->job->train.eval_iters, sums, err) != 0) return -1;
    if (td_train_allreduce(t, sums, 3, false, err) != 0) return -1;
    *loss = sums[0] / sums[2];
    return 0;
}
