#include "ops/td_gemm.h"
#include "core/td_parallel.h"

#include <cblas.h>
#include <stdlib.h>
#include <string.h>

#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#include <immintrin.h>

enum {
    TILE_M = 6,  /* rows of c a tile holds: 12 accumulators, two vectors of b, a broadcast */
    TILE_N = 16, /* columns: two AVX2 vectors */
    /* The inner size in blocks of 256: a panel of b (16 KB) stays in L1 while every row panel
     * of a passes it; a row panel of a (6 KB) comes from L2. */
    BLOCK_K = 256,
    /* the most floats of a transposed a packed into tiles (pack_a_transposed): 512 KB */
    PACK_A_MAX = 128 * 1024,
};

/* b's panel of `cols` <= 16 columns from j0 and kc inner rows from p0, as [kc][16] (zeros past
 * cols): op(b) (p, j) is b[p·ldb + j], or b[j·ldb + p] where tb. */
static void pack_b(bool tb, const float *b, int ldb, int p0, int kc, int j0, int cols, float *bp) {
    if (!tb && cols == TILE_N) { /* two vector copies a row: a memcpy call each cost 10% */
        for (int p = 0; p < kc; p++, bp += TILE_N) {
            const float *src = b + (size_t)(p0 + p) * ldb + j0;
            _mm256_storeu_ps(bp, _mm256_loadu_ps(src));
            _mm256_storeu_ps(bp + 8, _mm256_loadu_ps(src + 8));
        }
        return;
    }
    if (!tb) {
        for (int p = 0; p < kc; p++, bp += TILE_N) {
            memcpy(bp, b + (size_t)(p0 + p) * ldb + j0, (size_t)cols * sizeof(float));
            for (int j = cols; j < TILE_N; j++) bp[j] = 0.0f;
        }
        return;
    }
    /* op(b)^T's rows are contiguous: transposed 8 x 8 at a time */
    const float *src = b + (size_t)j0 * ldb + p0;
    int p = 0;
    if (cols == TILE_N) {
        for (; p + 8 <= kc; p += 8)
            for (int half = 0; half < 2; half++) {
                const float *s = src + (size_t)(8 * half) * ldb + p;
                __m256 r0 = _mm256_loadu_ps(s), r1 = _mm256_loadu_ps(s + ldb),
                       r2 = _mm256_loadu_ps(s + 2 * (size_t)ldb),
                       r3 = _mm256_loadu_ps(s + 3 * (size_t)ldb),
                       r4 = _mm256_loadu_ps(s + 4 * (size_t)ldb),
                       r5 = _mm256_loadu_ps(s + 5 * (size_t)ldb),
                       r6 = _mm256_loadu_ps(s + 6 * (size_t)ldb),
                       r7 = _mm256_loadu_ps(s + 7 * (size_t)ldb);
                __m256 t0 = _mm256_unpacklo_ps(r0, r1), t1 = _mm256_unpackhi_ps(r0, r1),
                       t2 = _mm256_unpacklo_ps(r2, r3), t3 = _mm256_unpackhi_ps(r2, r3),
                       t4 = _mm256_unpacklo_ps(r4, r5), t5 = _mm256_unpackhi_ps(r4, r5),
                       t6 = _mm256_unpacklo_ps(r6, r7), t7 = _mm256_unpackhi_ps(r6, r7);
                /* u_q: inner index q (rows 0-3) in the low lane, q + 4 in the high one */
                __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE),
                       u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE),
                       u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE),
                       u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
                float *d = bp + (size_t)p * TILE_N + 8 * half;
                _mm256_storeu_ps(d, _mm256_permute2f128_ps(u0, u4, 0x20));
                _mm256_storeu_ps(d + TILE_N, _mm256_permute2f128_ps(u1, u5, 0x20));
                _mm256_storeu_ps(d + 2 * TILE_N, _mm256_permute2f128_ps(u2, u6, 0x20));
                _mm256_storeu_ps(d + 3 * TILE_N, _mm256_permute2f128_ps(u3, u7, 0x20));
                _mm256_storeu_ps(d + 4 * TILE_N, _mm256_permute2f128_ps(u0, u4, 0x31));
                _mm256_storeu_ps(d + 5 * TILE_N, _mm256_permute2f128_ps(u1, u5, 0x31));
                _mm256_storeu_ps(d + 6 * TILE_N, _mm256_permute2f128_ps(u2, u6, 0x31));
                _mm256_storeu_ps(d + 7 * TILE_N, _mm256_permute2f128_ps(u3, u7, 0x31));
            }
    }
    for (; p < kc; p++)
        for (int j = 0; j < TILE_N; j++)
            bp[(size_t)p * TILE_N + j] = j < cols ? src[(size_t)j * ldb + p] : 0.0f;
}

/* c's tile of R rows (a compile-time constant after inlining) and `cols` <= 16 columns: the
 * kc-long products of a's rows, a_row floats apart and a_col from one inner index to the next,
 * with the packed panel bp; stored, or added where add. Each element is summed over the inner
 * index in order, so its bits do not depend on where the tiles fall. The accumulators are named
 * variables, not an array: GCC then keeps all twelve in registers. */
static inline __attribute__((always_inline)) void tile(const int R, int kc, const float *a,
                                                       size_t a_row, size_t a_col, const float *bp,
                                                       float *c, int ldc, int cols, bool add) {
    __m256 c00 = _mm256_setzero_ps(), c01 = c00, c10 = c00, c11 = c00, c20 = c00, c21 = c00,
           c30 = c00, c31 = c00, c40 = c00, c41 = c00, c50 = c00, c51 = c00;
    /* rows past R read row 0 again (always inside a) and are never stored */
    const float *a0 = a, *a1 = R > 1 ? a + a_row : a, *a2 = R > 2 ? a + 2 * a_row : a,
                *a3 = R > 3 ? a + 3 * a_row : a, *a4 = R > 4 ? a + 4 * a_row : a,
                *a5 = R > 5 ? a + 5 * a_row : a;
    for (int p = 0; p < kc; p++, bp += TILE_N) {
        __m256 b0 = _mm256_loadu_ps(bp), b1 = _mm256_loadu_ps(bp + 8), x;
        size_t at = (size_t)p * a_col;
        x = _mm256_broadcast_ss(a0 + at);
        c00 = _mm256_fmadd_ps(x, b0, c00);
        c01 = _mm256_fmadd_ps(x, b1, c01);
        if (R > 1) {
            x = _mm256_broadcast_ss(a1 + at);
            c10 = _mm256_fmadd_ps(x, b0, c10);
            c11 = _mm256_fmadd_ps(x, b1, c11);
        }
        if (R > 2) {
            x = _mm256_broadcast_ss(a2 + at);
            c20 = _mm256_fmadd_ps(x, b0, c20);
            c21 = _mm256_fmadd_ps(x, b1, c21);
        }
        if (R > 3) {
            x = _mm256_broadcast_ss(a3 + at);
            c30 = _mm256_fmadd_ps(x, b0, c30);
            c31 = _mm256_fmadd_ps(x, b1, c31);
        }
        if (R > 4) {
            x = _mm256_broadcast_ss(a4 + at);
            c40 = _mm256_fmadd_ps(x, b0, c40);
            c41 = _mm256_fmadd_ps(x, b1, c41);
        }
        if (R > 5) {
            x = _mm256_broadcast_ss(a5 + at);
            c50 = _mm256_fmadd_ps(x, b0, c50);
            c51 = _mm256_fmadd_ps(x, b1, c51);
        }
    }
    const __m256 rows[2 * TILE_M] = {c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51};
    for (int r = 0; r < R; r++, c += ldc) {
        __m256 lo = rows[2 * r], hi = rows[2 * r + 1];
        if (cols == TILE_N) {
            if (add) {
                lo = _mm256_add_ps(_mm256_loadu_ps(c), lo);
                hi = _mm256_add_ps(_mm256_loadu_ps(c + 8), hi);
            }
            _mm256_storeu_ps(c, lo);
            _mm256_storeu_ps(c + 8, hi);
            continue;
        }
        float t[TILE_N]; /* the last column panel: only its columns inside c are written */
        _mm256_storeu_ps(t, lo);
        _mm256_storeu_ps(t + 8, hi);
        for (int j = 0; j < cols; j++) c[j] = add ? c[j] + t[j] : t[j];
    }
}

/* Part `part` of `parts` of the cache lines pack_b will read for the panel from j0: asked for
 * while the tiles of the panel before run, so that a b just written by the optimizer (the
 * weights), or not read since the last step, comes from memory in the background; without it
 * the packing waits on each line (in a training step the GEMMs ran 8-10% below their speed on
 * cache-warm operands). */
static inline void prefetch_panel(bool tb, const float *b, int ldb, int p0, int kc, int j0,
                                  int part, int parts) {
    if (tb) { /* 16 rows of b^T, kc floats each: 16 lines of each row */
        int per_row = (kc + 15) / 16, lines = TILE_N * per_row;
        for (int q = lines * part / parts; q < lines * (part + 1) / parts; q++)
            _mm_prefetch(
                (const char *)(b + (size_t)(j0 + q / per_row) * ldb + p0 + 16 * (q % per_row)),
                _MM_HINT_T0);
    } else { /* kc rows, 16 floats (one or two lines) of each */
        for (int q = kc * part / parts; q < kc * (part + 1) / parts; q++) {
            const float *at = b + (size_t)(p0 + q) * ldb + j0;
            _mm_prefetch((const char *)at, _MM_HINT_T0);
            _mm_prefetch((const char *)(at + 15), _MM_HINT_T0);
        }
    }
}

/* Column panel j0 (cols <= 16 wide) of c over the inner block p0 (kc deep), for a's element
 * (i, p) at a[i·a_row + p·a_col]: packs that panel of b, then runs every row tile past it. The
 * lines of the panel packed next (the next block of this panel, else the first of the next
 * panel: next_p0, next_j0; next_j0 == n where none) are asked for, spread over the tiles. */
static inline __attribute__((always_inline)) void
panel(int m, int n, int kc, const float *a, size_t a_row, size_t a_col, size_t a_tile, bool tb,
      const float *b, int ldb, int p0, int j0, int cols, int next_p0, int next_kc, int next_j0,
      float *c, int ldc, bool add, float *bp) {
    pack_b(tb, b, ldb, p0, kc, j0, cols, bp);
    /* spread over the full tiles, the ones that ask: counting the last, partial one too left
     * its share of the lines (1/22 of the panel at m = 128) never asked for */
    int full = m / TILE_M;
    bool ahead = next_j0 + TILE_N <= n; /* the last, narrower panel is not worth it */
    int i0 = 0;
    for (; i0 + TILE_M <= m; i0 += TILE_M) {
        if (ahead) prefetch_panel(tb, b, ldb, next_p0, next_kc, next_j0, i0 / TILE_M, full);
        tile(TILE_M, kc, a + (size_t)(i0 / TILE_M) * a_tile, a_row, a_col, bp,
             c + (size_t)i0 * ldc + j0, ldc, cols, add);
    }
    const float *ai = a + (size_t)(i0 / TILE_M) * a_tile;
    float *ci = c + (size_t)i0 * ldc + j0;
    switch (m - i0) {
    case 5:
        tile(5, kc, ai, a_row, a_col, bp, ci, ldc, cols, add);
        break;
    case 4:
        tile(4, kc, ai, a_row, a_col, bp, ci, ldc, cols, add);
        break;
    case 3:
        tile(3, kc, ai, a_row, a_col, bp, ci, ldc, cols, add);
        break;
    case 2:
        tile(2, kc, ai, a_row, a_col, bp, ci, ldc, cols, add);
        break;
    case 1:
        tile(1, kc, ai, a_row, a_col, bp, ci, ldc, cols, add);
        break;
    }
}

/* The whole product for a's element (i, p) at a[i·a_row + p·a_col]. Column panels outermost,
 * the inner blocks inside each: the panel's slice of c (m x 16, 8 KB at m = 128) stays in L1
 * from one block to the next, where blocks outermost went through all of c once a block (from
 * L2; the MLP's forward GEMMs, 784 and 512 deep, stalled on those loads). a is read once a panel
 * either way. */
static inline __attribute__((always_inline)) void product(int m, int n, int k, const float *a,
                                                          size_t a_row, size_t a_col, size_t a_tile,
                                                          bool tb, const float *b, int ldb,
                                                          float *c, int ldc, bool add, float *bp) {
    for (int j0 = 0; j0 < n; j0 += TILE_N) {
        int cols = n - j0 < TILE_N ? n - j0 : TILE_N;
        for (int p0 = 0; p0 < k; p0 += BLOCK_K) {
            int kc = k - p0 < BLOCK_K ? k - p0 : BLOCK_K;
            bool more = p0 + BLOCK_K < k; /* the next block of this panel, else the next panel */
            int next_p0 = more ? p0 + BLOCK_K : 0, next_j0 = more ? j0 : j0 + TILE_N;
            int next_kc = k - next_p0 < BLOCK_K ? k - next_p0 : BLOCK_K;
            /* later blocks add onto the earlier ones */
            panel(m, n, kc, a + p0 * a_col, a_row, a_col, a_tile, tb, b, ldb, p0, j0, cols, next_p0,
                  next_kc, next_j0, c, ldc, add || p0 > 0, bp);
        }
    }
}

/* a transposed ([k, m], rows lda apart) as tiles of 6 of its columns, each tile [k][6]: the
 * tile then reads one sequential stream, where in place it takes 6 floats from each of k rows
 * 4·lda bytes apart, a line each. The MLP's weight gradients (m = 512 outputs, k = the batch)
 * read their a so; with another process streaming memory on the other core they ran up to 5%
 * below OpenBLAS, which packs, and 5-10% above it packed. Rows past m in the last tile are
 * zeros. */
static void pack_a_transposed(const float *a, int lda, int m, int k, float *ap) {
    int tiles = (m + TILE_M - 1) / TILE_M;
    for (int t = 0; t < tiles; t++) {
        int i0 = t * TILE_M, rows = m - i0 < TILE_M ? m - i0 : TILE_M;
        float *d = ap + (size_t)t * k * TILE_M;
        for (int p = 0; p < k; p++, d += TILE_M) {
            const float *src = a + (size_t)p * lda + i0;
            for (int r = 0; r < TILE_M; r++) d[r] = r < rows ? src[r] : 0.0f;
        }
    }
}

bool td_gemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b,
             int ldb, float *c, int ldc, bool add) {
    if (m < 1 || n < 1 || k < 1) return false;
    float bp[BLOCK_K * TILE_N] __attribute__((aligned(32))); /* 16 KB: a packed panel of b */
    size_t tiles = (size_t)(m + TILE_M - 1) / TILE_M, packed = tiles * (size_t)k * TILE_M;
    if (!ta) { /* rows of a contiguous: read in place, each tile 6 sequential streams */
        product(m, n, k, a, (size_t)lda, 1, TILE_M * (size_t)lda, tb, b, ldb, c, ldc, add, bp);
        return true;
    }
    /* Packing is one more pass over a, paid back by the panels that reuse it: only where there
     * are at least 4 and the copy stays in L2 (a 1x1 convolution's weight gradient, k the batch
     * times the pixels, would copy megabytes for few panels). */
    if (n < 4 * TILE_N || packed > PACK_A_MAX) {
        product(m, n, k, a, 1, (size_t)lda, TILE_M, tb, b, ldb, c, ldc, add, bp);
        return true;
    }
    /* from the heap: a few hundred KB, more than a team thread's stack should hold; glibc
     * keeps a freed block of this size for the next call rather than unmapping it */
    float *ap = aligned_alloc(32, (packed * sizeof(float) + 31) & ~(size_t)31);
    if (!ap) return false; /* the caller falls back to OpenBLAS */
    pack_a_transposed(a, lda, m, k, ap);
    product(m, n, k, ap, 1, TILE_M, (size_t)k * TILE_M, tb, b, ldb, c, ldc, add, bp);
    free(ap);
    return true;
}

#else
/* Baseline and AVX-512: OpenBLAS (td_gemm.h says why). */

bool td_gemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b,
             int ldb, float *c, int ldc, bool add) {
    (void)ta, (void)tb, (void)m, (void)n, (void)k, (void)a, (void)lda, (void)b, (void)ldb;
    (void)c, (void)ldc, (void)add;
    return false;
}
#endif

void td_sgemm(int threads, bool ta, bool tb, int m, int n, int k, const float *a, int lda,
              const float *b, int ldb, float *c, int ldc, bool add) {
    if (threads <= 1 && td_gemm(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, add)) return;
    td_par_sgemm(threads, ta ? CblasTrans : CblasNoTrans, tb ? CblasTrans : CblasNoTrans, m, n, k,
                 1.0f, a, lda, b, ldb, add ? 1.0f : 0.0f, c, ldc);
}
