/* BatchNorm1d / BatchNorm2d with torch.nn semantics, and SyncBatchNorm when the run carries a
 * td_sync: the statistics (and backward's reductions) then span every rank's batch, which
 * equals one process holding the global batch.
 *
 * Channels are the last dimension of both layouts ([N, C] and channels-last [N, H, W, C]), so one
 * implementation serves both: statistics run over the N·H·W rows of C channels. Training uses the
 * batch's mean and biased variance, and updates running_mean / running_var (the latter with the
 * unbiased variance) by `momentum`, and counts num_batches_tracked; evaluation uses the running
 * statistics. With track_running_stats false there are no buffers and batch statistics are used
 * in both modes. Sums are accumulated in double: a ResNet batch is millions of rows.
 */
#include "core/td_model.h"
#include "core/td_parallel.h"
#include "ops/td_ops_isa.h"

#include <math.h>
#include <omp.h>
#include <string.h>

enum { ARG_EPS, ARG_MOMENTUM, ARG_AFFINE, ARG_TRACK, ARG_ZERO_INIT };

/* The scratch every thread shares (see bn_build_common), rounded to a whole double. */
static size_t shared_floats(int c) {
    return (9 * (size_t)c + 2) & ~(size_t)1;
}

/* sum[k] = the sum over rows of x[r, k], or of (x[r, k] - center[k])^2 when center is not NULL,
 * in double. Each thread sums its run of rows into its own partial (scratch after the shared
 * part), and the partials are added in thread order. */
static void column_sums(const td_node *node, const td_run *run, const float *x, size_t rows, int c,
                        const float *center, double *sum) {
    double *partial = (double *)(run->scratch + shared_floats(c));
    int threads = td_par_threads_for(node->threads, rows * (size_t)c), team = 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int me = omp_get_thread_num();
        if (me == 0) team = omp_get_num_threads();
        double *p = partial + (size_t)me * c;
        memset(p, 0, (size_t)c * sizeof *p);
        size_t lo, hi;
        td_par_range(rows, omp_get_num_threads(), me, 1, &lo, &hi);
        if (center)
            for (size_t r = lo; r < hi; r++)
                for (int k = 0; k < c; k++) {
                    double d = (double)x[r * c + k] - center[k];
                    p[k] += d * d;
                }
        else
            for (size_t r = lo; r < hi; r++)
                for (int k = 0; k < c; k++) p[k] += x[r * c + k];
    }
    memcpy(sum, partial, (size_t)c * sizeof *sum);
    for (int t = 1; t < team; t++)
        for (int k = 0; k < c; k++) sum[k] += partial[(size_t)t * c + k];
}

static int bn_build_common(td_model *model, td_node *node, td_err *err, bool spatial) {
    td_shape in = node->in_shape[0];
    /* BatchNorm1d on [N, T, C] would normalise over T's axis in PyTorch (it reads [N, C, L]):
     * a transformer wants layernorm, so a sequence is refused rather than guessed at */
    if (in.spatial != spatial || td_shape_is_seq(in)) {
        char buf[64];
        td_shape_format(in, buf, sizeof buf);
        return td_fail(err, "expects %s input but its input has shape %s%s",
                       spatial ? "an image [C, H, W]" : "flat [C]", buf,
                       spatial               ? "; use batchnorm1d for flat features"
                       : td_shape_is_seq(in) ? "; a sequence [T, C] is normalised with layernorm"
                                             : "; use batchnorm2d");
    }
    int c = in.c;
    if (node->args[ARG_AFFINE]) {
        td_model_add_param(model, node, "weight", 1, &c,
                           td_init_fill(node->args[ARG_ZERO_INIT] ? 0.0f : 1.0f));
        td_model_add_param(model, node, "bias", 1, &c, td_init_fill(0.0f));
    }
    if (node->args[ARG_TRACK]) {
        td_model_add_buffer(model, node, "running_mean", 1, &c, 0.0f, TD_F32);
        td_model_add_buffer(model, node, "running_var", 1, &c, 1.0f, TD_F32);
        td_model_add_buffer(model, node, "num_batches_tracked", 0, NULL, 0.0f, TD_I64);
    }
    node->out_shape = in;
    node->saved_bytes = 2 * (size_t)c * sizeof(float); /* mean and 1/std used by forward */
    node->keep_saved = true; /* a recomputing forward reuses them (see bn_forward) */
    /* two double sums, three floats per channel, 2c + 1 floats for SyncBatchNorm, then each
     * thread's two partial double sums */
    node->scratch_floats = shared_floats(c) + 4 * (size_t)c * model->threads;
    return 0;
}

static int bn2d_build(td_model *model, td_node *node, td_err *err) {
    return bn_build_common(model, node, err, true);
}
static int bn1d_build(td_model *model, td_node *node, td_err *err) {
    return bn_build_common(model, node, err, false);
}

/* Whether this call normalises with the batch's own statistics. */
static bool uses_batch_stats(const td_node *node, const td_run *run) {
    return run->training || !node->args[ARG_TRACK];
}

static void bn_forward(td_node *node, const td_run *run) {
    int c = node->out_shape.c;
    size_t rows = (size_t)run->n * node->out_shape.h * node->out_shape.w;
    const float *x = node->in[0];
    float *mean = node->saved, *invstd = mean + c;
    float eps = (float)node->args[ARG_EPS];
    /* Recomputing for activation checkpointing: the batch statistics were saved by the first
     * forward, so the output is the same, running statistics move once per step (PyTorch's
     * torch.utils.checkpoint would move them twice) and SyncBatchNorm exchanges nothing. */
    bool batch = uses_batch_stats(node, run);
    if (batch && !run->recompute) {
        double *s = (double *)run->scratch, *s2 = s + c;
        column_sums(node, run, x, rows, c, NULL, s);
        double count = (double)rows;
        td_sync *sync = run->training ? run->sync : NULL;
        float *wire = (float *)(s2 + c); /* c + 1 floats for the reductions */
        if (sync) { /* global sums and count: the statistics of the global batch */
            for (int k = 0; k < c; k++) wire[k] = (float)s[k];
            wire[c] = (float)rows;
            if (sync->sum(sync->ctx, wire, (size_t)c + 1) != 0) sync->failed = true;
            for (int k = 0; k < c; k++) s[k] = wire[k];
            count = wire[c];
        }
        for (int k = 0; k < c; k++) mean[k] = (float)(s[k] / count);
        column_sums(node, run, x, rows, c, mean, s2);
        if (sync) {
            for (int k = 0; k < c; k++) wire[k] = (float)s2[k];
            if (sync->sum(sync->ctx, wire, (size_t)c) != 0) sync->failed = true;
            for (int k = 0; k < c; k++) s2[k] = wire[k];
        }
        for (int k = 0; k < c; k++) {
            double var = s2[k] / count;
            invstd[k] = (float)(1.0 / sqrt(var + eps));
            if (run->training && node->args[ARG_TRACK]) {
                float m = (float)node->args[ARG_MOMENTUM];
                double unbiased = count > 1 ? s2[k] / (count - 1) : var;
                float *rm = node->buffers[0]->data, *rv = node->buffers[1]->data;
                rm[k] = (1.0f - m) * rm[k] + m * mean[k];
                rv[k] = (1.0f - m) * rv[k] + m * (float)unbiased;
            }
        }
        if (run->training && node->args[ARG_TRACK]) node->buffers[2]->data[0] += 1.0f;
    } else if (!batch) {
        const float *rm = node->buffers[0]->data, *rv = node->buffers[1]->data;
        for (int k = 0; k < c; k++) {
            mean[k] = rm[k];
            invstd[k] = 1.0f / sqrtf(rv[k] + eps);
        }
    }
    /* y = x·scale + shift, scale = w/std, shift = b - mean·scale */
    float *scale = (float *)run->scratch, *shift = scale + c;
    for (int k = 0; k < c; k++) {
        float w = node->n_params ? node->params[0]->data[k] : 1.0f;
        float b = node->n_params ? node->params[1]->data[k] : 0.0f;
        scale[k] = w * invstd[k];
        shift[k] = b - mean[k] * scale[k];
    }
    float *y = node->out;
    int threads = td_par_threads_for(node->threads, rows * (size_t)c);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (size_t r = 0; r < rows; r++)
        for (int k = 0; k < c; k++) y[r * c + k] = x[r * c + k] * scale[k] + shift[k];
}

static void bn_backward(td_node *node, const td_run *run) {
    int c = node->out_shape.c;
    size_t rows = (size_t)run->n * node->out_shape.h * node->out_shape.w;
    const float *x = node->in[0], *dy = node->grad;
    const float *mean = node->saved, *invstd = mean + c;
    double *sdy = (double *)run->scratch, *sdyx = sdy + c;
    /* as column_sums, two sums at once */
    double *partial = (double *)(run->scratch + shared_floats(c));
    int threads = td_par_threads_for(node->threads, rows * (size_t)c), team = 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int me = omp_get_thread_num();
        if (me == 0) team = omp_get_num_threads();
        double *p = partial + (size_t)me * 2 * c, *px = p + c;
        memset(p, 0, 2 * (size_t)c * sizeof *p);
        size_t lo, hi;
        td_par_range(rows, omp_get_num_threads(), me, 1, &lo, &hi);
        for (size_t r = lo; r < hi; r++)
            for (int k = 0; k < c; k++) {
                double g = dy[r * c + k];
                p[k] += g;
                px[k] += g * (double)((x[r * c + k] - mean[k]) * invstd[k]);
            }
    }
    memcpy(sdy, partial, 2 * (size_t)c * sizeof *sdy);
    for (int t = 1; t < team; t++)
        for (int k = 0; k < 2 * c; k++) sdy[k] += partial[(size_t)t * 2 * c + k];
    if (node->n_params) {
        float *dw = node->params[0]->grad, *db = node->params[1]->grad;
        bool acc = run->accumulate_grads;
        for (int k = 0; k < c; k++) {
            dw[k] = (acc ? dw[k] : 0.0f) + (float)sdyx[k];
            db[k] = (acc ? db[k] : 0.0f) + (float)sdy[k];
        }
    }
    float *dx = node->in_grad[0];
    if (!dx) return;
    bool add = node->in_grad_add[0];
    double count = (double)rows;
    td_sync *sync = run->training ? run->sync : NULL;
    /* weight and bias gradients above are this rank's (DDP averages them like any other); the
     * input gradient needs the reductions over the global batch its statistics came from */
    if (sync) {
        float *wire = (float *)run->scratch + 7 * (size_t)c;
        for (int k = 0; k < c; k++) wire[k] = (float)sdy[k], wire[c + k] = (float)sdyx[k];
        wire[2 * c] = (float)rows;
        if (sync->sum(sync->ctx, wire, 2 * (size_t)c + 1) != 0) sync->failed = true;
        for (int k = 0; k < c; k++) sdy[k] = wire[k], sdyx[k] = wire[c + k];
        count = wire[2 * c];
    }
    /* dx = w/std · (dy - mean(dy) - xhat·mean(dy·xhat)) with batch statistics (the batch's
     * mean and std depend on x), dx = w/std · dy with running ones. xhat is affine in x, so per
     * channel dx = k1·dy + k2·x + k3. */
    float *k1 = (float *)(sdyx + c), *k2 = k1 + c, *k3 = k2 + c;
    bool batch = uses_batch_stats(node, run);
    for (int k = 0; k < c; k++) {
        float w = node->n_params ? node->params[0]->data[k] : 1.0f;
        float s = w * invstd[k];
        k1[k] = s;
        k2[k] = k3[k] = 0.0f;
        if (batch) {
            float mdy = (float)(sdy[k] / count), mdyx = (float)(sdyx[k] / count);
            k2[k] = -s * invstd[k] * mdyx;
            k3[k] = -s * mdy + s * invstd[k] * mean[k] * mdyx;
        }
    }
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (size_t r = 0; r < rows; r++)
        for (int k = 0; k < c; k++) {
            size_t i = r * c + k;
            float v = k1[k] * dy[i] + k2[k] * x[i] + k3[k];
            dx[i] = add ? dx[i] + v : v;
        }
}

const td_op TD_ISA_SYM(td_op_batchnorm2d) = {
    &td_op_sig_batchnorm2d, bn2d_build, bn_forward, bn_backward, TD_OP_VARIANTS(batchnorm2d), 0};
const td_op TD_ISA_SYM(td_op_batchnorm1d) = {
    &td_op_sig_batchnorm1d, bn1d_build, bn_forward, bn_backward, TD_OP_VARIANTS(batchnorm1d), 0};
