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
// Algorithms. td_gpu_conv_algo.cu chooses them (cuDNN's heuristics at plan time, or its timings
// under train.cudnn_benchmark); td_gpu_conv.h holds what the two files share.
#include "gpu/cuda/td_gpu_conv.h"

#include <stdlib.h>

#define CB_TX       32   // channels per block (bias kernels)
#define CB_TY       8    // row lanes per block
#define CB_FY       16   // tile lanes in the finalize kernel
#define CB_TARGET   1024 // blocks the bias-gradient partial kernel aims for
#define CB_MIN_ROWS 64   // rows per tile at least

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
    if (td_gpu_conv_build_plan(p, &ws_max) != 0) return td_fail(err, "%s", g->msg);

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
    conv_slot *s = td_gpu_conv_slot_for(p, run->n);
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
    char *ws = td_gpu_conv_workspace(p, &have);
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
    conv_slot *s = td_gpu_conv_slot_for(p, run->n);
    if (!s) return;
    size_t have;
    char *base = td_gpu_conv_workspace(p, &have);
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
