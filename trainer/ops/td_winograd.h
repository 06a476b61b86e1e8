/* Winograd F(4x4, 3x3): stride-1 3x3 convolutions over channels-last activations with 4x fewer
 * multiplications than im2col + GEMM.
 *
 * ResNet's 3x3 stride-1 convolutions are nearly nine tenths of its work, and im2col + GEMM runs
 * them at the GEMM's speed, which OpenBLAS already takes close to what this CPU does. Fewer
 * multiplications are the only way left to go faster. Every 4x4 block of outputs is computed from
 * the 6x6 input tile around it (Lavin and Gray, "Fast Algorithms for Convolutional Neural
 * Networks", 2016, with the interpolation points 0, ±1, ±2 and infinity):
 *
 *     Y = A^T [ (G g G^T) ⊙ (B^T d B) ] A
 *
 * and the sum over input channels of the elementwise products becomes, for each of the 36 tile
 * positions, one GEMM over all the tiles: M[ξ] [tiles, O] = V[ξ] [tiles, C] · U[ξ] [C, O].
 * The weight gradient is the adjoint of the same algebra (dU[ξ] = V[ξ]^T · dM[ξ] with
 * dM = A dY A^T, then dW = G^T dU G), and the input gradient is the forward convolution of dY with
 * the kernel rotated by 180 degrees and its channels swapped, padded by 2 - p.
 *
 * Results differ from the direct sum by rounding only (the transforms' coefficients are small
 * powers of two and sixths); tests/test_winograd.c bounds the difference.
 */
#ifndef TD_WINOGRAD_H
#define TD_WINOGRAD_H

#include "ops/td_ops_isa.h"

#include <stdbool.h>
#include <stddef.h>

/* one per instruction set (ops/td_ops_isa.h) */
#define td_wino_fits           TD_ISA_SYM(td_wino_fits)
#define td_wino_geom           TD_ISA_SYM(td_wino_geom)
#define td_wino_scratch_floats TD_ISA_SYM(td_wino_scratch_floats)
#define td_wino_forward        TD_ISA_SYM(td_wino_forward)
#define td_wino_backward       TD_ISA_SYM(td_wino_backward)

/* One stride-1 3x3 convolution of a batch: input [n, h, w, c], output [n, oh, ow, o]. */
typedef struct td_wino {
    int n, h, w, c;
    int o, p;   /* output channels, zero padding on every side (0..2) */
    int oh, ow; /* h + 2p - 2, w + 2p - 2 */
    int th, tw; /* 4x4 output tiles per image, down and across */
    int chunk;  /* tiles transformed and multiplied together (their V and M stay in cache) */
} td_wino;

/* Whether a convolution with this shape goes through Winograd (3x3, stride 1, padding at most 2,
 * and enough channels on both sides for the GEMMs to outweigh the transforms). */
bool td_wino_fits(int c, int o, int kernel, int stride, int padding);

td_wino td_wino_geom(int n, int h, int w, int c, int o, int p);

/* Scratch floats td_wino_forward and td_wino_backward need for batches up to g->n on up to
 * `threads` threads. */
size_t td_wino_scratch_floats(const td_wino *g, int threads);

/* y [n, oh, ow, o] (+)= conv(x, w) + bias, w OIHW [o, c, 3, 3]; bias may be NULL. The work is
 * split over `threads` threads (core/td_parallel.h). */
void td_wino_forward(const td_wino *g, const float *x, const float *w, const float *bias, float *y,
                     bool add, float *scratch, int threads);

/* From dy [n, oh, ow, o]: dw (+)= the weight gradient (OIHW, add_w selects accumulation) and,
 * when dx is not NULL, dx [n, h, w, c] (+)= the input gradient (add_x). */
void td_wino_backward(const td_wino *g, const float *x, const float *w, const float *dy, float *dw,
                      bool add_w, float *dx, bool add_x, float *scratch, int threads);

#endif
