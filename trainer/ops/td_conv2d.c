/* Conv2d over channels-last activations, weights OIHW as in torch.nn.Conv2d.
 *
 * im2col + GEMM through OpenBLAS, with the batch's pixels as the GEMM rows:
 *   Y [P, O] = Col [P, K*K*C + 1] x Wp^T
 * Col's columns run (kh, kw, c), so each window row is one contiguous run of K*C input floats
 * (channels last), and end in a constant 1 whose weight is the bias: the bias add and its
 * gradient come out of the same GEMMs. Wp is the weight repacked into that order, rebuilt at
 * every forward (it changes with every optimizer step and is tiny next to the activations).
 * Images are processed in chunks whose Col fits in L2; backward recomputes Col rather than
 * keeping it (ResNet-sized columns would dwarf the activations). A 1x1 stride-1 unpadded
 * convolution needs no Col at all: channels-last X already is [P, C].
 */
#include "ops/td_conv1ch.h"
#include "core/td_model.h"
#include "ops/td_ops_isa.h"
#include "core/td_simd.h"
#include "ops/td_gemm.h"
#include "ops/td_skinny.h"
#include "ops/td_winograd.h"
#include "core/td_parallel.h"

#include <math.h>
#include <omp.h>
#include <stddef.h>
#include <string.h>

enum { ARG_OUT_CHANNELS, ARG_KERNEL, ARG_STRIDE, ARG_PADDING, ARG_BIAS, ARG_INIT, ARG_ALGO };
enum { ALGO_AUTO, ALGO_IM2COL, ALGO_WINOGRAD };

/* About 256 KiB of Col per chunk: it stays in L2 between im2col and the GEMM that reads it.
 * But never fewer than CONV_CHUNK_ROWS rows: OpenBLAS packs the whole weight for every call, and
 * deep layers (ResNet's layer4: 16 pixels per image, a 512x4608 weight) would repack 9 MB of
 * weights for every image. */
#define CONV_CHUNK_FLOATS (64 * 1024)
#define CONV_CHUNK_ROWS   1024
/* A training forward keeps the whole batch's Col for backward when it is at most this big, about
 * half an L2, so backward finds it there; larger layers recompute it chunk by chunk in backward,
 * from the input, which is far smaller. Keeping LeNet-5's conv2 Col (3.9 MB at batch 64) streamed
 * it through L3 and back: recomputing made one rank 3% faster and two ranks on two cores 19%
 * (medians of 6 interleaved runs on a Zen 4 VM, where the ranks share L3 and memory). */
#define CONV_KEEP_COL_BYTES (512u << 10)
/* dCol made at a time where td_skinny_nn makes it (no packing to pay for): 128 KiB, or one image */
#define DCOL_STEP_FLOATS (32 * 1024)

typedef struct conv_geom {
    int c, h, w;   /* input */
    int o, oh, ow; /* output */
    int k, s, p;
    int kkc;     /* window size */
    int cols;    /* Col's width: kkc + 1 (the bias column) */
    int chunk;   /* images per chunk */
    bool direct; /* 1x1, stride 1, no padding: X is Col */
    bool bias;
    bool keep_col; /* the training forward's Col is kept for backward */
    bool conv1ch;  /* single-channel direct kernels instead of im2col (td_conv1ch.h) */
    bool wino;     /* Winograd F(4x4, 3x3) instead of im2col (td_winograd.h) */
} conv_geom;

static conv_geom geom_of(const td_node *node, int max_n) {
    conv_geom g;
    g.c = node->in_shape[0].c;
    g.h = node->in_shape[0].h;
    g.w = node->in_shape[0].w;
    g.o = (int)node->args[ARG_OUT_CHANNELS];
    g.k = (int)node->args[ARG_KERNEL];
    g.s = (int)node->args[ARG_STRIDE];
    g.p = (int)node->args[ARG_PADDING];
    g.bias = node->args[ARG_BIAS] != 0;
    g.oh = (g.h + 2 * g.p - g.k) / g.s + 1;
    g.ow = (g.w + 2 * g.p - g.k) / g.s + 1;
    g.kkc = g.k * g.k * g.c;
    g.cols = g.kkc + 1;
    size_t per_image = (size_t)g.oh * g.ow * g.cols;
    g.chunk = (int)(CONV_CHUNK_FLOATS / per_image);
    int min_images = (CONV_CHUNK_ROWS + g.oh * g.ow - 1) / (g.oh * g.ow);
    if (g.chunk < min_images) g.chunk = min_images;
    g.direct = g.k == 1 && g.s == 1 && g.p == 0;
    g.conv1ch = td_conv1ch_fits(g.c, g.k, g.s, g.p, g.o);
    int algo = (int)node->args[ARG_ALGO];
    g.wino = algo == ALGO_WINOGRAD ||
             (algo == ALGO_AUTO && !g.conv1ch && td_wino_fits(g.c, g.o, g.k, g.s, g.p));
    g.keep_col = !g.direct && !g.conv1ch && !g.wino &&
                 (size_t)max_n * per_image * sizeof(float) <= CONV_KEEP_COL_BYTES;
    return g;
}

/* Scratch layout, one part per thread: Col, dCol (chunk-sized), dWp [O, cols] (each thread's
 * share of the weight gradient) and the skinny kernel's transposed weight. */
static size_t col_floats(const conv_geom *g) {
    return (size_t)g->chunk * g->oh * g->ow * g->cols;
}

static size_t thread_floats(const conv_geom *g) {
    return 2 * col_floats(g) + (size_t)g->o * g->cols + 16 * (size_t)g->cols;
}

/* Images per chunk for a batch of n on `threads` threads: never so many that a thread is left
 * without a chunk (ResNet's layer4 fits its whole batch in one). */
static int chunk_for(const conv_geom *g, int n, int threads) {
    int per_thread = (n + threads - 1) / threads;
    return g->chunk < per_thread ? g->chunk : per_thread;
}

static int conv_build(td_model *model, td_node *node, td_err *err) {
    td_shape in = node->in_shape[0];
    if (!in.spatial)
        return td_fail(err, "expects an image input [C, H, W] but its input is flat [%d]", in.c);
    int k = (int)node->args[ARG_KERNEL], p = (int)node->args[ARG_PADDING];
    if (in.h + 2 * p < k || in.w + 2 * p < k)
        return td_fail(err,
                       "kernel_size %d does not fit the input %dx%d with padding %d; the input "
                       "is too small for this layer (check the earlier strides and pools)",
                       k, in.h, in.w, p);
    conv_geom g = geom_of(node, model->max_n);
    if (node->args[ARG_ALGO] == ALGO_WINOGRAD && !td_wino_fits(g.c, g.o, g.k, g.s, g.p))
        return td_fail(err,
                       "\"algorithm\": \"winograd\" needs kernel_size 3, stride 1, padding at "
                       "most 2 and at least 16 input and output channels (this layer: kernel %d, "
                       "stride %d, padding %d, %d -> %d channels); use \"auto\"",
                       g.k, g.s, g.p, g.c, g.o);
    /* PyTorch's default, kaiming_uniform_(a=sqrt(5)), and its bias rule both reduce to a bound
     * of 1/sqrt(fan_in); torchvision's ResNets use kaiming_normal_(mode="fan_out") instead */
    float bound = 1.0f / sqrtf((float)g.kkc);
    td_init w_init = node->args[ARG_INIT] == 1
                         ? td_init_normal(sqrtf(2.0f / (float)(g.o * g.k * g.k)))
                         : td_init_uniform(bound);
    td_model_add_param(model, node, "weight", 4, (int[]){g.o, g.c, g.k, g.k}, w_init);
    if (g.bias) td_model_add_param(model, node, "bias", 1, (int[]){g.o}, td_init_uniform(bound));
    node->out_shape = td_shape_image(g.o, g.oh, g.ow);
    if (g.wino) {
        td_wino wg = td_wino_geom(model->max_n, g.h, g.w, g.c, g.o, g.p);
        node->scratch_floats = td_wino_scratch_floats(&wg, model->threads);
    } else if (!g.direct) {
        /* Wp, then the kept Col */
        node->saved_bytes = (size_t)g.o * g.cols * sizeof(float);
        if (g.keep_col)
            node->saved_bytes += (size_t)model->max_n * g.oh * g.ow * g.cols * sizeof(float);
        node->scratch_floats = (size_t)model->threads * thread_floats(&g);
    }
    return 0;
}

/* Wp [O, (kh, kw, c) | bias] from W [O, C, KH, KW] and b. */
static void pack_weight(const conv_geom *g, const float *w, const float *b, float *wp) {
    int kk = g->k * g->k;
    for (int o = 0; o < g->o; o++) {
        float *dst = wp + (size_t)o * g->cols;
        const float *src = w + (size_t)o * g->kkc;
        for (int c = 0; c < g->c; c++)
            for (int q = 0; q < kk; q++) dst[q * g->c + c] = src[c * kk + q];
        dst[g->kkc] = b ? b[o] : 0.0f;
    }
}

/* The transpose of pack_weight for gradients: dW (+)= unpack(dWp), db (+)= its last column. */
static void unpack_grad(const conv_geom *g, const float *dwp, float *dw, float *db, bool add) {
    int kk = g->k * g->k;
    for (int o = 0; o < g->o; o++) {
        const float *src = dwp + (size_t)o * g->cols;
        float *dst = dw + (size_t)o * g->kkc;
        for (int c = 0; c < g->c; c++)
            for (int q = 0; q < kk; q++)
                dst[c * kk + q] = (add ? dst[c * kk + q] : 0.0f) + src[q * g->c + c];
        if (db) db[o] = (add ? db[o] : 0.0f) + src[g->kkc];
    }
}

/* One window row that hangs over the left or right padding. */
static void im2col_edge(float *dst, const float *src, int ow, int C, int W, int K, int S, int P) {
    int iw0 = ow * S - P;
    for (int kw = 0; kw < K; kw++) {
        int iw = iw0 + kw;
        if (iw < 0 || iw >= W)
            memset(dst + kw * C, 0, (size_t)C * sizeof(float));
        else
            td_copy_run(dst + kw * C, src + (size_t)iw * C, C);
    }
}

/* Col rows for nb images: the window of output pixel (oh, ow), zero over the padding, then 1.
 * The loops run kh outside ow so that each (image, output row, kh) reads one input row, and the
 * geometry sits in locals: the compiler cannot keep struct fields in registers across stores. */
static void im2col(const conv_geom *g, const float *x, int nb, float *col) {
    const int C = g->c, H = g->h, W = g->w, K = g->k, S = g->s, P = g->p;
    const int OH = g->oh, OW = g->ow, kc = K * C, cols = g->cols, kkc = g->kkc;
    for (int b = 0; b < nb; b++)
        for (int oh = 0; oh < OH; oh++) {
            float *rows = col + (size_t)(b * OH + oh) * OW * cols;
            for (int kh = 0; kh < K; kh++) {
                int ih = oh * S - P + kh;
                float *dst = rows + kh * kc;
                if (ih < 0 || ih >= H) {
                    for (int ow = 0; ow < OW; ow++, dst += cols)
                        memset(dst, 0, (size_t)kc * sizeof(float));
                    continue;
                }
                const float *src = x + (size_t)(b * H + ih) * W * C;
                /* output columns whose window lies inside the row take one contiguous run each;
                 * the few at the edges go through the padding-aware copy */
                int lo = (P + S - 1) / S, hi = (W - K + P) / S; /* inclusive */
                if (hi >= OW) hi = OW - 1;
                if (lo > hi) lo = OW, hi = OW - 1; /* no window lies inside */
                for (int ow = 0; ow < lo; ow++)
                    im2col_edge(dst + (size_t)ow * cols, src, ow, C, W, K, S, P);
                const float *first = lo <= hi ? src + (size_t)(lo * S - P) * C : src;
                if (kc <= 32)
                    td_copy_runs32(dst + (size_t)lo * cols, (size_t)cols, first, (size_t)S * C, kc,
                                   hi - lo + 1);
                else
                    for (int ow = lo; ow <= hi; ow++)
                        td_copy_run(dst + (size_t)ow * cols, first + (size_t)(ow - lo) * S * C, kc);
                for (int ow = hi + 1; ow < OW; ow++)
                    im2col_edge(dst + (size_t)ow * cols, src, ow, C, W, K, S, P);
            }
            for (int ow = 0; ow < OW; ow++) rows[(size_t)ow * cols + kkc] = 1.0f;
        }
}

/* Stride 1: the taps reaching input pixel (ih, iw) are kh in [kh_lo, kh_hi] (output row
 * oh = ih + P - kh) and kw in [kw_lo, kw_hi]; within one kh their dCol entries lie a constant
 * C - kkc floats apart, so the inner loop is a strided sum, split over two accumulators. */
static void col2im_stride1(const conv_geom *g, const float *dcol, int nb, float *dx, bool add) {
    const int C = g->c, H = g->h, W = g->w, K = g->k, P = g->p;
    const int OH = g->oh, OW = g->ow, kc = K * C, kkc = g->kkc;
    const ptrdiff_t step = C - kkc;
    for (int b = 0; b < nb; b++)
        for (int ih = 0; ih < H; ih++) {
            int kh_lo = ih + P - (OH - 1) > 0 ? ih + P - (OH - 1) : 0;
            int kh_hi = ih + P < K - 1 ? ih + P : K - 1;
            for (int iw = 0; iw < W; iw++) {
                int kw_lo = iw + P - (OW - 1) > 0 ? iw + P - (OW - 1) : 0;
                int kw_hi = iw + P < K - 1 ? iw + P : K - 1;
                float *dst = dx + ((size_t)(b * H + ih) * W + iw) * C;
                for (int c0 = 0; c0 < C; c0 += 16) {
                    int n = C - c0 < 16 ? C - c0 : 16;
                    td_acc16 even = td_acc16_zero(), odd = td_acc16_zero();
                    for (int kh = kh_lo; kh <= kh_hi; kh++) {
                        int oh = ih + P - kh;
                        /* the entry of tap kw: output column iw + P - kw, column kh·kc + kw·C */
                        const float *tap = dcol + ((size_t)(b * OH + oh) * OW + iw + P) * kkc +
                                           kh * kc + c0 + (ptrdiff_t)kw_lo * step;
                        int kw = kw_lo;
                        for (; kw + 1 <= kw_hi; kw += 2, tap += 2 * step) {
                            even = td_acc16_add(even, tap, n);
                            odd = td_acc16_add(odd, tap + step, n);
                        }
                        if (kw <= kw_hi) even = td_acc16_add(even, tap, n);
                    }
                    td_acc16_store(dst + c0, td_acc16_sum(even, odd), n, add);
                }
            }
        }
}

/* The adjoint of im2col (without the bias column): dx (+)= the sum, for every input pixel, of
 * the dCol [rows, kkc] entries that copied it. Written as a gather per input pixel, summed in
 * registers and stored once: scattering each window back instead makes neighbouring windows
 * read what a masked store just wrote, which the CPU cannot forward and stalls on. */
static void col2im(const conv_geom *g, const float *dcol, int nb, float *dx, bool add) {
    if (g->s == 1) {
        col2im_stride1(g, dcol, nb, dx, add);
        return;
    }
    const int C = g->c, H = g->h, W = g->w, K = g->k, S = g->s, P = g->p;
    const int OH = g->oh, OW = g->ow, kc = K * C, kkc = g->kkc;
    for (int b = 0; b < nb; b++)
        for (int ih = 0; ih < H; ih++) {
            /* the kh that reach row ih: ih + P - kh = S·oh, so kh steps by S from (ih+P) mod S,
             * and oh falls by one each step (one division per row, not per element) */
            int kh0 = (ih + P) % S, oh0 = (ih + P - kh0) / S;
            for (int iw = 0; iw < W; iw++) {
                int kw0 = (iw + P) % S, ow0 = (iw + P - kw0) / S;
                float *dst = dx + ((size_t)(b * H + ih) * W + iw) * C;
                for (int c0 = 0; c0 < C; c0 += 16) {
                    int n = C - c0 < 16 ? C - c0 : 16;
                    td_acc16 acc = td_acc16_zero();
                    for (int kh = kh0, oh = oh0; kh < K && oh >= 0; kh += S, oh--) {
                        if (oh >= OH) continue;
                        const float *row = dcol + (size_t)(b * OH + oh) * OW * kkc + kh * kc + c0;
                        for (int kw = kw0, ow = ow0; kw < K && ow >= 0; kw += S, ow--)
                            if (ow < OW)
                                acc = td_acc16_add(acc, row + (size_t)ow * kkc + kw * C, n);
                    }
                    td_acc16_store(dst + c0, acc, n, add);
                }
            }
        }
}

static void conv_forward(td_node *node, const td_run *run) {
    conv_geom g = geom_of(node, node->max_n);
    const float *w = node->params[0]->data;
    const float *b = g.bias ? node->params[1]->data : NULL;
    size_t out_pix = (size_t)g.oh * g.ow, in_size = (size_t)g.h * g.w * g.c;
    if (g.wino) {
        td_wino wg = td_wino_geom(run->n, g.h, g.w, g.c, g.o, g.p);
        td_wino_forward(&wg, node->in[0], w, b, node->out, false, run->scratch, node->threads);
        return;
    }
    if (g.direct) {
        size_t rows = (size_t)run->n * out_pix;
        if (b) td_fill_rows(node->out, b, rows, (size_t)g.o);
        td_sgemm(node->threads, false, true, (int)rows, g.o, g.c, node->in[0], g.c, w, g.c,
                 node->out, g.o, b != NULL);
        return;
    }
    float *wp = node->saved;
    pack_weight(&g, w, b, wp);
    bool keep = g.keep_col && run->training;
    float *kept = wp + (size_t)g.o * g.cols;
    int chunk = chunk_for(&g, run->n, node->threads);
    int chunks = (run->n + chunk - 1) / chunk;
#pragma omp parallel for num_threads(node->threads) if (node->threads > 1) schedule(static)
    for (int k = 0; k < chunks; k++) {
        int b0 = k * chunk, nb = run->n - b0 < chunk ? run->n - b0 : chunk;
        float *mine = run->scratch + (size_t)omp_get_thread_num() * thread_floats(&g);
        float *y = node->out + b0 * out_pix * g.o;
        if (g.conv1ch) {
            td_conv1ch_forward(nb, g.h, g.w, g.k, g.o, node->in[0] + b0 * in_size, wp, y, mine);
            continue;
        }
        float *col = keep ? kept + b0 * out_pix * g.cols : mine;
        im2col(&g, node->in[0] + b0 * in_size, nb, col);
        float *wt = mine + 2 * col_floats(&g) + (size_t)g.o * g.cols;
        if (!td_skinny_nt((int)(nb * out_pix), g.o, g.cols, col, wp, y, wt))
            td_sgemm(1, false, true, (int)(nb * out_pix), g.o, g.cols, col, g.cols, wp, g.cols, y,
                     g.o, false);
    }
}

/* db [o] (+)= the column sums of dy [rows, o]: for the paths whose GEMMs have no bias column */
static void bias_grad(const float *dy, size_t rows, int o, float *db, bool add) {
    if (!add) memset(db, 0, (size_t)o * sizeof(float));
    for (size_t r = 0; r < rows; r++)
        for (int k = 0; k < o; k++) db[k] += dy[r * o + k];
}

static void conv_backward_direct(const conv_geom *g, td_node *node, const td_run *run) {
    int rows = run->n * g->oh * g->ow;
    const float *dy = node->grad;
    bool acc = run->accumulate_grads;
    td_sgemm(node->threads, true, false, g->o, g->c, rows, dy, g->o, node->in[0], g->c,
             node->params[0]->grad, g->c, acc);
    if (g->bias) bias_grad(dy, (size_t)rows, g->o, node->params[1]->grad, acc);
    if (node->in_grad[0])
        td_sgemm(node->threads, false, false, rows, g->c, g->o, dy, g->o, node->params[0]->data,
                 g->c, node->in_grad[0], g->c, node->in_grad_add[0]);
}

static void conv_backward_wino(const conv_geom *g, td_node *node, const td_run *run) {
    td_wino wg = td_wino_geom(run->n, g->h, g->w, g->c, g->o, g->p);
    bool acc = run->accumulate_grads;
    td_wino_backward(&wg, node->in[0], node->params[0]->data, node->grad, node->params[0]->grad,
                     acc, node->in_grad[0], node->in_grad_add[0], run->scratch, node->threads);
    if (g->bias)
        bias_grad(node->grad, (size_t)run->n * g->oh * g->ow, g->o, node->params[1]->grad, acc);
}

static void conv_backward(td_node *node, const td_run *run) {
    conv_geom g = geom_of(node, node->max_n);
    if (g.wino) {
        conv_backward_wino(&g, node, run);
        return;
    }
    if (g.direct) {
        conv_backward_direct(&g, node, run);
        return;
    }
    size_t out_pix = (size_t)g.oh * g.ow, in_size = (size_t)g.h * g.w * g.c;
    const float *dy = node->grad, *wp = node->saved;
    float *dx = node->in_grad[0];
    int chunk = chunk_for(&g, run->n, node->threads);
    int chunks = (run->n + chunk - 1) / chunk;
    int threads = node->threads < chunks ? node->threads : chunks;
    /* each thread sums its run of chunks' weight gradient into its own dWp, added up below in
     * thread order (at most one thread per chunk, so none is left without) */
    int team = 1;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        int me = omp_get_thread_num();
        if (me == 0) team = omp_get_num_threads();
        float *col = run->scratch + (size_t)me * thread_floats(&g), *dcol = col + col_floats(&g);
        float *dwp = dcol + col_floats(&g);
        size_t lo, hi;
        td_par_range((size_t)chunks, omp_get_num_threads(), me, 1, &lo, &hi);
        for (int k = (int)lo; k < (int)hi; k++) {
            int b0 = k * chunk, nb = run->n - b0 < chunk ? run->n - b0 : chunk;
            int rows = (int)(nb * out_pix);
            bool add = k > (int)lo;
            const float *dyc = dy + b0 * out_pix * g.o, *xc = node->in[0] + b0 * in_size;
            if (g.conv1ch) {
                td_conv1ch_wgrad(nb, g.h, g.w, g.k, g.o, xc, dyc, dwp, add);
            } else {
                const float *c = col;
                if (g.keep_col)
                    c = (const float *)wp + (size_t)g.o * g.cols + b0 * out_pix * g.cols;
                else
                    im2col(&g, xc, nb, col);
                /* dWp [O, cols] (+)= dY^T [O, rows] x Col [rows, cols]; the last column is db */
                if (!td_skinny_tn(rows, g.o, g.cols, dyc, c, dwp, add))
                    td_sgemm(1, true, false, g.o, g.cols, rows, dyc, g.o, c, g.cols, dwp, g.cols,
                             add);
            }
            if (dx) {
                /* dCol [rows, kkc] = dY [rows, O] x Wp[:, :kkc]: by td_skinny_nn a few images at
                 * a time, so that col2im reads dCol from L2; where this variant or shape has no
                 * skinny kernel (it declines the first piece), by OpenBLAS for the whole chunk */
                int step = (int)(DCOL_STEP_FLOATS / (out_pix * g.kkc)), i = 0;
                step = step < 1 ? 1 : step > nb ? nb : step;
                for (int ni; i < nb; i += ni) {
                    ni = nb - i < step ? nb - i : step;
                    if (!td_skinny_nn((int)(ni * out_pix), g.kkc, g.o, dyc + i * out_pix * g.o, wp,
                                      g.cols, dcol, g.kkc, false))
                        break;
                    col2im(&g, dcol, ni, dx + (b0 + i) * in_size, node->in_grad_add[0]);
                }
                if (i == 0) {
                    td_sgemm(1, false, false, rows, g.kkc, g.o, dyc, g.o, wp, g.cols, dcol, g.kkc,
                             false);
                    col2im(&g, dcol, nb, dx + b0 * in_size, node->in_grad_add[0]);
                }
            }
        }
    }
    float *dwp = run->scratch + 2 * col_floats(&g);
    size_t dwp_floats = (size_t)g.o * g.cols;
    for (int t = 1; t < team; t++) {
        const float *other = dwp + (size_t)t * thread_floats(&g);
        for (size_t i = 0; i < dwp_floats; i++) dwp[i] += other[i];
    }
    unpack_grad(&g, dwp, node->params[0]->grad, g.bias ? node->params[1]->grad : NULL,
                run->accumulate_grads);
}

const td_op TD_ISA_SYM(td_op_conv2d) = {
    &td_op_sig_conv2d, conv_build, conv_forward, conv_backward, TD_OP_VARIANTS(conv2d), 0};
