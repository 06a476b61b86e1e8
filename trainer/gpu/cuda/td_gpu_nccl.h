// What the two NCCL sources share: the DDP state and the calls the collectives make into the
// communicator's failure handling. td_gpu_nccl.cu owns the communicator (set-up, the watchdog,
// aborts, teardown); td_gpu_nccl_collectives.cu what goes through it (gradient buckets, host
// values, broadcasts, SyncBatchNorm's sums) and the trainer's host waits. C++ (nvcc) only.
#ifndef TD_GPU_NCCL_H
#define TD_GPU_NCCL_H

#include "gpu/cuda/td_gpu_internal.h"

extern "C" {
#include "dist/td_buckets.h"
}

#include <pthread.h>

// td_gpu_ddp_allreduce_host's staging, in floats; longer inputs go through in chunks.
#define HOST_FLOATS 4096

struct td_gpu_ddp {
    td_gpu *g;
    int rank, world;
    double timeout_s;
    cudaStream_t stream; // communication

    td_buckets plan;    // dist/td_buckets.h: each bucket's floats, and each parameter's bucket
    int *pending;       // per bucket: its parameters still without their gradient in this backward
    cudaEvent_t *ready; // per bucket: recorded on the compute stream when its gradients are final
    cudaEvent_t fork;   // compute -> communication, outside backward
    cudaEvent_t join;   // communication -> compute
    cudaEvent_t host_done, wait_done;
    bool sync_bn;                     // SyncBatchNorm: BatchNorm's sums span every rank
    cudaEvent_t sync_fork, sync_join; // around each of its all-reduces
    int next; // the next bucket to launch in this backward: buckets go out in order
    bool in_backward;
    bool launch_failed;

    float *host_dev;    // [HOST_FLOATS], allreduce_host's device side
    float *host_pinned; // [HOST_FLOATS], its host side

    // The communicator and what the watchdog shares with this thread. NCCL calls happen under
    // mu, so the watchdog never aborts (frees) the communicator while this thread is inside one;
    // the calls are non-blocking, so mu is never held for long except by an abort.
    pthread_mutex_t mu;
    pthread_cond_t wake;
    ncclComm_t comm; // NULL once aborted or destroyed
    bool aborted;
    bool stop;
    double deadline;      // CLOCK_MONOTONIC seconds by which the armed wait must end; 0: none
    const char *what;     // what the armed wait waits for, for the message
    char why[TD_ERR_MAX]; // the abort's reason
    pthread_t watchdog;
    bool watchdog_running;
    bool sync_ready, mu_ready;
};

// The device context's first failure as the caller's error.
int td_gpu_error(td_gpu *g, td_err *err);

// The abort's reason when the communicator was aborted (written under mu, so read it there: the
// watchdog may be writing the device context's message at the same moment), else the device
// context's first failure.
int td_gpu_ddp_error(td_gpu_ddp *d, td_err *err);

// Whether the communicator was aborted (read under mu).
bool td_gpu_ddp_aborted(td_gpu_ddp *d);

enum { OP_ALLREDUCE, OP_BROADCAST };

// One collective on the communication stream, in place on device values of `type`: launched
// under mu, then settled. -1 with the failure recorded.
int td_gpu_ddp_collective(td_gpu_ddp *d, int kind, void *buf, size_t n, ncclDataType_t type,
                          ncclRedOp_t op, const char *what);

// Waits on the host for ev by polling, so that the watchdog's abort (which lets NCCL's kernels
// return, or leaves them stuck: either way `aborted` is set) ends the wait with an error.
int td_gpu_ddp_poll_event(td_gpu_ddp *d, cudaEvent_t ev, const char *what, td_err *err);

#endif
