#include "ops/td_skinny.h"

#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>

bool td_skinny_nt(int rows, int o, int k, const float *a, const float *w, float *y,
                  float *scratch) {
    if (o > 16) return false;
    /* wt [k, 16]: column j of w^T in one register, lanes past o zero */
    float *wt = scratch;
    memset(wt, 0, (size_t)k * 16 * sizeof(float));
    for (int i = 0; i < o; i++)
        for (int j = 0; j < k; j++) wt[j * 16 + i] = w[(size_t)i * k + j];
    __mmask16 m = (__mmask16)((1u << o) - 1u);
    int r = 0;
    for (; r + 8 <= rows; r += 8) {
        const float *a0 = a + (size_t)r * k;
        __m512 c0 = _mm512_setzero_ps(), c1 = c0, c2 = c0, c3 = c0, c4 = c0, c5 = c0, c6 = c0,
               c7 = c0;
        for (int j = 0; j < k; j++) {
            __m512 wj = _mm512_loadu_ps(wt + j * 16);
            c0 = _mm512_fmadd_ps(_mm512_set1_ps(a0[j]), wj, c0);
            c1 = _mm512_fmadd_ps(_mm512_set1_ps(a0[k + j]), wj, c1);
            c2 = _mm512_fmadd_ps(_mm512_set1_ps(a0[2 * k + j]), wj, c2);
            c3 = _mm512_fmadd_ps(_mm512_set1_ps(a0[3 * k + j]), wj, c3);
            c4 = _mm512_fmadd_ps(_mm512_set1_ps(a0[4 * k + j]), wj, c4);
            c5 = _mm512_fmadd_ps(_mm512_set1_ps(a0[5 * k + j]), wj, c5);
            c6 = _mm512_fmadd_ps(_mm512_set1_ps(a0[6 * k + j]), wj, c6);
            c7 = _mm512_fmadd_ps(_mm512_set1_ps(a0[7 * k + j]), wj, c7);
        }
        float *y0 = y + (size_t)r * o;
        _mm512_mask_storeu_ps(y0, m, c0);
        _mm512_mask_storeu_ps(y0 + o, m, c1);
        _mm512_mask_storeu_ps(y0 + 2 * o, m, c2);
        _mm512_mask_storeu_ps(y0 + 3 * o, m, c3);
        _mm512_mask_storeu_ps(y0 + 4 * o, m, c4);
        _mm512_mask_storeu_ps(y0 + 5 * o, m, c5);
        _mm512_mask_storeu_ps(y0 + 6 * o, m, c6);
        _mm512_mask_storeu_ps(y0 + 7 * o, m, c7);
    }
    for (; r < rows; r++) {
        const float *a0 = a + (size_t)r * k;
        __m512 c = _mm512_setzero_ps();
        for (int j = 0; j < k; j++)
            c = _mm512_fmadd_ps(_mm512_set1_ps(a0[j]), _mm512_loadu_ps(wt + j * 16), c);
        _mm512_mask_storeu_ps(y + (size_t)r * o, m, c);
    }
    return true;
}

/* O outputs and NV vectors of 16 columns, both compile-time constants after inlining, so the
 * O·NV accumulators live in registers. */
static inline __attribute__((always_inline)) void tn_kernel(int rows, const int O, const int NV,
                                                            int k, const float *dy, const float *a,
                                                            float *dw, bool add) {
    __m512 acc[24];
    for (int i = 0; i < O * NV; i++) acc[i] = _mm512_setzero_ps();
    __mmask16 mask[3];
    for (int v = 0; v < NV; v++) {
        int left = k - 16 * v;
        mask[v] = left >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << left) - 1u);
    }
    for (int r = 0; r < rows; r++) {
        const float *ar = a + (size_t)r * k;
        __m512 av[3];
        for (int v = 0; v < NV; v++) av[v] = _mm512_maskz_loadu_ps(mask[v], ar + 16 * v);
        const float *d = dy + (size_t)r * O;
        for (int i = 0; i < O; i++) {
            __m512 di = _mm512_set1_ps(d[i]);
            for (int v = 0; v < NV; v++)
                acc[i * NV + v] = _mm512_fmadd_ps(di, av[v], acc[i * NV + v]);
        }
    }
    for (int i = 0; i < O; i++)
        for (int v = 0; v < NV; v++) {
            float *dst = dw + (size_t)i * k + 16 * v;
            __m512 s = acc[i * NV + v];
            if (add) s = _mm512_add_ps(s, _mm512_maskz_loadu_ps(mask[v], dst));
            _mm512_mask_storeu_ps(dst, mask[v], s);
        }
}

#define TN_CASE(O_, NV_)                                                                           \
    case (O_)*4 + (NV_):                                                                           \
        tn_kernel(rows, O_, NV_, k, dy, a, dw, add);                                               \
        return true;

bool td_skinny_tn(int rows, int o, int k, const float *dy, const float *a, float *dw, bool add) {
    int nv = (k + 15) / 16;
    if (o > 16 || nv > 3 || o * nv > 24) return false;
    /* one instantiation per (outputs, vectors) pair, so the accumulators stay in registers */
    // clang-format off
    switch (o * 4 + nv) {
        TN_CASE(1, 1) TN_CASE(1, 2) TN_CASE(1, 3) TN_CASE(2, 1) TN_CASE(2, 2) TN_CASE(2, 3)
        TN_CASE(3, 1) TN_CASE(3, 2) TN_CASE(3, 3) TN_CASE(4, 1) TN_CASE(4, 2) TN_CASE(4, 3)
        TN_CASE(5, 1) TN_CASE(5, 2) TN_CASE(5, 3) TN_CASE(6, 1) TN_CASE(6, 2) TN_CASE(6, 3)
        TN_CASE(7, 1) TN_CASE(7, 2) TN_CASE(7, 3) TN_CASE(8, 1) TN_CASE(8, 2) TN_CASE(8, 3)
        TN_CASE(9, 1) TN_CASE(9, 2) TN_CASE(10, 1) TN_CASE(10, 2) TN_CASE(11, 1) TN_CASE(11, 2)
        TN_CASE(12, 1) TN_CASE(12, 2) TN_CASE(13, 1) TN_CASE(14, 1) TN_CASE(15, 1) TN_CASE(16, 1)
    }
    // clang-format on
    return false;
}

#else

bool td_skinny_nt(int rows, int o, int k, const float *a, const float *w, float *y,
                  float *scratch) {
    (void)rows, (void)o, (void)k, (void)a, (void)w, (void)y, (void)scratch;
    return false;
}

bool td_skinny_tn(int rows, int o, int k, const float *dy, const float *a, float *dw, bool add) {
    (void)rows, (void)o, (void)k, (void)dy, (void)a, (void)dw, (void)add;
    return false;
}

#endif
