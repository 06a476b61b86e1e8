#include "td_train.h"

#include "td_blas.h"
#include "td_cuda.h"

#include <cblas.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct trainer {
    const td_job *job;
    FILE *metrics, *log;
    td_dataset train, val;
    td_normalize norm;
    td_model model;
    td_optim optim;
    td_loader *train_loader, *val_loader;
    td_rng dropout_rng;
    float *dlogits;
    int classes;
} trainer;

static int load_split(const td_job *job, const td_split_spec *split, td_dataset *ds, uint64_t salt,
                      td_err *err) {
    if (job->format == TD_DATA_SYNTHETIC) {
        td_dataset_synthetic(ds, job->synthetic_shape, job->num_classes, split->size,
                             job->seed * 0x9E3779B97F4A7C15ull + salt);
        return 0;
    }
    return td_dataset_load_idx(ds, split->images, split->labels, err);
}

static int setup_data(trainer *t, td_err *err) {
    const td_job *job = t->job;
    if (load_split(job, &job->train, &t->train, 1, err) != 0)
        return td_fail_prefix(err, "data.train");
    if (job->val.present) {
        if (load_split(job, &job->val, &t->val, 2, err) != 0)
            return td_fail_prefix(err, "data.val");
        td_shape a = t->train.shape, b = t->val.shape;
        if (a.c != b.c || a.h != b.h || a.w != b.w)
            return td_fail(err, "data.val: images are %dx%dx%d but training images are %dx%dx%d",
                           b.c, b.h, b.w, a.c, a.h, a.w);
    }
    int channels = t->train.shape.c;
    if (job->norm_given) {
        if (job->norm.channels != channels)
            return td_fail(err,
                           "data.normalize: gives %d values per list but the images have %d "
                           "channel%s",
                           job->norm.channels, channels, channels > 1 ? "s" : "");
        t->norm = job->norm;
    } else {
        t->norm.channels = channels;
        for (int c = 0; c < channels; c++) t->norm.mean[c] = 0.0f, t->norm.std[c] = 1.0f;
    }
    return 0;
}

static int setup_model(trainer *t, td_err *err) {
    const td_job *job = t->job;
    int max_n = job->batch_size > job->eval_batch_size ? job->batch_size : job->eval_batch_size;
    if (td_model_build(&t->model, job->nodes, job->n_nodes, t->train.shape, max_n, job->seed, 0,
                       err) != 0)
        return -1;
    td_shape out = td_model_output_shape(&t->model);
    if (out.spatial)
        return td_fail(err,
                       "model: the last node outputs an image [%d, %d, %d]; expected logits "
                       "[classes] (end with a linear node)",
                       out.c, out.h, out.w);
    t->classes = out.c;
    if (job->num_classes && job->num_classes != out.c)
        return td_fail(err, "model: the last node outputs %d values but num_classes is %d", out.c,
                       job->num_classes);
    const td_dataset *sets[2] = {&t->train, job->val.present ? &t->val : NULL};
    for (int i = 0; i < 2; i++) {
        if (!sets[i]) continue;
        int max_label = td_dataset_max_label(sets[i]);
        if (max_label >= t->classes)
            return td_fail(err,
                           "data.%s: holds label %d but the model has %d classes (labels "
                           "must be 0..%d)",
                           i ? "val" : "train", max_label, t->classes, t->classes - 1);
    }
    td_optim_init(&t->optim, &job->optim, t->model.param_floats);
    t->dlogits = td_aligned_alloc((size_t)max_n * t->classes * sizeof(float));
    td_rng_seed_for(&t->dropout_rng, job->seed, "dropout", 0);
    return 0;
}

static void evaluate(trainer *t, double *val_loss, double *val_acc) {
    td_run run = {.training = false, .rng = &t->dropout_rng};
    double *profile = t->model.profile; /* only training steps are profiled */
    t->model.profile = NULL;
    double loss = 0;
    long correct = 0, seen = 0;
    td_loader_start_epoch(t->val_loader, 0, 0);
    td_batch b;
    while (td_loader_next(t->val_loader, &b)) {
        run.n = b.n;
        const float *logits = td_model_forward(&t->model, b.x, &run);
        int hits;
        loss += td_loss_compute(&t->job->loss, logits, b.labels, b.n, t->classes, NULL, 1, &hits);
        correct += hits;
        seen += b.n;
    }
    *val_loss = loss / (double)seen;
    *val_acc = (double)correct / (double)seen;
    t->model.profile = profile;
}

static void log_banner(const trainer *t) {
    const td_job *job = t->job;
    char why[256];
    int gpus = td_cuda_device_count(why, sizeof why);
    fprintf(t->log, "[traind] job \"%s\": %d parameters in %d tensors, %d nodes\n", job->name,
            (int)t->model.param_floats, t->model.n_params, t->model.n_nodes);
    fprintf(t->log, "[traind] data: %d training samples%s, shape [%d, %d, %d], %d classes\n",
            t->train.n, job->format == TD_DATA_SYNTHETIC ? " (synthetic)" : "", t->train.shape.c,
            t->train.shape.h, t->train.shape.w, t->classes);
    if (job->val.present) fprintf(t->log, "[traind] data: %d validation samples\n", t->val.n);
    fprintf(t->log, "[traind] device: CPU, OpenBLAS %s kernels, %d thread%s (%s)\n",
            td_blas_describe(), job->threads, job->threads > 1 ? "s" : "",
            gpus > 0 ? "CUDA devices present; the GPU backend is not built into this engine yet"
                     : why);
}

static int train_loop(trainer *t, td_train_result *res, td_err *err) {
    const td_job *job = t->job;
    td_schedule sched = job->schedule;
    int steps_per_epoch = job->drop_last ? t->train.n / job->batch_size
                                         : (t->train.n + job->batch_size - 1) / job->batch_size;
    if (steps_per_epoch == 0)
        return td_fail(err, "train.batch_size: %d with drop_last leaves no batch from %d samples",
                       job->batch_size, t->train.n);
    long total = (long)steps_per_epoch * job->epochs;
    if (job->max_steps > 0 && job->max_steps < total) total = job->max_steps;
    sched.total_steps = total;

    td_run run = {.training = true, .rng = &t->dropout_rng};
    long step = 0;
    /* TRAIND_PROFILE=1: per-node times of the training steps, printed at the end */
    const char *profile = getenv("TRAIND_PROFILE");
    bool profiling = profile && *profile && strcmp(profile, "0") != 0;
    double interval_loss = 0, t_start = now_s(), t_interval = t_start;
    long interval_steps = 0, interval_samples = 0, total_samples = 0;
    memset(res, 0, sizeof *res);
    for (int epoch = 0; epoch < job->epochs && step < total; epoch++) {
        td_loader_start_epoch(t->train_loader, epoch, 0);
        td_batch b;
        while (step < total && td_loader_next(t->train_loader, &b)) {
            float lr = td_schedule_lr(&sched, job->optim.lr, step);
            run.n = b.n;
            if (profiling) td_model_enable_profile(&t->model);
            const float *logits = td_model_forward(&t->model, b.x, &run);
            double loss = td_loss_compute(&job->loss, logits, b.labels, b.n, t->classes, t->dlogits,
                                          1.0f, NULL) /
                          b.n;
            if (!isfinite(loss))
                return td_fail(err,
                               "the training loss became %g at step %ld (epoch %d); lower "
                               "train.optimizer.lr or set train.clip_grad_norm",
                               loss, step + 1, epoch + 1);
            td_model_backward(&t->model, t->dlogits, &run);
            if (job->clip_grad_norm > 0)
                td_grad_clip(t->model.grad_block, t->model.param_floats, job->clip_grad_norm);
            td_optim_step(&t->optim, t->model.param_block, t->model.grad_block, lr);
            step++;
            interval_loss += loss;
            interval_steps++;
            interval_samples += b.n;
            total_samples += b.n;
            res->last_loss = loss;
            if (step % job->log_every == 0 || step == total) {
                double now = now_s(), dt = now - t_interval;
                fprintf(t->metrics,
                        "{\"event\":\"train\",\"step\":%ld,\"epoch\":%d,\"loss\":%.9g,\"lr\":%.9g,"
                        "\"samples_per_s\":%.1f,\"step_ms\":%.4f}\n",
                        step, epoch + 1, interval_loss / interval_steps, lr, interval_samples / dt,
                        dt * 1000.0 / interval_steps);
                fflush(t->metrics);
                interval_loss = 0;
                interval_steps = interval_samples = 0;
                t_interval = now;
            }
        }
        bool epoch_complete =
            !(step == total && job->max_steps > 0 && step < (long)steps_per_epoch * (epoch + 1));
        res->epochs_done = epoch + (epoch_complete ? 1 : 0);
        if (job->val.present && epoch_complete) {
            double t0 = now_s();
            evaluate(t, &res->val_loss, &res->val_acc);
            res->has_val = true;
            fprintf(t->metrics,
                    "{\"event\":\"eval\",\"epoch\":%d,\"step\":%ld,\"val_loss\":%.9g,"
                    "\"val_acc\":%.6f}\n",
                    epoch + 1, step, res->val_loss, res->val_acc);
            fflush(t->metrics);
            fprintf(t->log, "[traind] epoch %d: val_loss %.4f, val_acc %.4f (eval %.2fs)\n",
                    epoch + 1, res->val_loss, res->val_acc, now_s() - t0);
            t_interval += now_s() - t0; /* evaluation time is not training throughput */
        }
    }
    td_model_print_profile(&t->model, step, t->log);
    if (job->val.present && !res->has_val) {
        evaluate(t, &res->val_loss, &res->val_acc);
        res->has_val = true;
    }
    res->steps = step;
    double elapsed = now_s() - t_start;
    fprintf(t->metrics, "{\"event\":\"done\",\"step\":%ld,\"epoch\":%d,\"loss\":%.9g", step,
            res->epochs_done, res->last_loss);
    if (res->has_val)
        fprintf(t->metrics, ",\"val_loss\":%.9g,\"val_acc\":%.6f", res->val_loss, res->val_acc);
    fprintf(t->metrics, ",\"samples_per_s\":%.1f,\"elapsed_s\":%.3f}\n", total_samples / elapsed,
            elapsed);
    fflush(t->metrics);
    return 0;
}

int td_train_run(const td_job *job, FILE *metrics, FILE *log, td_train_result *result,
                 td_err *err) {
    trainer t = {.job = job, .metrics = metrics, .log = log};
    td_train_result scratch;
    if (!result) result = &scratch;
    openblas_set_num_threads(job->threads);
    int rc = setup_data(&t, err);
    if (rc == 0) rc = setup_model(&t, err);
    if (rc == 0) {
        log_banner(&t);
        t.train_loader = td_loader_create(&t.train, &t.norm, job->batch_size, job->shuffle,
                                          job->drop_last, job->seed);
        if (job->val.present)
            t.val_loader =
                td_loader_create(&t.val, &t.norm, job->eval_batch_size, false, false, job->seed);
        rc = train_loop(&t, result, err);
    }
    td_loader_destroy(t.train_loader);
    td_loader_destroy(t.val_loader);
    free(t.dlogits);
    td_optim_free(&t.optim);
    td_model_free(&t.model);
    td_dataset_free(&t.train);
    td_dataset_free(&t.val);
    return rc;
}
