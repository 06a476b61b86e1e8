/* safetensors and checkpoints: round trips, every kind of malformed file, strict and lenient
 * weight import, bitwise-exact resume, and a writer killed mid-save. */
#include "io/td_checkpoint.h"
#include "io/td_safetensors.h"
#include "train/td_train.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

/* A safetensors file from a header text and a data section of n bytes (0x11 each). */
static const char *raw_file(const char *name, const char *header, size_t hlen_claimed,
                            size_t data_bytes) {
    size_t hlen = strlen(header);
    size_t len = 8 + hlen + data_bytes;
    unsigned char *buf = malloc(len);
    for (int i = 0; i < 8; i++) buf[i] = (unsigned char)(hlen_claimed >> (8 * i));
    memcpy(buf + 8, header, hlen);
    memset(buf + 8 + hlen, 0x11, data_bytes);
    const char *path = test_write_file(name, buf, len);
    free(buf);
    return path;
}

static void expect_bad(const char *path, const char *fragment) {
    td_safetensors st;
    td_err err = {{0}};
    cr_assert_neq(td_safetensors_read(&st, path, &err), 0, "%s was accepted", path);
    cr_expect(strstr(err.msg, fragment), "message \"%s\" lacks \"%s\"", err.msg, fragment);
}

Test(safetensors, round_trip_f32_and_i64_scalar) {
    float w[6] = {1.5f, -2, 3.25f, 0, -0.0f, 1e-30f}, count = 42;
    int dims[2] = {2, 3};
    td_st_out out[2] = {{"layer.weight", TD_ST_F32, 2, dims, w},
                        {"bn.num_batches_tracked", TD_ST_I64, 0, NULL, &count}};
    char path[512];
    snprintf(path, sizeof path, "%s/rt.safetensors", test_tmpdir());
    td_err err = {{0}};
    cr_assert_eq(td_safetensors_write(path, out, 2, "{\"format\":\"pt\"}", &err), 0, "%s", err.msg);
    td_safetensors st;
    cr_assert_eq(td_safetensors_read(&st, path, &err), 0, "%s", err.msg);
    cr_assert_eq(st.n, 2);
    const td_st_tensor *t = td_safetensors_find(&st, "layer.weight");
    cr_assert(t && t->dtype == TD_ST_F32 && t->ndim == 2 && t->dims[0] == 2 && t->dims[1] == 3);
    float back[6];
    td_safetensors_to_float(t, back);
    cr_expect(memcmp(back, w, sizeof w) == 0, "values come back bit for bit");
    const td_st_tensor *c = td_safetensors_find(&st, "bn.num_batches_tracked");
    cr_assert(c && c->dtype == TD_ST_I64 && c->ndim == 0 && c->count == 1);
    float n;
    td_safetensors_to_float(c, &n);
    cr_expect_eq(n, 42.0f);
    cr_expect(st.metadata_json && strstr(st.metadata_json, "\"pt\""));
    /* the data section starts 8-byte aligned, as the format recommends */
    uint64_t hlen = 0;
    for (int i = 7; i >= 0; i--) hlen = hlen << 8 | st.bytes[i];
    cr_expect_eq(hlen % 8, 0u);
    td_safetensors_free(&st);
}

Test(safetensors, malformed_files) {
    expect_bad(test_write_file("short", "\x10\0\0", 3), "truncated: 3 bytes");
    expect_bad(raw_file("hlen", "{}", 4096, 0), "header length 4096 runs past the end");
    expect_bad(raw_file("notjson", "{\"a\": [1,", 9, 0), "header is not a JSON object");
    expect_bad(raw_file("array", "[1, 2]   ", 9, 0), "header is not a JSON object");
    const char *h = "{\"a\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[0,8]}}";
    expect_bad(raw_file("dtype", h, strlen(h), 8), "unknown dtype \"Q4\"");
    h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,16]}}";
    expect_bad(raw_file("range", h, strlen(h), 8), "data_offsets [0, 16] out of range");
    h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}";
    expect_bad(raw_file("size", h, strlen(h), 8), "need 12");
    h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}";
    expect_bad(raw_file("overlap", h, strlen(h), 12), "overlap");
    h = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}}";
    expect_bad(raw_file("nooffsets", h, strlen(h), 8), "data_offsets must be [begin, end]");
    expect_bad("/nonexistent/x.safetensors", "cannot open");
}

static const char *MODEL_NODES =
    "[{\"name\":\"conv\",\"op\":\"conv2d\",\"out_channels\":3,\"kernel_size\":3},"
    " {\"name\":\"bn\",\"op\":\"batchnorm2d\"},"
    " {\"name\":\"f\",\"op\":\"flatten\"},"
    " {\"name\":\"fc\",\"op\":\"linear\",\"out_features\":4}]";

static void save_weights(const td_model *m, const char *path) {
    td_err err = {{0}};
    cr_assert_eq(td_checkpoint_save_weights(path, m, NULL, &err), 0, "%s", err.msg);
}

Test(checkpoint, init_from_strict_lists_every_mismatch) {
    td_model a, b;
    test_build_model(&a, MODEL_NODES, td_shape_image(1, 5, 5), 2, 1);
    /* b: fc has 5 outputs, conv is named differently */
    test_build_model(&b,
                     "[{\"name\":\"conv1\",\"op\":\"conv2d\",\"out_channels\":3,\"kernel_size\":3},"
                     " {\"name\":\"bn\",\"op\":\"batchnorm2d\"},"
                     " {\"name\":\"f\",\"op\":\"flatten\"},"
                     " {\"name\":\"fc\",\"op\":\"linear\",\"out_features\":5}]",
                     td_shape_image(1, 5, 5), 2, 2);
    char path[512];
    snprintf(path, sizeof path, "%s/a.safetensors", test_tmpdir());
    save_weights(&a, path);
    td_err err = {{0}};
    cr_assert_neq(td_checkpoint_load_weights(path, &b, true, NULL, &err), 0);
    cr_expect(strstr(err.msg, "missing: conv1.weight, conv1.bias"), "%s", err.msg);
    cr_expect(strstr(err.msg, "unexpected: conv.weight, conv.bias"), "%s", err.msg);
    cr_expect(strstr(err.msg, "shape mismatch: fc.weight (file [4, 27], model [5, 27])"), "%s",
              err.msg);
    cr_expect(strstr(err.msg, "model.strict"), "the message says how to relax it: %s", err.msg);
    /* lenient: the BatchNorm tensors match and load */
    a.params[2].data[1] = 7.5f; /* bn.weight */
    save_weights(&a, path);
    FILE *devnull = fopen("/dev/null", "w");
    cr_assert_eq(td_checkpoint_load_weights(path, &b, false, devnull, &err), 0, "%s", err.msg);
    fclose(devnull);
    cr_expect_eq(td_model_find_param(&b, "bn.weight")->data[1], 7.5f);
    td_model_free(&a);
    td_model_free(&b);
}

/* Keeps the train, eval and done lines without their timings. */
static void keep_comparable(char *text) {
    char *out = text;
    for (char *line = text; *line;) {
        char *end = strchr(line, '\n');
        size_t n = end ? (size_t)(end - line + 1) : strlen(line);
        bool keep = strncmp(line, "{\"event\":\"checkpoint\"", 21) != 0;
        if (keep) {
            memmove(out, line, n);
            out += n;
        }
        line += n;
    }
    *out = 0;
    test_strip_timings(text);
}

static char *resume_spec(const char *dir, bool resume) {
    static char spec[2048];
    snprintf(spec, sizeof spec,
             "{\"model\": {\"nodes\": ["
             "  {\"name\":\"c1\",\"op\":\"conv2d\",\"out_channels\":4,\"kernel_size\":3,"
             "\"padding\":1},"
             "  {\"name\":\"bn1\",\"op\":\"batchnorm2d\"}, {\"name\":\"r1\",\"op\":\"relu\"},"
             "  {\"name\":\"f\",\"op\":\"flatten\"}, {\"name\":\"d\",\"op\":\"dropout\",\"p\":0.3},"
             "  {\"name\":\"fc\",\"op\":\"linear\",\"out_features\":10}]},"
             " \"data\": {\"format\": \"synthetic\", \"shape\": [1, 8, 8], \"num_classes\": 10,"
             "   \"size\": 256, \"val_size\": 64},"
             " \"train\": {\"epochs\": 3, \"batch_size\": 32, \"seed\": 5,"
             "   \"optimizer\": {\"type\": \"%s\", \"lr\": 0.01, \"momentum\": 0.9},"
             "   \"schedule\": {\"type\": \"cosine\", \"warmup_steps\": 4}},"
             " \"checkpoint\": {\"dir\": \"%s\", \"every_steps\": 5, \"keep\": 2},"
             " %s \"log\": {\"every_steps\": 3}}",
             "sgd", dir, resume ? "\"resume_from\": \"latest\"," : "");
    return spec;
}

Test(checkpoint, resume_is_bitwise_exact) {
    /* 24 steps straight, against 11 steps, a stop (mid-epoch and mid logging interval), and a
     * resume for the rest: the same train, eval and done lines, losses to the last bit */
    char a_dir[512], b_dir[512];
    snprintf(a_dir, sizeof a_dir, "%s/resume-a", test_tmpdir());
    snprintf(b_dir, sizeof b_dir, "%s/resume-b", test_tmpdir());
    char *straight = test_run_job(resume_spec(a_dir, false), NULL, NULL);
    td_train_options stop = {.stop_after_steps = 11};
    char *first = test_run_job(resume_spec(b_dir, false), &stop, NULL);
    char *second = test_run_job(resume_spec(b_dir, true), NULL, NULL);
    cr_expect(strstr(first, "{\"event\":\"checkpoint\",\"step\":11,"), "%s", first);
    cr_expect(!strstr(first, "\"done\""), "a stopped run prints no done line");
    char *joined = malloc(strlen(first) + strlen(second) + 1);
    strcpy(joined, first);
    strcat(joined, second);
    keep_comparable(straight);
    keep_comparable(joined);
    cr_expect(strstr(straight, "\"event\":\"eval\"") && strstr(straight, "\"event\":\"done\""));
    cr_expect_str_eq(joined, straight);
    /* keep: 2 -> only the two newest checkpoints remain */
    char path[600];
    snprintf(path, sizeof path, "%s/step-00000024", b_dir);
    cr_expect_eq(access(path, F_OK), 0);
    snprintf(path, sizeof path, "%s/step-00000011", b_dir);
    cr_expect_neq(access(path, F_OK), 0, "older checkpoints beyond keep are removed");
    free(straight);
    free(first);
    free(second);
    free(joined);
}

Test(checkpoint, killed_writer_leaves_previous_checkpoint) {
    /* the worker is SIGKILLed midway through its second save (after model.safetensors, before
     * the rest and the rename); the first checkpoint must stay the latest and load */
    char dir[512], spec_path[600];
    snprintf(dir, sizeof dir, "%s/killed", test_tmpdir());
    snprintf(spec_path, sizeof spec_path, "%s/killed.json", test_tmpdir());
    const char *spec = resume_spec(dir, false);
    test_write_file("killed.json", spec, strlen(spec));
    char worker[600];
    cr_assert(getenv("TRAIND_BINARY_DIR"), "TRAIND_BINARY_DIR is not set (ctest sets it)");
    snprintf(worker, sizeof worker, "%s/traind-worker", getenv("TRAIND_BINARY_DIR"));
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        setenv("TRAIND_FAULT", "checkpoint:2", 1);
        freopen("/dev/null", "w", stdout);
        freopen("/dev/null", "w", stderr);
        execl(worker, worker, spec_path, (char *)NULL);
        _exit(127);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    cr_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL,
              "the worker died by SIGKILL (status %d)", status);
    char latest[700];
    td_err err = {{0}};
    cr_assert_eq(td_checkpoint_resolve("latest", dir, latest, sizeof latest, &err), 0, "%s",
                 err.msg);
    cr_expect(strstr(latest, "step-00000005"), "latest is the first save: %s", latest);
    /* it loads completely */
    td_job job;
    cr_assert_eq(td_job_load_string(&job, resume_spec(dir, true), &err), 0, "%s", err.msg);
    td_model m;
    cr_assert_eq(td_model_build(&m, job.model.nodes, job.model.n_nodes, td_shape_image(1, 8, 8), 32,
                                1, 5, 0, &err),
                 0, "%s", err.msg);
    td_optim opt;
    td_optim_init(&opt, &job.train.optim, m.param_floats);
    td_train_state st;
    cr_expect_eq(td_checkpoint_load(latest, &m, &opt, &st, &err), 0, "%s", err.msg);
    cr_expect_eq(st.step, 5);
    cr_expect_eq(opt.steps, 5);
    td_optim_free(&opt);
    td_model_free(&m);
    td_job_free(&job);
}

/* fp16's GradScaler state (scale, growth tracker, skipped steps) travels in state.json, so a
 * resumed run scales its loss as the uninterrupted one; without one nothing is written. The GPU
 * fills and applies it (td_gpu_optim_download/upload); here the format alone is under test. */
Test(checkpoint, grad_scaler_round_trip) {
    td_job job;
    td_err err = {{0}};
    char dir[512];
    snprintf(dir, sizeof dir, "%s/scaler", test_tmpdir());
    cr_assert_eq(td_job_load_string(&job, resume_spec(dir, false), &err), 0, "%s", err.msg);
    td_model m;
    cr_assert_eq(td_model_build(&m, job.model.nodes, job.model.n_nodes, td_shape_image(1, 8, 8), 4,
                                1, 5, 0, &err),
                 0, "%s", err.msg);
    td_optim opt, back;
    td_optim_init(&opt, &job.train.optim, m.param_floats);
    td_optim_init(&back, &job.train.optim, m.param_floats);
    td_train_state st = {.step = 7}, st_back;
    char saved[700], state[800];
    for (int with = 0; with < 2; with++) {
        opt.scaler = with ? (td_grad_scaler){131072.0f, 17, 3} : (td_grad_scaler){0.0f, 0, 0};
        back.scaler = (td_grad_scaler){5.0f, 5, 5};
        st.step = 7 + with;
        cr_assert_eq(td_checkpoint_save(dir, &m, &opt, &st, 0, NULL, saved, sizeof saved, &err), 0,
                     "%s", err.msg);
        cr_assert_eq(td_checkpoint_load(saved, &m, &back, &st_back, &err), 0, "%s", err.msg);
        cr_expect_float_eq(back.scaler.scale, opt.scaler.scale, 0);
        cr_expect_eq(back.scaler.growth_tracker, opt.scaler.growth_tracker);
        cr_expect_eq(back.scaler.skipped, opt.scaler.skipped);
        snprintf(state, sizeof state, "%s/state.json", saved);
        char *text = test_read_file(state);
        cr_expect_eq(strstr(text, "\"grad_scaler\"") != NULL, with, "%s", text);
        free(text);
    }
    /* a damaged scaler is an error naming the file and the field */
    char *text = test_read_file(state);
    char *scale = strstr(text, "131072");
    cr_assert(scale != NULL, "%s", text);
    memcpy(scale, "-13107", 6);
    FILE *f = fopen(state, "w");
    cr_assert(f && fputs(text, f) != EOF && fclose(f) == 0);
    free(text);
    cr_assert_neq(td_checkpoint_load(saved, &m, &back, &st_back, &err), 0);
    cr_expect(strstr(err.msg, "state.json: grad_scaler: expected {\"scale\": > 0") != NULL, "%s",
              err.msg);
    td_optim_free(&opt);
    td_optim_free(&back);
    td_model_free(&m);
    td_job_free(&job);
}
