// BatchNorm1d / BatchNorm2d on the GPU, with torch.nn semantics as td_batchnorm.c has them:
// training normalises with the batch's mean and biased variance and moves running_mean /
// running_var (the latter by the unbiased variance) by `momentum`, counting
// num_batches_tracked; evaluation uses the running statistics; without track_running_stats
// there are no buffers and batch statistics serve both modes.
//
// Channels are the innermost dimension of both layouts ([rows, C], rows = N·H·W), so plain
// kernels do it: threads of a warp take consecutive channels (coalesced rows) and loop over
// rows; when C is a multiple of 8, every pass (sums, normalisation, input gradient) has a
// variant whose threads move 8 channels at a time instead. Statistics, parameters and gradients of
// the parameters are fp32 whatever the activations' precision; per-channel sums are accumulated in
// double, as the CPU does (a ResNet batch is millions of rows, and E[x²] - E[x]² needs the
// headroom).
//
// A ReLU that alone reads the output (td_gpu_fused_relu) runs inside these kernels: forward
// writes max(y, 0) straight into the ReLU's output, backward reads the ReLU's output gradient
// and masks it where the stored output is 0: y is recomputed from x exactly as forward computed
// it (the same fused multiply-add of the same per-channel scale and shift, rounded to the
// element type), so PyTorch's threshold_backward mask (output > 0) is reproduced without
// reading the output. BatchNorm's own output and its gradient
// then never exist: two of the five passes over the activation in forward and three of eight in
// backward are saved, and the memory of one activation.
//
// SyncBatchNorm (td_gpu_ddp_start's sync_bn, in training): the tiles' sums of this rank, with its
// row count, are all-reduced in double over the ranks before the statistics (forward) and the
// coefficients of dx (backward) are taken from them; the weight and bias gradients stay this
// rank's own, for DDP to average like any other. A world of one gives bit-identical results to
// plain BatchNorm.
//
// Reductions are deterministic: every channel's rows are cut into a fixed number of tiles (a
// function of rows and C only), each tile is summed by its own threads in a fixed order, and a
// second kernel adds the tiles' partial sums in tile order. No atomics, so the same batch gives
// bit-identical statistics and gradients at every run.
//
// This file holds the plan, the statistics and forward; td_gpu_batchnorm_backward.cu holds
// backward, and td_gpu_batchnorm.h what the two share.
#include "gpu/cuda/td_gpu_batchnorm.h"

#include <stdlib.h>

int td_gpu_bn_tiles(size_t rows, int c) {
    size_t cblocks = ((size_t)c + BN_TX - 1) / BN_TX;
    size_t want = (BN_TARGET + cblocks - 1) / cblocks;
    size_t most = (rows + BN_MIN_ROWS - 1) / BN_MIN_ROWS;
    size_t t = want < most ? want : most;
    return t < 1 ? 1 : (int)t;
}

// Scratch: two double partial sums per (tile, channel), SyncBatchNorm's 2c + 1 double totals, then
// k1, k2, k3 of backward.
static size_t bn_scratch_floats(size_t rows, int c) {
    return 4 * (size_t)td_gpu_bn_tiles(rows, c) * c + 2 * (2 * (size_t)c + 1) + 3 * (size_t)c;
}

// ---- kernels ----------------------------------------------------------------------------------

// Per (tile, channel): the sums of x and x² over the tile's rows.
template <typename T>
__global__ void bn_partial_stats(const T *__restrict__ x, size_t rows, int C, size_t per_tile,
                                 double *__restrict__ part_s, double *__restrict__ part_q) {
    __shared__ double ss[BN_TY][BN_TX], sq[BN_TY][BN_TX];
    int c = blockIdx.x * BN_TX + threadIdx.x;
    size_t r0 = (size_t)blockIdx.y * per_tile;
    size_t r1 = r0 + per_tile < rows ? r0 + per_tile : rows;
    double s = 0.0, q = 0.0;
    if (c < C)
        for (size_t r = r0 + threadIdx.y; r < r1; r += BN_TY) {
            double v = (double)td_to_float(x[r * C + c]);
            s += v;
            q += v * v;
        }
    ss[threadIdx.y][threadIdx.x] = s;
    sq[threadIdx.y][threadIdx.x] = q;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int k = 1; k < BN_TY; k++) {
            s += ss[k][threadIdx.x];
            q += sq[k][threadIdx.x];
        }
        part_s[(size_t)blockIdx.y * C + c] = s;
        part_q[(size_t)blockIdx.y * C + c] = q;
    }
}

// SyncBatchNorm's wire: per channel the two sums over this rank's tiles ([0, C) and [C, 2C)),
// then the rows they cover (at 2C), for the all-reduce across ranks.
__global__ void bn_total_tiles(const double *__restrict__ pa, const double *__restrict__ pb,
                               int tiles, int C, double rows, double *__restrict__ totals) {
    int c = blockIdx.x * BN_TX + threadIdx.x;
    double a, b;
    bn_sum_tiles(pa, pb, tiles, C, c, &a, &b);
    if (threadIdx.y != 0 || c >= C) return;
    totals[c] = a;
    totals[C + c] = b;
    if (c == 0) totals[2 * C] = rows;
}

// Batch statistics from the partial sums (or, with SyncBatchNorm, from the totals over every
// rank, whose count is then theirs): mean and invstd for normalisation (saved for backward), and
// in training with tracking the running statistics and the batch counter.
__global__ void bn_finalize_stats(const double *__restrict__ part_s,
                                  const double *__restrict__ part_q, int tiles, int C, double count,
                                  const double *__restrict__ totals, float eps, float momentum,
                                  float *__restrict__ mean, float *__restrict__ invstd,
                                  float *__restrict__ run_mean, float *__restrict__ run_var,
                                  float *__restrict__ batches) {
    int c = blockIdx.x * BN_TX + threadIdx.x;
    double s, q;
    bn_sum_tiles(part_s, part_q, tiles, C, c, &s, &q);
    if (threadIdx.y != 0 || c >= C) return;
    if (totals) {
        s = totals[c];
        q = totals[C + c];
        count = totals[2 * C];
    }
    double mu = s / count;
    double m2 = q - s * mu; // the sum of squared deviations
    if (m2 < 0.0) m2 = 0.0;
    double var = m2 / count;
    float mean_f = (float)mu;
    mean[c] = mean_f;
    invstd[c] = (float)(1.0 / sqrt(var + (double)eps)); // PyTorch: 1/sqrt(var + eps)
    if (run_mean) {
        double unbiased = count > 1.0 ? m2 / (count - 1.0) : var;
        run_mean[c] = (1.0f - momentum) * run_mean[c] + momentum * mean_f;
        run_var[c] = (1.0f - momentum) * run_var[c] + momentum * (float)unbiased;
        if (c == 0) batches[0] += 1.0f;
    }
}

// Evaluation with tracked statistics: normalise by the running ones.
__global__ void bn_running_stats(const float *__restrict__ run_mean,
                                 const float *__restrict__ run_var, int C, float eps,
                                 float *__restrict__ mean, float *__restrict__ invstd) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    mean[c] = run_mean[c];
    invstd[c] = 1.0f / sqrtf(run_var[c] + eps);
}

// y = x·scale + shift (then max(y, 0) with a fused ReLU).
template <typename T>
__global__ void bn_apply(const T *__restrict__ x, T *__restrict__ y, size_t rows, int C,
                         const float *__restrict__ mean, const float *__restrict__ invstd,
                         const float *__restrict__ w, const float *__restrict__ b, bool relu) {
    int c = blockIdx.x * BN_TX + threadIdx.x;
    if (c >= C) return;
    bn_affine af = bn_affine_of(c, w, b, mean, invstd);
    for (size_t r = (size_t)blockIdx.y * BN_TY + threadIdx.y; r < rows;
         r += (size_t)gridDim.y * BN_TY) {
        size_t i = r * C + c;
        float v = bn_y(td_to_float(x[i]), af);
        if (relu) v = td_relu(v);
        y[i] = td_from_float<T>(v);
    }
}

// The vectorised kernels of forward (td_gpu_batchnorm.h says how they go).
template <typename T>
__global__ void __launch_bounds__(BN_VEC_THREADS)
    bn_apply_vec(const T *__restrict__ x, T *__restrict__ y, size_t n, int C,
                 const float *__restrict__ mean, const float *__restrict__ invstd,
                 const float *__restrict__ w, const float *__restrict__ b, bool relu) {
    extern __shared__ float coef[]; // scale [C], shift [C]
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        bn_affine a = bn_affine_of(c, w, b, mean, invstd);
        coef[c] = a.scale;
        coef[C + c] = a.shift;
    }
    __syncthreads();
    EW_LOOP(i, n) {
        int c0 = (int)(i % (size_t)C);
        float v[EW_VEC];
        ew_load(x, i, n, true, v);
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) {
            bn_affine a = {coef[c0 + e], coef[C + c0 + e]};
            v[e] = bn_y(v[e], a);
            if (relu) v[e] = td_relu(v[e]);
        }
        ew_store(y, i, n, true, v);
    }
}

template <typename T>
__global__ void __launch_bounds__(BN_VEC_THREADS)
    bn_partial_stats_vec(const T *__restrict__ x, size_t rows, int C, size_t per_tile,
                         double *__restrict__ part_s, double *__restrict__ part_q) {
    bn_red_at at = bn_red_here(C, rows, per_tile);
    double s[EW_VEC] = {}, q[EW_VEC] = {};
    if (at.active)
        for (size_t r = at.r0 + at.lane; r < at.r1; r += at.lanes) {
            float v[EW_VEC];
            ew_load(x, r * C + at.c0, 0, true, v);
#pragma unroll
            for (int e = 0; e < EW_VEC; e++) {
                double d = (double)v[e];
                s[e] += d;
                q[e] += d * d;
            }
        }
    bn_reduce_lanes(s, q, at.packs, at.lanes, C, part_s, part_q);
}

// ---- launchers (TD_GPU_DISPATCH's body must not carry bare commas) ----------------------------

unsigned td_gpu_bn_vec_blocks(const td_gpu *g, size_t n) {
    size_t packs = n / EW_VEC, want = (size_t)g->prop.multiProcessorCount * 8;
    size_t b = (packs + BN_VEC_THREADS - 1) / BN_VEC_THREADS;
    return (unsigned)(b < want ? (b ? b : 1) : want);
}

dim3 td_gpu_bn_grid_rows(size_t rows, int C) {
    size_t y = (rows + BN_APPLY_ROWS - 1) / BN_APPLY_ROWS;
    if (y > 65535) y = 65535;
    return dim3((unsigned)((C + BN_TX - 1) / BN_TX), (unsigned)(y ? y : 1));
}

template <typename T>
static void launch_partial_stats(const void *x, size_t rows, int C, int tiles, double *ps,
                                 double *pq, cudaStream_t st) {
    size_t per_tile = (rows + tiles - 1) / tiles;
    if (C % EW_VEC == 0 && ew_aligned<T>(x, NULL)) {
        int packs = bn_red_packs(C), blocks = (C / EW_VEC + packs - 1) / packs;
        bn_partial_stats_vec<T><<<dim3((unsigned)blocks, (unsigned)tiles), BN_VEC_THREADS, 0, st>>>(
            (const T *)x, rows, C, per_tile, ps, pq);
        return;
    }
    dim3 grid((unsigned)((C + BN_TX - 1) / BN_TX), (unsigned)tiles), block(BN_TX, BN_TY);
    bn_partial_stats<T><<<grid, block, 0, st>>>((const T *)x, rows, C, per_tile, ps, pq);
}

template <typename T>
static void launch_apply(const td_gpu *g, const void *x, void *y, size_t rows, int C,
                         const float *mean, const float *invstd, const float *w, const float *b,
                         bool relu, cudaStream_t st) {
    if (bn_vec_ok<T>(C, 2, x, y, NULL)) {
        size_t n = rows * C;
        bn_apply_vec<T><<<td_gpu_bn_vec_blocks(g, n), BN_VEC_THREADS, 2 * C * sizeof(float), st>>>(
            (const T *)x, (T *)y, n, C, mean, invstd, w, b, relu);
        return;
    }
    bn_apply<T><<<td_gpu_bn_grid_rows(rows, C), dim3(BN_TX, BN_TY), 0, st>>>(
        (const T *)x, (T *)y, rows, C, mean, invstd, w, b, relu);
}

// ---- the op -----------------------------------------------------------------------------------

size_t td_gpu_bn_rows(const td_node *node, int n) {
    return (size_t)n * node->out_shape.h * node->out_shape.w;
}

static int bn_plan_node(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    bn_plan *p = (bn_plan *)td_calloc(1, sizeof *p);
    node->gpu = p;
    p->g = g;
    p->c = node->out_shape.c;
    p->eps = (float)td_node_arg(node, "eps");
    p->momentum = (float)td_node_arg(node, "momentum");
    p->affine = td_node_arg(node, "affine") != 0;
    p->track = td_node_arg(node, "track_running_stats") != 0;
    if ((p->affine && node->n_params < 2) || (p->track && node->n_buffers < 3))
        return td_fail(err, "batchnorm: parameters or buffers missing for its arguments");
    p->relu = td_gpu_fused_relu(g, m, node);
    node->out_fused = p->relu != NULL;
    node->saved_bytes = 2 * (size_t)p->c * sizeof(float); // mean and invstd used by forward
    node->scratch_floats = bn_scratch_floats(td_gpu_bn_rows(node, node->max_n), p->c);
    return 0;
}

static void bn_forward(td_gpu *g, td_node *node, const td_gpu_run *run) {
    bn_plan *p = (bn_plan *)node->gpu;
    int C = p->c;
    size_t rows = td_gpu_bn_rows(node, run->n);
    float *mean = (float *)node->saved, *invstd = mean + C;
    unsigned cblocks = (unsigned)((C + BN_TX - 1) / BN_TX);
    // Recomputing for activation checkpointing, the statistics this batch's forward saved still
    // hold (the node keeps its saved state out of the shared region) and running ones moved
    // once: only the normalisation runs again.
    bool batch = run->training || !p->track;
    if (batch && !run->recompute) {
        int tiles = td_gpu_bn_tiles(rows, C);
        double *ps = (double *)g->workspace, *pq = ps + (size_t)tiles * C;
        TD_GPU_DISPATCH(g->prec, T,
                        launch_partial_stats<T>(node->in[0], rows, C, tiles, ps, pq, run->stream));
        TD_LAUNCHED(g);
        double *totals = NULL; // SyncBatchNorm: sums and count over every rank
        if (run->training && td_gpu_ddp_syncs_batchnorm(g)) {
            totals = pq + (size_t)tiles * C;
            bn_total_tiles<<<cblocks, dim3(BN_TX, BN_FY), 0, run->stream>>>(ps, pq, tiles, C,
                                                                            (double)rows, totals);
            TD_LAUNCHED(g);
            td_gpu_ddp_sum(g, totals, 2 * (size_t)C + 1, run->stream);
        }
        bool update = run->training && p->track;
        float *rm = update ? node->buffers[0]->dev_data : NULL;
        float *rv = update ? node->buffers[1]->dev_data : NULL;
        float *nb = update ? node->buffers[2]->dev_data : NULL;
        bn_finalize_stats<<<cblocks, dim3(BN_TX, BN_FY), 0, run->stream>>>(
            ps, pq, tiles, C, (double)rows, totals, p->eps, p->momentum, mean, invstd, rm, rv, nb);
        TD_LAUNCHED(g);
    } else if (!batch) {
        bn_running_stats<<<(C + 255) / 256, 256, 0, run->stream>>>(
            node->buffers[0]->dev_data, node->buffers[1]->dev_data, C, p->eps, mean, invstd);
        TD_LAUNCHED(g);
    }
    const float *w = p->affine ? node->params[0]->dev_data : NULL;
    const float *b = p->affine ? node->params[1]->dev_data : NULL;
    bool relu = p->relu != NULL;
    void *y = relu ? p->relu->out : node->out;
    TD_GPU_DISPATCH(
        g->prec, T,
        launch_apply<T>(g, node->in[0], y, rows, C, mean, invstd, w, b, relu, run->stream));
    TD_LAUNCHED(g);
}

static void bn_release(td_node *node) {
    free(node->gpu);
    node->gpu = NULL;
}

extern "C" const td_gpu_op td_gpu_op_batchnorm2d = {&td_op_batchnorm2d, bn_plan_node, bn_forward,
                                                    td_gpu_bn_backward, bn_release};
extern "C" const td_gpu_op td_gpu_op_batchnorm1d = {&td_op_batchnorm1d, bn_plan_node, bn_forward,
                                                    td_gpu_bn_backward, bn_release};
