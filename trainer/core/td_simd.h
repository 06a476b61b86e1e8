/* Short-vector helpers for the inner loops of im2col, col2im and pooling, whose runs are a few
 * to a few dozen floats (a window row of K*C values, the C channels of one pixel). Loops that
 * short spend more time in loop set-up and scalar tails than in work; AVX-512's masked loads
 * and stores do a run of up to 16 floats in one instruction pair. With AVX2 and FMA but no
 * AVX-512 the same is done 8 floats at a time, with vmaskmovps for partial vectors; with
 * neither (another -march) the plain loops below are used. All three give the same results. */
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

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <string.h>

/* AVX2 has no mask registers: a partial run goes through vmaskmovps, whose mask is a vector
 * with lanes [0, n) all ones (n <= 0: none, n >= 8: all). Masked-off lanes are neither read nor
 * written and never fault, so a masked load stays inside [src, src + n). */
static inline __m256i td_mask8(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* dst[0..n) = src[0..n); dst and src do not overlap. A run of 8 or more ends with a whole vector
 * at n - 8 that rewrites a few floats the loop already copied, with the same values: plain
 * stores instead of vmaskmovps, which is slow on some CPUs (microcoded on AMD's Zen 1 and 2). */
static inline void td_copy_run(float *dst, const float *src, int n) {
    if (n < 8) {
        __m256i m = td_mask8(n);
        _mm256_maskstore_ps(dst, m, _mm256_maskload_ps(src, m));
        return;
    }
    int i = 0;
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(dst + i, _mm256_loadu_ps(src + i));
    if (i < n) _mm256_storeu_ps(dst + n - 8, _mm256_loadu_ps(src + n - 8));
}

/* dst + i·dst_stride [0..n) = src + i·src_stride [0..n) for i < count, n <= 32: the sliding
 * windows of one im2col row. A run of 8 or more is ceil(n/8) whole vectors, the last at n - 8
 * (overlapping the one before when 8 does not divide n), one loop per vector count. */
static inline void td_copy_runs32(float *dst, size_t dst_stride, const float *src,
                                  size_t src_stride, int n, int count) {
    if (n < 8) {
        __m256i m = td_mask8(n);
        for (int i = 0; i < count; i++, dst += dst_stride, src += src_stride)
            _mm256_maskstore_ps(dst, m, _mm256_maskload_ps(src, m));
        return;
    }
    const int t = n - 8;
    switch ((n + 7) >> 3) {
    case 1:
        for (int i = 0; i < count; i++, dst += dst_stride, src += src_stride)
            _mm256_storeu_ps(dst, _mm256_loadu_ps(src));
        break;
    case 2:
        for (int i = 0; i < count; i++, dst += dst_stride, src += src_stride) {
            __m256 a = _mm256_loadu_ps(src), b = _mm256_loadu_ps(src + t);
            _mm256_storeu_ps(dst, a);
            _mm256_storeu_ps(dst + t, b);
        }
        break;
    case 3:
        for (int i = 0; i < count; i++, dst += dst_stride, src += src_stride) {
            __m256 a = _mm256_loadu_ps(src), b = _mm256_loadu_ps(src + 8);
            __m256 c = _mm256_loadu_ps(src + t);
            _mm256_storeu_ps(dst, a);
            _mm256_storeu_ps(dst + 8, b);
            _mm256_storeu_ps(dst + t, c);
        }
        break;
    default:
        for (int i = 0; i < count; i++, dst += dst_stride, src += src_stride) {
            __m256 a = _mm256_loadu_ps(src), b = _mm256_loadu_ps(src + 8);
            __m256 c = _mm256_loadu_ps(src + 16), d = _mm256_loadu_ps(src + t);
            _mm256_storeu_ps(dst, a);
            _mm256_storeu_ps(dst + 8, b);
            _mm256_storeu_ps(dst + 16, c);
            _mm256_storeu_ps(dst + t, d);
        }
        break;
    }
}

/* Up to 16 floats being summed, in two registers: lanes 0-7 and 8-15. */
typedef struct td_acc16 {
    __m256 lo, hi;
} td_acc16;
static inline td_acc16 td_acc16_zero(void) {
    return (td_acc16){_mm256_setzero_ps(), _mm256_setzero_ps()};
}
/* src[0..n) as a vector, zero past n (n <= 8) */
static inline __m256 td_load8(const float *src, int n) {
    return n >= 8 ? _mm256_loadu_ps(src) : _mm256_maskload_ps(src, td_mask8(n));
}
static inline td_acc16 td_acc16_add(td_acc16 acc, const float *src, int n) {
    acc.lo = _mm256_add_ps(acc.lo, td_load8(src, n));
    if (n > 8) acc.hi = _mm256_add_ps(acc.hi, td_load8(src + 8, n - 8));
    return acc;
}
static inline td_acc16 td_acc16_sum(td_acc16 a, td_acc16 b) {
    return (td_acc16){_mm256_add_ps(a.lo, b.lo), _mm256_add_ps(a.hi, b.hi)};
}
/* dst[0..n) (+)= lanes [0, n) of a vector (n <= 8) */
static inline void td_store8(float *dst, __m256 v, int n, bool add) {
    if (n >= 8) {
        if (add) v = _mm256_add_ps(v, _mm256_loadu_ps(dst));
        _mm256_storeu_ps(dst, v);
    } else {
        __m256i m = td_mask8(n);
        if (add) v = _mm256_add_ps(v, _mm256_maskload_ps(dst, m));
        _mm256_maskstore_ps(dst, m, v);
    }
}
/* dst[0..n) = acc, or += acc */
static inline void td_acc16_store(float *dst, td_acc16 acc, int n, bool add) {
    td_store8(dst, acc.lo, n, add);
    if (n > 8) td_store8(dst + 8, acc.hi, n - 8, add);
}

/* dst[0..n) += src[0..n) */
static inline void td_add_run(float *dst, const float *src, int n) {
    int i = 0;
    for (; i + 8 <= n; i += 8)
        _mm256_storeu_ps(dst + i,
                         _mm256_add_ps(_mm256_loadu_ps(dst + i), _mm256_loadu_ps(src + i)));
    if (i < n) {
        __m256i m = td_mask8(n - i);
        __m256 s = _mm256_add_ps(_mm256_maskload_ps(dst + i, m), _mm256_maskload_ps(src + i, m));
        _mm256_maskstore_ps(dst + i, m, s);
    }
}

/* Lanes [0, n) of a vector from / to memory for n < 8, in plain pieces of 4, 2 and 1 floats
 * (zero past n). For data read back soon after it is written: the max-pool keeps its running
 * maximum in memory, and a load forwards from an earlier store of the same place and size,
 * whereas after vmaskmovps it waits for the store to reach the cache, which serialises the
 * windows. The pieces may be int32 (the argmax): __m128 and __m64 accesses may alias anything,
 * and single floats go through memcpy, which may too. */
static inline __m128 td_load1(const float *p) {
    float f;
    memcpy(&f, p, sizeof f);
    return _mm_set_ss(f);
}
static inline void td_store1(float *p, __m128 v) {
    float f = _mm_cvtss_f32(v);
    memcpy(p, &f, sizeof f);
}
static inline __m128 td_load_lt4(const float *p, int n) {
    __m128 z = _mm_setzero_ps();
    if (n == 1) return td_load1(p);
    if (n == 2) return _mm_loadl_pi(z, (const __m64 *)p);
    if (n == 3) return _mm_movelh_ps(_mm_loadl_pi(z, (const __m64 *)p), td_load1(p + 2));
    return z;
}
static inline __m256 td_load_lt8(const float *p, int n) {
    if (n < 4) return _mm256_zextps128_ps256(td_load_lt4(p, n));
    return _mm256_insertf128_ps(_mm256_castps128_ps256(_mm_loadu_ps(p)), td_load_lt4(p + 4, n - 4),
                                1);
}
static inline void td_store_lt4(float *p, __m128 v, int n) {
    if (n & 2) _mm_storel_pi((__m64 *)p, v);
    if (n & 1) td_store1(p + (n & 2), n & 2 ? _mm_movehl_ps(v, v) : v);
}
static inline void td_store_lt8(float *p, __m256 v, int n) {
    if (n < 4) {
        td_store_lt4(p, _mm256_castps256_ps128(v), n);
    } else {
        _mm_storeu_ps(p, _mm256_castps256_ps128(v));
        td_store_lt4(p + 4, _mm256_extractf128_ps(v, 1), n - 4);
    }
}

/* y[0..n) = x[0..n), arg[c] = base + c: a max-pool window's first element. */
static inline void td_max_seed(float *y, int32_t *arg, const float *x, int32_t base, int n) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    int i = 0;
    for (; i + 8 <= n; i += 8) {
        _mm256_storeu_ps(y + i, _mm256_loadu_ps(x + i));
        _mm256_storeu_si256((__m256i *)(arg + i),
                            _mm256_add_epi32(_mm256_set1_epi32(base + i), iota));
    }
    if (i < n) {
        __m256i idx = _mm256_add_epi32(_mm256_set1_epi32(base + i), iota);
        td_store_lt8(y + i, td_load_lt8(x + i, n - i), n - i);
        td_store_lt8((float *)(arg + i), _mm256_castsi256_ps(idx), n - i);
    }
}

/* n <= 4 floats, in pieces as above */
static inline __m128 td_load_le4(const float *p, int n) {
    return n >= 4 ? _mm_loadu_ps(p) : td_load_lt4(p, n);
}
static inline void td_store_le4(float *p, __m128 v, int n) {
    if (n >= 4)
        _mm_storeu_ps(p, v);
    else
        td_store_lt4(p, v, n);
}
/* td_max_run's rule for m <= 4 channels; arg as floats (only moved, never computed with) */
static inline void td_max_run4(float *y, float *arg, const float *x, __m128 idx, int m) {
    __m128 v = td_load_le4(x, m), best = td_load_le4(y, m), a = td_load_le4(arg, m);
    __m128 take = _mm_or_ps(_mm_cmpgt_ps(v, best), _mm_cmpunord_ps(v, v));
    td_store_le4(y, _mm_blendv_ps(best, v, take), m);
    td_store_le4(arg, _mm_blendv_ps(a, idx, take), m);
}
/* Where x[c] > y[c] or x[c] is NaN (PyTorch's max-pool rule): y[c] = x[c], arg[c] = base + c.
 * y and arg are blended and stored whole, rewriting the lanes not taken with their own values,
 * with plain stores: the next element of the window reloads them at once. A partial vector goes
 * in 128-bit halves, which keeps inserts and extracts out of that store-to-load chain. */
static inline void td_max_run(float *y, int32_t *arg, const float *x, int32_t base, int n) {
    const __m256i iota = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    for (int i = 0; i < n; i += 8) {
        int m = n - i;
        __m256 idx = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_set1_epi32(base + i), iota));
        float *yi = y + i, *ai = (float *)(arg + i);
        if (m >= 8) {
            __m256 v = _mm256_loadu_ps(x + i), best = _mm256_loadu_ps(yi), a = _mm256_loadu_ps(ai);
            __m256 take =
                _mm256_or_ps(_mm256_cmp_ps(v, best, _CMP_GT_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
            _mm256_storeu_ps(yi, _mm256_blendv_ps(best, v, take));
            _mm256_storeu_ps(ai, _mm256_blendv_ps(a, idx, take));
        } else {
            td_max_run4(yi, ai, x + i, _mm256_castps256_ps128(idx), m);
            if (m > 4) td_max_run4(yi + 4, ai + 4, x + i + 4, _mm256_extractf128_ps(idx, 1), m - 4);
        }
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
