/* Device selection and the device/precision/backend decision, as torchrun users expect them:
 * LOCAL_RANK picks among the visible GPUs, one visible GPU serves any local rank. */
#include "core/td_device.h"
#include "gpu/td_gpu.h"

#include <criterion/criterion.h>
#include <string.h>

Test(device, local_rank_picks_among_visible) {
    td_err err = {{0}};
    cr_assert_eq(td_device_pick(8, 0, NULL, &err), 0);
    cr_assert_eq(td_device_pick(8, 5, "0,1,2,3,4,5,6,7", &err), 5);
}

Test(device, one_visible_device_serves_every_rank) {
    td_err err = {{0}};
    cr_assert_eq(td_device_pick(1, 3, "3", &err), 0);
}

Test(device, too_few_devices_is_an_error_naming_the_mask) {
    td_err err = {{0}};
    cr_assert_eq(td_device_pick(2, 3, "0,1", &err), -1);
    cr_assert(strstr(err.msg, "LOCAL_RANK 3") && strstr(err.msg, "CUDA_VISIBLE_DEVICES=0,1"), "%s",
              err.msg);
    cr_assert_eq(td_device_pick(0, 0, "", &err), -1);
    cr_assert(strstr(err.msg, "no CUDA device is visible"), "%s", err.msg);
}

Test(device, auto_resolves_to_what_the_machine_has) {
    td_err err = {{0}};
    td_device_plan plan;
    cr_assert_eq(td_device_resolve(TD_DEVICE_AUTO, TD_PREC_FP32, TD_BACKEND_AUTO, 0, "no driver", 0,
                                   NULL, &plan, &err),
                 0);
    cr_assert_eq(plan.device, TD_DEVICE_CPU);
    cr_assert_eq(plan.backend, TD_BACKEND_CPU);
    cr_assert_eq(plan.cuda_device, -1);
    cr_assert_eq(td_device_resolve(TD_DEVICE_AUTO, TD_PREC_BF16, TD_BACKEND_AUTO, 4, "", 2, NULL,
                                   &plan, &err),
                 0);
    cr_assert_eq(plan.device, TD_DEVICE_CUDA);
    cr_assert_eq(plan.backend, TD_BACKEND_NCCL);
    cr_assert_eq(plan.cuda_device, 2);
    cr_assert_eq(plan.precision, TD_PREC_BF16);
}

Test(device, explicit_cpu_on_a_gpu_machine) {
    td_err err = {{0}};
    td_device_plan plan;
    cr_assert_eq(td_device_resolve(TD_DEVICE_CPU, TD_PREC_FP32, TD_BACKEND_AUTO, 4, "", 0, NULL,
                                   &plan, &err),
                 0);
    cr_assert_eq(plan.device, TD_DEVICE_CPU);
    cr_assert_eq(plan.backend, TD_BACKEND_CPU);
    cr_assert_eq(td_device_resolve(TD_DEVICE_CPU, TD_PREC_FP16, TD_BACKEND_AUTO, 4, "", 0, NULL,
                                   &plan, &err),
                 -1);
    cr_assert(strstr(err.msg, "train.precision: \"fp16\"") &&
                  strstr(err.msg, "train.device is \"cpu\""),
              "%s", err.msg);
}

Test(device, cuda_rank_without_device_names_the_field) {
    td_err err = {{0}};
    td_device_plan plan;
    cr_assert_eq(td_device_resolve(TD_DEVICE_CUDA, TD_PREC_FP32, TD_BACKEND_NCCL, 2, "", 4, "0,1",
                                   &plan, &err),
                 -1);
    cr_assert(strstr(err.msg, "train.device: LOCAL_RANK 4"), "%s", err.msg);
}

/* The backend library is opened on demand and resolves the engine against this executable: a
 * missing export or a wrong path shows up here, not first on a GPU machine. */
Test(device, gpu_backend_opens) {
    td_err err = {{0}};
    td_gpu *g = NULL;
    const td_gpu_api *gpu = td_gpu_load(&err);
#ifdef TRAIND_HAVE_CUDA
    cr_assert_not_null(gpu, "%s", err.msg);
    int rc = gpu->open(&g, 0, &err);
    char why[256];
    if (td_gpu_device_count(why, sizeof why) > 0) {
        cr_assert_eq(rc, 0, "%s", err.msg);
        char desc[512];
        gpu->describe(g, desc, sizeof desc);
        cr_assert(strstr(desc, "device 0"), "%s", desc);
        gpu->close(g);
        return;
    }
    /* no device: the library loaded and its own open failed */
    cr_assert_eq(rc, -1);
    cr_assert(strstr(err.msg, "opening CUDA device 0"), "%s", err.msg);
#else
    cr_assert_null(gpu);
    cr_assert(strstr(err.msg, "built without CUDA"), "%s", err.msg);
#endif
    cr_assert_null(g);
}
