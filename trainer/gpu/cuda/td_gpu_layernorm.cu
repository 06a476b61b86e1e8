// LayerNorm on the GPU, as the CPU's ops/td_layernorm.c: every row of C features (a flat [C]
// sample, or each position of a sequence [T, C]) normalised with its biased variance, then
// scaled and shifted by fp32 parameters. Activations are the precision's type, statistics and
// arithmetic fp32.
//
// Forward: one warp a row; the mean first, then the squares about it (two passes over registers'
// worth of the row, no cancellation), as the CPU's two passes. It keeps each row's mean and
// 1/std (two floats) for backward. Backward: a warp a row for dx, and the parameters' gradients
// as column sums over rows in two deterministic stages (row groups into the workspace, then the
// groups in order), so a rerun gives the same bits (no atomics).
#include "gpu/cuda/td_gpu_internal.h"

enum { LN_WARPS = 8, LN_THREADS = 32 * LN_WARPS, LN_GROUPS = 32, LN_COLS = 32 };

static size_t ln_rows(const td_node *node, int n) {
    return (size_t)n * node->in_shape[0].h;
}

static int layernorm_plan(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    (void)g, (void)err;
    node->gpu = NULL;
    node->saved_bytes = 2 * ln_rows(node, m->max_n) * sizeof(float);
    node->scratch_floats = 2 * (size_t)LN_GROUPS * node->out_shape.c; // the row groups' sums
    return 0;
}

template <typename T>
static __global__ void __launch_bounds__(LN_THREADS)
    layernorm_forward_kernel(const T *__restrict__ x, T *__restrict__ y, float *__restrict__ stats,
                             const float *__restrict__ w, const float *__restrict__ b, size_t rows,
                             int c, float eps) {
    size_t r = (size_t)blockIdx.x * LN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const T *xr = x + r * c;
    T *yr = y + r * c;
    float sum = 0;
    for (int k = lane; k < c; k += 32) sum += td_to_float(xr[k]);
    float mean = td_warp_sum(sum) / (float)c, sq = 0;
    for (int k = lane; k < c; k += 32) {
        float d = td_to_float(xr[k]) - mean;
        sq += d * d;
    }
    float rstd = rsqrtf(td_warp_sum(sq) / (float)c + eps);
    for (int k = lane; k < c; k += 32)
        yr[k] = td_from_float<T>((td_to_float(xr[k]) - mean) * rstd * w[k] + (b ? b[k] : 0.0f));
    if (lane == 0) {
        stats[2 * r] = mean;
        stats[2 * r + 1] = rstd;
    }
}

// dx = rstd · (g - mean(g) - xhat · mean(g · xhat)), g = dy · weight (added to dx when `add`).
template <typename T>
static __global__ void __launch_bounds__(LN_THREADS)
    layernorm_input_grad_kernel(const T *__restrict__ x, const T *__restrict__ dy,
                                T *__restrict__ dx, const float *__restrict__ stats,
                                const float *__restrict__ w, size_t rows, int c, bool add) {
    size_t r = (size_t)blockIdx.x * LN_WARPS + threadIdx.x / 32;
    int lane = threadIdx.x % 32;
    if (r >= rows) return;
    const T *xr = x + r * c, *dyr = dy + r * c;
    T *dxr = dx + r * c;
    float mean = stats[2 * r], rstd = stats[2 * r + 1], sg = 0, sgx = 0;
    for (int k = lane; k < c; k += 32) {
        float gk = td_to_float(dyr[k]) * w[k];
        sg += gk;
        sgx += gk * (td_to_float(xr[k]) - mean) * rstd;
    }
    float mg = td_warp_sum(sg) / (float)c, mgx = td_warp_sum(sgx) / (float)c;
    for (int k = lane; k < c; k += 32) {
        float xhat = (td_to_float(xr[k]) - mean) * rstd;
        float v = rstd * (td_to_float(dyr[k]) * w[k] - mg - xhat * mgx);
        dxr[k] = td_from_float<T>(add ? td_to_float(dxr[k]) + v : v);
    }
}

// Stage 1: block (column tile, row group) sums dy · xhat and dy over its rows for LN_COLS
// columns; the LN_WARPS rows a step are folded in shared memory in a fixed order.
template <typename T>
static __global__ void __launch_bounds__(LN_THREADS)
    layernorm_param_partials_kernel(const T *__restrict__ x, const T *__restrict__ dy,
                                    const float *__restrict__ stats, float *__restrict__ part,
                                    size_t rows, int c) {
    __shared__ float sw[LN_WARPS][LN_COLS], sb[LN_WARPS][LN_COLS];
    int col = blockIdx.x * LN_COLS + threadIdx.x % LN_COLS, lane_row = threadIdx.x / LN_COLS;
    float gw = 0, gb = 0;
    if (col < c)
        for (size_t r = (size_t)blockIdx.y * LN_WARPS + lane_row; r < rows;
             r += (size_t)gridDim.y * LN_WARPS) {
            float d = td_to_float(dy[r * c + col]);
            gw += d * (td_to_float(x[r * c + col]) - stats[2 * r]) * stats[2 * r + 1];
            gb += d;
        }
    sw[lane_row][threadIdx.x % LN_COLS] = gw;
    sb[lane_row][threadIdx.x % LN_COLS] = gb;
    __syncthreads();
    if (lane_row != 0 || col >= c) return;
    for (int i = 1; i < LN_WARPS; i++) {
        gw += sw[i][threadIdx.x];
        gb += sb[i][threadIdx.x];
    }
    part[(size_t)blockIdx.y * c + col] = gw;
    part[(size_t)(LN_GROUPS + blockIdx.y) * c + col] = gb;
}

// Stage 2: the row groups' sums in group order, into (or onto) the gradients.
static __global__ void layernorm_param_grads_kernel(const float *__restrict__ part,
                                                    float *__restrict__ dw, float *__restrict__ db,
                                                    int c, bool accumulate) {
    int k = blockIdx.x * blockDim.x + threadIdx.x;
    if (k >= c) return;
    float gw = 0, gb = 0;
    for (int i = 0; i < LN_GROUPS; i++) {
        gw += part[(size_t)i * c + k];
        gb += part[(size_t)(LN_GROUPS + i) * c + k];
    }
    dw[k] = accumulate ? dw[k] + gw : gw;
    if (db) db[k] = accumulate ? db[k] + gb : gb;
}

static unsigned row_blocks(size_t rows) {
    return (unsigned)((rows + LN_WARPS - 1) / LN_WARPS);
}

template <typename T> static void ln_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t rows = ln_rows(node, run->n);
    if (rows == 0) return;
    const float *b = node->n_params > 1 ? node->params[1]->dev_data : NULL;
    layernorm_forward_kernel<T><<<row_blocks(rows), LN_THREADS, 0, run->stream>>>(
        (const T *)node->in[0], (T *)node->out, (float *)node->saved, node->params[0]->dev_data, b,
        rows, node->out_shape.c, (float)td_node_arg(node, "eps"));
    TD_LAUNCHED(g);
}

template <typename T> static void ln_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t rows = ln_rows(node, run->n);
    int c = node->out_shape.c;
    const T *x = (const T *)node->in[0], *dy = (const T *)node->grad;
    const float *stats = (const float *)node->saved;
    if (rows == 0) return;
    if (node->in_grad[0]) {
        layernorm_input_grad_kernel<T><<<row_blocks(rows), LN_THREADS, 0, run->stream>>>(
            x, dy, (T *)node->in_grad[0], stats, node->params[0]->dev_data, rows, c,
            node->in_grad_add[0]);
        TD_LAUNCHED(g);
    }
    dim3 grid((unsigned)((c + LN_COLS - 1) / LN_COLS), LN_GROUPS);
    float *part = (float *)g->workspace;
    layernorm_param_partials_kernel<T>
        <<<grid, LN_THREADS, 0, run->stream>>>(x, dy, stats, part, rows, c);
    TD_LAUNCHED(g);
    float *db = node->n_params > 1 ? node->params[1]->dev_grad : NULL;
    layernorm_param_grads_kernel<<<(unsigned)((c + 255) / 256), 256, 0, run->stream>>>(
        part, node->params[0]->dev_grad, db, c, run->accumulate_grads);
    TD_LAUNCHED(g);
}

TD_GPU_TYPED_ENTRY(layernorm_forward, ln_fwd)

TD_GPU_TYPED_ENTRY(layernorm_backward, ln_bwd)

const td_gpu_op td_gpu_op_layernorm = {&td_op_layernorm, layernorm_plan, layernorm_forward,
                                       layernorm_backward, NULL};
