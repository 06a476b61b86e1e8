/* Feeds: a safetensors file (trainer/io/td_safetensors.c): parsed from memory
 * (td_safetensors_parse), every tensor converted to floats, and loaded by name into a small
 * model the way model.init_from and a resume load one (td_checkpoint_load_weights, strict and
 * not, through an in-memory file). Why: init_from names any file a user has, and its JSON header
 * decides every offset and size that is then read from the data. */
#include "fuzz_util.h"

#include "io/td_checkpoint.h"
#include "io/td_safetensors.h"
#include "spec/td_spec.h"

#include <stdio.h>
#include <stdlib.h>

static fuzz_file file;
static td_model model;
static FILE *sink;

/* A model with a parameter and a buffer of each kind a checkpoint names: conv, batch norm
 * (running stats, num_batches_tracked) and linear. */
static void setup(void) {
    static const char spec[] =
        "{\"model\": {\"nodes\": ["
        "{\"name\":\"c1\",\"op\":\"conv2d\",\"out_channels\":2,\"kernel_size\":3,\"padding\":1},"
        "{\"name\":\"bn1\",\"op\":\"batchnorm2d\"}, {\"name\":\"f\",\"op\":\"flatten\"},"
        "{\"name\":\"fc\",\"op\":\"linear\",\"out_features\":3}]},"
        "\"data\": {\"format\": \"synthetic\", \"shape\": [1, 4, 4], \"num_classes\": 3,"
        " \"size\": 8},"
        "\"train\": {\"batch_size\": 2, \"optimizer\": {\"type\": \"sgd\", \"lr\": 0.1}}}";
    td_job job;
    td_err err = {{0}};
    if (td_job_load_string(&job, spec, &err) != 0 ||
        td_model_build(&model, job.model.nodes, job.model.n_nodes, td_shape_image(1, 4, 4), 2, 1, 1,
                       0, &err) != 0) {
        fprintf(stderr, "fuzz_safetensors: the model: %s\n", err.msg);
        exit(1);
    }
    td_job_free(&job);
    fuzz_file_open(&file, "model.safetensors");
    sink = fopen("/dev/null", "w");
    if (!sink) abort();
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (!sink) setup();
    td_safetensors st;
    td_err err = {{0}};
    if (td_safetensors_parse(&st, "model.safetensors", data, size, &err) == 0) {
        for (int i = 0; i < st.n; i++) {
            const td_st_tensor *t = &st.tensors[i];
            FUZZ_CHECK(t->data >= st.bytes && t->data <= st.bytes + st.len,
                       "tensor %s points outside the file", t->name);
            float *out = malloc(t->count ? t->count * sizeof(float) : 1);
            FUZZ_CHECK(out != NULL, "%zu floats for tensor %s", t->count, t->name);
            td_safetensors_to_float(t, out);
            free(out);
            FUZZ_CHECK(td_safetensors_find(&st, t->name) != NULL, "tensor %s not found", t->name);
        }
        td_safetensors_free(&st);
    } else {
        FUZZ_CHECK(err.msg[0], "a refusal without a message");
    }
    fuzz_file_set(&file, data, size);
    for (int strict = 0; strict < 2; strict++) {
        err.msg[0] = 0;
        if (td_checkpoint_load_weights(file.path, &model, strict, sink, &err) != 0)
            FUZZ_CHECK(err.msg[0], "a refusal without a message");
    }
    return 0;
}
