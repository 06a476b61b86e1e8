/* Conv2d over channels-last activations, weights OIHW as in torch.nn.Conv2d.
 *
 * im2col + GEMM through OpenBLAS. The batch's pixels are the GEMM rows: Y [P, O] = Col [P, CKK] x
 * W^T, where Col's columns follow the weight's own (c, kh, kw) order so W is used in place, with
 * no repacking. Images are processed in chunks whose Col fits in L2; backward recomputes Col
 * rather than keeping it (ResNet-sized columns would dwarf the activations). A 1x1 stride-1
 * unpadded convolution needs no Col at all: channels-last X already is [P, C].
 */
#include "td_model.h"

#include <cblas.h>
#include <math.h>
#include <string.h>

enum { ARG_OUT_CHANNELS, ARG_KERNEL, ARG_STRIDE, ARG_PADDING, ARG_BIAS };

static const td_op_arg conv_args[] = {
    {"out_channels", TD_ARG_INT, true, 0, 1, 1 << 16, NULL},
    {"kernel_size", TD_ARG_INT, true, 0, 1, 64, NULL},
    {"stride", TD_ARG_INT, false, 1, 1, 64, NULL},
    {"padding", TD_ARG_INT, false, 0, 0, 64, NULL},
    {"bias", TD_ARG_BOOL, false, 1, 0, 1, NULL},
    {0},
};

/* About 256 KiB of Col per chunk: it stays in L2 between im2col and the GEMM that reads it. */
#define CONV_CHUNK_FLOATS (64 * 1024)

typedef struct conv_geom {
    int c, h, w;    /* input */
    int o, oh, ow;  /* output */
    int k, s, p;
    int ckk;        /* columns of Col */
    int chunk;      /* images per chunk */
    bool direct;    /* 1x1, stride 1, no padding: X is Col */
} conv_geom;

static conv_geom geom_of(const td_node *node) {
    conv_geom g;
    g.c = node->in_shape[0].c;
    g.h = node->in_shape[0].h;
    g.w = node->in_shape[0].w;
    g.o = (int)node->args[ARG_OUT_CHANNELS];
    g.k = (int)node->args[ARG_KERNEL];
    g.s = (int)node->args[ARG_STRIDE];
    g.p = (int)node->args[ARG_PADDING];
    g.oh = (g.h + 2 * g.p - g.k) / g.s + 1;
    g.ow = (g.w + 2 * g.p - g.k) / g.s + 1;
    g.ckk = g.c * g.k * g.k;
    size_t per_image = (size_t)g.oh * g.ow * g.ckk;
    g.chunk = (int)(CONV_CHUNK_FLOATS / per_image);
    if (g.chunk < 1) g.chunk = 1;
    g.direct = g.k == 1 && g.s == 1 && g.p == 0;
    return g;
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
    conv_geom g = geom_of(node);
    float bound = 1.0f / sqrtf((float)g.ckk);
    td_model_add_param(model, node, "weight", 4, (int[]){g.o, g.c, g.k, g.k}, bound, 0);
    if (node->args[ARG_BIAS]) td_model_add_param(model, node, "bias", 1, (int[]){g.o}, bound, 0);
    node->out_shape = td_shape_image(g.o, g.oh, g.ow);
    node->scratch_floats = g.direct ? 0 : 2 * (size_t)g.chunk * g.oh * g.ow * g.ckk;
    return 0;
}

/* Col row for output pixel (b, oh, ow): x[b, oh*s-p+kh, ow*s-p+kw, c] at column c*k*k + kh*k + kw,
 * zero where the window hangs over the padding. */
static void im2col(const conv_geom *g, const float *x, int nb, float *col) {
    int kk = g->k * g->k;
    for (int b = 0; b < nb; b++)
        for (int oh = 0; oh < g->oh; oh++)
            for (int ow = 0; ow < g->ow; ow++) {
                float *row = col + ((size_t)(b * g->oh + oh) * g->ow + ow) * g->ckk;
                for (int kh = 0; kh < g->k; kh++) {
                    int ih = oh * g->s - g->p + kh;
                    int iw0 = ow * g->s - g->p;
                    if (ih < 0 || ih >= g->h) {
                        for (int c = 0; c < g->c; c++)
                            memset(row + c * kk + kh * g->k, 0, (size_t)g->k * 4);
                        continue;
                    }
                    const float *src = x + ((size_t)(b * g->h + ih) * g->w) * g->c;
                    if (g->c == 1 && iw0 >= 0 && iw0 + g->k <= g->w) {
                        /* single channel, window inside: one contiguous run */
                        memcpy(row + kh * g->k, src + iw0, (size_t)g->k * 4);
                        continue;
                    }
                    for (int kw = 0; kw < g->k; kw++) {
                        int iw = iw0 + kw;
                        float *dst = row + kh * g->k + kw;
                        if (iw < 0 || iw >= g->w) {
                            for (int c = 0; c < g->c; c++) dst[c * kk] = 0.0f;
                        } else {
                            const float *s = src + (size_t)iw * g->c;
                            for (int c = 0; c < g->c; c++) dst[c * kk] = s[c];
                        }
                    }
                }
            }
}

/* The adjoint of im2col: scatters Col gradients back, adding into dx. */
static void col2im(const conv_geom *g, const float *col, int nb, float *dx) {
    int kk = g->k * g->k;
    for (int b = 0; b < nb; b++)
        for (int oh = 0; oh < g->oh; oh++)
            for (int ow = 0; ow < g->ow; ow++) {
                const float *row = col + ((size_t)(b * g->oh + oh) * g->ow + ow) * g->ckk;
                for (int kh = 0; kh < g->k; kh++) {
                    int ih = oh * g->s - g->p + kh;
                    if (ih < 0 || ih >= g->h) continue;
                    float *dst = dx + ((size_t)(b * g->h + ih) * g->w) * g->c;
                    for (int kw = 0; kw < g->k; kw++) {
                        int iw = ow * g->s - g->p + kw;
                        if (iw < 0 || iw >= g->w) continue;
                        float *d = dst + (size_t)iw * g->c;
                        const float *src = row + kh * g->k + kw;
                        for (int c = 0; c < g->c; c++) d[c] += src[c * kk];
                    }
                }
            }
}

static void conv_forward(td_node *node, const td_run *run) {
    conv_geom g = geom_of(node);
    const float *w = node->params[0]->data;
    size_t out_pix = (size_t)g.oh * g.ow, in_size = (size_t)g.h * g.w * g.c;
    float beta = 0.0f;
    if (node->n_params > 1) {
        const float *bias = node->params[1]->data;
        size_t rows = (size_t)run->n * out_pix;
        for (size_t r = 0; r < rows; r++) memcpy(node->out + r * g.o, bias, (size_t)g.o * 4);
        beta = 1.0f;
    }
    if (g.direct) {
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(run->n * out_pix), g.o, g.c,
                    1.0f, node->in[0], g.c, w, g.c, beta, node->out, g.o);
        return;
    }
    for (int b0 = 0; b0 < run->n; b0 += g.chunk) {
        int nb = run->n - b0 < g.chunk ? run->n - b0 : g.chunk;
        im2col(&g, node->in[0] + b0 * in_size, nb, run->scratch);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, (int)(nb * out_pix), g.o, g.ckk, 1.0f,
                    run->scratch, g.ckk, w, g.ckk, beta, node->out + b0 * out_pix * g.o, g.o);
    }
}

static void conv_backward(td_node *node, const td_run *run) {
    conv_geom g = geom_of(node);
    size_t out_pix = (size_t)g.oh * g.ow, in_size = (size_t)g.h * g.w * g.c;
    const float *dy = node->grad, *w = node->params[0]->data;
    float *dw = node->params[0]->grad, *dx = node->in_grad[0];
    if (node->n_params > 1) {
        float *db = node->params[1]->grad;
        if (!run->accumulate_grads) memset(db, 0, (size_t)g.o * 4);
        size_t rows = (size_t)run->n * out_pix;
        for (size_t r = 0; r < rows; r++)
            for (int o = 0; o < g.o; o++) db[o] += dy[r * g.o + o];
    }
    if (g.direct) {
        int rows = (int)(run->n * out_pix);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g.o, g.c, rows, 1.0f, dy, g.o,
                    node->in[0], g.c, run->accumulate_grads ? 1.0f : 0.0f, dw, g.c);
        if (dx)
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, g.c, g.o, 1.0f, dy, g.o,
                        w, g.c, node->in_grad_add[0] ? 1.0f : 0.0f, dx, g.c);
        return;
    }
    if (dx && !node->in_grad_add[0]) memset(dx, 0, (size_t)run->n * in_size * 4);
    float *col = run->scratch;
    float *dcol = run->scratch + (size_t)g.chunk * out_pix * g.ckk;
    for (int b0 = 0; b0 < run->n; b0 += g.chunk) {
        int nb = run->n - b0 < g.chunk ? run->n - b0 : g.chunk;
        int rows = (int)(nb * out_pix);
        const float *dyc = dy + b0 * out_pix * g.o;
        im2col(&g, node->in[0] + b0 * in_size, nb, col);
        float beta = (b0 == 0 && !run->accumulate_grads) ? 0.0f : 1.0f;
        /* dW [O, CKK] += dY^T [O, rows] x Col [rows, CKK] */
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, g.o, g.ckk, rows, 1.0f, dyc, g.o, col,
                    g.ckk, beta, dw, g.ckk);
        if (dx) {
            /* dCol [rows, CKK] = dY [rows, O] x W [O, CKK] */
            cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, g.ckk, g.o, 1.0f, dyc,
                        g.o, w, g.ckk, 0.0f, dcol, g.ckk);
            col2im(&g, dcol, nb, dx + b0 * in_size);
        }
    }
}

const td_op td_op_conv2d = {"conv2d", 1, 1, conv_args, conv_build, conv_forward, conv_backward};
