// Pooling on the device over channels-last activations, with td_pool.c's semantics: MaxPool2d
// and AvgPool2d (floor mode, stride 0 meaning kernel_size, zero padding, count_include_pad),
// global average pooling ([H, W, C] -> [C]) and AdaptiveAvgPool2d(1) ([H, W, C] -> [1, 1, C], the
// same bytes). One thread per output element in forward, one per input element in backward:
// channels are the fastest index, so neighbouring threads touch neighbouring addresses.
//
// Backward gathers, for each input element, over the windows that cover it instead of
// scattering each window into its inputs: overlapping windows then need no atomics, the result
// is deterministic, and the sums run in the CPU's order (windows in increasing output index).
#include "gpu/cuda/td_gpu_internal.h"

#define POOL_THREADS 256

typedef struct pool_geom {
    int c, h, w, oh, ow, k, s, p;
    bool include_pad; // avg only
} pool_geom;

// Element i of a channels-last [*, h, w, c] tensor: its sample, row, column and channel.
struct nhwc_pos {
    size_t b;
    int y, x, c;
};
static __device__ __forceinline__ nhwc_pos nhwc_split(size_t i, int h, int w, int c) {
    nhwc_pos p;
    p.c = (int)(i % c);
    size_t t = i / c;
    p.x = (int)(t % w);
    t /= w;
    p.y = (int)(t % h);
    p.b = t / h;
    return p;
}

static pool_geom pool_geom_of(const td_node *node, bool avg) {
    pool_geom q;
    q.c = node->in_shape[0].c;
    q.h = node->in_shape[0].h;
    q.w = node->in_shape[0].w;
    q.oh = node->out_shape.h;
    q.ow = node->out_shape.w;
    q.k = (int)td_node_arg(node, "kernel_size");
    int stride = (int)td_node_arg(node, "stride");
    q.s = stride > 0 ? stride : q.k;
    q.p = (int)td_node_arg(node, "padding");
    q.include_pad = avg && td_node_arg(node, "count_include_pad") != 0;
    return q;
}

// The outputs lo..hi (inclusive, possibly empty) along one axis whose windows
// [o*s - p, o*s - p + k - 1] contain input position i.
static __device__ __forceinline__ void pool_cover(int i, int k, int s, int p, int outs, int *lo,
                                                  int *hi) {
    int first = i + p - k + 1; // o*s >= first
    *lo = first > 0 ? (first + s - 1) / s : 0;
    int last = (i + p) / s; // o*s <= i + p
    *hi = last < outs - 1 ? last : outs - 1;
}

// 1 / the number of elements window (oh, ow) averages over, as the CPU computes it (in float).
static __device__ __forceinline__ float pool_avg_inv(const pool_geom &q, int oh, int ow) {
    if (q.include_pad) return 1.0f / (float)(q.k * q.k);
    int h0 = oh * q.s - q.p, w0 = ow * q.s - q.p;
    int h1 = h0 + q.k < q.h ? h0 + q.k : q.h, w1 = w0 + q.k < q.w ? w0 + q.k : q.w;
    if (h0 < 0) h0 = 0;
    if (w0 < 0) w0 = 0;
    return 1.0f / (float)((h1 - h0) * (w1 - w0));
}

// ---- MaxPool2d --------------------------------------------------------------------------------

// The window's first valid element seeds the maximum; a later one wins when greater or NaN
// (PyTorch's rule, as td_max_run). The argmax is an offset into the sample's input.
template <typename T>
static __global__ void __launch_bounds__(POOL_THREADS)
    maxpool_forward_kernel(const T *__restrict__ x, T *__restrict__ y, int32_t *__restrict__ arg,
                           pool_geom q, size_t total) {
    size_t in_size = (size_t)q.h * q.w * q.c;
    TD_GRID_STRIDE(o, total) {
        nhwc_pos pos = nhwc_split(o, q.oh, q.ow, q.c);
        int c = pos.c, ow = pos.x, oh = pos.y;
        size_t b = pos.b;
        const T *xs = x + b * in_size;
        float best = 0.0f;
        int32_t best_at = -1;
        for (int kh = 0; kh < q.k; kh++) {
            int ih = oh * q.s - q.p + kh;
            if (ih < 0 || ih >= q.h) continue;
            for (int kw = 0; kw < q.k; kw++) {
                int iw = ow * q.s - q.p + kw;
                if (iw < 0 || iw >= q.w) continue;
                int32_t at = (ih * q.w + iw) * q.c + c;
                float v = td_to_float(xs[at]);
                if (best_at < 0 || v > best || v != v) {
                    best = v;
                    best_at = at;
                }
            }
        }
        y[o] = td_from_float<T>(best);
        arg[o] = best_at;
    }
}

// dx at an input element: the gradients of the outputs whose argmax it is.
template <typename T>
static __global__ void __launch_bounds__(POOL_THREADS)
    maxpool_backward_kernel(const int32_t *__restrict__ arg, const T *__restrict__ dy,
                            T *__restrict__ dx, pool_geom q, size_t total, bool add) {
    size_t out_size = (size_t)q.oh * q.ow * q.c;
    TD_GRID_STRIDE(i, total) {
        nhwc_pos pos = nhwc_split(i, q.h, q.w, q.c);
        int c = pos.c, iw = pos.x, ih = pos.y;
        size_t b = pos.b;
        int32_t at = (ih * q.w + iw) * q.c + c;
        int oh0, oh1, ow0, ow1;
        pool_cover(ih, q.k, q.s, q.p, q.oh, &oh0, &oh1);
        pool_cover(iw, q.k, q.s, q.p, q.ow, &ow0, &ow1);
        const int32_t *a = arg + b * out_size;
        const T *d = dy + b * out_size;
        float acc = add ? td_to_float(dx[i]) : 0.0f;
        for (int oh = oh0; oh <= oh1; oh++)
            for (int ow = ow0; ow <= ow1; ow++) {
                size_t o = ((size_t)oh * q.ow + ow) * q.c + c;
                if (a[o] == at) acc += td_to_float(d[o]);
            }
        dx[i] = td_from_float<T>(acc);
    }
}

static int maxpool_plan(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    (void)g, (void)err;
    node->gpu = NULL;
    node->saved_bytes = (size_t)m->max_n * td_shape_size(node->out_shape) * sizeof(int32_t);
    node->scratch_floats = 0;
    return 0;
}

template <typename T> static void maxpool_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    pool_geom q = pool_geom_of(node, false);
    size_t total = (size_t)run->n * td_shape_size(node->out_shape);
    if (total == 0) return;
    maxpool_forward_kernel<T><<<td_gpu_blocks(total, POOL_THREADS), POOL_THREADS, 0, run->stream>>>(
        (const T *)node->in[0], (T *)node->out, (int32_t *)node->saved, q, total);
    TD_LAUNCHED(g);
}

template <typename T> static void maxpool_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    if (!node->in_grad[0]) return;
    pool_geom q = pool_geom_of(node, false);
    size_t total = (size_t)run->n * td_shape_size(node->in_shape[0]);
    if (total == 0) return;
    maxpool_backward_kernel<T>
        <<<td_gpu_blocks(total, POOL_THREADS), POOL_THREADS, 0, run->stream>>>(
            (const int32_t *)node->saved, (const T *)node->grad, (T *)node->in_grad[0], q, total,
            node->in_grad_add[0]);
    TD_LAUNCHED(g);
}

TD_GPU_TYPED_ENTRY(maxpool_forward, maxpool_fwd)

TD_GPU_TYPED_ENTRY(maxpool_backward, maxpool_bwd)

// ---- AvgPool2d --------------------------------------------------------------------------------

// Summed in window order, then scaled by 1/divisor: the CPU's order and roundings.
template <typename T>
static __global__ void __launch_bounds__(POOL_THREADS)
    avgpool_forward_kernel(const T *__restrict__ x, T *__restrict__ y, pool_geom q, size_t total) {
    size_t in_size = (size_t)q.h * q.w * q.c;
    TD_GRID_STRIDE(o, total) {
        nhwc_pos pos = nhwc_split(o, q.oh, q.ow, q.c);
        int c = pos.c, ow = pos.x, oh = pos.y;
        size_t b = pos.b;
        const T *xs = x + b * in_size;
        float sum = 0.0f;
        for (int kh = 0; kh < q.k; kh++) {
            int ih = oh * q.s - q.p + kh;
            if (ih < 0 || ih >= q.h) continue;
            for (int kw = 0; kw < q.k; kw++) {
                int iw = ow * q.s - q.p + kw;
                if (iw < 0 || iw >= q.w) continue;
                sum += td_to_float(xs[((size_t)ih * q.w + iw) * q.c + c]);
            }
        }
        y[o] = td_from_float<T>(sum * pool_avg_inv(q, oh, ow));
    }
}

template <typename T>
static __global__ void __launch_bounds__(POOL_THREADS)
    avgpool_backward_kernel(const T *__restrict__ dy, T *__restrict__ dx, pool_geom q, size_t total,
                            bool add) {
    size_t out_size = (size_t)q.oh * q.ow * q.c;
    TD_GRID_STRIDE(i, total) {
        nhwc_pos pos = nhwc_split(i, q.h, q.w, q.c);
        int c = pos.c, iw = pos.x, ih = pos.y;
        size_t b = pos.b;
        int oh0, oh1, ow0, ow1;
        pool_cover(ih, q.k, q.s, q.p, q.oh, &oh0, &oh1);
        pool_cover(iw, q.k, q.s, q.p, q.ow, &ow0, &ow1);
        const T *d = dy + b * out_size;
        float acc = add ? td_to_float(dx[i]) : 0.0f;
        for (int oh = oh0; oh <= oh1; oh++)
            for (int ow = ow0; ow <= ow1; ow++)
                acc += td_to_float(d[((size_t)oh * q.ow + ow) * q.c + c]) * pool_avg_inv(q, oh, ow);
        dx[i] = td_from_float<T>(acc);
    }
}

template <typename T> static void avgpool_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    pool_geom q = pool_geom_of(node, true);
    size_t total = (size_t)run->n * td_shape_size(node->out_shape);
    if (total == 0) return;
    avgpool_forward_kernel<T><<<td_gpu_blocks(total, POOL_THREADS), POOL_THREADS, 0, run->stream>>>(
        (const T *)node->in[0], (T *)node->out, q, total);
    TD_LAUNCHED(g);
}

template <typename T> static void avgpool_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    if (!node->in_grad[0]) return;
    pool_geom q = pool_geom_of(node, true);
    size_t total = (size_t)run->n * td_shape_size(node->in_shape[0]);
    if (total == 0) return;
    avgpool_backward_kernel<T>
        <<<td_gpu_blocks(total, POOL_THREADS), POOL_THREADS, 0, run->stream>>>(
            (const T *)node->grad, (T *)node->in_grad[0], q, total, node->in_grad_add[0]);
    TD_LAUNCHED(g);
}

TD_GPU_TYPED_ENTRY(avgpool_forward, avgpool_fwd)

TD_GPU_TYPED_ENTRY(avgpool_backward, avgpool_bwd)

// ---- global average pooling (and AdaptiveAvgPool2d(1)) ----------------------------------------

// One thread per (sample, channel), summing the pixels in order as the CPU does.
template <typename T>
static __global__ void __launch_bounds__(POOL_THREADS)
    gap_forward_kernel(const T *__restrict__ x, T *__restrict__ y, int c, int hw, float inv,
                       size_t total) {
    TD_GRID_STRIDE(o, total) {
        size_t b = o / c;
        int ch = (int)(o % c);
        const T *xs = x + b * hw * c + ch;
        float sum = 0.0f;
        for (int i = 0; i < hw; i++) sum += td_to_float(xs[(size_t)i * c]);
        y[o] = td_from_float<T>(sum * inv);
    }
}

template <typename T>
static __global__ void __launch_bounds__(POOL_THREADS)
    gap_backward_kernel(const T *__restrict__ dy, T *__restrict__ dx, int c, int hw, float inv,
                        size_t total, bool add) {
    TD_GRID_STRIDE(i, total) {
        int ch = (int)(i % c);
        size_t b = i / ((size_t)hw * c);
        float v = td_to_float(dy[b * c + ch]) * inv;
        dx[i] = td_from_float<T>(add ? td_to_float(dx[i]) + v : v);
    }
}

template <typename T> static void gap_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    td_shape s = node->in_shape[0];
    int hw = s.h * s.w;
    size_t total = (size_t)run->n * s.c;
    if (total == 0) return;
    gap_forward_kernel<T><<<td_gpu_blocks(total, POOL_THREADS), POOL_THREADS, 0, run->stream>>>(
        (const T *)node->in[0], (T *)node->out, s.c, hw, 1.0f / (float)hw, total);
    TD_LAUNCHED(g);
}

template <typename T> static void gap_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    if (!node->in_grad[0]) return;
    td_shape s = node->in_shape[0];
    int hw = s.h * s.w;
    size_t total = (size_t)run->n * td_shape_size(s);
    if (total == 0) return;
    gap_backward_kernel<T><<<td_gpu_blocks(total, POOL_THREADS), POOL_THREADS, 0, run->stream>>>(
        (const T *)node->grad, (T *)node->in_grad[0], s.c, hw, 1.0f / (float)hw, total,
        node->in_grad_add[0]);
    TD_LAUNCHED(g);
}

TD_GPU_TYPED_ENTRY(gap_forward, gap_fwd)

TD_GPU_TYPED_ENTRY(gap_backward, gap_bwd)

// ---- the table entries ------------------------------------------------------------------------

const td_gpu_op td_gpu_op_maxpool2d = {&td_op_maxpool2d, maxpool_plan, maxpool_forward,
                                       maxpool_backward, NULL};
const td_gpu_op td_gpu_op_avgpool2d = {&td_op_avgpool2d, td_gpu_plain_plan, avgpool_forward,
                                       avgpool_backward, NULL};
const td_gpu_op td_gpu_op_global_avgpool = {&td_op_global_avgpool, td_gpu_plain_plan, gap_forward,
                                            gap_backward, NULL};
const td_gpu_op td_gpu_op_adaptive_avgpool2d = {&td_op_adaptive_avgpool2d, td_gpu_plain_plan,
                                                gap_forward, gap_backward, NULL};
