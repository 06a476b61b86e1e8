/* Helpers shared by the Criterion tests. */
#ifndef TEST_UTIL_H
#define TEST_UTIL_H

#include "core/td_model.h"
#include "core/td_optim.h"
#include "spec/td_spec.h"
#include "train/td_train.h"

#include <stdio.h>

/* Parses a JSON array of nodes (as a spec's model.nodes) and builds the model with input
 * gradients enabled. Fails the test with the engine's message on error. */
void test_build_model(td_model *model, const char *nodes_json, td_shape input, int max_n,
                      uint64_t seed);
/* Same, for a model that runs on `threads` threads. */
void test_build_model_threads(td_model *model, const char *nodes_json, td_shape input, int max_n,
                              uint64_t seed, int threads);

/* Writes bytes to a fresh file under the test's temporary directory and returns its path
 * (static storage: copy it before the next call). */
const char *test_write_file(const char *name, const void *data, size_t len);
/* Same, gzip-compressed. */
const char *test_write_gz(const char *name, const void *data, size_t len);

/* A unique temporary directory for this test process. */
const char *test_tmpdir(void);

/* Trains spec (opt may be NULL) and returns its metrics text (malloc'd); fails the test on
 * error. */
char *test_run_job(const char *spec, const td_train_options *opt, td_train_result *res);
/* Cuts the timing fields (samples_per_s, step_ms, elapsed_s), which differ run to run, out of
 * metrics text in place. */
void test_strip_timings(char *text);

/* v[0..n) uniform in [-1, 1) from seed. */
void test_fill_uniform(float *v, size_t n, uint64_t seed);
/* A malloc'd copy of src[0..n). */
float *test_copy(const float *src, size_t n);
/* The largest |a[i] - b[i]| (NaN counts as largest), its index in *at, and in *scale
 * max(1, max |b|): tests accept rounding relative to the tensor's scale. */
double test_worst_diff(const float *a, const float *b, size_t n, size_t *at, double *scale);

/* What one model gives for one fixed batch: its output, the input gradient and the parameter
 * gradients (malloc'd copies). */
typedef struct test_pass {
    float *out, *dx, *dparams;
    size_t out_n, dx_n, dparams_n;
} test_pass;
/* Runs a model built with input gradients (test_build_model) forward and backward, in training
 * mode, `passes` times on the batch of n inputs of shape `in` from seed 17 with the output
 * gradient from seed 23, gradients accumulating after the first pass; out is the first pass's. */
test_pass test_pass_run(td_model *model, td_shape in, int n, int passes);
void test_pass_free(test_pass *pass);

/* Every update rule with each option that changes its arithmetic (no momentum, momentum,
 * dampening, Nesterov, weight decay; Adam, AdamW), for the tests that hold the optimizers to the
 * same bits across instruction sets and thread counts. */
extern const td_optim_config TEST_OPTIM_RULES[];
extern const int TEST_OPTIM_RULES_N;

/* Reads a whole file into a malloc'd NUL-terminated string. */
char *test_read_file(const char *path);

#endif
