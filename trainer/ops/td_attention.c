/* Causal self-attention's core, as nanoGPT's CausalSelfAttention computes it between its two
 * Linears: the input is c_attn's output [T, 3C] (queries, keys, values side by side, each split
 * into n_head heads of C / n_head); per head, y_t = softmax_j≤t(q_t · k_j / sqrt(hs)) · v_j; the
 * output [T, C] holds the heads side by side, as y.transpose(1, 2).view(B, T, C) does.
 *
 * The score matrix is never stored: forward keeps one number per query, the log of its softmax's
 * denominator (logsumexp), and backward recomputes the probabilities from it, as fused
 * ("flash") attention kernels do. Memory is N·H·T floats instead of N·H·T², plus a thread's two
 * [T, T] tiles of scratch. Each (sample, head) pair is five GEMMs on its tile (QK^T and PV
 * forward; QK^T again, dY V^T, and dS K, dS^T Q, P^T dY backward): the work is the GEMM kernels',
 * not dot products. The pairs are independent, each writing its own columns: the threads split
 * the pairs. */
#include "core/td_model.h"
#include "core/td_parallel.h"
#include "ops/td_gemm.h"
#include "ops/td_ops_isa.h"

#include <math.h>
#include <omp.h>
#include <string.h>

enum { ARG_N_HEAD };
static const td_op_arg attention_args[] = {
    {"n_head", TD_ARG_INT, true, 0, 1, 1 << 12, NULL},
    {0},
};

static int attention_build(td_model *model, td_node *node, td_err *err) {
    td_shape in = node->in_shape[0];
    int heads = (int)node->args[ARG_N_HEAD];
    if (in.spatial || in.c % (3 * heads) != 0) {
        char buf[64];
        td_shape_format(in, buf, sizeof buf);
        return td_fail(err,
                       "expects queries, keys and values side by side, [T, 3·C] with C a "
                       "multiple of n_head %d, but its input has shape %s",
                       heads, buf);
    }
    node->out_shape = td_shape_seq(in.h, in.c / 3);
    node->saved_bytes = (size_t)model->max_n * heads * in.h * sizeof(float);
    node->scratch_floats = 2 * (size_t)in.h * in.h * model->threads; /* a thread's two tiles */
    return 0;
}

typedef struct head_view {
    int t_len, hs, stride;  /* positions, head size, floats from one position to the next in qkv */
    const float *q, *k, *v; /* this head's first query, key and value */
    float scale;
} head_view;

static head_view view_of(const td_node *node, const float *qkv, int i, int h) {
    int c = node->out_shape.c, heads = (int)node->args[ARG_N_HEAD], hs = c / heads;
    int t_len = node->in_shape[0].h;
    const float *base = qkv + (size_t)i * t_len * 3 * c + (size_t)h * hs;
    return (head_view){t_len, hs, 3 * c, base, base + c, base + 2 * c, 1.0f / sqrtf((float)hs)};
}

/* p [T, T]: row t's causal softmax of the raw scores s (s · scale, keys j <= t; 0 past t): with
 * each row's logsumexp written to lse_out, or computed from the saved lse_in (backward). */
static void softmax_rows(const head_view *hv, const float *s, float *p, float *lse_out,
                         const float *lse_in) {
    int t_len = hv->t_len;
    for (int t = 0; t < t_len; t++) {
        const float *st = s + (size_t)t * t_len;
        float *pt = p + (size_t)t * t_len;
        if (lse_in) {
            for (int j = 0; j <= t; j++) pt[j] = expf(st[j] * hv->scale - lse_in[t]);
        } else {
            float m = -INFINITY, sum = 0;
            for (int j = 0; j <= t; j++) m = fmaxf(m, st[j] * hv->scale);
            for (int j = 0; j <= t; j++) sum += (pt[j] = expf(st[j] * hv->scale - m));
            float inv = 1.0f / sum;
            for (int j = 0; j <= t; j++) pt[j] *= inv;
            lse_out[t] = m + logf(sum);
        }
        for (int j = t + 1; j < t_len; j++) pt[j] = 0.0f;
    }
}

/* One (sample, head) as three GEMMs on a [T, T] tile in scratch: S = Q K^T, P = softmax, Y = P V
 * (y: this head's columns of the output, rows y_stride apart). */
static void head_forward(const head_view *hv, float *y, int y_stride, float *lse, float *tile) {
    int t_len = hv->t_len, hs = hv->hs;
    td_sgemm(1, false, true, t_len, t_len, hs, hv->q, hv->stride, hv->k, hv->stride, tile, t_len,
             false);
    softmax_rows(hv, tile, tile, lse, NULL);
    td_sgemm(1, false, false, t_len, hs, t_len, tile, t_len, hv->v, hv->stride, y, y_stride, false);
}

static void attention_forward(td_node *node, const td_run *run) {
    int heads = (int)node->args[ARG_N_HEAD], c = node->out_shape.c;
    int t_len = node->in_shape[0].h, pairs = run->n * heads;
    int threads = td_par_threads_for(node->threads, (size_t)pairs * t_len * t_len * c / heads);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int ih = 0; ih < pairs; ih++) {
        int i = ih / heads, h = ih % heads;
        head_view hv = view_of(node, node->in[0], i, h);
        float *y = node->out + (size_t)i * t_len * c + (size_t)h * hv.hs;
        float *lse = (float *)node->saved + (size_t)ih * t_len;
        float *tile = run->scratch + (size_t)omp_get_thread_num() * 2 * t_len * t_len;
        head_forward(&hv, y, c, lse, tile);
    }
}

/* One (sample, head) backward, the probabilities P recomputed from the saved logsumexp:
 * dP = dY V^T, dS = P ∘ (dP - rowsum(P ∘ dP)) · scale, dQ = dS K, dK = dS^T Q, dV = P^T dY.
 * dq: this head's query columns of the input's gradient (keys c, values 2c further on), written
 * or, where add, added to. tile: 2 · T · T floats. */
static void head_backward(const head_view *hv, const float *dy, int c, const float *lse, float *dq,
                          bool add, float *tile) {
    int t_len = hv->t_len, hs = hv->hs;
    float *p = tile, *ds = tile + (size_t)t_len * t_len;
    td_sgemm(1, false, true, t_len, t_len, hs, hv->q, hv->stride, hv->k, hv->stride, p, t_len,
             false);
    softmax_rows(hv, p, p, NULL, lse);
    td_sgemm(1, false, true, t_len, t_len, hs, dy, c, hv->v, hv->stride, ds, t_len, false);
    for (int t = 0; t < t_len; t++) {
        float *pt = p + (size_t)t * t_len, *dt = ds + (size_t)t * t_len, d = 0;
        for (int j = 0; j <= t; j++) d += pt[j] * dt[j];
        for (int j = 0; j <= t; j++) dt[j] = pt[j] * (dt[j] - d) * hv->scale;
        for (int j = t + 1; j < t_len; j++) dt[j] = 0.0f;
    }
    td_sgemm(1, false, false, t_len, hs, t_len, ds, t_len, hv->k, hv->stride, dq, hv->stride, add);
    td_sgemm(1, true, false, t_len, hs, t_len, ds, t_len, hv->q, hv->stride, dq + c, hv->stride,
             add);
    td_sgemm(1, true, false, t_len, hs, t_len, p, t_len, dy, c, dq + 2 * (size_t)c, hv->stride,
             add);
}

static void attention_backward(td_node *node, const td_run *run) {
    if (!node->in_grad[0]) return;
    int heads = (int)node->args[ARG_N_HEAD], c = node->out_shape.c;
    int t_len = node->in_shape[0].h, pairs = run->n * heads;
    int threads = td_par_threads_for(node->threads, (size_t)pairs * t_len * t_len * c / heads);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int ih = 0; ih < pairs; ih++) {
        int i = ih / heads, h = ih % heads;
        head_view hv = view_of(node, node->in[0], i, h);
        size_t y_at = (size_t)i * t_len * c + (size_t)h * hv.hs;
        float *dq = node->in_grad[0] + (size_t)i * t_len * 3 * c + (size_t)h * hv.hs;
        float *tile = run->scratch + (size_t)omp_get_thread_num() * 2 * t_len * t_len;
        head_backward(&hv, node->grad + y_at, c, (const float *)node->saved + (size_t)ih * t_len,
                      dq, node->in_grad_add[0], tile);
    }
}

const td_op TD_ISA_SYM(td_op_causal_attention) = {"causal_attention",
                                                  1,
                                                  1,
                                                  attention_args,
                                                  attention_build,
                                                  attention_forward,
                                                  attention_backward,
                                                  TD_OP_VARIANTS(causal_attention),
                                                  0};
