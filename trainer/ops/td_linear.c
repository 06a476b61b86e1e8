/* Linear: y = x W^T + b, W [out, in] as in torch.nn.Linear; on a sequence [T, in], at every
 * position (PyTorch's Linear on [N, T, in]): the N·T positions are the GEMM's rows. */
#include "core/td_model.h"
#include "core/td_parallel.h"
#include "ops/td_gemm.h"
#include "ops/td_ops_isa.h"
#include "ops/td_skinny.h"

#include <math.h>
#include <string.h>

enum { ARG_OUT_FEATURES, ARG_BIAS };

/* A classifier's last layer (10 outputs from 512) leaves OpenBLAS's register tiles mostly empty:
 * about 30 GFLOP/s on an AVX2 EPYC, against 50-75 for the skinny kernels (ops/td_skinny.h). The
 * AVX-512 variant keeps OpenBLAS until this is measured on a CPU that has AVX-512. */
static bool skinny_outputs(int out) {
#if defined(__AVX512F__)
    (void)out;
    return false;
#else
    return out <= 16;
#endif
}

/* With more than one thread td_par_sgemm splits the rows instead. */
static bool skinny(const td_node *node) {
    return skinny_outputs(node->out_shape.c) && node->threads == 1;
}

static int linear_build(td_model *model, td_node *node, td_err *err) {
    td_shape in = node->in_shape[0];
    if (in.spatial) {
        char buf[64];
        td_shape_format(in, buf, sizeof buf);
        return td_fail(err,
                       "expects flat features but its input has shape %s; add a "
                       "{\"op\": \"flatten\"} node before it",
                       buf);
    }
    int out = (int)node->args[ARG_OUT_FEATURES];
    /* kaiming_uniform_(a=sqrt(5)) reduces to a bound of 1/sqrt(fan_in), as does the bias rule */
    float bound = 1.0f / sqrtf((float)in.c);
    td_model_add_param(model, node, "weight", 2, (int[]){out, in.c}, td_init_uniform(bound));
    if (node->args[ARG_BIAS])
        td_model_add_param(model, node, "bias", 1, (int[]){out}, td_init_uniform(bound));
    node->out_shape = in;
    node->out_shape.c = out;
    /* the skinny forward's transposed weight */
    if (skinny_outputs(out)) node->scratch_floats = 16 * (size_t)in.c;
    return 0;
}

static void linear_forward(td_node *node, const td_run *run) {
    int n = run->n * node->in_shape[0].h, in = node->in_shape[0].c, out = node->out_shape.c;
    const float *w = node->params[0]->data;
    const float *b = node->n_params > 1 ? node->params[1]->data : NULL;
    if (skinny(node) && td_skinny_nt(n, out, in, node->in[0], w, node->out, run->scratch)) {
        if (b)
            for (int i = 0; i < n; i++)
                for (int o = 0; o < out; o++) node->out[(size_t)i * out + o] += b[o];
        return;
    }
    /* Start from the bias rows so the GEMM adds onto them: one pass over y fewer. */
    if (b) td_fill_rows(node->out, b, (size_t)n, (size_t)out);
    td_sgemm(node->threads, false, true, n, out, in, node->in[0], in, w, in, node->out, out,
             b != NULL);
}

static void linear_backward(td_node *node, const td_run *run) {
    int n = run->n * node->in_shape[0].h, in = node->in_shape[0].c, out = node->out_shape.c;
    const float *dy = node->grad, *w = node->params[0]->data;
    float *dw = node->params[0]->grad;
    /* dW [out, in] = dy^T [out, n] x [n, in] */
    if (!skinny(node) || !td_skinny_tn(n, out, in, dy, node->in[0], dw, run->accumulate_grads))
        td_sgemm(node->threads, true, false, out, in, n, dy, out, node->in[0], in, dw, in,
                 run->accumulate_grads);
    if (node->n_params > 1) {
        float *db = node->params[1]->grad;
        if (!run->accumulate_grads) memset(db, 0, (size_t)out * 4);
        for (int i = 0; i < n; i++)
            for (int o = 0; o < out; o++) db[o] += dy[(size_t)i * out + o];
    }
    /* dx [n, in] (+)= dy [n, out] x W [out, in] */
    if (node->in_grad[0] && (!skinny(node) || !td_skinny_nn(n, in, out, dy, w, in, node->in_grad[0],
                                                            in, node->in_grad_add[0])))
        td_sgemm(node->threads, false, false, n, in, out, dy, out, w, in, node->in_grad[0], in,
                 node->in_grad_add[0]);
}

const td_op TD_ISA_SYM(td_op_linear) = {&td_op_sig_linear, linear_build,           linear_forward,
                                        linear_backward,   TD_OP_VARIANTS(linear), 0};
