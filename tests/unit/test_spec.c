/* Each kind of bad spec gives one clear message naming the JSON path, what was found and what
 * was expected. Shape errors surface when the model is built, so those go through a real run. */
#include "gpu/td_gpu.h"
#include "ops/td_op_sigs.h"
#include "ops/td_ops.h"
#include "train/td_train.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

static const char *GOOD_TRAIN =
    "\"train\": {\"batch_size\": 8, \"max_steps\": 2, \"optimizer\": {\"type\": \"sgd\", "
    "\"lr\": 0.1}}";
static const char *SYNTH =
    "\"data\": {\"format\": \"synthetic\", \"shape\": [1, 28, 28], \"num_classes\": 10, "
    "\"size\": 32}";

/* Loads spec (and, if it parses, trains it briefly); expects an error containing each of the
 * given fragments. */
static void expect_error(const char *spec, const char *const *fragments) {
    td_job job;
    td_err err = {{0}};
    int rc = td_job_load_string(&job, spec, &err);
    if (rc == 0) {
        FILE *devnull = fopen("/dev/null", "w");
        rc = td_train_run(&job, NULL, devnull, devnull, NULL, &err);
        fclose(devnull);
        td_job_free(&job);
    }
    cr_assert_neq(rc, 0, "spec was accepted: %s", spec);
    for (int i = 0; fragments[i]; i++)
        cr_expect(strstr(err.msg, fragments[i]), "message \"%s\" lacks \"%s\"", err.msg,
                  fragments[i]);
}

#define EXPECT_ERROR(spec, ...) expect_error(spec, (const char *const[]){__VA_ARGS__, NULL})

static char *spec_of(const char *model, const char *data, const char *train) {
    static char buf[4096];
    snprintf(buf, sizeof buf, "{\"model\": %s, %s, %s}", model, data, train);
    return buf;
}

Test(spec, invalid_json_names_line_and_column) {
    EXPECT_ERROR("{\"model\": {\"preset\": \"lenet5\",\n \"num_classes\": }",
                 "spec:2:", "invalid JSON");
}

Test(spec, missing_section) {
    EXPECT_ERROR("{\"model\": {\"preset\": \"lenet5\", \"num_classes\": 10}, \"data\": "
                 "{\"format\": \"synthetic\", \"shape\": [1,28,28], \"num_classes\": 10, "
                 "\"size\": 8}}",
                 "train: missing; expected an object");
}

Test(spec, missing_field) {
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH,
                         "\"train\": {\"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}"),
                 "train.batch_size: missing; expected an integer");
}

Test(spec, wrong_type) {
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH,
                         "\"train\": {\"batch_size\": \"64\", \"optimizer\": {\"type\": \"sgd\", "
                         "\"lr\": 0.1}}"),
                 "train.batch_size: expected an integer, found \"64\"");
}

Test(spec, out_of_range) {
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH,
                         "\"train\": {\"batch_size\": 8, \"optimizer\": {\"type\": \"sgd\", "
                         "\"lr\": -1}}"),
                 "train.optimizer.lr: expected a number in", "found -1");
}

Test(spec, bucket_cap_must_be_positive) {
    char spec[4200];
    snprintf(spec, sizeof spec, "{\"distributed\": {\"bucket_cap_mb\": 0}, %s",
             spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH,
                     "\"train\": {\"batch_size\": 8, \"optimizer\": {\"type\": \"sgd\", "
                     "\"lr\": 0.1}}") +
                 1);
    EXPECT_ERROR(spec, "distributed.bucket_cap_mb: expected a number in", "found 0");
}

Test(spec, unknown_key_is_not_ignored) {
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH,
                         "\"train\": {\"batch_size\": 8, \"optimizer\": {\"type\": \"sgd\", "
                         "\"lr\": 0.1, \"momentun\": 0.9}}"),
                 "train.optimizer.momentun: unknown key", "momentum");
}

Test(spec, unknown_preset) {
    EXPECT_ERROR(spec_of("{\"preset\": \"resnet9000\", \"num_classes\": 10}", SYNTH, GOOD_TRAIN),
                 "model.preset: expected one of lenet5/mlp/cifar_net/resnet18", "\"resnet9000\"");
}

Test(spec, unknown_op) {
    EXPECT_ERROR(spec_of("{\"nodes\": [{\"name\": \"f\", \"op\": \"flatten\"}, {\"name\": \"c\", "
                         "\"op\": \"conv3d\"}]}",
                         SYNTH, GOOD_TRAIN),
                 "model.nodes[1].op: unknown op \"conv3d\"", "conv2d");
}

/* The op list (ops/td_ops.def) is the table: every op in it is found by the name it is listed
 * under, and the error for an unknown one lists them all in its order. */
Test(spec, every_listed_op_is_found_by_its_name) {
    char listed[256] = "";
#define TD_OP(name)                                                                                \
    cr_expect_eq(td_op_find(#name), &td_op_##name, "op %s", #name);                                \
    strcat(listed, listed[0] ? ", " #name : #name);
#include "ops/td_ops.def"
    cr_expect_str_eq(td_op_sig_names(), listed);
}

Test(spec, missing_op_argument) {
    EXPECT_ERROR(spec_of("{\"nodes\": [{\"name\": \"c\", \"op\": \"conv2d\", \"kernel_size\": 3}]}",
                         SYNTH, GOOD_TRAIN),
                 "model.nodes[0].out_channels: missing");
}

Test(spec, linear_on_image_input) {
    EXPECT_ERROR(spec_of("{\"nodes\": [{\"name\": \"fc\", \"op\": \"linear\", \"out_features\": "
                         "10}]}",
                         SYNTH, GOOD_TRAIN),
                 "model.nodes[0] (\"fc\", linear)", "input has shape [1, 28, 28]", "flatten");
}

Test(spec, kernel_larger_than_input) {
    EXPECT_ERROR(spec_of("{\"nodes\": [{\"name\": \"c1\", \"op\": \"conv2d\", \"out_channels\": "
                         "4, \"kernel_size\": 5, \"stride\": 4}, {\"name\": \"c2\", \"op\": "
                         "\"conv2d\", \"out_channels\": 4, \"kernel_size\": 9}]}",
                         SYNTH, GOOD_TRAIN),
                 "model.nodes[1] (\"c2\", conv2d)", "kernel_size 9 does not fit the input 6x6");
}

Test(spec, add_shape_mismatch) {
    EXPECT_ERROR(spec_of("{\"nodes\": [{\"name\": \"c\", \"op\": \"conv2d\", \"out_channels\": 2, "
                         "\"kernel_size\": 3}, {\"name\": \"s\", \"op\": \"add\", \"inputs\": "
                         "[\"c\", \"input\"]}]}",
                         SYNTH, GOOD_TRAIN),
                 "inputs[0] has shape [2, 26, 26] but inputs[1] has shape [1, 28, 28]");
}

Test(spec, input_names_an_unknown_node) {
    EXPECT_ERROR(spec_of("{\"nodes\": [{\"name\": \"f\", \"op\": \"flatten\", \"inputs\": "
                         "[\"stem\"]}]}",
                         SYNTH, GOOD_TRAIN),
                 "model.nodes[0].inputs[0]: no earlier node is named \"stem\"");
}

Test(spec, output_size_differs_from_num_classes) {
    EXPECT_ERROR(spec_of("{\"num_classes\": 10, \"nodes\": [{\"name\": \"f\", \"op\": "
                         "\"flatten\"}, {\"name\": \"fc\", \"op\": \"linear\", \"out_features\": "
                         "7}]}",
                         SYNTH, GOOD_TRAIN),
                 "outputs 7 values but num_classes is 10");
}

Test(spec, missing_data_file) {
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}",
                         "\"data\": {\"format\": \"idx\", \"train\": {\"images\": "
                         "\"/nonexistent/train-images.gz\", \"labels\": \"/nonexistent/l.gz\"}}",
                         GOOD_TRAIN),
                 "data.train", "/nonexistent/train-images.gz: cannot open");
}

Test(spec, normalize_channel_count) {
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}",
                         "\"data\": {\"format\": \"synthetic\", \"shape\": [1, 28, 28], "
                         "\"num_classes\": 10, \"size\": 32, \"normalize\": {\"mean\": [0.5, "
                         "0.5, 0.5], \"std\": [0.2, 0.2, 0.2]}}",
                         GOOD_TRAIN),
                 "data.normalize: gives 3 values", "1 channel");
}

Test(spec, example_spec_is_valid) {
    char path[1024];
    snprintf(path, sizeof path, "%s/examples/fmnist-lenet.json", getenv("TRAIND_SOURCE_DIR"));
    td_job job;
    td_err err = {{0}};
    cr_assert_eq(td_job_load_file(&job, path, &err), 0, "%s", err.msg);
    cr_expect_eq(job.train.epochs, 10);
    cr_expect_eq(job.train.batch_size, 64);
    cr_expect_eq(job.train.schedule.kind, TD_SCHED_COSINE);
    cr_expect_eq(job.train.schedule.warmup_steps, 200);
    cr_expect(job.train.optim.momentum == 0.9f);
    td_job_free(&job);
}

/* Device, precision and backend are checked against the machine before anything is built; on a
 * machine with a GPU these specs are valid, so the checks only apply without one. */
static bool machine_has_gpu(void) {
    char why[256];
    return td_gpu_device_count(why, sizeof why) > 0;
}

Test(spec, device_cuda_without_gpu) {
    if (machine_has_gpu()) cr_skip_test("a GPU is present");
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH,
                         "\"train\": {\"batch_size\": 8, \"device\": \"cuda\", \"optimizer\": "
                         "{\"type\": \"sgd\", \"lr\": 0.1}}"),
                 "train.device: \"cuda\", but this machine has no usable GPU");
}

Test(spec, half_precision_needs_gpu) {
    if (machine_has_gpu()) cr_skip_test("a GPU is present");
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH,
                         "\"train\": {\"batch_size\": 8, \"precision\": \"bf16\", \"optimizer\": "
                         "{\"type\": \"sgd\", \"lr\": 0.1}}"),
                 "train.precision: \"bf16\" runs on a GPU", "use \"fp32\"");
}

Test(spec, nccl_needs_gpu) {
    if (machine_has_gpu()) cr_skip_test("a GPU is present");
    char spec[4096];
    snprintf(spec, sizeof spec, "%s",
             spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH, GOOD_TRAIN));
    strcpy(spec + strlen(spec) - 1, ", \"distributed\": {\"backend\": \"nccl\"}}");
    EXPECT_ERROR(spec, "distributed.backend: \"nccl\" carries GPU memory");
}

Test(spec, unknown_precision_and_backend) {
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH,
                         "\"train\": {\"batch_size\": 8, \"precision\": \"fp8\", \"optimizer\": "
                         "{\"type\": \"sgd\", \"lr\": 0.1}}"),
                 "train.precision", "one of fp32/bf16/fp16", "\"fp8\"");
    char spec[4096];
    snprintf(spec, sizeof spec, "%s",
             spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH, GOOD_TRAIN));
    strcpy(spec + strlen(spec) - 1, ", \"distributed\": {\"backend\": \"gloo\"}}");
    EXPECT_ERROR(spec, "distributed.backend", "one of auto/nccl/cpu");
}

/* data.num_workers: DataLoader's num_workers, "auto" or 0..64 loader threads (0: none) */
Test(spec, num_workers_is_auto_or_a_count) {
    static const char *const bad[] = {"-1", "65", "\"many\"", "2.5"};
    static const char *const found[] = {"found -1", "found 65", "found \"many\"", "found 2.5"};
    char data[512];
    for (int i = 0; i < 4; i++) {
        snprintf(data, sizeof data,
                 "\"data\": {\"format\": \"synthetic\", \"shape\": [1, 28, 28], "
                 "\"num_classes\": 10, \"size\": 32, \"num_workers\": %s}",
                 bad[i]);
        EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", data, GOOD_TRAIN),
                     "data.num_workers", "\"auto\" or an integer in [0, 64]", found[i]);
    }
    static const char *const good[] = {"", ", \"num_workers\": \"auto\"", ", \"num_workers\": 6",
                                       ", \"num_workers\": 0"};
    static const int want[] = {TD_WORKERS_AUTO, TD_WORKERS_AUTO, 6, 0};
    for (int i = 0; i < 4; i++) {
        snprintf(data, sizeof data,
                 "\"data\": {\"format\": \"synthetic\", \"shape\": [1, 28, 28], "
                 "\"num_classes\": 10, \"size\": 32%s}",
                 good[i]);
        td_job job;
        td_err err = {{0}};
        cr_assert_eq(td_job_load_string(
                         &job,
                         spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", data, GOOD_TRAIN),
                         &err),
                     0, "%s", err.msg);
        cr_expect_eq(job.data.num_workers, want[i], "case %d", i);
        td_job_free(&job);
    }
}

/* A boolean train key: `bad` (not a boolean) is refused naming the key and what was found; absent
 * it is `def`; the other value is taken. field: the bool's offset in td_job. */
static void check_train_bool(const char *key, const char *bad, size_t field, bool def) {
    char train[256], where[64], found[64];
    snprintf(train, sizeof train,
             "\"train\": {\"batch_size\": 8, \"%s\": %s, \"optimizer\": {\"type\": \"sgd\", "
             "\"lr\": 0.1}}",
             key, bad);
    snprintf(where, sizeof where, "train.%s", key);
    snprintf(found, sizeof found, "found %s", bad);
    EXPECT_ERROR(spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH, train), where,
                 "expected true or false", found);
    td_job job;
    td_err err = {{0}};
    cr_assert_eq(td_job_load_string(
                     &job,
                     spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH, GOOD_TRAIN),
                     &err),
                 0, "%s", err.msg);
    cr_expect_eq(*(bool *)((char *)&job + field), def, "%s by default", key);
    td_job_free(&job);
    snprintf(train, sizeof train,
             "\"train\": {\"batch_size\": 8, \"%s\": %s, \"optimizer\": {\"type\": \"sgd\", "
             "\"lr\": 0.1}}",
             key, def ? "false" : "true");
    cr_assert_eq(
        td_job_load_string(
            &job, spec_of("{\"preset\": \"lenet5\", \"num_classes\": 10}", SYNTH, train), &err),
        0, "%s", err.msg);
    cr_expect_eq(*(bool *)((char *)&job + field), !def, "%s given", key);
    td_job_free(&job);
}

/* train.deterministic: torch.backends.cudnn.deterministic's switch, a boolean, on by default
 * (unlike PyTorch's: runs are reproducible unless asked otherwise). */
Test(spec, deterministic_is_a_boolean_on_by_default) {
    check_train_bool("deterministic", "\"yes\"", offsetof(td_job, train.deterministic), true);
}

/* train.cudnn_benchmark: torch.backends.cudnn.benchmark's switch, a boolean (off by default; on
 * the CPU it has nothing to time). */
Test(spec, cudnn_benchmark_is_a_boolean) {
    check_train_bool("cudnn_benchmark", "1", offsetof(td_job, train.cudnn_benchmark), false);
}
