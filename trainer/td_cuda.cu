// Device discovery through the CUDA runtime (linked statically, so a machine without the CUDA
// libraries still runs the worker and simply finds no device).
extern "C" {
#include "td_cuda.h"
}

#include <cuda_runtime.h>
#include <stdio.h>

extern "C" int td_cuda_device_count(char *why, size_t len) {
    int count = 0;
    cudaError_t rc = cudaGetDeviceCount(&count);
    if (rc != cudaSuccess) {
        snprintf(why, len, "no CUDA device: %s", cudaGetErrorString(rc));
        return 0;
    }
    if (count == 0) snprintf(why, len, "no CUDA device found");
    else snprintf(why, len, "%d CUDA device%s", count, count > 1 ? "s" : "");
    return count;
}
