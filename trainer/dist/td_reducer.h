/* DDP's reducer: gradients all-reduced in buckets by a communication thread while backward
 * goes on, as torch.nn.parallel.DistributedDataParallel does it.
 *
 * Parameters are grouped into buckets in reverse registration order (the order backward
 * produces their gradients): a first small bucket of 1 MiB (PyTorch's
 * _DEFAULT_FIRST_BUCKET_BYTES), so communication starts early, then buckets of bucket_cap_mb
 * (distributed.bucket_cap_mb, default 25 as PyTorch's); td_buckets.h plans them, for NCCL's
 * path as for this one. As backward finishes a node, the buckets its parameters complete go to
 * the communication thread, which averages them over the ranks one after another while
 * backward computes the next layers. The gradient block lives in
 * td_comm_alloc memory, so on one host the buckets are summed through shared memory.
 *
 * Every collective of the trainer made while a backward is in flight goes through the same
 * thread (td_reducer_sum, for SyncBatchNorm), so all ranks issue them in one order.
 */
#ifndef TD_REDUCER_H
#define TD_REDUCER_H

#include "dist/td_comm.h"
#include "core/td_model.h"

typedef struct td_reducer td_reducer;

/* Moves the model's gradient block into communication memory (one float more: the step's loss
 * rides with the first bucket) and starts the thread. */
int td_reducer_start(td_reducer **out, td_comm *comm, td_model *model, double bucket_cap_mb,
                     td_err *err);
/* Stops the thread; the model keeps its gradients in memory of its own again. */
void td_reducer_stop(td_reducer *r, td_model *model);

/* Before the backward whose gradients are to be averaged (the last of a no_sync group): the
 * loss to average with them. Installs the hook in run. */
void td_reducer_begin(td_reducer *r, float loss, td_run *run);
/* After that backward: waits for every bucket; the averaged loss in *loss. */
int td_reducer_finish(td_reducer *r, float *loss, td_err *err);

/* Sums n floats over the ranks through the communication thread, in order with the buckets. */
int td_reducer_sum(td_reducer *r, float *values, size_t n, td_err *err);

int td_reducer_buckets(const td_reducer *r);
const char *td_reducer_transport(const td_reducer *r);

#endif
