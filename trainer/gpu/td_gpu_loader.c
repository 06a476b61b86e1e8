/* The GPU backend lives in its own shared library (libtraind_gpu.so: the CUDA sources with
 * cuBLAS, cuDNN and NCCL behind them), opened only when a job trains on a GPU. Linked directly,
 * those libraries cost every process ~0.3 s and ~200 MB at start, CPU jobs and the daemon's
 * short-lived tools included. Devices are counted through the driver (libcuda.so.1), which is
 * small and present exactly where a GPU can be used.
 *
 * Each td_gpu.h function here forwards to the library's function of the same name. The library
 * is linked with -Bsymbolic (its calls among themselves stay inside it) and resolves what it
 * uses of the engine (td_fail, the op table, the store) against this executable, which exports
 * them (-rdynamic). The handle and table are process-wide, like the dynamic loader's own state,
 * and filled once under pthread_once. */
#include "gpu/td_gpu.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* name, return type, parameters, arguments */
#define TD_GPU_FUNCTIONS(X)                                                                        \
    X(td_gpu_open, int, (td_gpu * *out, int device, td_err *err), (out, device, err))              \
    X(td_gpu_close, void, (td_gpu * g), (g))                                                       \
    TD_GPU_FUNCTIONS_OF_A_GPU(X)

/* Those that take the td_gpu td_gpu_open returned: the library is loaded by then. */
#define TD_GPU_FUNCTIONS_OF_A_GPU(X)                                                               \
    X(td_gpu_describe, void, (const td_gpu *g, char *buf, size_t len), (g, buf, len))              \
    X(td_gpu_memory, void, (const td_gpu *g, size_t *in_use, size_t *peak), (g, in_use, peak))     \
    X(td_gpu_check, int, (td_gpu * g, td_err * err), (g, err))                                     \
    X(td_gpu_attach, int,                                                                          \
      (td_gpu * g, td_model * m, td_precision prec, uint64_t seed, td_err * err),                  \
      (g, m, prec, seed, err))                                                                     \
    X(td_gpu_detach, void, (td_gpu * g, td_model * m), (g, m))                                     \
    X(td_gpu_download, int, (td_gpu * g, td_model * m, td_optim * opt, td_err * err),              \
      (g, m, opt, err))                                                                            \
    X(td_gpu_upload, int, (td_gpu * g, td_model * m, const td_optim *opt, td_err *err),            \
      (g, m, opt, err))                                                                            \
    X(td_gpu_benchmark_convolutions, int, (td_gpu * g, td_model * m, int *timed, td_err *err),     \
      (g, m, timed, err))                                                                          \
    X(td_gpu_set_deterministic, void, (td_gpu * g, bool on), (g, on))                              \
    X(td_gpu_set_batch, int,                                                                       \
      (td_gpu * g, td_model * m, const float *x, const int32_t *labels, int n, td_err *err),       \
      (g, m, x, labels, n, err))                                                                   \
    X(td_gpu_forward, void, (td_gpu * g, td_model * m, const td_run *run), (g, m, run))            \
    X(td_gpu_loss, void,                                                                           \
      (td_gpu * g, td_model * m, const td_loss *loss, int n, float grad_scale, bool backward,      \
       float total_weight),                                                                        \
      (g, m, loss, n, grad_scale, backward, total_weight))                                         \
    X(td_gpu_backward, void, (td_gpu * g, td_model * m, const td_run *run), (g, m, run))           \
    X(td_gpu_read, int, (td_gpu * g, const void *dev, size_t elems, float *host, td_err *err),     \
      (g, dev, elems, host, err))                                                                  \
    X(td_gpu_read_grads, int, (td_gpu * g, const td_model *m, float *host, td_err *err),           \
      (g, m, host, err))                                                                           \
    X(td_gpu_seek_dropout, int, (td_gpu * g, unsigned long long draws, td_err *err),               \
      (g, draws, err))                                                                             \
    X(td_gpu_take_totals, int, (td_gpu * g, double *loss_sum, double *hits, td_err *err),          \
      (g, loss_sum, hits, err))                                                                    \
    X(td_gpu_optim_init, int, (td_gpu * g, td_model * m, const td_optim *opt, td_err *err),        \
      (g, m, opt, err))                                                                            \
    X(td_gpu_optim_step, void, (td_gpu * g, td_model * m, float lr, float max_norm),               \
      (g, m, lr, max_norm))                                                                        \
    X(td_gpu_scaler_state, void, (td_gpu * g, float *scale, long *skipped), (g, scale, skipped))   \
    X(td_gpu_ddp_start, int,                                                                       \
      (td_gpu * g, td_model * m, td_store * store, int rank, int world, double bucket_cap_mb,      \
       double timeout_s, bool sync_bn, td_err *err),                                               \
      (g, m, store, rank, world, bucket_cap_mb, timeout_s, sync_bn, err))                          \
    X(td_gpu_ddp_begin, void, (td_gpu * g, td_run * run), (g, run))                                \
    X(td_gpu_ddp_finish, int, (td_gpu * g, td_err * err), (g, err))                                \
    X(td_gpu_ddp_allreduce_host, int,                                                              \
      (td_gpu * g, float *values, size_t n, bool average, td_err *err),                            \
      (g, values, n, average, err))                                                                \
    X(td_gpu_ddp_broadcast_params, int,                                                            \
      (td_gpu * g, td_model * m, bool buffers_only, td_err *err), (g, m, buffers_only, err))       \
    X(td_gpu_ddp_buckets, int, (const td_gpu *g), (g))                                             \
    X(td_gpu_graph_step, int,                                                                      \
      (td_gpu * g, td_model * m, const td_gpu_step_args *args, td_err *err), (g, m, args, err))

typedef struct gpu_library {
    void *handle;
    char error[1024];
#define X(name, ret, params, args) ret(*name) params;
    TD_GPU_FUNCTIONS(X)
#undef X
} gpu_library;

static gpu_library library;
static pthread_once_t library_once = PTHREAD_ONCE_INIT;

/* Beside the executable (the build tree, or an install's libexec), unless TRAIND_GPU_LIBRARY
 * names it. */
static void library_path(char *path, size_t len) {
    const char *env = getenv("TRAIND_GPU_LIBRARY");
    if (env && *env) {
        snprintf(path, len, "%s", env);
        return;
    }
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n <= 0) {
        snprintf(path, len, "libtraind_gpu.so");
        return;
    }
    exe[n] = '\0';
    char *slash = strrchr(exe, '/');
    if (slash) *slash = '\0';
    snprintf(path, len, "%s/libtraind_gpu.so", exe);
}

static void load_library(void) {
    char path[PATH_MAX + 32];
    library_path(path, sizeof path);
    library.handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!library.handle) {
        snprintf(library.error, sizeof library.error,
                 "cannot load the GPU backend (%.900s); set TRAIND_GPU_LIBRARY to its path",
                 dlerror());
        return;
    }
#define X(name, ret, params, args)                                                                 \
    if (!(library.name = (ret(*) params)dlsym(library.handle, #name))) {                           \
        snprintf(library.error, sizeof library.error, "%.900s: no symbol %s (a stale build?)",     \
                 path, #name);                                                                     \
        dlclose(library.handle);                                                                   \
        library.handle = NULL;                                                                     \
        return;                                                                                    \
    }
    TD_GPU_FUNCTIONS(X)
#undef X
}

int td_gpu_open(td_gpu **out, int device, td_err *err) {
    pthread_once(&library_once, load_library);
    if (!library.handle) {
        *out = NULL;
        return td_fail(err, "%s", library.error);
    }
    return library.td_gpu_open(out, device, err);
}

void td_gpu_close(td_gpu *g) {
    if (g) library.td_gpu_close(g); /* a td_gpu exists only if the library loaded */
}

/* A td_gpu exists only if td_gpu_open loaded the library. */
#define X(name, ret, params, args)                                                                 \
    ret name params {                                                                              \
        TD_ASSERT(library.handle, "the GPU backend is not loaded: no td_gpu_open succeeded");      \
        return library.name args;                                                                  \
    }
TD_GPU_FUNCTIONS_OF_A_GPU(X)
#undef X

/* Driver API entry points, declared here: the driver's header is not needed for three calls. */
typedef int (*cu_init_fn)(unsigned flags);
typedef int (*cu_count_fn)(int *count);
typedef int (*cu_error_fn)(int status, const char **text);

int td_gpu_device_count(char *why, size_t len) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        snprintf(why, len, "no NVIDIA driver (libcuda.so.1 not found)");
        return 0;
    }
    cu_init_fn init = (cu_init_fn)dlsym(cuda, "cuInit");
    cu_count_fn count_fn = (cu_count_fn)dlsym(cuda, "cuDeviceGetCount");
    cu_error_fn error_fn = (cu_error_fn)dlsym(cuda, "cuGetErrorString");
    int count = 0, rc = init && count_fn ? init(0) : -1;
    if (rc == 0) rc = count_fn(&count);
    if (rc != 0) {
        const char *text = NULL;
        if (error_fn) error_fn(rc, &text);
        snprintf(why, len, "no usable CUDA device: %s", text ? text : "the driver failed");
        count = 0;
    } else if (count == 0) {
        snprintf(why, len, "no CUDA device found (CUDA_VISIBLE_DEVICES=%s)",
                 getenv("CUDA_VISIBLE_DEVICES") ? getenv("CUDA_VISIBLE_DEVICES") : "unset");
    } else {
        snprintf(why, len, "%d CUDA device%s", count, count > 1 ? "s" : "");
    }
    /* the driver stays loaded: the backend will use it */
    return count;
}
