#include "td_cuda.h"

#include <stdio.h>

int td_cuda_device_count(char *why, size_t len) {
    snprintf(why, len, "built without CUDA (-DTRAIND_CUDA=OFF)");
    return 0;
}
