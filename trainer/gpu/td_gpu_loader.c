/* The GPU backend lives in its own shared library (libtraind_gpu.so: the CUDA sources with
 * cuBLAS, cuDNN and NCCL behind them), opened only when a job trains on a GPU. Linked directly,
 * those libraries cost every process ~0.3 s and ~200 MB at start, CPU jobs and the daemon's
 * short-lived tools included. Devices are counted through the driver (libcuda.so.1), which is
 * small and present exactly where a GPU can be used.
 *
 * The library exports one symbol, its table of functions (td_gpu_api), found here with one
 * dlsym; the trainer calls through the table. The library resolves what it uses of the engine
 * (td_fail, the ops, the store, the bucket plan) against this executable, which exports them
 * (-rdynamic; trainer/CMakeLists.txt lists them). The handle and table are process-wide, like the
 * dynamic loader's own state, and filled once under pthread_once. */
#include "gpu/td_gpu.h"

#include <dlfcn.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

typedef struct gpu_library {
    void *handle;
    const td_gpu_api *api; /* NULL: not loaded, the reason in error */
    char error[1024];
} gpu_library;

static gpu_library library;
static pthread_once_t library_once = PTHREAD_ONCE_INIT;

/* TRAIND_GPU_LIBRARY when set; else beside the executable (the build tree) when it is there;
 * else PREFIX/lib/traind/ of an installed PREFIX/bin/traind-worker (the traind-cuda package). */
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
    if (access(path, R_OK) == 0) return;
    char installed[PATH_MAX + 64];
    int n_installed =
        snprintf(installed, sizeof installed, "%s/../lib/traind/libtraind_gpu.so", exe);
    if (n_installed > 0 && (size_t)n_installed < len && access(installed, R_OK) == 0)
        memcpy(path, installed, (size_t)n_installed + 1);
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
    const td_gpu_api *api = dlsym(library.handle, TD_GPU_API_SYMBOL);
    if (!api)
        snprintf(library.error, sizeof library.error, "%.900s: no symbol %s (a stale build?)", path,
                 TD_GPU_API_SYMBOL);
    else if (api->size != sizeof *api) /* functions added or removed since it was built */
        snprintf(library.error, sizeof library.error,
                 "%.800s: its %s holds %zu bytes where this program expects %zu (a stale build?)",
                 path, TD_GPU_API_SYMBOL, api->size, sizeof *api);
    else {
        library.api = api;
        return;
    }
    dlclose(library.handle);
    library.handle = NULL;
}

const td_gpu_api *td_gpu_load(td_err *err) {
    pthread_once(&library_once, load_library);
    if (!library.api) td_fail(err, "%s", library.error);
    return library.api;
}

/* Driver API entry points, declared here: the driver's header is not needed for five calls. */
typedef int (*cu_init_fn)(unsigned flags);
typedef int (*cu_count_fn)(int *count);
typedef int (*cu_error_fn)(int status, const char **text);
typedef int (*cu_get_fn)(int *device, int ordinal);
typedef int (*cu_name_fn)(char *name, int len, int device);
typedef int (*cu_memory_fn)(size_t *bytes, int device);

int td_gpu_devices(td_gpu_device_info *out, int max, char *why, size_t len) {
    void *cuda = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (!cuda) {
        snprintf(why, len, "no NVIDIA driver (libcuda.so.1 not found)");
        return 0;
    }
    cu_init_fn init = (cu_init_fn)dlsym(cuda, "cuInit");
    cu_count_fn count_fn = (cu_count_fn)dlsym(cuda, "cuDeviceGetCount");
    cu_error_fn error_fn = (cu_error_fn)dlsym(cuda, "cuGetErrorString");
    cu_get_fn get_fn = (cu_get_fn)dlsym(cuda, "cuDeviceGet");
    cu_name_fn name_fn = (cu_name_fn)dlsym(cuda, "cuDeviceGetName");
    cu_memory_fn memory_fn = (cu_memory_fn)dlsym(cuda, "cuDeviceTotalMem_v2");
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
    /* what each one is, for the node's listing: a name or size the driver will not tell stays
     * empty (0), which the listing shows as unknown rather than failing the daemon */
    for (int i = 0; i < count && i < max; i++) {
        int device = 0;
        size_t bytes = 0;
        out[i] = (td_gpu_device_info){.index = i};
        if (!get_fn || get_fn(&device, i) != 0) continue;
        if (name_fn && name_fn(out[i].name, (int)sizeof out[i].name, device) != 0)
            out[i].name[0] = 0;
        out[i].name[sizeof out[i].name - 1] = 0;
        if (memory_fn && memory_fn(&bytes, device) == 0) out[i].memory_bytes = bytes;
    }
    /* the driver stays loaded: the backend will use it */
    return count;
}

int td_gpu_device_count(char *why, size_t len) {
    return td_gpu_devices(NULL, 0, why, len);
}
