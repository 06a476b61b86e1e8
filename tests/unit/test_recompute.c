/* Activation checkpointing (train.activation_checkpointing): a model whose segments are
 * recomputed in backward must train exactly as the same model keeping every activation — same
 * outputs, gradients, BatchNorm running statistics and dropout draws — in less memory. */
#include "test_util.h"
#include "ops/td_ops.h"

#include <criterion/criterion.h>
#include <string.h>

/* A residual block with BatchNorm and dropout, then a head; names as PyTorch modules. */
static const char *block_nodes =
    "[{\"name\": \"stem.pool\", \"op\": \"maxpool2d\", \"kernel_size\": 2},"
    " {\"name\": \"stem.conv\", \"op\": \"conv2d\", \"out_channels\": 6, \"kernel_size\": 3,"
    "  \"padding\": 1},"
    " {\"name\": \"block.conv1\", \"op\": \"conv2d\", \"out_channels\": 6, \"kernel_size\": 3,"
    "  \"padding\": 1},"
    " {\"name\": \"block.bn1\", \"op\": \"batchnorm2d\"},"
    " {\"name\": \"block.relu\", \"op\": \"relu\"},"
    " {\"name\": \"block.drop\", \"op\": \"dropout\", \"p\": 0.3},"
    " {\"name\": \"block.conv2\", \"op\": \"conv2d\", \"out_channels\": 6, \"kernel_size\": 3,"
    "  \"padding\": 1},"
    " {\"name\": \"block.bn2\", \"op\": \"batchnorm2d\"},"
    " {\"name\": \"block.add\", \"op\": \"add\", \"inputs\": [\"block.bn2\", \"stem.conv\"]},"
    " {\"name\": \"block.out\", \"op\": \"relu\"},"
    " {\"name\": \"head.flat\", \"op\": \"flatten\"},"
    " {\"name\": \"head.drop\", \"op\": \"dropout\", \"p\": 0.2},"
    " {\"name\": \"head.fc\", \"op\": \"linear\", \"out_features\": 5}]";

enum { BATCH = 4, STEPS = 3 };

/* Loads the nodes with `segments` as train.activation_checkpointing (NULL: none) and builds. */
static int build(td_model *m, const char *segments, td_err *err) {
    char spec[8192];
    snprintf(
        spec, sizeof spec,
        "{\"model\": {\"nodes\": %s},"
        " \"data\": {\"format\": \"synthetic\", \"shape\": [3, 8, 8], \"num_classes\": 5,"
        "          \"size\": 8},"
        " \"train\": {\"batch_size\": %d, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}%s%s}}",
        block_nodes, BATCH, segments ? ", \"activation_checkpointing\": " : "",
        segments ? segments : "");
    td_job job;
    if (td_job_load_string(&job, spec, err) != 0) return -1;
    int rc = td_model_build(m, job.model.nodes, job.model.n_nodes, td_shape_image(3, 8, 8), BATCH,
                            1, 11, 0, err);
    td_job_free(&job);
    return rc;
}

/* A few training steps (forward, backward, SGD) on fixed batches, dropout drawn from one
 * seeded generator; returns the generator's final state in *rng. */
static void train_steps(td_model *m, float *logits_out, td_rng *rng) {
    size_t in = (size_t)BATCH * 3 * 8 * 8, classes = 5;
    float *x = td_aligned_alloc(in * sizeof(float));
    float *dlogits = td_aligned_alloc((size_t)BATCH * classes * sizeof(float));
    td_rng data;
    td_rng_seed_for(&data, 5, "data", 0);
    td_rng_seed_for(rng, 5, "dropout", 0);
    for (int step = 0; step < STEPS; step++) {
        for (size_t i = 0; i < in; i++) x[i] = (float)td_rng_normal(&data);
        td_run run = {.n = BATCH, .training = true, .rng = rng};
        const float *y = td_model_forward(m, x, &run);
        memcpy(logits_out + (size_t)step * BATCH * classes, y,
               (size_t)BATCH * classes * sizeof(float));
        for (size_t i = 0; i < (size_t)BATCH * classes; i++) dlogits[i] = y[i] * 0.1f - 0.05f;
        td_model_backward(m, dlogits, &run);
        for (size_t i = 0; i < m->param_floats; i++) m->param_block[i] -= 0.1f * m->grad_block[i];
    }
    free(x);
    free(dlogits);
}

static void assert_same_training(const char *segments, int expect_segments) {
    td_model plain, ckpt;
    td_err err = {{0}};
    cr_assert_eq(build(&plain, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(build(&ckpt, segments, &err), 0, "%s: %s", segments, err.msg);
    cr_assert_eq(ckpt.n_segments, expect_segments);
    float a[STEPS * BATCH * 5], b[STEPS * BATCH * 5];
    td_rng ra, rb;
    train_steps(&plain, a, &ra);
    train_steps(&ckpt, b, &rb);
    cr_assert(memcmp(a, b, sizeof a) == 0, "%s: logits differ", segments);
    cr_assert(memcmp(plain.grad_block, ckpt.grad_block, plain.param_floats * sizeof(float)) == 0,
              "%s: gradients differ", segments);
    cr_assert(memcmp(plain.param_block, ckpt.param_block, plain.param_floats * sizeof(float)) == 0,
              "%s: parameters differ", segments);
    /* running statistics moved once per step, num_batches_tracked == STEPS */
    cr_assert(memcmp(plain.buffer_block, ckpt.buffer_block, plain.buffer_floats * sizeof(float)) ==
                  0,
              "%s: BatchNorm buffers differ", segments);
    cr_assert_float_eq(td_model_find_param(&ckpt, "block.bn1.num_batches_tracked")->data[0],
                       (float)STEPS, 0);
    cr_assert(memcmp(&ra, &rb, sizeof ra) == 0, "%s: dropout drew a different number of values",
              segments);
    /* one segment alone saves nothing: its region is as large as what it drops */
    cr_assert_leq(ckpt.activation_bytes, plain.activation_bytes, "%s: memory grew %zu -> %zu",
                  segments, plain.activation_bytes, ckpt.activation_bytes);
    td_model_free(&plain);
    td_model_free(&ckpt);
}

Test(recompute, block_with_batchnorm_and_dropout_trains_identically) {
    assert_same_training("[\"block\"]", 1);
}

Test(recompute, segments_by_first_and_last_node) {
    assert_same_training("[{\"first\": \"block.conv1\", \"last\": \"block.drop\"},"
                         " {\"first\": \"block.conv2\", \"last\": \"block.out\"}]",
                         2);
}

/* The first segment needs no gradient at all (a pool on the batch), the last holds the model's
 * output: both ends of backward. */
Test(recompute, segments_at_both_ends) {
    assert_same_training("[\"stem\", \"block\", \"head\"]", 3);
}

/* Memory: only what leaves the block survives forward; its interior shares one region with the
 * head's. */
Test(recompute, interior_activations_share_one_region) {
    td_model plain, ckpt;
    td_err err = {{0}};
    cr_assert_eq(build(&plain, NULL, &err), 0, "%s", err.msg);
    cr_assert_eq(build(&ckpt, "[\"block\", \"head\"]", &err), 0, "%s", err.msg);
    for (int i = 0; i < ckpt.n_nodes; i++) {
        const td_node *node = &ckpt.nodes[i];
        /* block.out leaves the block; stem.conv is read by block.add but lies outside */
        bool expect =
            i >= 2 && strcmp(node->name, "block.out") != 0 && strcmp(node->name, "head.fc") != 0;
        cr_assert_eq(node->dropped, expect, "%s: dropped %d", node->name, node->dropped);
    }
    const td_node *conv1 = &ckpt.nodes[2], *flat = &ckpt.nodes[10];
    cr_assert_eq((void *)conv1->out, (void *)flat->out, "segments should start the region alike");
    /* what checkpointing saves is what the segments drop less the region they share */
    cr_assert_lt(ckpt.activation_bytes, plain.activation_bytes);
    cr_assert_eq(plain.activation_bytes - ckpt.activation_bytes,
                 ckpt.dropped_bytes - ckpt.region_bytes);
    td_model_free(&plain);
    td_model_free(&ckpt);
}

/* Bytes the layout plans for m (nothing placed: pointers come back NULL). */
static size_t planned_bytes(td_model *m) {
    td_arena count = {0};
    td_model_layout(m, &count, sizeof(float));
    return count.used;
}

/* A node whose output a device plan fuses into its reader (out_fused: BatchNorm or Add + ReLU on
 * the GPU) gets neither output nor gradient, in the arena and in the segments' shared region. */
Test(recompute, a_fused_output_takes_no_memory) {
    const size_t bn1_out = (size_t)BATCH * 6 * 4 * 4 * sizeof(float); /* [4, 4, 6] after the pool */
    for (int segmented = 0; segmented < 2; segmented++) {
        td_model m;
        td_err err = {{0}};
        cr_assert_eq(build(&m, segmented ? "[\"block\"]" : NULL, &err), 0, "%s", err.msg);
        td_node *bn1 = &m.nodes[3];
        cr_assert_str_eq(bn1->name, "block.bn1");
        cr_assert_eq(bn1->dropped, segmented);
        char *host_arena = m.arena.base; /* td_model_free frees it: layouts below only count */
        size_t whole = planned_bytes(&m), region = m.region_bytes;
        bn1->out_fused = true;
        size_t fused = planned_bytes(&m);
        cr_assert_eq(whole - fused, 2 * bn1_out, "segmented %d: %zu -> %zu bytes", segmented, whole,
                     fused);
        if (segmented) cr_assert_eq(region - m.region_bytes, 2 * bn1_out);
        td_arena arena = {td_aligned_alloc(fused), 0, fused};
        td_model_layout(&m, &arena, sizeof(float));
        cr_assert_eq(arena.used, fused);
        cr_assert_null(bn1->out);
        cr_assert_null(bn1->grad);
        cr_assert_null(m.nodes[4].in[0], "the ReLU reads nothing of the fused BatchNorm");
        cr_assert_not_null(m.nodes[4].out);
        free(arena.base);
        m.arena.base = host_arena;
        td_model_free(&m);
    }
}

/* The whole trainer, ResNet-18 (CIFAR stem) with a segment per residual block: the metrics,
 * validation (running statistics) included, equal those of the run that keeps everything. */
Test(recompute, resnet18_job_metrics_equal, .timeout = 300) {
    const char *fmt =
        "{\"model\": {\"preset\": \"resnet18\", \"stem\": \"cifar\", \"num_classes\": 10},"
        " \"data\": {\"format\": \"synthetic\", \"shape\": [3, 16, 16], \"num_classes\": 10,"
        "          \"size\": 24, \"val_size\": 8},"
        " \"train\": {\"max_steps\": 3, \"batch_size\": 8, \"seed\": 4,"
        "           \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}%s},"
        " \"log\": {\"every_steps\": 1}}";
    char plain_spec[2048], ckpt_spec[2048];
    snprintf(plain_spec, sizeof plain_spec, fmt, "");
    snprintf(ckpt_spec, sizeof ckpt_spec, fmt,
             ", \"activation_checkpointing\": [\"layer1.0\", \"layer1.1\", \"layer2\","
             " {\"first\": \"layer3.0.conv1\", \"last\": \"layer4.1.relu2\"}]");
    char *a = test_run_job(plain_spec, NULL, NULL), *b = test_run_job(ckpt_spec, NULL, NULL);
    test_strip_timings(a);
    test_strip_timings(b);
    cr_assert(strstr(a, "\"val_acc\"") != NULL, "no evaluation in: %s", a);
    cr_assert_str_eq(a, b);
    free(a);
    free(b);
}

static void assert_spec_error(const char *segments, const char *expect) {
    td_model m;
    td_err err = {{0}};
    cr_assert_neq(build(&m, segments, &err), 0, "%s was accepted", segments);
    cr_assert(strstr(err.msg, expect) != NULL, "%s: message \"%s\" lacks \"%s\"", segments, err.msg,
              expect);
}

Test(recompute, bad_segments_name_the_entry) {
    assert_spec_error("[\"blok\"]", "train.activation_checkpointing[0]: no node is named \"blok\"");
    assert_spec_error("[\"block\", \"block.relu\"]",
                      "train.activation_checkpointing[1]: overlaps entry [0] at nodes[4] "
                      "(\"block.relu\")");
    assert_spec_error("[{\"first\": \"head.fc\", \"last\": \"block.bn1\"}]",
                      "[0]: first (\"head.fc\", nodes[12]) comes after last");
    assert_spec_error("[{\"first\": \"block.bn1\", \"last\": \"fc\"}]",
                      "[0].last: no node is named \"fc\"");
    assert_spec_error("[{\"first\": \"block.bn1\"}]", "[0].last: missing");
    assert_spec_error("[{\"first\": \"block.bn1\", \"last\": \"block.bn2\", \"every\": 2}]",
                      "[0].every: unknown key");
    assert_spec_error("[7]", "train.activation_checkpointing[0]: expected a module prefix");
    assert_spec_error("\"block\"", "train.activation_checkpointing: expected an array");
    /* a prefix is a module: "block" does not take "blockade.x", and "stem" here is not one run */
    assert_spec_error("[\"block.co\"]", "no node is named \"block.co\"");
}

Test(recompute, a_module_split_by_other_nodes_is_refused) {
    td_node_spec specs[3] = {0};
    snprintf(specs[0].name, sizeof specs[0].name, "enc.a");
    snprintf(specs[1].name, sizeof specs[1].name, "mid");
    snprintf(specs[2].name, sizeof specs[2].name, "enc.b");
    td_segment_name names[1] = {{.first = "enc"}};
    td_err err = {{0}};
    cr_assert_neq(td_segments_assign(specs, 3, names, 1, &err), 0);
    cr_assert(strstr(err.msg, "not consecutive: nodes[1] (\"mid\") lies between") != NULL, "%s",
              err.msg);
}

/* Specs built by hand (not through the spec parser) get the same rule from the model. */
Test(recompute, build_refuses_a_scattered_segment) {
    td_node_spec specs[3] = {0};
    const char *names[3] = {"a", "b", "c"};
    for (int i = 0; i < 3; i++) {
        snprintf(specs[i].name, sizeof specs[i].name, "%s", names[i]);
        specs[i].op = &td_op_relu;
    }
    specs[2].op = &td_op_linear;
    specs[2].args[0] = 3;
    specs[0].segment = specs[2].segment = 1;
    td_model m;
    td_err err = {{0}};
    cr_assert_neq(td_model_build(&m, specs, 3, td_shape_flat(4), 2, 1, 1, 0, &err), 0);
    cr_assert(strstr(err.msg, "a segment must be consecutive nodes") != NULL, "%s", err.msg);
}
