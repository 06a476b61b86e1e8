/* Pooling over channels-last activations: MaxPool2d, AvgPool2d (torch.nn semantics, floor mode)
 * and global average pooling ([H, W, C] -> [C], i.e. AdaptiveAvgPool2d(1) followed by flatten).
 * The inner loops run over channels, which are contiguous. */
#include "core/td_model.h"
#include "ops/td_ops_isa.h"
#include "core/td_simd.h"

#include <math.h>
#include <stdint.h>
#include <string.h>

enum { ARG_KERNEL, ARG_STRIDE, ARG_PADDING, ARG_COUNT_INCLUDE_PAD };

/* stride 0 stands for "same as kernel_size", PyTorch's default */
typedef struct pool_geom {
    int c, h, w, oh, ow, k, s, p;
} pool_geom;

static pool_geom pool_geom_of(const td_node *node) {
    pool_geom g;
    g.c = node->in_shape[0].c;
    g.h = node->in_shape[0].h;
    g.w = node->in_shape[0].w;
    g.k = (int)node->args[ARG_KERNEL];
    g.s = node->args[ARG_STRIDE] > 0 ? (int)node->args[ARG_STRIDE] : g.k;
    g.p = (int)node->args[ARG_PADDING];
    g.oh = (g.h + 2 * g.p - g.k) / g.s + 1;
    g.ow = (g.w + 2 * g.p - g.k) / g.s + 1;
    return g;
}

static int pool_check(const td_node *node, td_err *err) {
    td_shape in = node->in_shape[0];
    if (!in.spatial)
        return td_fail(err, "expects an image input [C, H, W] but its input is flat [%d]", in.c);
    pool_geom g = pool_geom_of(node);
    if (2 * g.p > g.k)
        return td_fail(err, "padding %d must be at most half of kernel_size %d (as in PyTorch)",
                       g.p, g.k);
    if (in.h + 2 * g.p < g.k || in.w + 2 * g.p < g.k)
        return td_fail(err, "kernel_size %d does not fit the input %dx%d", g.k, in.h, in.w);
    return 0;
}

static int maxpool_build(td_model *model, td_node *node, td_err *err) {
    (void)model;
    if (pool_check(node, err) != 0) return -1;
    pool_geom g = pool_geom_of(node);
    node->out_shape = td_shape_image(g.c, g.oh, g.ow);
    /* the argmax of every output, as an offset into its sample's input */
    node->saved_bytes = (size_t)model->max_n * td_shape_size(node->out_shape) * sizeof(int32_t);
    return 0;
}

#if defined(__AVX512F__)
/* Up to 16 channels: the window's running maximum and its argmax stay in registers and are
 * stored once. Storing them after every window element and reading them back, as the general
 * loop does, stalls on store forwarding, which does not work for masked stores. */
static void maxpool_forward_c16(const pool_geom *g, const float *x, float *y, int32_t *a) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    __mmask16 m = td_tail_mask(g->c);
    if (g->p == 0 && g->k == 2) {
        /* the common 2x2 pool: every window lies inside, four loads at fixed offsets */
        const int32_t right = g->c, down = g->w * g->c;
        for (int oh = 0; oh < g->oh; oh++)
            for (int ow = 0; ow < g->ow; ow++) {
                int32_t base = ((oh * g->s) * g->w + ow * g->s) * g->c;
                int32_t offs[4] = {0, right, down, down + right};
                __m512 best = _mm512_maskz_loadu_ps(m, x + base);
                __m512i arg = _mm512_add_epi32(_mm512_set1_epi32(base), iota);
                for (int q = 1; q < 4; q++) {
                    __m512 v = _mm512_maskz_loadu_ps(m, x + base + offs[q]);
                    __mmask16 take = _mm512_mask_cmp_ps_mask(m, v, best, _CMP_GT_OQ) |
                                     _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
                    best = _mm512_mask_mov_ps(best, take, v);
                    arg = _mm512_mask_mov_epi32(
                        arg, take, _mm512_add_epi32(_mm512_set1_epi32(base + offs[q]), iota));
                }
                size_t o = ((size_t)oh * g->ow + ow) * g->c;
                _mm512_mask_storeu_ps(y + o, m, best);
                _mm512_mask_storeu_epi32(a + o, m, arg);
            }
        return;
    }
    for (int oh = 0; oh < g->oh; oh++)
        for (int ow = 0; ow < g->ow; ow++) {
            __m512 best = _mm512_set1_ps(-INFINITY);
            __m512i arg = _mm512_set1_epi32(-1);
            bool first = true;
            for (int kh = 0; kh < g->k; kh++) {
                int ih = oh * g->s - g->p + kh;
                if (ih < 0 || ih >= g->h) continue;
                for (int kw = 0; kw < g->k; kw++) {
                    int iw = ow * g->s - g->p + kw;
                    if (iw < 0 || iw >= g->w) continue;
                    int32_t base = (int32_t)(((size_t)ih * g->w + iw) * g->c);
                    __m512 v = _mm512_maskz_loadu_ps(m, x + base);
                    __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base), iota);
                    /* the first element seeds; later ones win when greater or NaN (PyTorch) */
                    __mmask16 take = first ? m
                                           : _mm512_mask_cmp_ps_mask(m, v, best, _CMP_GT_OQ) |
                                                 _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
                    best = _mm512_mask_mov_ps(best, take, v);
                    arg = _mm512_mask_mov_epi32(arg, take, idx);
                    first = false;
                }
            }
            size_t o = ((size_t)oh * g->ow + ow) * g->c;
            _mm512_mask_storeu_ps(y + o, m, best);
            _mm512_mask_storeu_epi32(a + o, m, arg);
        }
}
#elif defined(__AVX2__) && defined(__FMA__)
/* The AVX-512 kernel's scheme on AVX2: up to 16 channels in two 8-lane halves, the running
 * maximum and argmax in registers and stored once per output (the general loop's read-back of
 * memory it just wrote cost more than the comparisons). */
static inline void max_take8(__m256 v, __m256i idx, __m256 *best, __m256i *arg, bool first) {
    /* the first element seeds; later ones win when greater or NaN (PyTorch's rule) */
    __m256 take = first ? _mm256_castsi256_ps(_mm256_set1_epi32(-1))
                        : _mm256_or_ps(_mm256_cmp_ps(v, *best, _CMP_GT_OQ),
                                       _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    *best = _mm256_blendv_ps(*best, v, take);
    *arg = _mm256_castps_si256(
        _mm256_blendv_ps(_mm256_castsi256_ps(*arg), _mm256_castsi256_ps(idx), take));
}

/* Whole 8-lane loads and stores wherever they stay inside the sample, masked ones only at its
 * end: vmaskmovps is microcoded on AMD (Zen), and two masked stores per output (maximum and
 * argmax) made LeNet's 6-channel pool 4x slower there than AVX-512's. A plain store at output
 * pixel o spills its lanes past c onto pixel o + 1, which is written after it (outputs go in
 * increasing order), so only pixels within 8 floats of the end need the mask; a plain load reads
 * lanes of the next pixel, which nothing uses. */
/* HALVES (1 or 2) is a constant after inlining, so best[] and arg[] stay in registers: indexed by
 * a run-time count they lived on the stack and every window element waited on a store. */
static inline __attribute__((always_inline)) void
maxpool_c16_kernel(const pool_geom *g, const float *x, float *y, int32_t *a, const int HALVES) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    const int lanes[2] = {g->c < 8 ? g->c : 8, g->c - 8};
    const __m256i mask[2] = {td_mask8(lanes[0]), td_mask8(lanes[1])};
    const int32_t in_end = g->h * g->w * g->c;
    const size_t out_end = (size_t)g->oh * g->ow * g->c;
    /* the common 2x2 pool: every window lies inside, four loads at fixed offsets */
    const bool inside2 = g->p == 0 && g->k == 2;
    const int32_t offs[4] = {0, g->c, g->w * g->c, (g->w + 1) * g->c};
    for (int oh = 0; oh < g->oh; oh++)
        for (int ow = 0; ow < g->ow; ow++) {
            __m256 best[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
            __m256i arg[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
            if (inside2) {
                int32_t base = ((oh * g->s) * g->w + ow * g->s) * g->c;
                for (int q = 0; q < 4; q++)
                    for (int h = 0; h < HALVES; h++) {
                        int32_t at = base + offs[q] + 8 * h;
                        __m256 v = at + 8 <= in_end ? _mm256_loadu_ps(x + at)
                                                    : _mm256_maskload_ps(x + at, mask[h]);
                        max_take8(v, _mm256_add_epi32(_mm256_set1_epi32(at), iota), &best[h],
                                  &arg[h], q == 0);
                    }
            } else {
                bool first = true;
                for (int kh = 0; kh < g->k; kh++) {
                    int ih = oh * g->s - g->p + kh;
                    if (ih < 0 || ih >= g->h) continue;
                    for (int kw = 0; kw < g->k; kw++) {
                        int iw = ow * g->s - g->p + kw;
                        if (iw < 0 || iw >= g->w) continue;
                        int32_t base = (int32_t)(((size_t)ih * g->w + iw) * g->c);
                        for (int h = 0; h < HALVES; h++) {
                            int32_t at = base + 8 * h;
                            __m256 v = at + 8 <= in_end ? _mm256_loadu_ps(x + at)
                                                        : _mm256_maskload_ps(x + at, mask[h]);
                            max_take8(v, _mm256_add_epi32(_mm256_set1_epi32(at), iota), &best[h],
                                      &arg[h], first);
                        }
                        first = false;
                    }
                }
            }
            size_t o = ((size_t)oh * g->ow + ow) * g->c;
            for (int h = 0; h < HALVES; h++) {
                if (o + 8 * h + 8 <= out_end) {
                    _mm256_storeu_ps(y + o + 8 * h, best[h]);
                    _mm256_storeu_si256((__m256i *)(a + o + 8 * h), arg[h]);
                } else {
                    _mm256_maskstore_ps(y + o + 8 * h, mask[h], best[h]);
                    _mm256_maskstore_epi32(a + o + 8 * h, mask[h], arg[h]);
                }
            }
        }
}

static void maxpool_forward_c16(const pool_geom *g, const float *x, float *y, int32_t *a) {
    if (g->c > 8)
        maxpool_c16_kernel(g, x, y, a, 2);
    else
        maxpool_c16_kernel(g, x, y, a, 1);
}
#endif

/* A fused ReLU before the pool (td_node.relu_in) applied after it, on the 4x smaller output while
 * it is in L1: max(relu(x)) = relu(max(x)), with the same argmax wherever the maximum is positive
 * (elsewhere the output is 0 and its gradient is masked below). As torch.relu, NaN passes. */
static void relu_in_place(float *restrict y, size_t n) {
    for (size_t i = 0; i < n; i++) y[i] = y[i] <= 0.0f ? 0.0f : y[i];
}

/* One sample, any channel count: the running maximum kept in y itself. */
static void maxpool_forward_general(const pool_geom *g, const float *x, float *y, int32_t *a) {
    for (int oh = 0; oh < g->oh; oh++)
        for (int ow = 0; ow < g->ow; ow++) {
            float *yp = y + ((size_t)oh * g->ow + ow) * g->c;
            int32_t *ap = a + ((size_t)oh * g->ow + ow) * g->c;
            bool first = true;
            for (int kh = 0; kh < g->k; kh++) {
                int ih = oh * g->s - g->p + kh;
                if (ih < 0 || ih >= g->h) continue;
                for (int kw = 0; kw < g->k; kw++) {
                    int iw = ow * g->s - g->p + kw;
                    if (iw < 0 || iw >= g->w) continue;
                    int32_t base = (int32_t)(((size_t)ih * g->w + iw) * g->c);
                    if (first) {
                        /* the window's first element seeds the running maximum */
                        td_max_seed(yp, ap, x + base, base, g->c);
                        first = false;
                    } else {
                        /* later elements win only when greater or NaN: PyTorch's rule */
                        td_max_run(yp, ap, x + base, base, g->c);
                    }
                }
            }
        }
}

static void maxpool_forward_one(const pool_geom *g, const float *x, float *y, int32_t *a) {
#if defined(__AVX512F__) || (defined(__AVX2__) && defined(__FMA__))
    if (g->c <= 16) {
        maxpool_forward_c16(g, x, y, a);
        return;
    }
#endif
    maxpool_forward_general(g, x, y, a);
}

static void maxpool_forward(td_node *node, const td_run *run) {
    pool_geom g = pool_geom_of(node);
    size_t in_size = (size_t)g.h * g.w * g.c, out_size = (size_t)g.oh * g.ow * g.c;
    int32_t *arg = node->saved;
    for (int b = 0; b < run->n; b++) {
        float *y = node->out + b * out_size;
        maxpool_forward_one(&g, node->in[0] + b * in_size, y, arg + b * out_size);
        if (node->relu_in) relu_in_place(y, out_size);
    }
}

static void maxpool_backward(td_node *node, const td_run *run) {
    float *dx = node->in_grad[0];
    if (!dx) return;
    size_t in_size = td_shape_size(node->in_shape[0]), out_size = td_shape_size(node->out_shape);
    if (!node->in_grad_add[0]) memset(dx, 0, (size_t)run->n * in_size * 4);
    const int32_t *arg = node->saved;
    for (int b = 0; b < run->n; b++) {
        float *d = dx + b * in_size;
        const float *dy = node->grad + b * out_size, *y = node->out + b * out_size;
        const int32_t *a = arg + b * out_size;
        if (node->relu_in) /* the fused ReLU's mask, from its output as relu's backward takes it */
            for (size_t i = 0; i < out_size; i++) d[a[i]] += y[i] > 0.0f ? dy[i] : 0.0f;
        else
            for (size_t i = 0; i < out_size; i++) d[a[i]] += dy[i];
    }
}

static int avgpool_build(td_model *model, td_node *node, td_err *err) {
    (void)model;
    if (pool_check(node, err) != 0) return -1;
    pool_geom g = pool_geom_of(node);
    node->out_shape = td_shape_image(g.c, g.oh, g.ow);
    return 0;
}

/* Number of elements a window averages over. */
static float avg_divisor(const td_node *node, const pool_geom *g, int oh, int ow) {
    if (node->args[ARG_COUNT_INCLUDE_PAD]) return (float)(g->k * g->k);
    int h0 = oh * g->s - g->p, w0 = ow * g->s - g->p;
    int h1 = h0 + g->k < g->h ? h0 + g->k : g->h, w1 = w0 + g->k < g->w ? w0 + g->k : g->w;
    if (h0 < 0) h0 = 0;
    if (w0 < 0) w0 = 0;
    return (float)((h1 - h0) * (w1 - w0));
}

static void avgpool_forward(td_node *node, const td_run *run) {
    pool_geom g = pool_geom_of(node);
    size_t in_size = (size_t)g.h * g.w * g.c, out_size = (size_t)g.oh * g.ow * g.c;
    for (int b = 0; b < run->n; b++) {
        const float *x = node->in[0] + b * in_size;
        float *y = node->out + b * out_size;
        for (int oh = 0; oh < g.oh; oh++)
            for (int ow = 0; ow < g.ow; ow++) {
                float *yp = y + ((size_t)oh * g.ow + ow) * g.c;
                memset(yp, 0, (size_t)g.c * 4);
                for (int kh = 0; kh < g.k; kh++) {
                    int ih = oh * g.s - g.p + kh;
                    if (ih < 0 || ih >= g.h) continue;
                    for (int kw = 0; kw < g.k; kw++) {
                        int iw = ow * g.s - g.p + kw;
                        if (iw < 0 || iw >= g.w) continue;
                        const float *xp = x + ((size_t)ih * g.w + iw) * g.c;
                        for (int c = 0; c < g.c; c++) yp[c] += xp[c];
                    }
                }
                float inv = 1.0f / avg_divisor(node, &g, oh, ow);
                for (int c = 0; c < g.c; c++) yp[c] *= inv;
            }
    }
}

static void avgpool_backward(td_node *node, const td_run *run) {
    float *dx = node->in_grad[0];
    if (!dx) return;
    pool_geom g = pool_geom_of(node);
    size_t in_size = (size_t)g.h * g.w * g.c, out_size = (size_t)g.oh * g.ow * g.c;
    if (!node->in_grad_add[0]) memset(dx, 0, (size_t)run->n * in_size * 4);
    for (int b = 0; b < run->n; b++) {
        float *d = dx + b * in_size;
        const float *dy = node->grad + b * out_size;
        for (int oh = 0; oh < g.oh; oh++)
            for (int ow = 0; ow < g.ow; ow++) {
                const float *gp = dy + ((size_t)oh * g.ow + ow) * g.c;
                float inv = 1.0f / avg_divisor(node, &g, oh, ow);
                for (int kh = 0; kh < g.k; kh++) {
                    int ih = oh * g.s - g.p + kh;
                    if (ih < 0 || ih >= g.h) continue;
                    for (int kw = 0; kw < g.k; kw++) {
                        int iw = ow * g.s - g.p + kw;
                        if (iw < 0 || iw >= g.w) continue;
                        float *dp = d + ((size_t)ih * g.w + iw) * g.c;
                        for (int c = 0; c < g.c; c++) dp[c] += gp[c] * inv;
                    }
                }
            }
    }
}

static int gap_build(td_model *model, td_node *node, td_err *err) {
    (void)model;
    td_shape in = node->in_shape[0];
    if (!in.spatial)
        return td_fail(err, "expects an image input [C, H, W] but its input is flat [%d]", in.c);
    node->out_shape = td_shape_flat(in.c);
    return 0;
}

static void gap_forward(td_node *node, const td_run *run) {
    td_shape in = node->in_shape[0];
    size_t hw = (size_t)in.h * in.w;
    float inv = 1.0f / (float)hw;
    for (int b = 0; b < run->n; b++) {
        const float *x = node->in[0] + b * hw * in.c;
        float *y = node->out + (size_t)b * in.c;
        memset(y, 0, (size_t)in.c * 4);
        for (size_t i = 0; i < hw; i++)
            for (int c = 0; c < in.c; c++) y[c] += x[i * in.c + c];
        for (int c = 0; c < in.c; c++) y[c] *= inv;
    }
}

static void gap_backward(td_node *node, const td_run *run) {
    float *dx = node->in_grad[0];
    if (!dx) return;
    td_shape in = node->in_shape[0];
    size_t hw = (size_t)in.h * in.w;
    float inv = 1.0f / (float)hw;
    bool add = node->in_grad_add[0];
    for (int b = 0; b < run->n; b++) {
        float *d = dx + b * hw * in.c;
        const float *dy = node->grad + (size_t)b * in.c;
        for (size_t i = 0; i < hw; i++)
            for (int c = 0; c < in.c; c++)
                d[i * in.c + c] = (add ? d[i * in.c + c] : 0.0f) + dy[c] * inv;
    }
}

/* AdaptiveAvgPool2d(1): the global average kept as a 1x1 image, so a following flatten gives
 * [C] as in torchvision's ResNets. Only output_size 1 is supported. */
static int adaptive_build(td_model *model, td_node *node, td_err *err) {
    if (gap_build(model, node, err) != 0) return -1;
    node->out_shape = td_shape_image(node->in_shape[0].c, 1, 1);
    return 0;
}

const td_op TD_ISA_SYM(td_op_maxpool2d) = {&td_op_sig_maxpool2d,      maxpool_build,
                                           maxpool_forward,           maxpool_backward,
                                           TD_OP_VARIANTS(maxpool2d), TD_OP_ABSORBS_RELU};
const td_op TD_ISA_SYM(td_op_avgpool2d) = {&td_op_sig_avgpool2d,      avgpool_build,
                                           avgpool_forward,           avgpool_backward,
                                           TD_OP_VARIANTS(avgpool2d), 0};
const td_op TD_ISA_SYM(td_op_adaptive_avgpool2d) = {&td_op_sig_adaptive_avgpool2d,
                                                    adaptive_build,
                                                    gap_forward,
                                                    gap_backward,
                                                    TD_OP_VARIANTS(adaptive_avgpool2d),
                                                    0};
const td_op TD_ISA_SYM(td_op_global_avgpool) = {
    &td_op_sig_global_avgpool,      gap_build, gap_forward, gap_backward,
    TD_OP_VARIANTS(global_avgpool), 0};
