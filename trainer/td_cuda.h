/* What the CUDA runtime sees. Built from td_cuda.cu when nvcc is found, else from
 * td_cuda_none.c; callers never need an #ifdef. */
#ifndef TD_CUDA_H
#define TD_CUDA_H

#include <stddef.h>

/* Number of usable CUDA devices; 0 with the reason in why (no driver, no device, built without
 * CUDA). */
int td_cuda_device_count(char *why, size_t len);

#endif
