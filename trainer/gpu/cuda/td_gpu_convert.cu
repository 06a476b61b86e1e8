// Conversions from fp32 to the compute precision on the device: a batch as copied in, and the
// 16-bit copy of the parameters after they change outside a step (a checkpoint loaded, a
// broadcast). The optimizer's update writes its own 16-bit copy as it goes (td_gpu_optim.cu).
#include "gpu/cuda/td_gpu_internal.h"

#define CONVERT_THREADS 256

template <typename T> struct alignas(4 * sizeof(T)) narrow_pack4 { T e[4]; };

template <typename T>
static __global__ void __launch_bounds__(CONVERT_THREADS)
    narrow_kernel(const float *__restrict__ src, T *__restrict__ dst, size_t n, bool vec) {
    size_t n4 = vec ? n / 4 : 0, items = n4 + (n - n4 * 4);
    TD_GRID_STRIDE(it, items) {
        if (it < n4) {
            float4 q = reinterpret_cast<const float4 *>(src)[it];
            narrow_pack4<T> h;
            h.e[0] = td_from_float<T>(q.x);
            h.e[1] = td_from_float<T>(q.y);
            h.e[2] = td_from_float<T>(q.z);
            h.e[3] = td_from_float<T>(q.w);
            reinterpret_cast<narrow_pack4<T> *>(dst)[it] = h;
        } else {
            size_t i = n4 * 4 + (it - n4);
            dst[i] = td_from_float<T>(src[i]);
        }
    }
}

template <typename T>
static void narrow(td_gpu *g, const float *src, void *dst, size_t n, cudaStream_t stream) {
    bool vec = (uintptr_t)src % 16 == 0 && (uintptr_t)dst % (4 * sizeof(T)) == 0;
    size_t n4 = vec ? n / 4 : 0, items = n4 + (n - n4 * 4);
    narrow_kernel<T><<<td_gpu_blocks(items, CONVERT_THREADS), CONVERT_THREADS, 0, stream>>>(
        src, (T *)dst, n, vec);
    TD_LAUNCHED(g);
}

// fp32 -> the compute precision, src and dst both device memory (the fp32 batch as copied).
void td_gpu_convert_in(td_gpu *g, const float *src, void *dst, size_t n, cudaStream_t stream) {
    if (n == 0) return;
    if (g->prec == TD_PREC_FP32) {
        if ((const void *)src != dst)
            TD_CUDA(g, cudaMemcpyAsync(dst, src, n * sizeof(float), cudaMemcpyDefault, stream));
        return;
    }
    TD_GPU_DISPATCH(g->prec, T, narrow<T>(g, src, dst, n, stream));
}

void td_gpu_refresh_half(td_gpu *g, size_t n, cudaStream_t stream) {
    if (g->prec == TD_PREC_FP32 || !g->params_half || n == 0) return;
    TD_GPU_DISPATCH(g->prec, T, narrow<T>(g, g->params, g->params_half, n, stream));
}
