/* Our own single-threaded GEMM for the linear layer and the convolutions' GEMMs (Winograd's per
 * position, im2col's, 1x1's), where it beats OpenBLAS.
 *
 * The MLP (784-512-512-10, batch 128, one thread) is GEMMs and little else. On the AMD EPYC CI
 * VM (AVX2; the same loop, pinned, best of 200, a throwaway harness) OpenBLAS 0.3.21 runs its
 * shapes at 77-81 GFLOP/s, its weight gradients (an inner size of only the batch) at 77; a 6x16
 * register tile (twelve accumulators, two vectors of b, a broadcast of a read in place) over
 * 16-column panels of b packed 256 deep runs the forward at 83, the input gradient at 81-83 and
 * the weight gradient at 84-85, against a peak of about 90. In a training step, where b comes
 * from memory rather than cache, the next panel's lines are prefetched while the current one
 * runs; OpenBLAS also zeroes c in a pass of its own for beta 0, which the tile's store makes
 * unneeded. Called from inside a team of threads, each call is one thread's (its panel lives
 * on that thread's stack).
 *
 * AVX2 only for now: the baseline keeps OpenBLAS, and so does the AVX-512 variant until this is
 * measured on a CPU that has AVX-512 (as ops/td_skinny.h). */
#ifndef TD_GEMM_H
#define TD_GEMM_H

#include "ops/td_ops_isa.h"

#include <stdbool.h>
#include <stddef.h>

/* one per instruction set (ops/td_ops_isa.h) */
#define td_gemm  TD_ISA_SYM(td_gemm)
#define td_sgemm TD_ISA_SYM(td_sgemm)

/* c [m, n] (+)= op(a) [m, k] · op(b) [k, n], row-major, as cblas_sgemm with alpha 1 and beta
 * 1 where add, else 0: op(a) is a [m, k] with rows lda floats apart or, where ta, a [k, m]
 * transposed; op(b) likewise with tb. Each element is summed over k in blocks of 256, in order
 * within a block, whatever its place in c: the bits do not depend on m or n. false (nothing
 * written) where this variant has no kernel: the caller uses OpenBLAS. */
bool td_gemm(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b,
             int ldb, float *c, int ldc, bool add);

/* The same product on `threads` threads, as the ops call it: td_gemm where one thread does the
 * work and this variant has a kernel, else OpenBLAS (td_par_sgemm splits it over a team). */
void td_sgemm(int threads, bool ta, bool tb, int m, int n, int k, const float *a, int lda,
              const float *b, int ldb, float *c, int ldc, bool add);

#endif
