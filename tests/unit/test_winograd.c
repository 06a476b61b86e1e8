/* Winograd F(4x4, 3x3) convolutions against im2col + GEMM on the same weights and data.
 *
 * The two algorithms sum the same products in a different order (Winograd through its
 * transforms), so they agree to float rounding, not bit for bit. Shapes cover full and partial
 * tiles, channel counts that are not a multiple of 16 (the transforms' vector width), every
 * padding Winograd takes, images smaller than one tile, accumulation into existing gradients,
 * and batches smaller than the one the model was built for. */
#include "test_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct conv_case {
    int n, c, h, w, o, p;
    bool bias;
} conv_case;

/* One conv layer with the given algorithm: forward on random x, backward of a random dy run
 * `passes` times with gradient accumulation after the first; batch n on a model built for
 * n + 2. */
static test_pass run_conv(const conv_case *k, const char *algorithm, int passes) {
    char nodes[512];
    snprintf(nodes, sizeof nodes,
             "[{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":%d,\"kernel_size\":3,"
             "\"padding\":%d,\"bias\":%s,\"algorithm\":\"%s\"}]",
             k->o, k->p, k->bias ? "true" : "false", algorithm);
    td_model m;
    td_shape in = td_shape_image(k->c, k->h, k->w);
    test_build_model(&m, nodes, in, k->n + 2, 5);
    test_pass r = test_pass_run(&m, in, k->n, passes);
    td_model_free(&m);
    return r;
}

/* |a - b| <= tol · max(1, max |b|) elementwise: rounding relative to the tensor's scale */
static void expect_close(const char *what, const float *a, const float *b, size_t n, double tol) {
    size_t at;
    double scale, worst = test_worst_diff(a, b, n, &at, &scale);
    cr_expect(worst <= tol * scale,
              "%s: winograd and im2col differ by %.3g at [%zu] (%g vs %g), "
              "scale %.3g",
              what, worst, at, (double)a[at], (double)b[at], scale);
}

static void check_case(conv_case k, int passes) {
    test_pass wino = run_conv(&k, "winograd", passes);
    test_pass ref = run_conv(&k, "im2col", passes);
    expect_close("output", wino.out, ref.out, ref.out_n, 2e-5);
    expect_close("input gradient", wino.dx, ref.dx, ref.dx_n, 2e-5);
    expect_close("parameter gradients", wino.dparams, ref.dparams, ref.dparams_n, 2e-5);
    test_pass_free(&wino);
    test_pass_free(&ref);
}

Test(winograd, whole_tiles) {
    check_case((conv_case){.n = 2, .c = 16, .h = 8, .w = 8, .o = 32, .p = 1, .bias = true}, 1);
}

Test(winograd, partial_tiles_and_channel_tails) {
    check_case((conv_case){.n = 3, .c = 20, .h = 7, .w = 9, .o = 24, .p = 1, .bias = true}, 1);
}

Test(winograd, unpadded) {
    check_case((conv_case){.n = 2, .c = 17, .h = 10, .w = 6, .o = 16, .p = 0, .bias = false}, 1);
}

Test(winograd, padding_two) {
    check_case((conv_case){.n = 1, .c = 16, .h = 5, .w = 5, .o = 19, .p = 2, .bias = true}, 1);
}

Test(winograd, image_smaller_than_a_tile) {
    check_case((conv_case){.n = 4, .c = 32, .h = 2, .w = 3, .o = 16, .p = 1, .bias = false}, 1);
}

Test(winograd, many_chunks) {
    /* more tiles than one chunk holds: 6 * 8 * 8 = 384 tiles of 16 + 16 channels */
    check_case((conv_case){.n = 6, .c = 16, .h = 32, .w = 32, .o = 16, .p = 1, .bias = true}, 1);
}

Test(winograd, gradient_accumulation) {
    check_case((conv_case){.n = 2, .c = 16, .h = 6, .w = 6, .o = 16, .p = 1, .bias = true}, 3);
}

/* The accumulated gradient is the sum of the single ones: passes=2 gives twice passes=1. */
Test(winograd, accumulation_adds) {
    conv_case k = {.n = 2, .c = 16, .h = 6, .w = 6, .o = 16, .p = 1, .bias = true};
    test_pass one = run_conv(&k, "winograd", 1), two = run_conv(&k, "winograd", 2);
    for (size_t i = 0; i < one.dparams_n; i++) one.dparams[i] *= 2.0f;
    expect_close("doubled parameter gradients", two.dparams, one.dparams, one.dparams_n, 1e-6);
    test_pass_free(&one);
    test_pass_free(&two);
}

Test(winograd, refused_where_it_does_not_fit) {
    const char *spec =
        "{\"model\": {\"nodes\": [{\"name\":\"c\",\"op\":\"conv2d\",\"out_channels\":16,"
        "\"kernel_size\":3,\"stride\":2,\"algorithm\":\"winograd\"}]},"
        " \"data\": {\"format\": \"synthetic\", \"shape\": [3, 8, 8], \"num_classes\": 2,"
        " \"size\": 4},"
        " \"train\": {\"batch_size\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}";
    td_job job;
    td_err err = {{0}};
    cr_assert(td_job_load_string(&job, spec, &err) == 0, "spec: %s", err.msg);
    td_model m;
    int rc = td_model_build(&m, job.model.nodes, job.model.n_nodes, td_shape_image(16, 8, 8), 2, 1,
                            1, 0, &err);
    td_job_free(&job);
    if (rc == 0) td_model_free(&m);
    cr_expect(rc != 0, "a stride-2 convolution was accepted for Winograd");
    cr_expect(strstr(err.msg, "stride 1") != NULL, "unclear message: %s", err.msg);
}
