/* Losses, optimizers, clipping and schedules against values worked out by hand (the
 * arithmetic is in the comments). */
#include "core/td_loss.h"
#include "core/td_optim.h"
#include "core/td_schedule.h"

#include <criterion/criterion.h>
#include <math.h>

#define EXPECT_NEAR(got, want, tol)                                                                \
    cr_expect(fabs((double)(got) - (double)(want)) <= (tol), "%s = %.9g, expected %.9g", #got,     \
              (double)(got), (double)(want))

Test(loss, cross_entropy_value_and_gradient) {
    /* logits [1, 2, 3], label 2: softmax = [0.0900306, 0.2447285, 0.6652410],
     * loss = -log 0.6652410 = 0.4076059, gradient = softmax - onehot */
    float z[3] = {1, 2, 3}, dz[3];
    int32_t y = 2;
    int correct;
    td_loss loss = {TD_LOSS_CROSS_ENTROPY, 0};
    double l = td_loss_compute(&loss, z, &y, 1, 3, dz, 1.0f, &correct);
    EXPECT_NEAR(l, 0.4076059, 1e-6);
    EXPECT_NEAR(dz[0], 0.0900306, 1e-6);
    EXPECT_NEAR(dz[1], 0.2447285, 1e-6);
    EXPECT_NEAR(dz[2], -0.3347590, 1e-6);
    cr_expect_eq(correct, 1);
}

Test(loss, cross_entropy_label_smoothing) {
    /* ε = 0.1, 3 classes: target = [1/30, 1/30, 14/15]; -log p = [2.4076059, 1.4076059,
     * 0.4076059]; loss = (2.4076059 + 1.4076059)/30 + 0.4076059·14/15 = 0.5076059 */
    float z[3] = {1, 2, 3}, dz[3];
    int32_t y = 2;
    td_loss loss = {TD_LOSS_CROSS_ENTROPY, 0.1f};
    double l = td_loss_compute(&loss, z, &y, 1, 3, dz, 1.0f, NULL);
    EXPECT_NEAR(l, 0.5076059, 1e-6);
    EXPECT_NEAR(dz[0], 0.0900306 - 1.0 / 30, 1e-6);
    EXPECT_NEAR(dz[2], 0.6652410 - 14.0 / 15, 1e-6);
}

Test(loss, cross_entropy_batch_mean_and_stability) {
    /* huge logits must not overflow; the gradient is divided by the batch size */
    float z[4] = {1000, 0, 0, 1000}, dz[4];
    int32_t y[2] = {0, 0};
    int correct;
    td_loss loss = {TD_LOSS_CROSS_ENTROPY, 0};
    double l = td_loss_compute(&loss, z, y, 2, 2, dz, 1.0f, &correct);
    cr_expect(isfinite(l));
    EXPECT_NEAR(l, 1000.0, 1e-3); /* sample 0: 0, sample 1: 1000 */
    EXPECT_NEAR(dz[0], 0.0, 1e-6);
    EXPECT_NEAR(dz[2], -0.5, 1e-6); /* (0 - 1) / 2 */
    cr_expect_eq(correct, 1);
}

Test(loss, mse_against_one_hot) {
    /* logits [0.5, -1], label 0: d = [-0.5, -1]; mean over 2 = 0.625; grad = 2d/2 = d */
    float z[2] = {0.5f, -1}, dz[2];
    int32_t y = 0;
    td_loss loss = {TD_LOSS_MSE, 0};
    double l = td_loss_compute(&loss, z, &y, 1, 2, dz, 1.0f, NULL);
    EXPECT_NEAR(l, 0.625, 1e-7);
    EXPECT_NEAR(dz[0], -0.5, 1e-7);
    EXPECT_NEAR(dz[1], -1.0, 1e-7);
}

static float run_optim(td_optim_config cfg, const float *grads, int steps) {
    td_optim opt;
    td_optim_init(&opt, &cfg, 1);
    float p = 1.0f;
    for (int i = 0; i < steps; i++) td_optim_step(&opt, &p, &grads[i], cfg.lr);
    td_optim_free(&opt);
    return p;
}

Test(optim, sgd_momentum_weight_decay) {
    /* p=1, g=0.5, lr=0.1, wd=0.1: d = 0.6, buf = 0.6, p = 0.94;
     * then d = 0.5 + 0.094 = 0.594, buf = 0.9·0.6 + 0.594 = 1.134, p = 0.94 - 0.1134 = 0.8266 */
    td_optim_config c = {.kind = TD_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f, .weight_decay = 0.1f};
    float g[2] = {0.5f, 0.5f};
    EXPECT_NEAR(run_optim(c, g, 1), 0.94, 1e-6);
    EXPECT_NEAR(run_optim(c, g, 2), 0.8266, 1e-6);
}

/* nanoGPT's groups (decay "matrices"): the ranges without decay keep their values under a zero
 * gradient, the others shrink by 1 - lr·wd each step; split into parts or whole, the same. */
Test(optim, adamw_without_decay_on_given_ranges) {
    td_optim_config c = {.kind = TD_OPTIM_ADAMW,
                         .lr = 0.1f,
                         .weight_decay = 0.5f,
                         .beta1 = 0.9f,
                         .beta2 = 0.99f,
                         .eps = 1e-8f,
                         .decay_matrices = true};
    const size_t ranges[2][2] = {{1, 3}, {5, 6}};
    for (int parts = 1; parts <= 2; parts++) {
        td_optim opt;
        td_optim_init(&opt, &c, 7);
        td_optim_set_no_decay(&opt, ranges, 2);
        float p[7] = {1, 1, 1, 1, 1, 1, 1}, g[7] = {0};
        if (parts == 1) {
            td_optim_step(&opt, p, g, c.lr);
        } else { /* as the fused step hands it over: [0, 2) then [2, 7) */
            td_optim_step_part(&opt, p, g, c.lr, 0, 2);
            td_optim_step_part(&opt, p, g, c.lr, 2, 7);
            td_optim_step_end(&opt);
        }
        const float want[7] = {0.95f, 1, 1, 0.95f, 0.95f, 1, 0.95f};
        for (int i = 0; i < 7; i++) EXPECT_NEAR(p[i], want[i], 1e-7);
        td_optim_free(&opt);
    }
}

Test(optim, sgd_plain_and_dampening) {
    td_optim_config c = {.kind = TD_OPTIM_SGD, .lr = 0.5f};
    float g[2] = {0.2f, 0.4f};
    EXPECT_NEAR(run_optim(c, g, 2), 1.0 - 0.1 - 0.2, 1e-6);
    /* dampening 0.5: buf = 0.2, then 0.9·0.2 + 0.5·0.4 = 0.38; p = 1 - 0.1 - 0.19 = 0.71 */
    c.momentum = 0.9f;
    c.dampening = 0.5f;
    EXPECT_NEAR(run_optim(c, g, 2), 0.71, 1e-6);
}

Test(optim, sgd_nesterov) {
    /* d = 0.5, buf = 0.5, step uses d + 0.9·buf = 0.95: p = 1 - 0.095 = 0.905 */
    td_optim_config c = {.kind = TD_OPTIM_SGD, .lr = 0.1f, .momentum = 0.9f, .nesterov = true};
    float g[1] = {0.5f};
    EXPECT_NEAR(run_optim(c, g, 1), 0.905, 1e-6);
}

Test(optim, adam_two_steps) {
    /* step 1: m = 0.05, v = 0.00025, step_size = 0.1/0.1 = 1, denom = sqrt(0.25) = 0.5:
     *         p = 1 - 0.05/0.5 = 0.9 (Adam's first step moves by lr)
     * step 2 (g = 0.25): m = 0.07, v = 0.00031225, step_size = 0.1/0.19,
     *         denom = sqrt(0.00031225)/sqrt(0.001999) = 0.3952247, p = 0.9 - 0.0932181 */
    td_optim_config c = {
        .kind = TD_OPTIM_ADAM, .lr = 0.1f, .beta1 = 0.9f, .beta2 = 0.999f, .eps = 1e-8f};
    float g[2] = {0.5f, 0.25f};
    EXPECT_NEAR(run_optim(c, g, 1), 0.9, 1e-6);
    EXPECT_NEAR(run_optim(c, g, 2), 0.9 - 0.0932181, 2e-6);
}

Test(optim, adam_l2_vs_adamw_decoupled) {
    /* AdamW: p = 1·(1 - 0.1·0.1) = 0.99, then the Adam step of -0.1: 0.89.
     * Adam with wd: the decay enters the gradient (0.6), and its first step is still lr: 0.9 */
    td_optim_config c = {.kind = TD_OPTIM_ADAMW,
                         .lr = 0.1f,
                         .beta1 = 0.9f,
                         .beta2 = 0.999f,
                         .eps = 1e-8f,
                         .weight_decay = 0.1f};
    float g[1] = {0.5f};
    EXPECT_NEAR(run_optim(c, g, 1), 0.89, 1e-6);
    c.kind = TD_OPTIM_ADAM;
    EXPECT_NEAR(run_optim(c, g, 1), 0.9, 1e-6);
}

Test(optim, clip_global_norm) {
    float g[2] = {3, 4};
    double norm = td_grad_clip(g, 2, 1.0f);
    EXPECT_NEAR(norm, 5.0, 1e-9);
    EXPECT_NEAR(g[0], 0.6, 1e-6);
    EXPECT_NEAR(g[1], 0.8, 1e-6);
    float h[2] = {0.3f, 0.4f}; /* below the limit: untouched */
    td_grad_clip(h, 2, 1.0f);
    cr_expect(h[0] == 0.3f && h[1] == 0.4f);
}

Test(schedule, warmup_then_cosine) {
    td_schedule s = {.kind = TD_SCHED_COSINE, .warmup_steps = 10, .total_steps = 110};
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 0), 0.1, 1e-7);  /* (0+1)/10 */
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 9), 1.0, 1e-7);  /* last warmup step reaches base */
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 10), 1.0, 1e-7); /* cosine starts at base */
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 60), 0.5, 1e-6); /* halfway */
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 110), 0.0, 1e-6);
    s.min_lr = 0.1f;
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 60), 0.55, 1e-6);
}

Test(schedule, step_and_multistep) {
    td_schedule s = {.kind = TD_SCHED_STEP, .step_size = 30, .gamma = 0.1f, .total_steps = 100};
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 29), 1.0, 1e-7);
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 30), 0.1, 1e-7);
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 60), 0.01, 1e-8);
    td_schedule m = {.kind = TD_SCHED_MULTISTEP,
                     .gamma = 0.5f,
                     .n_milestones = 2,
                     .milestones = {5, 8},
                     .total_steps = 20};
    EXPECT_NEAR(td_schedule_lr(&m, 2.0f, 4), 2.0, 1e-7);
    EXPECT_NEAR(td_schedule_lr(&m, 2.0f, 5), 1.0, 1e-7);
    EXPECT_NEAR(td_schedule_lr(&m, 2.0f, 8), 0.5, 1e-7);
    /* milestones count after warmup */
    m.warmup_steps = 2;
    EXPECT_NEAR(td_schedule_lr(&m, 2.0f, 6), 2.0, 1e-7);
    EXPECT_NEAR(td_schedule_lr(&m, 2.0f, 7), 1.0, 1e-7);
}

Test(schedule, linear_and_constant) {
    td_schedule s = {.kind = TD_SCHED_LINEAR, .total_steps = 100, .end_factor = 0};
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 0), 1.0, 1e-7);
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 50), 0.5, 1e-7);
    EXPECT_NEAR(td_schedule_lr(&s, 1.0f, 100), 0.0, 1e-7);
    td_schedule c = {.kind = TD_SCHED_CONSTANT, .warmup_steps = 4, .total_steps = 10};
    EXPECT_NEAR(td_schedule_lr(&c, 0.4f, 1), 0.2, 1e-7);
    EXPECT_NEAR(td_schedule_lr(&c, 0.4f, 9), 0.4, 1e-7);
}
