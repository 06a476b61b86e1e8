/* The spec's train section: batch, epochs and steps, the optimizer, the learning-rate schedule,
 * the loss, precision and device, gradient accumulation and activation checkpointing. */
#include "spec/td_spec_private.h"

#include "base/td_json.h"
#include "ops/td_ops.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int parse_optimizer(const json_t *t, td_job *job, td_err *err) {
    json_t *o;
    if (td_json_object(t, "train", "optimizer", true, &o, err) != 0) return -1;
    const char *p = "train.optimizer";
    int kind;
    if (td_json_choice(o, p, "type", true, "", "sgd|adam|adamw", &kind, err) != 0) return -1;
    td_optim_config *c = &job->train.optim;
    c->kind = kind == 0 ? TD_OPTIM_SGD : kind == 1 ? TD_OPTIM_ADAM : TD_OPTIM_ADAMW;
    double lr, wd, v;
    if (td_json_number(o, p, "lr", true, 0, 1e-12, 1e6, &lr, err) != 0) return -1;
    c->lr = (float)lr;
    /* PyTorch's defaults: AdamW decays by 0.01, the others not at all */
    if (td_json_number(o, p, "weight_decay", false, c->kind == TD_OPTIM_ADAMW ? 0.01 : 0.0, 0, 10,
                       &wd, err) != 0)
        return -1;
    c->weight_decay = (float)wd;
    /* "matrices": nanoGPT's groups, decay on parameters of 2 or more dimensions only */
    int decay;
    if (td_json_choice(o, p, "decay", false, "all", "all|matrices", &decay, err) != 0) return -1;
    c->decay_matrices = decay == 1;
    if (c->kind == TD_OPTIM_SGD) {
        static const char *const keys[] = {"type",      "lr",       "weight_decay", "momentum",
                                           "dampening", "nesterov", "decay",        NULL};
        if (td_json_check_keys(o, p, keys, err) != 0) return -1;
        if (td_json_number(o, p, "momentum", false, 0, 0, 1, &v, err) != 0) return -1;
        c->momentum = (float)v;
        if (td_json_number(o, p, "dampening", false, 0, 0, 1, &v, err) != 0) return -1;
        c->dampening = (float)v;
        if (td_json_bool(o, p, "nesterov", false, &c->nesterov, err) != 0) return -1;
        if (c->nesterov && (c->momentum <= 0 || c->dampening != 0))
            return td_fail(err, "train.optimizer.nesterov: needs momentum > 0 and dampening 0 "
                                "(as in PyTorch)");
        return 0;
    }
    static const char *const keys[] = {"type", "lr", "weight_decay", "betas", "eps", "decay", NULL};
    if (td_json_check_keys(o, p, keys, err) != 0) return -1;
    c->beta1 = 0.9f;
    c->beta2 = 0.999f;
    json_t *betas = json_object_get(o, "betas");
    if (betas) {
        if (!json_is_array(betas) || json_array_size(betas) != 2 ||
            !json_is_number(json_array_get(betas, 0)) || !json_is_number(json_array_get(betas, 1)))
            return td_json_fail_found(err, "train.optimizer.betas", "[beta1, beta2]", betas);
        double b1 = json_number_value(json_array_get(betas, 0));
        double b2 = json_number_value(json_array_get(betas, 1));
        if (!(b1 >= 0 && b1 < 1 && b2 >= 0 && b2 < 1))
            return td_json_fail_found(err, "train.optimizer.betas", "two numbers in [0, 1)", betas);
        c->beta1 = (float)b1;
        c->beta2 = (float)b2;
    }
    if (td_json_number(o, p, "eps", false, 1e-8, 0, 1, &v, err) != 0) return -1;
    c->eps = (float)v;
    return 0;
}

static int parse_schedule(const json_t *t, td_job *job, td_err *err) {
    json_t *s;
    td_schedule *sc = &job->train.schedule;
    memset(sc, 0, sizeof *sc);
    sc->kind = TD_SCHED_CONSTANT;
    if (td_json_object(t, "train", "schedule", false, &s, err) != 0) return -1;
    if (!s) return 0;
    const char *p = "train.schedule";
    static const char *const keys[] = {"type",       "warmup_steps", "step_size",  "gamma",
                                       "milestones", "min_lr",       "end_factor", NULL};
    if (td_json_check_keys(s, p, keys, err) != 0) return -1;
    int kind;
    if (td_json_choice(s, p, "type", false, "constant", "constant|step|multistep|cosine|linear",
                       &kind, err) != 0)
        return -1;
    sc->kind = (td_schedule_kind)kind;
    long l;
    double v;
    if (td_json_int(s, p, "warmup_steps", false, 0, 0, 1L << 40, &l, err) != 0) return -1;
    sc->warmup_steps = l;
    if (td_json_number(s, p, "gamma", false, 0.1, 0, 10, &v, err) != 0) return -1;
    sc->gamma = (float)v;
    if (td_json_int(s, p, "step_size", sc->kind == TD_SCHED_STEP, 1, 1, 1L << 40, &l, err) != 0)
        return -1;
    sc->step_size = l;
    if (td_json_number(s, p, "min_lr", false, 0, 0, 1e6, &v, err) != 0) return -1;
    sc->min_lr = (float)v;
    if (td_json_number(s, p, "end_factor", false, 0, 0, 1e6, &v, err) != 0) return -1;
    sc->end_factor = (float)v;
    json_t *ms = json_object_get(s, "milestones");
    if (sc->kind == TD_SCHED_MULTISTEP && !ms)
        return td_fail(err, "train.schedule.milestones: missing; expected an increasing array of "
                            "step counts");
    if (ms) {
        if (!json_is_array(ms) || json_array_size(ms) > TD_MAX_MILESTONES)
            return td_json_fail_found(err, "train.schedule.milestones",
                                      "an increasing array of up to 32 step counts", ms);
        sc->n_milestones = (int)json_array_size(ms);
        for (int i = 0; i < sc->n_milestones; i++) {
            json_t *x = json_array_get(ms, (size_t)i);
            if (!json_is_integer(x) || json_integer_value(x) < 0 ||
                (i > 0 && json_integer_value(x) <= sc->milestones[i - 1]))
                return td_json_fail_found(err, "train.schedule.milestones",
                                          "an increasing array of non-negative step counts", ms);
            sc->milestones[i] = (long)json_integer_value(x);
        }
    }
    return 0;
}

/* train.activation_checkpointing: segments named by module prefix ("layer1.0") or by
 * {"first": node, "last": node}, marked on the model's nodes. */
static int parse_recompute(const json_t *t, td_job *job, td_err *err) {
    const char *path = "train.activation_checkpointing";
    json_t *list = json_object_get(t, "activation_checkpointing");
    if (!list) return 0;
    const char *expected = "an array of segments, each a module prefix such as \"layer1.0\" or "
                           "{\"first\": node name, \"last\": node name}";
    if (!json_is_array(list)) return td_json_fail_found(err, path, expected, list);
    int n = (int)json_array_size(list);
    td_segment_name *names = td_calloc(n ? (size_t)n : 1, sizeof *names);
    int rc = 0;
    for (int i = 0; i < n && rc == 0; i++) {
        json_t *e = json_array_get(list, (size_t)i);
        char where[TD_PATH_MAX];
        snprintf(where, sizeof where, "%s[%d]", path, i);
        if (json_is_string(e)) {
            rc = strlen(json_string_value(e)) >= TD_NAME_MAX
                     ? td_fail(err, "%s: longer than %d characters", where, TD_NAME_MAX - 1)
                     : 0;
            snprintf(names[i].first, sizeof names[i].first, "%s", json_string_value(e));
            continue;
        }
        static const char *const keys[] = {"first", "last", NULL};
        if (!json_is_object(e))
            rc = td_json_fail_found(err, where,
                                    "a module prefix or {\"first\": ..., \"last\": ...}", e);
        else if (td_json_check_keys(e, where, keys, err) != 0 ||
                 td_json_string(e, where, "first", true, "", names[i].first, sizeof names[i].first,
                                err) != 0 ||
                 td_json_string(e, where, "last", true, "", names[i].last, sizeof names[i].last,
                                err) != 0)
            rc = -1;
        else if (!names[i].last[0])
            rc = td_fail(err, "%s.last: empty; expected a node name", where);
    }
    if (rc == 0 && td_segments_assign(job->model.nodes, job->model.n_nodes, names, n, err) != 0) {
        char msg[TD_ERR_MAX]; /* "[2]: ..." joins the path without the usual ": " */
        memcpy(msg, err->msg, sizeof msg);
        rc = td_fail(err, "%s%s", path, msg);
    }
    job->train.n_segments = n;
    free(names);
    return rc;
}

int td_spec_parse_train(const json_t *root, td_job *job, td_err *err) {
    json_t *t;
    if (td_json_object(root, "", "train", true, &t, err) != 0) return -1;
    static const char *const keys[] = {"epochs",
                                       "max_steps",
                                       "batch_size",
                                       "eval_batch_size",
                                       "seed",
                                       "threads",
                                       "shuffle",
                                       "drop_last",
                                       "optimizer",
                                       "schedule",
                                       "loss",
                                       "clip_grad_norm",
                                       "sync_bn",
                                       "grad_accum",
                                       "device",
                                       "precision",
                                       "cuda_graph",
                                       "activation_checkpointing",
                                       "cudnn_benchmark",
                                       "deterministic",
                                       "eval_every_steps",
                                       "eval_iters",
                                       NULL};
    if (td_json_check_keys(t, "train", keys, err) != 0) return -1;
    int choice;
    if (td_json_choice(t, "train", "device", false, "auto", "auto|cpu|cuda", &choice, err) != 0)
        return -1;
    job->train.device = choice == 0 ? TD_DEVICE_AUTO : choice == 1 ? TD_DEVICE_CPU : TD_DEVICE_CUDA;
    if (td_json_choice(t, "train", "precision", false, "fp32", "fp32|bf16|fp16", &choice, err) != 0)
        return -1;
    job->train.precision = choice == 0 ? TD_PREC_FP32 : choice == 1 ? TD_PREC_BF16 : TD_PREC_FP16;
    if (td_json_bool(t, "train", "cuda_graph", true, &job->train.cuda_graph, err) != 0 ||
        td_json_bool(t, "train", "cudnn_benchmark", false, &job->train.cudnn_benchmark, err) != 0 ||
        td_json_bool(t, "train", "deterministic", true, &job->train.deterministic, err) != 0)
        return -1;
    if (parse_recompute(t, job, err) != 0) return -1;
    long l;
    if (td_json_int(t, "train", "epochs", false, 1, 1, 1000000, &l, err) != 0) return -1;
    job->train.epochs = (int)l;
    if (td_json_int(t, "train", "max_steps", false, 0, 0, 1L << 40, &l, err) != 0) return -1;
    job->train.max_steps = l;
    /* nanoGPT's eval_interval: a validation pass every N optimizer steps, besides each epoch's */
    if (td_json_int(t, "train", "eval_every_steps", false, 0, 0, 1L << 40, &l, err) != 0) return -1;
    job->train.eval_every_steps = l;
    /* nanoGPT's eval_iters (Lightning's limit_val_batches): a pass reads at most this many
     * batches of data.val per rank; 0: all of it */
    if (td_json_int(t, "train", "eval_iters", false, 0, 0, 1L << 40, &l, err) != 0) return -1;
    job->train.eval_iters = l;
    if (td_json_int(t, "train", "batch_size", true, 0, 1, 1 << 20, &l, err) != 0) return -1;
    job->train.batch_size = (int)l;
    if (td_json_int(t, "train", "eval_batch_size", false, job->train.batch_size, 1, 1 << 20, &l,
                    err) != 0)
        return -1;
    job->train.eval_batch_size = (int)l;
    if (td_json_int(t, "train", "seed", false, 0, 0, (long)(~0ul >> 1), &l, err) != 0) return -1;
    job->train.seed = (uint64_t)l;
    if (td_json_int(t, "train", "threads", false, 1, 1, 1024, &l, err) != 0) return -1;
    job->train.threads = (int)l;
    if (td_json_bool(t, "train", "sync_bn", false, &job->train.sync_bn, err) != 0) return -1;
    if (td_json_int(t, "train", "grad_accum", false, 1, 1, 1 << 16, &l, err) != 0) return -1;
    job->train.grad_accum = (int)l;
    if (td_json_bool(t, "train", "shuffle", true, &job->train.shuffle, err) != 0 ||
        td_json_bool(t, "train", "drop_last", false, &job->train.drop_last, err) != 0)
        return -1;
    double v;
    if (td_json_number(t, "train", "clip_grad_norm", false, 0, 0, 1e12, &v, err) != 0) return -1;
    job->train.clip_grad_norm = (float)v;
    if (parse_optimizer(t, job, err) != 0 || parse_schedule(t, job, err) != 0) return -1;
    json_t *loss;
    if (td_json_object(t, "train", "loss", false, &loss, err) != 0) return -1;
    job->train.loss.kind = TD_LOSS_CROSS_ENTROPY;
    if (loss) {
        static const char *const lkeys[] = {"type", "label_smoothing", NULL};
        if (td_json_check_keys(loss, "train.loss", lkeys, err) != 0) return -1;
        int kind;
        if (td_json_choice(loss, "train.loss", "type", false, "cross_entropy", "cross_entropy|mse",
                           &kind, err) != 0)
            return -1;
        job->train.loss.kind = kind == 0 ? TD_LOSS_CROSS_ENTROPY : TD_LOSS_MSE;
        if (td_json_number(loss, "train.loss", "label_smoothing", false, 0, 0, 1, &v, err) != 0)
            return -1;
        job->train.loss.label_smoothing = (float)v;
        if (job->train.loss.kind == TD_LOSS_MSE && v != 0)
            return td_fail(err, "train.loss.label_smoothing: only applies to cross_entropy");
    }
    return 0;
}
