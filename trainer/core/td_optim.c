#include "core/td_optim.h"

#include "core/td_error.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

void td_optim_init(td_optim *opt, const td_optim_config *cfg, size_t n_params) {
    memset(opt, 0, sizeof *opt);
    opt->cfg = *cfg;
    opt->n = n_params;
    bool momentum = cfg->kind != TD_OPTIM_SGD || cfg->momentum != 0.0f;
    if (momentum) opt->m = td_aligned_alloc(n_params * sizeof(float));
    if (cfg->kind != TD_OPTIM_SGD) opt->v = td_aligned_alloc(n_params * sizeof(float));
}

void td_optim_free(td_optim *opt) {
    free(opt->m);
    free(opt->v);
    memset(opt, 0, sizeof *opt);
}

static void sgd_step(td_optim *opt, float *p, const float *g, float lr) {
    const td_optim_config *c = &opt->cfg;
    float wd = c->weight_decay, mom = c->momentum, damp = 1.0f - c->dampening;
    bool first = opt->steps == 0;
    for (size_t i = 0; i < opt->n; i++) {
        float d = g[i] + wd * p[i];
        if (mom != 0.0f) {
            float buf = first ? d : mom * opt->m[i] + damp * d;
            opt->m[i] = buf;
            d = c->nesterov ? d + mom * buf : buf;
        }
        p[i] -= lr * d;
    }
}

static void adam_step(td_optim *opt, float *p, const float *g, float lr) {
    const td_optim_config *c = &opt->cfg;
    long t = opt->steps + 1;
    float b1 = c->beta1, b2 = c->beta2, wd = c->weight_decay;
    float bc1 = 1.0f - powf(b1, (float)t), bc2 = 1.0f - powf(b2, (float)t);
    float step_size = lr / bc1, bc2_sqrt = sqrtf(bc2);
    bool decoupled = c->kind == TD_OPTIM_ADAMW;
    for (size_t i = 0; i < opt->n; i++) {
        float d = g[i];
        if (decoupled)
            p[i] *= 1.0f - lr * wd;
        else
            d += wd * p[i];
        opt->m[i] = b1 * opt->m[i] + (1.0f - b1) * d;
        opt->v[i] = b2 * opt->v[i] + (1.0f - b2) * d * d;
        float denom = sqrtf(opt->v[i]) / bc2_sqrt + c->eps;
        p[i] -= step_size * opt->m[i] / denom;
    }
}

void td_optim_step(td_optim *opt, float *params, const float *grads, float lr) {
    if (opt->cfg.kind == TD_OPTIM_SGD)
        sgd_step(opt, params, grads, lr);
    else
        adam_step(opt, params, grads, lr);
    opt->steps++;
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
