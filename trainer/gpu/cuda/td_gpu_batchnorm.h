// What BatchNorm's two sources share: td_gpu_batchnorm.cu (the plan, the statistics and
// forward) and td_gpu_batchnorm_backward.cu (backward). The launch shapes, the node's plan, the
// tiling of the deterministic reductions, the per-channel affine map that forward applies and
// backward's fused-ReLU mask recomputes, and the helpers of the vectorised kernels. C++ (nvcc)
// only; td_gpu_batchnorm.cu's opening comment describes the whole.
#ifndef TD_GPU_BATCHNORM_H
#define TD_GPU_BATCHNORM_H

#include "gpu/cuda/td_gpu_internal.h"

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
int td_gpu_bn_tiles(size_t rows, int c);

// Rows of the node's [rows, C] layout (rows = N·H·W) at batch size n.
size_t td_gpu_bn_rows(const td_node *node, int n);

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
// then the rows they cover (at 2C), for the all-reduce across ranks (td_gpu_batchnorm.cu).
__global__ void bn_total_tiles(const double *__restrict__ pa, const double *__restrict__ pb,
                               int tiles, int C, double rows, double *__restrict__ totals);

// ---- vectorised kernels -----------------------------------------------------------------------

// The element-wise passes vectorised, when C is a multiple of 8 and the pointers allow 8-element
// vectors: rows are contiguous and channels innermost, so the activation is one flat run of packs
// of 8 channels of one row (element i has channel i % C). Each block first stages the
// per-channel coefficients in shared memory, computed by the same functions as the per-channel
// kernels (the same bits), then streams packs; with few channels the per-channel kernels would
// read 16 to 64 bytes per row and warp instead of 512.
//
// The tiles' partial sums vectorised, under the same conditions: a block takes up to BN_RED_PACKS
// packs of 8 channels and as many row lanes as its threads leave (BN_VEC_THREADS / packs); each
// thread keeps its own 8 channels' sums through the tile's rows (16-byte loads of bf16 where the
// per-channel kernels load 2 bytes a thread), then the lanes' sums are added per channel, in lane
// order, through shared memory. The tiles are the per-channel kernels' (td_gpu_bn_tiles), so
// scratch and the finalize kernels are shared; only the order of rows within a tile differs, and it
// depends on rows and C alone (deterministic).
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

// Blocks for the vectorised element-wise kernels: enough to fill the device a few times over
// (each block stages its coefficients once, then grid-strides), never more than there are packs.
unsigned td_gpu_bn_vec_blocks(const td_gpu *g, size_t n);

// Whether the vectorised kernels apply: whole packs of channels, aligned pointers, and the
// coefficients (`coef_per_channel` floats per channel) within the shared memory at hand.
template <typename T>
static bool bn_vec_ok(int C, int coef_per_channel, const void *a, const void *b, const void *c) {
    return C % EW_VEC == 0 && ew_aligned<T>(a, b, c) &&
           (size_t)coef_per_channel * C * sizeof(float) <= BN_VEC_SMEM;
}

// The grid of the per-channel element-wise kernels: channel blocks by blocks of BN_APPLY_ROWS
// rows.
dim3 td_gpu_bn_grid_rows(size_t rows, int C);

// The op's backward (td_gpu_batchnorm_backward.cu).
void td_gpu_bn_backward(td_gpu *g, td_node *node, const td_gpu_run *run);

#endif
