/* Learning-rate schedules, evaluated per optimizer step s (counting from 0).
 *
 * Warmup first: for s < warmup_steps, lr = base · (s+1) / warmup_steps (never 0, reaching base
 * on the last warmup step). The schedule then runs on t = s - warmup_steps over
 * T = total_steps - warmup_steps:
 *  - constant: base
 *  - step:      base · gamma^floor(t / step_size)                 (torch StepLR)
 *  - multistep: base · gamma^(number of milestones <= t)          (torch MultiStepLR)
 *  - cosine:    min_lr + (base - min_lr) · (1 + cos(pi·t/T)) / 2  (torch CosineAnnealingLR)
 *  - linear:    base · (1 + (end_factor - 1) · t/T)               (torch LinearLR, start 1)
 */
#ifndef TD_SCHEDULE_H
#define TD_SCHEDULE_H

#define TD_MAX_MILESTONES 32

typedef enum td_schedule_kind {
    TD_SCHED_CONSTANT,
    TD_SCHED_STEP,
    TD_SCHED_MULTISTEP,
    TD_SCHED_COSINE,
    TD_SCHED_LINEAR
} td_schedule_kind;

typedef struct td_schedule {
    td_schedule_kind kind;
    long warmup_steps;
    long step_size;
    float gamma;
    int n_milestones;
    long milestones[TD_MAX_MILESTONES];
    float min_lr;
    float end_factor;
    long total_steps; /* set by the trainer from epochs and max_steps */
} td_schedule;

float td_schedule_lr(const td_schedule *s, float base_lr, long step);

#endif
