/* The engine's threads: with train.threads > 1, forward and backward split each op's work (tiles,
 * images, rows of a GEMM, pixels) over a team of that many threads.
 *
 * The team is OpenMP's (GCC's libgomp): ops open it where their loops are, with
 *     #pragma omp parallel for num_threads(node->threads) if (node->threads > 1)
 * and OpenBLAS runs single-threaded inside it. Letting OpenBLAS thread its own GEMMs instead
 * leaves everything around them (Winograd's transforms, BatchNorm, the optimizer) on one core,
 * and two thread pools on the same cores spin against each other between calls: every thread
 * the engine runs is the team's. */
#ifndef TD_PARALLEL_H
#define TD_PARALLEL_H

#include <cblas.h>
#include <stddef.h>

/* Below about this many floats touched (or multiply-adds), an elementwise loop is not worth
 * waking the team for. */
#define TD_PAR_MIN_WORK ((size_t)1 << 15)

/* The threads for a pass over `work` floats: all of them, or one when the pass is too small. */
static inline int td_par_threads_for(int threads, size_t work) {
    return work < TD_PAR_MIN_WORK ? 1 : threads;
}

/* Part k of `parts` consecutive, near-equal parts of [0, n): [*lo, *hi), every boundary but n a
 * multiple of align (1 for none). */
void td_par_range(size_t n, int parts, int k, size_t align, size_t *lo, size_t *hi);

/* The same as cblas_sgemm (row-major), split over `threads` threads along C's rows or columns,
 * whichever has more. Small products, and threads == 1, run on the caller's thread. */
void td_par_sgemm(int threads, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
                  float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                  float *c, int ldc);

/* Makes OpenBLAS single-threaded, as the engine's team needs (above). OpenBLAS's thread count is
 * the process's, so a program that builds models calls this once (td_model_build does). */
void td_par_blas_single(void);

#endif
