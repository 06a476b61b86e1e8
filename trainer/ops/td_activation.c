/* Elementwise activations: ReLU and GELU (torch.nn.GELU, exact erf form or approximate="tanh"),
 * split over the node's threads in equal runs. */
#include "core/td_model.h"
#include "core/td_parallel.h"
#include "ops/td_ops_isa.h"

#include <math.h>
#include <omp.h>

static int same_shape_build(td_model *model, td_node *node, td_err *err) {
    (void)model;
    (void)err;
    node->out_shape = node->in_shape[0];
    return 0;
}

/* One thread's run [lo, hi) of each pass, as plain functions with restrict pointers: inside
 * OpenMP's outlined loop bodies GCC could not tell the arrays apart and left ReLU's backward
 * scalar and branching (23 ms instead of 3.7 for a ResNet layer1 ReLU). */
static void relu_run(float *restrict y, const float *restrict x, size_t lo, size_t hi) {
    /* as torch.relu, a NaN passes through rather than becoming 0, so it still reaches the loss */
    for (size_t i = lo; i < hi; i++) y[i] = x[i] <= 0.0f ? 0.0f : x[i];
}

/* the mask comes from the output, as PyTorch's threshold_backward does */
static void relu_grad_run(float *restrict dx, const float *restrict y, const float *restrict dy,
                          bool add, size_t lo, size_t hi) {
    if (add)
        for (size_t i = lo; i < hi; i++) dx[i] += y[i] > 0.0f ? dy[i] : 0.0f;
    else
        for (size_t i = lo; i < hi; i++) dx[i] = y[i] > 0.0f ? dy[i] : 0.0f;
}

static void relu_forward(td_node *node, const td_run *run) {
    size_t n = (size_t)run->n * td_shape_size(node->out_shape);
    int threads = td_par_threads_for(node->threads, n);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t lo, hi;
        td_par_range(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        relu_run(node->out, node->in[0], lo, hi);
    }
}

static void relu_backward(td_node *node, const td_run *run) {
    if (!node->in_grad[0]) return;
    size_t n = (size_t)run->n * td_shape_size(node->out_shape);
    int threads = td_par_threads_for(node->threads, n);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t lo, hi;
        td_par_range(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        relu_grad_run(node->in_grad[0], node->out, node->grad, node->in_grad_add[0], lo, hi);
    }
}

#define SQRT_2_OVER_PI 0.7978845608028654f
#define INV_SQRT_2     0.7071067811865476f
#define INV_SQRT_2PI   0.3989422804014327f
#define GELU_TANH_C    0.044715f

/* GCC vectorises these loops through libmvec's variants below. clang (the fuzzing build) knows
 * no vector erff without -fveclib, and fails a build whose "omp simd" loop it cannot vectorise:
 * plain loops there. */
#if defined(__clang__)
#define SIMD_LOOP
#else
#define SIMD_LOOP _Pragma("omp simd")
#endif

#if defined(__x86_64__) && defined(__GLIBC__) && !defined(__clang__)
/* glibc's libmvec (2.35 on) has erff, expf and tanhf for SSE2, AVX2 and AVX-512; math.h declares
 * them vectorisable only under -ffast-math, so they are declared so here. GCC then calls
 * _ZGV?N?v_erff on 4, 8 or 16 values at once (libm's own vector code, within a few ulp of the
 * scalar erff, as PyTorch's Sleef functions are) instead of the scalar erff at 3.5 ns a value:
 * the exact GELU was 15 of 95 ms a step of a small GPT. libm.so pulls libmvec in as needed. */
#pragma omp declare simd notinbranch
extern float erff(float);
#pragma omp declare simd notinbranch
extern float expf(float);
#pragma omp declare simd notinbranch
extern float tanhf(float);
#endif

/* One thread's run of each pass, restrict-qualified with a simd loop, as relu_run. */
static void gelu_run(float *restrict y, const float *restrict x, bool approx, size_t lo,
                     size_t hi) {
    if (approx) {
        SIMD_LOOP
        for (size_t i = lo; i < hi; i++) {
            float v = x[i];
            y[i] = 0.5f * v * (1.0f + tanhf(SQRT_2_OVER_PI * (v + GELU_TANH_C * v * v * v)));
        }
    } else {
        SIMD_LOOP
        for (size_t i = lo; i < hi; i++) y[i] = 0.5f * x[i] * (1.0f + erff(x[i] * INV_SQRT_2));
    }
}

/* GELU's derivative at v, both forms */
#pragma omp declare simd notinbranch
static inline float gelu_grad(float v, bool approx) {
    if (approx) {
        float t = tanhf(SQRT_2_OVER_PI * (v + GELU_TANH_C * v * v * v));
        return 0.5f * (1.0f + t) +
               0.5f * v * (1.0f - t * t) * SQRT_2_OVER_PI * (1.0f + 3.0f * GELU_TANH_C * v * v);
    }
    return 0.5f * (1.0f + erff(v * INV_SQRT_2)) + v * INV_SQRT_2PI * expf(-0.5f * v * v);
}

/* written or added: never 0 · dx, which an uninitialised NaN would survive */
static void gelu_grad_run(float *restrict dx, const float *restrict x, const float *restrict dy,
                          bool add, bool approx, size_t lo, size_t hi) {
    if (add) {
        SIMD_LOOP
        for (size_t i = lo; i < hi; i++) dx[i] += dy[i] * gelu_grad(x[i], approx);
    } else {
        SIMD_LOOP
        for (size_t i = lo; i < hi; i++) dx[i] = dy[i] * gelu_grad(x[i], approx);
    }
}

static void gelu_forward(td_node *node, const td_run *run) {
    size_t n = (size_t)run->n * td_shape_size(node->out_shape);
    bool approx = node->args[0] == 1;
    int threads = td_par_threads_for(node->threads, n);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t lo, hi;
        td_par_range(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        gelu_run(node->out, node->in[0], approx, lo, hi);
    }
}

static void gelu_backward(td_node *node, const td_run *run) {
    if (!node->in_grad[0]) return;
    size_t n = (size_t)run->n * td_shape_size(node->out_shape);
    bool add = node->in_grad_add[0], approx = node->args[0] == 1;
    int threads = td_par_threads_for(node->threads, n);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t lo, hi;
        td_par_range(n, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        gelu_grad_run(node->in_grad[0], node->in[0], node->grad, add, approx, lo, hi);
    }
}

const td_op TD_ISA_SYM(td_op_relu) = {&td_op_sig_relu, same_shape_build,     relu_forward,
                                      relu_backward,   TD_OP_VARIANTS(relu), TD_OP_RELU};
const td_op TD_ISA_SYM(td_op_gelu) = {&td_op_sig_gelu, same_shape_build,     gelu_forward,
                                      gelu_backward,   TD_OP_VARIANTS(gelu), 0};
