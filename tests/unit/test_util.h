/* Helpers shared by the Criterion tests. */
#ifndef TEST_UTIL_H
#define TEST_UTIL_H

#include "core/td_model.h"
#include "spec/td_spec.h"
#include "train/td_train.h"

#include <stdio.h>

/* Parses a JSON array of nodes (as a spec's model.nodes) and builds the model with input
 * gradients enabled. Fails the test with the engine's message on error. */
void test_build_model(td_model *model, const char *nodes_json, td_shape input, int max_n,
                      uint64_t seed);

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

/* Reads a whole file into a malloc'd NUL-terminated string. */
char *test_read_file(const char *path);

#endif
