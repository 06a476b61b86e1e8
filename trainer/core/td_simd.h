/* Short-vector helpers for the inner loops of im2col, col2im and pooling, whose runs are a few
 * to a few dozen floats (a window row of K*C values, the C channels of one pixel). Loops that
 * short spend more time in loop set-up and scalar tails than in work; AVX-512's masked loads
 * and stores do a run of up to 16 floats in one instruction pair. Without AVX-512 (another
 * -march) the plain loops below are used and give the same results. */
#ifndef TD_SIMD_H
#define TD_SIMD_H

#include <stdbool.h>
#include <stdint.h>

#if defined(__AVX512F__)
#include <immintrin.h>

static inline __mmask16 td_tail_mask(int n) {
    return (__mmask16)((1u << n) - 1u);
}

/* dst[0..n) = src[0..n) */
static inline void td_copy_run(float *dst, const float *src, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(dst + i, _mm512_loadu_ps(src + i));
    if (i < n) {
        __mmask16 m = td_tail_mask(n - i);
        _mm512_mask_storeu_ps(dst + i, m, _mm512_maskz_loadu_ps(m, src + i));
    }
}

/* dst + i·dst_stride [0..n) = src + i·src_stride [0..n) for i < count, n <= 32: the sliding
 * windows of one im2col row, with the masks computed once. */
static inline void td_copy_runs32(float *dst, size_t dst_stride, const float *src,
                                  size_t src_stride, int n, int count) {
    if (n <= 16) {
        __mmask16 m = td_tail_mask(n);
        for (int i = 0; i < count; i++, dst += dst_stride, src += src_stride)
            _mm512_mask_storeu_ps(dst, m, _mm512_maskz_loadu_ps(m, src));
        return;
    }
    __mmask16 m = td_tail_mask(n - 16);
    for (int i = 0; i < count; i++, dst += dst_stride, src += src_stride) {
        _mm512_storeu_ps(dst, _mm512_loadu_ps(src));
        _mm512_mask_storeu_ps(dst + 16, m, _mm512_maskz_loadu_ps(m, src + 16));
    }
}

/* A register of up to 16 floats being summed, for gathers that must not go through memory. */
typedef __m512 td_acc16;
static inline td_acc16 td_acc16_zero(void) {
    return _mm512_setzero_ps();
}
static inline td_acc16 td_acc16_add(td_acc16 acc, const float *src, int n) {
    return _mm512_add_ps(acc, _mm512_maskz_loadu_ps(td_tail_mask(n), src));
}
static inline td_acc16 td_acc16_sum(td_acc16 a, td_acc16 b) {
    return _mm512_add_ps(a, b);
}
/* dst[0..n) = acc, or += acc */
static inline void td_acc16_store(float *dst, td_acc16 acc, int n, bool add) {
    __mmask16 m = td_tail_mask(n);
    if (add) acc = _mm512_add_ps(acc, _mm512_maskz_loadu_ps(m, dst));
    _mm512_mask_storeu_ps(dst, m, acc);
}

/* dst[0..n) += src[0..n) */
static inline void td_add_run(float *dst, const float *src, int n) {
    int i = 0;
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(dst + i,
                         _mm512_add_ps(_mm512_loadu_ps(dst + i), _mm512_loadu_ps(src + i)));
    if (i < n) {
        __mmask16 m = td_tail_mask(n - i);
        __m512 s =
            _mm512_add_ps(_mm512_maskz_loadu_ps(m, dst + i), _mm512_maskz_loadu_ps(m, src + i));
        _mm512_mask_storeu_ps(dst + i, m, s);
    }
}

/* y[0..n) = x[0..n), arg[c] = base + c: a max-pool window's first element. */
static inline void td_max_seed(float *y, int32_t *arg, const float *x, int32_t base, int n) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : td_tail_mask(n - i);
        _mm512_mask_storeu_ps(y + i, m, _mm512_maskz_loadu_ps(m, x + i));
        _mm512_mask_storeu_epi32(arg + i, m, _mm512_add_epi32(_mm512_set1_epi32(base + i), iota));
    }
}

/* Where x[c] > y[c] or x[c] is NaN (PyTorch's max-pool rule): y[c] = x[c], arg[c] = base + c. */
static inline void td_max_run(float *y, int32_t *arg, const float *x, int32_t base, int n) {
    const __m512i iota = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    for (int i = 0; i < n; i += 16) {
        __mmask16 m = n - i >= 16 ? (__mmask16)0xFFFF : td_tail_mask(n - i);
        __m512 v = _mm512_maskz_loadu_ps(m, x + i), best = _mm512_maskz_loadu_ps(m, y + i);
        __mmask16 take = _mm512_mask_cmp_ps_mask(m, v, best, _CMP_GT_OQ) |
                         _mm512_mask_cmp_ps_mask(m, v, v, _CMP_UNORD_Q);
        _mm512_mask_storeu_ps(y + i, take, v);
        __m512i idx = _mm512_add_epi32(_mm512_set1_epi32(base + i), iota);
        _mm512_mask_storeu_epi32(arg + i, take, idx);
    }
}

#else

static inline void td_copy_run(float *dst, const float *src, int n) {
    for (int i = 0; i < n; i++) dst[i] = src[i];
}

static inline void td_copy_runs32(float *dst, size_t dst_stride, const float *src,
                                  size_t src_stride, int n, int count) {
    for (int i = 0; i < count; i++, dst += dst_stride, src += src_stride) td_copy_run(dst, src, n);
}

static inline void td_add_run(float *dst, const float *src, int n) {
    for (int i = 0; i < n; i++) dst[i] += src[i];
}

typedef struct td_acc16 {
    float v[16];
} td_acc16;
static inline td_acc16 td_acc16_zero(void) {
    return (td_acc16){{0}};
}
static inline td_acc16 td_acc16_add(td_acc16 acc, const float *src, int n) {
    for (int i = 0; i < n; i++) acc.v[i] += src[i];
    return acc;
}
static inline td_acc16 td_acc16_sum(td_acc16 a, td_acc16 b) {
    for (int i = 0; i < 16; i++) a.v[i] += b.v[i];
    return a;
}
static inline void td_acc16_store(float *dst, td_acc16 acc, int n, bool add) {
    for (int i = 0; i < n; i++) dst[i] = (add ? dst[i] : 0.0f) + acc.v[i];
}

static inline void td_max_seed(float *y, int32_t *arg, const float *x, int32_t base, int n) {
    for (int i = 0; i < n; i++) {
        y[i] = x[i];
        arg[i] = base + i;
    }
}

static inline void td_max_run(float *y, int32_t *arg, const float *x, int32_t base, int n) {
    for (int i = 0; i < n; i++)
        if (x[i] > y[i] || x[i] != x[i]) {
            y[i] = x[i];
            arg[i] = base + i;
        }
}

#endif
#endif
