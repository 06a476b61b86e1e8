// BatchNorm's backward on the GPU (td_gpu_batchnorm.cu has the plan, the statistics, forward
// and the design): per-channel sums of dy and dy·xhat over deterministic tiles, all-reduced over
// the ranks under SyncBatchNorm, then the parameters' gradients and the coefficients of
// dx = k1·dy + k2·x + k3, and dx itself; with a fused ReLU, dy is masked where forward's
// recomputed output is not positive.
#include "gpu/cuda/td_gpu_batchnorm.h"

// ---- kernels ----------------------------------------------------------------------------------

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

// The vectorised kernels of backward (td_gpu_batchnorm.h says how they go).
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
static void launch_dx(const td_gpu *g, const void *x, const void *dy, void *dx, size_t rows, int C,
                      const float *k1, const float *k2, const float *k3, bool add, bn_back k,
                      cudaStream_t st) {
    int per_channel = k.relu ? 5 : 3;
    if (bn_vec_ok<T>(C, per_channel, x, dy, dx)) {
        size_t n = rows * C;
        bn_dx_vec<T>
            <<<td_gpu_bn_vec_blocks(g, n), BN_VEC_THREADS, per_channel * C * sizeof(float), st>>>(
                (const T *)x, (const T *)dy, (T *)dx, n, C, k1, k2, k3, add, k.mean, k.invstd, k.w,
                k.b, k.relu);
        return;
    }
    bn_dx<T><<<td_gpu_bn_grid_rows(rows, C), dim3(BN_TX, BN_TY), 0, st>>>(
        (const T *)x, (const T *)dy, (T *)dx, rows, C, k1, k2, k3, add, k.mean, k.invstd, k.w, k.b,
        k.relu);
}

// ---- the op -----------------------------------------------------------------------------------

void td_gpu_bn_backward(td_gpu *g, td_node *node, const td_gpu_run *run) {
    bn_plan *p = (bn_plan *)node->gpu;
    int C = p->c;
    size_t rows = td_gpu_bn_rows(node, run->n);
    const float *mean = (const float *)node->saved, *invstd = mean + C;
    bool batch = run->training || !p->track;
    void *dx = node->in_grad[0];
    if (!p->affine && !dx) return;
    // The sums are needed for the parameters' gradients and for dx under batch statistics.
    int tiles = p->affine || batch ? td_gpu_bn_tiles(rows, C) : 0;
    int alloc_tiles = td_gpu_bn_tiles(rows, C);
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
