#include "core/td_schedule.h"

#include <math.h>

float td_schedule_lr(const td_schedule *s, float base_lr, long step) {
    if (step < s->warmup_steps) return base_lr * (float)(step + 1) / (float)s->warmup_steps;
    long t = step - s->warmup_steps;
    long span = s->total_steps - s->warmup_steps;
    if (span < 1) span = 1;
    if (t > span) t = span;
    switch (s->kind) {
    case TD_SCHED_CONSTANT:
        return base_lr;
    case TD_SCHED_STEP:
        return base_lr * powf(s->gamma, (float)(t / s->step_size));
    case TD_SCHED_MULTISTEP: {
        int passed = 0;
        for (int i = 0; i < s->n_milestones; i++) passed += s->milestones[i] <= t;
        return base_lr * powf(s->gamma, (float)passed);
    }
    case TD_SCHED_COSINE:
        return s->min_lr +
               (base_lr - s->min_lr) * 0.5f * (1.0f + (float)cos(M_PI * (double)t / (double)span));
    case TD_SCHED_LINEAR:
        return base_lr * (1.0f + (s->end_factor - 1.0f) * (float)t / (float)span);
    }
    return base_lr;
}
