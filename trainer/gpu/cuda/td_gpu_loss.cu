// The loss on the device, with td_loss.c's semantics: softmax cross-entropy with label smoothing
// (max-subtracted log-sum-exp in double) or MSE against the one-hot label, the gradient of the
// mean loss into dlogits, and the batch's loss sum and argmax hits added to g->totals.
//
// One block of one kernel does it all: a warp per row (rows strided over the warps), each warp's
// partial kept by its lane 0 in row order, the warps' partials summed in warp order. The sums
// are thus the same at every run (no atomics), and no scratch memory is needed: batches of a few
// thousand rows are still a handful of rows per warp. A language model's many rows take a wider
// path (loss_launch).
#include "gpu/cuda/td_gpu_internal.h"

#include <limits.h>
#include <math.h>

#define LOSS_THREADS 1024
#define LOSS_WARPS   (LOSS_THREADS / 32)
#define FULL_MASK    0xffffffffu

typedef struct loss_args {
    const int32_t *labels;
    int n, classes;
    bool mse;
    float eps;       // label smoothing (cross-entropy)
    float scale;     // grad_scale / n (/ classes for MSE), in float as the CPU computes it
    const float *ls; // fp16's loss scale on the device, or NULL
    double weight;   // total_weight: the loss sum is added × this
    double *totals;
} loss_args;

// The row's argmax as td_loss.c's argmax() finds it: the first index of the largest value,
// where a NaN never wins unless it is element 0 (which then stays). Returns the maximum (the
// CPU's `max` of the log-sum-exp, NaN when z[0] is) and the index in *at.
template <typename T>
static __device__ __forceinline__ float row_argmax(const T *z, int classes, int lane, int *at) {
    float best = -INFINITY;
    int best_at = INT_MAX; // none yet
    for (int c = lane; c < classes; c += 32) {
        float v = td_to_float(z[c]);
        if (v == v && (best_at == INT_MAX || v > best)) {
            best = v;
            best_at = c;
        }
    }
    for (int off = 16; off > 0; off >>= 1) {
        float ov = __shfl_xor_sync(FULL_MASK, best, off);
        int oat = __shfl_xor_sync(FULL_MASK, best_at, off);
        if (ov > best || (ov == best && oat < best_at)) {
            best = ov;
            best_at = oat;
        }
    }
    float z0 = td_to_float(z[0]);
    if (z0 != z0) {
        *at = 0;
        return z0;
    }
    *at = best_at;
    return best;
}

// One row of softmax cross-entropy; every lane returns the row's loss.
template <typename T>
static __device__ double cross_entropy_row(const loss_args &a, const T *z, int label, T *dz,
                                           int lane, float zmax, double grad_mult) {
    double sum = 0.0;
    for (int c = lane; c < a.classes; c += 32) sum += exp((double)(td_to_float(z[c]) - zmax));
    sum = td_warp_sum(sum);
    double log_sum = log(sum);
    bool valid = label >= 0 && label < a.classes;
    // -log p_label = log_sum - (z_label - zmax); a label outside the classes poisons the loss
    // rather than reading outside the row
    double nll = valid ? log_sum - (double)(td_to_float(z[label]) - zmax) : (double)NAN;
    double eps = a.eps;
    if (a.eps <= 0.0f && !dz) return nll;
    double nll_sum = 0.0, smooth = eps / a.classes;
    for (int c = lane; c < a.classes; c += 32) {
        double d = (double)(td_to_float(z[c]) - zmax);
        nll_sum += log_sum - d;
        if (dz) {
            double p = exp(d) / sum;
            double target = (c == label ? 1.0 - eps : 0.0) + smooth;
            dz[c] = td_from_float<T>((float)((p - target) * grad_mult));
        }
    }
    if (a.eps <= 0.0f) return nll;
    double mean_nll = td_warp_sum(nll_sum) / a.classes;
    return (1.0 - eps) * nll + eps * mean_nll;
}

// One row of MSE against the one-hot label: the per-sample share of a mean over n·classes.
template <typename T>
static __device__ double mse_row(const loss_args &a, const T *z, int label, T *dz, int lane,
                                 double grad_mult) {
    double sum = 0.0;
    for (int c = lane; c < a.classes; c += 32) {
        double d = (double)td_to_float(z[c]) - (c == label ? 1.0 : 0.0);
        sum += d * d;
        if (dz) dz[c] = td_from_float<T>((float)(2.0 * d * grad_mult));
    }
    return td_warp_sum(sum) / a.classes;
}

template <typename T>
static __global__ void __launch_bounds__(LOSS_THREADS)
    loss_kernel(loss_args a, const T *__restrict__ logits, T *__restrict__ dlogits) {
    __shared__ double warp_loss[LOSS_WARPS];
    __shared__ int warp_hits[LOSS_WARPS];
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    // the loss scale is a power of two, so scaling the float multiplier by it is exact
    double grad_mult = (double)a.scale * (a.ls ? (double)*a.ls : 1.0);
    double loss_acc = 0.0;
    int hits = 0;
    for (int r = warp; r < a.n; r += LOSS_WARPS) {
        const T *z = logits + (size_t)r * a.classes;
        T *dz = dlogits ? dlogits + (size_t)r * a.classes : NULL;
        int label = a.labels[r], at;
        float zmax = row_argmax(z, a.classes, lane, &at);
        hits += at == label;
        loss_acc += a.mse ? mse_row(a, z, label, dz, lane, grad_mult)
                          : cross_entropy_row(a, z, label, dz, lane, zmax, grad_mult);
    }
    if (lane == 0) {
        warp_loss[warp] = loss_acc;
        warp_hits[warp] = hits;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
        double sum = 0.0;
        long long total_hits = 0;
        for (int w = 0; w < LOSS_WARPS; w++) {
            sum += warp_loss[w];
            total_hits += warp_hits[w];
        }
        // one block and one stream: nothing else touches the totals meanwhile
        a.totals[0] += sum * a.weight;
        a.totals[1] += (double)total_hits;
    }
}

// Many rows (a language model's batch × positions × a vocabulary: GPT-2's 16384 × 50257) would
// keep the one block above busy for most of a step: a warp a row over the whole GPU instead,
// each row's loss and hit into scratch, then one block adds them up in a fixed order (thread i
// takes rows i, i + LOSS_THREADS, ..., thread 0 the threads' sums in order), so the totals are
// again the same at every run. Batches of up to LOSS_ONE_BLOCK_ROWS rows keep the one-block
// kernel and its sums to the bit.
#define LOSS_ONE_BLOCK_ROWS 4096
#define ROW_WARPS           8

template <typename T>
static __global__ void __launch_bounds__(ROW_WARPS * 32)
    loss_rows_kernel(loss_args a, const T *__restrict__ logits, T *__restrict__ dlogits,
                     double *__restrict__ row_loss, int *__restrict__ row_hit) {
    int r = blockIdx.x * ROW_WARPS + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (r >= a.n) return; // a whole warp leaves together
    double grad_mult = (double)a.scale * (a.ls ? (double)*a.ls : 1.0);
    const T *z = logits + (size_t)r * a.classes;
    T *dz = dlogits ? dlogits + (size_t)r * a.classes : NULL;
    int label = a.labels[r], at;
    float zmax = row_argmax(z, a.classes, lane, &at);
    double loss = a.mse ? mse_row(a, z, label, dz, lane, grad_mult)
                        : cross_entropy_row(a, z, label, dz, lane, zmax, grad_mult);
    if (lane == 0) {
        row_loss[r] = loss;
        row_hit[r] = at == label;
    }
}

static __global__ void __launch_bounds__(LOSS_THREADS)
    loss_sum_kernel(loss_args a, const double *__restrict__ row_loss,
                    const int *__restrict__ row_hit) {
    __shared__ double part[LOSS_THREADS];
    __shared__ long long part_hits[LOSS_THREADS];
    double sum = 0.0;
    long long hits = 0;
    for (int r = threadIdx.x; r < a.n; r += LOSS_THREADS) {
        sum += row_loss[r];
        hits += row_hit[r];
    }
    part[threadIdx.x] = sum;
    part_hits[threadIdx.x] = hits;
    __syncthreads();
    if (threadIdx.x != 0) return;
    for (int i = 1; i < LOSS_THREADS; i++) {
        sum += part[i];
        hits += part_hits[i];
    }
    a.totals[0] += sum * a.weight;
    a.totals[1] += (double)hits;
}

template <typename T>
static void loss_launch(td_gpu *g, const loss_args &a, const void *logits, void *dlogits,
                        cudaStream_t stream) {
    if (a.n <= LOSS_ONE_BLOCK_ROWS || !g->loss_rows) {
        loss_kernel<T><<<1, LOSS_THREADS, 0, stream>>>(a, (const T *)logits, (T *)dlogits);
        TD_LAUNCHED(g);
        return;
    }
    unsigned blocks = (unsigned)((a.n + ROW_WARPS - 1) / ROW_WARPS);
    loss_rows_kernel<T><<<blocks, ROW_WARPS * 32, 0, stream>>>(a, (const T *)logits, (T *)dlogits,
                                                               g->loss_rows, g->loss_row_hits);
    TD_LAUNCHED(g);
    loss_sum_kernel<<<1, LOSS_THREADS, 0, stream>>>(a, g->loss_rows, g->loss_row_hits);
    TD_LAUNCHED(g);
}

void td_gpu_loss_run(td_gpu *g, const td_loss *loss, const void *logits, const int32_t *labels,
                     int n, int classes, void *dlogits, float grad_scale, const float *loss_scale,
                     float total_weight, cudaStream_t stream) {
    if (n <= 0 || classes <= 0) return;
    loss_args a;
    a.labels = labels;
    a.n = n;
    a.classes = classes;
    a.mse = loss->kind == TD_LOSS_MSE;
    a.eps = a.mse ? 0.0f : loss->label_smoothing;
    a.scale = grad_scale / (float)n;
    if (a.mse) a.scale /= (float)classes;
    a.ls = loss_scale;
    a.weight = total_weight;
    a.totals = g->totals;
    TD_GPU_DISPATCH(g->prec, T, loss_launch<T>(g, a, logits, dlogits, stream));
}

// The many-rows path's scratch: a row's loss and hit each (none for batches the one block
// handles).
int td_gpu_loss_alloc(td_gpu *g, size_t max_rows, td_err *err) {
    g->loss_max_rows = 0;
    if (max_rows <= LOSS_ONE_BLOCK_ROWS) return 0;
    g->loss_rows = (double *)td_gpu_malloc(g, max_rows * sizeof(double), "the loss's row sums");
    g->loss_row_hits = (int *)td_gpu_malloc(g, max_rows * sizeof(int), "the loss's row hits");
    if (g->failed) return td_fail(err, "%s", g->msg);
    g->loss_max_rows = max_rows;
    return 0;
}

void td_gpu_loss_free(td_gpu *g) {
    td_gpu_free(g, g->loss_rows, g->loss_max_rows * sizeof(double));
    td_gpu_free(g, g->loss_row_hits, g->loss_max_rows * sizeof(int));
    g->loss_rows = NULL;
    g->loss_row_hits = NULL;
    g->loss_max_rows = 0;
}
