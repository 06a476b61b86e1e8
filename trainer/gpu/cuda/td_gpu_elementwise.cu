// Elementwise ops on the device: ReLU, GELU, Add, Dropout, Flatten and Identity, with the
// semantics of their CPU files (td_activation.c, td_add.c, td_dropout.c, td_flatten.c,
// td_identity.c). They are memory-bound and small models launch many of them, so each op call is
// one kernel (or one copy), and each thread moves eight elements with vector loads.
#include "gpu/cuda/td_gpu_internal.h"

#include <math.h>

#define EW_THREADS 256

// ---- eight elements at a time -----------------------------------------------------------------

static unsigned ew_blocks(size_t n) {
    return td_gpu_blocks((n + EW_VEC - 1) / EW_VEC, EW_THREADS);
}

static size_t ew_elems(const td_node *node, const td_gpu_run *run) {
    return (size_t)run->n * td_shape_size(node->out_shape);
}

static void ew_copy(td_gpu *g, void *dst, const void *src, size_t n, cudaStream_t stream) {
    TD_CUDA(g,
            cudaMemcpyAsync(dst, src, n * td_gpu_elem(g->prec), cudaMemcpyDeviceToDevice, stream));
}

// ---- gradient fan-out: dx_j = (add_j ? dx_j : 0) + dy -----------------------------------------

// The destinations may be one buffer twice (add(x, x)): no __restrict__, and each thread
// finishes destination j before it reads destination j+1, so the second adds to the first.
template <typename T> struct fanout_args {
    T *dx[TD_MAX_INPUTS];
    bool add[TD_MAX_INPUTS];
    int count;
    const T *relu_out; // a fused ReLU's output: dy counts only where it is positive; NULL: none
};

template <typename T>
static __global__ void __launch_bounds__(EW_THREADS)
    fanout_kernel(const T *dy, fanout_args<T> a, size_t n, bool vec) {
    EW_LOOP(i, n) {
        bool full = vec && i + EW_VEC <= n;
        float d[EW_VEC];
        ew_load(dy, i, n, full, d);
        if (a.relu_out) { // PyTorch's threshold_backward: the mask is output > 0
            float z[EW_VEC];
            ew_load(a.relu_out, i, n, full, z);
#pragma unroll
            for (int e = 0; e < EW_VEC; e++) d[e] = z[e] > 0.0f ? d[e] : 0.0f;
        }
        for (int j = 0; j < a.count; j++) {
            float v[EW_VEC];
            if (a.add[j]) {
                ew_load(a.dx[j], i, n, full, v);
#pragma unroll
                for (int e = 0; e < EW_VEC; e++) v[e] += d[e];
            } else {
#pragma unroll
                for (int e = 0; e < EW_VEC; e++) v[e] = d[e];
            }
            ew_store(a.dx[j], i, n, full, v);
        }
    }
}

// One overwritten destination is a copy; anything else is one kernel for all of them. relu_out:
// a fused ReLU's output, masking dy (then never a plain copy).
template <typename T>
static void fanout(td_gpu *g, const T *dy, T *const *dx, const bool *add, int count, size_t n,
                   cudaStream_t stream, const T *relu_out = NULL) {
    fanout_args<T> a = {};
    a.relu_out = relu_out;
    bool vec = ew_aligned<T>(dy, relu_out);
    for (int j = 0; j < count; j++) {
        if (!dx[j]) continue;
        a.dx[a.count] = dx[j];
        a.add[a.count] = add[j];
        vec = vec && ew_aligned<T>(dx[j], NULL);
        a.count++;
    }
    if (a.count == 0 || n == 0) return;
    if (a.count == 1 && !a.add[0] && !relu_out) {
        ew_copy(g, a.dx[0], dy, n, stream);
        return;
    }
    fanout_kernel<T><<<ew_blocks(n), EW_THREADS, 0, stream>>>(dy, a, n, vec);
    TD_LAUNCHED(g);
}

// The usual single input gradient of a node.
template <typename T>
static void fanout_one(td_gpu *g, td_node *node, const T *dy, size_t n, cudaStream_t stream) {
    T *dx = (T *)node->in_grad[0];
    bool add = node->in_grad_add[0];
    fanout(g, dy, &dx, &add, 1, n, stream);
}

// ---- plans ------------------------------------------------------------------------------------

// node->gpu: the ReLU fused into the Add (a node of the model: nothing to release), or NULL.
static int add_plan(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    (void)err;
    td_node *relu = td_gpu_fused_relu(g, m, node);
    node->gpu = relu;
    node->saved_bytes = 0;
    node->scratch_floats = 0;
    node->out_fused = relu != NULL;
    return 0;
}

int td_gpu_plain_plan(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    (void)g, (void)m, (void)err;
    node->gpu = NULL;
    node->saved_bytes = 0;
    node->scratch_floats = 0;
    return 0;
}

// ---- ReLU -------------------------------------------------------------------------------------

template <typename T>
static __global__ void __launch_bounds__(EW_THREADS)
    relu_forward_kernel(const T *__restrict__ x, T *__restrict__ y, size_t n, bool vec) {
    EW_LOOP(i, n) {
        bool full = vec && i + EW_VEC <= n;
        float v[EW_VEC];
        ew_load(x, i, n, full, v);
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) v[e] = td_relu(v[e]);
        ew_store(y, i, n, full, v);
    }
}

// The mask comes from the output, as PyTorch's threshold_backward (and the CPU) do.
template <typename T>
static __global__ void __launch_bounds__(EW_THREADS)
    relu_backward_kernel(const T *__restrict__ y, const T *__restrict__ dy, T *__restrict__ dx,
                         size_t n, bool add, bool vec) {
    EW_LOOP(i, n) {
        bool full = vec && i + EW_VEC <= n;
        float yv[EW_VEC], d[EW_VEC], v[EW_VEC];
        ew_load(y, i, n, full, yv);
        ew_load(dy, i, n, full, d);
        if (add) ew_load(dx, i, n, full, v);
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) {
            float gv = yv[e] > 0.0f ? d[e] : 0.0f;
            v[e] = add ? v[e] + gv : gv;
        }
        ew_store(dx, i, n, full, v);
    }
}

template <typename T> static void relu_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t n = ew_elems(node, run);
    const T *x = (const T *)node->in[0];
    T *y = (T *)node->out;
    if (n == 0) return;
    relu_forward_kernel<T>
        <<<ew_blocks(n), EW_THREADS, 0, run->stream>>>(x, y, n, ew_aligned<T>(x, y));
    TD_LAUNCHED(g);
}

template <typename T> static void relu_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t n = ew_elems(node, run);
    T *dx = (T *)node->in_grad[0];
    if (!dx || n == 0) return;
    const T *y = (const T *)node->out, *dy = (const T *)node->grad;
    relu_backward_kernel<T><<<ew_blocks(n), EW_THREADS, 0, run->stream>>>(
        y, dy, dx, n, node->in_grad_add[0], ew_aligned<T>(y, dy, dx));
    TD_LAUNCHED(g);
}

TD_GPU_TYPED_ENTRY(relu_forward, relu_fwd)

TD_GPU_TYPED_ENTRY(relu_backward, relu_bwd)

// ---- GELU -------------------------------------------------------------------------------------

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2     0.7071067811865476f
#define INV_SQRT_2PI   0.3989422804014327f
#define GELU_TANH_C    0.044715f

static __device__ __forceinline__ float gelu_value(float v, bool tanh_form) {
    if (tanh_form) return 0.5f * v * (1.0f + tanhf(SQRT_2_OVER_PI * (v + GELU_TANH_C * v * v * v)));
    return 0.5f * v * (1.0f + erff(v * INV_SQRT_2));
}

static __device__ __forceinline__ float gelu_slope(float v, bool tanh_form) {
    if (tanh_form) {
        float t = tanhf(SQRT_2_OVER_PI * (v + GELU_TANH_C * v * v * v));
        return 0.5f * (1.0f + t) +
               0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_TANH_C * v * v);
    }
    return 0.5f * (1.0f + erff(v * INV_SQRT_2)) + v * INV_SQRT_2PI * expf(-0.5f * v * v);
}

template <typename T>
static __global__ void __launch_bounds__(EW_THREADS)
    gelu_forward_kernel(const T *__restrict__ x, T *__restrict__ y, size_t n, bool tanh_form,
                        bool vec) {
    EW_LOOP(i, n) {
        bool full = vec && i + EW_VEC <= n;
        float v[EW_VEC];
        ew_load(x, i, n, full, v);
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) v[e] = gelu_value(v[e], tanh_form);
        ew_store(y, i, n, full, v);
    }
}

template <typename T>
static __global__ void __launch_bounds__(EW_THREADS)
    gelu_backward_kernel(const T *__restrict__ x, const T *__restrict__ dy, T *__restrict__ dx,
                         size_t n, bool add, bool tanh_form, bool vec) {
    EW_LOOP(i, n) {
        bool full = vec && i + EW_VEC <= n;
        float xv[EW_VEC], d[EW_VEC], v[EW_VEC];
        ew_load(x, i, n, full, xv);
        ew_load(dy, i, n, full, d);
        if (add) ew_load(dx, i, n, full, v);
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) {
            float gv = d[e] * gelu_slope(xv[e], tanh_form);
            v[e] = add ? v[e] + gv : gv;
        }
        ew_store(dx, i, n, full, v);
    }
}

static bool gelu_tanh(const td_node *node) {
    return td_node_arg(node, "approximate") == 1;
}

template <typename T> static void gelu_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t n = ew_elems(node, run);
    const T *x = (const T *)node->in[0];
    T *y = (T *)node->out;
    if (n == 0) return;
    gelu_forward_kernel<T><<<ew_blocks(n), EW_THREADS, 0, run->stream>>>(x, y, n, gelu_tanh(node),
                                                                         ew_aligned<T>(x, y));
    TD_LAUNCHED(g);
}

template <typename T> static void gelu_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t n = ew_elems(node, run);
    T *dx = (T *)node->in_grad[0];
    if (!dx || n == 0) return;
    const T *x = (const T *)node->in[0], *dy = (const T *)node->grad;
    gelu_backward_kernel<T><<<ew_blocks(n), EW_THREADS, 0, run->stream>>>(
        x, dy, dx, n, node->in_grad_add[0], gelu_tanh(node), ew_aligned<T>(x, dy, dx));
    TD_LAUNCHED(g);
}

TD_GPU_TYPED_ENTRY(gelu_forward, gelu_fwd)

TD_GPU_TYPED_ENTRY(gelu_backward, gelu_bwd)

// ---- Add --------------------------------------------------------------------------------------

template <typename T> struct add_inputs {
    const T *x[TD_MAX_INPUTS];
    int count;
};

// Summed in fp32 in input order and rounded once; in fp32 the same order and roundings as the
// CPU's copy-then-add loops. relu: a fused ReLU (td_gpu_fused_relu), y = max(sum, 0) written
// into the ReLU's output, as a ResNet block ends; backward masks by that output.
template <typename T>
static __global__ void __launch_bounds__(EW_THREADS)
    add_forward_kernel(add_inputs<T> a, T *__restrict__ y, size_t n, bool relu, bool vec) {
    EW_LOOP(i, n) {
        bool full = vec && i + EW_VEC <= n;
        float s[EW_VEC];
        ew_load(a.x[0], i, n, full, s);
        for (int j = 1; j < a.count; j++) {
            float v[EW_VEC];
            ew_load(a.x[j], i, n, full, v);
#pragma unroll
            for (int e = 0; e < EW_VEC; e++) s[e] += v[e];
        }
        if (relu)
#pragma unroll
            for (int e = 0; e < EW_VEC; e++) s[e] = td_relu(s[e]);
        ew_store(y, i, n, full, s);
    }
}

template <typename T> static void add_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t n = ew_elems(node, run);
    if (n == 0) return;
    add_inputs<T> a = {};
    a.count = node->n_inputs;
    const td_node *relu = (const td_node *)node->gpu;
    T *y = (T *)(relu ? relu->out : node->out);
    bool vec = ew_aligned<T>(y, NULL);
    for (int j = 0; j < a.count; j++) {
        a.x[j] = (const T *)node->in[j];
        vec = vec && ew_aligned<T>(a.x[j], NULL);
    }
    add_forward_kernel<T><<<ew_blocks(n), EW_THREADS, 0, run->stream>>>(a, y, n, relu != NULL, vec);
    TD_LAUNCHED(g);
}

template <typename T> static void add_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    T *dx[TD_MAX_INPUTS];
    for (int j = 0; j < node->n_inputs; j++) dx[j] = (T *)node->in_grad[j];
    const td_node *relu = (const td_node *)node->gpu;
    const T *dy = (const T *)(relu ? relu->grad : node->grad);
    fanout(g, dy, dx, node->in_grad_add, node->n_inputs, ew_elems(node, run), run->stream,
           relu ? (const T *)relu->out : (const T *)NULL);
}

TD_GPU_TYPED_ENTRY(add_forward, add_fwd)

TD_GPU_TYPED_ENTRY(add_backward, add_bwd)

// ---- Dropout ----------------------------------------------------------------------------------

// The draw's offset is read on the device, so a replayed graph sees the value the previous
// replay advanced it to. Element i keeps its value when u(seed, offset, i) >= p (the CPU's rule
// with a different generator); the mask goes to saved as one byte per element.
template <typename T>
static __global__ void __launch_bounds__(EW_THREADS)
    dropout_forward_kernel(const T *__restrict__ x, T *__restrict__ y, uint8_t *__restrict__ mask,
                           size_t n, float p, float scale, uint64_t seed,
                           const unsigned long long *offset_ptr, bool vec) {
    unsigned long long offset = *offset_ptr;
    EW_LOOP(i, n) {
        bool full = vec && i + EW_VEC <= n;
        float v[EW_VEC];
        ew_load(x, i, n, full, v);
        uint64_t bits = 0;
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) {
            bool keep = td_gpu_uniform(seed, offset, i + e) >= p;
            v[e] = keep ? v[e] * scale : 0.0f;
            bits |= (uint64_t)keep << (8 * e);
        }
        ew_store(y, i, n, full, v);
        if (full) {
            *reinterpret_cast<uint64_t *>(mask + i) = bits;
        } else {
#pragma unroll
            for (int e = 0; e < EW_VEC; e++)
                if (i + e < n) mask[i + e] = (uint8_t)(bits >> (8 * e));
        }
    }
}

// Runs after the draw, in-stream: the next dropout (of this pass or the next replay) draws anew.
static __global__ void dropout_advance_kernel(unsigned long long *offset) {
    *offset += 1;
}

template <typename T>
static __global__ void __launch_bounds__(EW_THREADS)
    dropout_backward_kernel(const uint8_t *__restrict__ mask, const T *__restrict__ dy,
                            T *__restrict__ dx, size_t n, float scale, bool add, bool vec) {
    EW_LOOP(i, n) {
        bool full = vec && i + EW_VEC <= n;
        float d[EW_VEC], v[EW_VEC];
        ew_load(dy, i, n, full, d);
        if (add) ew_load(dx, i, n, full, v);
        uint64_t bits = 0;
        if (full) {
            bits = *reinterpret_cast<const uint64_t *>(mask + i);
        } else {
#pragma unroll
            for (int e = 0; e < EW_VEC; e++)
                if (i + e < n) bits |= (uint64_t)mask[i + e] << (8 * e);
        }
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) {
            float gv = (bits >> (8 * e)) & 0xff ? d[e] * scale : 0.0f;
            v[e] = add ? v[e] + gv : gv;
        }
        ew_store(dx, i, n, full, v);
    }
}

static int dropout_plan(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    (void)g, (void)err;
    node->gpu = NULL;
    node->saved_bytes = (size_t)m->max_n * td_shape_size(node->out_shape);
    node->scratch_floats = 0;
    return 0;
}

static float dropout_p(const td_node *node) {
    return (float)td_node_arg(node, "p");
}

// 1/(1-p) in float, as the CPU computes it; p == 1 drops everything.
static float dropout_scale(float p) {
    return p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
}

template <typename T> static void dropout_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t n = ew_elems(node, run);
    float p = dropout_p(node);
    if (n == 0) return;
    if (!run->training || p == 0.0f) {
        ew_copy(g, node->out, node->in[0], n, run->stream);
        return;
    }
    const T *x = (const T *)node->in[0];
    T *y = (T *)node->out;
    uint8_t *mask = (uint8_t *)node->saved;
    bool vec = ew_aligned<T>(x, y) && (uintptr_t)mask % 8 == 0;
    dropout_forward_kernel<T><<<ew_blocks(n), EW_THREADS, 0, run->stream>>>(
        x, y, mask, n, p, dropout_scale(p), g->seed, run->rng_offset, vec);
    TD_LAUNCHED(g);
    dropout_advance_kernel<<<1, 1, 0, run->stream>>>(run->rng_offset);
    TD_LAUNCHED(g);
}

template <typename T> static void dropout_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t n = ew_elems(node, run);
    T *dx = (T *)node->in_grad[0];
    if (!dx || n == 0) return;
    const T *dy = (const T *)node->grad;
    float p = dropout_p(node);
    if (!run->training || p == 0.0f) {
        fanout_one(g, node, dy, n, run->stream);
        return;
    }
    const uint8_t *mask = (const uint8_t *)node->saved;
    bool vec = ew_aligned<T>(dy, dx) && (uintptr_t)mask % 8 == 0;
    dropout_backward_kernel<T><<<ew_blocks(n), EW_THREADS, 0, run->stream>>>(
        mask, dy, dx, n, dropout_scale(p), node->in_grad_add[0], vec);
    TD_LAUNCHED(g);
}

TD_GPU_TYPED_ENTRY(dropout_forward, dropout_fwd)

TD_GPU_TYPED_ENTRY(dropout_backward, dropout_bwd)

// ---- Flatten ----------------------------------------------------------------------------------

#define TILE      32
#define TILE_ROWS 8

// Per sample, src [rows, cols] -> dst [cols, rows] through a shared tile, so both the reads and
// the writes are coalesced. Forward: [HW, C] -> [C, HW] (PyTorch's order); backward the reverse.
template <typename T>
static __global__ void __launch_bounds__(TILE *TILE_ROWS)
    transpose_kernel(const T *__restrict__ src, T *__restrict__ dst, int rows, int cols, int n,
                     bool add) {
    __shared__ float tile[TILE][TILE + 1]; // +1: the column reads hit distinct banks
    size_t size = (size_t)rows * cols;
    int r0 = blockIdx.y * TILE, c0 = blockIdx.x * TILE;
    for (int b = blockIdx.z; b < n; b += gridDim.z) {
        const T *s = src + (size_t)b * size;
        T *d = dst + (size_t)b * size;
        for (int j = threadIdx.y; j < TILE; j += TILE_ROWS) {
            int r = r0 + j, c = c0 + threadIdx.x;
            if (r < rows && c < cols) tile[j][threadIdx.x] = td_to_float(s[(size_t)r * cols + c]);
        }
        __syncthreads();
        for (int j = threadIdx.y; j < TILE; j += TILE_ROWS) {
            int c = c0 + j, r = r0 + threadIdx.x;
            if (r < rows && c < cols) {
                size_t o = (size_t)c * rows + r;
                float v = tile[threadIdx.x][j];
                d[o] = td_from_float<T>(add ? td_to_float(d[o]) + v : v);
            }
        }
        __syncthreads(); // the tile is refilled for the next sample
    }
}

template <typename T>
static void transpose(td_gpu *g, const T *src, T *dst, int rows, int cols, int n, bool add,
                      cudaStream_t stream) {
    dim3 grid((unsigned)((cols + TILE - 1) / TILE), (unsigned)((rows + TILE - 1) / TILE),
              (unsigned)(n < 65535 ? n : 65535));
    transpose_kernel<T><<<grid, dim3(TILE, TILE_ROWS), 0, stream>>>(src, dst, rows, cols, n, add);
    TD_LAUNCHED(g);
}

// Channels last and PyTorch's order agree when there is one channel or one pixel.
static bool flatten_same_order(td_shape s) {
    return !s.spatial || s.c == 1 || s.h * s.w == 1;
}

template <typename T> static void flatten_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    td_shape s = node->in_shape[0];
    size_t n = ew_elems(node, run);
    if (n == 0) return;
    if (flatten_same_order(s)) {
        ew_copy(g, node->out, node->in[0], n, run->stream);
        return;
    }
    transpose(g, (const T *)node->in[0], (T *)node->out, s.h * s.w, s.c, run->n, false,
              run->stream);
}

template <typename T> static void flatten_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    td_shape s = node->in_shape[0];
    size_t n = ew_elems(node, run);
    T *dx = (T *)node->in_grad[0];
    if (!dx || n == 0) return;
    const T *dy = (const T *)node->grad;
    if (flatten_same_order(s)) {
        fanout_one(g, node, dy, n, run->stream);
        return;
    }
    transpose(g, dy, dx, s.c, s.h * s.w, run->n, node->in_grad_add[0], run->stream);
}

TD_GPU_TYPED_ENTRY(flatten_forward, flatten_fwd)

TD_GPU_TYPED_ENTRY(flatten_backward, flatten_bwd)

// ---- Identity ---------------------------------------------------------------------------------

static void identity_forward(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t n = ew_elems(node, run);
    if (n) ew_copy(g, node->out, node->in[0], n, run->stream);
}

template <typename T> static void identity_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    if (node->in_grad[0])
        fanout_one(g, node, (const T *)node->grad, ew_elems(node, run), run->stream);
}

TD_GPU_TYPED_ENTRY(identity_backward, identity_bwd)

// ---- a node fused into another ----------------------------------------------------------------

static void fused_pass(td_gpu *g, td_node *node, const td_gpu_run *run) {
    (void)g, (void)node, (void)run;
}

// ---- the table entries ------------------------------------------------------------------------

const td_gpu_op td_gpu_op_fused = {&td_op_relu, td_gpu_plain_plan, fused_pass, fused_pass, NULL};

const td_gpu_op td_gpu_op_relu = {&td_op_relu, td_gpu_plain_plan, relu_forward, relu_backward,
                                  NULL};
const td_gpu_op td_gpu_op_gelu = {&td_op_gelu, td_gpu_plain_plan, gelu_forward, gelu_backward,
                                  NULL};
const td_gpu_op td_gpu_op_add = {&td_op_add, add_plan, add_forward, add_backward, NULL};
const td_gpu_op td_gpu_op_dropout = {&td_op_dropout, dropout_plan, dropout_forward,
                                     dropout_backward, NULL};
const td_gpu_op td_gpu_op_flatten = {&td_op_flatten, td_gpu_plain_plan, flatten_forward,
                                     flatten_backward, NULL};
const td_gpu_op td_gpu_op_identity = {&td_op_identity, td_gpu_plain_plan, identity_forward,
                                      identity_backward, NULL};
