/* The training loop and the module's entry points (td_train.h). The loop reads as the run goes:
 * epochs, batches, a step (td_train_step.c), then the train line, evaluation and checkpoints as
 * they fall due. The parts it calls, and the file of each, are listed in td_train_private.h. */
#include "train/td_train_private.h"

#include "base/td_clock.h"
#include "train/td_metrics.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* What the loop tracks besides the state a checkpoint saves: its extent, and the throughput of
 * what this process ran. */
typedef struct loop {
    td_schedule sched;          /* spanning the whole run, even where this process stops early */
    int batches;                /* per epoch */
    long total, stop;           /* the run's steps; where this process stops (--stop-after) */
    double t_start, t_interval; /* this process's start, the open logging interval's */
    long interval_samples, interval_steps, total_samples, steps;
    long val_step; /* the step of the last validation pass; -1: none yet */
} loop;

static bool profile_requested(void) {
    const char *profile = getenv("TRAIND_PROFILE");
    return profile && *profile && strcmp(profile, "0") != 0;
}

/* The run's extent and the model's training settings, before the first batch. */
static int start(trainer *t, loop *L, td_run *run, td_err *err) {
    const td_job *job = t->job;
    *L = (loop){.sched = job->train.schedule, .val_step = -1};
    /* an optimizer step every grad_accum batches (the last group of an epoch may be short) */
    L->batches = td_loader_batches(&t->train, &t->train_cfg);
    int steps_per_epoch = (L->batches + job->train.grad_accum - 1) / job->train.grad_accum;
    if (steps_per_epoch == 0)
        return td_fail(err, "train.batch_size: %d with drop_last leaves no batch from %d samples",
                       job->train.batch_size, t->train.n);
    L->total = (long)steps_per_epoch * job->train.epochs;
    if (job->train.max_steps > 0 && job->train.max_steps < L->total)
        L->total = job->train.max_steps;
    L->sched.total_steps = L->total;
    /* --stop-after: leave as if preempted, the schedule still spanning the whole run */
    L->stop = L->total;
    if (t->opt && t->opt->stop_after_steps > 0 && t->opt->stop_after_steps < L->stop)
        L->stop = t->opt->stop_after_steps;

    *run = (td_run){.training = true, .rng = &t->state.dropout_rng};
    if (t->sync.sum) run->sync = &t->sync; /* SyncBatchNorm over the ranks (td_train_join) */
    if (t->gpu && profile_requested())
        fprintf(t->log, "[traind] TRAIND_PROFILE: per-node times are not measured on the GPU "
                        "(use nsys); ignored\n");
    /* TRAIND_PROFILE=1: per-node times of the training steps, printed at the end */
    t->profiling = !t->gpu && profile_requested();
    /* TRAIND_FUSE_OPTIMIZER=0: the optimizer after backward, as one pass (for comparing) */
    const char *fuse = getenv("TRAIND_FUSE_OPTIMIZER");
    t->fuse_optimizer = !(fuse && strcmp(fuse, "0") == 0);
    L->t_start = L->t_interval = td_clock_now();
    return 0;
}

/* GPU memory this process holds, now and at most, with fp16's loss scale when it applies. */
static void gpu_memory(trainer *t, td_metric_train *m) {
    size_t in_use, peak;
    t->gpu_api->memory(t->gpu, &in_use, &peak);
    m->gpu = true;
    m->gpu_mem_mb = in_use / 1048576.0;
    m->gpu_mem_peak_mb = peak / 1048576.0;
    if (t->device.precision == TD_PREC_FP16) {
        float scale;
        long skipped;
        t->gpu_api->scaler_state(t->gpu, &scale, &skipped);
        m->fp16 = true;
        m->loss_scale = scale;
        m->skipped_steps = skipped;
    }
}

/* The train line closes the logging interval. Its loss covers the whole interval (after a
 * resume, partly run by the earlier process); its timings only what this process ran. */
static int log_train(trainer *t, loop *L, float lr, td_train_result *res, td_err *err) {
    td_train_state *st = &t->state;
    if (t->gpu) {
        if (td_train_gpu_flush_loss(t, err) != 0) return -1;
        /* divergence shows at log lines here, not at the very step */
        double mean = st->interval_loss / st->interval_steps;
        if (!isfinite(mean)) return td_train_diverged(err, mean, st->step, st->epoch + 1);
        res->last_loss = mean;
    }
    double now = td_clock_now(), dt = now - L->t_interval;
    if (t->rank0) {
        td_metric_train m = {.step = st->step,
                             .epoch = st->epoch + 1,
                             .loss = st->interval_loss / st->interval_steps,
                             .lr = lr,
                             .samples_per_s = L->interval_samples / dt,
                             .step_ms = dt * 1000.0 / L->interval_steps,
                             .total_steps = L->total,
                             .epochs = t->job->train.epochs};
        if (t->gpu) gpu_memory(t, &m);
        td_metrics_train(t->metrics, &m);
    }
    st->interval_loss = 0;
    st->interval_steps = 0;
    L->interval_samples = L->interval_steps = 0;
    L->t_interval = now;
    return 0;
}

/* What an eval line says: data.val's loss and accuracy, and a language model's estimated
 * training loss and perplexity. */
static int eval_line(trainer *t, td_metric_eval *e, td_err *err) {
    *e = (td_metric_eval){
        .epoch = t->state.epoch, .step = t->state.step, .language_model = t->positions > 1};
    if (td_train_eval_pass(t, &e->val_loss, &e->val_acc, err) != 0) return -1;
    return td_train_estimate_loss(t, &e->loss, err);
}

/* After an epoch (t->state.epoch counts it done) or every train.eval_every_steps: evaluation,
 * its line, and one for people. */
static int evaluate(trainer *t, loop *L, td_train_result *res, td_err *err) {
    double t0 = td_clock_now();
    td_metric_eval e;
    if (eval_line(t, &e, err) != 0) return -1;
    res->val_loss = e.val_loss;
    res->val_acc = e.val_acc;
    res->has_val = true;
    L->val_step = t->state.step;
    if (t->rank0) td_metrics_eval(t->metrics, &e);
    td_train_sample(t);
    char estimate[48] = "";
    if (!isnan(e.loss)) snprintf(estimate, sizeof estimate, "loss %.4f (estimated), ", e.loss);
    fprintf(t->log, "[traind] epoch %d, step %ld: %sval_loss %.4f, val_acc %.4f (eval %.2fs)\n",
            t->state.epoch, t->state.step, estimate, res->val_loss, res->val_acc,
            td_clock_now() - t0);
    L->t_interval += td_clock_now() - t0; /* evaluation time is not training throughput */
    return 0;
}

/* The end: stopped early on request, a checkpoint and no final line; else the last checkpoint,
 * an evaluation unless the last epoch had one, and the done line. */
static int finish(trainer *t, loop *L, td_train_result *res, td_err *err) {
    td_train_state *st = &t->state;
    td_model_print_profile(&t->model, L->steps, t->log);
    td_train_print_phases(t, L->steps);
    res->steps = st->step;
    if (st->step < L->total) {
        res->stopped = true;
        if (td_train_save(t, err) != 0) return -1;
        /* after the save, so that what is resumed is what an unstopped run has at this step */
        if (!t->opt || !t->opt->report_at_stop) return 0;
        float lr = td_schedule_lr(&L->sched, t->job->train.optim.lr, st->step - 1);
        if (st->interval_steps > 0 && log_train(t, L, lr, res, err) != 0) return -1;
        if (t->job->data.val.present && L->val_step != st->step) return evaluate(t, L, res, err);
        return 0;
    }
    if (td_train_save(t, err) != 0) return -1;
    /* the end's own evaluation, unless the last pass was at this very step */
    if (t->job->data.val.present && L->val_step != st->step) {
        if (td_train_eval_pass(t, &res->val_loss, &res->val_acc, err) != 0) return -1;
        res->has_val = true;
        td_train_sample(t);
    }
    double elapsed = td_clock_now() - L->t_start;
    if (!t->rank0) return 0;
    td_metric_done m = {.step = st->step,
                        .epochs = res->epochs_done,
                        .loss = res->last_loss,
                        .has_val = res->has_val,
                        .val_loss = res->val_loss,
                        .val_acc = res->val_acc,
                        .samples_per_s = L->total_samples / elapsed,
                        .elapsed_s = elapsed};
    td_metrics_done(t->metrics, &m);
    return 0;
}

static int train_loop(trainer *t, td_train_result *res, td_err *err) {
    const td_job *job = t->job;
    td_train_state *st = &t->state;
    loop L;
    td_run run;
    if (start(t, &L, &run, err) != 0) return -1;
    int accum = job->train.grad_accum, world = td_train_world(t);
    memset(res, 0, sizeof *res);
    res->epochs_done = st->epoch;
    if (t->gpu && td_train_gpu_seek_dropout(t, (long)st->epoch * L.batches + st->batch, err) != 0)
        return -1;
    for (int epoch = st->epoch; epoch < job->train.epochs && st->step < L.stop; epoch++) {
        td_loader_start_epoch(t->train_loader, epoch, st->epoch == epoch ? st->batch : 0);
        st->epoch = epoch;
        td_batch b;
        t->phase.t_step = td_clock_now();
        double t_wait = t->phase.t_step;
        while (st->step < L.stop && td_loader_next(t->train_loader, &b)) {
            td_train_phase(t, &t->phase.loader, &t_wait);
            float lr = td_schedule_lr(&L.sched, job->train.optim.lr, st->step);
            /* this batch's place in its group of grad_accum (the epoch's last may be short) */
            int micro = st->batch % accum, left = L.batches - (st->batch - micro);
            int group = left < accum ? left : accum;
            double loss = NAN; /* on the GPU it stays on the device until the next log line */
            int rc = t->gpu ? td_train_gpu_batch(t, &b, &run, lr, group, micro, err)
                            : td_train_cpu_batch(t, &b, &run, lr, group, micro, &loss, err);
            if (rc != 0) return -1;
            t_wait = td_clock_now();
            st->batch++;
            L.interval_samples += (long)b.n * world;
            L.total_samples += (long)b.n * world;
            if (micro + 1 < group) continue; /* no optimizer step before the group's last batch */
            td_train_profile_step(t);
            if (!t->gpu) res->last_loss = loss;
            st->step++;
            L.steps++;
            st->interval_steps++;
            L.interval_steps++;
            if ((st->step % job->log.every_steps == 0 || st->step == L.total) &&
                log_train(t, &L, lr, res, err) != 0)
                return -1;
            if (job->train.eval_every_steps > 0 && job->data.val.present &&
                st->step % job->train.eval_every_steps == 0 && st->step < L.total &&
                evaluate(t, &L, res, err) != 0)
                return -1;
            if (job->checkpoint.every_steps > 0 && st->step % job->checkpoint.every_steps == 0 &&
                td_train_save(t, err) != 0)
                return -1;
            /* logging and checkpoints are not the step's time */
            t->phase.t_step = t_wait = td_clock_now();
        }
        if (st->batch < L.batches) break; /* stopped inside the epoch */
        st->epoch = epoch + 1;
        st->batch = 0;
        res->epochs_done = epoch + 1;
        if (job->data.val.present && L.val_step != st->step && evaluate(t, &L, res, err) != 0)
            return -1;
        if (job->checkpoint.every_epochs > 0 && (epoch + 1) % job->checkpoint.every_epochs == 0 &&
            td_train_save(t, err) != 0)
            return -1;
    }
    return finish(t, &L, res, err);
}

int td_train_run(const td_job *job, const td_train_options *opt, FILE *metrics, FILE *log,
                 td_train_result *result, td_err *err) {
    static const td_train_options defaults = {0};
    trainer t = {.job = job,
                 .opt = opt ? opt : &defaults,
                 .metrics = metrics,
                 .log = log,
                 .dist = opt ? opt->dist : NULL,
                 .rank0 = !(opt && td_dist_active(opt->dist)) || opt->dist->rank == 0};
    td_train_result scratch;
    if (!result) result = &scratch;
    int rc = td_train_setup(&t, err);
    if (rc == 0) {
        t.train_loader = td_loader_create(&t.train, &t.norm, &job->data.augment, &t.train_cfg);
        rc = train_loop(&t, result, err);
    }
    td_train_release(&t);
    return rc;
}

int td_train_evaluate(const td_job *job, FILE *metrics, FILE *log, td_train_result *result,
                      td_err *err) {
    static const td_train_options defaults = {0};
    trainer t = {.job = job, .opt = &defaults, .metrics = metrics, .log = log, .rank0 = true};
    td_train_result scratch;
    if (!result) result = &scratch;
    memset(result, 0, sizeof *result);
    int rc = -1;
    if (!job->data.val.present)
        td_fail(err, "--eval: the spec has no data.val to evaluate on");
    else if (!job->checkpoint.resume_from[0] && !job->model.init_from[0])
        td_fail(err, "--eval: give resume_from or model.init_from, or there is nothing trained "
                     "to evaluate");
    else
        rc = td_train_setup(&t, err);
    if (rc == 0) {
        td_metric_eval e;
        rc = eval_line(&t, &e, err);
        result->val_loss = e.val_loss;
        result->val_acc = e.val_acc;
        result->has_val = true;
        result->steps = t.state.step;
        result->epochs_done = t.state.epoch;
        if (rc == 0) td_metrics_eval(t.metrics, &e);
    }
    td_train_release(&t);
    return rc;
}
