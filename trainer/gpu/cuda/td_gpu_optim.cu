// The optimizer on the device, with td_optim.c's update rules (SGD with momentum, dampening,
// Nesterov and weight decay; Adam with L2; AdamW decoupled), over the flat fp32 blocks.
//
// A step is one or two kernels, all in-stream, so a captured graph replays it whole:
//  - when clipping or fp16 loss scaling is on, a deterministic two-stage reduction of the squared
//    (unscaled) gradient norm and of the inf/nan check: per-block partials in a fixed order, the
//    last block to finish (atomic ticket) sums them in a fixed order into g->norm_sq;
//  - the fused update: unscale, clip (torch.nn.utils.clip_grad_norm_'s coefficient), the rule,
//    the 16-bit copy of the new weights; a step whose gradients hold inf or nan leaves weights
//    and state untouched. The last block to finish advances the step counter and, in fp16, the
//    loss scale as torch.cuda.amp.GradScaler does (backoff 0.5 on inf, growth 2 after 2000 clean
//    steps).
// The gradients themselves are not rewritten (PyTorch unscales and clips them in place): the
// next backward overwrites them, and the update reads them once instead of twice.
#include "gpu/cuda/td_gpu_internal.h"

#include <math.h>
#include <string.h>

#define OPT_THREADS 256
#define NORM_BLOCKS 1024 // at most; the partials live in the state block

#define SCALER_INIT     65536.0f
#define SCALER_GROWTH   2.0f
#define SCALER_BACKOFF  0.5f
#define SCALER_INTERVAL 2000

// The small device state behind g->norm_sq, one allocation: the scalars the context points at,
// then what the reductions need.
typedef struct optim_state {
    double norm_sq;           // g->norm_sq: clipping's squared norm of the unscaled gradients
    long long steps;          // g->optim_steps
    long long skipped;        // g->scaler.skipped
    float lr;                 // g->lr
    float scale;              // g->scaler.scale: 65536 at first in fp16, 1 otherwise
    int growth_tracker;       // g->scaler.growth_tracker
    int found_inf;            // g->scaler.found_inf
    unsigned int norm_ticket; // blocks of the norm kernel done (0 between kernels)
    unsigned int step_ticket; // blocks of the update kernel done (0 between kernels)
    double partial[NORM_BLOCKS];
    int partial_bad[NORM_BLOCKS];
} optim_state;

static optim_state *state_of(td_gpu *g) {
    return (optim_state *)g->norm_sq;
}

// Failures of the calls that report through err.
static int take_failure(td_gpu *g, td_err *err) {
    if (!g->failed) return 0;
    td_fail(err, "%s", g->msg);
    return -1;
}

static bool aligned16(const void *a, const void *b, const void *c, const void *d) {
    return ((uintptr_t)a | (uintptr_t)b | (uintptr_t)c | (uintptr_t)d) % 16 == 0;
}

// PyTorch's GradScaler unscales by the reciprocal computed in double, then rounded to float.
static __device__ __forceinline__ float inv_scale_of(const optim_state *st) {
    return (float)(1.0 / (double)st->scale);
}

// ---- the gradient norm and the inf/nan check --------------------------------------------------

static __device__ __forceinline__ double warp_sum(double v) {
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// The block's sum in a fixed order (warps in order); the result is valid in thread 0.
static __device__ double block_sum(double v, double *shared) {
    v = warp_sum(v);
    int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    if (lane == 0) shared[warp] = v;
    __syncthreads();
    double s = 0.0;
    if (threadIdx.x == 0)
        for (int w = 0; w < (int)(blockDim.x / 32); w++) s += shared[w];
    __syncthreads(); // shared is reused by the caller's next reduction
    return s;
}

static __device__ __forceinline__ void check_one(float x, float inv, double *s, int *bad) {
    // the check looks at the gradients as backward left them (GradScaler's order)
    *bad |= !isfinite(x);
    float u = x * inv;
    *s += (double)u * u;
}

// Sum of squares in double (as td_grad_norm) and whether any gradient is inf or nan. Each
// thread's elements and order depend only on n and the grid, so the result is reproducible.
static __global__ void __launch_bounds__(OPT_THREADS)
    grad_check_kernel(const float *__restrict__ grads, size_t n, optim_state *st, bool unscale,
                      bool vec) {
    __shared__ double shared[OPT_THREADS / 32];
    __shared__ bool last;
    float inv = unscale ? inv_scale_of(st) : 1.0f;
    double s = 0.0;
    int bad = 0;
    size_t stride = (size_t)gridDim.x * blockDim.x,
           first = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    size_t n4 = vec ? n / 4 : 0;
    for (size_t k = first; k < n4; k += stride) {
        float4 q = reinterpret_cast<const float4 *>(grads)[k];
        check_one(q.x, inv, &s, &bad);
        check_one(q.y, inv, &s, &bad);
        check_one(q.z, inv, &s, &bad);
        check_one(q.w, inv, &s, &bad);
    }
    for (size_t i = n4 * 4 + first; i < n; i += stride) check_one(grads[i], inv, &s, &bad);

    double total = block_sum(s, shared);
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        st->partial[blockIdx.x] = total;
        st->partial_bad[blockIdx.x] = bad;
        __threadfence(); // the partial is visible before the ticket says it is there
        last = atomicAdd(&st->norm_ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last) return;

    // the last block: every partial is in; sum them in block order
    __threadfence();
    s = 0.0;
    bad = 0;
    for (unsigned b = threadIdx.x; b < gridDim.x; b += blockDim.x) {
        s += __ldcg(&st->partial[b]);
        bad |= __ldcg(&st->partial_bad[b]);
    }
    total = block_sum(s, shared);
    bad = __syncthreads_or(bad);
    if (threadIdx.x == 0) {
        st->norm_sq = total;
        st->found_inf = bad;
        st->norm_ticket = 0;
    }
}

// ---- the update -------------------------------------------------------------------------------

typedef struct update_args {
    float *p;
    const float *g;
    float *m, *v; // NULL where the rule keeps none
    size_t n;
    optim_state *st;
    td_optim_config cfg;
    float max_norm;      // > 0: clip
    bool scaler;         // fp16: unscale, skip on inf/nan, update the scale
    const float *lr_ptr; // the device lr (captured graphs), or NULL: lr_value
    float lr_value;
    const uint32_t *no_decay; // a bit per element: no weight decay (decay "matrices"); or NULL
    bool vec;
} update_args;

// What every element of this step shares, worked out once per thread.
typedef struct update_coef {
    float lr, wd, mom, damp, b1, b2, eps, step_size, bc2_sqrt, inv_scale, clip;
    bool sgd, first, nesterov, decoupled, unscale, clipping;
} update_coef;

static __device__ update_coef update_coef_of(const update_args &a) {
    const optim_state *st = a.st;
    const td_optim_config &c = a.cfg;
    update_coef k;
    k.lr = a.lr_ptr ? *a.lr_ptr : a.lr_value;
    k.wd = c.weight_decay;
    k.mom = c.momentum;
    k.damp = 1.0f - c.dampening;
    k.b1 = c.beta1;
    k.b2 = c.beta2;
    k.eps = c.eps;
    k.sgd = c.kind == TD_OPTIM_SGD;
    k.nesterov = c.nesterov;
    k.decoupled = c.kind == TD_OPTIM_ADAMW;
    long long steps = st->steps;
    k.first = steps == 0;
    long long t = steps + 1;
    float bc1 = 1.0f - powf(k.b1, (float)t), bc2 = 1.0f - powf(k.b2, (float)t);
    k.step_size = k.lr / bc1;
    k.bc2_sqrt = sqrtf(bc2);
    k.unscale = a.scaler;
    k.inv_scale = a.scaler ? inv_scale_of(st) : 1.0f;
    k.clipping = false;
    k.clip = 1.0f;
    if (a.max_norm > 0.0f) {
        // td_grad_clip: coefficient max/(norm + 1e-6) in double, applied only below 1 (a NaN
        // norm leaves the gradients as they are)
        double coef = a.max_norm / (sqrt(st->norm_sq) + 1e-6);
        if (coef < 1.0) {
            k.clipping = true;
            k.clip = (float)coef;
        }
    }
    return k;
}

// Element i's weight decay: none where the mask says so (biases and norms' scales, as the CPU's
// td_optim_set_no_decay ranges), else the configured one.
static __device__ __forceinline__ float decay_at(const update_coef &k, const uint32_t *no_decay,
                                                 size_t i) {
    return no_decay && (no_decay[i >> 5] >> (i & 31) & 1u) ? 0.0f : k.wd;
}

// One parameter, td_optim.c's expressions in its order.
static __device__ __forceinline__ void update_one(const update_coef &k, float wd, float &p,
                                                  float grad, float &m, float &v) {
    float d = grad;
    if (k.unscale) d *= k.inv_scale;
    if (k.clipping) d *= k.clip;
    if (k.sgd) {
        d += wd * p;
        if (k.mom != 0.0f) {
            float buf = k.first ? d : k.mom * m + k.damp * d;
            m = buf;
            d = k.nesterov ? d + k.mom * buf : buf;
        }
        p -= k.lr * d;
        return;
    }
    if (k.decoupled)
        p *= 1.0f - k.lr * wd;
    else
        d += wd * p;
    m = k.b1 * m + (1.0f - k.b1) * d;
    v = k.b2 * v + (1.0f - k.b2) * d * d;
    float denom = sqrtf(v) / k.bc2_sqrt + k.eps;
    p -= k.step_size * m / denom;
}

template <typename T> struct alignas(4 * sizeof(T)) pack4 { T e[4]; };

// T is the 16-bit type of params_half, or float when there is no 16-bit copy (half is NULL).
template <typename T>
static __global__ void __launch_bounds__(OPT_THREADS) update_kernel(update_args a, T *half) {
    __shared__ bool last;
    optim_state *st = a.st;
    bool skip = a.scaler && st->found_inf;
    if (!skip) {
        update_coef k = update_coef_of(a);
        size_t n4 = a.vec ? a.n / 4 : 0, items = n4 + (a.n - n4 * 4);
        TD_GRID_STRIDE(it, items) {
            if (it < n4) {
                float4 p = reinterpret_cast<float4 *>(a.p)[it];
                float4 g = reinterpret_cast<const float4 *>(a.g)[it];
                float4 m = make_float4(0, 0, 0, 0), v = m;
                if (a.m) m = reinterpret_cast<float4 *>(a.m)[it];
                if (a.v) v = reinterpret_cast<float4 *>(a.v)[it];
                size_t i0 = it * 4;
                update_one(k, decay_at(k, a.no_decay, i0), p.x, g.x, m.x, v.x);
                update_one(k, decay_at(k, a.no_decay, i0 + 1), p.y, g.y, m.y, v.y);
                update_one(k, decay_at(k, a.no_decay, i0 + 2), p.z, g.z, m.z, v.z);
                update_one(k, decay_at(k, a.no_decay, i0 + 3), p.w, g.w, m.w, v.w);
                reinterpret_cast<float4 *>(a.p)[it] = p;
                if (a.m) reinterpret_cast<float4 *>(a.m)[it] = m;
                if (a.v) reinterpret_cast<float4 *>(a.v)[it] = v;
                if (half) {
                    pack4<T> h;
                    h.e[0] = td_from_float<T>(p.x);
                    h.e[1] = td_from_float<T>(p.y);
                    h.e[2] = td_from_float<T>(p.z);
                    h.e[3] = td_from_float<T>(p.w);
                    reinterpret_cast<pack4<T> *>(half)[it] = h;
                }
            } else {
                size_t i = n4 * 4 + (it - n4);
                float p = a.p[i], m = a.m ? a.m[i] : 0.0f, v = a.v ? a.v[i] : 0.0f;
                update_one(k, decay_at(k, a.no_decay, i), p, a.g[i], m, v);
                a.p[i] = p;
                if (a.m) a.m[i] = m;
                if (a.v) a.v[i] = v;
                if (half) half[i] = td_from_float<T>(p);
            }
        }
    }

    // The last block to finish advances the state that every block read above.
    __syncthreads();
    if (threadIdx.x == 0) {
        __threadfence();
        last = atomicAdd(&st->step_ticket, 1u) == gridDim.x - 1;
    }
    __syncthreads();
    if (!last || threadIdx.x != 0) return;
    __threadfence();
    if (!skip) st->steps += 1;
    if (a.scaler) {
        // torch's _amp_update_scale_
        if (skip) {
            st->scale *= SCALER_BACKOFF;
            st->growth_tracker = 0;
            st->skipped += 1;
        } else if (st->growth_tracker + 1 == SCALER_INTERVAL) {
            float grown = st->scale * SCALER_GROWTH;
            if (isfinite(grown)) st->scale = grown;
            st->growth_tracker = 0;
        } else {
            st->growth_tracker += 1;
        }
    }
    st->step_ticket = 0;
}

template <typename T>
static void update_launch(td_gpu *g, const update_args &a, void *half, cudaStream_t stream) {
    size_t n4 = a.vec ? a.n / 4 : 0, items = n4 + (a.n - n4 * 4);
    update_kernel<T><<<td_gpu_blocks(items, OPT_THREADS), OPT_THREADS, 0, stream>>>(a, (T *)half);
    TD_LAUNCHED(g);
}

// lr_ptr: read lr from the device at execution (a captured step); NULL: lr_value now.
static void optim_queue(td_gpu *g, size_t n, float max_norm, cudaStream_t stream,
                        const float *lr_ptr, float lr_value) {
    if (!g->optim_ready) {
        td_gpu_fail(g, __FILE__, __LINE__, "optimizer step", "the optimizer is not on the GPU",
                    "call td_gpu_optim_init after td_gpu_attach");
        return;
    }
    optim_state *st = state_of(g);
    bool scaler = g->prec == TD_PREC_FP16;
    bool clip = max_norm > 0.0f;
    if (clip || scaler) {
        size_t per_block = (size_t)OPT_THREADS * 16;
        size_t blocks = (n + per_block - 1) / per_block;
        blocks = blocks < 1 ? 1 : blocks > NORM_BLOCKS ? NORM_BLOCKS : blocks;
        grad_check_kernel<<<(unsigned)blocks, OPT_THREADS, 0, stream>>>(
            g->grads, n, st, scaler, aligned16(g->grads, NULL, NULL, NULL));
        TD_LAUNCHED(g);
    }
    update_args a;
    a.p = g->params;
    a.g = g->grads;
    a.m = g->m;
    a.v = g->v;
    a.n = n;
    a.st = st;
    a.cfg = g->optim;
    a.max_norm = max_norm;
    a.scaler = scaler;
    a.lr_ptr = lr_ptr;
    a.lr_value = lr_value;
    a.no_decay = g->no_decay;
    void *half = g->prec == TD_PREC_FP32 ? NULL : g->params_half;
    a.vec = aligned16(a.p, a.g, a.m, a.v) && (uintptr_t)half % 8 == 0;
    if (!half)
        update_launch<float>(g, a, NULL, stream);
    else if (g->prec == TD_PREC_BF16)
        update_launch<__nv_bfloat16>(g, a, half, stream);
    else
        update_launch<__half>(g, a, half, stream);
}

// The learning rate a captured step reads at replay, written in-stream just before it: a kernel's
// argument is fixed at launch, so the host never waits for the previous replay to have read it.
__global__ void set_lr_kernel(float *lr, float value) {
    *lr = value;
}

void td_gpu_optim_set_lr(td_gpu *g, float lr, cudaStream_t stream) {
    if (!g->optim_ready) return; // the step itself reports it
    set_lr_kernel<<<1, 1, 0, stream>>>(g->lr, lr);
    TD_LAUNCHED(g);
}

extern "C" void td_gpu_optim_step(td_gpu *g, td_model *m, float lr, float max_norm) {
    cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
    TD_CUDA(g, cudaStreamIsCapturing(g->stream, &capture));
    if (capture != cudaStreamCaptureStatusActive) {
        // eager: lr travels as a kernel argument, fixed at launch
        optim_queue(g, m->param_floats, max_norm, g->stream, NULL, lr);
        return;
    }
    // captured: the graph reads the device lr, which td_gpu_optim_set_lr writes before each
    // replay
    if (!g->optim_ready) {
        optim_queue(g, m->param_floats, max_norm, g->stream, NULL, lr); // records the failure
        return;
    }
    optim_queue(g, m->param_floats, max_norm, g->stream, g->lr, lr);
}

// ---- state: allocation, transfers -------------------------------------------------------------

void td_gpu_optim_free(td_gpu *g) {
    // m and v hold the attached model's param_floats: freed before the model is let go
    size_t bytes = g->model ? g->model->param_floats * sizeof(float) : 0;
    td_gpu_free(g, g->m, bytes);
    td_gpu_free(g, g->v, bytes);
    td_gpu_free(g, g->norm_sq, sizeof(optim_state));
    td_gpu_free(g, g->no_decay, g->no_decay_words * sizeof(uint32_t));
    g->no_decay = NULL;
    g->no_decay_words = 0;
    g->m = g->v = NULL;
    g->norm_sq = NULL;
    g->optim_steps = NULL;
    g->lr = NULL;
    memset(&g->scaler, 0, sizeof g->scaler);
    g->optim_ready = false;
}

int td_gpu_optim_alloc(td_gpu *g, size_t n, td_err *err) {
    td_gpu_optim_free(g);
    const td_optim_config *c = &g->optim;
    // as td_optim_init: SGD without momentum keeps no buffer, only Adam(W) keeps v
    if (c->kind != TD_OPTIM_SGD || c->momentum != 0.0f)
        g->m = (float *)td_gpu_malloc(g, n * sizeof(float), "the optimizer's first moments");
    if (c->kind != TD_OPTIM_SGD)
        g->v = (float *)td_gpu_malloc(g, n * sizeof(float), "the optimizer's second moments");
    optim_state *st = (optim_state *)td_gpu_malloc(g, sizeof(optim_state), "optimizer state");
    if (take_failure(g, err) != 0) return -1;
    g->norm_sq = &st->norm_sq;
    g->optim_steps = &st->steps;
    g->lr = &st->lr;
    g->scaler.scale = &st->scale;
    g->scaler.growth_tracker = &st->growth_tracker;
    g->scaler.found_inf = &st->found_inf;
    g->scaler.skipped = &st->skipped;

    float scale = g->prec == TD_PREC_FP16 ? SCALER_INIT : 1.0f;
    TD_CUDA_RET(g, cudaMemsetAsync(st, 0, sizeof(optim_state), g->stream), take_failure(g, err));
    TD_CUDA_RET(
        g, cudaMemcpyAsync(&st->scale, &scale, sizeof scale, cudaMemcpyHostToDevice, g->stream),
        take_failure(g, err));
    TD_CUDA_RET(g,
                cudaMemcpyAsync(&st->lr, &c->lr, sizeof c->lr, cudaMemcpyHostToDevice, g->stream),
                take_failure(g, err));
    if (g->m)
        TD_CUDA_RET(g, cudaMemsetAsync(g->m, 0, n * sizeof(float), g->stream),
                    take_failure(g, err));
    if (g->v)
        TD_CUDA_RET(g, cudaMemsetAsync(g->v, 0, n * sizeof(float), g->stream),
                    take_failure(g, err));
    TD_CUDA_RET(g, cudaStreamSynchronize(g->stream), take_failure(g, err));
    return 0;
}

// The elements without weight decay (td_optim_set_no_decay's ranges) as a bit mask on the device.
static int upload_no_decay(td_gpu *g, const td_optim *opt, td_err *err) {
    if (opt->n_no_decay == 0) return 0;
    size_t words = (opt->n + 31) / 32;
    uint32_t *mask = (uint32_t *)td_calloc(words, sizeof *mask);
    for (int r = 0; r < opt->n_no_decay; r++)
        for (size_t i = opt->no_decay[r][0]; i < opt->no_decay[r][1] && i < opt->n; i++)
            mask[i >> 5] |= 1u << (i & 31);
    g->no_decay = (uint32_t *)td_gpu_malloc(g, words * sizeof *mask, "the weight decay mask");
    g->no_decay_words = g->no_decay ? words : 0;
    // in-stream, then waited for: the host mask is pageable and freed right after
    cudaError_t e = g->no_decay ? cudaMemcpyAsync(g->no_decay, mask, words * sizeof *mask,
                                                  cudaMemcpyHostToDevice, g->stream)
                                : cudaSuccess;
    if (e == cudaSuccess) e = cudaStreamSynchronize(g->stream);
    free(mask);
    if (e != cudaSuccess)
        return td_fail(err, "copying the weight decay mask: %s", cudaGetErrorString(e));
    return take_failure(g, err);
}

extern "C" int td_gpu_optim_init(td_gpu *g, td_model *m, const td_optim *opt, td_err *err) {
    if (g->model != m)
        return td_fail(err, "td_gpu_optim_init: the model is not attached to this GPU");
    if (opt->n != m->param_floats)
        return td_fail(err, "td_gpu_optim_init: the optimizer holds %zu values, the model %zu",
                       opt->n, m->param_floats);
    g->optim = opt->cfg;
    if (td_gpu_optim_alloc(g, m->param_floats, err) != 0) return -1;
    g->optim_ready = true;
    if (upload_no_decay(g, opt, err) != 0) return -1;
    return td_gpu_optim_upload(g, opt, err);
}

int td_gpu_optim_upload(td_gpu *g, const td_optim *opt, td_err *err) {
    size_t n = g->model ? g->model->param_floats : 0;
    if (opt->n != n)
        return td_fail(err, "optimizer upload: %zu values for a model of %zu", opt->n, n);
    // a buffer the host does not have (a state saved under another rule) starts from zero
    if (g->m) {
        if (opt->m)
            TD_CUDA_RET(
                g,
                cudaMemcpyAsync(g->m, opt->m, n * sizeof(float), cudaMemcpyHostToDevice, g->stream),
                take_failure(g, err));
        else
            TD_CUDA_RET(g, cudaMemsetAsync(g->m, 0, n * sizeof(float), g->stream),
                        take_failure(g, err));
    }
    if (g->v) {
        if (opt->v)
            TD_CUDA_RET(
                g,
                cudaMemcpyAsync(g->v, opt->v, n * sizeof(float), cudaMemcpyHostToDevice, g->stream),
                take_failure(g, err));
        else
            TD_CUDA_RET(g, cudaMemsetAsync(g->v, 0, n * sizeof(float), g->stream),
                        take_failure(g, err));
    }
    long long steps = opt->steps;
    TD_CUDA_RET(
        g, cudaMemcpyAsync(g->optim_steps, &steps, sizeof steps, cudaMemcpyHostToDevice, g->stream),
        take_failure(g, err));
    // a resumed fp16 run goes on with the scale it had; without saved state it starts afresh
    long long skipped = opt->scaler.skipped;
    if (g->prec == TD_PREC_FP16 && opt->scaler.scale > 0.0f) {
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(g->scaler.scale, &opt->scaler.scale, sizeof(float),
                                    cudaMemcpyHostToDevice, g->stream),
                    take_failure(g, err));
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(g->scaler.growth_tracker, &opt->scaler.growth_tracker,
                                    sizeof(int), cudaMemcpyHostToDevice, g->stream),
                    take_failure(g, err));
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(g->scaler.skipped, &skipped, sizeof skipped,
                                    cudaMemcpyHostToDevice, g->stream),
                    take_failure(g, err));
    }
    TD_CUDA_RET(g, cudaStreamSynchronize(g->stream), take_failure(g, err));
    return take_failure(g, err);
}

int td_gpu_optim_download(td_gpu *g, td_optim *opt, td_err *err) {
    size_t n = g->model ? g->model->param_floats : 0;
    if (opt->n != n)
        return td_fail(err, "optimizer download: %zu values for a model of %zu", opt->n, n);
    if (g->m && opt->m)
        TD_CUDA_RET(
            g, cudaMemcpyAsync(opt->m, g->m, n * sizeof(float), cudaMemcpyDeviceToHost, g->stream),
            take_failure(g, err));
    if (g->v && opt->v)
        TD_CUDA_RET(
            g, cudaMemcpyAsync(opt->v, g->v, n * sizeof(float), cudaMemcpyDeviceToHost, g->stream),
            take_failure(g, err));
    long long steps = 0, skipped = 0;
    td_grad_scaler sc = {0.0f, 0, 0};
    TD_CUDA_RET(
        g, cudaMemcpyAsync(&steps, g->optim_steps, sizeof steps, cudaMemcpyDeviceToHost, g->stream),
        take_failure(g, err));
    if (g->prec == TD_PREC_FP16) {
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(&sc.scale, g->scaler.scale, sizeof(float),
                                    cudaMemcpyDeviceToHost, g->stream),
                    take_failure(g, err));
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(&sc.growth_tracker, g->scaler.growth_tracker, sizeof(int),
                                    cudaMemcpyDeviceToHost, g->stream),
                    take_failure(g, err));
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(&skipped, g->scaler.skipped, sizeof skipped,
                                    cudaMemcpyDeviceToHost, g->stream),
                    take_failure(g, err));
    }
    TD_CUDA_RET(g, cudaStreamSynchronize(g->stream), take_failure(g, err));
    opt->steps = (long)steps;
    sc.skipped = (long)skipped;
    opt->scaler = sc;
    return take_failure(g, err);
}

extern "C" void td_gpu_scaler_state(td_gpu *g, float *scale, long *skipped) {
    *scale = 1.0f;
    *skipped = 0;
    if (g->prec != TD_PREC_FP16 || !g->optim_ready) return;
    float s = 1.0f;
    long long k = 0;
    TD_CUDA(g, cudaMemcpyAsync(&s, g->scaler.scale, sizeof s, cudaMemcpyDeviceToHost, g->stream));
    TD_CUDA(g, cudaMemcpyAsync(&k, g->scaler.skipped, sizeof k, cudaMemcpyDeviceToHost, g->stream));
    TD_CUDA(g, cudaStreamSynchronize(g->stream));
    *scale = s;
    *skipped = (long)k;
}

float *td_gpu_loss_scale_ptr(td_gpu *g) {
    // fp32 and bf16 need no loss scaling: NULL tells the loss kernel to multiply by nothing
    return g->prec == TD_PREC_FP16 && g->optim_ready ? g->scaler.scale : NULL;
}
