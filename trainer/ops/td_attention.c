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
 * the pairs.
 *
 * Dropout on the probabilities (nanoGPT's attn_dropout: nn.Dropout on att after the softmax,
 * before att @ v), inverted as PyTorch's: a kept probability is scaled by 1 / (1 - p). The mask
 * is not stored either: forward draws one key from the run's generator and element (pair, t, j)
 * is kept when a hash of the key and its index, as a uniform number, is at least p; backward
 * recomputes the same bits from the key saved beside the logsumexps. The threads then need no
 * generator of their own, and the result does not depend on how many there are. */
#include "core/td_model.h"
#include "core/td_parallel.h"
#include "ops/td_gemm.h"
#include "ops/td_ops_isa.h"

#include <math.h>
#include <omp.h>
#include <string.h>

enum { ARG_N_HEAD, ARG_DROPOUT };
/* saved: the dropout key (8 bytes), then one logsumexp per (sample, head, query) */
#define LSE_OFFSET sizeof(uint64_t)

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
    node->saved_bytes = LSE_OFFSET + (size_t)model->max_n * heads * in.h * sizeof(float);
    node->scratch_floats = 2 * (size_t)in.h * in.h * model->threads; /* a thread's two tiles */
    return 0;
}

typedef struct head_view {
    int t_len, hs, stride;  /* positions, head size, floats from one position to the next in qkv */
    const float *q, *k, *v; /* this head's first query, key and value */
    float scale;
    uint64_t key;   /* dropout: this pair's mask is keep(key, t · T + j) */
    float drop_p;   /* 0: no dropout (evaluation, or p = 0) */
    float keep_mul; /* 1 / (1 - p) */
} head_view;

/* Dropout's multiplier of probability (t, j): 0 or 1 / (1 - p); 1 without dropout. */
static inline float keep(const head_view *hv, int t, int j) {
    if (hv->drop_p == 0.0f) return 1.0f;
    uint64_t bits = td_mix64(hv->key + (uint64_t)t * (uint64_t)hv->t_len + (uint64_t)j);
    float u = (float)(bits >> 40) * (1.0f / 16777216.0f); /* 24 bits: uniform in [0, 1) */
    return u >= hv->drop_p ? hv->keep_mul : 0.0f;
}

static head_view view_of(const td_node *node, const td_run *run, const float *qkv, int i, int h) {
    int c = node->out_shape.c, heads = (int)node->args[ARG_N_HEAD], hs = c / heads;
    int t_len = node->in_shape[0].h;
    const float *base = qkv + (size_t)i * t_len * 3 * c + (size_t)h * hs;
    float p = run->training ? (float)node->args[ARG_DROPOUT] : 0.0f;
    /* each pair's indices apart by T², so no two elements of one forward share a hash input */
    uint64_t pair = (uint64_t)i * (uint64_t)heads + (uint64_t)h;
    uint64_t key = *(const uint64_t *)node->saved + pair * (uint64_t)t_len * (uint64_t)t_len;
    return (head_view){t_len,
                       hs,
                       3 * c,
                       base,
                       base + c,
                       base + 2 * c,
                       1.0f / sqrtf((float)hs),
                       key,
                       p,
                       1.0f / (1.0f - p)};
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
    if (hv->drop_p > 0.0f)
        for (int t = 0; t < t_len; t++)
            for (int j = 0; j <= t; j++) tile[(size_t)t * t_len + j] *= keep(hv, t, j);
    td_sgemm(1, false, false, t_len, hs, t_len, tile, t_len, hv->v, hv->stride, y, y_stride, false);
}

static void attention_forward(td_node *node, const td_run *run) {
    /* a repeated forward (activation checkpointing) gets the generator as it was: the same key */
    if (run->training && node->args[ARG_DROPOUT] > 0)
        *(uint64_t *)node->saved = td_rng_u64(run->rng);
    int heads = (int)node->args[ARG_N_HEAD], c = node->out_shape.c;
    int t_len = node->in_shape[0].h, pairs = run->n * heads;
    int threads = td_par_threads_for(node->threads, (size_t)pairs * t_len * t_len * c / heads);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int ih = 0; ih < pairs; ih++) {
        int i = ih / heads, h = ih % heads;
        head_view hv = view_of(node, run, node->in[0], i, h);
        float *y = node->out + (size_t)i * t_len * c + (size_t)h * hv.hs;
        float *lse = (float *)((char *)node->saved + LSE_OFFSET) + (size_t)ih * t_len;
        float *tile = run->scratch + (size_t)omp_get_thread_num() * 2 * t_len * t_len;
        head_forward(&hv, y, c, lse, tile);
    }
}

/* One (sample, head) backward, the probabilities P recomputed from the saved logsumexp:
 * dP = dY V^T, dS = P ∘ (dP - rowsum(P ∘ dP)) · scale, dQ = dS K, dK = dS^T Q, dV = P^T dY.
 * With dropout's multipliers M, Y = (P ∘ M) V: dP = M ∘ (dY V^T), and dV = (P ∘ M)^T dY.
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
        if (hv->drop_p > 0.0f)
            for (int j = 0; j <= t; j++) dt[j] *= keep(hv, t, j);
        for (int j = 0; j <= t; j++) d += pt[j] * dt[j];
        for (int j = 0; j <= t; j++) dt[j] = pt[j] * (dt[j] - d) * hv->scale;
        for (int j = t + 1; j < t_len; j++) dt[j] = 0.0f;
        if (hv->drop_p > 0.0f) /* P ∘ M for dV */
            for (int j = 0; j <= t; j++) pt[j] *= keep(hv, t, j);
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
        head_view hv = view_of(node, run, node->in[0], i, h);
        size_t y_at = (size_t)i * t_len * c + (size_t)h * hv.hs;
        float *dq = node->in_grad[0] + (size_t)i * t_len * 3 * c + (size_t)h * hv.hs;
        float *tile = run->scratch + (size_t)omp_get_thread_num() * 2 * t_len * t_len;
        const float *lse = (const float *)((const char *)node->saved + LSE_OFFSET);
        head_backward(&hv, node->grad + y_at, c, lse + (size_t)ih * t_len, dq, node->in_grad_add[0],
                      tile);
    }
}

const td_op TD_ISA_SYM(td_op_causal_attention) = {&td_op_sig_causal_attention,
                                                  attention_build,
                                                  attention_forward,
                                                  attention_backward,
                                                  TD_OP_VARIANTS(causal_attention),
                                                  0};
