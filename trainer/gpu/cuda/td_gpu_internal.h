// What the CUDA sources of the engine share: the device context, the check macros, element
// types per precision and the table through which a model node finds its GPU forward and
// backward. C++ (nvcc) only; the trainer sees td_gpu.h.
#ifndef TD_GPU_INTERNAL_H
#define TD_GPU_INTERNAL_H

extern "C" {
#include "gpu/td_gpu.h"
#include "core/td_model.h"
#include "ops/td_ops.h"
}

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <cudnn.h>
#include <nccl.h>

#include <pthread.h>
#include <stdint.h>
#include <type_traits>

typedef struct td_gpu_ddp td_gpu_ddp; // td_gpu_nccl.h
struct td_gpu_op;

// The members of td_gpu.h's table. Each is implemented by td_gpu_<member> (td_gpu_open, ...),
// declared here with the member's own type, so td_gpu.h alone spells the signatures; the
// functions are defined across these sources and td_gpu_api.cu gathers them into the table the
// library exports.
// clang-format off
#define TD_GPU_API_FUNCTIONS(X)                                                                    \
    X(open) X(close) X(describe) X(memory) X(check) X(attach) X(detach) X(download) X(upload)      \
    X(benchmark_convolutions) X(set_deterministic) X(set_batch) X(forward) X(loss) X(backward)     \
    X(read) X(read_grads) X(seek_dropout) X(take_totals) X(optim_init) X(optim_step)               \
    X(scaler_state) X(ddp_start) X(ddp_begin) X(ddp_finish) X(ddp_allreduce_host)                  \
    X(ddp_broadcast_params) X(ddp_buckets) X(graph_step)
// clang-format on
#define TD_GPU_DECLARE(member)                                                                     \
    extern "C" std::remove_pointer_t<decltype(td_gpu_api::member)> td_gpu_##member;
TD_GPU_API_FUNCTIONS(TD_GPU_DECLARE)
#undef TD_GPU_DECLARE

// fp16 loss scaling state on the device, as torch.cuda.amp.GradScaler keeps it.
struct td_gpu_scaler {
    float *scale;        // current loss scale (init 65536)
    int *growth_tracker; // consecutive finite steps
    int *found_inf;      // set by the gradient check of this step
    long long *skipped;  // steps skipped so far
};

struct td_gpu {
    int device;
    cudaDeviceProp prop;
    cudaStream_t stream; // all compute
    cublasLtHandle_t lt;
    cudnnHandle_t dnn;

    // The first failure, with file:line and a hint; later ones are dropped (they are cascades).
    // The NCCL watchdog records from its own thread, hence the lock.
    pthread_mutex_t fail_lock;
    bool failed;
    char msg[TD_ERR_MAX];

    size_t in_use, peak; // bytes held through td_gpu_malloc

    // The attached model (one per context).
    td_model *model;
    td_precision prec;
    float *params, *grads, *buffers; // fp32, param_floats / buffer_floats
    void *params_half;               // prec != fp32: the compute copy of params, same offsets
    void *arena;                     // activations, their gradients, saved state, workspace
    size_t arena_bytes;
    void *workspace; // model->scratch: cuDNN and cuBLASLt workspace, shared by every node
    size_t workspace_bytes;
    // The batch travels host -> device on its own stream, into input_next / labels_next, while
    // the previous step still computes; its step then takes it over (a device copy, or the
    // conversion to 16 bits) into input / labels, which the step alone reads.
    void *input;     // [max_n, input size] in the compute precision
    int32_t *labels; // [max_n, positions]
    int positions;   // labels per sample: a sequence's length (a language model), else 1
    // A model whose first node is an embedding: the batch's token ids as int32, taken from the
    // fp32 input_next before any 16-bit conversion could round them (td_gpu_embedding.cu)
    int32_t *ids; // [max_n, input size]; NULL: none
    int ids_vocab;
    float *input_next;        // the next batch as copied in, fp32
    int32_t *labels_next;     // [max_n, positions]
    float *input_staging;     // pinned host copy of the batch, fp32
    int32_t *labels_staging;  // pinned
    cudaStream_t copy_stream; // host -> device copies of batches
    cudaEvent_t staging_free; // the last copy out of the staging buffers has run (copy_stream)
    cudaEvent_t input_ready;  // the last batch is in input_next / labels_next (copy_stream)
    cudaEvent_t input_taken;  // the last batch left input_next / labels_next (stream)

    // Per-batch accumulators (evaluation and metrics): loss sum and argmax hits, in double.
    double *totals; // [2]
    // The loss's per-row scratch for batches of many rows (td_gpu_loss.cu); NULL: none needed.
    double *loss_rows;
    int *loss_row_hits;
    size_t loss_max_rows;

    // Dropout: counter-based random numbers keyed by (seed, offset); the offset lives on the
    // device and advances in-stream, so a captured graph draws fresh masks at every replay.
    uint64_t seed;
    unsigned long long *rng_offset;
    // Activation checkpointing: each segment's offset as its forward found it, and the counter a
    // recomputation draws from (restored from the former), so it redraws the same masks.
    unsigned long long *segment_offsets; // [model->n_segments]
    unsigned long long *recompute_offset;
    size_t rng_slots; // counters allocated together from rng_offset

    // Optimizer state (td_gpu_optim.cu).
    td_optim_config optim;
    bool optim_ready;
    float *m, *v;
    uint32_t *no_decay; // decay "matrices": a bit per parameter without weight decay; or NULL
    size_t no_decay_words;
    long long *optim_steps; // steps taken (not skipped), for Adam's bias correction
    float *lr;              // device scalar a captured step reads (td_gpu_optim_set_lr)
    double *norm_sq;        // clipping's squared global norm
    td_gpu_scaler scaler;   // fp16 only

    td_gpu_ddp *ddp;

    // Fusion of an op into the kernels of the op before it (BatchNorm or Add, then ReLU); off with
    // TRAIND_GPU_FUSION=0, to measure what it saves or to rule it out.
    bool fusion;
    // Convolutions keep to cuDNN's deterministic algorithms (td_gpu_set_deterministic).
    bool deterministic;
    const td_gpu_op **ops; // per model node

    // CUDA graph of a whole training step (td_gpu_graph.cu).
    cudaGraphExec_t graph;
    int graph_n;
    bool graph_ddp;
};

// What a node's GPU forward and backward see.
struct td_gpu_run {
    td_gpu *g;
    int n;
    bool training;
    bool accumulate_grads; // add into the parameter gradients
    // A recomputation in backward (activation checkpointing; td_run.recompute): no running
    // statistics move, BatchNorm reuses the statistics it saved.
    bool recompute;
    unsigned long long *rng_offset; // the dropout counter this pass draws from
    cudaStream_t stream;
    // After backward of a node with parameters: DDP's bucket hook (NULL: none).
    void (*node_done)(void *ctx, const td_node *node);
    void *node_done_ctx;
};

// One op's GPU side. plan: from the node's shapes and arguments (already built on the host),
// sets node->gpu (a malloc'ed plan, freed by release), node->saved_bytes (device bytes forward
// keeps for backward) and node->scratch_floats (workspace it needs, in 4-byte units). Runs
// before the arena exists. forward/backward: queue the work on run->stream; errors go to
// td_gpu_fail.
struct td_gpu_op {
    const td_op *op;
    int (*plan)(td_gpu *g, td_model *m, td_node *node, td_err *err);
    void (*forward)(td_gpu *g, td_node *node, const td_gpu_run *run);
    void (*backward)(td_gpu *g, td_node *node, const td_gpu_run *run);
    void (*release)(td_node *node);
};

// cudnn.benchmark for one conv2d node (td_gpu_benchmark_convolutions): its passes timed on its
// own buffers at the full batch, the fastest deterministic algorithms kept. 1 when timed, 0 when
// the node has no full-batch plan, -1 with the failure recorded.
int td_gpu_conv_benchmark(td_gpu *g, td_node *node);

// The plan of an op that needs nothing but its forward and backward: no device plan, no saved
// state, no workspace.
int td_gpu_plain_plan(td_gpu *g, td_model *m, td_node *node, td_err *err);

// A node whose forward and backward run inside another node's kernels (a ReLU fused into the
// BatchNorm or Add before it): nothing to plan or queue.
extern "C" const td_gpu_op td_gpu_op_fused;

// The ReLU whose work `node` (a BatchNorm or an Add) may do in its own kernels, or NULL: the
// ReLU is the only reader of node's output (which then need not exist), in the same
// activation-checkpointing segment, and fusion is on.
td_node *td_gpu_fused_relu(const td_gpu *g, td_model *m, const td_node *node);

// Each op's GPU side, td_gpu_op_<name> for the op td_op_<name> of ops/td_ops.def, defined in the
// source of its kind (td_gpu_conv.cu: conv2d).
extern "C" {
#define TD_OP(name) extern const td_gpu_op td_gpu_op_##name;
#include "ops/td_ops.def"
}

// The batch's token ids, from its fp32 copy x (n values) into g->ids, on `stream`; nothing for a
// model without an embedding first.
void td_gpu_take_ids(td_gpu *g, const float *x, size_t n, cudaStream_t stream);

// Records the first failure: "file:line: what: detail (hint)".
void td_gpu_fail(td_gpu *g, const char *file, int line, const char *what, const char *detail,
                 const char *hint);
const char *td_gpu_hint_cuda(cudaError_t e);
const char *td_gpu_hint_cublas(cublasStatus_t s);
const char *td_gpu_hint_cudnn(cudnnStatus_t s);
const char *td_gpu_hint_nccl(ncclResult_t r);

// Device memory with accounting (in_use, peak). NULL after recording the failure.
void *td_gpu_malloc(td_gpu *g, size_t bytes, const char *what);
void td_gpu_free(td_gpu *g, void *p, size_t bytes);

// Check macros: on failure record file:line, the library's message and a hint, then leave the
// function (`return` in void functions; TD_*_RET returns the given value).
#define TD_GPU_CHECK_IMPL(g, ok, what, detail, hint, ret)                                          \
    do {                                                                                           \
        if (!(ok)) {                                                                               \
            td_gpu_fail((g), __FILE__, __LINE__, (what), (detail), (hint));                        \
            return ret;                                                                            \
        }                                                                                          \
    } while (0)

#define TD_CUDA_RET(g, call, ret)                                                                  \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        TD_GPU_CHECK_IMPL(g, e_ == cudaSuccess, #call, cudaGetErrorString(e_),                     \
                          td_gpu_hint_cuda(e_), ret);                                              \
    } while (0)
#define TD_CUBLAS_RET(g, call, ret)                                                                \
    do {                                                                                           \
        cublasStatus_t s_ = (call);                                                                \
        TD_GPU_CHECK_IMPL(g, s_ == CUBLAS_STATUS_SUCCESS, #call, cublasGetStatusString(s_),        \
                          td_gpu_hint_cublas(s_), ret);                                            \
    } while (0)
#define TD_CUDNN_RET(g, call, ret)                                                                 \
    do {                                                                                           \
        cudnnStatus_t s_ = (call);                                                                 \
        TD_GPU_CHECK_IMPL(g, s_ == CUDNN_STATUS_SUCCESS, #call, cudnnGetErrorString(s_),           \
                          td_gpu_hint_cudnn(s_), ret);                                             \
    } while (0)
#define TD_NCCL_RET(g, call, ret)                                                                  \
    do {                                                                                           \
        ncclResult_t r_ = (call);                                                                  \
        TD_GPU_CHECK_IMPL(g, r_ == ncclSuccess || r_ == ncclInProgress, #call,                     \
                          ncclGetErrorString(r_), td_gpu_hint_nccl(r_), ret);                      \
    } while (0)
#define TD_NOTHING
#define TD_CUDA(g, call)   TD_CUDA_RET(g, call, TD_NOTHING)
#define TD_CUBLAS(g, call) TD_CUBLAS_RET(g, call, TD_NOTHING)
#define TD_CUDNN(g, call)  TD_CUDNN_RET(g, call, TD_NOTHING)
#define TD_NCCL(g, call)   TD_NCCL_RET(g, call, TD_NOTHING)
// After a kernel launch: a bad configuration shows up here, not at the next synchronisation.
#define TD_LAUNCHED(g) TD_CUDA(g, cudaGetLastError())

// Element types of activations per precision; arithmetic is always fp32 in registers.
template <typename T> __device__ __forceinline__ float td_to_float(T v);
template <> __device__ __forceinline__ float td_to_float<float>(float v) {
    return v;
}
template <> __device__ __forceinline__ float td_to_float<__nv_bfloat16>(__nv_bfloat16 v) {
    return __bfloat162float(v);
}
template <> __device__ __forceinline__ float td_to_float<__half>(__half v) {
    return __half2float(v);
}
template <typename T> __device__ __forceinline__ T td_from_float(float v);
template <> __device__ __forceinline__ float td_from_float<float>(float v) {
    return v;
}
template <> __device__ __forceinline__ __nv_bfloat16 td_from_float<__nv_bfloat16>(float v) {
    return __float2bfloat16_rn(v);
}
template <> __device__ __forceinline__ __half td_from_float<__half>(float v) {
    return __float2half_rn(v);
}

// A warp's sum, every lane getting it: a butterfly, so every lane adds the same pairs (in swapped
// order, which addition ignores) and all lanes end with bit-identical sums. All 32 lanes take
// part.
template <typename V> __device__ __forceinline__ V td_warp_sum(V v) {
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// ReLU as torch.relu: a NaN passes through (fmaxf would turn it into 0 and hide it from the loss
// and from fp16's overflow check). The CPU's td_activation.c does the same.
__device__ __forceinline__ float td_relu(float v) {
    return v <= 0.0f ? 0.0f : v;
}

// Runs `body` with `T` the element type of precision `prec`.
#define TD_GPU_DISPATCH(prec, T, body)                                                             \
    do {                                                                                           \
        switch (prec) {                                                                            \
        case TD_PREC_FP32: {                                                                       \
            typedef float T;                                                                       \
            body;                                                                                  \
        } break;                                                                                   \
        case TD_PREC_BF16: {                                                                       \
            typedef __nv_bfloat16 T;                                                               \
            body;                                                                                  \
        } break;                                                                                   \
        case TD_PREC_FP16: {                                                                       \
            typedef __half T;                                                                      \
            body;                                                                                  \
        } break;                                                                                   \
        }                                                                                          \
    } while (0)

// An op's forward or backward entry: the template `impl` instantiated for the compute precision.
#define TD_GPU_TYPED_ENTRY(name, impl)                                                             \
    static void name(td_gpu *g, td_node *node, const td_gpu_run *run) {                            \
        TD_GPU_DISPATCH(g->prec, T, impl<T>(g, node, run));                                        \
    }

// Library data types of the compute precision.
static inline cudaDataType_t td_gpu_cuda_type(td_precision p) {
    return p == TD_PREC_BF16 ? CUDA_R_16BF : p == TD_PREC_FP16 ? CUDA_R_16F : CUDA_R_32F;
}
static inline cudnnDataType_t td_gpu_cudnn_type(td_precision p) {
    return p == TD_PREC_BF16   ? CUDNN_DATA_BFLOAT16
           : p == TD_PREC_FP16 ? CUDNN_DATA_HALF
                               : CUDNN_DATA_FLOAT;
}
static inline size_t td_gpu_elem(td_precision p) {
    return p == TD_PREC_FP32 ? 4 : 2;
}

// A parameter as compute reads it: the fp32 master in fp32, else its 16-bit copy.
static inline void *td_gpu_weight(const td_gpu *g, const td_param *p) {
    if (g->prec == TD_PREC_FP32) return p->dev_data;
    return (char *)g->params_half + p->offset * 2;
}

// Grid size for n elements at `threads` per block, capped so huge tensors grid-stride.
static inline unsigned td_gpu_blocks(size_t n, unsigned threads) {
    size_t b = (n + threads - 1) / threads;
    return (unsigned)(b < 65535u * 16 ? (b ? b : 1) : 65535u * 16);
}
#define TD_GRID_STRIDE(i, n)                                                                       \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);                        \
         i += (size_t)gridDim.x * blockDim.x)

// ---- eight elements at a time (memory-bound kernels)
// ---------------------------------------------

#define EW_VEC 8

// 16 bytes of a 16-bit type or 32 of fp32: what lets the compiler emit 128-bit accesses.
template <typename T> struct alignas(EW_VEC * sizeof(T)) ew_pack { T e[EW_VEC]; };

// Elements i..i+7 as floats. full: all eight exist and the pointer is aligned for the vector;
// otherwise each element is read on its own and those past n read as 0. The unrolled constant
// indices keep v[] in registers.
template <typename T>
static __device__ __forceinline__ void ew_load(const T *p, size_t i, size_t n, bool full,
                                               float *v) {
    if (full) {
        ew_pack<T> a = *reinterpret_cast<const ew_pack<T> *>(p + i);
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) v[e] = td_to_float(a.e[e]);
    } else {
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) v[e] = i + e < n ? td_to_float(p[i + e]) : 0.0f;
    }
}

template <typename T>
static __device__ __forceinline__ void ew_store(T *p, size_t i, size_t n, bool full,
                                                const float *v) {
    if (full) {
        ew_pack<T> a;
#pragma unroll
        for (int e = 0; e < EW_VEC; e++) a.e[e] = td_from_float<T>(v[e]);
        *reinterpret_cast<ew_pack<T> *>(p + i) = a;
    } else {
#pragma unroll
        for (int e = 0; e < EW_VEC; e++)
            if (i + e < n) p[i + e] = td_from_float<T>(v[e]);
    }
}

// Grid-stride over the packs of n elements: i is each pack's first element.
#define EW_LOOP(i, n)                                                                              \
    for (size_t k_ = (size_t)blockIdx.x * blockDim.x + threadIdx.x, i = k_ * EW_VEC; i < (n);      \
         k_ += (size_t)gridDim.x * blockDim.x, i = k_ * EW_VEC)

// Whether every pointer given allows the vector accesses of T (NULL ones do).
template <typename T> static bool ew_aligned(const void *a, const void *b, const void *c = NULL) {
    uintptr_t bits = (uintptr_t)a | (uintptr_t)b | (uintptr_t)c;
    return bits % (EW_VEC * sizeof(T)) == 0;
}

// Counter-based uniform in [0, 1) for element i of draw `offset` (dropout): a hash, so any
// element can be drawn by any thread in any order and a replayed graph draws new masks.
__device__ __forceinline__ float td_gpu_uniform(uint64_t seed, unsigned long long offset,
                                                size_t i) {
    uint64_t x = seed ^ (offset * 0x9E3779B97F4A7C15ull) ^ ((uint64_t)i * 0xBF58476D1CE4E5B9ull);
    x ^= x >> 30;
    x *= 0xBF58476D1CE4E5B9ull;
    x ^= x >> 27;
    x *= 0x94D049BB133111EBull;
    x ^= x >> 31;
    return (float)(x >> 40) * (1.0f / 16777216.0f);
}

// Shared by the optimizer and graph code: the loss-scale multiplier of the loss gradient (1
// unless fp16).
float *td_gpu_loss_scale_ptr(td_gpu *g);

// Loss kernels (td_gpu_loss.cu): the loss sum × total_weight and the hits added to g->totals;
// when dlogits is not NULL, the gradient of (mean loss × grad_scale × *loss_scale, when
// loss_scale is not NULL) into it.
void td_gpu_loss_run(td_gpu *g, const td_loss *loss, const void *logits, const int32_t *labels,
                     int n, int classes, void *dlogits, float grad_scale, const float *loss_scale,
                     float total_weight, cudaStream_t stream);

// Optimizer pieces (td_gpu_optim.cu), queued on stream.
int td_gpu_optim_alloc(td_gpu *g, size_t n, td_err *err);
void td_gpu_optim_free(td_gpu *g);
// Writes the learning rate a captured step reads, in-stream, before its replay.
void td_gpu_optim_set_lr(td_gpu *g, float lr, cudaStream_t stream);
// fp32 params -> their 16-bit copy (after an upload).
void td_gpu_refresh_half(td_gpu *g, size_t n, cudaStream_t stream);
// fp32 device values -> device elements of the compute precision.
void td_gpu_convert_in(td_gpu *g, const float *src, void *dst, size_t n, cudaStream_t stream);

// Loss scratch (td_gpu_loss.cu), sized for batches of up to max_n.
int td_gpu_loss_alloc(td_gpu *g, size_t max_rows, td_err *err);
void td_gpu_loss_free(td_gpu *g);
// Optimizer state between host and device (td_gpu_optim.cu). Synchronise.
int td_gpu_optim_download(td_gpu *g, td_optim *opt, td_err *err);
int td_gpu_optim_upload(td_gpu *g, const td_optim *opt, td_err *err);

// Takes the recorded failure, if any, into msg and clears it (under the lock the NCCL
// watchdog records with). Returns whether there was one.
bool td_gpu_take_failure(td_gpu *g, char *msg, size_t len);

// DDP (td_gpu_ddp_stop in td_gpu_nccl.cu, the rest in td_gpu_nccl_collectives.cu)
void td_gpu_ddp_stop(td_gpu *g);
// Waits for stream s with the watchdog in charge: a dead peer or a collective past its deadline
// becomes an error return, never a hang.
int td_gpu_ddp_wait(td_gpu *g, cudaStream_t s, td_err *err);
int td_gpu_ddp_wait_event(td_gpu *g, cudaEvent_t ev, td_err *err);
// SyncBatchNorm (td_gpu_ddp_start's sync_bn): whether training BatchNorm spans every rank, and the
// all-reduce (sum) of n device doubles written by the compute stream, queued between that
// stream's work so far and its next. A failure is recorded (td_gpu_fail).
bool td_gpu_ddp_syncs_batchnorm(const td_gpu *g);
void td_gpu_ddp_sum(td_gpu *g, double *values, size_t n, cudaStream_t compute);

#endif
