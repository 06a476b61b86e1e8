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
#include "gpu/cuda/td_gpu_internal.h"

#include <stdlib.h>

#define BN_TX          32   // channels per block
#define BN_TY          8    // row lanes per block in the row loops
#define BN_FY          16   // tile lanes per block in the finalize kernels
#define BN_TARGET      1024 // blocks the partial-sum kernels aim for (several waves on an H100)
#define BN_MIN_ROWS    64   // rows per tile at least
#define BN_APPLY_ROWS  64   // rows per block (8 per thread) in the element-wise kernels
#define BN_VEC_THREADS 256  // threads per block of the vectorised element-wise kernels
// Shared memory the vectorised kernels may stage per-channel coefficients in (the default
// per-block limit); wider layers take the per-channel kernels.
#define BN_VEC_SMEM (48u << 10)

typedef struct bn_plan {
    td_gpu *g;
    int c;
    float eps, momentum;
    bool affine, track;
    td_node *relu; // the ReLU fused into this node's kernels, or NULL
} bn_plan;

// Tiles per channel block for a batch of `rows` rows: enough blocks to fill the device, at
// least BN_MIN_ROWS rows each. Depends on rows and C only (determinism).
static int bn_tiles(size_t rows, int c) {
    size_t cblocks = ((size_t)c + BN_TX - 1) / BN_TX;
    size_t want = (BN_TARGET + cblocks - 1) / cblocks;
    size_t most = (rows + BN_MIN_ROWS - 1) / BN_MIN_ROWS;
    size_t t = want < most ? want : most;
    return t < 1 ? 1 : (int)t;
}

// Scratch: two double partial sums per (tile, channel), SyncBatchNorm's 2c + 1 double totals, then
// k1, k2, k3 of backward.
static size_t bn_scratch_floats(size_t rows, int c) {
    return 4 * (size_t)bn_tiles(rows, c) * c + 2 * (2 * (size_t)c + 1) + 3 * (size_t)c;
}

// ---- kernels ----------------------------------------------------------------------------------

// y = x·scale + shift per channel, scale = w·invstd, shift = b - mean·scale: one rounding each, in
// explicit fused multiply-adds, so the ReLU mask of backward recomputes forward's y bit for bit.
struct bn_affine {
    float scale, shift;
};
__device__ __forceinline__ bn_affine bn_affine_of(int c, const float *__restrict__ w,
                                                  const float *__restrict__ b,
                                                  const float *__restrict__ mean,
                                                  const float *__restrict__ invstd) {
    bn_affine a;
    a.scale = (w ? w[c] : 1.0f) * invstd[c];
    a.shift = __fmaf_rn(-mean[c], a.scale, b ? b[c] : 0.0f);
    return a;
}
__device__ __forceinline__ float bn_y(float x, bn_affine a) {
    return __fmaf_rn(x, a.scale, a.shift);
}
// Whether the fused ReLU's stored output (y rounded to T) is positive: its backward's mask.
template <typename T> __device__ __forceinline__ bool bn_relu_passes(float x, bn_affine a) {
    return td_to_float(td_from_float<T>(bn_y(x, a))) > 0.0f;
}

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

// Per (tile, channel) of backward: the sums of dy and dy·xhat, xhat = (x - mean)·invstd.
// relu: dy is the fused ReLU's output gradient, taken where y > 0 only.
template <typename T>
__global__ void bn_partial_grad(const T *__restrict__ x, const T *__restrict__ dy, size_t rows,
                                int C, size_t per_tile, const float *__restrict__ mean,
                                const float *__restrict__ invstd, const float *__restrict__ w,
                                const float *__restrict__ bias, bool relu,
                                double *__restrict__ part_dy, double *__restrict__ part_dyx) {
    __shared__ double sa[BN_TY][BN_TX], sb[BN_TY][BN_TX];
    int c = blockIdx.x * BN_TX + threadIdx.x;
    size_t r0 = (size_t)blockIdx.y * per_tile;
    size_t r1 = r0 + per_tile < rows ? r0 + per_tile : rows;
    double a = 0.0, b = 0.0;
    if (c < C) {
        float m = mean[c], is = invstd[c];
        bn_affine af = bn_affine_of(c, w, bias, mean, invstd);
        for (size_t r = r0 + threadIdx.y; r < r1; r += BN_TY) {
            float xv = td_to_float(x[r * C + c]);
            double gv =
                relu && !bn_relu_passes<T>(xv, af) ? 0.0 : (double)td_to_float(dy[r * C + c]);
            float xhat = (xv - m) * is;
            a += gv;
            b += gv * (double)xhat;
        }
    }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int k = 1; k < BN_TY; k++) {
            a += sa[k][threadIdx.x];
            b += sb[k][threadIdx.x];
        }
        part_dy[(size_t)blockIdx.y * C + c] = a;
        part_dyx[(size_t)blockIdx.y * C + c] = b;
    }
}

// The tiles' partial sums of one channel, in tile order (lanes take every BN_FY-th tile, then
// lane sums are added in lane order). Valid in threadIdx.y == 0.
__device__ __forceinline__ void bn_sum_tiles(const double *__restrict__ pa,
                                             const double *__restrict__ pb, int tiles, int C, int c,
                                             double *a_out, double *b_out) {
    __shared__ double sa[BN_FY][BN_TX], sb[BN_FY][BN_TX];
    double a = 0.0, b = 0.0;
    if (c < C)
        for (int t = threadIdx.y; t < tiles; t += BN_FY) {
            a += pa[(size_t)t * C + c];
            b += pb[(size_t)t * C + c];
        }
    sa[threadIdx.y][threadIdx.x] = a;
    sb[threadIdx.y][threadIdx.x] = b;
    __syncthreads();
    if (threadIdx.y == 0)
        for (int k = 1; k < BN_FY; k++) {
            a += sa[k][threadIdx.x];
            b += sb[k][threadIdx.x];
        }
    *a_out = a;
    *b_out = b;
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

// Backward's per-channel totals: the parameters' gradients, and the coefficients of
// dx = k1·dy + k2·x + k3 (xhat is affine in x). With batch statistics
//   dx = w·invstd·(dy - mean(dy) - xhat·mean(dy·xhat)),
// with running ones dx = w·invstd·dy. tiles == 0: no sums needed (no parameters, running
// statistics). With SyncBatchNorm, `global` holds the sums (and count) over every rank, which
// the mean terms of dx take; the parameters' gradients keep this rank's.
__global__ void bn_finalize_grad(const double *__restrict__ part_dy,
                                 const double *__restrict__ part_dyx, int tiles, int C,
                                 double count, const double *__restrict__ global, bool batch,
                                 const float *__restrict__ mean, const float *__restrict__ invstd,
                                 const float *__restrict__ w, float *__restrict__ dw,
                                 float *__restrict__ db, bool accumulate, float *__restrict__ k1,
                                 float *__restrict__ k2, float *__restrict__ k3) {
    int c = blockIdx.x * BN_TX + threadIdx.x;
    double sdy, sdyx;
    bn_sum_tiles(part_dy, part_dyx, tiles, C, c, &sdy, &sdyx);
    if (threadIdx.y != 0 || c >= C) return;
    if (dw) {
        dw[c] = (accumulate ? dw[c] : 0.0f) + (float)sdyx;
        db[c] = (accumulate ? db[c] : 0.0f) + (float)sdy;
    }
    if (global) {
        sdy = global[c];
        sdyx = global[C + c];
        count = global[2 * C];
    }
    float is = invstd[c];
    float s = (w ? w[c] : 1.0f) * is;
    float a = s, b = 0.0f, d = 0.0f;
    if (batch) {
        float mdy = (float)(sdy / count), mdyx = (float)(sdyx / count);
        b = -s * is * mdyx;
        d = -s * mdy + s * is * mean[c] * mdyx;
    }
    k1[c] = a;
    k2[c] = b;
    k3[c] = d;
}

// relu: as in bn_partial_grad, dy masked by forward's y > 0 (af: forward's scale and shift).
template <typename T>
__global__ void bn_dx(const T *__restrict__ x, const T *__restrict__ dy, T *__restrict__ dx,
                      size_t rows, int C, const float *__restrict__ k1,
                      const float *__restrict__ k2, const float *__restrict__ k3, bool add,
                      const float *__restrict__ mean, const float *__restrict__ invstd,
                      const float *__restrict__ w, const float *__restrict__ bias, bool relu) {
    int c = blockIdx.x * BN_TX + threadIdx.x;
    if (c >= C) return;
    float a = k1[c], b = k2[c], d = k3[c];
    bn_affine af = bn_affine_of(c, w, bias, mean, invstd);
    for (size_t r = (size_t)blockIdx.y * BN_TY + threadIdx.y; r < rows;
         r += (size_t)gridDim.y * BN_TY) {
        size_t i = r * C + c;
        float xv = td_to_float(x[i]);
        float g = relu && !bn_relu_passes<T>(xv, af) ? 0.0f : td_to_float(dy[i]);
        float v = a * g + b * xv + d;
        dx[i] = td_from_float<T>(add ? td_to_float(dx[i]) + v : v);
    }
}

// The element-wise passes vectorised, when C is a multiple of 8 and the pointers allow 8-element
// vectors: rows are contiguous and channels innermost, so the activation is one flat run of packs
// of 8 channels of one row (element i has channel i % C). Each block first stages the
// per-channel coefficients in shared memory, computed by the same functions as the per-channel
// kernels (the same bits), then streams packs; with few channels the per-channel kernels would
// read 16 to 64 bytes per row and warp instead of 512.
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
    bn_dx_vec(const T *__restrict__ x, const T *__restrict__ dy, T *__restrict__ dx, size_t n,
              int C, const float *__restrict__ k1, const float *__restrict__ k2,
              const float *__restrict__ k3, bool add, const float *__restrict__ mean,
              const float *__restrict__ invstd, const float *__restrict__ w,
              const float *__restrict__ bias, bool relu) {
    extern __shared__ float coef[]; // k1, k2, k3 [C] each, then scale, shift [C] with relu
    for (int c = threadIdx.x; c < C; c += blockDim.x) {
        coef[c] = k1[c];
        coef[C + c] = k2[c];
        coef[2 * C + c] = k3[c];
        if (relu) {
            bn_affine a = bn_affine_of(c, w, bias, mean, invstd);
            coef[3 * C + c] = a.scale;
            coef[4 * C + c] = a.shift;
        }
    }
    __syncthreads();
    EW_LOOP(i, n) {
        int c0 = (int)(i % (size_t)C);
        float xv[EW_VEC], g[EW_VEC], v[EW_VEC];
        ew_load(x, i, n, true, xv);
        ew_load(dy, i, n, true, g);
        if (add) ew_load(dx, i, n, true, v);
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) {
            int c = c0 + e;
            if (relu) {
                bn_affine a = {coef[3 * C + c], coef[4 * C + c]};
                if (!bn_relu_passes<T>(xv[e], a)) g[e] = 0.0f;
            }
            float t = coef[c] * g[e] + coef[C + c] * xv[e] + coef[2 * C + c];
            v[e] = add ? v[e] + t : t;
        }
        ew_store(dx, i, n, true, v);
    }
}

// The tiles' partial sums vectorised, under the same conditions: a block takes up to BN_RED_PACKS
// packs of 8 channels and as many row lanes as its threads leave (BN_VEC_THREADS / packs); each
// thread keeps its own 8 channels' sums through the tile's rows (16-byte loads of bf16 where the
// per-channel kernels load 2 bytes a thread), then the lanes' sums are added per channel, in lane
// order, through shared memory. The tiles are the per-channel kernels' (bn_tiles), so scratch and
// the finalize kernels are shared; only the order of rows within a tile differs, and it depends
// on rows and C alone (deterministic).
#define BN_RED_PACKS 32

__host__ __device__ static inline int bn_red_packs(int C) {
    int packs = C / EW_VEC;
    return packs < BN_RED_PACKS ? packs : BN_RED_PACKS;
}

// Adds the row lanes' per-channel sums (a[], b[] of this thread's pack) in lane order and writes
// the block's channels of tile blockIdx.y.
__device__ __forceinline__ void bn_reduce_lanes(const double *a, const double *b, int packs,
                                                int lanes, int C, double *__restrict__ pa,
                                                double *__restrict__ pb) {
    __shared__ double sa[BN_VEC_THREADS * EW_VEC], sb[BN_VEC_THREADS * EW_VEC];
    int t = threadIdx.x, width = packs * EW_VEC, lane = t / packs, pack = t % packs;
    if (lane < lanes)
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) {
            sa[lane * width + pack * EW_VEC + e] = a[e];
            sb[lane * width + pack * EW_VEC + e] = b[e];
        }
    __syncthreads();
    if (t >= width) return;
    int c = blockIdx.x * width + t;
    double ta = 0.0, tb = 0.0;
    for (int l = 0; l < lanes; l++) {
        ta += sa[l * width + t];
        tb += sb[l * width + t];
    }
    if (c < C) {
        pa[(size_t)blockIdx.y * C + c] = ta;
        pb[(size_t)blockIdx.y * C + c] = tb;
    }
}

// This thread's share of a vectorised sum: its pack's first channel c0 and row lane, and the
// rows [r0, r1) of tile blockIdx.y; active when it has a lane and a channel.
struct bn_red_at {
    int packs, lanes, lane, c0;
    size_t r0, r1;
    bool active;
};
__device__ __forceinline__ bn_red_at bn_red_here(int C, size_t rows, size_t per_tile) {
    bn_red_at at;
    at.packs = bn_red_packs(C);
    at.lanes = BN_VEC_THREADS / at.packs;
    at.lane = threadIdx.x / at.packs;
    at.c0 = (blockIdx.x * at.packs + threadIdx.x % at.packs) * EW_VEC;
    at.r0 = (size_t)blockIdx.y * per_tile;
    at.r1 = at.r0 + per_tile < rows ? at.r0 + per_tile : rows;
    at.active = at.lane < at.lanes && at.c0 < C;
    return at;
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

template <typename T>
__global__ void __launch_bounds__(BN_VEC_THREADS)
    bn_partial_grad_vec(const T *__restrict__ x, const T *__restrict__ dy, size_t rows, int C,
                        size_t per_tile, const float *__restrict__ mean,
                        const float *__restrict__ invstd, const float *__restrict__ w,
                        const float *__restrict__ bias, bool relu, double *__restrict__ part_dy,
                        double *__restrict__ part_dyx) {
    bn_red_at at = bn_red_here(C, rows, per_tile);
    double a[EW_VEC] = {}, b[EW_VEC] = {};
    if (at.active) {
        int c0 = at.c0;
        float m[EW_VEC], is[EW_VEC];
        bn_affine af[EW_VEC];
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) {
            m[e] = mean[c0 + e];
            is[e] = invstd[c0 + e];
            af[e] = bn_affine_of(c0 + e, w, bias, mean, invstd);
        }
        for (size_t r = at.r0 + at.lane; r < at.r1; r += at.lanes) {
            float xv[EW_VEC], g[EW_VEC];
            ew_load(x, r * C + c0, 0, true, xv);
            ew_load(dy, r * C + c0, 0, true, g);
#pragma unroll
            for (int e = 0; e < EW_VEC; e++) {
                double gv = relu && !bn_relu_passes<T>(xv[e], af[e]) ? 0.0 : (double)g[e];
                float xhat = (xv[e] - m[e]) * is[e];
                a[e] += gv;
                b[e] += gv * (double)xhat;
            }
        }
    }
    bn_reduce_lanes(a, b, at.packs, at.lanes, C, part_dy, part_dyx);
}

// ---- launchers (TD_GPU_DISPATCH's body must not carry bare commas) ----------------------------

// Blocks for the vectorised kernels: enough to fill the device a few times over (each block
// stages its coefficients once, then grid-strides), never more than there are packs.
static unsigned bn_vec_blocks(const td_gpu *g, size_t n) {
    size_t packs = n / EW_VEC, want = (size_t)g->prop.multiProcessorCount * 8;
    size_t b = (packs + BN_VEC_THREADS - 1) / BN_VEC_THREADS;
    return (unsigned)(b < want ? (b ? b : 1) : want);
}

// Whether the vectorised kernels apply: whole packs of channels, aligned pointers, and the
// coefficients (`coef_per_channel` floats per channel) within the shared memory at hand.
template <typename T>
static bool bn_vec_ok(int C, int coef_per_channel, const void *a, const void *b, const void *c) {
    return C % EW_VEC == 0 && ew_aligned<T>(a, b, c) &&
           (size_t)coef_per_channel * C * sizeof(float) <= BN_VEC_SMEM;
}

static dim3 bn_grid_rows(size_t rows, int C) {
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

// What backward reads besides x and dy: the statistics, and for a fused ReLU's mask the
// affine parameters.
struct bn_back {
    const float *mean, *invstd, *w, *b;
    bool relu;
};

template <typename T>
static void launch_partial_grad(const void *x, const void *dy, size_t rows, int C, int tiles,
                                bn_back k, double *pa, double *pb, cudaStream_t st) {
    size_t per_tile = (rows + tiles - 1) / tiles;
    if (C % EW_VEC == 0 && ew_aligned<T>(x, dy)) {
        int packs = bn_red_packs(C), blocks = (C / EW_VEC + packs - 1) / packs;
        bn_partial_grad_vec<T><<<dim3((unsigned)blocks, (unsigned)tiles), BN_VEC_THREADS, 0, st>>>(
            (const T *)x, (const T *)dy, rows, C, per_tile, k.mean, k.invstd, k.w, k.b, k.relu, pa,
            pb);
        return;
    }
    dim3 grid((unsigned)((C + BN_TX - 1) / BN_TX), (unsigned)tiles), block(BN_TX, BN_TY);
    bn_partial_grad<T><<<grid, block, 0, st>>>((const T *)x, (const T *)dy, rows, C, per_tile,
                                               k.mean, k.invstd, k.w, k.b, k.relu, pa, pb);
}

template <typename T>
static void launch_apply(const td_gpu *g, const void *x, void *y, size_t rows, int C,
                         const float *mean, const float *invstd, const float *w, const float *b,
                         bool relu, cudaStream_t st) {
    if (bn_vec_ok<T>(C, 2, x, y, NULL)) {
        size_t n = rows * C;
        bn_apply_vec<T><<<bn_vec_blocks(g, n), BN_VEC_THREADS, 2 * C * sizeof(float), st>>>(
            (const T *)x, (T *)y, n, C, mean, invstd, w, b, relu);
        return;
    }
    bn_apply<T><<<bn_grid_rows(rows, C), dim3(BN_TX, BN_TY), 0, st>>>((const T *)x, (T *)y, rows, C,
                                                                      mean, invstd, w, b, relu);
}

template <typename T>
static void launch_dx(const td_gpu *g, const void *x, const void *dy, void *dx, size_t rows, int C,
                      const float *k1, const float *k2, const float *k3, bool add, bn_back k,
                      cudaStream_t st) {
    int per_channel = k.relu ? 5 : 3;
    if (bn_vec_ok<T>(C, per_channel, x, dy, dx)) {
        size_t n = rows * C;
        bn_dx_vec<T><<<bn_vec_blocks(g, n), BN_VEC_THREADS, per_channel * C * sizeof(float), st>>>(
            (const T *)x, (const T *)dy, (T *)dx, n, C, k1, k2, k3, add, k.mean, k.invstd, k.w, k.b,
            k.relu);
        return;
    }
    bn_dx<T><<<bn_grid_rows(rows, C), dim3(BN_TX, BN_TY), 0, st>>>(
        (const T *)x, (const T *)dy, (T *)dx, rows, C, k1, k2, k3, add, k.mean, k.invstd, k.w, k.b,
        k.relu);
}

// ---- the op -----------------------------------------------------------------------------------

static size_t bn_rows(const td_node *node, int n) {
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
    node->scratch_floats = bn_scratch_floats(bn_rows(node, node->max_n), p->c);
    return 0;
}

static void bn_forward(td_gpu *g, td_node *node, const td_gpu_run *run) {
    bn_plan *p = (bn_plan *)node->gpu;
    int C = p->c;
    size_t rows = bn_rows(node, run->n);
    float *mean = (float *)node->saved, *invstd = mean + C;
    unsigned cblocks = (unsigned)((C + BN_TX - 1) / BN_TX);
    // Recomputing for activation checkpointing, the statistics this batch's forward saved still
    // hold (the node keeps its saved state out of the shared region) and running ones moved
    // once: only the normalisation runs again.
    bool batch = run->training || !p->track;
    if (batch && !run->recompute) {
        int tiles = bn_tiles(rows, C);
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

static void bn_backward(td_gpu *g, td_node *node, const td_gpu_run *run) {
    bn_plan *p = (bn_plan *)node->gpu;
    int C = p->c;
    size_t rows = bn_rows(node, run->n);
    const float *mean = (const float *)node->saved, *invstd = mean + C;
    bool batch = run->training || !p->track;
    void *dx = node->in_grad[0];
    if (!p->affine && !dx) return;
    // The sums are needed for the parameters' gradients and for dx under batch statistics.
    int tiles = p->affine || batch ? bn_tiles(rows, C) : 0;
    int alloc_tiles = bn_tiles(rows, C);
    double *pa = (double *)g->workspace, *pb = pa + (size_t)alloc_tiles * C;
    double *global = pb + (size_t)alloc_tiles * C;
    float *k1 = (float *)(global + 2 * (size_t)C + 1), *k2 = k1 + C, *k3 = k2 + C;
    // with a fused ReLU, the gradient arrives at the ReLU's output
    const void *dy = p->relu ? p->relu->grad : node->grad;
    bn_back k = {mean, invstd, p->affine ? node->params[0]->dev_data : NULL,
                 p->affine ? node->params[1]->dev_data : NULL, p->relu != NULL};
    if (tiles) {
        TD_GPU_DISPATCH(
            g->prec, T,
            launch_partial_grad<T>(node->in[0], dy, rows, C, tiles, k, pa, pb, run->stream));
        TD_LAUNCHED(g);
    }
    unsigned cblocks = (unsigned)((C + BN_TX - 1) / BN_TX);
    // SyncBatchNorm: dx's means run over the global batch its statistics came from (every rank
    // has the same model, so all of them take this branch or none)
    bool sync = run->training && dx && td_gpu_ddp_syncs_batchnorm(g);
    if (sync) {
        bn_total_tiles<<<cblocks, dim3(BN_TX, BN_FY), 0, run->stream>>>(pa, pb, tiles, C,
                                                                        (double)rows, global);
        TD_LAUNCHED(g);
        td_gpu_ddp_sum(g, global, 2 * (size_t)C + 1, run->stream);
    }
    const float *w = k.w;
    float *dw = p->affine ? node->params[0]->dev_grad : NULL;
    float *db = p->affine ? node->params[1]->dev_grad : NULL;
    bn_finalize_grad<<<cblocks, dim3(BN_TX, BN_FY), 0, run->stream>>>(
        pa, pb, tiles, C, (double)rows, sync ? global : NULL, batch, mean, invstd, w, dw, db,
        run->accumulate_grads, k1, k2, k3);
    TD_LAUNCHED(g);
    if (!dx) return;
    bool add = node->in_grad_add[0];
    TD_GPU_DISPATCH(g->prec, T,
                    launch_dx<T>(g, node->in[0], dy, dx, rows, C, k1, k2, k3, add, k, run->stream));
    TD_LAUNCHED(g);
}

static void bn_release(td_node *node) {
    free(node->gpu);
    node->gpu = NULL;
}

extern "C" const td_gpu_op td_gpu_op_batchnorm2d = {&td_op_batchnorm2d, bn_plan_node, bn_forward,
                                                    bn_backward, bn_release};
extern "C" const td_gpu_op td_gpu_op_batchnorm1d = {&td_op_batchnorm1d, bn_plan_node, bn_forward,
                                                    bn_backward, bn_release};
