// Conv2d's choice of cuDNN algorithms (td_gpu_conv.cu has the kernels and the op).
//
// Algorithms are chosen once at plan time from cuDNN's heuristics for the full batch (no
// buffers exist yet, so no benchmarking): the first candidate whose workspace is at most
// CONV_WS_LIMIT, only deterministic ones unless train.deterministic is false. The ranked
// candidates are kept; a smaller last batch re-queries the workspace of the chosen algorithm and
// walks the ranking when it no longer fits the shared workspace. Choices live in two slots keyed
// by the full shape (the batch size and the largest other batch size seen last).
//
// With train.cudnn_benchmark, td_gpu_conv_benchmark then times cuDNN's algorithms on the node's
// own buffers at the full batch and keeps the fastest that qualify.
#include "gpu/cuda/td_gpu_conv.h"

#include <stdio.h>

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

int td_gpu_conv_build_plan(conv_plan *p, size_t *ws_max) {
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

char *td_gpu_conv_workspace(const conv_plan *p, size_t *bytes) {
    const td_gpu *g = p->g;
    uintptr_t base = (uintptr_t)g->workspace;
    uintptr_t al = (base + CONV_ALIGN - 1) / CONV_ALIGN * CONV_ALIGN;
    size_t skip = (size_t)(al - base) + p->dw_bytes;
    *bytes = g->workspace && g->workspace_bytes > skip ? g->workspace_bytes - skip : 0;
    return g->workspace ? (char *)al : NULL;
}

conv_slot *td_gpu_conv_slot_for(conv_plan *p, int n) {
    size_t have;
    td_gpu_conv_workspace(p, &have);
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
    char *base = td_gpu_conv_workspace(p, &have);
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
