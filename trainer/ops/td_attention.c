/* Causal self-attention's core, as nanoGPT's CausalSelfAttention computes it between its two
 * Linears: the input is c_attn's output [T, 3C] (queries, keys, values side by side, each split
 * into n_head heads of C / n_head); per head, y_t = softmax_j≤t(q_t · k_j / sqrt(hs)) · v_j; the
 * output [T, C] holds the heads side by side, as y.transpose(1, 2).view(B, T, C) does.
 *
 * The score matrix is never stored: forward keeps one number per query, the log of its softmax's
 * denominator (logsumexp), and backward recomputes each row's probabilities from it, as fused
 * ("flash") attention kernels do. Memory is N·H·T floats instead of N·H·T². Every (sample, head)
 * pair is independent, writing only its own columns: the threads split the pairs. */
#include "core/td_model.h"
#include "core/td_parallel.h"
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
    node->scratch_floats = (size_t)in.h * model->threads;
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

static float dot(const float *restrict a, const float *restrict b, int n) {
    float s = 0;
    for (int k = 0; k < n; k++) s += a[k] * b[k];
    return s;
}

/* One (sample, head): y's columns of the head, and each query's logsumexp. */
static void head_forward(const head_view *hv, float *y, int y_stride, float *lse, float *p) {
    for (int t = 0; t < hv->t_len; t++) {
        const float *q = hv->q + (size_t)t * hv->stride;
        float m = -INFINITY;
        for (int j = 0; j <= t; j++) {
            p[j] = dot(q, hv->k + (size_t)j * hv->stride, hv->hs) * hv->scale;
            if (p[j] > m) m = p[j];
        }
        float sum = 0;
        for (int j = 0; j <= t; j++) sum += (p[j] = expf(p[j] - m));
        float *yt = y + (size_t)t * y_stride, inv = 1.0f / sum;
        memset(yt, 0, (size_t)hv->hs * sizeof(float));
        for (int j = 0; j <= t; j++) {
            const float *vj = hv->v + (size_t)j * hv->stride;
            float pj = p[j] * inv;
            for (int k = 0; k < hv->hs; k++) yt[k] += pj * vj[k];
        }
        lse[t] = m + logf(sum);
    }
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
        head_forward(&hv, y, c, lse, run->scratch + (size_t)omp_get_thread_num() * t_len);
    }
}

/* One (sample, head) backward. With p the recomputed probabilities of query t, dp_j = dy_t · v_j
 * and D_t = Σ_j p_j dp_j = dy_t · y_t: ds_j = p_j (dp_j - D_t); dq_t = scale Σ_j ds_j k_j,
 * dk_j += scale ds_j q_t, dv_j += p_j dy_t. dq, dk, dv: this head's columns of the input's
 * gradient, zeroed first unless they add. */
static void head_backward(const head_view *hv, const float *y, const float *dy, int y_stride,
                          const float *lse, float *dq, bool add) {
    float *dk = dq + (y_stride), *dv = dq + 2 * (size_t)y_stride;
    int hs = hv->hs;
    size_t st = (size_t)hv->stride;
    if (!add)
        for (int t = 0; t < hv->t_len; t++) {
            memset(dq + t * st, 0, (size_t)hs * sizeof(float));
            memset(dk + t * st, 0, (size_t)hs * sizeof(float));
            memset(dv + t * st, 0, (size_t)hs * sizeof(float));
        }
    for (int t = 0; t < hv->t_len; t++) {
        const float *q = hv->q + t * st, *dyt = dy + (size_t)t * y_stride;
        float d = dot(dyt, y + (size_t)t * y_stride, hs);
        float *dqt = dq + t * st;
        for (int j = 0; j <= t; j++) {
            const float *kj = hv->k + j * st, *vj = hv->v + j * st;
            float p = expf(dot(q, kj, hs) * hv->scale - lse[t]);
            float ds = p * (dot(dyt, vj, hs) - d) * hv->scale;
            float *dkj = dk + j * st, *dvj = dv + j * st;
            for (int k = 0; k < hs; k++) {
                dqt[k] += ds * kj[k];
                dkj[k] += ds * q[k];
                dvj[k] += p * dyt[k];
            }
        }
    }
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
        head_backward(&hv, node->out + y_at, node->grad + y_at, c,
                      (const float *)node->saved + (size_t)ih * t_len, dq, node->in_grad_add[0]);
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
