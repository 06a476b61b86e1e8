/* A resnet18 checkpoint written by traind, after a few training steps (so BatchNorm's running
 * statistics have moved), loads into torchvision's resnet18 with strict=True and gives the same
 * eval-mode logits as the engine's own forward (tests/torchvision_load.py ran it). */
#include "io/td_checkpoint.h"
#include "test_util.h"

#include <criterion/criterion.h>
#include <math.h>
#include <stdlib.h>

Test(torchvision, resnet18_checkpoint_gives_torchvisions_logits) {
    const char *bin = getenv("TRAIND_BINARY_DIR"), *src = getenv("TRAIND_SOURCE_DIR");
    cr_assert(bin && src, "run through ctest");
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/resnet18-tiny.json", src);
    td_job job;
    td_err err = {{0}};
    cr_assert_eq(td_job_load_file(&job, path, &err), 0, "%s", err.msg);
    td_model m;
    cr_assert_eq(td_model_build(&m, job.model.nodes, job.model.n_nodes, td_shape_image(3, 32, 32),
                                2, 1, 1, 0, &err),
                 0, "%s", err.msg);
    snprintf(path, sizeof path, "%s/tests/resnet18-ck/step-00000003/model.safetensors", bin);
    cr_assert_eq(td_checkpoint_load_weights(path, &m, true, NULL, &err), 0, "%s", err.msg);
    cr_expect_eq(td_model_find_param(&m, "bn1.num_batches_tracked")->data[0], 3.0f);

    snprintf(path, sizeof path, "%s/tests/torchvision-out/input.f32", bin);
    float *x = (float *)test_read_file(path);
    snprintf(path, sizeof path, "%s/tests/torchvision-out/logits.f32", bin);
    float *want = (float *)test_read_file(path);
    td_run run = {.n = 2, .training = false};
    const float *got = td_model_forward(&m, x, &run);
    double diff = 0, scale = 0;
    for (int i = 0; i < 20; i++) {
        diff = fmax(diff, fabs((double)got[i] - want[i]));
        scale = fmax(scale, fabs((double)want[i]));
    }
    cr_expect(diff / scale <= 1e-4, "relative error %.3g exceeds 1e-4 (max |logit| %.3g)",
              diff / scale, scale);
    free(x);
    free(want);
    td_model_free(&m);
    td_job_free(&job);
}
