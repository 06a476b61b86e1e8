#include "core/td_device.h"

#include <stdio.h>

const char *td_precision_name(td_precision prec) {
    return prec == TD_PREC_BF16 ? "bf16" : prec == TD_PREC_FP16 ? "fp16" : "fp32";
}

size_t td_precision_bytes(td_precision prec) {
    return prec == TD_PREC_FP32 ? 4 : 2;
}

int td_device_pick(int visible_devices, int local_rank, const char *cuda_visible_devices,
                   td_err *err) {
    const char *mask = cuda_visible_devices ? cuda_visible_devices : "(unset)";
    if (visible_devices <= 0)
        return td_fail(err, "no CUDA device is visible (CUDA_VISIBLE_DEVICES=%s)", mask);
    if (local_rank < 0) return td_fail(err, "LOCAL_RANK is %d; expected 0 or more", local_rank);
    if (local_rank < visible_devices) return local_rank;
    /* One GPU per worker, masked by the launcher: every local rank's GPU is device 0. */
    if (visible_devices == 1) return 0;
    return td_fail(err,
                   "LOCAL_RANK %d has no GPU of its own: %d devices are visible "
                   "(CUDA_VISIBLE_DEVICES=%s); start at most %d workers per node, or give each "
                   "worker one device through CUDA_VISIBLE_DEVICES",
                   local_rank, visible_devices, mask, visible_devices);
}

int td_device_resolve(td_device_kind want, td_precision prec, td_backend backend,
                      int visible_devices, const char *why_no_gpu, int local_rank,
                      const char *cuda_visible_devices, td_device_plan *plan, td_err *err) {
    plan->precision = prec;
    plan->cuda_device = -1;
    bool cuda = want == TD_DEVICE_CUDA || (want == TD_DEVICE_AUTO && visible_devices > 0);
    if (want == TD_DEVICE_CUDA && visible_devices <= 0)
        return td_fail(err, "train.device: \"cuda\", but this machine has no usable GPU (%s)",
                       why_no_gpu && *why_no_gpu ? why_no_gpu : "none found");
    plan->device = cuda ? TD_DEVICE_CUDA : TD_DEVICE_CPU;
    if (!cuda && prec != TD_PREC_FP32)
        return td_fail(err,
                       "train.precision: \"%s\" runs on a GPU and this worker trains on the CPU "
                       "(%s); use \"fp32\" or run where a GPU is visible",
                       td_precision_name(prec),
                       want == TD_DEVICE_CPU ? "train.device is \"cpu\""
                                             : (why_no_gpu && *why_no_gpu ? why_no_gpu : "no GPU"));
    if (backend == TD_BACKEND_NCCL && !cuda)
        return td_fail(err,
                       "distributed.backend: \"nccl\" carries GPU memory and this worker trains "
                       "on the CPU; use \"auto\" or \"cpu\"");
    plan->backend =
        backend == TD_BACKEND_AUTO ? (cuda ? TD_BACKEND_NCCL : TD_BACKEND_CPU) : backend;
    if (cuda) {
        int dev = td_device_pick(visible_devices, local_rank, cuda_visible_devices, err);
        if (dev < 0) return td_fail_prefix(err, "train.device");
        plan->cuda_device = dev;
    }
    return 0;
}
