#include "ops/td_conv1ch.h"

#include <string.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#include <stddef.h>

/* One kernel for the AVX2 and the AVX-512 builds, in 8-lane registers (the AVX-512 build gets
 * the EVEX encodings and 32 registers for free). An AVX-512 kernel with the output channels in
 * lanes (a pixel broadcast against all 16) used 6 of 16 lanes for LeNet and ran LeNet's conv1 at
 * twice this kernel's time on an AMD Zen 4 (0.61 against 0.28 ms a step; Zen 4 splits 512-bit
 * FMAs in two) and slower on a Xeon too, so it was removed:
 * - the forward puts 8 output pixels in a register instead of the channels (6 of 8 lanes would
 *   be used for LeNet's 6), broadcasts each weight against them (and against the same pixels of
 *   the next rows), and transposes to the [pixel, channel] layout once per 8 pixels with
 *   shuffles, which run beside the FMAs;
 * - the weight gradient's window (k·k + 1 = 26 lanes for k = 5) takes 4 registers, and O·4
 *   accumulators do not fit in 16, so it runs in passes over each image, each pass owning at most
 *   12 accumulators. For k = 5 the fourth register would hold only tap 24 and the bias; those two
 *   are summed with the channels in lanes instead. */

bool td_conv1ch_fits(int c, int k, int stride, int padding, int o) {
    return c == 1 && stride == 1 && padding == 0 && k * k + 1 <= 32 && o <= 12;
}

/* lanes [0, n) */
static inline __m256i c1_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Rows r[0..4) of 8 lanes to out[l] = (r0[l], r1[l], r2[l], r3[l]). */
static inline __attribute__((always_inline)) void c1_transpose4(const __m256 *r, __m128 *out) {
    __m256 t0 = _mm256_unpacklo_ps(r[0], r[1]), t1 = _mm256_unpackhi_ps(r[0], r[1]);
    __m256 t2 = _mm256_unpacklo_ps(r[2], r[3]), t3 = _mm256_unpackhi_ps(r[2], r[3]);
    __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
    __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
    out[0] = _mm256_castps256_ps128(u0), out[4] = _mm256_extractf128_ps(u0, 1);
    out[1] = _mm256_castps256_ps128(u1), out[5] = _mm256_extractf128_ps(u1, 1);
    out[2] = _mm256_castps256_ps128(u2), out[6] = _mm256_extractf128_ps(u2, 1);
    out[3] = _mm256_castps256_ps128(u3), out[7] = _mm256_extractf128_ps(u3, 1);
}

/* Rows r[0..8) of 8 lanes to out[l] = (r0[l], ..., r7[l]). */
static inline __attribute__((always_inline)) void c1_transpose8(const __m256 *r, __m256 *out) {
    __m256 t[8], u[8];
    for (int i = 0; i < 4; i++) {
        t[2 * i] = _mm256_unpacklo_ps(r[2 * i], r[2 * i + 1]);
        t[2 * i + 1] = _mm256_unpackhi_ps(r[2 * i], r[2 * i + 1]);
    }
    for (int i = 0; i < 2; i++) {
        u[4 * i] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0x44);
        u[4 * i + 1] = _mm256_shuffle_ps(t[4 * i], t[4 * i + 2], 0xEE);
        u[4 * i + 2] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0x44);
        u[4 * i + 3] = _mm256_shuffle_ps(t[4 * i + 1], t[4 * i + 3], 0xEE);
    }
    for (int i = 0; i < 4; i++) {
        out[i] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x20);
        out[i + 4] = _mm256_permute2f128_ps(u[i], u[i + 4], 0x31);
    }
}

/* y [8 pixels, O] from acc[o·stride] (channel o of 8 pixels). Pixel l is written whole with a
 * plain store of 8 (or 4) floats at y + l·O, whose excess lanes land on pixel l + 1 and are
 * overwritten by its store, which comes later; only the row's last pixel (last) is stored with a
 * mask, so nothing outside the row is touched. */
static inline __attribute__((always_inline)) void c1_store8(const __m256 *acc, int stride,
                                                            const int O, float *y, bool last) {
    if (O == 1) { /* already in place; 4-float stores would spill past the row */
        _mm256_storeu_ps(y, acc[0]);
        return;
    }
    if (O <= 4) {
        __m256 r[4];
        __m128 p[8];
        for (int i = 0; i < 4; i++) r[i] = i < O ? acc[i * stride] : _mm256_setzero_ps();
        c1_transpose4(r, p);
        for (int l = 0; l < 7; l++) _mm_storeu_ps(y + l * O, p[l]);
        if (last)
            _mm_maskstore_ps(y + 7 * O, _mm256_castsi256_si128(c1_mask(O)), p[7]);
        else
            _mm_storeu_ps(y + 7 * O, p[7]);
        return;
    }
    __m256 r[8], q[8], r2[4];
    __m128 p[8];
    for (int i = 0; i < 8; i++) r[i] = i < O ? acc[i * stride] : _mm256_setzero_ps();
    c1_transpose8(r, q);
    if (O > 8) {
        for (int i = 0; i < 4; i++) r2[i] = 8 + i < O ? acc[(8 + i) * stride] : _mm256_setzero_ps();
        c1_transpose4(r2, p);
    }
    for (int l = 0; l < 8; l++) {
        float *yl = y + l * O;
        if (l == 7 && last) {
            _mm256_maskstore_ps(yl, c1_mask(O), q[7]);
            if (O > 8) _mm_maskstore_ps(yl + 8, _mm256_castsi256_si128(c1_mask(O - 8)), p[7]);
        } else {
            _mm256_storeu_ps(yl, q[l]);
            if (O > 8) _mm_storeu_ps(yl + 8, p[l]);
        }
    }
}

/* Output pixels c0 .. c0 + 8 of R rows: O·R accumulators (at most 12, with R loaded input
 * vectors and a broadcast weight, or O broadcasts and an input: within 16 registers), each
 * weight broadcast serving R rows. With O·R <= 6 that is too few independent FMA chains to cover
 * the FMA latency (8 are needed: 4 cycles, 2 a cycle), so NS = 2 sets of accumulators take
 * alternate kernel rows and are summed at the end. xp: the input at (first row, c0); wt [cols, 16]
 * the weights of each tap across channels (bias last); yp: the output at (first row, c0), rows ys
 * apart; last: the block ends its rows. */
static inline __attribute__((always_inline)) void c1_fwd_block(const float *xp, int w, int k,
                                                               const int O, const int R,
                                                               const float *wt, float *yp,
                                                               size_t ys, bool last) {
    const int NA = O * R, NS = NA <= 6 ? 2 : 1;
    __m256 acc[12];
    const float *bias = wt + k * k * 16;
    for (int o = 0; o < O; o++)
        for (int q = 0; q < R; q++) acc[o * R + q] = _mm256_broadcast_ss(bias + o);
    for (int i = NA; i < NS * NA; i++) acc[i] = _mm256_setzero_ps();
    for (int kh = 0; kh < k; kh += NS)
        for (int kw = 0; kw < k; kw++)
            for (int s = 0; s < NS; s++) {
                if (s > 0 && kh + s >= k) break;
                const float *xr = xp + (size_t)(kh + s) * w + kw;
                const float *wr = wt + ((kh + s) * k + kw) * 16;
                /* whichever of inputs and weights are fewer are held in registers */
                if (R <= O) {
                    __m256 xv[6];
                    for (int q = 0; q < R; q++) xv[q] = _mm256_loadu_ps(xr + (size_t)q * w);
                    for (int o = 0; o < O; o++) {
                        __m256 wo = _mm256_broadcast_ss(wr + o);
                        for (int q = 0; q < R; q++)
                            acc[s * NA + o * R + q] =
                                _mm256_fmadd_ps(wo, xv[q], acc[s * NA + o * R + q]);
                    }
                } else {
                    __m256 wo[12];
                    for (int o = 0; o < O; o++) wo[o] = _mm256_broadcast_ss(wr + o);
                    for (int q = 0; q < R; q++) {
                        __m256 xq = _mm256_loadu_ps(xr + (size_t)q * w);
                        for (int o = 0; o < O; o++)
                            acc[s * NA + o * R + q] =
                                _mm256_fmadd_ps(wo[o], xq, acc[s * NA + o * R + q]);
                    }
                }
            }
    for (int i = 0; i < (NS - 1) * NA; i++) acc[i] = _mm256_add_ps(acc[i], acc[NA + i]);
    for (int q = 0; q < R; q++) c1_store8(acc + q, R, O, yp + q * ys, last);
}

/* One output pixel with the channels in lanes (for the few columns left over by the blocks). */
static void c1_fwd_pixel(const float *xp, int w, int k, int o, const float *wt, float *yp) {
    const int kk = k * k;
    __m256 a0 = _mm256_loadu_ps(wt + kk * 16), a1 = _mm256_loadu_ps(wt + kk * 16 + 8);
    for (int kh = 0; kh < k; kh++)
        for (int kw = 0; kw < k; kw++) {
            __m256 v = _mm256_broadcast_ss(xp + (size_t)kh * w + kw);
            const float *t = wt + (kh * k + kw) * 16;
            a0 = _mm256_fmadd_ps(v, _mm256_loadu_ps(t), a0);
            a1 = _mm256_fmadd_ps(v, _mm256_loadu_ps(t + 8), a1);
        }
    _mm256_maskstore_ps(yp, c1_mask(o), a0);
    if (o > 8) _mm256_maskstore_ps(yp + 8, c1_mask(o - 8), a1);
}

/* R rows r .. r + R of one image. */
static inline __attribute__((always_inline)) void
c1_fwd_rows(const float *xr, int w, int k, const int O, const int R, const float *wt, float *yr) {
    const int ow = w - k + 1;
    const size_t ys = (size_t)ow * O;
    int c0 = 0;
    for (; c0 + 8 <= ow; c0 += 8)
        c1_fwd_block(xr + c0, w, k, O, R, wt, yr + (size_t)c0 * O, ys, c0 + 8 == ow);
    for (; c0 < ow; c0++)
        for (int q = 0; q < R; q++)
            c1_fwd_pixel(xr + (size_t)q * w + c0, w, k, O, wt, yr + q * ys + (size_t)c0 * O);
}

/* O as a compile-time constant after inlining, so the accumulators stay in registers; blocks of
 * R rows share each weight broadcast, as many as keep O·R <= 12 (and leftover rows go one at a
 * time). */
static inline __attribute__((always_inline)) void
c1_fwd_kernel(int n, int h, int w, int k, const int O, const float *x, const float *wt, float *y) {
    const int R = O <= 2 ? 6 : O <= 3 ? 4 : O <= 4 ? 3 : O <= 6 ? 2 : 1;
    const int oh = h - k + 1, ow = w - k + 1;
    for (int b = 0; b < n; b++) {
        const float *xb = x + (size_t)b * h * w;
        float *yb = y + (size_t)b * oh * ow * O;
        int r = 0;
        for (; r + R <= oh; r += R)
            c1_fwd_rows(xb + (size_t)r * w, w, k, O, R, wt, yb + (size_t)r * ow * O);
        if (R > 1)
            for (; r < oh; r++)
                c1_fwd_rows(xb + (size_t)r * w, w, k, O, 1, wt, yb + (size_t)r * ow * O);
    }
}

#define FWD_CASE(O_)                                                                               \
    case O_:                                                                                       \
        if (k == 5)                                                                                \
            c1_fwd_kernel(n, h, w, 5, O_, x, wt, y);                                               \
        else                                                                                       \
            c1_fwd_kernel(n, h, w, k, O_, x, wt, y);                                               \
        return;

void td_conv1ch_forward(int n, int h, int w, int k, int o, const float *x, const float *wp,
                        float *y, float *scratch) {
    const int cols = k * k + 1;
    /* wt [cols, 16]: all output channels of one weight tap side by side, lanes past o zero */
    float *wt = scratch;
    memset(wt, 0, (size_t)cols * 16 * sizeof(float));
    for (int i = 0; i < o; i++)
        for (int j = 0; j < cols; j++) wt[j * 16 + i] = wp[(size_t)i * cols + j];
    // clang-format off
    switch (o) {
        FWD_CASE(1) FWD_CASE(2) FWD_CASE(3) FWD_CASE(4) FWD_CASE(5) FWD_CASE(6)
        FWD_CASE(7) FWD_CASE(8) FWD_CASE(9) FWD_CASE(10) FWD_CASE(11) FWD_CASE(12)
    }
    // clang-format on
}

/* The weight gradient sums dy[pixel, o] · window(pixel) over every output pixel. The window is
 * laid out with tap q = kh·k + kw in lane q % 8 of register q / 8 and the constant 1 of the bias
 * in lane k·k; each register is multiplied by a broadcast of dy for each output channel. */

/* k = 5 (LeNet), taps 0-23 in 3 registers from plain loads blended at fixed lanes: register 0
 * is row 0 and the start of row 1, register 1 the rest of row 1, row 2 and the start of row 3,
 * register 2 the rest of row 3 and the start of row 4. Each load is placed so that the lanes
 * kept are the right taps; the lanes dropped read neighbouring pixels, and every load lies
 * within [p, p + 4w + 5), the window's own span, so none can leave the image. This costs no
 * masks: vmaskmovps spends an ALU operation per load, and then the rows must still be merged. */
static inline __attribute__((always_inline)) __m256 c1_win5(const float *p, int w, int g) {
    const float *q1 = p + w, *q2 = q1 + w, *q3 = q2 + w, *q4 = q3 + w;
    switch (g) {
    case 0: /* row 0, row 1 taps 0-2 */
        return _mm256_blend_ps(_mm256_loadu_ps(p), _mm256_loadu_ps(q1 - 5), 0xE0);
    case 1: /* row 1 taps 3-4, row 2, row 3 tap 0 */
        return _mm256_blend_ps(
            _mm256_blend_ps(_mm256_loadu_ps(q1 + 3), _mm256_loadu_ps(q2 - 2), 0x7C),
            _mm256_loadu_ps(q3 - 7), 0x80);
    default: /* row 3 taps 1-4, row 4 taps 0-3 */
        return _mm256_blend_ps(_mm256_loadu_ps(q3 + 1), _mm256_loadu_ps(q4 - 4), 0xF0);
    }
}

/* One pass of k = 5 over an image: window registers g0 .. g0 + NG (O·NG accumulators, at most
 * 12), and with TAIL the last tap and the bias. Those two would fill a fourth register with 2
 * lanes of 8, so they are summed the other way round instead: the O channels of dy in lanes
 * (ND registers), times a broadcast of tap 24 and times 1, one FMA and one add per pixel where
 * the fourth register would cost O FMAs. Accumulators are loaded from and stored back to acc
 * [O, 32] (taps 0-23) and tail [2, 16] (tap 24, bias; lanes are channels). */
static inline __attribute__((always_inline)) void
c1_wgrad_pass5(const float *xb, const float *db, int h, int w, const int O, const int g0,
               const int NG, const bool TAIL, float *acc, float *tail) {
    const int oh = h - 4, ow = w - 4, ND = (O + 7) / 8;
    __m256 a[12], t[2], bs[2];
    __m256i dm[2];
    for (int i = 0; i < O; i++)
        for (int j = 0; j < NG; j++) a[i * NG + j] = _mm256_load_ps(acc + i * 32 + 8 * (g0 + j));
    for (int q = 0; q < (TAIL ? ND : 0); q++) {
        t[q] = _mm256_load_ps(tail + 8 * q), bs[q] = _mm256_load_ps(tail + 16 + 8 * q);
        dm[q] = c1_mask(O - 8 * q); /* dy's own O floats only: the last pixel ends the buffer */
    }
    for (int r = 0; r < oh; r++) {
        const float *xr = xb + (size_t)r * w, *d = db + (size_t)r * ow * O;
        /* two pixels an iteration: the loop is at the limit of instructions issued a cycle */
#pragma GCC unroll 2
        for (int c = 0; c < ow; c++, d += O) {
            __m256 v[3];
            for (int j = 0; j < NG; j++) v[j] = c1_win5(xr + c, w, g0 + j);
            for (int i = 0; i < O; i++) {
                __m256 di = _mm256_broadcast_ss(d + i);
                for (int j = 0; j < NG; j++)
                    a[i * NG + j] = _mm256_fmadd_ps(di, v[j], a[i * NG + j]);
            }
            if (TAIL) {
                __m256 x24 = _mm256_broadcast_ss(xr + c + 4 * w + 4);
                for (int q = 0; q < ND; q++) {
                    __m256 dv = _mm256_maskload_ps(d + 8 * q, dm[q]);
                    t[q] = _mm256_fmadd_ps(x24, dv, t[q]);
                    bs[q] = _mm256_add_ps(bs[q], dv);
                }
            }
        }
    }
    for (int i = 0; i < O; i++)
        for (int j = 0; j < NG; j++) _mm256_store_ps(acc + i * 32 + 8 * (g0 + j), a[i * NG + j]);
    for (int q = 0; q < (TAIL ? ND : 0); q++) {
        _mm256_store_ps(tail + 8 * q, t[q]);
        _mm256_store_ps(tail + 16 + 8 * q, bs[q]);
    }
}

/* Any other k: the window in 4 registers, row kh overlapping register g in lanes
 * [kh·k - 8g, kh·k - 8g + k) ∩ [0, 8), one masked load each from an offset pointer (masked-off
 * lanes are never read), merged. */
typedef struct c1_win {
    __m256i mask[4][5];
    ptrdiff_t off[4][5];
    int first[4], last[4]; /* the rows overlapping register g: [first, last) */
    __m256 one[4];         /* the bias lane of register g */
} c1_win;

static void c1_win_init(c1_win *t, int w, int k) {
    const int kk = k * k;
    for (int g = 0; g < 4; g++) {
        t->first[g] = k, t->last[g] = 0;
        for (int kh = 0; kh < k; kh++) {
            int lo = kh * k - 8 * g, hi = lo + k;
            if (hi <= 0 || lo >= 8) continue;
            if (kh < t->first[g]) t->first[g] = kh;
            t->last[g] = kh + 1;
            t->mask[g][kh] = _mm256_andnot_si256(c1_mask(lo), c1_mask(hi));
            t->off[g][kh] = (ptrdiff_t)kh * w + 8 * g - kh * k;
        }
        __m256i bias = _mm256_andnot_si256(c1_mask(kk - 8 * g), c1_mask(kk - 8 * g + 1));
        t->one[g] = _mm256_and_ps(_mm256_castsi256_ps(bias), _mm256_set1_ps(1.0f));
    }
}

/* One pass over an image for window register g: O accumulators in registers, loaded from and
 * stored back to acc [O, 32]. */
static inline __attribute__((always_inline)) void c1_wgrad_pass(const float *xb, const float *db,
                                                                int h, int w, int k, const int O,
                                                                int g, const c1_win *t,
                                                                float *acc) {
    const int oh = h - k + 1, ow = w - k + 1;
    __m256 a[12];
    for (int i = 0; i < O; i++) a[i] = _mm256_load_ps(acc + i * 32 + 8 * g);
    for (int r = 0; r < oh; r++) {
        const float *xr = xb + (size_t)r * w, *d = db + (size_t)r * ow * O;
        for (int c = 0; c < ow; c++, d += O) {
            const float *p = xr + c;
            __m256 v = t->one[g];
            for (int kh = t->first[g]; kh < t->last[g]; kh++)
                v = _mm256_or_ps(v, _mm256_maskload_ps(p + t->off[g][kh], t->mask[g][kh]));
            for (int i = 0; i < O; i++) a[i] = _mm256_fmadd_ps(_mm256_broadcast_ss(d + i), v, a[i]);
        }
    }
    for (int i = 0; i < O; i++) _mm256_store_ps(acc + i * 32 + 8 * g, a[i]);
}

/* O as a compile-time constant, so the accumulators stay in registers. They do not all fit at
 * once (O·4 registers), so each image is passed over several times, each pass owning at most
 * 12 accumulators (with the window registers and a broadcast, within 16); the image and its dy
 * are read again from L1. */
static inline __attribute__((always_inline)) void c1_wgrad_kernel(int n, int h, int w, int k,
                                                                  const int O, const float *x,
                                                                  const float *dy, float *dwp,
                                                                  bool add) {
    const int oh = h - k + 1, ow = w - k + 1, cols = k * k + 1, nreg = (cols + 7) / 8;
    _Alignas(32) float acc[12 * 32], tail[2 * 16];
    memset(acc, 0, sizeof acc);
    memset(tail, 0, sizeof tail);
    c1_win t;
    if (k != 5) c1_win_init(&t, w, k);
    for (int b = 0; b < n; b++) {
        const float *xb = x + (size_t)b * h * w, *db = dy + (size_t)b * oh * ow * O;
        if (k != 5) {
            for (int g = 0; g < nreg; g++) c1_wgrad_pass(xb, db, h, w, k, O, g, &t, acc);
        } else if (O <= 2) { /* register numbers spelled out: c1_win5 needs them constant */
            c1_wgrad_pass5(xb, db, h, w, O, 0, 3, true, acc, tail);
        } else if (O <= 6) {
            c1_wgrad_pass5(xb, db, h, w, O, 0, 2, false, acc, tail);
            c1_wgrad_pass5(xb, db, h, w, O, 2, 1, true, acc, tail);
        } else {
            c1_wgrad_pass5(xb, db, h, w, O, 0, 1, false, acc, tail);
            c1_wgrad_pass5(xb, db, h, w, O, 1, 1, false, acc, tail);
            c1_wgrad_pass5(xb, db, h, w, O, 2, 1, O <= 8, acc, tail);
            if (O > 8) c1_wgrad_pass5(xb, db, h, w, O, 0, 0, true, acc, tail);
        }
    }
    if (k == 5)
        for (int i = 0; i < O; i++) acc[i * 32 + 24] = tail[i], acc[i * 32 + 25] = tail[16 + i];
    for (int i = 0; i < O; i++)
        for (int j = 0; j < cols; j++)
            dwp[(size_t)i * cols + j] = (add ? dwp[(size_t)i * cols + j] : 0.0f) + acc[i * 32 + j];
}

#define WGRAD_CASE(O_)                                                                             \
    case O_:                                                                                       \
        c1_wgrad_kernel(n, h, w, k, O_, x, dy, dwp, add);                                          \
        return;

void td_conv1ch_wgrad(int n, int h, int w, int k, int o, const float *x, const float *dy,
                      float *dwp, bool add) {
    // clang-format off
    switch (o) {
        WGRAD_CASE(1) WGRAD_CASE(2) WGRAD_CASE(3) WGRAD_CASE(4) WGRAD_CASE(5) WGRAD_CASE(6)
        WGRAD_CASE(7) WGRAD_CASE(8) WGRAD_CASE(9) WGRAD_CASE(10) WGRAD_CASE(11) WGRAD_CASE(12)
    }
    // clang-format on
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
