/* Optimizers over the model's flat parameter block, with PyTorch's update rules (torch.optim,
 * one parameter group, weight decay applied to every parameter as PyTorch does by default):
 *  - sgd: g += wd·p; buf = g on the first step, then buf = momentum·buf + (1-dampening)·g;
 *         nesterov: g += momentum·buf, else g = buf; p -= lr·g.
 *  - adam: g += wd·p (L2); m, v moving averages; p -= lr/(1-β1^t) · m / (sqrt(v)/sqrt(1-β2^t) +
 * eps)
 *  - adamw: p *= 1 - lr·wd (decoupled), then Adam without the L2 term.
 * Global-norm clipping matches torch.nn.utils.clip_grad_norm_ (coefficient max/(norm+1e-6)).
 * decay_matrices: weight decay only on parameters of two or more dimensions (matrices and
 * embeddings), none on biases and norms' scales: nanoGPT's two parameter groups.
 */
#ifndef TD_OPTIM_H
#define TD_OPTIM_H

#include <stdbool.h>
#include <stddef.h>

typedef enum td_optim_kind { TD_OPTIM_SGD, TD_OPTIM_ADAM, TD_OPTIM_ADAMW } td_optim_kind;

typedef struct td_optim_config {
    td_optim_kind kind;
    float lr;
    float momentum, dampening;
    bool nesterov;
    float weight_decay;
    float beta1, beta2, eps;
    bool decay_matrices; /* train.optimizer.decay "matrices" (td_optim_set_no_decay) */
} td_optim_config;

/* fp16's dynamic loss scaling: torch.cuda.amp.GradScaler's state_dict ("scale",
 * "_growth_tracker": clean steps since the scale last changed) and the steps it skipped. Kept
 * with the optimizer so checkpoints carry it and a resumed fp16 run scales as the uninterrupted
 * one. scale 0: no scaler state (fp32, bf16, or none yet; the GPU starts fp16 at 65536). */
typedef struct td_grad_scaler {
    float scale;
    int growth_tracker;
    long skipped;
} td_grad_scaler;

typedef struct td_optim {
    td_optim_config cfg;
    size_t n;
    float *m, *v; /* SGD momentum buffer in m; Adam exp_avg in m, exp_avg_sq in v */
    long steps;   /* optimizer steps taken */
    td_grad_scaler scaler;
    int threads; /* the update is split over (core/td_parallel.h); td_optim_init sets 1 */
    /* [lo, hi) ranges of the block without weight decay, in order (decay_matrices) */
    int n_no_decay;
    size_t (*no_decay)[2];
} td_optim;

void td_optim_init(td_optim *opt, const td_optim_config *cfg, size_t n_params);
void td_optim_free(td_optim *opt);
/* The block's ranges that take no weight decay (sorted, disjoint), copied. */
void td_optim_set_no_decay(td_optim *opt, const size_t (*ranges)[2], int n);
/* One update of params from grads at learning rate lr (the schedule's value for this step). */
void td_optim_step(td_optim *opt, float *params, const float *grads, float lr);
/* The same update in parts: td_optim_step_part for [lo, hi) of the block, as each part's
 * gradients are ready (every part once), then td_optim_step_end. Each element's update is its
 * own, so the parts give td_optim_step's result to the bit. */
void td_optim_step_part(td_optim *opt, float *params, const float *grads, float lr, size_t lo,
                        size_t hi);
void td_optim_step_end(td_optim *opt);

/* The L2 norm of all gradients, computed in double. */
double td_grad_norm(const float *grads, size_t n);
/* Scales grads so their global norm is at most max_norm; returns the norm before clipping. */
double td_grad_clip(float *grads, size_t n, float max_norm);

#endif
