/* LayerNorm over the features of each position, as torch.nn.LayerNorm(C) (and nanoGPT's own
 * LayerNorm, whose bias may be off): y = (x - mean) / sqrt(var + eps) · weight + bias, with the
 * biased variance. Flat inputs [C] and sequences [T, C] alike: every row of C is one group.
 *
 * Forward keeps each row's mean and 1/std for backward (two floats a row), so backward never
 * recomputes them. The parameters' gradients are sums over rows: each thread sums its rows into
 * its own part of scratch, and the parts are added in thread order. */
#include "core/td_model.h"
#include "core/td_parallel.h"
#include "ops/td_ops_isa.h"

#include <math.h>
#include <omp.h>
#include <string.h>

enum { ARG_EPS, ARG_BIAS };
static size_t rows_of(const td_node *node, int n) {
    return (size_t)n * node->in_shape[0].h;
}

static int layernorm_build(td_model *model, td_node *node, td_err *err) {
    td_shape in = node->in_shape[0];
    if (in.spatial) {
        char buf[64];
        td_shape_format(in, buf, sizeof buf);
        return td_fail(err,
                       "normalises the features of flat [C] or sequence [T, C] inputs, but its "
                       "input has shape %s; use batchnorm2d for images",
                       buf);
    }
    int c = in.c;
    td_model_add_param(model, node, "weight", 1, &c, td_init_fill(1.0f));
    if (node->args[ARG_BIAS]) td_model_add_param(model, node, "bias", 1, &c, td_init_fill(0.0f));
    node->out_shape = in;
    node->saved_bytes = 2 * rows_of(node, model->max_n) * sizeof(float);
    node->scratch_floats = 2 * (size_t)c * model->threads;
    return 0;
}

static void layernorm_forward(td_node *node, const td_run *run) {
    int c = node->out_shape.c;
    size_t rows = rows_of(node, run->n);
    float eps = (float)node->args[ARG_EPS], *stats = node->saved;
    const float *w = node->params[0]->data;
    const float *b = node->n_params > 1 ? node->params[1]->data : NULL;
    int threads = td_par_threads_for(node->threads, rows * (size_t)c);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (size_t r = 0; r < rows; r++) {
        const float *x = node->in[0] + r * c;
        float *y = node->out + r * c;
        /* two passes in double: the mean first, then the squares about it (no cancellation) */
        double sum = 0, sq = 0;
        for (int k = 0; k < c; k++) sum += x[k];
        double mean = sum / c;
        for (int k = 0; k < c; k++) sq += (x[k] - mean) * (x[k] - mean);
        float rstd = (float)(1.0 / sqrt(sq / c + eps)), m = (float)mean;
        for (int k = 0; k < c; k++) y[k] = (x[k] - m) * rstd * w[k] + (b ? b[k] : 0.0f);
        stats[2 * r] = m;
        stats[2 * r + 1] = rstd;
    }
}

/* One row's dx: rstd · (g - mean(g) - xhat · mean(g · xhat)) with g = dy · weight. */
static void row_input_grad(float *restrict dx, const float *restrict x, const float *restrict dy,
                           const float *restrict w, int c, float mean, float rstd, bool add) {
    double sg = 0, sgx = 0;
    for (int k = 0; k < c; k++) {
        float g = dy[k] * w[k];
        sg += g;
        sgx += (double)g * ((x[k] - mean) * rstd);
    }
    float mg = (float)(sg / c), mgx = (float)(sgx / c);
    for (int k = 0; k < c; k++) {
        float v = rstd * (dy[k] * w[k] - mg - (x[k] - mean) * rstd * mgx);
        dx[k] = add ? dx[k] + v : v;
    }
}

static void layernorm_backward(td_node *node, const td_run *run) {
    int c = node->out_shape.c;
    size_t rows = rows_of(node, run->n);
    const float *stats = node->saved, *w = node->params[0]->data;
    td_param *pw = node->params[0], *pb = node->n_params > 1 ? node->params[1] : NULL;
    int threads = td_par_threads_for(node->threads, rows * (size_t)c), team = 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int me = omp_get_thread_num();
        if (me == 0) team = omp_get_num_threads();
        float *gw = run->scratch + 2 * (size_t)c * me, *gb = gw + c;
        memset(gw, 0, 2 * (size_t)c * sizeof(float));
        size_t lo, hi;
        td_par_range(rows, omp_get_num_threads(), me, 1, &lo, &hi);
        for (size_t r = lo; r < hi; r++) {
            const float *x = node->in[0] + r * c, *dy = node->grad + r * c;
            float mean = stats[2 * r], rstd = stats[2 * r + 1];
            for (int k = 0; k < c; k++) {
                gw[k] += dy[k] * ((x[k] - mean) * rstd);
                gb[k] += dy[k];
            }
            if (node->in_grad[0])
                row_input_grad(node->in_grad[0] + r * c, x, dy, w, c, mean, rstd,
                               node->in_grad_add[0]);
        }
    }
    if (!run->accumulate_grads) {
        memset(pw->grad, 0, (size_t)c * sizeof(float));
        if (pb) memset(pb->grad, 0, (size_t)c * sizeof(float));
    }
    for (int t = 0; t < team; t++) {
        const float *gw = run->scratch + 2 * (size_t)c * t, *gb = gw + c;
        for (int k = 0; k < c; k++) pw->grad[k] += gw[k];
        if (pb)
            for (int k = 0; k < c; k++) pb->grad[k] += gb[k];
    }
}

const td_op TD_ISA_SYM(td_op_layernorm) = {&td_op_sig_layernorm,      layernorm_build,
                                           layernorm_forward,         layernorm_backward,
                                           TD_OP_VARIANTS(layernorm), 0};
