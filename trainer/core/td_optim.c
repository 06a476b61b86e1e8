#include "core/td_optim.h"

#include "base/td_error.h"
#include "core/td_isa.h"
#include "core/td_parallel.h"

#include <math.h>
#include <omp.h>
#include <stdlib.h>
#include <string.h>

void td_optim_init(td_optim *opt, const td_optim_config *cfg, size_t n_params) {
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    opt->n = n_params;
    opt->threads = 1;
    bool momentum = cfg->kind != TD_OPTIM_SGD || cfg->momentum != 0.0f;
    if (momentum) opt->m = td_aligned_alloc(n_params * sizeof(float));
    if (cfg->kind != TD_OPTIM_SGD) opt->v = td_aligned_alloc(n_params * sizeof(float));
}

void td_optim_set_no_decay(td_optim *opt, const size_t (*ranges)[2], int n) {
    free(opt->no_decay);
    opt->no_decay = n ? td_malloc((size_t)n * sizeof *opt->no_decay) : NULL;
    if (n) memcpy(opt->no_decay, ranges, (size_t)n * sizeof *opt->no_decay);
    opt->n_no_decay = n;
}

void td_optim_free(td_optim *opt) {
    free(opt->m);
    free(opt->v);
    free(opt->no_decay);
    memset(opt, 0, sizeof *opt);
}

/* One loop per case, with restrict: the general loop's branches and its loads of opt->m through
 * the struct (which could alias p) kept GCC from vectorising it, and the update streams 5 floats
 * per parameter through memory (1.2 ms of a 5.3 ms MLP step). The arithmetic, and so every
 * bit of the result, is the general loop's. Every element's update is its own, so splitting the
 * loops over threads changes no bit either: each thread runs its part [lo, hi) through these
 * same functions (OpenMP's outlined loop bodies lose restrict, and with it the vectorising). */
static inline __attribute__((always_inline)) void sgd_body(const td_optim *opt, float *restrict p,
                                                           const float *restrict g,
                                                           float *restrict m, float lr, float wd,
                                                           size_t lo, size_t hi) {
    const td_optim_config *c = &opt->cfg;
    const float mom = c->momentum, damp = 1.0f - c->dampening;
    if (mom == 0.0f) {
        for (size_t i = lo; i < hi; i++) p[i] -= lr * (g[i] + wd * p[i]);
    } else if (opt->steps == 0) { /* the buffer starts as the first gradient */
        for (size_t i = lo; i < hi; i++) {
            float d = g[i] + wd * p[i];
            m[i] = d;
            p[i] -= lr * (c->nesterov ? d + mom * d : d);
        }
    } else if (!c->nesterov) {
        for (size_t i = lo; i < hi; i++) {
            float buf = mom * m[i] + damp * (g[i] + wd * p[i]);
            m[i] = buf;
            p[i] -= lr * buf;
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            float d = g[i] + wd * p[i];
            float buf = mom * m[i] + damp * d;
            m[i] = buf;
            p[i] -= lr * (d + mom * buf);
        }
    }
}

/* Adam and AdamW, restrict-qualified and without a branch in the loop, as sgd_body. */
static inline __attribute__((always_inline)) void
adam_body(const td_optim *opt, float *restrict p, const float *restrict g, float *restrict m,
          float *restrict v, float lr, float wd, size_t lo, size_t hi) {
    const td_optim_config *c = &opt->cfg;
    long t = opt->steps + 1;
    const float b1 = c->beta1, b2 = c->beta2, eps = c->eps;
    const float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    const float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2), keep = 1.0f - lr * wd;
    if (c->kind == TD_OPTIM_ADAMW) { /* decoupled weight decay */
        for (size_t i = lo; i < hi; i++) {
            float d = g[i];
            p[i] *= keep;
            m[i] = b1 * m[i] + (1.0f - b1) * d;
            v[i] = b2 * v[i] + (1.0f - b2) * d * d;
            p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
        }
    } else {
        for (size_t i = lo; i < hi; i++) {
            float d = g[i] + wd * p[i];
            m[i] = b1 * m[i] + (1.0f - b1) * d;
            v[i] = b2 * v[i] + (1.0f - b2) * d * d;
            p[i] -= step_size * m[i] / (sqrtf(v[i]) / bc2_sqrt + eps);
        }
    }
}

/* Each loop twice: for baseline x86-64 (SSE2, 4 floats an instruction) and, where the process's
 * instruction set is AVX2 or better (core/td_isa.h), for AVX2 (8 floats). Without FMA: AVX2
 * alone gives GCC no fused multiply-add to contract into, so both do the same IEEE operations
 * on every element and give the same bits, as replicas on different CPUs must (a rank on an
 * AVX-512 Xeon and one on an AVX2-only EPYC stay identical). Half the instructions: the SSE2
 * loop was bound by its arithmetic rather than by memory (MLP: 0.275 ms a step). */
static void sgd_run(const td_optim *opt, float *restrict p, const float *restrict g,
                    float *restrict m, float lr, float wd, size_t lo, size_t hi) {
    sgd_body(opt, p, g, m, lr, wd, lo, hi);
}

static void adam_run(const td_optim *opt, float *restrict p, const float *restrict g,
                     float *restrict m, float *restrict v, float lr, float wd, size_t lo,
                     size_t hi) {
    adam_body(opt, p, g, m, v, lr, wd, lo, hi);
}

#if defined(__x86_64__)
__attribute__((target("avx2"))) static void sgd_run_avx2(const td_optim *opt, float *restrict p,
                                                         const float *restrict g, float *restrict m,
                                                         float lr, float wd, size_t lo, size_t hi) {
    sgd_body(opt, p, g, m, lr, wd, lo, hi);
}

__attribute__((target("avx2"))) static void
adam_run_avx2(const td_optim *opt, float *restrict p, const float *restrict g, float *restrict m,
              float *restrict v, float lr, float wd, size_t lo, size_t hi) {
    adam_body(opt, p, g, m, v, lr, wd, lo, hi);
}
#else /* td_isa_active() is always baseline there */
#define sgd_run_avx2  sgd_run
#define adam_run_avx2 adam_run
#endif

static void step_range(td_optim *opt, float *params, const float *grads, float lr, float wd,
                       size_t lo, size_t hi) {
    if (hi <= lo) return;
    const int threads = td_par_threads_for(opt->threads, hi - lo);
    const bool avx2 = td_isa_active() != TD_ISA_BASELINE;
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t a, b;
        td_par_range(hi - lo, omp_get_num_threads(), omp_get_thread_num(), 16, &a, &b);
        if (opt->cfg.kind == TD_OPTIM_SGD)
            (avx2 ? sgd_run_avx2 : sgd_run)(opt, params, grads, opt->m, lr, wd, lo + a, lo + b);
        else
            (avx2 ? adam_run_avx2 : adam_run)(opt, params, grads, opt->m, opt->v, lr, wd, lo + a,
                                              lo + b);
    }
}

/* [lo, hi) in runs with and without weight decay (the no_decay ranges) */
void td_optim_step_part(td_optim *opt, float *params, const float *grads, float lr, size_t lo,
                        size_t hi) {
    const float wd = opt->cfg.weight_decay;
    size_t at = lo;
    for (int k = 0; k < opt->n_no_decay && at < hi; k++) {
        size_t a = opt->no_decay[k][0], b = opt->no_decay[k][1];
        if (b <= at) continue;
        if (a >= hi) break;
        if (a > at) step_range(opt, params, grads, lr, wd, at, a);
        size_t from = a > at ? a : at, to = b < hi ? b : hi;
        step_range(opt, params, grads, lr, 0.0f, from, to);
        at = to;
    }
    step_range(opt, params, grads, lr, wd, at, hi);
}

void td_optim_step_end(td_optim *opt) {
    opt->steps++;
}

void td_optim_step(td_optim *opt, float *params, const float *grads, float lr) {
    td_optim_step_part(opt, params, grads, lr, 0, opt->n);
    td_optim_step_end(opt);
}

double td_grad_norm(const float *grads, size_t n) {
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += (double)grads[i] * grads[i];
    return sqrt(s);
}

double td_grad_clip(float *grads, size_t n, float max_norm) {
    double norm = td_grad_norm(grads, n);
    double coef = max_norm / (norm + 1e-6);
    if (coef < 1.0)
        for (size_t i = 0; i < n; i++) grads[i] *= (float)coef;
    return norm;
}
