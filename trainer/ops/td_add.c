/* Add: the elementwise sum of two or more inputs of one shape (the join of a residual block),
 * split over the node's threads in equal runs. */
#include "core/td_model.h"
#include "core/td_parallel.h"
#include "ops/td_ops_isa.h"

#include <omp.h>
#include <string.h>

static int add_build(td_model *model, td_node *node, td_err *err) {
    (void)model;
    td_shape a = node->in_shape[0];
    for (int j = 1; j < node->n_inputs; j++) {
        td_shape b = node->in_shape[j];
        if (a.c != b.c || a.h != b.h || a.w != b.w || a.spatial != b.spatial) {
            char sa[64], sb[64];
            td_shape_format(a, sa, sizeof sa);
            td_shape_format(b, sb, sizeof sb);
            return td_fail(err,
                           "inputs[0] has shape %s but inputs[%d] has shape %s; add needs "
                           "equal shapes",
                           sa, j, sb);
        }
    }
    node->out_shape = a;
    return 0;
}

static void add_forward(td_node *node, const td_run *run) {
    size_t n = (size_t)run->n * td_shape_size(node->out_shape);
    int threads = td_par_threads_for(node->threads, n);
    float *y = node->out;
    /* each thread's run of every input at once: one pass over the output */
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t lo, hi;
        td_par_range(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        if (node->n_inputs == 2) {
            const float *a = node->in[0], *b = node->in[1];
            for (size_t i = lo; i < hi; i++) y[i] = a[i] + b[i];
        } else {
            memcpy(y + lo, node->in[0] + lo, (hi - lo) * 4);
            for (int j = 1; j < node->n_inputs; j++) {
                const float *x = node->in[j];
                for (size_t i = lo; i < hi; i++) y[i] += x[i];
            }
        }
    }
}

static void add_backward(td_node *node, const td_run *run) {
    size_t n = (size_t)run->n * td_shape_size(node->out_shape);
    int threads = td_par_threads_for(node->threads, n);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t lo, hi;
        td_par_range(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        for (int j = 0; j < node->n_inputs; j++) {
            float *dx = node->in_grad[j];
            if (!dx) continue;
            if (node->in_grad_add[j])
                for (size_t i = lo; i < hi; i++) dx[i] += node->grad[i];
            else
                memcpy(dx + lo, node->grad + lo, (hi - lo) * 4);
        }
    }
}

const td_op TD_ISA_SYM(td_op_add) = {&td_op_sig_add, add_build,           add_forward,
                                     add_backward,   TD_OP_VARIANTS(add), 0};
