/* The GPU backend of an engine built without CUDA (-DTRAIND_CUDA=OFF, or no nvcc): no device is
 * ever found, so the trainer never gets as far as the table; td_gpu_load says why there is none
 * should anything ask for it. */
#include "gpu/td_gpu.h"

#include <stdio.h>

int td_gpu_devices(td_gpu_device_info *out, int max, char *why, size_t len) {
    (void)out, (void)max;
    snprintf(why, len, "built without CUDA (-DTRAIND_CUDA=OFF)");
    return 0;
}

int td_gpu_device_count(char *why, size_t len) {
    snprintf(why, len, "built without CUDA (-DTRAIND_CUDA=OFF)");
    return 0;
}

const td_gpu_api *td_gpu_load(td_err *err) {
    td_fail(err, "this traind was built without CUDA (-DTRAIND_CUDA=OFF or no nvcc at build "
                 "time); rebuild with CUDA to train on a GPU");
    return NULL;
}
