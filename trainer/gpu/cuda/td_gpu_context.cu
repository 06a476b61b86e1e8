// The device context: opening a GPU, failure records and memory accounting. A model's life on
// the device (attach, batches, forward, loss, backward, transfers) is td_gpu_model.cu.
#include "gpu/cuda/td_gpu_internal.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// ---- failures ---------------------------------------------------------------------------------

void td_gpu_fail(td_gpu *g, const char *file, int line, const char *what, const char *detail,
                 const char *hint) {
    pthread_mutex_lock(&g->fail_lock);
    if (!g->failed) { // later failures are the cascade of the first
        const char *base = strrchr(file, '/');
        snprintf(g->msg, sizeof g->msg, "%s:%d: %s: %s%s%s%s", base ? base + 1 : file, line, what,
                 detail ? detail : "failed", hint && *hint ? " (" : "", hint ? hint : "",
                 hint && *hint ? ")" : "");
        g->failed = true;
    }
    pthread_mutex_unlock(&g->fail_lock);
}

const char *td_gpu_hint_cuda(cudaError_t e) {
    switch (e) {
    case cudaErrorMemoryAllocation:
        return "out of GPU memory: lower train.batch_size, use train.precision bf16, or "
               "train.activation_checkpointing";
    case cudaErrorNoDevice:
    case cudaErrorInsufficientDriver:
        return "no usable GPU or driver: check nvidia-smi and CUDA_VISIBLE_DEVICES";
    case cudaErrorInvalidDevice:
        return "the device index is not visible: check CUDA_VISIBLE_DEVICES and LOCAL_RANK";
    case cudaErrorIllegalAddress:
    case cudaErrorLaunchFailure:
        return "a kernel faulted; the context is lost: rerun with CUDA_LAUNCH_BLOCKING=1 and "
               "compute-sanitizer to find it";
    case cudaErrorStreamCaptureUnsupported:
    case cudaErrorStreamCaptureInvalidated:
        return "an operation cannot be captured in a CUDA graph: set train.cuda_graph false";
    default:
        return "";
    }
}

const char *td_gpu_hint_cublas(cublasStatus_t s) {
    switch (s) {
    case CUBLAS_STATUS_NOT_SUPPORTED:
        return "this GEMM shape or type is not supported on this GPU";
    case CUBLAS_STATUS_ALLOC_FAILED:
        return "out of GPU memory";
    case CUBLAS_STATUS_ARCH_MISMATCH:
        return "the GPU is too old for this data type";
    default:
        return "";
    }
}

const char *td_gpu_hint_cudnn(cudnnStatus_t s) {
    switch (s) {
    case CUDNN_STATUS_NOT_SUPPORTED:
        return "cuDNN has no kernel for this layer shape in this precision";
    case CUDNN_STATUS_ALLOC_FAILED:
        return "out of GPU memory";
    case CUDNN_STATUS_BAD_PARAM:
        return "a descriptor does not match its tensor";
    default:
        return "";
    }
}

const char *td_gpu_hint_nccl(ncclResult_t r) {
    switch (r) {
    case ncclSystemError:
        return "a network or system call failed: is every rank's host reachable? (NCCL_DEBUG=WARN "
               "says more)";
    case ncclRemoteError:
        return "a peer rank failed or was killed";
    case ncclInvalidUsage:
        return "ranks disagree on a collective (a different model or batch on one rank?)";
    case ncclUnhandledCudaError:
        return "a CUDA error inside NCCL";
    default:
        return "";
    }
}

// ---- lifetime -------------------------------------------------------------------------

static int open_handles(td_gpu *g, int device) {
    TD_CUDA_RET(g, cudaSetDevice(device), -1);
    TD_CUDA_RET(g, cudaGetDeviceProperties(&g->prop, device), -1);
    TD_CUDA_RET(g, cudaStreamCreateWithFlags(&g->stream, cudaStreamNonBlocking), -1);
    // GEMMs go through cuBLASLt alone (fp32 there is true fp32: CUBLAS_COMPUTE_32F, no TF32)
    TD_CUBLAS_RET(g, cublasLtCreate(&g->lt), -1);
    TD_CUDNN_RET(g, cudnnCreate(&g->dnn), -1);
    TD_CUDNN_RET(g, cudnnSetStream(g->dnn, g->stream), -1);
    TD_CUDA_RET(g, cudaStreamCreateWithFlags(&g->copy_stream, cudaStreamNonBlocking), -1);
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&g->staging_free, cudaEventDisableTiming), -1);
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&g->input_ready, cudaEventDisableTiming), -1);
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&g->input_taken, cudaEventDisableTiming), -1);
    return 0;
}

extern "C" int td_gpu_open(td_gpu **out, int device, td_err *err) {
    *out = NULL;
    td_gpu *g = (td_gpu *)td_calloc(1, sizeof *g);
    g->device = device;
    g->deterministic = true;
    pthread_mutex_init(&g->fail_lock, NULL);
    if (open_handles(g, device) != 0) {
        td_fail(err, "opening CUDA device %d: %s", device, g->msg);
        td_gpu_close(g);
        return -1;
    }
    *out = g;
    return 0;
}

extern "C" void td_gpu_close(td_gpu *g) {
    if (!g) return;
    if (g->model) td_gpu_detach(g, g->model);
    if (g->staging_free) cudaEventDestroy(g->staging_free);
    if (g->input_ready) cudaEventDestroy(g->input_ready);
    if (g->input_taken) cudaEventDestroy(g->input_taken);
    if (g->copy_stream) cudaStreamDestroy(g->copy_stream);
    if (g->dnn) cudnnDestroy(g->dnn);
    if (g->lt) cublasLtDestroy(g->lt);
    if (g->stream) cudaStreamDestroy(g->stream);
    pthread_mutex_destroy(&g->fail_lock);
    free(g);
}

extern "C" void td_gpu_describe(const td_gpu *g, char *buf, size_t len) {
    int runtime = 0, nccl = 0;
    cudaRuntimeGetVersion(&runtime);
    ncclGetVersion(&nccl);
    snprintf(buf, len, "%s (device %d, sm_%d%d, %.1f GiB), CUDA %d.%d, cuDNN %zu, NCCL %d.%d.%d",
             g->prop.name, g->device, g->prop.major, g->prop.minor,
             (double)g->prop.totalGlobalMem / (1u << 30), runtime / 1000, runtime % 1000 / 10,
             cudnnGetVersion(), nccl / 10000, nccl / 100 % 100, nccl % 100);
}

extern "C" void td_gpu_memory(const td_gpu *g, size_t *in_use, size_t *peak) {
    *in_use = g->in_use;
    *peak = g->peak;
}

void *td_gpu_malloc(td_gpu *g, size_t bytes, const char *what) {
    void *p = NULL;
    cudaError_t e = cudaMalloc(&p, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        char detail[256];
        snprintf(detail, sizeof detail, "%s for %s (%.1f MiB; %.1f MiB held already)",
                 cudaGetErrorString(e), what, (double)bytes / (1 << 20),
                 (double)g->in_use / (1 << 20));
        td_gpu_fail(g, __FILE__, __LINE__, "cudaMalloc", detail, td_gpu_hint_cuda(e));
        return NULL;
    }
    g->in_use += bytes;
    if (g->in_use > g->peak) g->peak = g->in_use;
    return p;
}

void td_gpu_free(td_gpu *g, void *p, size_t bytes) {
    if (!p) return;
    cudaFree(p);
    g->in_use -= bytes;
}

bool td_gpu_take_failure(td_gpu *g, char *msg, size_t len) {
    pthread_mutex_lock(&g->fail_lock);
    bool failed = g->failed;
    if (failed) snprintf(msg, len, "%s", g->msg);
    g->failed = false;
    pthread_mutex_unlock(&g->fail_lock);
    return failed;
}

extern "C" int td_gpu_check(td_gpu *g, td_err *err) {
    // a communicator abort stays recorded in the DDP state; what is cleared here is only the
    // report, so the next caller starts clean (td_gpu.h: failures "since the last call")
    if (!g->failed && td_gpu_ddp_wait(g, g->stream, err) != 0) return -1;
    char msg[TD_ERR_MAX];
    if (!td_gpu_take_failure(g, msg, sizeof msg)) return 0;
    td_fail(err, "GPU: %s", msg);
    return -1;
}
