#include "ops/td_conv1ch.h"

#include <string.h>

#if defined(__AVX512F__)
#include <immintrin.h>

bool td_conv1ch_fits(int c, int k, int stride, int padding, int o) {
    return c == 1 && stride == 1 && padding == 0 && k * k + 1 <= 32 && o <= 12;
}

void td_conv1ch_forward(int n, int h, int w, int k, int o, const float *x, const float *wp,
                        float *y, float *scratch) {
    const int oh = h - k + 1, ow = w - k + 1, kk = k * k, cols = kk + 1;
    /* wt [cols, 16]: all output channels of one weight tap in a register */
    float *wt = scratch;
    memset(wt, 0, (size_t)cols * 16 * sizeof(float));
    for (int i = 0; i < o; i++)
        for (int j = 0; j < cols; j++) wt[j * 16 + i] = wp[(size_t)i * cols + j];
    const __m512 bias = _mm512_loadu_ps(wt + kk * 16);
    const __mmask16 m = (__mmask16)((1u << o) - 1u);
    for (int b = 0; b < n; b++)
        for (int r = 0; r < oh; r++) {
            const float *xr = x + ((size_t)b * h + r) * w;
            float *yr = y + (((size_t)b * oh + r) * ow) * o;
            int c0 = 0;
            for (; c0 + 8 <= ow; c0 += 8) {
                __m512 a0 = bias, a1 = bias, a2 = bias, a3 = bias, a4 = bias, a5 = bias, a6 = bias,
                       a7 = bias;
                for (int kh = 0; kh < k; kh++) {
                    const float *xp = xr + (size_t)kh * w + c0;
                    for (int kw = 0; kw < k; kw++, xp++) {
                        __m512 t = _mm512_loadu_ps(wt + (kh * k + kw) * 16);
                        a0 = _mm512_fmadd_ps(_mm512_set1_ps(xp[0]), t, a0);
                        a1 = _mm512_fmadd_ps(_mm512_set1_ps(xp[1]), t, a1);
                        a2 = _mm512_fmadd_ps(_mm512_set1_ps(xp[2]), t, a2);
                        a3 = _mm512_fmadd_ps(_mm512_set1_ps(xp[3]), t, a3);
                        a4 = _mm512_fmadd_ps(_mm512_set1_ps(xp[4]), t, a4);
                        a5 = _mm512_fmadd_ps(_mm512_set1_ps(xp[5]), t, a5);
                        a6 = _mm512_fmadd_ps(_mm512_set1_ps(xp[6]), t, a6);
                        a7 = _mm512_fmadd_ps(_mm512_set1_ps(xp[7]), t, a7);
                    }
                }
                float *yp = yr + (size_t)c0 * o;
                _mm512_mask_storeu_ps(yp, m, a0);
                _mm512_mask_storeu_ps(yp + o, m, a1);
                _mm512_mask_storeu_ps(yp + 2 * o, m, a2);
                _mm512_mask_storeu_ps(yp + 3 * o, m, a3);
                _mm512_mask_storeu_ps(yp + 4 * o, m, a4);
                _mm512_mask_storeu_ps(yp + 5 * o, m, a5);
                _mm512_mask_storeu_ps(yp + 6 * o, m, a6);
                _mm512_mask_storeu_ps(yp + 7 * o, m, a7);
            }
            for (; c0 < ow; c0++) {
                __m512 a = bias;
                for (int kh = 0; kh < k; kh++)
                    for (int kw = 0; kw < k; kw++)
                        a = _mm512_fmadd_ps(_mm512_set1_ps(xr[(size_t)kh * w + c0 + kw]),
                                            _mm512_loadu_ps(wt + (kh * k + kw) * 16), a);
                _mm512_mask_storeu_ps(yr + (size_t)c0 * o, m, a);
            }
        }
}

/* O output channels as a compile-time constant after inlining, so the 2·O accumulators stay in
 * registers. A window (kk taps and the constant 1 of the bias) spans lanes 0..kk of two
 * registers; row kh of the window is one masked load placed at lanes kh·k.. by offsetting the
 * pointer (masked-off lanes are never read, so the offset pointer is safe). */
static inline __attribute__((always_inline)) void wgrad_kernel(int n, int h, int w, int k,
                                                               const int O, const float *x,
                                                               const float *dy, float *dwp,
                                                               bool add) {
    const int oh = h - k + 1, ow = w - k + 1, kk = k * k, cols = kk + 1;
    __mmask16 lo[5], hi[5];
    for (int kh = 0; kh < k; kh++) {
        unsigned bits = ((1u << k) - 1u) << (kh * k); /* lanes kh*k .. kh*k+k-1 of 32 */
        lo[kh] = (__mmask16)(bits & 0xFFFF);
        hi[kh] = (__mmask16)(bits >> 16);
    }
    /* the bias lane, kk, always holds 1 */
    const __m512 one_lo = kk < 16 ? _mm512_mask_mov_ps(_mm512_setzero_ps(), (__mmask16)(1u << kk),
                                                       _mm512_set1_ps(1.0f))
                                  : _mm512_setzero_ps();
    const __m512 one_hi =
        kk >= 16 ? _mm512_mask_mov_ps(_mm512_setzero_ps(), (__mmask16)(1u << (kk - 16)),
                                      _mm512_set1_ps(1.0f))
                 : _mm512_setzero_ps();
    __m512 acc[24];
    for (int i = 0; i < 2 * O; i++) acc[i] = _mm512_setzero_ps();
    for (int b = 0; b < n; b++)
        for (int r = 0; r < oh; r++) {
            const float *xr = x + ((size_t)b * h + r) * w;
            const float *dr = dy + (((size_t)b * oh + r) * ow) * O;
            for (int c = 0; c < ow; c++) {
                __m512 v0 = one_lo, v1 = one_hi;
                /* most window rows lie in one register: skip the load whose mask is empty */
                for (int kh = 0; kh < k; kh++) {
                    const float *src = xr + (size_t)kh * w + c - kh * k; /* lane kh*k -> col c */
                    if (lo[kh]) v0 = _mm512_mask_loadu_ps(v0, lo[kh], src);
                    if (hi[kh]) v1 = _mm512_mask_loadu_ps(v1, hi[kh], src + 16);
                }
                const float *d = dr + (size_t)c * O;
                for (int i = 0; i < O; i++) {
                    __m512 di = _mm512_set1_ps(d[i]);
                    acc[2 * i] = _mm512_fmadd_ps(di, v0, acc[2 * i]);
                    acc[2 * i + 1] = _mm512_fmadd_ps(di, v1, acc[2 * i + 1]);
                }
            }
        }
    __mmask16 m0 = cols >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << cols) - 1u);
    __mmask16 m1 = cols > 16 ? (__mmask16)((1u << (cols - 16)) - 1u) : 0;
    for (int i = 0; i < O; i++) {
        float *dst = dwp + (size_t)i * cols;
        __m512 s0 = acc[2 * i], s1 = acc[2 * i + 1];
        if (add) {
            s0 = _mm512_add_ps(s0, _mm512_maskz_loadu_ps(m0, dst));
            s1 = _mm512_add_ps(s1, _mm512_maskz_loadu_ps(m1, dst + 16));
        }
        _mm512_mask_storeu_ps(dst, m0, s0);
        _mm512_mask_storeu_ps(dst + 16, m1, s1);
    }
}

#define WGRAD_CASE(O_)                                                                             \
    case O_:                                                                                       \
        wgrad_kernel(n, h, w, k, O_, x, dy, dwp, add);                                             \
        return;

void td_conv1ch_wgrad(int n, int h, int w, int k, int o, const float *x, const float *dy,
                      float *dwp, bool add) {
    switch (o) {
        WGRAD_CASE(1)
        WGRAD_CASE(2)
        WGRAD_CASE(3)
        WGRAD_CASE(4)
        WGRAD_CASE(5)
        WGRAD_CASE(6)
        WGRAD_CASE(7) WGRAD_CASE(8) WGRAD_CASE(9) WGRAD_CASE(10) WGRAD_CASE(11) WGRAD_CASE(12)
    }
}

#else

bool td_conv1ch_fits(int c, int k, int stride, int padding, int o) {
    (void)c, (void)k, (void)stride, (void)padding, (void)o;
    return false;
}

void td_conv1ch_forward(int n, int h, int w, int k, int o, const float *x, const float *wp,
                        float *y, float *scratch) {
    (void)n, (void)h, (void)w, (void)k, (void)o, (void)x, (void)wp, (void)y, (void)scratch;
}

void td_conv1ch_wgrad(int n, int h, int w, int k, int o, const float *x, const float *dy,
                      float *dwp, bool add) {
    (void)n, (void)h, (void)w, (void)k, (void)o, (void)x, (void)dy, (void)dwp, (void)add;
}

#endif
