/* Every op's backward against central finite differences.
 *
 * The objective is L = sum(out · r) for a fixed random r, accumulated in double; its gradient
 * with respect to every parameter and input element is checked against (L(x+h) - L(x-h)) / 2h.
 * The forward is float32, so the tolerance allows for float rounding of L divided by 2h. */
#include "test_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#define N 3
#define H 1e-3f

typedef struct check {
    td_model model;
    float *x, *r;
    size_t in_size, out_size;
    td_rng rng;
    bool training;
} check;

static double objective(check *c) {
    td_run run = {.n = N, .training = c->training, .rng = &c->rng};
    td_rng_seed(&c->rng, 7); /* the same dropout mask on every evaluation */
    const float *out = td_model_forward(&c->model, c->x, &run);
    double l = 0;
    for (size_t i = 0; i < N * c->out_size; i++) l += (double)out[i] * c->r[i];
    return l;
}

/* Compares the analytic gradient g of value v with a central difference; samples up to
 * `limit` elements spread over the tensor. */
static void compare(check *c, const char *what, float *v, const float *g, size_t n) {
    size_t stride = n > 60 ? n / 60 : 1;
    for (size_t i = 0; i < n; i += stride) {
        float keep = v[i];
        v[i] = keep + H;
        double up = objective(c);
        v[i] = keep - H;
        double down = objective(c);
        v[i] = keep;
        double fd = (up - down) / (2.0 * H);
        double tol = 3e-3 + 1e-2 * fabs(fd);
        cr_expect(fabs(g[i] - fd) <= tol, "%s[%zu]: analytic %.6g, finite difference %.6g", what, i,
                  g[i], fd);
    }
}

/* vocab > 0: the input is token ids in [0, vocab) (an embedding's), which have no gradient */
static void run_check_full(const char *nodes, td_shape input, bool training, int warm, int vocab) {
    check c = {.training = training};
    test_build_model(&c.model, nodes, input, N, 11);
    c.in_size = td_shape_size(input);
    c.out_size = td_shape_size(td_model_output_shape(&c.model));
    c.x = malloc(N * c.in_size * sizeof(float));
    c.r = malloc(N * c.out_size * sizeof(float));
    td_rng data;
    td_rng_seed(&data, 3);
    for (size_t i = 0; i < N * c.in_size; i++)
        c.x[i] = vocab ? (float)td_rng_below(&data, (uint64_t)vocab)
                       : 2.0f * td_rng_uniform(&data) - 1.0f;
    for (size_t i = 0; i < N * c.out_size; i++) c.r[i] = 2.0f * td_rng_uniform(&data) - 1.0f;
    /* training forwards on other data first, so running statistics are not the initial ones */
    for (int w = 0; w < warm; w++) {
        float *other = malloc(N * c.in_size * sizeof(float));
        for (size_t i = 0; i < N * c.in_size; i++)
            other[i] = 3.0f * td_rng_uniform(&data) + 0.5f * (float)w;
        td_run warm_run = {.n = N, .training = true, .rng = &c.rng};
        td_model_forward(&c.model, other, &warm_run);
        free(other);
    }

    objective(&c);
    td_run run = {.n = N, .training = training, .rng = &c.rng};
    td_model_backward(&c.model, c.r, &run);
    /* copy the gradients: the checks below rerun forward */
    float *pg = malloc(c.model.param_floats * sizeof(float) + 1);
    float *xg = malloc(N * c.in_size * sizeof(float));
    memcpy(pg, c.model.grad_block, c.model.param_floats * sizeof(float));
    memcpy(xg, c.model.input_grad, N * c.in_size * sizeof(float));
    for (int p = 0; p < c.model.n_params; p++) {
        td_param *par = &c.model.params[p];
        compare(&c, par->name, par->data, pg + par->offset, par->size);
    }
    if (!vocab) compare(&c, "input", c.x, xg, N * c.in_size);
    free(pg);
    free(xg);
    free(c.x);
    free(c.r);
    td_model_free(&c.model);
}

static void run_check_warm(const char *nodes, td_shape input, bool training, int warm) {
    run_check_full(nodes, input, training, warm, 0);
}

static void run_check(const char *nodes, td_shape input, bool training) {
    run_check_warm(nodes, input, training, 0);
}

Test(gradcheck, linear) {
    run_check("[{\"name\":\"fc\",\"op\":\"linear\",\"out_features\":4}]", td_shape_flat(5), true);
}

Test(gradcheck, linear_without_bias) {
    run_check("[{\"name\":\"fc\",\"op\":\"linear\",\"out_features\":3,\"bias\":false}]",
              td_shape_flat(6), true);
}

Test(gradcheck, conv2d_3x3_padded) {
    run_check("[{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":4,\"kernel_size\":3,"
              "\"padding\":1}]",
              td_shape_image(3, 5, 5), true);
}

Test(gradcheck, conv2d_strided_single_channel) {
    run_check("[{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":2,\"kernel_size\":5,"
              "\"stride\":2,\"padding\":2}]",
              td_shape_image(1, 7, 6), true);
}

/* single-channel, stride 1, unpadded: the direct kernels of td_conv1ch.c (on the AVX2 and AVX-512
 * kernels; ctest runs this program once per instruction set) */
Test(gradcheck, conv2d_single_channel_direct) {
    run_check("[{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":6,\"kernel_size\":5}]",
              td_shape_image(1, 14, 13), true);
}

Test(gradcheck, conv2d_single_channel_direct_12_outputs_no_bias) {
    run_check("[{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":12,\"kernel_size\":3,"
              "\"bias\":false}]",
              td_shape_image(1, 6, 11), true);
}

Test(gradcheck, conv2d_1x1_without_bias) {
    run_check("[{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":5,\"kernel_size\":1,"
              "\"bias\":false}]",
              td_shape_image(3, 4, 4), true);
}

Test(gradcheck, conv2d_1x1_strided) {
    run_check("[{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":2,\"kernel_size\":1,"
              "\"stride\":2}]",
              td_shape_image(3, 5, 5), true);
}

Test(gradcheck, maxpool2d) {
    run_check("[{\"name\":\"p\",\"op\":\"maxpool2d\",\"kernel_size\":2}]", td_shape_image(3, 4, 6),
              true);
}

Test(gradcheck, maxpool2d_overlapping_padded) {
    run_check("[{\"name\":\"p\",\"op\":\"maxpool2d\",\"kernel_size\":3,\"stride\":2,"
              "\"padding\":1}]",
              td_shape_image(2, 5, 5), true);
}

Test(gradcheck, avgpool2d) {
    run_check("[{\"name\":\"p\",\"op\":\"avgpool2d\",\"kernel_size\":2}]", td_shape_image(3, 4, 4),
              true);
}

Test(gradcheck, avgpool2d_padded_exclude_pad) {
    run_check("[{\"name\":\"p\",\"op\":\"avgpool2d\",\"kernel_size\":3,\"stride\":2,"
              "\"padding\":1,\"count_include_pad\":false}]",
              td_shape_image(2, 5, 5), true);
}

Test(gradcheck, global_avgpool) {
    run_check("[{\"name\":\"g\",\"op\":\"global_avgpool\"}]", td_shape_image(4, 3, 3), true);
}

Test(gradcheck, relu) {
    run_check("[{\"name\":\"a\",\"op\":\"relu\"}]", td_shape_flat(12), true);
}

/* torch.relu(tensor([nan, -1, 0, 2])) is [nan, 0, 0, 2]; the gradient at the NaN is 0, as
 * threshold_backward's mask (output > 0) is false there. */
Test(gradcheck, relu_passes_nan_through_as_torch_does) {
    td_model m;
    test_build_model(&m, "[{\"name\":\"a\",\"op\":\"relu\"}]", td_shape_flat(4), 1, 1);
    float x[4] = {NAN, -1.0f, 0.0f, 2.0f}, dy[4] = {5.0f, 5.0f, 5.0f, 5.0f};
    td_rng rng;
    td_rng_seed(&rng, 1);
    td_run run = {.n = 1, .training = true, .rng = &rng};
    const float *y = td_model_forward(&m, x, &run);
    cr_expect(isnan(y[0]), "relu(nan) = %g, torch gives nan", y[0]);
    cr_expect(y[1] == 0.0f && y[2] == 0.0f && y[3] == 2.0f, "relu gave %g %g %g", y[1], y[2], y[3]);
    td_model_backward(&m, dy, &run);
    const float *dx = m.input_grad;
    cr_expect(dx[0] == 0.0f && dx[1] == 0.0f && dx[2] == 0.0f && dx[3] == 5.0f,
              "relu backward gave %g %g %g %g", dx[0], dx[1], dx[2], dx[3]);
    td_model_free(&m);
}

Test(gradcheck, gelu) {
    run_check("[{\"name\":\"a\",\"op\":\"gelu\"}]", td_shape_flat(12), true);
}

Test(gradcheck, gelu_tanh) {
    run_check("[{\"name\":\"a\",\"op\":\"gelu\",\"approximate\":\"tanh\"}]", td_shape_flat(12),
              true);
}

Test(gradcheck, flatten_multichannel) {
    run_check("[{\"name\":\"f\",\"op\":\"flatten\"},"
              " {\"name\":\"fc\",\"op\":\"linear\",\"out_features\":3}]",
              td_shape_image(3, 2, 3), true);
}

Test(gradcheck, dropout_training) {
    run_check("[{\"name\":\"d\",\"op\":\"dropout\",\"p\":0.3}]", td_shape_flat(20), true);
}

Test(gradcheck, dropout_eval) {
    run_check("[{\"name\":\"d\",\"op\":\"dropout\",\"p\":0.3}]", td_shape_flat(20), false);
}

/* The same with Winograd convolutions (16 channels): its input gradient adds into the skip's */
Test(gradcheck, residual_block_winograd) {
    run_check("[{\"name\":\"c1\",\"op\":\"conv2d\",\"out_channels\":16,\"kernel_size\":3,"
              "\"padding\":1,\"algorithm\":\"winograd\"},"
              " {\"name\":\"r1\",\"op\":\"relu\"},"
              " {\"name\":\"c2\",\"op\":\"conv2d\",\"out_channels\":16,\"kernel_size\":3,"
              "\"padding\":1,\"algorithm\":\"winograd\"},"
              " {\"name\":\"sum\",\"op\":\"add\",\"inputs\":[\"c2\",\"input\"]},"
              " {\"name\":\"g\",\"op\":\"global_avgpool\"}]",
              td_shape_image(16, 5, 5), true);
}

Test(gradcheck, residual_block) {
    /* the input feeds both the conv branch and the add: its gradient is the sum of two paths */
    run_check("[{\"name\":\"c1\",\"op\":\"conv2d\",\"out_channels\":2,\"kernel_size\":3,"
              "\"padding\":1},"
              " {\"name\":\"r1\",\"op\":\"relu\"},"
              " {\"name\":\"c2\",\"op\":\"conv2d\",\"out_channels\":2,\"kernel_size\":3,"
              "\"padding\":1},"
              " {\"name\":\"sum\",\"op\":\"add\",\"inputs\":[\"c2\",\"input\"]},"
              " {\"name\":\"g\",\"op\":\"global_avgpool\"}]",
              td_shape_image(2, 4, 4), true);
}

Test(gradcheck, batchnorm2d_training) {
    run_check("[{\"name\":\"bn\",\"op\":\"batchnorm2d\"}]", td_shape_image(3, 3, 2), true);
}

Test(gradcheck, batchnorm2d_eval) {
    run_check_warm("[{\"name\":\"bn\",\"op\":\"batchnorm2d\"}]", td_shape_image(3, 3, 2), false, 3);
}

Test(gradcheck, batchnorm1d_training_and_eval) {
    run_check("[{\"name\":\"bn\",\"op\":\"batchnorm1d\",\"eps\":0.001}]", td_shape_flat(5), true);
    run_check_warm("[{\"name\":\"bn\",\"op\":\"batchnorm1d\"}]", td_shape_flat(5), false, 2);
}

Test(gradcheck, batchnorm_without_affine_or_tracking) {
    /* no running statistics: batch statistics in evaluation too */
    run_check("[{\"name\":\"bn\",\"op\":\"batchnorm2d\",\"affine\":false,"
              "\"track_running_stats\":false}]",
              td_shape_image(2, 2, 3), false);
}

Test(gradcheck, conv_then_batchnorm) {
    run_check("[{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":3,\"kernel_size\":3,"
              "\"padding\":1,\"bias\":false},"
              " {\"name\":\"bn\",\"op\":\"batchnorm2d\"}]",
              td_shape_image(3, 4, 4), true);
}

/* GELU rather than ReLU after BatchNorm: BatchNorm magnifies a weight's finite-difference step
 * by 1/std of its channel, which pushes ReLU inputs across the kink and makes the difference
 * quotient, not the gradient, wrong. */
Test(gradcheck, conv_bn_gelu_residual) {
    run_check("[{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":3,\"kernel_size\":3,"
              "\"padding\":1,\"bias\":false},"
              " {\"name\":\"bn\",\"op\":\"batchnorm2d\"},"
              " {\"name\":\"r\",\"op\":\"gelu\"},"
              " {\"name\":\"s\",\"op\":\"add\",\"inputs\":[\"r\",\"input\"]},"
              " {\"name\":\"p\",\"op\":\"adaptive_avgpool2d\"},"
              " {\"name\":\"f\",\"op\":\"flatten\"},"
              " {\"name\":\"i\",\"op\":\"identity\"}]",
              td_shape_image(3, 4, 4), true);
}

/* -- a transformer's ops, on sequences [T, C] */

Test(gradcheck, linear_at_every_position) {
    run_check("[{\"name\":\"fc\",\"op\":\"linear\",\"out_features\":3}]", td_shape_seq(4, 5), true);
}

Test(gradcheck, layernorm_flat_and_sequence) {
    run_check("[{\"name\":\"ln\",\"op\":\"layernorm\"}]", td_shape_flat(6), true);
    run_check("[{\"name\":\"ln\",\"op\":\"layernorm\",\"bias\":false,\"eps\":0.001}]",
              td_shape_seq(3, 5), true);
}

Test(gradcheck, causal_attention) {
    /* T = 5, C = 4 in 2 heads of 2: the input is [5, 12] */
    run_check("[{\"name\":\"a\",\"op\":\"causal_attention\",\"n_head\":2}]", td_shape_seq(5, 12),
              true);
}

Test(gradcheck, causal_attention_dropout_training) {
    run_check("[{\"name\":\"a\",\"op\":\"causal_attention\",\"n_head\":2,\"dropout\":0.4}]",
              td_shape_seq(5, 12), true);
}

/* Attention dropout as nn.Dropout on nanoGPT's att: with equal scores every row's probabilities
 * are 1/(t+1), and with values of 1 a head's output is the kept share times 1/(1-p). Over many
 * rows about p of them are dropped and the mean output stays 1 (inverted dropout is unbiased);
 * in evaluation nothing is dropped. */
Test(gradcheck, attention_dropout_drops_p_of_the_probabilities) {
    enum { T = 64, C = 4 };
    td_model m;
    test_build_model(&m,
                     "[{\"name\":\"a\",\"op\":\"causal_attention\",\"n_head\":1,"
                     "\"dropout\":0.25}]",
                     td_shape_seq(T, 3 * C), 8, 1);
    float *x = calloc(8 * T * 3 * C, sizeof(float));
    for (int i = 0; i < 8 * T; i++)
        for (int k = 0; k < C; k++) x[(size_t)i * 3 * C + 2 * C + k] = 1.0f; /* v = 1, q = k = 0 */
    td_rng rng;
    td_rng_seed(&rng, 5);
    td_run run = {.n = 8, .training = true, .rng = &rng};
    const float *y = td_model_forward(&m, x, &run);
    double sum = 0, kept = 0, slots = 0;
    for (int i = 0; i < 8; i++)
        for (int t = 0; t < T; t++) {
            double v = y[((size_t)i * T + t) * C];
            sum += v;
            kept += v * 0.75 * (t + 1); /* kept probabilities in this row */
            slots += t + 1;
        }
    cr_expect(fabs(sum / (8 * T) - 1.0) < 0.05, "mean output %.4f, expected about 1",
              sum / (8 * T));
    cr_expect(fabs(kept / slots - 0.75) < 0.02, "kept %.4f of the probabilities, expected 0.75",
              kept / slots);
    run.training = false;
    y = td_model_forward(&m, x, &run);
    for (int i = 0; i < 8 * T; i++)
        cr_assert_float_eq(y[(size_t)i * C], 1.0f, 1e-5, "evaluation drops nothing (row %d)", i);
    free(x);
    td_model_free(&m);
}

Test(gradcheck, position_embedding) {
    run_check("[{\"name\":\"wpe\",\"op\":\"position_embedding\",\"block_size\":6}]",
              td_shape_seq(4, 3), true);
}

Test(gradcheck, embedding) {
    run_check_full("[{\"name\":\"wte\",\"op\":\"embedding\",\"num_embeddings\":7,"
                   "\"embedding_dim\":3}]",
                   td_shape_flat(5), true, 0, 7);
}

/* One GPT block as nanoGPT's Block is, on a two-token vocabulary's worth of embeddings: ln_1,
 * c_attn, attention, c_proj and the residual; ln_2, the MLP (4x, GELU) and the residual. */
Test(gradcheck, gpt_block) {
    run_check_full(
        "[{\"name\":\"wte\",\"op\":\"embedding\",\"num_embeddings\":5,\"embedding_dim\":4},"
        " {\"name\":\"wpe\",\"op\":\"position_embedding\",\"block_size\":8},"
        " {\"name\":\"ln_1\",\"op\":\"layernorm\"},"
        " {\"name\":\"c_attn\",\"op\":\"linear\",\"out_features\":12},"
        " {\"name\":\"attn\",\"op\":\"causal_attention\",\"n_head\":2},"
        " {\"name\":\"c_proj\",\"op\":\"linear\",\"out_features\":4},"
        " {\"name\":\"r1\",\"op\":\"add\",\"inputs\":[\"c_proj\",\"wpe\"]},"
        " {\"name\":\"ln_2\",\"op\":\"layernorm\"},"
        " {\"name\":\"c_fc\",\"op\":\"linear\",\"out_features\":16},"
        " {\"name\":\"gelu\",\"op\":\"gelu\",\"approximate\":\"tanh\"},"
        " {\"name\":\"mlp_proj\",\"op\":\"linear\",\"out_features\":4},"
        " {\"name\":\"r2\",\"op\":\"add\",\"inputs\":[\"mlp_proj\",\"r1\"]}]",
        td_shape_flat(6), true, 0, 5);
}

/* The head's weight is the embedding's (weight_from): one tensor, whose gradient sums the
 * lookup's and the head's, against a finite difference that moves both at once. */
Test(gradcheck, tied_embedding_and_head) {
    run_check_full("[{\"name\":\"wte\",\"op\":\"embedding\",\"num_embeddings\":6,"
                   "\"embedding_dim\":4},"
                   " {\"name\":\"ln\",\"op\":\"layernorm\"},"
                   " {\"name\":\"head\",\"op\":\"linear\",\"out_features\":6,\"bias\":false,"
                   "\"weight_from\":\"wte\"}]",
                   td_shape_flat(5), true, 0, 6);
}

Test(model, weight_from_is_checked) {
    const char *bad[][2] = {
        {"[{\"name\":\"a\",\"op\":\"linear\",\"out_features\":3,\"weight_from\":\"b\"},"
         " {\"name\":\"b\",\"op\":\"linear\",\"out_features\":3}]",
         "no earlier node \"b\""},
        {"[{\"name\":\"a\",\"op\":\"linear\",\"out_features\":3,\"bias\":false},"
         " {\"name\":\"b\",\"op\":\"linear\",\"out_features\":4,\"weight_from\":\"a\"}]",
         "another shape"},
        {"[{\"name\":\"a\",\"op\":\"linear\",\"out_features\":3},"
         " {\"name\":\"b\",\"op\":\"linear\",\"out_features\":3,\"weight_from\":\"a\"}]",
         "no other parameter"},
        {"[{\"name\":\"a\",\"op\":\"linear\",\"out_features\":3,\"bias\":false},"
         " {\"name\":\"b\",\"op\":\"relu\",\"weight_from\":\"a\"}]",
         "no weight to share"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        char spec[2048];
        snprintf(spec, sizeof spec,
                 "{\"model\": {\"nodes\": %s}, \"data\": {\"format\": \"synthetic\", \"shape\": "
                 "[1, 1, 3], \"num_classes\": 3, \"size\": 4}, \"train\": {\"batch_size\": 2, "
                 "\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}",
                 bad[i][0]);
        td_job job;
        td_err err;
        cr_assert_eq(td_job_load_string(&job, spec, &err), 0, "%s", err.msg);
        td_model m;
        cr_expect_neq(td_model_build(&m, job.model.nodes, job.model.n_nodes, td_shape_flat(3), 2, 1,
                                     1, 0, &err),
                      0);
        cr_expect(strstr(err.msg, bad[i][1]) && strstr(err.msg, "weight_from"), "%zu: %s", i,
                  err.msg);
        td_job_free(&job);
    }
}

Test(batchnorm, running_statistics_by_hand) {
    /* x = [[1, 2], [3, 6]]: batch mean [2, 4], unbiased variance [2, 8]; momentum 0.1:
     * running_mean = 0.9·0 + 0.1·mean = [0.2, 0.4], running_var = 0.9·1 + 0.1·var = [1.1, 1.7];
     * a second step: [0.38, 0.76] and [1.19, 2.33] */
    td_model m;
    test_build_model(&m, "[{\"name\":\"bn\",\"op\":\"batchnorm1d\"}]", td_shape_flat(2), 2, 1);
    const td_param *rm = td_model_find_param(&m, "bn.running_mean");
    const td_param *rv = td_model_find_param(&m, "bn.running_var");
    const td_param *nbt = td_model_find_param(&m, "bn.num_batches_tracked");
    cr_assert(rm && rv && nbt);
    cr_expect(nbt->ndim == 0 && nbt->dtype == TD_I64, "num_batches_tracked is an int64 scalar");
    float x[4] = {1, 2, 3, 6};
    td_run run = {.n = 2, .training = true};
    const float *y = td_model_forward(&m, x, &run);
    cr_expect(fabsf(rm->data[0] - 0.2f) < 1e-6f && fabsf(rm->data[1] - 0.4f) < 1e-6f);
    cr_expect(fabsf(rv->data[0] - 1.1f) < 1e-6f && fabsf(rv->data[1] - 1.7f) < 1e-6f);
    cr_expect_eq(nbt->data[0], 1.0f);
    /* normalised with the batch's biased variance [1, 4]: y = [[-1, -1], [1, 1]] (eps aside) */
    cr_expect(fabsf(y[0] + 1.0f) < 1e-4f && fabsf(y[3] - 1.0f) < 1e-4f);
    td_model_forward(&m, x, &run);
    cr_expect(fabsf(rm->data[0] - 0.38f) < 1e-6f && fabsf(rm->data[1] - 0.76f) < 1e-6f);
    cr_expect(fabsf(rv->data[0] - 1.19f) < 1e-6f && fabsf(rv->data[1] - 2.33f) < 1e-5f);
    cr_expect_eq(nbt->data[0], 2.0f);
    /* evaluation uses the running statistics and leaves them alone */
    run.training = false;
    y = td_model_forward(&m, x, &run);
    cr_expect(fabsf(y[0] - (1.0f - 0.38f) / sqrtf(1.19f + 1e-5f)) < 1e-5f);
    cr_expect_eq(nbt->data[0], 2.0f);
    td_model_free(&m);
}

Test(gradcheck, lenet5_whole) {
    td_model m;
    td_node_spec *nodes;
    int n;
    td_preset_lenet5(10, &nodes, &n);
    td_spec_resolve_ops(nodes, n);
    td_err err;
    cr_assert_eq(td_model_build(&m, nodes, n, td_shape_image(1, 28, 28), 4, 1, 1, 0, &err), 0, "%s",
                 err.msg);
    cr_expect_eq(m.param_count, 44426u, "LeNet-5 has 44,426 parameters, got %zu", m.param_count);
    const char *names[] = {"conv1.weight", "conv1.bias", "conv2.weight", "conv2.bias", "fc1.weight",
                           "fc1.bias",     "fc2.weight", "fc2.bias",     "fc3.weight", "fc3.bias"};
    cr_assert_eq(m.n_params, 10);
    for (int i = 0; i < 10; i++) cr_expect_str_eq(m.params[i].name, names[i]);
    const td_param *w = td_model_find_param(&m, "conv2.weight");
    cr_assert(w);
    cr_expect(w->ndim == 4 && w->dims[0] == 16 && w->dims[1] == 6 && w->dims[2] == 5 &&
                  w->dims[3] == 5,
              "conv2.weight is OIHW [16, 6, 5, 5]");
    /* each parameter starts 32-byte aligned (conv1.weight's 150 values leave a gap of 2); the
     * gaps hold zeros, before and after a training step */
    float x[4 * 28 * 28], dlogits[4 * 10];
    for (int i = 0; i < 4 * 28 * 28; i++) x[i] = (float)(i % 17) / 17.0f;
    for (int i = 0; i < 40; i++) dlogits[i] = (float)(i % 7) - 3.0f;
    td_run run = {.n = 4, .training = true};
    td_model_forward(&m, x, &run);
    td_model_backward(&m, dlogits, &run);
    cr_expect_eq(m.params[1].offset, 152u, "conv1.bias after conv1.weight's 150 and a gap of 2");
    size_t end = 0;
    for (int i = 0; i < m.n_params; i++) {
        const td_param *p = &m.params[i];
        cr_expect_eq(p->offset % 8, 0u, "%s at %zu", p->name, p->offset);
        for (size_t k = end; k < p->offset; k++)
            cr_expect(m.param_block[k] == 0.0f && m.grad_block[k] == 0.0f, "gap %zu before %s", k,
                      p->name);
        end = p->offset + p->size;
    }
    cr_expect_eq(end, m.param_floats);
    td_model_free(&m);
    free(nodes);
}
