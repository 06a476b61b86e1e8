#define _XOPEN_SOURCE 700 /* nftw */
#include "test_util.h"

#include "core/td_isa.h"

#include <criterion/criterion.h>
#include <ftw.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <zlib.h>

void test_build_model(td_model *model, const char *nodes_json, td_shape input, int max_n,
                      uint64_t seed) {
    test_build_model_threads(model, nodes_json, input, max_n, seed, 1);
}

void test_build_model_threads(td_model *model, const char *nodes_json, td_shape input, int max_n,
                              uint64_t seed, int threads) {
    char spec[8192];
    snprintf(spec, sizeof spec,
             "{\"model\": {\"nodes\": %s},"
             " \"data\": {\"format\": \"synthetic\", \"shape\": [1, 4, 4], \"num_classes\": 2,"
             "          \"size\": 4},"
             " \"train\": {\"batch_size\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}",
             nodes_json);
    td_job job;
    td_err err = {{0}};
    if (td_job_load_string(&job, spec, &err) != 0) cr_assert_fail("spec: %s", err.msg);
    int rc = td_model_build(model, job.model.nodes, job.model.n_nodes, input, max_n, threads, seed,
                            TD_MODEL_INPUT_GRAD, &err);
    td_job_free(&job);
    if (rc != 0) cr_assert_fail("build: %s", err.msg);
}

test_pass test_pass_run(td_model *model, td_shape in, int n, int passes) {
    size_t in_n = (size_t)n * td_shape_size(in);
    size_t out_n = (size_t)n * td_shape_size(td_model_output_shape(model));
    float *x = malloc(in_n * sizeof(float)), *dy = malloc(out_n * sizeof(float));
    test_fill_uniform(x, in_n, 17);
    test_fill_uniform(dy, out_n, 23);
    test_pass r = {.out_n = out_n, .dx_n = in_n, .dparams_n = model->param_floats};
    for (int pass = 0; pass < passes; pass++) {
        td_run run = {.n = n, .training = true, .accumulate_grads = pass > 0};
        const float *out = td_model_forward(model, x, &run);
        if (pass == 0) r.out = test_copy(out, out_n);
        td_model_backward(model, dy, &run);
    }
    r.dx = test_copy(model->input_grad, in_n);
    r.dparams = test_copy(model->grad_block, model->param_floats);
    free(x);
    free(dy);
    return r;
}

void test_pass_free(test_pass *pass) {
    free(pass->out);
    free(pass->dx);
    free(pass->dparams);
}

static char tmpdir_path[256];

static int remove_entry(const char *path, const struct stat *st, int type, struct FTW *ftw) {
    (void)st, (void)type, (void)ftw;
    (void)remove(path); /* best effort: a leftover file must not fail a test */
    return 0;
}

/* Criterion runs each test in its own process: each removes its directory as it exits, or every
 * run would leave hundreds behind in /tmp. */
static void remove_tmpdir(void) {
    if (tmpdir_path[0]) nftw(tmpdir_path, remove_entry, 16, FTW_DEPTH | FTW_PHYS);
}

/* TRAIND_ISA forces the kernels a test program runs (tests/CMakeLists.txt runs some once per
 * instruction set); one this CPU cannot run skips the whole program (77, ctest's skip code)
 * rather than testing another set under its name. */
__attribute__((constructor)) static void select_isa(void) {
    const char *isa = getenv("TRAIND_ISA");
    if (!isa || !*isa) return;
    td_err err = {{0}};
    if (td_isa_select(NULL, &err) != 0) {
        fprintf(stderr, "SKIP: %s\n", err.msg);
        exit(77);
    }
}

const char *test_tmpdir(void) {
    if (!tmpdir_path[0]) {
        const char *base = getenv("TMPDIR") ? getenv("TMPDIR") : "/tmp";
        snprintf(tmpdir_path, sizeof tmpdir_path, "%s/traind-test-XXXXXX", base);
        if (!mkdtemp(tmpdir_path)) cr_assert_fail("mkdtemp failed");
        atexit(remove_tmpdir);
    }
    return tmpdir_path;
}

const char *test_write_file(const char *name, const void *data, size_t len) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    FILE *f = fopen(path, "wb");
    if (!f || fwrite(data, 1, len, f) != len || fclose(f) != 0)
        cr_assert_fail("cannot write %s", path);
    return path;
}

const char *test_write_gz(const char *name, const void *data, size_t len) {
    static char path[512];
    snprintf(path, sizeof path, "%s/%s", test_tmpdir(), name);
    gzFile f = gzopen(path, "wb");
    if (!f || gzwrite(f, data, (unsigned)len) != (int)len || gzclose(f) != Z_OK)
        cr_assert_fail("cannot write %s", path);
    return path;
}

void test_fill_uniform(float *v, size_t n, uint64_t seed) {
    td_rng rng;
    td_rng_seed(&rng, seed);
    for (size_t i = 0; i < n; i++) v[i] = 2.0f * td_rng_uniform(&rng) - 1.0f;
}

float *test_copy(const float *src, size_t n) {
    float *dst = malloc(n * sizeof(float));
    memcpy(dst, src, n * sizeof(float));
    return dst;
}

double test_worst_diff(const float *a, const float *b, size_t n, size_t *at, double *scale) {
    double worst = 0.0;
    *scale = 1.0;
    *at = 0;
    for (size_t i = 0; i < n; i++) *scale = fmax(*scale, fabs((double)b[i]));
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - (double)b[i]);
        if (!(d <= worst)) worst = d, *at = i; /* NaN counts as worst */
    }
    return worst;
}

char *test_read_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) cr_assert_fail("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long len = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)len + 1);
    if (fread(buf, 1, (size_t)len, f) != (size_t)len) cr_assert_fail("cannot read %s", path);
    buf[len] = 0;
    fclose(f);
    return buf;
}

char *test_run_job(const char *spec, const td_train_options *opt, td_train_result *res) {
    td_job job;
    td_err err = {{0}};
    if (td_job_load_string(&job, spec, &err) != 0) cr_assert_fail("spec: %s", err.msg);
    char *text = NULL;
    size_t len = 0;
    FILE *metrics = open_memstream(&text, &len);
    FILE *devnull = fopen("/dev/null", "w");
    int rc = td_train_run(&job, opt, metrics, devnull, res, &err);
    fclose(metrics);
    fclose(devnull);
    td_job_free(&job);
    if (rc != 0) cr_assert_fail("training: %s", err.msg);
    return text;
}

void test_strip_timings(char *text) {
    const char *keys[] = {",\"samples_per_s\":", ",\"step_ms\":", ",\"elapsed_s\":"};
    for (int k = 0; k < 3; k++) {
        char *p;
        while ((p = strstr(text, keys[k]))) {
            char *end = p + strlen(keys[k]);
            while (*end && *end != ',' && *end != '}') end++;
            memmove(p, end, strlen(end) + 1);
        }
    }
}

const td_optim_config TEST_OPTIM_RULES[] = {
    {.kind = TD_OPTIM_SGD, .weight_decay = 1e-2f},
    {.kind = TD_OPTIM_SGD, .momentum = 0.9f, .weight_decay = 5e-4f},
    {.kind = TD_OPTIM_SGD,
     .momentum = 0.9f,
     .dampening = 0.1f,
     .nesterov = true,
     .weight_decay = 1e-3f},
    {.kind = TD_OPTIM_ADAM, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f, .weight_decay = 1e-2f},
    {.kind = TD_OPTIM_ADAMW, .beta1 = 0.8f, .beta2 = 0.99f, .eps = 1e-6f, .weight_decay = 1e-1f},
};
const int TEST_OPTIM_RULES_N = sizeof TEST_OPTIM_RULES / sizeof TEST_OPTIM_RULES[0];
