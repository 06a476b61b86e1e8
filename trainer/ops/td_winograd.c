/* Winograd F(4x4, 3x3) convolution: the transforms by hand, the 36 GEMMs through OpenBLAS.
 *
 * The transforms run on 16 channels at a time (GCC's vector extension: one AVX-512 register
 * under -march=native, plain SSE or scalar code elsewhere), since channels are the contiguous
 * dimension of the activations. Tiles are processed in chunks so that a chunk's transformed
 * inputs V and products M stay in L2 between the transform, the GEMMs and the inverse transform.
 */
#include "ops/td_winograd.h"
#include "core/td_parallel.h"
#include "ops/td_gemm.h"

#include <omp.h>
#include <string.h>

typedef float vec16 __attribute__((vector_size(64)));

enum { TILE = 4, ALPHA = 6, POSITIONS = ALPHA * ALPHA, LANES = 16 };

/* n <= 16 channels from memory; the rest zero. The common full case is a fixed-size copy, which
 * the compiler turns into one vector load (a variable-size memcpy would be a library call). */
static inline void lanes_load(vec16 *d, const float *src, int n) {
    if (n == LANES) {
        memcpy(d, src, sizeof *d);
    } else {
        *d = (vec16){0};
        memcpy(d, src, (size_t)n * sizeof(float));
    }
}

static inline void lanes_store(float *dst, const vec16 *s, int n) {
    if (n == LANES)
        memcpy(dst, s, sizeof *s);
    else
        memcpy(dst, s, (size_t)n * sizeof(float));
}

/* V and M of one chunk: about 2 MiB, half of this CPU's L2 */
#define WINO_CHUNK_BYTES (2u << 20)
/* Below this many tiles per GEMM, OpenBLAS's per-call packing outweighs the multiplications */
#define WINO_MIN_CHUNK 64

bool td_wino_fits(int c, int o, int kernel, int stride, int padding) {
    return kernel == 3 && stride == 1 && padding <= 2 && c >= 16 && o >= 16;
}

td_wino td_wino_geom(int n, int h, int w, int c, int o, int p) {
    td_wino g = {.n = n, .h = h, .w = w, .c = c, .o = o, .p = p};
    g.oh = h + 2 * p - 2;
    g.ow = w + 2 * p - 2;
    g.th = (g.oh + TILE - 1) / TILE;
    g.tw = (g.ow + TILE - 1) / TILE;
    long chunk = WINO_CHUNK_BYTES / ((size_t)POSITIONS * (c + o) * sizeof(float));
    if (chunk < WINO_MIN_CHUNK) chunk = WINO_MIN_CHUNK;
    long tiles = (long)n * g.th * g.tw;
    g.chunk = (int)(chunk < tiles ? chunk : tiles);
    return g;
}

static size_t scratch_of(const td_wino *g, int threads) {
    return (size_t)POSITIONS * g->c * g->o + (size_t)threads * POSITIONS * g->chunk * (g->c + g->o);
}

/* The input gradient's convolution: dY [n, oh, ow, o] to dX [n, h, w, c]. */
static td_wino dgrad_geom(const td_wino *g) {
    return td_wino_geom(g->n, g->oh, g->ow, g->o, g->c, 2 - g->p);
}

size_t td_wino_scratch_floats(const td_wino *g, int threads) {
    td_wino d = dgrad_geom(g);
    size_t a = scratch_of(g, threads), b = scratch_of(&d, threads);
    return a > b ? a : b;
}

/* ---- the one-dimensional transforms, on vectors of 16 channels ---------------------------- */

/* r = B^T d: six tile values to six transformed ones */
static inline void wino_bt(vec16 *r, int rs, const vec16 *d, int ds) {
    vec16 d0 = d[0], d1 = d[ds], d2 = d[2 * ds], d3 = d[3 * ds], d4 = d[4 * ds], d5 = d[5 * ds];
    r[0] = 4.0f * d0 - 5.0f * d2 + d4;
    r[rs] = (d3 + d4) - 4.0f * (d1 + d2);
    r[2 * rs] = 4.0f * (d1 - d2) + (d4 - d3);
    r[3 * rs] = 2.0f * (d3 - d1) + (d4 - d2);
    r[4 * rs] = 2.0f * (d1 - d3) + (d4 - d2);
    r[5 * rs] = 4.0f * d1 - 5.0f * d3 + d5;
}

/* y = A^T m: six products to four outputs */
static inline void wino_at(vec16 *y, int ys, const vec16 *m, int ms) {
    vec16 s12 = m[ms] + m[2 * ms], d12 = m[ms] - m[2 * ms];
    vec16 s34 = m[3 * ms] + m[4 * ms], d34 = m[3 * ms] - m[4 * ms];
    y[0] = m[0] + s12 + s34;
    y[ys] = d12 + 2.0f * d34;
    y[2 * ys] = s12 + 4.0f * s34;
    y[3 * ys] = d12 + 8.0f * d34 + m[5 * ms];
}

/* m = A y: the adjoint of wino_at, four output gradients to six */
static inline void wino_a(vec16 *m, int ms, const vec16 *y, int ys) {
    vec16 y0 = y[0], y1 = y[ys], y2 = y[2 * ys], y3 = y[3 * ys];
    vec16 e = y0 + y2, o = y1 + y3, e4 = y0 + 4.0f * y2, o4 = 2.0f * y1 + 8.0f * y3;
    m[0] = y0;
    m[ms] = e + o;
    m[2 * ms] = e - o;
    m[3 * ms] = e4 + o4;
    m[4 * ms] = e4 - o4;
    m[5 * ms] = y3;
}

/* u = G g: three kernel taps to six */
static inline void wino_g(vec16 *u, int us, const vec16 *g, int gs) {
    vec16 g0 = g[0], g1 = g[gs], g2 = g[2 * gs];
    u[0] = g0 / 4.0f;
    u[us] = -(g0 + g1 + g2) / 6.0f;
    u[2 * us] = -(g0 - g1 + g2) / 6.0f;
    u[3 * us] = g0 / 24.0f + g1 / 12.0f + g2 / 6.0f;
    u[4 * us] = g0 / 24.0f - g1 / 12.0f + g2 / 6.0f;
    u[5 * us] = g2;
}

/* g = G^T u: the adjoint of wino_g */
static inline void wino_gt(vec16 *g, int gs, const vec16 *u, int us) {
    vec16 s12 = u[us] + u[2 * us], d21 = u[2 * us] - u[us];
    vec16 s34 = u[3 * us] + u[4 * us], d34 = u[3 * us] - u[4 * us];
    g[0] = u[0] / 4.0f - s12 / 6.0f + s34 / 24.0f;
    g[gs] = d21 / 6.0f + d34 / 12.0f;
    g[2 * gs] = (s34 - s12) / 6.0f + u[5 * us];
}

/* ---- whole tiles -------------------------------------------------------------------------- */

typedef struct tile_pos {
    int img, y0, x0; /* the tile's first output pixel */
} tile_pos;

static tile_pos tile_at(const td_wino *g, long t) {
    long per_image = (long)g->th * g->tw;
    int r = (int)(t % per_image);
    return (tile_pos){(int)(t / per_image), r / g->tw * TILE, r % g->tw * TILE};
}

/* V[ξ][t][c] = (B^T d B)[ξ] for tiles t in [lo, hi) of the chunk of nt tiles from t0, d the 6x6
 * input window (zero outside). */
static void transform_input(const td_wino *g, const float *x, long t0, int nt, int lo, int hi,
                            float *v) {
    const int C = g->c, H = g->h, W = g->w;
    const size_t plane = (size_t)nt * C;
    for (int t = lo; t < hi; t++) {
        tile_pos tp = tile_at(g, t0 + t);
        int y0 = tp.y0 - g->p, x0 = tp.x0 - g->p;
        const float *img = x + (size_t)tp.img * H * W * C;
        bool inside = y0 >= 0 && x0 >= 0 && y0 + ALPHA <= H && x0 + ALPHA <= W;
        for (int c0 = 0; c0 < C; c0 += LANES) {
            int nc = C - c0 < LANES ? C - c0 : LANES;
            vec16 d[ALPHA][ALPHA], u[ALPHA][ALPHA];
            if (inside) {
                for (int i = 0; i < ALPHA; i++)
                    for (int j = 0; j < ALPHA; j++)
                        lanes_load(&d[i][j], img + ((size_t)(y0 + i) * W + x0 + j) * C + c0, nc);
            } else {
                for (int i = 0; i < ALPHA; i++)
                    for (int j = 0; j < ALPHA; j++) {
                        int yy = y0 + i, xx = x0 + j;
                        if (yy >= 0 && yy < H && xx >= 0 && xx < W)
                            lanes_load(&d[i][j], img + ((size_t)yy * W + xx) * C + c0, nc);
                        else
                            d[i][j] = (vec16){0};
                    }
            }
            for (int j = 0; j < ALPHA; j++) wino_bt(&u[0][j], ALPHA, &d[0][j], ALPHA);
            for (int i = 0; i < ALPHA; i++) {
                vec16 r[ALPHA];
                wino_bt(r, 1, u[i], 1);
                float *dst = v + (size_t)i * ALPHA * plane + (size_t)t * C + c0;
                for (int j = 0; j < ALPHA; j++, dst += plane) lanes_store(dst, &r[j], nc);
            }
        }
    }
}

/* y (+)= A^T M A + bias for the chunk's tiles, clipped to the output's edge. */
static void transform_output(const td_wino *g, const float *m, long t0, int nt, const float *bias,
                             float *y, bool add) {
    const int O = g->o, OH = g->oh, OW = g->ow;
    const size_t plane = (size_t)nt * O;
    for (int t = 0; t < nt; t++) {
        tile_pos tp = tile_at(g, t0 + t);
        int rows = OH - tp.y0 < TILE ? OH - tp.y0 : TILE;
        int cols = OW - tp.x0 < TILE ? OW - tp.x0 : TILE;
        float *img = y + (size_t)tp.img * OH * OW * O;
        for (int k0 = 0; k0 < O; k0 += LANES) {
            int nk = O - k0 < LANES ? O - k0 : LANES;
            vec16 mm[ALPHA][ALPHA], s[TILE][ALPHA], b = {0};
            const float *src = m + (size_t)t * O + k0;
            for (int i = 0; i < ALPHA; i++)
                for (int j = 0; j < ALPHA; j++, src += plane) lanes_load(&mm[i][j], src, nk);
            if (bias) lanes_load(&b, bias + k0, nk);
            for (int j = 0; j < ALPHA; j++) wino_at(&s[0][j], ALPHA, &mm[0][j], ALPHA);
            for (int i = 0; i < rows; i++) {
                vec16 r[TILE];
                wino_at(r, 1, s[i], 1);
                float *dst = img + ((size_t)(tp.y0 + i) * OW + tp.x0) * O + k0;
                for (int j = 0; j < cols; j++, dst += O) {
                    vec16 out = r[j] + b;
                    if (add) {
                        vec16 old;
                        lanes_load(&old, dst, nk);
                        out += old;
                    }
                    lanes_store(dst, &out, nk);
                }
            }
        }
    }
}

/* dM[ξ][t][k] = (A dY A^T)[ξ] for tiles t in [lo, hi) of the chunk, dY zero beyond the output's
 * edge. */
static void transform_grad(const td_wino *g, const float *dy, long t0, int nt, int lo, int hi,
                           float *dm) {
    const int O = g->o, OH = g->oh, OW = g->ow;
    const size_t plane = (size_t)nt * O;
    for (int t = lo; t < hi; t++) {
        tile_pos tp = tile_at(g, t0 + t);
        int rows = OH - tp.y0 < TILE ? OH - tp.y0 : TILE;
        int cols = OW - tp.x0 < TILE ? OW - tp.x0 : TILE;
        const float *img = dy + (size_t)tp.img * OH * OW * O;
        for (int k0 = 0; k0 < O; k0 += LANES) {
            int nk = O - k0 < LANES ? O - k0 : LANES;
            vec16 d[TILE][TILE], s[ALPHA][TILE];
            if (rows < TILE || cols < TILE) memset(d, 0, sizeof d);
            for (int i = 0; i < rows; i++)
                for (int j = 0; j < cols; j++)
                    lanes_load(&d[i][j], img + ((size_t)(tp.y0 + i) * OW + tp.x0 + j) * O + k0, nk);
            for (int j = 0; j < TILE; j++) wino_a(&s[0][j], TILE, &d[0][j], TILE);
            for (int i = 0; i < ALPHA; i++) {
                vec16 r[ALPHA];
                wino_a(r, 1, s[i], 1);
                float *dst = dm + (size_t)i * ALPHA * plane + (size_t)t * O + k0;
                for (int j = 0; j < ALPHA; j++, dst += plane) lanes_store(dst, &r[j], nk);
            }
        }
    }
}

/* u [36] = G k G^T for 16 kernels at once, k [9] their taps */
static void kernel_to_tile(const vec16 *k, vec16 *u) {
    vec16 t[ALPHA][3];
    for (int j = 0; j < 3; j++) wino_g(&t[0][j], 3, k + j, 3);
    for (int i = 0; i < ALPHA; i++) wino_g(u + i * ALPHA, 1, t[i], 1);
}

/* U [36][rows][cols] from the OIHW kernel w [O, C, 3, 3], 16 columns at a time: kernel (row,
 * col) is w + (row·row_step + col·col_step)·9, its taps rotated by 180 degrees when flip. Each
 * position's 16 results are one contiguous store (scattering single floats into 36 planes a
 * megabyte apart thrashes the TLB).
 *   forward:        U [36][C][O]:  rows c, cols o (row_step 1, col_step C)
 *   input gradient: U'[36][O][C]:  rows o, cols c (row_step C, col_step 1), rotated */
static void transform_kernels(int rows, int cols, size_t row_step, size_t col_step, bool flip,
                              const float *w, float *u, int threads) {
    const size_t plane = (size_t)rows * cols;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int row = 0; row < rows; row++)
        for (int c0 = 0; c0 < cols; c0 += LANES) {
            int nc = cols - c0 < LANES ? cols - c0 : LANES;
            vec16 k[9] = {0}, r[POSITIONS];
            for (int l = 0; l < nc; l++) {
                const float *src = w + (row * row_step + (size_t)(c0 + l) * col_step) * 9;
                for (int q = 0; q < 9; q++) k[flip ? 8 - q : q][l] = src[q];
            }
            kernel_to_tile(k, r);
            float *dst = u + (size_t)row * cols + c0;
            for (int q = 0; q < POSITIONS; q++) lanes_store(dst + q * plane, &r[q], nc);
        }
}

/* dw [O, C, 3, 3] (+)= G^T dU G, dU [36][C][O], 16 output channels at a time. */
static void weight_grad(int O, int C, const float *du, float *dw, bool add, int threads) {
    const size_t plane = (size_t)C * O;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int c = 0; c < C; c++)
        for (int o0 = 0; o0 < O; o0 += LANES) {
            int no = O - o0 < LANES ? O - o0 : LANES;
            vec16 r[POSITIONS], t[3][ALPHA], k[3][3];
            const float *src = du + (size_t)c * O + o0;
            for (int q = 0; q < POSITIONS; q++) lanes_load(&r[q], src + q * plane, no);
            for (int j = 0; j < ALPHA; j++) wino_gt(&t[0][j], ALPHA, r + j, ALPHA);
            for (int i = 0; i < 3; i++) wino_gt(k[i], 1, t[i], 1);
            for (int l = 0; l < no; l++) {
                float *dst = dw + ((size_t)(o0 + l) * C + c) * 9;
                for (int q = 0; q < 9; q++) dst[q] = (add ? dst[q] : 0.0f) + k[q / 3][q % 3][l];
            }
        }
}

/* ---- the convolutions --------------------------------------------------------------------- */

/* One chunk's V and M (or V and dM): each thread of a forward has its own. */
static size_t chunk_floats(const td_wino *g) {
    return (size_t)POSITIONS * g->chunk * (g->c + g->o);
}

/* y (+)= conv(x) with the transformed kernel u [36][c][o] already in place. Every thread takes
 * whole chunks with a V and M of its own (v + k·chunk_floats for thread k): each tile's output
 * depends on that tile alone, so the chunks need no order. */
static void forward_with(const td_wino *g, const float *x, const float *u, const float *bias,
                         float *y, bool add, float *v, int threads) {
    long tiles = (long)g->n * g->th * g->tw;
    /* chunks small enough that every thread gets one (ResNet's layer4 has 64 tiles in all) */
    long chunk = g->chunk;
    if (threads > 1 && chunk * threads > tiles) chunk = (tiles + threads - 1) / threads;
    long chunks = (tiles + chunk - 1) / chunk;
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (long k = 0; k < chunks; k++) {
        long t0 = k * chunk;
        int nt = (int)(tiles - t0 < chunk ? tiles - t0 : chunk);
        float *vt = v + (size_t)omp_get_thread_num() * chunk_floats(g);
        float *m = vt + (size_t)POSITIONS * nt * g->c;
        transform_input(g, x, t0, nt, 0, nt, vt);
        for (int q = 0; q < POSITIONS; q++)
            td_sgemm(1, false, false, nt, g->o, g->c, vt + (size_t)q * nt * g->c, g->c,
                     u + (size_t)q * g->c * g->o, g->o, m + (size_t)q * nt * g->o, g->o, false);
        transform_output(g, m, t0, nt, bias, y, add);
    }
}

void td_wino_forward(const td_wino *g, const float *x, const float *w, const float *bias, float *y,
                     bool add, float *scratch, int threads) {
    float *u = scratch, *v = u + (size_t)POSITIONS * g->c * g->o;
    transform_kernels(g->c, g->o, 1, (size_t)g->c, false, w, u, threads);
    forward_with(g, x, u, bias, y, add, v, threads);
}

void td_wino_backward(const td_wino *g, const float *x, const float *w, const float *dy, float *dw,
                      bool add_w, float *dx, bool add_x, float *scratch, int threads) {
    float *du = scratch, *v = du + (size_t)POSITIONS * g->c * g->o;
    long tiles = (long)g->n * g->th * g->tw;
    /* dU sums over every chunk: the team shares one chunk at a time, its tiles transformed by
     * all threads, then its 36 GEMMs dealt out by position. Chunks and the order they add up in
     * are a single thread's, so the weight gradient is too. */
#pragma omp parallel num_threads(threads) if (threads > 1)
    for (long t0 = 0; t0 < tiles; t0 += g->chunk) {
        int nt = (int)(tiles - t0 < g->chunk ? tiles - t0 : g->chunk);
        float *dm = v + (size_t)POSITIONS * nt * g->c;
        size_t lo, hi;
        td_par_range((size_t)nt, omp_get_num_threads(), omp_get_thread_num(), 1, &lo, &hi);
        transform_input(g, x, t0, nt, (int)lo, (int)hi, v);
        transform_grad(g, dy, t0, nt, (int)lo, (int)hi, dm);
#pragma omp barrier
        /* dU[ξ] [C, O] (+)= V[ξ]^T [C, tiles] · dM[ξ] [tiles, O] */
#pragma omp for schedule(static)
        for (int q = 0; q < POSITIONS; q++)
            td_sgemm(1, true, false, g->c, g->o, nt, v + (size_t)q * nt * g->c, g->c,
                     dm + (size_t)q * nt * g->o, g->o, du + (size_t)q * g->c * g->o, g->o, t0 > 0);
        /* (the loop's implicit barrier: the next chunk overwrites V and dM) */
    }
    weight_grad(g->o, g->c, du, dw, add_w, threads);
    if (!dx) return;
    td_wino d = dgrad_geom(g);
    float *u = scratch; /* dU is spent: the rotated kernel takes its place */
    transform_kernels(g->o, g->c, (size_t)g->c, 1, true, w, u, threads);
    forward_with(&d, dy, u, NULL, dx, add_x, u + (size_t)POSITIONS * g->c * g->o, threads);
}
