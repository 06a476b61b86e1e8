/* The engine's thread team (td_parallel.h). */
#include "core/td_parallel.h"

#include <omp.h>
#include <stdbool.h>

void openblas_set_num_threads(int threads);

void td_par_range(size_t n, int parts, int k, size_t align, size_t *lo, size_t *hi) {
    size_t units = (n + align - 1) / align;
    size_t a = units * (size_t)k / (size_t)parts, b = units * (size_t)(k + 1) / (size_t)parts;
    *lo = a * align < n ? a * align : n;
    *hi = b * align < n ? b * align : n;
}

void td_par_sgemm(int threads, CBLAS_TRANSPOSE ta, CBLAS_TRANSPOSE tb, int m, int n, int k,
                  float alpha, const float *a, int lda, const float *b, int ldb, float beta,
                  float *c, int ldc) {
    if (threads <= 1 || (size_t)m * n * k < 64 * TD_PAR_MIN_WORK) {
        cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
        return;
    }
    /* C's rows come from op(A)'s rows, its columns from op(B)'s columns; blocks of 16 keep each
     * thread's part of C whole cache lines wide */
    bool by_rows = m >= n;
#pragma omp parallel num_threads(threads)
    {
        size_t lo, hi;
        td_par_range((size_t)(by_rows ? m : n), omp_get_num_threads(), omp_get_thread_num(), 16,
                     &lo, &hi);
        if (lo < hi) {
            int part = (int)(hi - lo);
            if (by_rows) {
                const float *a_part = ta == CblasNoTrans ? a + lo * (size_t)lda : a + lo;
                cblas_sgemm(CblasRowMajor, ta, tb, part, n, k, alpha, a_part, lda, b, ldb, beta,
                            c + lo * (size_t)ldc, ldc);
            } else {
                const float *b_part = tb == CblasNoTrans ? b + lo : b + lo * (size_t)ldb;
                cblas_sgemm(CblasRowMajor, ta, tb, m, part, k, alpha, a, lda, b_part, ldb, beta,
                            c + lo, ldc);
            }
        }
    }
}

void td_par_blas_single(void) {
    openblas_set_num_threads(1);
}
