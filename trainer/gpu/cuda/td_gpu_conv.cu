// Conv2d on the GPU through cuDNN's convolution API (cudnnConvolutionForward / BackwardData /
// BackwardFilter): it runs with a preallocated workspace and no host synchronisation, so a
// training step with it can be captured in a CUDA graph.
//
// Layouts. Activations are channels-last, cuDNN's NHWC (descriptor dims n, c, h, w). Weights
// keep PyTorch's OIHW in the fp32 master block, but cuDNN's tensor-core NHWC kernels want the
// filter channels-last too (KRSC: [O, KH, KW, C]), so forward rebuilds a KRSC copy in the compute
// precision (weights change at every step; the copy is tiny next to the activations) and keeps
// it in node->saved for backward's data gradient. The filter gradient comes out KRSC in the
// compute precision and a second small kernel adds it into the OIHW fp32 gradient. A 1x1 kernel
// has the same memory order in both layouts, so it skips the copy (and in fp32 the gradient
// goes straight into the gradient block).
//
// Precision. fp32 runs with CUDNN_FMA_MATH: cuDNN's default math would allow TF32 on Ampere and
// later, which breaks parity with the CPU. bf16 / fp16 run on tensor cores with fp32
// accumulation (the convolution's compute type is float).
//
// Algorithms are chosen once at plan time from cuDNN's heuristics for the full batch (no
// buffers exist yet, so no benchmarking): the first candidate whose workspace is at most
// CONV_WS_LIMIT, only deterministic ones unless train.deterministic is false. The ranked
// candidates are kept; a smaller last batch re-queries the workspace of the chosen algorithm and
// walks the ranking when it no longer fits the shared workspace. Choices live in two slots keyed
// by the full shape (the batch size and the largest other batch size seen last).
#include "gpu/cuda/td_gpu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define CONV_WS_LIMIT ((size_t)256 << 20)
// The shared workspace is only 64-byte aligned (the arena's rule); cuDNN's is rounded to 256.
#define CONV_ALIGN    256
#define CONV_MAX_CAND 16

#define CB_TX       32   // channels per block (bias kernels)
#define CB_TY       8    // row lanes per block
#define CB_FY       16   // tile lanes in the finalize kernel
#define CB_TARGET   1024 // blocks the bias-gradient partial kernel aims for
#define CB_MIN_ROWS 64   // rows per tile at least

enum { PASS_FWD, PASS_BWD_DATA, PASS_BWD_FILTER, PASS_COUNT };

// What a choice of algorithms depends on: every shape parameter and the precision.
typedef struct conv_key {
    int n, c, h, w, o, k, s, p;
    td_precision prec;
} conv_key;

typedef struct conv_choice {
    int algo; // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t of the pass
    cudnnMathType_t math;
    size_t ws;
} conv_choice;

typedef struct conv_slot {
    bool valid;
    conv_key key;
    cudnnTensorDescriptor_t x, y;
    conv_choice pass[PASS_COUNT];
} conv_slot;

typedef struct conv_plan {
    td_gpu *g;
    conv_key full; // the shape at max_n
    int oh, ow;
    bool bias;
    bool direct_w;   // 1x1: OIHW already is KRSC, no copy
    bool stage_dw;   // the filter gradient goes through a KRSC buffer in the workspace
    size_t w_elems;  // O·KH·KW·C
    size_t dw_bytes; // the staging buffer, rounded to CONV_ALIGN (0 without staging)
    cudnnDataType_t dtype;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    int n_cand[PASS_COUNT];
    conv_choice cand[PASS_COUNT][CONV_MAX_CAND]; // heuristics' ranking at max_n (ws unused)
    conv_slot slot[2];                           // [0]: max_n, [1]: the latest other batch size
} conv_plan;

// ---- kernels ----------------------------------------------------------------------------------

// KRSC copy of the OIHW fp32 weight in the compute precision; i runs over the KRSC output.
template <typename T>
__global__ void conv_weight_krsc(const float *__restrict__ w, T *__restrict__ wk, size_t total,
                                 int C, int KK) {
    TD_GRID_STRIDE(i, total) {
        size_t c = i % C, t = i / C;
        size_t rs = t % KK, o = t / KK;
        wk[i] = td_from_float<T>(w[(o * C + c) * KK + rs]);
    }
}

// OIHW fp32 gradient (+)= the KRSC gradient; i runs over the OIHW output (coalesced writes).
template <typename T>
__global__ void conv_grad_oihw(const T *__restrict__ dwk, float *__restrict__ dw, size_t total,
                               int C, int KK, bool add) {
    TD_GRID_STRIDE(i, total) {
        size_t rs = i % KK, t = i / KK;
        size_t c = t % C, o = t / C;
        float v = td_to_float(dwk[(o * KK + rs) * C + c]);
        dw[i] = add ? dw[i] + v : v;
    }
}

// y[r, o] += b[o] over channels-last rows.
template <typename T>
__global__ void conv_add_bias(T *__restrict__ y, const float *__restrict__ b, size_t rows, int O) {
    int c = blockIdx.x * CB_TX + threadIdx.x;
    if (c >= O) return;
    float bc = b[c];
    for (size_t r = (size_t)blockIdx.y * CB_TY + threadIdx.y; r < rows;
         r += (size_t)gridDim.y * CB_TY) {
        size_t i = r * O + c;
        y[i] = td_from_float<T>(td_to_float(y[i]) + bc);
    }
}

// Bias gradient, first level: per (tile, channel) the sum of dy over the tile's rows, lanes
// summed in a fixed order. With the tile order fixed in the second level the result is the same
// at every run (no atomics).
template <typename T>
__global__ void conv_bias_partial(const T *__restrict__ dy, size_t rows, int O, size_t per_tile,
                                  float *__restrict__ part) {
    __shared__ float sp[CB_TY][CB_TX];
    int c = blockIdx.x * CB_TX + threadIdx.x;
    size_t r0 = (size_t)blockIdx.y * per_tile;
    size_t r1 = r0 + per_tile < rows ? r0 + per_tile : rows;
    float s = 0.0f;
    if (c < O)
        for (size_t r = r0 + threadIdx.y; r < r1; r += CB_TY) s += td_to_float(dy[r * O + c]);
    sp[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < O) {
        for (int k = 1; k < CB_TY; k++) s += sp[k][threadIdx.x];
        part[(size_t)blockIdx.y * O + c] = s;
    }
}

// Second level: the tiles in order, into the fp32 bias gradient.
__global__ void conv_bias_finalize(const float *__restrict__ part, int tiles, int O,
                                   float *__restrict__ db, bool add) {
    __shared__ double sp[CB_FY][CB_TX];
    int c = blockIdx.x * CB_TX + threadIdx.x;
    double s = 0.0;
    if (c < O)
        for (int t = threadIdx.y; t < tiles; t += CB_FY) s += part[(size_t)t * O + c];
    sp[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y != 0 || c >= O) return;
    for (int k = 1; k < CB_FY; k++) s += sp[k][threadIdx.x];
    db[c] = add ? db[c] + (float)s : (float)s;
}

// Tiles for the bias gradient: a function of rows and O only (determinism).
static int conv_bias_tiles(size_t rows, int O) {
    size_t cblocks = ((size_t)O + CB_TX - 1) / CB_TX;
    size_t want = (CB_TARGET + cblocks - 1) / cblocks;
    size_t most = (rows + CB_MIN_ROWS - 1) / CB_MIN_ROWS;
    size_t t = want < most ? want : most;
    return t < 1 ? 1 : (int)t;
}

// Launchers, so that TD_GPU_DISPATCH's body has no bare commas.
template <typename T>
static void launch_weight_krsc(const float *w, void *wk, size_t total, int C, int KK,
                               cudaStream_t st) {
    conv_weight_krsc<T><<<td_gpu_blocks(total, 256), 256, 0, st>>>(w, (T *)wk, total, C, KK);
}

template <typename T>
static void launch_grad_oihw(const void *dwk, float *dw, size_t total, int C, int KK, bool add,
                             cudaStream_t st) {
    conv_grad_oihw<T>
        <<<td_gpu_blocks(total, 256), 256, 0, st>>>((const T *)dwk, dw, total, C, KK, add);
}

template <typename T>
static void launch_add_bias(void *y, const float *b, size_t rows, int O, cudaStream_t st) {
    size_t gy = (rows + 8 * CB_TY - 1) / (8 * CB_TY); // 8 rows per thread
    if (gy > 65535) gy = 65535;
    dim3 grid((unsigned)((O + CB_TX - 1) / CB_TX), (unsigned)(gy ? gy : 1));
    conv_add_bias<T><<<grid, dim3(CB_TX, CB_TY), 0, st>>>((T *)y, b, rows, O);
}

template <typename T>
static void launch_bias_partial(const void *dy, size_t rows, int O, int tiles, float *part,
                                cudaStream_t st) {
    size_t per_tile = (rows + tiles - 1) / tiles;
    dim3 grid((unsigned)((O + CB_TX - 1) / CB_TX), (unsigned)tiles);
    conv_bias_partial<T>
        <<<grid, dim3(CB_TX, CB_TY), 0, st>>>((const T *)dy, rows, O, per_tile, part);
}

// ---- algorithms -------------------------------------------------------------------------------

// The math a plan's convolutions run with: FMA keeps fp32 true fp32 (cuDNN's default may use
// TF32 on Ampere and later); 16-bit data runs on tensor cores.
static cudnnMathType_t conv_math(td_precision prec) {
    return prec == TD_PREC_FP32 ? CUDNN_FMA_MATH : CUDNN_TENSOR_OP_MATH;
}

static bool key_eq(const conv_key *a, const conv_key *b) {
    return a->n == b->n && a->c == b->c && a->h == b->h && a->w == b->w && a->o == b->o &&
           a->k == b->k && a->s == b->s && a->p == b->p && a->prec == b->prec;
}

// The workspace of one algorithm of one pass at the slot's shape; not SUCCESS when cuDNN does
// not support that algorithm there (an expected answer while ranking, so not a failure).
static cudnnStatus_t ws_query(conv_plan *p, const conv_slot *s, int pass, const conv_choice *c,
                              size_t *bytes) {
    td_gpu *g = p->g;
    cudnnStatus_t st = cudnnSetConvolutionMathType(p->conv, c->math);
    if (st != CUDNN_STATUS_SUCCESS) return st;
    switch (pass) {
    case PASS_FWD:
        return cudnnGetConvolutionForwardWorkspaceSize(g->dnn, s->x, p->w, p->conv, s->y,
                                                       (cudnnConvolutionFwdAlgo_t)c->algo, bytes);
    case PASS_BWD_DATA:
        return cudnnGetConvolutionBackwardDataWorkspaceSize(
            g->dnn, p->w, s->y, p->conv, s->x, (cudnnConvolutionBwdDataAlgo_t)c->algo, bytes);
    default:
        return cudnnGetConvolutionBackwardFilterWorkspaceSize(
            g->dnn, s->x, s->y, p->conv, p->w, (cudnnConvolutionBwdFilterAlgo_t)c->algo, bytes);
    }
}

// Keeps a heuristic result as a candidate: only successful ones, fp32 forced to FMA math.
// want_det: 1 deterministic ones only, 0 the others only, -1 either.
static void add_cand(conv_plan *p, int pass, int algo, cudnnStatus_t status, cudnnMathType_t math,
                     cudnnDeterminism_t det, int want_det) {
    if (status != CUDNN_STATUS_SUCCESS) return;
    if (want_det >= 0 && (det == CUDNN_DETERMINISTIC) != (want_det == 1)) return;
    if (p->n_cand[pass] >= CONV_MAX_CAND) return;
    conv_choice *c = &p->cand[pass][p->n_cand[pass]++];
    c->algo = algo;
    c->math = p->full.prec == TD_PREC_FP32 ? CUDNN_FMA_MATH : math;
    c->ws = 0;
}

// cuDNN's ranking of every pass at the full batch: its deterministic algorithms alone, or (not
// g->deterministic) all of them in cuDNN's own order. As torch.backends.cudnn.deterministic, a
// deterministic run never falls back on an algorithm that adds with atomics: it fails instead.
static int rank_algorithms(conv_plan *p, const conv_slot *s) {
    td_gpu *g = p->g;
    int want_det = g->deterministic ? 1 : -1;
    TD_CUDNN_RET(g, cudnnSetConvolutionMathType(p->conv, conv_math(p->full.prec)), -1);
    int got = 0;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    TD_CUDNN_RET(g,
                 cudnnGetConvolutionForwardAlgorithm_v7(g->dnn, s->x, p->w, p->conv, s->y,
                                                        CUDNN_CONVOLUTION_FWD_ALGO_COUNT, &got,
                                                        fwd),
                 -1);
    for (int i = 0; i < got; i++)
        add_cand(p, PASS_FWD, fwd[i].algo, fwd[i].status, fwd[i].mathType, fwd[i].determinism,
                 want_det);
    cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
    TD_CUDNN_RET(g,
                 cudnnGetConvolutionBackwardDataAlgorithm_v7(g->dnn, p->w, s->y, p->conv, s->x,
                                                             CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT,
                                                             &got, bd),
                 -1);
    for (int i = 0; i < got; i++)
        add_cand(p, PASS_BWD_DATA, bd[i].algo, bd[i].status, bd[i].mathType, bd[i].determinism,
                 want_det);
    cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    TD_CUDNN_RET(
        g,
        cudnnGetConvolutionBackwardFilterAlgorithm_v7(
            g->dnn, s->x, s->y, p->conv, p->w, CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, bf),
        -1);
    for (int i = 0; i < got; i++)
        add_cand(p, PASS_BWD_FILTER, bf[i].algo, bf[i].status, bf[i].mathType, bf[i].determinism,
                 want_det);
    return 0;
}

// The first candidate of the pass (after `first`, if given) that cuDNN supports at the slot's
// shape within `limit` bytes of workspace; then the pass's plain deterministic algorithm
// (forward's implicit GEMM, the gradients' ALGO_1) and, unless g->deterministic, its ALGO_0,
// which adds with atomics (cudnn_ops.h marks it non-deterministic). -1 after recording a failure.
static int choose(conv_plan *p, conv_slot *s, int pass, const conv_choice *first, size_t limit) {
    conv_choice tries[CONV_MAX_CAND + 3];
    int n = 0;
    if (first) tries[n++] = *first;
    for (int i = 0; i < p->n_cand[pass]; i++) tries[n++] = p->cand[pass][i];
    int plain = pass == PASS_FWD        ? (int)CUDNN_CONVOLUTION_FWD_ALGO_IMPLICIT_GEMM
                : pass == PASS_BWD_DATA ? (int)CUDNN_CONVOLUTION_BWD_DATA_ALGO_1
                                        : (int)CUDNN_CONVOLUTION_BWD_FILTER_ALGO_1;
    tries[n++] = conv_choice{plain, conv_math(p->full.prec), 0};
    if (pass != PASS_FWD && !p->g->deterministic)
        tries[n++] = conv_choice{0, conv_math(p->full.prec), 0};
    for (int i = 0; i < n; i++) {
        size_t bytes = 0;
        if (ws_query(p, s, pass, &tries[i], &bytes) == CUDNN_STATUS_SUCCESS && bytes <= limit) {
            s->pass[pass] = tries[i];
            s->pass[pass].ws = bytes;
            return 0;
        }
    }
    static const char *const names[PASS_COUNT] = {"forward", "data-gradient", "filter-gradient"};
    char detail[256];
    snprintf(detail, sizeof detail,
             "no %s algorithm for conv2d %d -> %d channels, %dx%d input, kernel %d, stride %d, "
             "padding %d, batch %d within %.0f MiB of workspace",
             names[pass], s->key.c, s->key.o, s->key.h, s->key.w, s->key.k, s->key.s, s->key.p,
             s->key.n, (double)limit / (1 << 20));
    td_gpu_fail(p->g, __FILE__, __LINE__, "cuDNN", detail,
                p->g->deterministic
                    ? "cuDNN has no deterministic kernel for this layer in this precision; try "
                      "train.deterministic false, train.precision fp32, or another kernel_size / "
                      "channel count"
                    : "cuDNN has no kernel for this layer in this precision; try train.precision "
                      "fp32 or another kernel_size / channel count");
    return -1;
}

static int slot_descriptors(conv_plan *p, conv_slot *s, const conv_key *key) {
    td_gpu *g = p->g;
    if (!s->x) TD_CUDNN_RET(g, cudnnCreateTensorDescriptor(&s->x), -1);
    if (!s->y) TD_CUDNN_RET(g, cudnnCreateTensorDescriptor(&s->y), -1);
    TD_CUDNN_RET(g,
                 cudnnSetTensor4dDescriptor(s->x, CUDNN_TENSOR_NHWC, p->dtype, key->n, key->c,
                                            key->h, key->w),
                 -1);
    TD_CUDNN_RET(
        g,
        cudnnSetTensor4dDescriptor(s->y, CUDNN_TENSOR_NHWC, p->dtype, key->n, key->o, p->oh, p->ow),
        -1);
    s->key = *key;
    return 0;
}

// The shared workspace rounded up to CONV_ALIGN: the filter-gradient staging buffer (dw_bytes),
// then cuDNN's workspace, whose size goes to *bytes.
static char *conv_workspace(const conv_plan *p, size_t *bytes) {
    const td_gpu *g = p->g;
    uintptr_t base = (uintptr_t)g->workspace;
    uintptr_t al = (base + CONV_ALIGN - 1) / CONV_ALIGN * CONV_ALIGN;
    size_t skip = (size_t)(al - base) + p->dw_bytes;
    *bytes = g->workspace && g->workspace_bytes > skip ? g->workspace_bytes - skip : 0;
    return g->workspace ? (char *)al : NULL;
}

// The slot for this batch size, its algorithms fitting the workspace there is. NULL after
// recording a failure.
static conv_slot *slot_for(conv_plan *p, int n) {
    size_t have;
    conv_workspace(p, &have);
    conv_key key = p->full;
    key.n = n;
    conv_slot *s = n == p->full.n ? &p->slot[0] : &p->slot[1];
    if (s->valid && key_eq(&s->key, &key)) {
        // chosen at plan time for a workspace the context sized from our request, so this only
        // trips if the shared workspace ever shrinks
        for (int i = 0; i < PASS_COUNT; i++)
            if (s->pass[i].ws > have && choose(p, s, i, NULL, have) != 0) return NULL;
        return s;
    }
    s->valid = false;
    if (slot_descriptors(p, s, &key) != 0) return NULL;
    for (int i = 0; i < PASS_COUNT; i++)
        if (choose(p, s, i, &p->slot[0].pass[i], have) != 0) return NULL;
    s->valid = true;
    return s;
}

// ---- cudnn.benchmark --------------------------------------------------------------------------

// The fastest of cuDNN's timings (sorted fastest first) that is deterministic (unless det_only is
// false), fits `have` bytes of workspace and, in fp32, does not compute in TF32. False when none
// qualifies: the heuristic choice stays.
template <typename Perf>
static bool fastest(const Perf *perf, int got, size_t have, td_precision prec, bool det_only,
                    conv_choice *out) {
    for (int i = 0; i < got; i++) {
        const Perf *r = &perf[i];
        // fp32: FMA only (cuDNN's default math may use TF32 on Ampere and later)
        if (r->status != CUDNN_STATUS_SUCCESS ||
            (det_only && r->determinism != CUDNN_DETERMINISTIC) || r->memory > have ||
            (prec == TD_PREC_FP32 && r->mathType != CUDNN_FMA_MATH))
            continue;
        out->algo = (int)r->algo;
        out->math = prec == TD_PREC_FP32 ? CUDNN_FMA_MATH : r->mathType;
        out->ws = r->memory;
        return true;
    }
    return false;
}

int td_gpu_conv_benchmark(td_gpu *g, td_node *node) {
    conv_plan *p = (conv_plan *)node->gpu;
    conv_slot *s = &p->slot[0];
    if (!s->valid) return 0;
    size_t have;
    char *base = conv_workspace(p, &have);
    char *ws = base ? base + p->dw_bytes : NULL;
    const void *x = node->inputs[0] == TD_INPUT_NODE ? g->input : node->in[0];
    const td_param *wp = node->params[0];
    const void *wk = p->direct_w ? td_gpu_weight(g, wp) : node->saved;
    void *dw = p->stage_dw ? (void *)base : (void *)wp->dev_grad;
    td_precision prec = p->full.prec;
    TD_CUDNN_RET(g, cudnnSetStream(g->dnn, g->stream), -1);
    // the math the search may use, as the heuristic choice's
    TD_CUDNN_RET(g, cudnnSetConvolutionMathType(p->conv, conv_math(prec)), -1);
    int got = 0;
    conv_choice c;
    cudnnConvolutionFwdAlgoPerf_t fwd[CUDNN_CONVOLUTION_FWD_ALGO_COUNT];
    TD_CUDNN_RET(g,
                 cudnnFindConvolutionForwardAlgorithmEx(g->dnn, s->x, x, p->w, wk, p->conv, s->y,
                                                        node->out, CUDNN_CONVOLUTION_FWD_ALGO_COUNT,
                                                        &got, fwd, ws, have),
                 -1);
    if (fastest(fwd, got, have, prec, g->deterministic, &c)) s->pass[PASS_FWD] = c;
    if (node->in_grad[0]) { // the first layer's input wants no gradient
        cudnnConvolutionBwdDataAlgoPerf_t bd[CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT];
        TD_CUDNN_RET(g,
                     cudnnFindConvolutionBackwardDataAlgorithmEx(
                         g->dnn, p->w, wk, s->y, node->grad, p->conv, s->x, node->in_grad[0],
                         CUDNN_CONVOLUTION_BWD_DATA_ALGO_COUNT, &got, bd, ws, have),
                     -1);
        if (fastest(bd, got, have, prec, g->deterministic, &c)) s->pass[PASS_BWD_DATA] = c;
    }
    cudnnConvolutionBwdFilterAlgoPerf_t bf[CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT];
    TD_CUDNN_RET(g,
                 cudnnFindConvolutionBackwardFilterAlgorithmEx(
                     g->dnn, s->x, x, s->y, node->grad, p->conv, p->w, dw,
                     CUDNN_CONVOLUTION_BWD_FILTER_ALGO_COUNT, &got, bf, ws, have),
                 -1);
    if (fastest(bf, got, have, prec, g->deterministic, &c)) s->pass[PASS_BWD_FILTER] = c;
    return 1;
}

// ---- the op -----------------------------------------------------------------------------------

static void conv_release(td_node *node) {
    conv_plan *p = (conv_plan *)node->gpu;
    if (!p) return;
    for (int i = 0; i < 2; i++) {
        if (p->slot[i].x) cudnnDestroyTensorDescriptor(p->slot[i].x);
        if (p->slot[i].y) cudnnDestroyTensorDescriptor(p->slot[i].y);
    }
    if (p->w) cudnnDestroyFilterDescriptor(p->w);
    if (p->conv) cudnnDestroyConvolutionDescriptor(p->conv);
    free(p);
    node->gpu = NULL;
}

static int conv_build_plan(conv_plan *p, size_t *ws_max) {
    td_gpu *g = p->g;
    const conv_key *k = &p->full;
    TD_CUDNN_RET(g, cudnnCreateFilterDescriptor(&p->w), -1);
    TD_CUDNN_RET(
        g, cudnnSetFilter4dDescriptor(p->w, p->dtype, CUDNN_TENSOR_NHWC, k->o, k->c, k->k, k->k),
        -1);
    TD_CUDNN_RET(g, cudnnCreateConvolutionDescriptor(&p->conv), -1);
    // float compute for every precision: 16-bit data accumulates in fp32
    TD_CUDNN_RET(g,
                 cudnnSetConvolution2dDescriptor(p->conv, k->p, k->p, k->s, k->s, 1, 1,
                                                 CUDNN_CROSS_CORRELATION, CUDNN_DATA_FLOAT),
                 -1);
    conv_slot *s = &p->slot[0];
    if (slot_descriptors(p, s, k) != 0 || rank_algorithms(p, s) != 0) return -1;
    *ws_max = 0;
    for (int i = 0; i < PASS_COUNT; i++) {
        if (choose(p, s, i, NULL, CONV_WS_LIMIT) != 0) return -1;
        if (s->pass[i].ws > *ws_max) *ws_max = s->pass[i].ws;
    }
    s->valid = true;
    return 0;
}

static int conv_plan_node(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    (void)m;
    conv_plan *p = (conv_plan *)td_calloc(1, sizeof *p);
    node->gpu = p; // set first: release cleans up after a partial build
    p->g = g;
    conv_key *k = &p->full;
    k->n = node->max_n;
    k->c = node->in_shape[0].c;
    k->h = node->in_shape[0].h;
    k->w = node->in_shape[0].w;
    k->o = (int)td_node_arg(node, "out_channels");
    k->k = (int)td_node_arg(node, "kernel_size");
    k->s = (int)td_node_arg(node, "stride");
    k->p = (int)td_node_arg(node, "padding");
    k->prec = g->prec;
    p->oh = node->out_shape.h;
    p->ow = node->out_shape.w;
    p->bias = td_node_arg(node, "bias") != 0;
    if (k->o != node->out_shape.c || p->oh != (k->h + 2 * k->p - k->k) / k->s + 1 ||
        p->ow != (k->w + 2 * k->p - k->k) / k->s + 1)
        return td_fail(err, "conv2d: the node's output shape does not match its arguments");
    p->dtype = td_gpu_cudnn_type(g->prec);
    // The 1x1 shortcut hands the weight (and in fp32 the gradient) to cuDNN in place, which
    // wants 16-byte aligned tensors: the blocks are cudaMalloc'ed, so that is an offset that is
    // a multiple of 8 floats (16 bytes of the 16-bit copy, 32 of fp32).
    p->direct_w = k->k == 1 && node->params[0]->offset % 8 == 0;
    p->stage_dw = !(p->direct_w && g->prec == TD_PREC_FP32);
    p->w_elems = (size_t)k->o * k->k * k->k * k->c;
    size_t elem = td_gpu_elem(g->prec);
    p->dw_bytes = p->stage_dw ? (p->w_elems * elem + CONV_ALIGN - 1) / CONV_ALIGN * CONV_ALIGN : 0;

    size_t ws_max = 0;
    if (conv_build_plan(p, &ws_max) != 0) return td_fail(err, "%s", g->msg);

    node->saved_bytes = p->direct_w ? 0 : p->w_elems * elem; // the KRSC weight copy
    size_t rows = (size_t)k->n * p->oh * p->ow;
    size_t bias_bytes = p->bias ? (size_t)conv_bias_tiles(rows, k->o) * k->o * sizeof(float) : 0;
    size_t need = p->dw_bytes + ws_max;
    if (bias_bytes > need) need = bias_bytes; // the bias partials run before cuDNN's calls
    node->scratch_floats = (CONV_ALIGN + need + sizeof(float) - 1) / sizeof(float);
    return 0;
}

static void conv_forward(td_gpu *g, td_node *node, const td_gpu_run *run) {
    conv_plan *p = (conv_plan *)node->gpu;
    TD_CUDNN(g, cudnnSetStream(g->dnn, run->stream));
    conv_slot *s = slot_for(p, run->n);
    if (!s) return;
    const td_param *wp = node->params[0];
    const void *wk = p->direct_w ? td_gpu_weight(g, wp) : node->saved;
    TD_GPU_CHECK_IMPL(g, ((uintptr_t)wk & 15) == 0, "conv2d", "the weight is not 16-byte aligned",
                      "the parameter blocks are expected to be cudaMalloc'ed", TD_NOTHING);
    if (!p->direct_w) {
        int C = p->full.c, KK = p->full.k * p->full.k;
        TD_GPU_DISPATCH(
            g->prec, T,
            launch_weight_krsc<T>(wp->dev_data, node->saved, p->w_elems, C, KK, run->stream));
        TD_LAUNCHED(g);
    }
    size_t have;
    char *ws = conv_workspace(p, &have);
    if (ws) ws += p->dw_bytes;
    const conv_choice *c = &s->pass[PASS_FWD];
    float one = 1.0f, zero = 0.0f;
    TD_CUDNN(g, cudnnSetConvolutionMathType(p->conv, c->math));
    TD_CUDNN(g, cudnnConvolutionForward(g->dnn, &one, s->x, node->in[0], p->w, wk, p->conv,
                                        (cudnnConvolutionFwdAlgo_t)c->algo, c->ws ? ws : NULL,
                                        c->ws, &zero, s->y, node->out));
    if (p->bias) {
        size_t rows = (size_t)run->n * p->oh * p->ow;
        const float *b = node->params[1]->dev_data;
        TD_GPU_DISPATCH(g->prec, T, launch_add_bias<T>(node->out, b, rows, p->full.o, run->stream));
        TD_LAUNCHED(g);
    }
}

static void conv_backward(td_gpu *g, td_node *node, const td_gpu_run *run) {
    conv_plan *p = (conv_plan *)node->gpu;
    TD_CUDNN(g, cudnnSetStream(g->dnn, run->stream));
    conv_slot *s = slot_for(p, run->n);
    if (!s) return;
    size_t have;
    char *base = conv_workspace(p, &have);
    char *ws = base ? base + p->dw_bytes : NULL;
    float one = 1.0f;
    bool acc = run->accumulate_grads;
    int O = p->full.o;

    if (p->bias) { // first: its partial sums borrow the workspace cuDNN uses next
        size_t rows = (size_t)run->n * p->oh * p->ow;
        int tiles = conv_bias_tiles(rows, O);
        float *part = (float *)base;
        TD_GPU_DISPATCH(g->prec, T,
                        launch_bias_partial<T>(node->grad, rows, O, tiles, part, run->stream));
        TD_LAUNCHED(g);
        conv_bias_finalize<<<(unsigned)((O + CB_TX - 1) / CB_TX), dim3(CB_TX, CB_FY), 0,
                             run->stream>>>(part, tiles, O, node->params[1]->dev_grad, acc);
        TD_LAUNCHED(g);
    }

    const td_param *wp = node->params[0];
    if (node->in_grad[0]) {
        const void *wk = p->direct_w ? td_gpu_weight(g, wp) : node->saved;
        const conv_choice *c = &s->pass[PASS_BWD_DATA];
        float beta = node->in_grad_add[0] ? 1.0f : 0.0f;
        TD_CUDNN(g, cudnnSetConvolutionMathType(p->conv, c->math));
        TD_CUDNN(g, cudnnConvolutionBackwardData(g->dnn, &one, p->w, wk, s->y, node->grad, p->conv,
                                                 (cudnnConvolutionBwdDataAlgo_t)c->algo,
                                                 c->ws ? ws : NULL, c->ws, &beta, s->x,
                                                 node->in_grad[0]));
    }

    // fp32 1x1: straight into the gradient block (beta adds); otherwise KRSC staging, then added
    const conv_choice *c = &s->pass[PASS_BWD_FILTER];
    void *dw = p->stage_dw ? (void *)base : (void *)wp->dev_grad;
    float fbeta = !p->stage_dw && acc ? 1.0f : 0.0f;
    TD_CUDNN(g, cudnnSetConvolutionMathType(p->conv, c->math));
    TD_CUDNN(g, cudnnConvolutionBackwardFilter(g->dnn, &one, s->x, node->in[0], s->y, node->grad,
                                               p->conv, (cudnnConvolutionBwdFilterAlgo_t)c->algo,
                                               c->ws ? ws : NULL, c->ws, &fbeta, p->w, dw));
    if (p->stage_dw) {
        int C = p->full.c, KK = p->full.k * p->full.k;
        TD_GPU_DISPATCH(
            g->prec, T,
            launch_grad_oihw<T>(base, wp->dev_grad, p->w_elems, C, KK, acc, run->stream));
        TD_LAUNCHED(g);
    }
}

extern "C" const td_gpu_op td_gpu_op_conv2d = {&td_op_conv2d, conv_plan_node, conv_forward,
                                               conv_backward, conv_release};
