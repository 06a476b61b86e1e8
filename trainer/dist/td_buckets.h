/* DDP's gradient buckets, planned by one function for both transports: the CPU reducer
 * (td_reducer.c) and NCCL (gpu/cuda/td_gpu_nccl.cu, which imports it from the executable). The
 * plan is PyTorch's (DistributedDataParallel with its defaults):
 *
 * - parameters in reverse registration order, the order backward produces their gradients;
 * - the first bucket closes at TD_FIRST_BUCKET_BYTES, or at the cap if that is smaller, so the
 *   first all-reduce starts early in backward; the others close at bucket_cap_mb
 *   (distributed.bucket_cap_mb);
 * - a bucket closes once it reaches its size, so a parameter larger than the cap has its own.
 *
 * A bucket is one range of the flat gradient block, from its lowest parameter's offset to its
 * highest's end, so it goes out as one all-reduce. The alignment gaps between parameters
 * (core/td_model.c: zeros) ride along and change no value; what the plan needs is the
 * parameters' ranges in registration order without overlap, which every td_model has (another
 * layout is refused: floats in two buckets would be averaged twice).
 *
 * A model without parameters has no buckets, as PyTorch assigns none to no tensors; a transport
 * that must still send something (the CPU reducer's loss, which rides in the first bucket) adds
 * it itself.
 */
#ifndef TD_BUCKETS_H
#define TD_BUCKETS_H

#include "base/td_error.h"
#include "core/td_tensor.h"

/* PyTorch's first bucket (torch.distributed._DEFAULT_FIRST_BUCKET_BYTES). */
#define TD_FIRST_BUCKET_BYTES (1u << 20)
/* distributed.bucket_cap_mb when the spec gives none: DistributedDataParallel's default */
#define TD_BUCKET_CAP_MB_DEFAULT 25.0

typedef struct td_bucket {
    size_t lo, hi; /* its floats in the gradient block: [lo, hi) */
    int params;    /* parameters it holds */
} td_bucket;

typedef struct td_buckets {
    int n;
    td_bucket *bucket; /* [n], in all-reduce order: bucket[0] holds the last parameters */
    int *bucket_of;    /* per parameter, by registration index: its bucket */
} td_buckets;

/* Plans the buckets of params[0..n_params) (a model's, in registration order) for a cap of
 * cap_mb MiB (0: each parameter its own bucket). -1 with err set when parameters overlap or are
 * out of order in the block. */
int td_buckets_plan(td_buckets *plan, const td_param *params, int n_params, double cap_mb,
                    td_err *err);
void td_buckets_free(td_buckets *plan);

#endif
