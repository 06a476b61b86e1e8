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

bool td_skinny_nn(int rows, int n, int o, const float *dy, const float *b, int ldb, float *c,
                  int ldc, bool add) {
    (void)rows, (void)n, (void)o, (void)dy, (void)b, (void)ldb, (void)c, (void)ldc, (void)add;
    return false; /* OpenBLAS: this variant is unmeasured (td_skinny.h) */
}

#elif defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>

/* lanes [0, n) */
static inline __m256i sk_mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

/* Row y[r] from NW registers (o <= 8·NW). Rows are stored in order, each with whole vectors
 * whose excess lanes spill onto the rows after it, which are stored later and overwrite them;
 * rows whose spill would pass the end of y (safe false) use masked stores instead. Plain stores
 * are cheaper than vmaskmovps, much so on AMD before Zen 3. */
static inline __attribute__((always_inline)) void sk_store_row(float *yr, const __m256 *c,
                                                               const int NW, int o, bool safe) {
    if (NW == 1) {
        if (safe)
            _mm256_storeu_ps(yr, c[0]);
        else
            _mm256_maskstore_ps(yr, sk_mask(o), c[0]);
    } else {
        _mm256_storeu_ps(yr, c[0]);
        if (safe)
            _mm256_storeu_ps(yr + 8, c[1]);
        else
            _mm256_maskstore_ps(yr + 8, sk_mask(o - 8), c[1]);
    }
}

/* R rows of y at once: each weight column (NW registers of outputs) is loaded once for R
 * broadcasts. R·NW = 12 accumulators, with NW weight registers and a broadcast: 14-15 of 16. */
static inline __attribute__((always_inline)) void sk_nt(int rows, int o, int k, const float *a,
                                                        const float *wt, float *y, const int NW) {
    const int R = 12 / NW;
    const size_t end = (size_t)rows * o; /* a store must end here */
    int r = 0;
    for (; r + R <= rows; r += R) {
        const float *a0 = a + (size_t)r * k;
        __m256 c[12];
        for (int i = 0; i < R * NW; i++) c[i] = _mm256_setzero_ps();
        for (int j = 0; j < k; j++) {
            __m256 w0 = _mm256_loadu_ps(wt + j * 16), w1 = _mm256_loadu_ps(wt + j * 16 + 8);
            for (int i = 0; i < R; i++) {
                __m256 ai = _mm256_broadcast_ss(a0 + (size_t)i * k + j);
                c[i * NW] = _mm256_fmadd_ps(ai, w0, c[i * NW]);
                if (NW > 1) c[i * NW + 1] = _mm256_fmadd_ps(ai, w1, c[i * NW + 1]);
            }
        }
        bool safe = (size_t)(r + R - 1) * o + 8 * NW <= end;
        for (int i = 0; i < R; i++) sk_store_row(y + (size_t)(r + i) * o, c + i * NW, NW, o, safe);
    }
    for (; r < rows; r++) {
        const float *a0 = a + (size_t)r * k;
        __m256 c[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
        for (int j = 0; j < k; j++) {
            __m256 aj = _mm256_broadcast_ss(a0 + j);
            c[0] = _mm256_fmadd_ps(aj, _mm256_loadu_ps(wt + j * 16), c[0]);
            if (NW > 1) c[1] = _mm256_fmadd_ps(aj, _mm256_loadu_ps(wt + j * 16 + 8), c[1]);
        }
        sk_store_row(y + (size_t)r * o, c, NW, o, (size_t)r * o + 8 * NW <= end);
    }
}

bool td_skinny_nt(int rows, int o, int k, const float *a, const float *w, float *y,
                  float *scratch) {
    if (o > 16) return false;
    /* wt [k, 16]: column j of w^T in two registers, lanes past o zero */
    float *wt = scratch;
    memset(wt, 0, (size_t)k * 16 * sizeof(float));
    for (int i = 0; i < o; i++)
        for (int j = 0; j < k; j++) wt[j * 16 + i] = w[(size_t)i * k + j];
    if (o <= 8)
        sk_nt(rows, o, k, a, wt, y, 1);
    else
        sk_nt(rows, o, k, a, wt, y, 2);
    return true;
}

/* dw[i0 .. i0+OB, 8·v0 .. 8·(v0+NV)) += dy[r0..r1, i0..)^T · a[r0..r1, 8·v0..): OB·NV
 * accumulators (at most 12), with NV vectors of a row and a broadcast of dy, within 16
 * registers. The last vector of a row may run past k into the rows after it: those lanes only
 * reach accumulator lanes that are never stored (the caller keeps out the rows whose reads
 * would pass the end of a). dw is loaded and stored with masks: its rows are other tiles'. */
static inline __attribute__((always_inline)) void sk_tn_tile(const float *dy, int o, const float *a,
                                                             int k, int r0, int r1, const int OB,
                                                             const int NV, int i0, int v0,
                                                             float *dw) {
    __m256 acc[12];
    __m256i m[4];
    for (int j = 0; j < NV; j++) m[j] = sk_mask(k - 8 * (v0 + j));
    for (int i = 0; i < OB; i++)
        for (int j = 0; j < NV; j++)
            acc[i * NV + j] = _mm256_maskload_ps(dw + (size_t)(i0 + i) * k + 8 * (v0 + j), m[j]);
    const float *ar = a + (size_t)r0 * k + 8 * v0, *d = dy + (size_t)r0 * o + i0;
    for (int r = r0; r < r1; r++, ar += k, d += o) {
        __m256 av[4];
        for (int j = 0; j < NV; j++) av[j] = _mm256_loadu_ps(ar + 8 * j);
        for (int i = 0; i < OB; i++) {
            __m256 di = _mm256_broadcast_ss(d + i);
            for (int j = 0; j < NV; j++)
                acc[i * NV + j] = _mm256_fmadd_ps(di, av[j], acc[i * NV + j]);
        }
    }
    for (int i = 0; i < OB; i++)
        for (int j = 0; j < NV; j++)
            _mm256_maskstore_ps(dw + (size_t)(i0 + i) * k + 8 * (v0 + j), m[j], acc[i * NV + j]);
}

/* vectors of a per tile for OB outputs: OB·NV <= 12, and NV + OB·NV + 1 <= 16 */
static inline int sk_tn_nv(int ob) {
    return ob <= 2 ? 4 : ob == 3 ? 3 : 2;
}

#define TN_CASE(O_, NV_)                                                                           \
    case (O_)*8 + (NV_):                                                                           \
        sk_tn_tile(dy, o, a, k, r0, r1, O_, NV_, i0, v0, dw);                                      \
        break;

/* AVX2's limit on k: the tiles read a in row blocks of about 16 KB, which stay in L1 while every
 * tile passes over them; past a few hundred columns a block is too few rows to pay for loading
 * and storing the tiles, and OpenBLAS's packed GEMM does better. */
#define SK_TN_MAX_K 512

bool td_skinny_tn(int rows, int o, int k, const float *dy, const float *a, float *dw, bool add) {
    if (o > 16 || k > SK_TN_MAX_K) return false;
    if (!add) memset(dw, 0, (size_t)o * k * sizeof(float));
    if (rows <= 0) return true;
    /* outputs in nob blocks of at most 6, and column panels of nvb vectors that suit the
     * largest block; for each panel every output block runs while the panel is still in L1 */
    const int nvec = (k + 7) / 8, nob = (o + 5) / 6, nvb = sk_tn_nv((o + nob - 1) / nob);
    /* The last vector of a row reads ext = 8·nvec - k floats past its end (into the rows after
     * it), so the last ceil(ext / k) rows, whose reads would pass the end of a, are added alone
     * below with masked loads. */
    const int ext = 8 * nvec - k, tail = (ext + k - 1) / k;
    const int body = rows > tail ? rows - tail : 0;
    /* rows in blocks of about 128 KB of a and dy, which stay in L2 while the tiles pass over
     * them; the tiles load and store their accumulators once per block */
    int rb = (128 << 10) / (int)(sizeof(float) * (size_t)(k + o));
    if (rb < 64) rb = 64;
    for (int r0 = 0; r0 < body; r0 += rb) {
        int r1 = body - r0 < rb ? body : r0 + rb;
        for (int v0 = 0; v0 < nvec; v0 += nvb) {
            int nv = nvec - v0 < nvb ? nvec - v0 : nvb;
            for (int b = 0; b < nob; b++) {
                int i0 = b * o / nob, ob = (b + 1) * o / nob - i0;
                /* one instantiation per (outputs, vectors) pair: accumulators in registers */
                // clang-format off
                switch (ob * 8 + nv) {
                    TN_CASE(1, 1) TN_CASE(1, 2) TN_CASE(1, 3) TN_CASE(1, 4)
                    TN_CASE(2, 1) TN_CASE(2, 2) TN_CASE(2, 3) TN_CASE(2, 4)
                    TN_CASE(3, 1) TN_CASE(3, 2) TN_CASE(3, 3)
                    TN_CASE(4, 1) TN_CASE(4, 2) TN_CASE(5, 1) TN_CASE(5, 2)
                    TN_CASE(6, 1) TN_CASE(6, 2)
                }
                // clang-format on
            }
        }
    }
    for (int r = body; r < rows; r++) {
        const float *al = a + (size_t)r * k, *dl = dy + (size_t)r * o;
        for (int i = 0; i < o; i++) {
            __m256 di = _mm256_broadcast_ss(dl + i);
            float *dst = dw + (size_t)i * k;
            for (int j = 0; j < k; j += 8) {
                __m256i m = sk_mask(k - j);
                __m256 s = _mm256_fmadd_ps(di, _mm256_maskload_ps(al + j, m),
                                           _mm256_maskload_ps(dst + j, m));
                _mm256_maskstore_ps(dst + j, m, s);
            }
        }
    }
    return true;
}

/* R rows by NV vectors of c from o rank-one updates: R·NV <= 12 accumulators, NV rows of b and a
 * broadcast of dy within 16 registers. The last vector may be partial (mask `last`): b and c are
 * read and written through the mask there, since b's and c's rows may end where the array does. */
static inline __attribute__((always_inline)) void
sk_nn_tile(const float *dy, int o, const float *b, int ldb, float *c, int ldc, const int R,
           const int NV, __m256i last, const bool full, bool add) {
    __m256 acc[12];
    for (int i = 0; i < R * NV; i++) acc[i] = _mm256_setzero_ps();
    for (int q = 0; q < o; q++) {
        const float *bq = b + (size_t)q * ldb;
        __m256 bv[3];
        for (int v = 0; v < NV; v++)
            bv[v] = v + 1 < NV || full ? _mm256_loadu_ps(bq + 8 * v)
                                       : _mm256_maskload_ps(bq + 8 * v, last);
        for (int i = 0; i < R; i++) {
            __m256 d = _mm256_broadcast_ss(dy + (size_t)i * o + q);
            for (int v = 0; v < NV; v++)
                acc[i * NV + v] = _mm256_fmadd_ps(d, bv[v], acc[i * NV + v]);
        }
    }
    for (int i = 0; i < R; i++)
        for (int v = 0; v < NV; v++) {
            float *dst = c + (size_t)i * ldc + 8 * v;
            __m256 s = acc[i * NV + v];
            if (v + 1 < NV || full) {
                if (add) s = _mm256_add_ps(s, _mm256_loadu_ps(dst));
                _mm256_storeu_ps(dst, s);
            } else {
                if (add) s = _mm256_add_ps(s, _mm256_maskload_ps(dst, last));
                _mm256_maskstore_ps(dst, last, s);
            }
        }
}

/* One panel of NV vectors (the last one partial unless full) down all rows, 4 rows at a time. */
static inline __attribute__((always_inline)) void sk_nn_panel(int rows, int o, const float *dy,
                                                              const float *b, int ldb, float *c,
                                                              int ldc, const int NV, __m256i last,
                                                              const bool full, bool add) {
    int r = 0;
    for (; r + 4 <= rows; r += 4)
        sk_nn_tile(dy + (size_t)r * o, o, b, ldb, c + (size_t)r * ldc, ldc, 4, NV, last, full, add);
    for (; r < rows; r++)
        sk_nn_tile(dy + (size_t)r * o, o, b, ldb, c + (size_t)r * ldc, ldc, 1, NV, last, full, add);
}

bool td_skinny_nn(int rows, int n, int o, const float *dy, const float *b, int ldb, float *c,
                  int ldc, bool add) {
    if (o > 16) return false;
    /* panels of 3 vectors (24 columns of c, o rows of b: at most 1.5 KB, in L1 for every row) */
    for (int j = 0; j < n; j += 24) {
        int left = n - j, nv = left >= 24 ? 3 : (left + 7) / 8;
        bool full = left >= 8 * nv;
        __m256i last = sk_mask(left - 8 * (nv - 1));
        /* one instantiation per (vectors, whether the last is whole) */
        const float *bj = b + j;
        float *cj = c + j;
        if (nv == 3 && full)
            sk_nn_panel(rows, o, dy, bj, ldb, cj, ldc, 3, last, true, add);
        else if (nv == 3)
            sk_nn_panel(rows, o, dy, bj, ldb, cj, ldc, 3, last, false, add);
        else if (nv == 2 && full)
            sk_nn_panel(rows, o, dy, bj, ldb, cj, ldc, 2, last, true, add);
        else if (nv == 2)
            sk_nn_panel(rows, o, dy, bj, ldb, cj, ldc, 2, last, false, add);
        else if (full)
            sk_nn_panel(rows, o, dy, bj, ldb, cj, ldc, 1, last, true, add);
        else
            sk_nn_panel(rows, o, dy, bj, ldb, cj, ldc, 1, last, false, add);
    }
    return true;
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

bool td_skinny_nn(int rows, int n, int o, const float *dy, const float *b, int ldb, float *c,
                  int ldc, bool add) {
    (void)rows, (void)n, (void)o, (void)dy, (void)b, (void)ldb, (void)c, (void)ldc, (void)add;
    return false;
}

#endif
