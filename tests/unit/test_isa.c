/* The op kernels of every instruction set this machine runs (core/td_isa.h) against the
 * baseline ones: the same model, weights and batch give the same outputs, input gradients and
 * parameter gradients to float rounding (the kernels sum in different orders: FMA, wider
 * registers, blocked loops), and a model really runs the variant it was built for. Models cover
 * what has ISA-specific code: the single-channel direct convolution and skinny GEMMs (LeNet's
 * conv1, a 6-output conv2 on 1x1), im2col/col2im (conv2), Winograd (3x3 with 16+ channels),
 * BatchNorm, ReLU, Add, max and average pooling, linear. TRAIND_ISA and the selection's errors
 * are tested too, the skinny dCol = dY · W kernel on its own, on shapes no model reaches, and
 * the optimizers' wider loops (bit for bit). */
#include "core/td_isa.h"
#include "core/td_optim.h"
#include "ops/td_ops.h"
#include "test_util.h"

#include <stdbool.h>

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Builds nodes under isa (made the process's choice first), checks every node runs isa's
 * variant, and returns forward and backward of a fixed batch. */
static test_pass run_model(td_isa isa, const char *nodes, td_shape in, int n) {
    td_err err = {{0}};
    cr_assert_eq(td_isa_select(td_isa_name(isa), &err), 0, "%s", err.msg);
    td_model m;
    test_build_model(&m, nodes, in, n, 7);
    for (int i = 0; i < m.n_nodes; i++) {
        const td_node *node = &m.nodes[i];
        cr_assert(node->op->variants, "%s has no variants", node->op->sig->name);
        cr_assert_eq(node->impl, node->op->variants[isa], "node %s does not run the %s kernels",
                     node->name, td_isa_name(isa));
    }
    test_pass r = test_pass_run(&m, in, n, 1);
    td_model_free(&m);
    return r;
}

/* |a - b| <= tol · max(1, max |b|) elementwise */
static void expect_close(const char *model, const char *isa, const char *what, const float *a,
                         const float *b, size_t n, double tol) {
    size_t at;
    double scale, worst = test_worst_diff(a, b, n, &at, &scale);
    cr_expect(worst <= tol * scale, "%s, %s: %s differs from baseline by %.3g at [%zu] (%g vs %g)",
              model, isa, what, worst, at, (double)a[at], (double)b[at]);
}

static void compare_paths(const char *name, const char *nodes, td_shape in, int n) {
    test_pass base = run_model(TD_ISA_BASELINE, nodes, in, n);
    int tested = 0;
    for (int i = TD_ISA_BASELINE + 1; i < TD_ISA_COUNT; i++) {
        if (!td_isa_supported((td_isa)i)) continue;
        test_pass got = run_model((td_isa)i, nodes, in, n);
        const char *isa = td_isa_name((td_isa)i);
        expect_close(name, isa, "output", got.out, base.out, base.out_n, 1e-5);
        expect_close(name, isa, "input gradient", got.dx, base.dx, base.dx_n, 1e-5);
        expect_close(name, isa, "parameter gradients", got.dparams, base.dparams, base.dparams_n,
                     1e-4);
        test_pass_free(&got);
        tested++;
    }
    test_pass_free(&base);
    cr_log_info("%s: %d instruction sets against baseline", name, tested);
}

static const char *LENET =
    "[{\"name\":\"conv1\",\"op\":\"conv2d\",\"out_channels\":6,\"kernel_size\":5},"
    " {\"name\":\"relu1\",\"op\":\"relu\"},"
    " {\"name\":\"pool1\",\"op\":\"maxpool2d\",\"kernel_size\":2},"
    " {\"name\":\"conv2\",\"op\":\"conv2d\",\"out_channels\":16,\"kernel_size\":5},"
    " {\"name\":\"relu2\",\"op\":\"relu\"},"
    " {\"name\":\"pool2\",\"op\":\"avgpool2d\",\"kernel_size\":2},"
    " {\"name\":\"flatten\",\"op\":\"flatten\"},"
    " {\"name\":\"fc1\",\"op\":\"linear\",\"out_features\":30},"
    " {\"name\":\"gelu\",\"op\":\"gelu\"},"
    " {\"name\":\"fc2\",\"op\":\"linear\",\"out_features\":10}]";

Test(isa, lenet_on_every_instruction_set_equals_baseline) {
    compare_paths("lenet", LENET, td_shape_image(1, 28, 28), 9);
}

/* A residual block: Winograd convolutions (16 channels), BatchNorm, ReLU, Add, a global pool. */
static const char *RESIDUAL =
    "[{\"name\":\"stem\",\"op\":\"conv2d\",\"out_channels\":16,\"kernel_size\":3,\"padding\":1},"
    " {\"name\":\"bn0\",\"op\":\"batchnorm2d\"},"
    " {\"name\":\"r0\",\"op\":\"relu\"},"
    " {\"name\":\"c1\",\"op\":\"conv2d\",\"out_channels\":16,\"kernel_size\":3,\"padding\":1,"
    "  \"bias\":false},"
    " {\"name\":\"bn1\",\"op\":\"batchnorm2d\"},"
    " {\"name\":\"r1\",\"op\":\"relu\"},"
    " {\"name\":\"c2\",\"op\":\"conv2d\",\"out_channels\":16,\"kernel_size\":3,\"padding\":1,"
    "  \"bias\":false},"
    " {\"name\":\"bn2\",\"op\":\"batchnorm2d\"},"
    " {\"name\":\"sum\",\"op\":\"add\",\"inputs\":[\"bn2\",\"r0\"]},"
    " {\"name\":\"r2\",\"op\":\"relu\"},"
    " {\"name\":\"pool\",\"op\":\"global_avgpool\"},"
    " {\"name\":\"fc\",\"op\":\"linear\",\"out_features\":5}]";

Test(isa, residual_block_on_every_instruction_set_equals_baseline) {
    compare_paths("residual", RESIDUAL, td_shape_image(3, 12, 12), 4);
}

/* A transformer block on sequences: LayerNorm, causal attention, linear at every position. */
static const char *TRANSFORMER =
    "[{\"name\":\"wpe\",\"op\":\"position_embedding\",\"block_size\":24},"
    " {\"name\":\"ln_1\",\"op\":\"layernorm\"},"
    " {\"name\":\"c_attn\",\"op\":\"linear\",\"out_features\":48},"
    " {\"name\":\"attn\",\"op\":\"causal_attention\",\"n_head\":2},"
    " {\"name\":\"c_proj\",\"op\":\"linear\",\"out_features\":16},"
    " {\"name\":\"sum\",\"op\":\"add\",\"inputs\":[\"c_proj\",\"wpe\"]},"
    " {\"name\":\"ln_f\",\"op\":\"layernorm\"},"
    " {\"name\":\"c_fc\",\"op\":\"linear\",\"out_features\":64},"
    " {\"name\":\"gelu\",\"op\":\"gelu\",\"approximate\":\"tanh\"}]";

Test(isa, transformer_block_on_every_instruction_set_equals_baseline) {
    compare_paths("transformer", TRANSFORMER, td_shape_seq(20, 16), 3);
}

/* Max pooling's NaN rule (a NaN in the window wins, as in PyTorch) and its argmax, on 6 and 13
 * channels (one and two vectors of 8, partial), with padding and overlapping windows: the same
 * NaNs, values and gradient routing on every instruction set. */
Test(isa, max_pool_nan_rule_and_argmax_match_baseline) {
    const char *nodes[2] = {"[{\"name\":\"p\",\"op\":\"maxpool2d\",\"kernel_size\":2}]",
                            "[{\"name\":\"p\",\"op\":\"maxpool2d\",\"kernel_size\":3,\"stride\":2,"
                            "\"padding\":1}]"};
    const int channels[2] = {6, 13};
    for (int k = 0; k < 2; k++)
        for (int c = 0; c < 2; c++) {
            td_shape in = td_shape_image(channels[c], 7, 7);
            float *out[TD_ISA_COUNT] = {0}, *dx[TD_ISA_COUNT] = {0};
            size_t out_n = 0, in_n = (size_t)2 * td_shape_size(in);
            for (int isa = 0; isa < TD_ISA_COUNT; isa++) {
                if (!td_isa_supported((td_isa)isa)) continue;
                td_err err = {{0}};
                cr_assert_eq(td_isa_select(td_isa_name((td_isa)isa), &err), 0, "%s", err.msg);
                td_model m;
                test_build_model(&m, nodes[k], in, 2, 7);
                out_n = (size_t)2 * td_shape_size(td_model_output_shape(&m));
                float *x = malloc(in_n * sizeof(float)), *dy = malloc(out_n * sizeof(float));
                test_fill_uniform(x, in_n, 5);
                for (size_t i = 0; i < in_n; i += 7) x[i] = NAN; /* some windows hold a NaN */
                for (size_t i = 0; i < out_n; i++) dy[i] = (float)(i % 5) + 1.0f;
                td_run run = {.n = 2, .training = true};
                out[isa] = test_copy(td_model_forward(&m, x, &run), out_n);
                td_model_backward(&m, dy, &run);
                dx[isa] = test_copy(m.input_grad, in_n);
                free(x);
                free(dy);
                td_model_free(&m);
            }
            for (int isa = 1; isa < TD_ISA_COUNT; isa++) {
                if (!out[isa]) continue;
                for (size_t i = 0; i < out_n; i++)
                    cr_expect(isnan(out[isa][i]) == isnan(out[0][i]) &&
                                  (isnan(out[0][i]) || out[isa][i] == out[0][i]),
                              "%s, pool %d, %d channels: output %zu is %g, baseline %g",
                              td_isa_name((td_isa)isa), k, channels[c], i, (double)out[isa][i],
                              (double)out[0][i]);
                cr_expect(memcmp(dx[isa], dx[0], in_n * sizeof(float)) == 0,
                          "%s, pool %d, %d channels: gradients routed to other inputs",
                          td_isa_name((td_isa)isa), k, channels[c]);
            }
            for (int isa = 0; isa < TD_ISA_COUNT; isa++) {
                free(out[isa]);
                free(dx[isa]);
            }
        }
}

Test(isa, selection_errors_say_what_is_wrong) {
    td_err err = {{0}};
    cr_assert_neq(td_isa_select("sse9", &err), 0);
    cr_assert(strstr(err.msg, "unknown instruction set \"sse9\"") &&
                  strstr(err.msg, "baseline, avx2 or avx512"),
              "%s", err.msg);
    for (int i = 0; i < TD_ISA_COUNT; i++)
        if (!td_isa_supported((td_isa)i)) {
            cr_assert_neq(td_isa_select(td_isa_name((td_isa)i), &err), 0);
            cr_assert(strstr(err.msg, td_isa_name((td_isa)i)), "%s", err.msg);
        }
    setenv("TRAIND_ISA", "baseline", 1);
    cr_assert_eq(td_isa_select(NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(td_isa_active(), TD_ISA_BASELINE);
    cr_assert_str_eq(td_isa_why(), "TRAIND_ISA");
    setenv("TRAIND_ISA", "avx-9000", 1);
    cr_assert_neq(td_isa_select(NULL, &err), 0);
    cr_assert(strstr(err.msg, "TRAIND_ISA=avx-9000"), "%s", err.msg);
    unsetenv("TRAIND_ISA");
    cr_assert_eq(td_isa_select(NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(td_isa_active(), td_isa_best());
}

#if defined(__x86_64__)
/* the AVX2 variant of td_skinny_nn (ops/td_skinny.h), compiled into every x86-64 build */
bool td_skinny_nn_avx2(int rows, int n, int o, const float *dy, const float *b, int ldb, float *c,
                       int ldc, bool add);

/* c (+)= dy · b on every remainder of rows by 4 and columns by 8 and 24, strided b and c, against
 * a plain double sum; the floats between c's rows (ldc > n) and past its end must stay as they
 * were: the last vector of a row is partial and written through a mask. */
Test(isa, skinny_nn_matches_a_plain_sum_on_awkward_shapes) {
    if (!td_isa_supported(TD_ISA_AVX2)) {
        cr_log_info("no AVX2 here: skipped");
        return;
    }
    const int rows_of[] = {1, 3, 4, 5, 9}, n_of[] = {1, 7, 8, 9, 23, 24, 25, 150},
              o_of[] = {1, 3, 16};
    const float guard = -12345.0f;
    for (size_t ri = 0; ri < sizeof rows_of / sizeof *rows_of; ri++)
        for (size_t ni = 0; ni < sizeof n_of / sizeof *n_of; ni++)
            for (size_t oi = 0; oi < 3; oi++)
                for (int add = 0; add < 2; add++) {
                    int rows = rows_of[ri], n = n_of[ni], o = o_of[oi], ldb = n + 1, ldc = n + 3;
                    size_t c_n = (size_t)rows * ldc + 8;
                    float *dy = malloc((size_t)rows * o * sizeof(float));
                    float *b = malloc((size_t)o * ldb * sizeof(float));
                    float *c = malloc(c_n * sizeof(float)), *c0 = malloc(c_n * sizeof(float));
                    test_fill_uniform(dy, (size_t)rows * o, 3);
                    test_fill_uniform(b, (size_t)o * ldb, 4);
                    for (size_t i = 0; i < c_n; i++) c[i] = guard;
                    for (int r = 0; r < rows; r++)
                        for (int j = 0; j < n; j++) c[(size_t)r * ldc + j] = (float)(r - j) * 0.25f;
                    memcpy(c0, c, c_n * sizeof(float));
                    cr_assert(td_skinny_nn_avx2(rows, n, o, dy, b, ldb, c, ldc, add));
                    for (int r = 0; r < rows; r++)
                        for (int j = 0; j < ldc; j++) {
                            size_t at = (size_t)r * ldc + j;
                            if (j >= n) {
                                cr_assert_eq(c[at], guard,
                                             "rows %d n %d o %d: c[%d][%d] between "
                                             "rows was written",
                                             rows, n, o, r, j);
                                continue;
                            }
                            double want = add ? c0[at] : 0.0;
                            for (int q = 0; q < o; q++)
                                want += (double)dy[(size_t)r * o + q] * b[(size_t)q * ldb + j];
                            cr_assert(fabs(c[at] - want) <= 1e-5 * (1 + fabs(want)),
                                      "rows %d n %d o %d add %d: c[%d][%d] = %g, want %g", rows, n,
                                      o, add, r, j, (double)c[at], want);
                        }
                    for (size_t i = (size_t)rows * ldc; i < c_n; i++)
                        cr_assert_eq(c[i], guard, "rows %d n %d o %d: written past c's end", rows,
                                     n, o);
                    free(dy);
                    free(b);
                    free(c);
                    free(c0);
                }
    float one = 0;
    cr_assert_not(td_skinny_nn_avx2(1, 1, 17, &one, &one, 1, &one, 1, false),
                  "17 outputs are more than the kernel takes");
}

/* the AVX2 variant of td_gemm (ops/td_gemm.h) */
bool td_gemm_avx2(bool ta, bool tb, int m, int n, int k, const float *a, int lda, const float *b,
                  int ldb, float *c, int ldc, bool add);

/* op(a) (i, p) and op(b) (p, j) of td_gemm's operands */
static float gemm_a(bool ta, const float *a, int lda, int i, int p) {
    return ta ? a[(size_t)p * lda + i] : a[(size_t)i * lda + p];
}
static float gemm_b(bool tb, const float *b, int ldb, int p, int j) {
    return tb ? b[(size_t)j * ldb + p] : b[(size_t)p * ldb + j];
}

/* c (+)= op(a) · op(b) for every transposition, every remainder of rows by the 6-row tile and of
 * columns by the 16-column panel, inner sizes around the 256 of a block and of the 8 x 8
 * transpose, strided operands, against a plain double sum; the floats between c's rows and past
 * its end must stay as they were; n = 70 (4 panels and more) takes the packed copy of a
 * transposed a. And the bits of a row must not depend on how many rows are computed with it (the
 * header promises it: the linear layer's result must not change with the batch it sits in). */
Test(isa, gemm_matches_a_plain_sum_on_awkward_shapes) {
    if (!td_isa_supported(TD_ISA_AVX2)) {
        cr_log_info("no AVX2 here: skipped");
        return;
    }
    const int m_of[] = {1, 5, 6, 7, 13}, n_of[] = {1, 9, 16, 17, 40, 70},
              k_of[] = {1, 7, 8, 255, 257, 600};
    const float guard = -12345.0f;
    for (int t = 0; t < 4; t++)
        for (size_t mi = 0; mi < sizeof m_of / sizeof *m_of; mi++)
            for (size_t ni = 0; ni < sizeof n_of / sizeof *n_of; ni++)
                for (size_t ki = 0; ki < sizeof k_of / sizeof *k_of; ki++) {
                    bool ta = t & 1, tb = t & 2;
                    int m = m_of[mi], n = n_of[ni], k = k_of[ki], add = (int)((mi + ni + ki) & 1);
                    int lda = (ta ? m : k) + 3, ldb = (tb ? k : n) + 5, ldc = n + 2;
                    size_t a_n = (size_t)(ta ? k : m) * lda, b_n = (size_t)(tb ? n : k) * ldb;
                    size_t c_n = (size_t)m * ldc + 8;
                    float *a = malloc(a_n * sizeof(float)), *b = malloc(b_n * sizeof(float));
                    float *c = malloc(c_n * sizeof(float)), *c0 = malloc(c_n * sizeof(float));
                    float *row = malloc(c_n * sizeof(float));
                    test_fill_uniform(a, a_n, 5);
                    test_fill_uniform(b, b_n, 6);
                    for (size_t i = 0; i < c_n; i++) c[i] = guard;
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < n; j++) c[(size_t)i * ldc + j] = (float)(i - j) * 0.5f;
                    memcpy(c0, c, c_n * sizeof(float));
                    memcpy(row, c, c_n * sizeof(float));
                    cr_assert(td_gemm_avx2(ta, tb, m, n, k, a, lda, b, ldb, c, ldc, add));
                    for (int i = 0; i < m; i++)
                        for (int j = 0; j < ldc; j++) {
                            size_t at = (size_t)i * ldc + j;
                            if (j >= n) {
                                cr_assert_eq(c[at], guard,
                                             "ta %d tb %d m %d n %d k %d: c[%d][%d] between rows "
                                             "was written",
                                             ta, tb, m, n, k, i, j);
                                continue;
                            }
                            double want = add ? c0[at] : 0.0, size = add ? fabs(c0[at]) : 0.0;
                            for (int p = 0; p < k; p++) {
                                double x =
                                    (double)gemm_a(ta, a, lda, i, p) * gemm_b(tb, b, ldb, p, j);
                                want += x;
                                size += fabs(x);
                            }
                            cr_assert(
                                fabs(c[at] - want) <= 1e-6 * (1 + size),
                                "ta %d tb %d m %d n %d k %d add %d: c[%d][%d] = %.9g, want %.9g",
                                ta, tb, m, n, k, add, i, j, (double)c[at], want);
                        }
                    for (size_t i = (size_t)m * ldc; i < c_n; i++)
                        cr_assert_eq(c[i], guard,
                                     "ta %d tb %d m %d n %d k %d: written past c's end", ta, tb, m,
                                     n, k);
                    /* the last row alone: the same bits as among the others */
                    int last = m - 1;
                    const float *a_last = ta ? a + last : a + (size_t)last * lda;
                    float *row_c = row + (size_t)last * ldc;
                    cr_assert(td_gemm_avx2(ta, tb, 1, n, k, a_last, lda, b, ldb, row_c, ldc, add));
                    cr_assert(memcmp(row_c, c + (size_t)last * ldc, (size_t)n * sizeof(float)) == 0,
                              "ta %d tb %d m %d n %d k %d: row %d alone has other bits", ta, tb, m,
                              n, k, last);
                    free(a);
                    free(b);
                    free(c);
                    free(c0);
                    free(row);
                }
}
#endif

/* The optimizers' loops run 8 floats an instruction where the instruction set is AVX2 or more
 * (core/td_optim.c), with no fused multiply-add: every bit must be the baseline's, so replicas on
 * CPUs of different kinds stay identical. Every rule, three steps (the first starts the momentum
 * buffer), on 1003 parameters (a partial last vector). */
Test(isa, optimizers_give_the_baseline_bits_on_every_instruction_set) {
    enum { N = 1003, STEPS = 3 };
    for (int k = 0; k < TEST_OPTIM_RULES_N; k++) {
        float *p[TD_ISA_COUNT] = {0}, *m[TD_ISA_COUNT] = {0}, *v[TD_ISA_COUNT] = {0};
        for (int isa = 0; isa < TD_ISA_COUNT; isa++) {
            if (!td_isa_supported((td_isa)isa)) continue;
            td_err err = {{0}};
            cr_assert_eq(td_isa_select(td_isa_name((td_isa)isa), &err), 0, "%s", err.msg);
            td_optim opt;
            td_optim_init(&opt, &TEST_OPTIM_RULES[k], N);
            p[isa] = malloc(N * sizeof(float));
            float *g = malloc(N * sizeof(float));
            test_fill_uniform(p[isa], N, 11);
            for (int s = 0; s < STEPS; s++) {
                test_fill_uniform(g, N, 20 + (unsigned)s);
                td_optim_step(&opt, p[isa], g, 0.05f);
            }
            if (opt.m) m[isa] = test_copy(opt.m, N);
            if (opt.v) v[isa] = test_copy(opt.v, N);
            free(g);
            td_optim_free(&opt);
        }
        for (int isa = 1; isa < TD_ISA_COUNT; isa++) {
            if (!p[isa]) continue;
            cr_expect(memcmp(p[isa], p[0], N * sizeof(float)) == 0,
                      "optimizer %d, %s: parameters differ from baseline's in some bit", k,
                      td_isa_name((td_isa)isa));
            cr_expect(!m[0] || memcmp(m[isa], m[0], N * sizeof(float)) == 0,
                      "optimizer %d, %s: first moment differs from baseline's", k,
                      td_isa_name((td_isa)isa));
            cr_expect(!v[0] || memcmp(v[isa], v[0], N * sizeof(float)) == 0,
                      "optimizer %d, %s: second moment differs from baseline's", k,
                      td_isa_name((td_isa)isa));
        }
        for (int isa = 0; isa < TD_ISA_COUNT; isa++) {
            free(p[isa]);
            free(m[isa]);
            free(v[isa]);
        }
    }
}
