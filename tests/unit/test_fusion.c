/* CPU fusion (td_node.relu_in): a ReLU read only by a max-pool runs inside the pool. The fused
 * model must train bit for bit as the same model run node by node (TD_MODEL_UNFUSED): outputs,
 * every gradient (the batch's too) and the parameters after a few SGD steps, while keeping no
 * output for the ReLU. Run once per instruction set (tests/CMakeLists.txt): the pool has
 * separate kernels for few and many channels on each. */
#include "test_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <string.h>

/* LeNet's shape (conv, relu, 2x2 pool, twice) with a 3x3 stride-2 padded pool over 20 channels
 * (the general kernel, windows over the padding) and a ReLU that has two readers. */
static const char *nodes =
    "[{\"name\": \"conv1\", \"op\": \"conv2d\", \"out_channels\": 6, \"kernel_size\": 5,"
    "  \"padding\": 2},"
    " {\"name\": \"relu1\", \"op\": \"relu\"},"
    " {\"name\": \"pool1\", \"op\": \"maxpool2d\", \"kernel_size\": 2},"
    " {\"name\": \"conv2\", \"op\": \"conv2d\", \"out_channels\": 20, \"kernel_size\": 3,"
    "  \"padding\": 1},"
    " {\"name\": \"relu2\", \"op\": \"relu\"},"
    " {\"name\": \"pool2\", \"op\": \"maxpool2d\", \"kernel_size\": 3, \"stride\": 2,"
    "  \"padding\": 1},"
    " {\"name\": \"conv3\", \"op\": \"conv2d\", \"out_channels\": 20, \"kernel_size\": 1},"
    " {\"name\": \"relu3\", \"op\": \"relu\"},"
    " {\"name\": \"pool3\", \"op\": \"maxpool2d\", \"kernel_size\": 2},"
    " {\"name\": \"up\", \"op\": \"conv2d\", \"out_channels\": 20, \"kernel_size\": 3,"
    "  \"stride\": 2, \"padding\": 1, \"inputs\": [\"relu3\"]},"
    " {\"name\": \"join\", \"op\": \"add\", \"inputs\": [\"pool3\", \"up\"]},"
    " {\"name\": \"flat\", \"op\": \"flatten\"},"
    " {\"name\": \"fc\", \"op\": \"linear\", \"out_features\": 10}]";

enum { BATCH = 5, STEPS = 3, CLASSES = 10, SIDE = 16 };

static void build(td_model *m, const char *segments, unsigned flags) {
    char spec[8192];
    snprintf(
        spec, sizeof spec,
        "{\"model\": {\"nodes\": %s},"
        " \"data\": {\"format\": \"synthetic\", \"shape\": [1, %d, %d], \"num_classes\": %d,"
        "          \"size\": 8},"
        " \"train\": {\"batch_size\": %d, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}%s%s}}",
        nodes, SIDE, SIDE, CLASSES, BATCH, segments ? ", \"activation_checkpointing\": " : "",
        segments ? segments : "");
    td_job job;
    td_err err = {{0}};
    cr_assert_eq(td_job_load_string(&job, spec, &err), 0, "spec: %s", err.msg);
    int rc = td_model_build(m, job.model.nodes, job.model.n_nodes, td_shape_image(1, SIDE, SIDE),
                            BATCH, 1, 3, flags | TD_MODEL_INPUT_GRAD, &err);
    td_job_free(&job);
    cr_assert_eq(rc, 0, "build: %s", err.msg);
}

static const td_node *node_named(const td_model *m, const char *name) {
    for (int i = 0; i < m->n_nodes; i++)
        if (strcmp(m->nodes[i].name, name) == 0) return &m->nodes[i];
    cr_assert_fail("no node %s", name);
    return NULL;
}

typedef struct run_result {
    float logits[STEPS * BATCH * CLASSES];
    float dx[BATCH * SIDE * SIDE];
    int pooled_zeros; /* pool1 outputs that are exactly 0: windows with no positive value */
} run_result;

/* SGD steps on fixed batches; a NaN in the last step's batch reaches the outputs through the
 * pools as torch.relu and MaxPool2d pass it. */
static void train(td_model *m, run_result *r, bool with_nan) {
    size_t in = (size_t)BATCH * SIDE * SIDE;
    float *x = td_aligned_alloc(in * sizeof(float)), dlogits[BATCH * CLASSES];
    const td_node *pool1 = node_named(m, "pool1");
    size_t pool1_n = (size_t)BATCH * td_shape_size(pool1->out_shape);
    for (int step = 0; step < STEPS; step++) {
        test_fill_uniform(x, in, 9 + (uint64_t)step);
        if (with_nan && step == STEPS - 1) x[37] = NAN;
        td_run run = {.n = BATCH, .training = true};
        const float *y = td_model_forward(m, x, &run);
        memcpy(r->logits + step * BATCH * CLASSES, y, sizeof dlogits);
        r->pooled_zeros = 0;
        for (size_t i = 0; i < pool1_n; i++) r->pooled_zeros += pool1->out[i] == 0.0f;
        for (int i = 0; i < BATCH * CLASSES; i++) dlogits[i] = 0.1f * (float)((i * 7) % 11) - 0.5f;
        td_model_backward(m, dlogits, &run);
        for (size_t i = 0; i < m->param_floats; i++)
            if (isfinite(m->grad_block[i])) m->param_block[i] -= 0.05f * m->grad_block[i];
    }
    memcpy(r->dx, m->input_grad, sizeof r->dx);
    free(x);
}

static void assert_same(const td_model *a, const run_result *ra, const td_model *b,
                        const run_result *rb, const char *what) {
    cr_assert_eq(ra->pooled_zeros, rb->pooled_zeros, "%s: pool1 zeros differ", what);
    cr_assert(memcmp(ra->logits, rb->logits, sizeof ra->logits) == 0, "%s: logits differ", what);
    cr_assert(memcmp(ra->dx, rb->dx, sizeof ra->dx) == 0, "%s: the batch's gradient differs", what);
    cr_assert(memcmp(a->grad_block, b->grad_block, a->param_floats * sizeof(float)) == 0,
              "%s: parameter gradients differ", what);
    cr_assert(memcmp(a->param_block, b->param_block, a->param_floats * sizeof(float)) == 0,
              "%s: parameters differ", what);
}

Test(fusion, relu_read_only_by_a_max_pool_runs_inside_it_and_trains_identically) {
    td_model fused, plain;
    build(&fused, NULL, 0);
    build(&plain, NULL, TD_MODEL_UNFUSED);
    /* relu3 has a second reader (up): it stays a node of its own */
    const char *absorbed[] = {"relu1", "relu2"};
    for (int i = 0; i < 2; i++) {
        const td_node *relu = node_named(&fused, absorbed[i]);
        cr_assert(relu->out_fused && !relu->out, "%s should run inside its pool", absorbed[i]);
        cr_assert(!node_named(&plain, absorbed[i])->out_fused);
    }
    cr_assert(node_named(&fused, "pool1")->relu_in && node_named(&fused, "pool2")->relu_in);
    cr_assert(!node_named(&fused, "relu3")->out_fused && !node_named(&fused, "pool3")->relu_in,
              "a ReLU with two readers must keep its output");
    /* an output and a gradient each (whole 64-byte units at these sizes) */
    size_t relu_bytes = 2 * BATCH * sizeof(float) *
                        (td_shape_size(node_named(&plain, "relu1")->out_shape) +
                         td_shape_size(node_named(&plain, "relu2")->out_shape));
    cr_assert_eq(plain.activation_bytes - fused.activation_bytes, relu_bytes,
                 "the fused ReLUs' outputs and gradients should take no memory (%zu vs %zu)",
                 fused.activation_bytes, plain.activation_bytes);
    run_result a, b;
    train(&fused, &a, false);
    train(&plain, &b, false);
    cr_assert_gt(b.pooled_zeros, 0, "some pool1 windows should hold no positive value");
    assert_same(&fused, &a, &plain, &b, "fused");
    td_model_free(&fused);
    td_model_free(&plain);
}

Test(fusion, nan_passes_through_a_fused_relu_and_pool_as_through_the_two) {
    td_model fused, plain;
    build(&fused, NULL, 0);
    build(&plain, NULL, TD_MODEL_UNFUSED);
    run_result a, b;
    train(&fused, &a, true);
    train(&plain, &b, true);
    bool any_nan = false;
    for (int i = 0; i < STEPS * BATCH * CLASSES; i++) any_nan = any_nan || isnan(b.logits[i]);
    cr_assert(any_nan, "the NaN in the batch should reach the logits");
    assert_same(&fused, &a, &plain, &b, "with a NaN");
    td_model_free(&fused);
    td_model_free(&plain);
}

/* Activation checkpointing: a ReLU and its pool in one recomputed segment fuse; across a
 * segment's edge they do not (what is dropped was decided from the graph as written). */
Test(fusion, fuses_inside_a_checkpointed_segment_and_not_across_its_edge) {
    td_model inside, across, plain;
    build(&inside, "[{\"first\": \"conv1\", \"last\": \"pool2\"}]", 0);
    build(&across, "[{\"first\": \"conv1\", \"last\": \"relu1\"}]", 0);
    build(&plain, NULL, TD_MODEL_UNFUSED);
    cr_assert(node_named(&inside, "relu1")->out_fused && node_named(&inside, "relu2")->out_fused);
    cr_assert(!node_named(&across, "relu1")->out_fused, "relu1 and pool1 lie in two segments");
    cr_assert(node_named(&across, "relu2")->out_fused);
    run_result a, b, c;
    train(&inside, &a, false);
    train(&across, &b, false);
    train(&plain, &c, false);
    assert_same(&inside, &a, &plain, &c, "segment conv1..pool2");
    assert_same(&across, &b, &plain, &c, "segment conv1..relu1");
    td_model_free(&inside);
    td_model_free(&across);
    td_model_free(&plain);
}
