/* Which device a worker trains on, in which precision, and which collective backend carries its
 * gradients: the decisions made before any CUDA call, kept here in plain C so they are the same
 * (and tested) on machines without a GPU.
 *
 * Device selection follows PyTorch's convention for torchrun workers: the process sees the GPUs
 * CUDA_VISIBLE_DEVICES leaves it (the CUDA runtime applies that mask itself) and uses the one
 * numbered LOCAL_RANK among them, as torch.cuda.set_device(local_rank) does. A daemon that gives
 * each worker exactly one GPU through CUDA_VISIBLE_DEVICES leaves one visible device, which every
 * local rank then uses.
 */
#ifndef TD_DEVICE_H
#define TD_DEVICE_H

#include "base/td_error.h"

#include <stdbool.h>
#include <stddef.h>

/* train.device: "auto" is CUDA when a GPU is visible, else the CPU. */
typedef enum td_device_kind { TD_DEVICE_AUTO, TD_DEVICE_CPU, TD_DEVICE_CUDA } td_device_kind;

/* train.precision. fp32 master weights in every mode; bf16 and fp16 compute GEMMs and
 * convolutions in 16 bits and keep activations in 16 bits; BatchNorm statistics stay fp32. fp16
 * adds dynamic loss scaling as torch.cuda.amp.GradScaler does it. */
typedef enum td_precision { TD_PREC_FP32, TD_PREC_BF16, TD_PREC_FP16 } td_precision;

/* distributed.backend: "auto" is NCCL when training on GPUs, the CPU ring otherwise. */
typedef enum td_backend { TD_BACKEND_AUTO, TD_BACKEND_NCCL, TD_BACKEND_CPU } td_backend;

const char *td_precision_name(td_precision prec);
/* Bytes per activation element: 4 for fp32, 2 for bf16 and fp16. */
size_t td_precision_bytes(td_precision prec);

/* The CUDA device index (among the visible ones) for this local rank; -1 with err naming
 * CUDA_VISIBLE_DEVICES and LOCAL_RANK when there is none to give it. */
int td_device_pick(int visible_devices, int local_rank, const char *cuda_visible_devices,
                   td_err *err);

/* What the job asked for, resolved against what this machine has. Errors name the spec field:
 * "train.device: cuda, but ..." when no GPU is there, "train.precision: fp16 needs a GPU", and
 * "distributed.backend: nccl needs train.device cuda". `why_no_gpu` explains an absent GPU. */
typedef struct td_device_plan {
    td_device_kind device; /* CPU or CUDA, never AUTO */
    td_precision precision;
    td_backend backend; /* NCCL or CPU, never AUTO */
    int cuda_device;    /* index among the visible devices; -1 on the CPU */
} td_device_plan;

int td_device_resolve(td_device_kind want, td_precision prec, td_backend backend,
                      int visible_devices, const char *why_no_gpu, int local_rank,
                      const char *cuda_visible_devices, td_device_plan *plan, td_err *err);

#endif
