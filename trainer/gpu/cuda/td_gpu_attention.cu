// Causal self-attention on the GPU, as the CPU's ops/td_attention.c: the input is c_attn's
// output [T, 3C] (queries, keys, values side by side, n_head heads of hs = C / n_head each), per
// head y_t = softmax_{j<=t}(q_t · k_j / sqrt(hs)) · v_j, the heads side by side in [T, C].
//
// Fused and memory-light as the CPU's: no score matrix is stored. Forward is one warp a query,
// keys visited in order with the online softmax (a running maximum and denominator, the weighted
// sum of values rescaled as the maximum grows), and keeps each query's logsumexp. Backward
// recomputes the probabilities from it, p_tj = exp(s_tj - lse_t), in two passes that each own
// what they write (no atomics, the same bits at every run):
//   query-major, a warp a query t: D_t = dy_t · y_t, then dq_t = Σ_j p_tj (dy_t · v_j - D_t) k_j;
//   key-major, a warp a key j: dk_j = Σ_{t>=j} ds_tj q_t and dv_j = Σ_{t>=j} p_tj dy_t.
// Every product is in fp32 registers whatever the activations' type.
//
// This is the plain form of a flash kernel: each warp rereads keys and values from memory (L2
// serves most), with no tiles in shared memory. Dropout on the probabilities (attn_dropout) is
// the CPU's alone for now: plan refuses p > 0.
#include "gpu/cuda/td_gpu_internal.h"

#include <math.h>

enum { ATT_WARPS = 8, ATT_THREADS = 32 * ATT_WARPS, ATT_MAX_PER_LANE = 8 };

// One head's view of a sample: where its rows start and how far apart they are.
typedef struct att_shape {
    int t_len, heads, hs, c; // positions, heads, head size, C
    float scale;             // 1 / sqrt(hs)
} att_shape;

static att_shape shape_of(const td_node *node) {
    att_shape s;
    s.c = node->out_shape.c;
    s.t_len = node->in_shape[0].h;
    s.heads = (int)td_node_arg(node, "n_head");
    s.hs = s.c / s.heads;
    s.scale = 1.0f / sqrtf((float)s.hs);
    return s;
}

static int attention_plan(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    (void)g;
    node->gpu = NULL;
    att_shape s = shape_of(node);
    if (td_node_arg(node, "dropout") > 0)
        return td_fail(err,
                       "attention dropout %g has no GPU side yet: set it to 0 on a GPU (GPT-2's "
                       "and nanoGPT's GPT-2 recipes train without it)",
                       td_node_arg(node, "dropout"));
    if (s.hs > 32 * ATT_MAX_PER_LANE)
        return td_fail(err, "head size %d: the GPU kernel holds at most %d values a head", s.hs,
                       32 * ATT_MAX_PER_LANE);
    size_t rows = (size_t)m->max_n * s.heads * s.t_len;
    node->saved_bytes = rows * sizeof(float); // each query's logsumexp
    node->scratch_floats = rows;              // backward's D_t
    return 0;
}

// The dot product of two rows of hs values (every lane gets it).
template <typename T>
static __device__ __forceinline__ float row_dot(const T *a, const T *b, int hs, int lane) {
    float s = 0;
    for (int d = lane; d < hs; d += 32) s += td_to_float(a[d]) * td_to_float(b[d]);
    return td_warp_sum(s);
}

// Where a warp works: its (sample, head) pair ih and position t, the offset of the pair's head
// in the input's rows (its query at t: in + t · 3C; key + C; value + 2C) and of its position's
// output row (another position u's: out + (u - t) · C).
typedef struct att_row {
    size_t ih, in, out;
    int t;
} att_row;

static __device__ __forceinline__ bool att_row_of(const att_shape &s, size_t total, att_row *r) {
    size_t w = (size_t)blockIdx.x * ATT_WARPS + threadIdx.x / 32;
    if (w >= total) return false; // a whole warp leaves together
    r->ih = w / (size_t)s.t_len;
    r->t = (int)(w % (size_t)s.t_len);
    size_t i = r->ih / s.heads, h = r->ih % s.heads;
    r->in = i * s.t_len * 3 * s.c + h * s.hs;
    r->out = (i * s.t_len + r->t) * s.c + h * s.hs;
    return true;
}

template <typename T>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_forward_kernel(const T *__restrict__ qkv, T *__restrict__ y, float *__restrict__ lse,
                             att_shape s, size_t total) {
    att_row r;
    int lane = threadIdx.x % 32, stride = 3 * s.c;
    if (!att_row_of(s, total, &r)) return;
    int t = r.t;
    const T *base = qkv + r.in, *q = base + (size_t)t * stride;
    float acc[ATT_MAX_PER_LANE] = {0}, m = -INFINITY, l = 0;
    for (int j = 0; j <= t; j++) {
        const T *kj = base + s.c + (size_t)j * stride, *vj = base + 2 * s.c + (size_t)j * stride;
        float sc = row_dot(q, kj, s.hs, lane) * s.scale;
        float m_new = fmaxf(m, sc), corr = expf(m - m_new), p = expf(sc - m_new);
        l = l * corr + p;
#pragma unroll
        for (int e = 0; e < ATT_MAX_PER_LANE; e++) {
            int d = lane + 32 * e;
            if (d < s.hs) acc[e] = acc[e] * corr + p * td_to_float(vj[d]);
        }
        m = m_new;
    }
    T *yt = y + r.out;
#pragma unroll
    for (int e = 0; e < ATT_MAX_PER_LANE; e++) {
        int d = lane + 32 * e;
        if (d < s.hs) yt[d] = td_from_float<T>(acc[e] / l);
    }
    if (lane == 0) lse[r.ih * s.t_len + t] = m + logf(l);
}

// Query-major: D_t, then dq_t (written, or added when `add`).
template <typename T>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_dq_kernel(const T *__restrict__ qkv, const T *__restrict__ y,
                        const T *__restrict__ dy, const float *__restrict__ lse,
                        float *__restrict__ dsum, T *__restrict__ dqkv, att_shape s, size_t total,
                        bool add) {
    att_row r;
    int lane = threadIdx.x % 32, stride = 3 * s.c;
    if (!att_row_of(s, total, &r)) return;
    int t = r.t;
    const T *base = qkv + r.in, *q = base + (size_t)t * stride, *dyt = dy + r.out;
    float d_t = row_dot(dyt, y + r.out, s.hs, lane), lse_t = lse[r.ih * s.t_len + t];
    if (lane == 0) dsum[r.ih * s.t_len + t] = d_t;
    float dq[ATT_MAX_PER_LANE] = {0};
    for (int j = 0; j <= t; j++) {
        const T *kj = base + s.c + (size_t)j * stride, *vj = base + 2 * s.c + (size_t)j * stride;
        float p = expf(row_dot(q, kj, s.hs, lane) * s.scale - lse_t);
        float ds = p * (row_dot(dyt, vj, s.hs, lane) - d_t);
#pragma unroll
        for (int e = 0; e < ATT_MAX_PER_LANE; e++) {
            int d = lane + 32 * e;
            if (d < s.hs) dq[e] += ds * td_to_float(kj[d]);
        }
    }
    T *dqt = dqkv + r.in + (size_t)t * stride;
#pragma unroll
    for (int e = 0; e < ATT_MAX_PER_LANE; e++) {
        int d = lane + 32 * e;
        if (d < s.hs) {
            float v = dq[e] * s.scale;
            dqt[d] = td_from_float<T>(add ? td_to_float(dqt[d]) + v : v);
        }
    }
}

// Key-major: dk_j and dv_j over the queries t >= j that see key j (D_t from the first pass).
template <typename T>
static __global__ void __launch_bounds__(ATT_THREADS)
    attention_dkv_kernel(const T *__restrict__ qkv, const T *__restrict__ dy,
                         const float *__restrict__ lse, const float *__restrict__ dsum,
                         T *__restrict__ dqkv, att_shape s, size_t total, bool add) {
    att_row r;
    int lane = threadIdx.x % 32, stride = 3 * s.c;
    if (!att_row_of(s, total, &r)) return;
    int j = r.t;
    const T *base = qkv + r.in;
    const T *kj = base + s.c + (size_t)j * stride, *vj = base + 2 * s.c + (size_t)j * stride;
    float dk[ATT_MAX_PER_LANE] = {0}, dv[ATT_MAX_PER_LANE] = {0};
    for (int t = j; t < s.t_len; t++) {
        const T *qt = base + (size_t)t * stride;
        const T *dyt = dy + r.out + (size_t)(t - j) * s.c;
        float p = expf(row_dot(qt, kj, s.hs, lane) * s.scale - lse[r.ih * s.t_len + t]);
        float ds = p * (row_dot(dyt, vj, s.hs, lane) - dsum[r.ih * s.t_len + t]);
#pragma unroll
        for (int e = 0; e < ATT_MAX_PER_LANE; e++) {
            int d = lane + 32 * e;
            if (d < s.hs) {
                dk[e] += ds * td_to_float(qt[d]);
                dv[e] += p * td_to_float(dyt[d]);
            }
        }
    }
    T *row = dqkv + r.in + (size_t)j * stride;
#pragma unroll
    for (int e = 0; e < ATT_MAX_PER_LANE; e++) {
        int d = lane + 32 * e;
        if (d < s.hs) {
            float k = dk[e] * s.scale, v = dv[e];
            T *dk_at = row + s.c + d, *dv_at = row + 2 * s.c + d;
            *dk_at = td_from_float<T>(add ? td_to_float(*dk_at) + k : k);
            *dv_at = td_from_float<T>(add ? td_to_float(*dv_at) + v : v);
        }
    }
}

static unsigned att_blocks(size_t warps) {
    return (unsigned)((warps + ATT_WARPS - 1) / ATT_WARPS);
}

template <typename T> static void att_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    att_shape s = shape_of(node);
    size_t total = (size_t)run->n * s.heads * s.t_len;
    if (total == 0) return;
    attention_forward_kernel<T><<<att_blocks(total), ATT_THREADS, 0, run->stream>>>(
        (const T *)node->in[0], (T *)node->out, (float *)node->saved, s, total);
    TD_LAUNCHED(g);
}

template <typename T> static void att_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    att_shape s = shape_of(node);
    size_t total = (size_t)run->n * s.heads * s.t_len;
    T *dqkv = (T *)node->in_grad[0];
    if (total == 0 || !dqkv) return;
    const T *qkv = (const T *)node->in[0], *dy = (const T *)node->grad;
    const float *lse = (const float *)node->saved;
    float *dsum = (float *)g->workspace;
    bool add = node->in_grad_add[0];
    attention_dq_kernel<T><<<att_blocks(total), ATT_THREADS, 0, run->stream>>>(
        qkv, (const T *)node->out, dy, lse, dsum, dqkv, s, total, add);
    TD_LAUNCHED(g);
    attention_dkv_kernel<T><<<att_blocks(total), ATT_THREADS, 0, run->stream>>>(
        qkv, dy, lse, dsum, dqkv, s, total, add);
    TD_LAUNCHED(g);
}

TD_GPU_TYPED_ENTRY(attention_forward, att_fwd)

TD_GPU_TYPED_ENTRY(attention_backward, att_bwd)

const td_gpu_op td_gpu_op_causal_attention = {&td_op_causal_attention, attention_plan,
                                              attention_forward, attention_backward, NULL};
