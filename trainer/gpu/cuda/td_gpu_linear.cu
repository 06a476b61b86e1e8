// Linear on the GPU: y = x W^T + b through cuBLASLt, the bias fused into the forward GEMM's
// epilogue; backward is two more GEMMs (dW, dx) and a column sum of dy for db.
//
// Row-major tensors seen by column-major cuBLAS: a row-major [r, c] matrix with leading
// dimension c is the column-major [c, r] matrix, its transpose, with the same ld. So
//   x  [n, in]   is X' = x^T  (in x n,  ld in)
//   W  [out, in] is W' = W^T  (in x out, ld in)
//   y  [n, out]  is Y' = y^T  (out x n, ld out), and dy, dx alike
// and every product is written for the transposes:
//   forward  y^T  = W x^T        ->  Y'  = op_T(W') * X'         (m out, n n,   k in)
//   dgrad    dx^T = W^T dy^T     ->  dX' = W' * dY'              (m in,  n n,   k out)
//   wgrad    dW^T = x^T dy       ->  dW' = X' * op_T(dY')        (m in,  n out, k n)
// dW' [in x out, ld in] is exactly the row-major dW [out, in] that the gradient block holds.
// The bias epilogue adds a vector over D's rows (m = out): the bias per output feature.
//
// Compute type is CUBLAS_COMPUTE_32F for every precision: fp32 inputs then run true fp32
// kernels (TF32 only comes with CUBLAS_COMPUTE_32F_FAST_TF32, which would break parity with the
// CPU), and 16-bit inputs accumulate in fp32. The weight gradient is produced in fp32 straight
// from the 16-bit operands (C/D of type CUDA_R_32F), so no 16-bit rounding of dW.
//
// Heuristic results depend on n and on the operands' alignment (cuBLASLt assumes 256-byte
// aligned buffers unless told otherwise, and 16-bit weights at odd float offsets of the
// parameter block are only 2-byte aligned). They are queried on first use and cached in two
// slots, n == max_n and the latest other n, each remembering the alignments it was asked for;
// node pointers never move, so after the first step every call is a cache hit.
#include "gpu/cuda/td_gpu_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// Hopper's recommended cuBLASLt workspace.
#define LIN_WORKSPACE_BYTES ((size_t)32 << 20)
// The shared workspace is only 64-byte aligned (the arena's rule); cuBLASLt wants 256.
#define LIN_WS_ALIGN 256

enum { PASS_FWD, PASS_DGRAD, PASS_WGRAD, PASS_COUNT };

typedef struct lin_algo {
    bool ready;
    uint64_t align_key; // operand alignments the heuristic was asked for (see align_key)
    bool fused_bias;    // forward: the bias epilogue had an algorithm
    cublasLtMatmulAlgo_t algo;
    size_t ws;
} lin_algo;

typedef struct lin_slot {
    int n;                       // 0: unused
    cublasLtMatrixLayout_t x, y; // X' (in x n) and Y' (out x n), compute precision
    lin_algo pass[PASS_COUNT];
} lin_slot;

typedef struct lin_plan {
    td_gpu *g;
    int in, out, max_n; // max_n: rows of a full batch
    int per_sample;     // rows a sample: a sequence's positions (each [T, in] row alike), else 1
    bool bias;
    cudaDataType_t type;
    cublasLtMatmulDesc_t desc[PASS_COUNT];
    cublasLtMatmulDesc_t fwd_plain; // forward without the epilogue, when BIAS has no algorithm
    cublasLtMatrixLayout_t w, dw;   // W' in compute precision, dW' in fp32
    cublasLtMatmulPreference_t pref;
    lin_slot slot[2]; // [0]: max_n, [1]: the latest other n
} lin_plan;

// ---- kernels ----------------------------------------------------------------------------------

// db[o] (+)= sum over rows of dy[r, o]. Threads of a warp take consecutive columns (coalesced);
// the 32 row groups are then summed in a fixed order, so the result is the same at every run
// (no atomics). A linear's rows are the batch (a sequence's: batch × positions, a few thousand:
// one level still).
#define COLSUM_ROWS 32
template <typename T>
__global__ void lin_colsum(const T *__restrict__ dy, int rows, int cols, float *__restrict__ db,
                           bool add) {
    __shared__ float part[COLSUM_ROWS][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    float s = 0.0f;
    if (c < cols)
        for (int r = threadIdx.y; r < rows; r += COLSUM_ROWS)
            s += td_to_float(dy[(size_t)r * cols + c]);
    part[threadIdx.y][threadIdx.x] = s;
    __syncthreads();
    if (threadIdx.y == 0 && c < cols) {
        float t = 0.0f;
        for (int k = 0; k < COLSUM_ROWS; k++) t += part[k][threadIdx.x];
        db[c] = add ? db[c] + t : t;
    }
}

// y[r, o] += b[o]: only when cuBLASLt offers no algorithm with the bias epilogue.
template <typename T>
__global__ void lin_add_bias(T *__restrict__ y, const float *__restrict__ b, size_t total,
                             int cols) {
    TD_GRID_STRIDE(i, total) {
        y[i] = td_from_float<T>(td_to_float(y[i]) + b[i % (size_t)cols]);
    }
}

// Launchers, so that TD_GPU_DISPATCH's body has no bare commas.
template <typename T>
static void launch_colsum(const void *dy, int rows, int cols, float *db, bool add,
                          cudaStream_t stream) {
    dim3 block(32, COLSUM_ROWS), grid((unsigned)((cols + 31) / 32));
    lin_colsum<T><<<grid, block, 0, stream>>>((const T *)dy, rows, cols, db, add);
}
template <typename T>
static void launch_add_bias(void *y, const float *b, size_t total, int cols, cudaStream_t stream) {
    lin_add_bias<T><<<td_gpu_blocks(total, 256), 256, 0, stream>>>((T *)y, b, total, cols);
}

// ---- descriptors and algorithm cache ----------------------------------------------------------

// The largest power of two (at most 256) that divides the address.
static unsigned align_of(const void *p) {
    uintptr_t a = (uintptr_t)p;
    unsigned al = 1;
    while (al < 256 && !(a & al)) al <<= 1;
    return al;
}

static uint64_t align_key(const void *a, const void *b, const void *c, const void *d,
                          const void *bias) {
    uint64_t k = 0;
    const void *ptrs[5] = {a, b, c, d, bias};
    for (int i = 0; i < 5; i++) k = k * 512 + (ptrs[i] ? align_of(ptrs[i]) : 0);
    return k;
}

static int desc_create(lin_plan *p, cublasLtMatmulDesc_t *desc, cublasOperation_t ta,
                       cublasOperation_t tb, cublasLtEpilogue_t epi) {
    td_gpu *g = p->g;
    TD_CUBLAS_RET(g, cublasLtMatmulDescCreate(desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), -1);
    int32_t a = ta, b = tb;
    uint32_t e = epi;
    TD_CUBLAS_RET(
        g, cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSA, &a, sizeof a), -1);
    TD_CUBLAS_RET(
        g, cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_TRANSB, &b, sizeof b), -1);
    TD_CUBLAS_RET(
        g, cublasLtMatmulDescSetAttribute(*desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &e, sizeof e), -1);
    return 0;
}

// The slot for batch size n, its layouts set; its algorithms are dropped when n changes.
static lin_slot *slot_for(lin_plan *p, int n) {
    td_gpu *g = p->g;
    lin_slot *s = n == p->max_n ? &p->slot[0] : &p->slot[1];
    if (s->n == n) return s;
    uint64_t cols = (uint64_t)n;
    TD_CUBLAS_RET(
        g, cublasLtMatrixLayoutSetAttribute(s->x, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols),
        NULL);
    TD_CUBLAS_RET(
        g, cublasLtMatrixLayoutSetAttribute(s->y, CUBLASLT_MATRIX_LAYOUT_COLS, &cols, sizeof cols),
        NULL);
    s->n = n;
    for (int i = 0; i < PASS_COUNT; i++) s->pass[i].ready = false;
    return s;
}

// The workspace cuBLASLt gets: the shared one, rounded up to 256 bytes.
static void *lin_workspace(const td_gpu *g, size_t *bytes) {
    uintptr_t base = (uintptr_t)g->workspace;
    uintptr_t al = (base + LIN_WS_ALIGN - 1) / LIN_WS_ALIGN * LIN_WS_ALIGN;
    size_t skip = (size_t)(al - base);
    size_t have = g->workspace && g->workspace_bytes > skip ? g->workspace_bytes - skip : 0;
    *bytes = have < LIN_WORKSPACE_BYTES ? have : LIN_WORKSPACE_BYTES;
    return *bytes ? (void *)al : NULL;
}

// One heuristic query: 0 with *found telling whether cuBLASLt has an algorithm; -1 on failure.
static int query(lin_plan *p, cublasLtMatmulDesc_t desc, cublasLtMatrixLayout_t la,
                 cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const void *a, const void *b,
                 const void *c, size_t ws_cap, lin_algo *out, bool *found) {
    td_gpu *g = p->g;
    uint64_t cap = ws_cap;
    uint32_t al[4] = {align_of(a), align_of(b), align_of(c), align_of(c)};
    cublasLtMatmulPreferenceAttributes_t attr[4] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    TD_CUBLAS_RET(g,
                  cublasLtMatmulPreferenceSetAttribute(
                      p->pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &cap, sizeof cap),
                  -1);
    for (int i = 0; i < 4; i++)
        TD_CUBLAS_RET(
            g, cublasLtMatmulPreferenceSetAttribute(p->pref, attr[i], &al[i], sizeof al[i]), -1);
    cublasLtMatmulHeuristicResult_t r;
    memset(&r, 0, sizeof r);
    int count = 0;
    cublasStatus_t st =
        cublasLtMatmulAlgoGetHeuristic(g->lt, desc, la, lb, lc, lc, p->pref, 1, &r, &count);
    *found = st == CUBLAS_STATUS_SUCCESS && count > 0 && r.state == CUBLAS_STATUS_SUCCESS;
    if (st != CUBLAS_STATUS_SUCCESS && st != CUBLAS_STATUS_NOT_SUPPORTED) TD_CUBLAS_RET(g, st, -1);
    if (*found) {
        out->algo = r.algo;
        out->ws = r.workspaceSize;
    }
    return 0;
}

static void no_algorithm(lin_plan *p, const char *pass, int n) {
    char detail[192];
    snprintf(detail, sizeof detail, "no algorithm for the %s GEMM of linear %d -> %d at batch %d",
             pass, p->in, p->out, n);
    td_gpu_fail(p->g, __FILE__, __LINE__, "cublasLtMatmulAlgoGetHeuristic", detail,
                "report this layer shape; a different batch size or out_features may work");
}

// The cached algorithm of one pass, queried again when the operands' alignment differs from the
// one it was chosen for. NULL after recording a failure.
static const lin_algo *algo_for(lin_plan *p, lin_slot *s, int pass, cublasLtMatrixLayout_t la,
                                cublasLtMatrixLayout_t lb, cublasLtMatrixLayout_t lc, const void *a,
                                const void *b, const void *c, const void *bias, size_t ws_cap) {
    lin_algo *al = &s->pass[pass];
    uint64_t key = align_key(a, b, c, c, bias);
    if (al->ready && al->align_key == key) return al;
    al->ready = false;
    bool found = false;
    static const char *const names[PASS_COUNT] = {"forward", "input-gradient", "weight-gradient"};
    // A bias below 16-byte alignment (16-bit copies at odd offsets) goes through the plain GEMM
    // and a bias kernel: epilogues have been seen to reject such vectors at run time.
    bool try_fused = pass != PASS_FWD || !p->bias || align_of(bias) >= 16;
    if (try_fused && query(p, p->desc[pass], la, lb, lc, a, b, c, ws_cap, al, &found) != 0)
        return NULL;
    al->fused_bias = pass == PASS_FWD && p->bias && found;
    if (!found && pass == PASS_FWD && p->bias &&
        query(p, p->fwd_plain, la, lb, lc, a, b, c, ws_cap, al, &found) != 0)
        return NULL;
    if (!found) {
        no_algorithm(p, names[pass], s->n);
        return NULL;
    }
    al->align_key = key;
    al->ready = true;
    return al;
}

// ---- the op -----------------------------------------------------------------------------------

static void lin_release(td_node *node) {
    lin_plan *p = (lin_plan *)node->gpu;
    if (!p) return;
    for (int i = 0; i < 2; i++) {
        if (p->slot[i].x) cublasLtMatrixLayoutDestroy(p->slot[i].x);
        if (p->slot[i].y) cublasLtMatrixLayoutDestroy(p->slot[i].y);
    }
    for (int i = 0; i < PASS_COUNT; i++)
        if (p->desc[i]) cublasLtMatmulDescDestroy(p->desc[i]);
    if (p->fwd_plain) cublasLtMatmulDescDestroy(p->fwd_plain);
    if (p->w) cublasLtMatrixLayoutDestroy(p->w);
    if (p->dw) cublasLtMatrixLayoutDestroy(p->dw);
    if (p->pref) cublasLtMatmulPreferenceDestroy(p->pref);
    free(p);
    node->gpu = NULL;
}

static int lin_build(lin_plan *p) {
    td_gpu *g = p->g;
    TD_CUBLAS_RET(g, cublasLtMatmulPreferenceCreate(&p->pref), -1);
    if (desc_create(p, &p->desc[PASS_FWD], CUBLAS_OP_T, CUBLAS_OP_N,
                    p->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT) != 0 ||
        desc_create(p, &p->fwd_plain, CUBLAS_OP_T, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT) != 0 ||
        desc_create(p, &p->desc[PASS_DGRAD], CUBLAS_OP_N, CUBLAS_OP_N, CUBLASLT_EPILOGUE_DEFAULT) !=
            0 ||
        desc_create(p, &p->desc[PASS_WGRAD], CUBLAS_OP_N, CUBLAS_OP_T, CUBLASLT_EPILOGUE_DEFAULT) !=
            0)
        return -1;
    TD_CUBLAS_RET(g, cublasLtMatrixLayoutCreate(&p->w, p->type, p->in, p->out, p->in), -1);
    TD_CUBLAS_RET(g, cublasLtMatrixLayoutCreate(&p->dw, CUDA_R_32F, p->in, p->out, p->in), -1);
    for (int i = 0; i < 2; i++) {
        TD_CUBLAS_RET(g, cublasLtMatrixLayoutCreate(&p->slot[i].x, p->type, p->in, 1, p->in), -1);
        TD_CUBLAS_RET(g, cublasLtMatrixLayoutCreate(&p->slot[i].y, p->type, p->out, 1, p->out), -1);
        p->slot[i].n = 0;
    }
    return slot_for(p, p->max_n) ? 0 : -1;
}

static int lin_plan_node(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    (void)m;
    lin_plan *p = (lin_plan *)td_calloc(1, sizeof *p);
    node->gpu = p; // set first: release cleans up after a partial build
    p->g = g;
    p->in = node->in_shape[0].c;
    p->out = node->out_shape.c;
    // a sequence [T, in] is T rows of the same product, as nn.Linear applies to the last dim
    p->per_sample = td_shape_is_seq(node->in_shape[0]) ? node->in_shape[0].h : 1;
    p->max_n = node->max_n * p->per_sample;
    p->bias = node->n_params > 1;
    p->type = td_gpu_cuda_type(g->prec);
    if (lin_build(p) != 0) return td_fail(err, "%s", g->msg);
    node->saved_bytes = 0;
    node->scratch_floats = (LIN_WORKSPACE_BYTES + LIN_WS_ALIGN) / sizeof(float);
    return 0;
}

static void lin_forward(td_gpu *g, td_node *node, const td_gpu_run *run) {
    lin_plan *p = (lin_plan *)node->gpu;
    int rows = run->n * p->per_sample;
    lin_slot *s = slot_for(p, rows);
    if (!s) return;
    const void *w = td_gpu_weight(g, node->params[0]);
    const void *b = p->bias ? td_gpu_weight(g, node->params[1]) : NULL;
    const void *x = node->in[0];
    void *y = node->out;
    if (b) // heuristics read the bias pointer for its alignment, so it is set before the query
        TD_CUBLAS(g, cublasLtMatmulDescSetAttribute(
                         p->desc[PASS_FWD], CUBLASLT_MATMUL_DESC_BIAS_POINTER, &b, sizeof b));
    size_t ws_cap;
    void *ws = lin_workspace(g, &ws_cap);
    const lin_algo *al = algo_for(p, s, PASS_FWD, p->w, s->x, s->y, w, x, y, b, ws_cap);
    if (!al) return;
    float one = 1.0f, zero = 0.0f;
    cublasLtMatmulDesc_t desc = !p->bias || al->fused_bias ? p->desc[PASS_FWD] : p->fwd_plain;
    TD_CUBLAS(g, cublasLtMatmul(g->lt, desc, &one, w, p->w, x, s->x, &zero, y, s->y, y, s->y,
                                &al->algo, ws, al->ws, run->stream));
    if (p->bias && !al->fused_bias) {
        size_t total = (size_t)rows * p->out;
        const float *b32 = node->params[1]->dev_data;
        TD_GPU_DISPATCH(g->prec, T, launch_add_bias<T>(y, b32, total, p->out, run->stream));
        TD_LAUNCHED(g);
    }
}

static void lin_backward(td_gpu *g, td_node *node, const td_gpu_run *run) {
    lin_plan *p = (lin_plan *)node->gpu;
    int rows = run->n * p->per_sample;
    lin_slot *s = slot_for(p, rows);
    if (!s) return;
    const void *x = node->in[0], *dy = node->grad;
    float *dw = node->params[0]->dev_grad;
    size_t ws_cap;
    void *ws = lin_workspace(g, &ws_cap);
    float one = 1.0f;
    float pbeta = run->accumulate_grads ? 1.0f : 0.0f;

    const lin_algo *al = algo_for(p, s, PASS_WGRAD, s->x, s->y, p->dw, x, dy, dw, NULL, ws_cap);
    if (!al) return;
    TD_CUBLAS(g, cublasLtMatmul(g->lt, p->desc[PASS_WGRAD], &one, x, s->x, dy, s->y, &pbeta, dw,
                                p->dw, dw, p->dw, &al->algo, ws, al->ws, run->stream));
    if (p->bias) {
        float *db = node->params[1]->dev_grad;
        TD_GPU_DISPATCH(g->prec, T,
                        launch_colsum<T>(dy, rows, p->out, db, run->accumulate_grads, run->stream));
        TD_LAUNCHED(g);
    }
    void *dx = node->in_grad[0];
    if (dx) {
        const void *w = td_gpu_weight(g, node->params[0]);
        float beta = node->in_grad_add[0] ? 1.0f : 0.0f;
        al = algo_for(p, s, PASS_DGRAD, p->w, s->y, s->x, w, dy, dx, NULL, ws_cap);
        if (!al) return;
        TD_CUBLAS(g, cublasLtMatmul(g->lt, p->desc[PASS_DGRAD], &one, w, p->w, dy, s->y, &beta, dx,
                                    s->x, dx, s->x, &al->algo, ws, al->ws, run->stream));
    }
}

extern "C" const td_gpu_op td_gpu_op_linear = {&td_op_linear, lin_plan_node, lin_forward,
                                               lin_backward, lin_release};
