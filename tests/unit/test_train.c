/* Whole training runs: bitwise determinism for a seed, and that a run actually learns. */
#include "train/td_train.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

static const char *SPEC_FMT =
    "{\"model\": {\"preset\": \"mlp\", \"hidden\": [32, 16], \"dropout\": 0.2, "
    "\"num_classes\": 10},"
    " \"data\": {\"format\": \"synthetic\", \"shape\": [1, 8, 8], \"num_classes\": 10, "
    "\"size\": 640, \"val_size\": 128},"
    " \"train\": {\"epochs\": 2, \"batch_size\": 32, \"seed\": %d,"
    "   \"optimizer\": {\"type\": \"adamw\", \"lr\": 0.003},"
    "   \"schedule\": {\"type\": \"cosine\", \"warmup_steps\": 5}},"
    " \"log\": {\"every_steps\": 5}}";

Test(train, same_seed_is_bitwise_identical) {
    char spec[2048];
    snprintf(spec, sizeof spec, SPEC_FMT, 42);
    char *a = test_run_job(spec, NULL, NULL), *b = test_run_job(spec, NULL, NULL);
    test_strip_timings(a);
    test_strip_timings(b);
    cr_expect(strstr(a, "\"event\":\"train\"") && strstr(a, "\"event\":\"eval\"") &&
                  strstr(a, "\"event\":\"done\""),
              "all three kinds of line: %s", a);
    cr_expect_str_eq(a, b);
    snprintf(spec, sizeof spec, SPEC_FMT, 43);
    char *c = test_run_job(spec, NULL, NULL);
    test_strip_timings(c);
    cr_expect_str_neq(a, c, "another seed gives another run");
    free(a);
    free(b);
    free(c);
}

/* The optimizer inside backward (td_train_step.c) against the one pass after it: the same run
 * to the bit, for SGD with momentum, Nesterov and weight decay, and for AdamW. */
Test(train, optimizer_in_backward_is_bitwise_the_pass_after_it) {
    static const char *optimizers[] = {
        "{\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9, \"nesterov\": true, "
        "\"weight_decay\": 0.001}",
        "{\"type\": \"adamw\", \"lr\": 0.003}"};
    for (int i = 0; i < 2; i++) {
        char spec[2048];
        snprintf(spec, sizeof spec,
                 "{\"model\": {\"preset\": \"mlp\", \"hidden\": [32, 16], \"num_classes\": 10},"
                 " \"data\": {\"format\": \"synthetic\", \"shape\": [1, 8, 8], "
                 "\"num_classes\": 10, \"size\": 640, \"val_size\": 128},"
                 " \"train\": {\"epochs\": 2, \"batch_size\": 32, \"seed\": 3, "
                 "\"optimizer\": %s}, \"log\": {\"every_steps\": 1}}",
                 optimizers[i]);
        setenv("TRAIND_FUSE_OPTIMIZER", "0", 1);
        char *after = test_run_job(spec, NULL, NULL);
        unsetenv("TRAIND_FUSE_OPTIMIZER");
        char *inside = test_run_job(spec, NULL, NULL);
        test_strip_timings(after);
        test_strip_timings(inside);
        cr_expect(strstr(after, "\"step\":40"), "40 steps: %s", after);
        cr_expect_str_eq(inside, after, "%s", optimizers[i]);
        free(after);
        free(inside);
    }
}

Test(train, max_steps_and_metrics_lines) {
    char spec[2048];
    snprintf(spec, sizeof spec, SPEC_FMT, 1);
    char *s = strstr(spec, "\"epochs\": 2");
    memcpy(s, "\"epochs\":99", 11); /* same length */
    char *with_limit = malloc(strlen(spec) + 32);
    strcpy(with_limit, spec);
    char *t = strstr(with_limit, "\"batch_size\"");
    memmove(t + 17, t, strlen(t) + 1);
    memcpy(t, "\"max_steps\": 13, ", 17);
    td_train_result res;
    char *m = test_run_job(with_limit, NULL, &res);
    cr_expect_eq(res.steps, 13);
    cr_expect(strstr(m, "{\"event\":\"train\",\"step\":5,\"epoch\":1,\"loss\":"), "%s", m);
    cr_expect(strstr(m, "{\"event\":\"train\",\"step\":13,"), "the last step is logged: %s", m);
    cr_expect(strstr(m, "{\"event\":\"done\",\"step\":13,"), "%s", m);
    cr_expect(strstr(m, "\"val_acc\":"), "done carries the final val_acc: %s", m);
    free(m);
    free(with_limit);
}

Test(train, lenet_learns_fashion_mnist, .timeout = 120) {
    const char *spec =
        "{\"model\": {\"preset\": \"lenet5\", \"num_classes\": 10},"
        " \"data\": {\"format\": \"idx\","
        "   \"train\": {\"images\": "
        "\"/usr/share/datasets/fashion-mnist/train-images-idx3-ubyte.gz\","
        "             \"labels\": "
        "\"/usr/share/datasets/fashion-mnist/train-labels-idx1-ubyte.gz\"},"
        "   \"val\": {\"images\": \"/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz\","
        "           \"labels\": \"/usr/share/datasets/fashion-mnist/t10k-labels-idx1-ubyte.gz\"},"
        "   \"normalize\": {\"mean\": [0.286], \"std\": [0.353]}},"
        " \"train\": {\"max_steps\": 400, \"batch_size\": 64, \"seed\": 3,"
        "   \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.05, \"momentum\": 0.9}},"
        " \"log\": {\"every_steps\": 100}}";
    td_train_result res;
    char *m = test_run_job(spec, NULL, &res);
    /* chance is 0.10; 400 steps of LeNet reach about 0.8 */
    cr_expect(res.val_acc > 0.70, "val_acc %.3f after 400 steps", res.val_acc);
    free(m);
}

/* TRAIND_PROFILE=1: the step breakdown, each step's own work as quantiles, and the per-node
 * table naming a fused ReLU with the pool that runs it. */
Test(train, profile_prints_the_step_breakdown_and_its_spread) {
    const char *spec =
        "{\"model\": {\"preset\": \"lenet5\", \"num_classes\": 10},"
        " \"data\": {\"format\": \"synthetic\", \"shape\": [1, 28, 28], \"num_classes\": 10,"
        "          \"size\": 640},"
        " \"train\": {\"epochs\": 1, \"batch_size\": 16, \"seed\": 3, \"threads\": 1,"
        "           \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.01}}}";
    td_job job;
    td_err err = {{0}};
    cr_assert_eq(td_job_load_string(&job, spec, &err), 0, "%s", err.msg);
    char *text = NULL, *log = NULL;
    size_t len = 0, log_len = 0;
    FILE *metrics = open_memstream(&text, &len), *logf = open_memstream(&log, &log_len);
    setenv("TRAIND_PROFILE", "1", 1);
    int rc = td_train_run(&job, NULL, metrics, logf, NULL, &err);
    unsetenv("TRAIND_PROFILE");
    fclose(metrics);
    fclose(logf);
    td_job_free(&job);
    cr_assert_eq(rc, 0, "%s", err.msg);
    long steps = 0;
    double total = 0, p10 = 0, median = 0, p90 = 0;
    const char *line = strstr(log, "rank 0 step profile, ms per step over ");
    cr_assert(line, "no step profile in: %s", log);
    cr_assert_eq(
        sscanf(line, "rank 0 step profile, ms per step over %ld steps: %lf total", &steps, &total),
        2, "%.200s", line);
    cr_assert_eq(steps, 40, "640 samples in batches of 16: %s", line);
    line = strstr(log, "rank 0 own work per step (all but the all-reduce tail), ms: ");
    cr_assert(line, "no own-work line in: %s", log);
    line = strchr(line, ':') + 1;
    cr_assert_eq(sscanf(line, " p10 %lf, median %lf, p90 %lf", &p10, &median, &p90), 3, "%s", line);
    cr_assert(0 < p10 && p10 <= median && median <= p90, "%g %g %g", p10, median, p90);
    /* one rank: a step is all its own work, so the median is near the mean step */
    cr_assert(median > 0.3 * total && median < 3 * total, "median %g of steps of %g ms", median,
              total);
    cr_assert(strstr(log, "relu1+pool1") && strstr(log, "relu+maxpool2d"),
              "the fused ReLU is timed with its pool: %s", log);
    free(text);
    free(log);
}
