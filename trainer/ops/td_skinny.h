/* GEMMs with a skinny side of at most 16, where OpenBLAS's register tiles are mostly empty.
 *
 * A convolution with few output channels (LeNet's conv1: 6 channels from a 5x5 window of one
 * input channel) is a GEMM of tens of thousands of rows by 6 columns; OpenBLAS 0.3.21 runs its
 * forward at about 22 GFLOP/s and its weight gradient at about 18 here, against 60-95 for
 * well-shaped GEMMs. One AVX-512 register holds all 16 outputs of a row, which these kernels
 * exploit; with AVX2 and FMA (no AVX-512) two registers do. Both return false when the shape or
 * the CPU does not suit them (neither at build time, too many outputs); the caller then uses
 * OpenBLAS. */
#ifndef TD_SKINNY_H
#define TD_SKINNY_H

#include "ops/td_ops_isa.h"

#include <stdbool.h>

/* one per instruction set (ops/td_ops_isa.h) */
#define td_skinny_nt TD_ISA_SYM(td_skinny_nt)
#define td_skinny_tn TD_ISA_SYM(td_skinny_tn)
#define td_skinny_nn TD_ISA_SYM(td_skinny_nn)

/* y [rows, o] = a [rows, k] · w[o, k]^T, with o <= 16 (forward of a small convolution).
 * scratch: at least 16·k floats. */
bool td_skinny_nt(int rows, int o, int k, const float *a, const float *w, float *y, float *scratch);

/* dw [o, k] (+)= dy[rows, o]^T · a [rows, k], with o·ceil(k/16) <= 24 on AVX-512, o <= 16 and
 * k <= 512 on AVX2 (weight gradient of a small convolution); add selects accumulation. */
bool td_skinny_tn(int rows, int o, int k, const float *dy, const float *a, float *dw, bool add);

/* c [rows, n] (+)= dy [rows, o] · b [o, n], b's rows ldb floats apart and c's ldc, with o <= 16
 * (the input gradient of a small convolution or linear layer: dCol = dY · W). OpenBLAS spends
 * as long zeroing c for beta 0 as multiplying, at an inner size this small. AVX2 only for now:
 * the AVX-512 variant keeps OpenBLAS until it is measured on a CPU that has AVX-512. */
bool td_skinny_nn(int rows, int n, int o, const float *dy, const float *b, int ldb, float *c,
                  int ldc, bool add);

#endif
