/* The CUDA backend, as the trainer sees it: one table of functions (td_gpu_api) that the backend
 * library exports, found with td_gpu_load. Built from the sources in cuda/ when nvcc is found;
 * without CUDA (td_gpu_none.c) no device is ever counted and td_gpu_load says why it has no
 * table, so callers need no #ifdef.
 *
 * A td_gpu is one device with its streams, library handles and memory. A model attached to it
 * keeps its host parameter blocks (initialisation, checkpoints) and gains device ones: fp32
 * parameters, gradients and buffers, a 16-bit copy of the parameters for bf16/fp16 compute, and
 * one device arena for every activation, activation gradient and saved tensor, planned by the
 * same layout as the CPU's (td_model_layout). Node pointers (in, out, grad, saved) then point into
 * device memory, in the precision's element type.
 *
 * Work is queued on the device's stream and nothing here waits for it, except where a function
 * says it synchronises. Failures inside queued work (a CUDA, cuBLAS, cuDNN or NCCL error) are
 * recorded with file:line and a hint; the trainer collects them with the table's check.
 */
#ifndef TD_GPU_H
#define TD_GPU_H

#include "core/td_device.h"
#include "base/td_error.h"
#include "core/td_loss.h"
#include "core/td_model.h"
#include "core/td_optim.h"
#include "dist/td_store.h"

#include <stdint.h>

typedef struct td_gpu td_gpu;

/* Number of usable CUDA devices; 0 with the reason in why. Asks the driver alone: never loads
 * the backend, so CPU jobs and the daemon never map CUDA's libraries. */
int td_gpu_device_count(char *why, size_t len);

/* One device as the driver describes it: its CUDA ordinal, name and memory (an empty name or 0
 * bytes where the driver would not say). */
typedef struct td_gpu_device_info {
    int index;
    char name[96];
    uint64_t memory_bytes;
} td_gpu_device_info;

/* As td_gpu_device_count, and the first max devices described in out. */
int td_gpu_devices(td_gpu_device_info *out, int max, char *why, size_t len);

/* CUDA graphs (graph_step): the arguments of one step, and its failure that ends the job. */
#define TD_GPU_GRAPH_FATAL (-2)
typedef struct td_gpu_step_args {
    const td_loss *loss;
    int n;
    float lr, max_norm;
    bool ddp;
} td_gpu_step_args;

/* The backend's functions. All but open take the td_gpu that open returned. */
typedef struct td_gpu_api {
    /* sizeof(td_gpu_api) as the library was built: td_gpu_load refuses a library whose table
     * differs from this program's (a stale build). */
    size_t size;

    int (*open)(td_gpu **out, int device, td_err *err);
    void (*close)(td_gpu *g);
    /* "NVIDIA H100 80GB HBM3 (device 0, sm_90, 79.1 GiB), CUDA 13.0, cuDNN 91900, NCCL 2.28.3" */
    void (*describe)(const td_gpu *g, char *buf, size_t len);
    /* Device memory this process holds now and at most so far (the caching of the CUDA runtime
     * itself aside), in bytes. */
    void (*memory)(const td_gpu *g, size_t *in_use, size_t *peak);
    /* The first failure recorded since the last call, if any: -1 with err set. Synchronises. */
    int (*check)(td_gpu *g, td_err *err);

    /* Moves the model onto the device: plans every node (cuDNN descriptors and algorithms chosen
     * once per shape), allocates the device blocks and arena, uploads parameters and buffers.
     * The model must have been built with TD_MODEL_NO_ARENA. */
    int (*attach)(td_gpu *g, td_model *m, td_precision prec, uint64_t seed, td_err *err);
    void (*detach)(td_gpu *g, td_model *m);

    /* Parameters, buffers and optimizer state between host and device (checkpoints, restores,
     * broadcasts from rank 0). Synchronise. */
    int (*download)(td_gpu *g, td_model *m, td_optim *opt, td_err *err);
    int (*upload)(td_gpu *g, td_model *m, const td_optim *opt, td_err *err);

    /* torch.backends.cudnn.benchmark with cudnn.deterministic: times cuDNN's deterministic
     * algorithms of every convolution pass at the full batch, on the attached model's own
     * buffers, and keeps the fastest that fits the workspace (the plan's heuristic choice
     * otherwise). Writes over activations and gradients, so it runs before training; *timed:
     * convolutions timed. Synchronises. */
    int (*benchmark_convolutions)(td_gpu *g, td_model *m, int *timed, td_err *err);
    /* Whether convolutions keep to cuDNN's deterministic algorithms (the default, true), as
     * torch.backends.cudnn.deterministic; false also admits those that add with atomics (some
     * filter-gradient ones), PyTorch's default, where they rank or time faster. Before attach,
     * which chooses the algorithms. */
    void (*set_deterministic)(td_gpu *g, bool on);

    /* Copies a host batch to the device (converting to the compute precision). */
    int (*set_batch)(td_gpu *g, td_model *m, const float *x, const int32_t *labels, int n,
                     td_err *err);
    /* The model on the batch set last; run->scratch, rng and sync are not used on the device. */
    void (*forward)(td_gpu *g, td_model *m, const td_run *run);
    /* The loss of the batch set last: its sum over the rows × total_weight and the argmax hits
     * are added to the device's accumulators, and (when backward) the gradient of (mean loss ×
     * grad_scale × loss scale) goes into the last node's gradient, ready for backward. A row is
     * a sample, or a language model's position (its n samples are n·T rows). */
    void (*loss)(td_gpu *g, td_model *m, const td_loss *loss, int n, float grad_scale,
                 bool backward, float total_weight);
    void (*backward)(td_gpu *g, td_model *m, const td_run *run);
    /* Device values of the compute precision (an activation: node->out) as floats on the host;
     * the model's fp32 parameter gradients. Synchronise. */
    int (*read)(td_gpu *g, const void *dev, size_t elems, float *host, td_err *err);
    int (*read_grads)(td_gpu *g, const td_model *m, float *host, td_err *err);

    /* Dropout masks are drawn from a counter that advances by one per dropout node and training
     * forward; a resumed run sets it to where the interrupted one was. Synchronises. */
    int (*seek_dropout)(td_gpu *g, unsigned long long draws, td_err *err);

    /* Reads and zeroes the accumulators (loss sum, hits). Synchronises. */
    int (*take_totals)(td_gpu *g, double *loss_sum, double *hits, td_err *err);

    /* The optimizer on the device: state allocated at init, one fused kernel per step over the
     * flat blocks (clipping to max_norm when > 0, fp16 unscaling and the skip of a step whose
     * gradients hold inf or nan, then the update of the fp32 weights and their 16-bit copy). Op
     * by op, lr is the kernel's argument; a captured step reads it from device memory, which
     * graph_step writes in-stream before each replay. */
    int (*optim_init)(td_gpu *g, td_model *m, const td_optim *opt, td_err *err);
    void (*optim_step)(td_gpu *g, td_model *m, float lr, float max_norm);
    /* fp16 loss scaling: the current scale and the number of steps skipped so far. */
    void (*scaler_state)(td_gpu *g, float *scale, long *skipped);

    /* Data-parallel gradients through NCCL: the unique id travels through the rendezvous store;
     * buckets as dist/td_buckets.h plans them, each all-reduced (ncclAvg) on the communication
     * stream as soon as backward has produced it (event-gated), so communication overlaps
     * backward. A watchdog aborts the communicator when a peer fails or a collective outlives
     * timeout_s, so a dead peer never hangs the job. sync_bn: SyncBatchNorm, training
     * BatchNorm's statistics and its backward's sums over every rank's batch (all-reduced in
     * order with the buckets). */
    int (*ddp_start)(td_gpu *g, td_model *m, td_store *store, int rank, int world,
                     double bucket_cap_mb, double timeout_s, bool sync_bn, td_err *err);
    /* Before the backward whose gradients are to be averaged: installs the node hook in run. */
    void (*ddp_begin)(td_gpu *g, td_run *run);
    /* After that backward: the compute stream waits for the last bucket (no host wait). */
    int (*ddp_finish)(td_gpu *g, td_err *err);
    /* Sums (or averages) n floats of host memory over the ranks (metrics, evaluation counts,
     * the checkpoint barrier). Synchronises. */
    int (*ddp_allreduce_host)(td_gpu *g, float *values, size_t n, bool average, td_err *err);
    /* Rank 0's parameters and buffers to every rank (as DDP's constructor does). */
    int (*ddp_broadcast_params)(td_gpu *g, td_model *m, bool buffers_only, td_err *err);
    int (*ddp_buckets)(const td_gpu *g);

    /* CUDA graphs: the whole training step (forward, loss, backward, all-reduce, optimizer)
     * captured once for a full batch and replayed; it runs the step, capturing on first use;
     * eager steps remain for short batches. Returns -1 (and the trainer runs eagerly) when
     * capture fails, with the reason in err; TD_GPU_GRAPH_FATAL when, under DDP, the step failed
     * where this rank cannot fall back alone (its peers would replay collectives it runs op by
     * op): the job must stop. */
    int (*graph_step)(td_gpu *g, td_model *m, const td_gpu_step_args *args, td_err *err);
} td_gpu_api;

/* The backend library exports its one td_gpu_api under this name (C linkage, default
 * visibility): the library defines TD_GPU_API_NAME, the loader looks up TD_GPU_API_SYMBOL. */
#define TD_GPU_API_NAME          td_gpu_backend
#define TD_GPU_API_SYMBOL        TD_GPU_EXPAND_STRING_(TD_GPU_API_NAME)
#define TD_GPU_EXPAND_STRING_(x) TD_GPU_STRING_(x)
#define TD_GPU_STRING_(x)        #x

/* The backend's table, loading the library on first use (process-wide, thread-safe); NULL with
 * the reason in err when it cannot be loaded or this traind was built without CUDA. */
const td_gpu_api *td_gpu_load(td_err *err);

#endif
