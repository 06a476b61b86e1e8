/* The engine's threads (core/td_parallel.h): a model built for 2 or 3 threads computes what the
 * one-thread model does, to float rounding (a thread's share of a weight gradient is summed
 * apart, and GEMMs split by rows may block their sums differently), on every op with a parallel
 * path: the single-channel and im2col convolutions (forward chunks, weight-gradient shares,
 * col2im), the 1x1 direct one and the linear layer (split GEMMs), Winograd (several chunks:
 * its forward per thread, its weight gradient shared), BatchNorm (partial sums), ReLU, GELU, Add,
 * pooling; a transformer block's positions, LayerNorm (partial sums), causal attention (its
 * (sample, head) pairs) and learned positions (split columns). Batches of 7 and 9 leave the threads
 * uneven shares. The optimizer's update is elementwise and so must match bit for bit; the split
 * GEMM must equal OpenBLAS's own. */
#include "core/td_optim.h"
#include "core/td_parallel.h"
#include "test_util.h"

#include <cblas.h>
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static test_pass run_model(const char *nodes, td_shape in, int n, int threads) {
    td_model m;
    test_build_model_threads(&m, nodes, in, n, 7, threads);
    cr_assert_eq(m.threads, threads);
    test_pass r = test_pass_run(&m, in, n, 1);
    td_model_free(&m);
    return r;
}

static void expect_close(const char *model, int threads, const char *what, const float *a,
                         const float *b, size_t n, double tol) {
    size_t at;
    double scale, worst = test_worst_diff(a, b, n, &at, &scale);
    cr_expect(worst <= tol * scale,
              "%s on %d threads: %s differs from one thread's by %.3g at [%zu] (%g vs %g)", model,
              threads, what, worst, at, (double)a[at], (double)b[at]);
}

static void compare_threads(const char *name, const char *nodes, td_shape in, int n) {
    test_pass one = run_model(nodes, in, n, 1);
    for (int threads = 2; threads <= 3; threads++) {
        test_pass got = run_model(nodes, in, n, threads);
        expect_close(name, threads, "output", got.out, one.out, one.out_n, 1e-5);
        expect_close(name, threads, "input gradient", got.dx, one.dx, one.dx_n, 1e-5);
        expect_close(name, threads, "parameter gradients", got.dparams, one.dparams, one.dparams_n,
                     1e-4);
        test_pass_free(&got);
    }
    test_pass_free(&one);
}

Test(parallel, lenet_on_several_threads_equals_one) {
    const char *lenet =
        "[{\"name\":\"conv1\",\"op\":\"conv2d\",\"out_channels\":6,\"kernel_size\":5},"
        " {\"name\":\"relu1\",\"op\":\"relu\"},"
        " {\"name\":\"pool1\",\"op\":\"maxpool2d\",\"kernel_size\":2},"
        " {\"name\":\"conv2\",\"op\":\"conv2d\",\"out_channels\":16,\"kernel_size\":5},"
        " {\"name\":\"relu2\",\"op\":\"relu\"},"
        " {\"name\":\"pool2\",\"op\":\"avgpool2d\",\"kernel_size\":2},"
        " {\"name\":\"flatten\",\"op\":\"flatten\"},"
        " {\"name\":\"fc1\",\"op\":\"linear\",\"out_features\":300},"
        " {\"name\":\"gelu\",\"op\":\"gelu\"},"
        " {\"name\":\"fc2\",\"op\":\"linear\",\"out_features\":10}]";
    compare_threads("lenet", lenet, td_shape_image(1, 28, 28), 9);
}

/* Winograd on 32x32 images of 16 channels: 512 tiles, more than one chunk */
Test(parallel, residual_block_on_several_threads_equals_one) {
    const char *residual =
        "[{\"name\":\"c1\",\"op\":\"conv2d\",\"out_channels\":16,\"kernel_size\":3,\"padding\":1,"
        "  \"bias\":false},"
        " {\"name\":\"bn1\",\"op\":\"batchnorm2d\"},"
        " {\"name\":\"r1\",\"op\":\"relu\"},"
        " {\"name\":\"c2\",\"op\":\"conv2d\",\"out_channels\":16,\"kernel_size\":3,\"padding\":1,"
        "  \"bias\":false},"
        " {\"name\":\"bn2\",\"op\":\"batchnorm2d\"},"
        " {\"name\":\"sum\",\"op\":\"add\",\"inputs\":[\"bn2\",\"input\"]},"
        " {\"name\":\"r2\",\"op\":\"relu\"},"
        " {\"name\":\"pool\",\"op\":\"global_avgpool\"},"
        " {\"name\":\"fc\",\"op\":\"linear\",\"out_features\":5}]";
    compare_threads("residual", residual, td_shape_image(16, 32, 32), 8);
}

/* A strided im2col convolution with its kept Col, a 1x1 direct one, and BatchNorm1d */
Test(parallel, strided_and_pointwise_convolutions_on_several_threads_equal_one) {
    const char *nodes =
        "[{\"name\":\"down\",\"op\":\"conv2d\",\"out_channels\":32,\"kernel_size\":3,"
        "  \"stride\":2,\"padding\":1},"
        " {\"name\":\"point\",\"op\":\"conv2d\",\"out_channels\":24,\"kernel_size\":1},"
        " {\"name\":\"flatten\",\"op\":\"flatten\"},"
        " {\"name\":\"bn\",\"op\":\"batchnorm1d\"},"
        " {\"name\":\"fc\",\"op\":\"linear\",\"out_features\":7}]";
    compare_threads("strided", nodes, td_shape_image(8, 20, 20), 7);
}

Test(parallel, transformer_block_on_several_threads_equals_one) {
    const char *block = "[{\"name\":\"wpe\",\"op\":\"position_embedding\",\"block_size\":96},"
                        " {\"name\":\"ln_1\",\"op\":\"layernorm\"},"
                        " {\"name\":\"c_attn\",\"op\":\"linear\",\"out_features\":192},"
                        " {\"name\":\"attn\",\"op\":\"causal_attention\",\"n_head\":4},"
                        " {\"name\":\"c_proj\",\"op\":\"linear\",\"out_features\":64},"
                        " {\"name\":\"r1\",\"op\":\"add\",\"inputs\":[\"c_proj\",\"wpe\"]},"
                        " {\"name\":\"ln_2\",\"op\":\"layernorm\",\"bias\":false},"
                        " {\"name\":\"c_fc\",\"op\":\"linear\",\"out_features\":256},"
                        " {\"name\":\"gelu\",\"op\":\"gelu\"},"
                        " {\"name\":\"mlp_proj\",\"op\":\"linear\",\"out_features\":64},"
                        " {\"name\":\"r2\",\"op\":\"add\",\"inputs\":[\"mlp_proj\",\"r1\"]}]";
    compare_threads("transformer block", block, td_shape_seq(80, 64), 7);
}

Test(parallel, optimizer_update_is_bitwise_the_same_on_every_thread_count) {
    const size_t n = 100003;
    float *g = malloc(n * sizeof(float)), *p[2];
    test_fill_uniform(g, n, 3);
    for (int c = 0; c < TEST_OPTIM_RULES_N; c++) {
        td_optim opt[2];
        for (int k = 0; k < 2; k++) {
            p[k] = malloc(n * sizeof(float));
            test_fill_uniform(p[k], n, 9);
            td_optim_init(&opt[k], &TEST_OPTIM_RULES[c], n);
            opt[k].threads = k == 0 ? 1 : 3;
            for (int step = 0; step < 3; step++) td_optim_step(&opt[k], p[k], g, 0.01f);
        }
        cr_expect(memcmp(p[0], p[1], n * sizeof(float)) == 0,
                  "optimizer %d: 3 threads changed the update", c);
        cr_expect(!opt[0].m || memcmp(opt[0].m, opt[1].m, n * sizeof(float)) == 0,
                  "optimizer %d: 3 threads changed the first moment", c);
        for (int k = 0; k < 2; k++) {
            td_optim_free(&opt[k]);
            free(p[k]);
        }
    }
    free(g);
}

Test(parallel, split_gemm_equals_openblas_for_every_transpose_and_shape) {
    td_par_blas_single();
    const int shapes[2][3] = {{203, 100, 128}, {37, 301, 200}}; /* split by rows, by columns */
    for (int s = 0; s < 2; s++)
        for (int t = 0; t < 4; t++) {
            int m = shapes[s][0], n = shapes[s][1], k = shapes[s][2];
            CBLAS_TRANSPOSE ta = t & 1 ? CblasTrans : CblasNoTrans;
            CBLAS_TRANSPOSE tb = t & 2 ? CblasTrans : CblasNoTrans;
            int lda = ta == CblasNoTrans ? k : m, ldb = tb == CblasNoTrans ? n : k;
            float *a = malloc((size_t)m * k * sizeof(float));
            float *b = malloc((size_t)k * n * sizeof(float));
            float *want = malloc((size_t)m * n * sizeof(float));
            test_fill_uniform(a, (size_t)m * k, 1);
            test_fill_uniform(b, (size_t)k * n, 2);
            test_fill_uniform(want, (size_t)m * n, 3);
            float *got = test_copy(want, (size_t)m * n);
            cblas_sgemm(CblasRowMajor, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, want, n);
            td_par_sgemm(3, ta, tb, m, n, k, 0.5f, a, lda, b, ldb, 0.25f, got, n);
            size_t at;
            double scale, worst = test_worst_diff(got, want, (size_t)m * n, &at, &scale);
            cr_expect(worst <= 1e-6 * scale, "%dx%dx%d, transpose %d: off by %.3g at [%zu]", m, n,
                      k, t, worst, at);
            free(a);
            free(b);
            free(want);
            free(got);
        }
}

Test(parallel, ranges_cover_every_item_once_in_order) {
    for (size_t n = 0; n < 70; n += 7)
        for (int parts = 1; parts <= 5; parts++)
            for (size_t align = 1; align <= 16; align *= 4) {
                size_t next = 0;
                for (int k = 0; k < parts; k++) {
                    size_t lo, hi;
                    td_par_range(n, parts, k, align, &lo, &hi);
                    cr_assert_eq(lo, next, "n %zu, %d parts, part %d starts at %zu", n, parts, k,
                                 lo);
                    cr_assert(hi >= lo && (hi == n || hi % align == 0));
                    next = hi;
                }
                cr_assert_eq(next, n);
            }
}
