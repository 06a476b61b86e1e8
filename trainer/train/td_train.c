#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "train/td_train.h"

#include "core/td_blas.h"
#include "io/td_checkpoint.h"
#include "dist/td_comm.h"
#include "dist/td_reducer.h"
#include "ops/td_ops.h"
#include "gpu/td_gpu.h"

#include <cblas.h>
#include <math.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct trainer {
    const td_job *job;
    const td_train_options *opt;
    FILE *metrics, *log;
    td_dataset train, val;
    td_normalize norm;
    td_model model;
    td_optim optim;
    td_loader *train_loader, *val_loader;
    float *dlogits;
    int classes;
    td_train_state state; /* position, RNG and open logging interval: what a checkpoint saves */
    long last_saved_step;
    int checkpoints_saved; /* in this process, for the kill_at_checkpoint test hook */

    /* data parallel: every rank a replica; rank 0 alone prints and checkpoints */
    const td_dist *dist;
    td_store *store;
    bool own_store;
    td_comm *comm;
    td_reducer *reducer; /* DDP's bucketed gradient all-reduce */
    bool rank0;
    td_loader_config train_cfg, val_cfg;
    td_sync sync; /* SyncBatchNorm's reductions, when train.sync_bn */

    /* the device: a GPU when gpu is set, and then NCCL carries the collectives when gpu_ddp */
    td_device_plan device;
    const td_gpu_api *gpu_api; /* the backend's functions (gpu/td_gpu.h), set with gpu */
    td_gpu *gpu;
    bool gpu_ddp;
    bool graph_off;  /* CUDA graphs off by the spec, or after a failed capture */
    bool graph_warm; /* one full step ran op by op: lazy library setup is done before capture */
} trainer;

static int world_of(const trainer *t) {
    return td_dist_active(t->dist) ? t->dist->world : 1;
}

/* TRAIND_FORCE_DDP=1: a world of one still goes through DDP (NCCL, buckets): what its overhead
 * costs is then measurable, and its steps comparable with the plain run's. GPU only. */
static bool force_ddp(const trainer *t) {
    const char *v = getenv("TRAIND_FORCE_DDP");
    return t->gpu && world_of(t) == 1 && v && strcmp(v, "1") == 0;
}

/* After a collective failed: the first rank to fail records its message in the store; the
 * others, whose failure is often the cascade (a neighbour that gave up), add it to theirs, so
 * every rank's error leads to the rank that really died. Best effort, with a short deadline:
 * the store itself may be gone (rank 0 hosts it). */
static int collective_failed(trainer *t, td_err *err) {
    if (!t->store) {
        if (t->comm) td_comm_abort(t->comm);
        return -1;
    }
    td_err ignored;
    int64_t order = 0;
    td_store_set_timeout(t->store, 5.0);
    /* register before shutting the ring down: a neighbour only learns of the failure from that
     * shutdown, so the rank that failed first is also first in the store */
    bool counted = td_store_add(t->store, "failures", 1, &order, &ignored) == 0;
    if (counted && order == 1)
        td_store_set(t->store, "failure/first", err->msg, strlen(err->msg) + 1, &ignored);
    if (t->comm) td_comm_abort(t->comm); /* the neighbours learn now, not at their timeout */
    if (!counted) return -1;
    void *first;
    if (order > 1 && td_store_get(t->store, "failure/first", &first, NULL, &ignored) == 0) {
        char ours[TD_ERR_MAX];
        memcpy(ours, err->msg, sizeof ours);
        td_fail(err, "%.500s (the job's first failure: %.480s)", ours, (char *)first);
        free(first);
    }
    /* when one rank died, the world - 1 others report; the last of them says so */
    if (order == world_of(t) - 1) td_store_set(t->store, "failure/reported", "1", 1, &ignored);
    if (t->rank0) { /* rank 0 hosts the store: keep it up until the others have read it */
        void *done;
        if (td_store_get(t->store, "failure/reported", &done, NULL, &ignored) == 0) free(done);
    }
    return -1;
}

/* through the reducer's thread: in backward, SyncBatchNorm's sums interleave with the
 * gradient buckets, and every rank must issue them in the same order */
static int sync_sum(void *ctx, float *values, size_t n) {
    trainer *t = ctx;
    td_err err;
    return td_reducer_sum(t->reducer, values, n, &err);
}

/* Averages a few floats over the ranks (the loss of a step, evaluation counts). */
static int average_over_ranks(trainer *t, float *v, size_t n, bool average, td_err *err) {
    if (t->gpu_ddp) {
        if (t->gpu_api->ddp_allreduce_host(t->gpu, v, n, average, err) != 0)
            return collective_failed(t, err);
        return 0;
    }
    if (!t->comm) return 0;
    if (td_comm_allreduce(t->comm, v, n, average, err) != 0) return collective_failed(t, err);
    return 0;
}

/* Every rank arrives before any leaves (around rank 0's checkpoint writes). */
static int barrier(trainer *t, td_err *err) {
    if (t->gpu_ddp) {
        float one = 1.0f;
        return average_over_ranks(t, &one, 1, false, err);
    }
    return t->comm && td_comm_barrier(t->comm, err) != 0 ? collective_failed(t, err) : 0;
}

/* This rank failed to join (td_store_ready comes after the ring or NCCL is up): the store
 * fails the rendezvous with our error, so the ranks waiting for us stop now, naming us, rather
 * than at their timeout. */
static int join_failed(trainer *t, td_err *err) {
    if (t->store) td_store_abort(t->store, err->msg);
    return -1;
}

/* On GPUs: NCCL through the rendezvous store (none for a forced world of one), rank 0's
 * parameters and buffers broadcast as DDP's constructor does. */
static int setup_gpu_dist(trainer *t, int rank, int world, td_err *err) {
    const td_job *job = t->job;
    const td_dist *d = t->dist;
    if (t->device.backend != TD_BACKEND_NCCL)
        return td_fail(err, "distributed.backend: \"cpu\" with GPU training is not supported yet; "
                            "use \"nccl\" (or \"auto\")");
    t->store = t->opt->store;
    if (!t->store && world > 1) {
        if (td_store_open_rank(&t->store, d->master_addr, d->master_port, t->rank0, d->namespace_,
                               rank, world, d->timeout_s, err) != 0)
            return -1;
        t->own_store = true;
    }
    double timeout = d ? d->timeout_s : 300.0;
    if (t->gpu_api->ddp_start(t->gpu, &t->model, t->store, rank, world, job->bucket_cap_mb, timeout,
                              job->sync_bn, err) != 0)
        return join_failed(t, err);
    t->gpu_ddp = true;
    if (t->store && td_store_ready(t->store, rank, world, err) != 0) return -1;
    if (t->gpu_api->ddp_broadcast_params(t->gpu, &t->model, false, err) != 0)
        return td_fail_prefix(err, "broadcasting rank 0's parameters");
    if (t->rank0)
        fprintf(t->log,
                "[traind] data parallel: %d rank%s, %d per node; gradients in %d bucket%s "
                "(bucket_cap_mb %g), all-reduced through NCCL%s\n",
                world, world == 1 ? "" : "s", d && world > 1 ? d->local_world : 1,
                t->gpu_api->ddp_buckets(t->gpu), t->gpu_api->ddp_buckets(t->gpu) == 1 ? "" : "s",
                job->bucket_cap_mb,
                job->sync_bn ? "; SyncBatchNorm statistics over every rank's batch" : "");
    return 0;
}

/* data.num_workers, "auto" resolved: on the CPU one loader thread, which shares the cores with
 * training's BLAS threads; on a GPU this rank's share of the cores it may run on, less one for
 * the thread that drives the device, at most 8 (a 3x224x224 batch of 256 takes one core ~20 ms,
 * a ResNet-50 step on an H100 well under 100 ms). A rank whose launcher pinned it to some of the
 * cores has those to itself; an unpinned one shares the machine's with the node's other ranks. */
static int loader_workers(const trainer *t) {
    if (t->job->num_workers > 0) return t->job->num_workers;
    if (!t->gpu) return 1;
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int local =
        t->dist && td_dist_active(t->dist) && t->dist->local_world > 0 ? t->dist->local_world : 1;
    if (online > 0 && cores < online) local = 1;
    int n = cores / local - 1;
    return n < 1 ? 1 : n > 8 ? 8 : n;
}

/* Joins the job: the rendezvous store, the ring, then the replicas start from rank 0's
 * parameters and buffers (as DDP's constructor broadcasts them). */
static int setup_dist(trainer *t, td_err *err) {
    const td_job *job = t->job;
    int rank = td_dist_active(t->dist) ? t->dist->rank : 0, world = world_of(t);
    t->rank0 = rank == 0;
    int workers = loader_workers(t);
    t->train_cfg = (td_loader_config){
        job->batch_size, job->shuffle, job->drop_last, job->seed, rank, world, true, workers};
    t->val_cfg = (td_loader_config){
        job->eval_batch_size, false, false, job->seed, rank, world, false, workers};
    if (world == 1 && !force_ddp(t)) return 0;
    const td_dist *d = t->dist;
    if (t->gpu) return setup_gpu_dist(t, rank, world, err);
    t->store = t->opt->store;
    if (!t->store) {
        if (td_store_open_rank(&t->store, d->master_addr, d->master_port, t->rank0, d->namespace_,
                               rank, world, d->timeout_s, err) != 0)
            return -1;
        t->own_store = true;
    }
    if (td_comm_init(&t->comm, t->store, rank, world, d->host, d->timeout_s, err) != 0)
        return join_failed(t, err);
    if (td_store_ready(t->store, rank, world, err) != 0) return -1;
    if (t->opt->kill_in_allreduce > 0)
        td_comm_kill_in_allreduce(t->comm, t->opt->kill_in_allreduce);
    if (td_comm_broadcast(t->comm, t->model.param_block, t->model.param_floats, 0, err) != 0 ||
        td_comm_broadcast(t->comm, t->model.buffer_block, t->model.buffer_floats, 0, err) != 0)
        return td_fail_prefix(err, "broadcasting rank 0's parameters");
    if (td_reducer_start(&t->reducer, t->comm, &t->model, job->bucket_cap_mb, err) != 0) return -1;
    if (t->rank0)
        fprintf(t->log,
                "[traind] data parallel: %d ranks, %d per node; gradients in %d bucket%s "
                "(bucket_cap_mb %g), all-reduced through %s\n",
                world, d->local_world, td_reducer_buckets(t->reducer),
                td_reducer_buckets(t->reducer) == 1 ? "" : "s", job->bucket_cap_mb,
                td_reducer_transport(t->reducer));
    return 0;
}

static int load_split(const td_job *job, const td_split_spec *split, td_dataset *ds, uint64_t salt,
                      td_err *err) {
    switch (job->format) {
    case TD_DATA_SYNTHETIC:
        td_dataset_synthetic(ds, job->synthetic_shape, job->num_classes, split->size,
                             job->seed * 0x9E3779B97F4A7C15ull + salt);
        return 0;
    case TD_DATA_IDX:
        return td_dataset_load_idx(ds, split->images, split->labels, err);
    case TD_DATA_NPY:
        return td_dataset_load_npy(ds, split->images, split->labels, job->nhwc, err);
    case TD_DATA_CIFAR10: {
        const char *files[TD_MAX_FILES];
        for (int i = 0; i < split->n_files; i++) files[i] = split->files[i];
        return td_dataset_load_cifar10(ds, files, split->n_files, err);
    }
    case TD_DATA_CSV:
        return td_dataset_load_csv(ds, split->images, job->label_column, job->csv_header, err);
    }
    return td_fail(err, "unknown data format");
}

static int setup_data(trainer *t, td_err *err) {
    const td_job *job = t->job;
    if (load_split(job, &job->train, &t->train, 1, err) != 0)
        return td_fail_prefix(err, "data.train");
    if (job->val.present) {
        if (load_split(job, &job->val, &t->val, 2, err) != 0)
            return td_fail_prefix(err, "data.val");
        td_shape a = t->train.shape, b = t->val.shape;
        if (a.c != b.c || a.h != b.h || a.w != b.w || a.spatial != b.spatial) {
            char sa[64], sb[64];
            td_shape_format(a, sa, sizeof sa);
            td_shape_format(b, sb, sizeof sb);
            return td_fail(err, "data.val: samples have shape %s but training samples %s", sb, sa);
        }
    }
    /* flat features share one mean/std; images have one per channel (or one for all) */
    int channels = t->train.shape.spatial ? t->train.shape.c : 1;
    if (job->norm_given) {
        if (job->norm.channels != channels && job->norm.channels != 1)
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
    unsigned flags = t->device.device == TD_DEVICE_CUDA ? TD_MODEL_NO_ARENA : 0;
    if (td_model_build(&t->model, job->nodes, job->n_nodes, t->train.shape, max_n, job->seed, flags,
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
    t->state.seed = job->seed;
    td_rng_seed_for(&t->state.dropout_rng, job->seed, "dropout", 0);
    t->last_saved_step = -1;
    return 0;
}

/* Weights from init_from, then everything from resume_from. */
static int restore(trainer *t, td_err *err) {
    const td_job *job = t->job;
    if (job->init_from[0] &&
        td_checkpoint_load_weights(job->init_from, &t->model, job->init_strict, t->log, err) != 0)
        return td_fail_prefix(err, "model.init_from");
    if (!job->resume_from[0]) return 0;
    char dir[TD_PATH_MAX + 32];
    if (td_checkpoint_resolve(job->resume_from, job->checkpoint_dir, dir, sizeof dir, err) != 0)
        return -1;
    if (td_checkpoint_load(dir, &t->model, &t->optim, &t->state, err) != 0)
        return td_fail_prefix(err, "resume_from");
    if (t->state.seed != job->seed)
        return td_fail(err,
                       "resume_from: %s was trained with train.seed %llu but the spec says "
                       "%llu; the data order would differ",
                       dir, (unsigned long long)t->state.seed, (unsigned long long)job->seed);
    t->last_saved_step = t->state.step;
    fprintf(t->log, "[traind] resumed from %s at step %ld (epoch %d, batch %d)\n", dir,
            t->state.step, t->state.epoch + 1, t->state.batch);
    return 0;
}

/* On the GPU the training loss accumulates on the device (reading it back every step would stall
 * the queue): at each log line, checkpoint and evaluation it is added to the interval's, averaged
 * over the ranks. The device sums each step's mean loss, so the interval's value is the CPU's. */
static int gpu_flush_loss(trainer *t, td_err *err) {
    double sum, hits;
    if (t->gpu_api->take_totals(t->gpu, &sum, &hits, err) != 0) return -1;
    float v = (float)sum;
    if (average_over_ranks(t, &v, 1, true, err) != 0) return -1;
    t->state.interval_loss += v;
    return 0;
}

static int save_checkpoint(trainer *t, td_err *err) {
    if (!t->job->checkpoint_dir[0] || t->last_saved_step == t->state.step) return 0;
    /* the open logging interval's loss is part of the state: fetch it from the device */
    if (t->gpu && gpu_flush_loss(t, err) != 0) return -1;
    if (!t->rank0) { /* the replicas are identical: rank 0 writes, the others wait for it */
        t->last_saved_step = t->state.step;
        return barrier(t, err);
    }
    if (t->gpu && t->gpu_api->download(t->gpu, &t->model, &t->optim, err) != 0) return -1;
    char path[TD_PATH_MAX + 32];
    bool kill = t->opt && t->opt->kill_at_checkpoint > 0 &&
                ++t->checkpoints_saved == t->opt->kill_at_checkpoint;
    if (td_checkpoint_save(t->job->checkpoint_dir, &t->model, &t->optim, &t->state,
                           t->job->checkpoint_keep, kill, path, sizeof path, err) != 0)
        return -1;
    t->last_saved_step = t->state.step;
    fprintf(t->metrics, "{\"event\":\"checkpoint\",\"step\":%ld,\"path\":\"", t->state.step);
    for (const char *c = path; *c; c++) /* JSON string escaping for the path */
        if (*c == '"' || *c == '\\')
            fprintf(t->metrics, "\\%c", *c);
        else if ((unsigned char)*c < 0x20)
            fprintf(t->metrics, "\\u%04x", *c);
        else
            fputc(*c, t->metrics);
    fprintf(t->metrics, "\"}\n");
    fflush(t->metrics);
    /* no rank races into the next collective while the save is under way */
    return barrier(t, err);
}

static int evaluate(trainer *t, double *val_loss, double *val_acc, td_err *err) {
    td_run run = {.training = false, .rng = &t->state.dropout_rng};
    double *profile = t->model.profile; /* only training steps are profiled */
    t->model.profile = NULL;
    double loss = 0;
    long correct = 0, seen = 0;
    td_loader_start_epoch(t->val_loader, 0, 0);
    td_batch b;
    if (t->gpu) { /* the training loss pending on the device must not mix with these sums */
        if (gpu_flush_loss(t, err) != 0) return -1;
        while (td_loader_next(t->val_loader, &b)) {
            run.n = b.n;
            if (t->gpu_api->set_batch(t->gpu, &t->model, b.x, b.labels, b.n, err) != 0) return -1;
            t->gpu_api->forward(t->gpu, &t->model, &run);
            t->gpu_api->loss(t->gpu, &t->model, &t->job->loss, b.n, 1.0f, false, 1.0f);
            seen += b.n;
        }
        double hits;
        if (t->gpu_api->take_totals(t->gpu, &loss, &hits, err) != 0) return -1;
        correct = (long)hits;
    }
    while (!t->gpu && td_loader_next(t->val_loader, &b)) {
        run.n = b.n;
        const float *logits = td_model_forward(&t->model, b.x, &run);
        int hits;
        loss += td_loss_compute(&t->job->loss, logits, b.labels, b.n, t->classes, NULL, 1, &hits);
        correct += hits;
        seen += b.n;
    }
    t->model.profile = profile;
    /* every validation sample counted once, over all ranks */
    float sums[3] = {(float)loss, (float)correct, (float)seen};
    if (average_over_ranks(t, sums, 3, false, err) != 0) return -1;
    *val_loss = sums[0] / sums[2];
    *val_acc = sums[1] / sums[2];
    return 0;
}

static void log_banner(const trainer *t) {
    const td_job *job = t->job;
    fprintf(t->log, "[traind] job \"%s\": %d parameters in %d tensors, %d nodes\n", job->name,
            (int)t->model.param_count, t->model.n_params, t->model.n_nodes);
    char shape[64];
    td_shape_format(t->train.shape, shape, sizeof shape);
    int workers = loader_workers(t);
    fprintf(t->log,
            "[traind] data: %d training samples%s, shape %s, %d classes; %d loader thread%s\n",
            t->train.n, job->format == TD_DATA_SYNTHETIC ? " (synthetic)" : "", shape, t->classes,
            workers, workers == 1 ? "" : "s");
    if (job->val.present) fprintf(t->log, "[traind] data: %d validation samples\n", t->val.n);
    const td_model *m = &t->model;
    if (m->n_segments) {
        double mib = 1.0 / (1024.0 * 1024.0);
        fprintf(t->log,
                "[traind] activation checkpointing: %d segment%s recomputed in backward; "
                "activations %.1f MiB instead of %.1f MiB\n",
                m->n_segments, m->n_segments > 1 ? "s" : "", (double)m->activation_bytes * mib,
                (double)(m->activation_bytes - m->region_bytes + m->dropped_bytes) * mib);
    }
    if (t->gpu) {
        char desc[512];
        t->gpu_api->describe(t->gpu, desc, sizeof desc);
        int fused = 0;
        for (int i = 0; i < t->model.n_nodes; i++) fused += t->model.nodes[i].out_fused;
        fprintf(t->log,
                "[traind] device: %s; %s, CUDA graphs %s, %d ReLU%s fused into BatchNorm or "
                "Add%s\n",
                desc, td_precision_name(t->device.precision), t->graph_off ? "off" : "on", fused,
                fused == 1 ? "" : "s",
                job->deterministic ? "" : "; cuDNN may choose nondeterministic algorithms");
        return;
    }
    char why[256];
    td_gpu_device_count(why, sizeof why);
    fprintf(t->log, "[traind] device: CPU, OpenBLAS %s kernels, %d thread%s (%s)\n",
            td_blas_describe(), job->threads, job->threads > 1 ? "s" : "", why);
}

/* Decides CPU or GPU, precision and collective backend before the model is built (a GPU model
 * gets no host arena). */
static int resolve_device(trainer *t, td_err *err) {
    const td_job *job = t->job;
    char why[256];
    int gpus = td_gpu_device_count(why, sizeof why);
    int local_rank = t->dist ? t->dist->local_rank : 0;
    if (td_device_resolve(job->device, job->precision, job->backend, gpus, why, local_rank,
                          getenv("CUDA_VISIBLE_DEVICES"), &t->device, err) != 0)
        return -1;
    t->graph_off = !job->cuda_graph;
    return 0;
}

/* Opens the device and moves the restored model and optimizer onto it. */
static int setup_gpu(trainer *t, td_err *err) {
    if (t->device.device != TD_DEVICE_CUDA) return 0;
    t->gpu_api = td_gpu_load(err);
    if (!t->gpu_api || t->gpu_api->open(&t->gpu, t->device.cuda_device, err) != 0)
        return td_fail_prefix(err, "train.device");
    t->gpu_api->set_deterministic(t->gpu, t->job->deterministic);
    if (t->gpu_api->attach(t->gpu, &t->model, t->device.precision, t->job->seed, err) != 0 ||
        t->gpu_api->optim_init(t->gpu, &t->model, &t->optim, err) != 0)
        return td_fail_prefix(err, "train.device");
    if (t->job->cudnn_benchmark) {
        double t0 = now_s();
        int timed = 0;
        if (t->gpu_api->benchmark_convolutions(t->gpu, &t->model, &timed, err) != 0) return -1;
        if (!td_dist_active(t->dist) || t->dist->rank == 0)
            fprintf(t->log, "[traind] cuDNN benchmark: %d convolution%s timed in %.1f s\n", timed,
                    timed == 1 ? "" : "s", now_s() - t0);
    }
    return 0;
}

/* One batch on the GPU: the whole step as one CUDA graph where it can be, else op by op. The
 * loss stays on the device (see gpu_flush_loss). */
static int gpu_batch(trainer *t, const td_batch *b, td_run *run, float lr, int group, int micro,
                     td_err *err) {
    const td_job *job = t->job;
    if (t->gpu_api->set_batch(t->gpu, &t->model, b->x, b->labels, b->n, err) != 0) return -1;
    bool last = micro + 1 == group;
    bool full = group == 1 && b->n == job->batch_size;
    if (!t->graph_off && full && t->graph_warm) {
        td_gpu_step_args args = {&job->loss, b->n, lr, job->clip_grad_norm, t->gpu_ddp};
        int rc = t->gpu_api->graph_step(t->gpu, &t->model, &args, err);
        if (rc == 0) return 0;
        if (rc == TD_GPU_GRAPH_FATAL) return collective_failed(t, err);
        if (t->rank0)
            fprintf(t->log, "[traind] CUDA graph: %s; training op by op from here\n", err->msg);
        t->graph_off = true;
    }
    run->n = b->n;
    run->accumulate_grads = micro > 0;
    run->node_done = NULL;
    /* DDP's broadcast_buffers, needless under SyncBatchNorm (every rank's statistics agree) */
    if (t->gpu_ddp && !job->sync_bn && t->model.buffer_floats &&
        t->gpu_api->ddp_broadcast_params(t->gpu, &t->model, true, err) != 0)
        return collective_failed(t, err);
    t->gpu_api->forward(t->gpu, &t->model, run);
    t->gpu_api->loss(t->gpu, &t->model, &job->loss, b->n, 1.0f / (float)group, true,
                     1.0f / ((float)b->n * (float)group));
    if (last && t->gpu_ddp) t->gpu_api->ddp_begin(t->gpu, run);
    t->gpu_api->backward(t->gpu, &t->model, run);
    if (last && t->gpu_ddp && t->gpu_api->ddp_finish(t->gpu, err) != 0)
        return collective_failed(t, err);
    if (last) t->gpu_api->optim_step(t->gpu, &t->model, lr, job->clip_grad_norm);
    t->graph_warm = t->graph_warm || full;
    return 0;
}

static void print_eval(trainer *t, int epoch, long step, const td_train_result *res) {
    fprintf(t->metrics,
            "{\"event\":\"eval\",\"epoch\":%d,\"step\":%ld,\"val_loss\":%.9g,"
            "\"val_acc\":%.6f}\n",
            epoch, step, res->val_loss, res->val_acc);
    fflush(t->metrics);
}

/* Where the GPU's dropout counter stands after `batches` training batches: one draw per dropout
 * node and batch (what a resumed run must continue from). */
static int gpu_seek_dropout(trainer *t, long batches, td_err *err) {
    long nodes = 0;
    for (int i = 0; i < t->model.n_nodes; i++)
        if (t->model.nodes[i].op == &td_op_dropout && td_node_arg(&t->model.nodes[i], "p") > 0)
            nodes++;
    return t->gpu_api->seek_dropout(t->gpu, (unsigned long long)(batches * nodes), err);
}

static bool profile_requested(void) {
    const char *profile = getenv("TRAIND_PROFILE");
    return profile && *profile && strcmp(profile, "0") != 0;
}

static int diverged(td_err *err, double loss, long step, int epoch) {
    return td_fail(err,
                   "the training loss became %g at step %ld (epoch %d); lower "
                   "train.optimizer.lr or set train.clip_grad_norm",
                   loss, step, epoch);
}

/* GPU memory this process holds, now and at most, with fp16's loss scale when it applies. */
static void print_gpu_memory(trainer *t) {
    size_t in_use, peak;
    t->gpu_api->memory(t->gpu, &in_use, &peak);
    fprintf(t->metrics, ",\"gpu_mem_mb\":%.1f,\"gpu_mem_peak_mb\":%.1f", in_use / 1048576.0,
            peak / 1048576.0);
    if (t->device.precision == TD_PREC_FP16) {
        float scale;
        long skipped;
        t->gpu_api->scaler_state(t->gpu, &scale, &skipped);
        fprintf(t->metrics, ",\"loss_scale\":%g,\"skipped_steps\":%ld", scale, skipped);
    }
}

static int train_loop(trainer *t, td_train_result *res, td_err *err) {
    const td_job *job = t->job;
    td_train_state *st = &t->state;
    td_schedule sched = job->schedule;
    /* an optimizer step every grad_accum batches (the last group of an epoch may be short) */
    int batches = td_loader_batches(&t->train, &t->train_cfg), accum = job->grad_accum;
    int steps_per_epoch = (batches + accum - 1) / accum;
    if (steps_per_epoch == 0)
        return td_fail(err, "train.batch_size: %d with drop_last leaves no batch from %d samples",
                       job->batch_size, t->train.n);
    long total = (long)steps_per_epoch * job->epochs;
    if (job->max_steps > 0 && job->max_steps < total) total = job->max_steps;
    sched.total_steps = total;
    /* --stop-after: leave as if preempted, the schedule still spanning the whole run */
    long stop = total;
    if (t->opt && t->opt->stop_after_steps > 0 && t->opt->stop_after_steps < stop)
        stop = t->opt->stop_after_steps;

    td_run run = {.training = true, .rng = &st->dropout_rng};
    if (t->gpu && profile_requested())
        fprintf(t->log, "[traind] TRAIND_PROFILE: per-node times are not measured on the GPU "
                        "(use nsys); ignored\n");
    if (t->comm && job->sync_bn) {
        t->sync = (td_sync){.sum = sync_sum, .ctx = t};
        run.sync = &t->sync;
    }
    /* TRAIND_PROFILE=1: per-node times of the training steps, printed at the end */
    bool profiling = !t->gpu && profile_requested();
    double t_start = now_s(), t_interval = t_start;
    long interval_samples = 0, interval_steps_here = 0, total_samples = 0, steps_here = 0;
    memset(res, 0, sizeof *res);
    res->epochs_done = st->epoch;
    if (t->gpu && gpu_seek_dropout(t, (long)st->epoch * batches + st->batch, err) != 0) return -1;
    for (int epoch = st->epoch; epoch < job->epochs && st->step < stop; epoch++) {
        td_loader_start_epoch(t->train_loader, epoch, st->epoch == epoch ? st->batch : 0);
        st->epoch = epoch;
        td_batch b;
        double group_loss = 0;
        while (st->step < stop && td_loader_next(t->train_loader, &b)) {
            float lr = td_schedule_lr(&sched, job->optim.lr, st->step);
            int micro = st->batch % accum;
            int group =
                batches - (st->batch - micro) < accum ? batches - (st->batch - micro) : accum;
            double loss = NAN; /* on the GPU it stays on the device until the next log line */
            if (t->gpu) {
                if (gpu_batch(t, &b, &run, lr, group, micro, err) != 0) return -1;
                st->batch++;
                interval_samples += (long)b.n * world_of(t);
                total_samples += (long)b.n * world_of(t);
                if (micro + 1 < group) continue;
            } else {
                run.n = b.n;
                run.accumulate_grads = micro > 0;
                if (profiling) td_model_enable_profile(&t->model);
                /* DDP's broadcast_buffers: BatchNorm statistics follow rank 0's */
                if (t->comm && !run.sync && t->model.buffer_floats &&
                    td_comm_broadcast(t->comm, t->model.buffer_block, t->model.buffer_floats, 0,
                                      err) != 0)
                    return collective_failed(t, err);
                const float *logits = td_model_forward(&t->model, b.x, &run);
                /* each batch of a group carries 1/group of the step's gradient */
                group_loss += td_loss_compute(&job->loss, logits, b.labels, b.n, t->classes,
                                              t->dlogits, 1.0f / (float)group, NULL) /
                              b.n;
                /* no_sync for all but the group's last batch; on the last, buckets of gradients
                 * are all-reduced while backward goes on, the loss riding with them */
                bool sync_now = t->reducer && micro + 1 == group;
                run.node_done = NULL;
                if (sync_now) td_reducer_begin(t->reducer, (float)(group_loss / group), &run);
                td_model_backward(&t->model, t->dlogits, &run);
                if (t->sync.failed) {
                    td_fail(err, "rank %d: a SyncBatchNorm reduction failed (a peer is gone?)",
                            t->dist->rank);
                    return collective_failed(t, err);
                }
                st->batch++;
                interval_samples += (long)b.n * world_of(t);
                total_samples += (long)b.n * world_of(t);
                if (micro + 1 < group) continue; /* no_sync: gradients accumulate locally */
                loss = group_loss / group;
                group_loss = 0;
                if (sync_now) { /* gradients and loss averaged over the replicas */
                    float l;
                    if (td_reducer_finish(t->reducer, &l, err) != 0)
                        return collective_failed(t, err);
                    loss = l; /* the mean over ranks, the same on every rank */
                }
                if (!isfinite(loss)) return diverged(err, loss, st->step + 1, epoch + 1);
                if (job->clip_grad_norm > 0)
                    td_grad_clip(t->model.grad_block, t->model.param_floats, job->clip_grad_norm);
                td_optim_step(&t->optim, t->model.param_block, t->model.grad_block, lr);
                st->interval_loss += loss;
                res->last_loss = loss;
            }
            st->step++;
            steps_here++;
            st->interval_steps++;
            interval_steps_here++;
            if (st->step % job->log_every == 0 || st->step == total) {
                if (t->gpu) {
                    if (gpu_flush_loss(t, err) != 0) return -1;
                    /* divergence shows at log lines here, not at the very step */
                    double mean = st->interval_loss / st->interval_steps;
                    if (!isfinite(mean)) return diverged(err, mean, st->step, epoch + 1);
                    res->last_loss = mean;
                }
                /* the loss covers the whole interval (after a resume, partly run by the earlier
                 * process); the timings only what this process ran */
                double now = now_s(), dt = now - t_interval;
                if (t->rank0) {
                    fprintf(t->metrics,
                            "{\"event\":\"train\",\"step\":%ld,\"epoch\":%d,\"loss\":%.9g,"
                            "\"lr\":%.9g,\"samples_per_s\":%.1f,\"step_ms\":%.4f",
                            st->step, epoch + 1, st->interval_loss / st->interval_steps, lr,
                            interval_samples / dt, dt * 1000.0 / interval_steps_here);
                    if (t->gpu) print_gpu_memory(t);
                    fprintf(t->metrics, "}\n");
                }
                fflush(t->metrics);
                st->interval_loss = 0;
                st->interval_steps = 0;
                interval_samples = interval_steps_here = 0;
                t_interval = now;
            }
            if (job->checkpoint_every_steps > 0 && st->step % job->checkpoint_every_steps == 0 &&
                save_checkpoint(t, err) != 0)
                return -1;
        }
        if (st->batch < batches) break; /* stopped inside the epoch */
        st->epoch = epoch + 1;
        st->batch = 0;
        res->epochs_done = epoch + 1;
        if (job->val.present) {
            double t0 = now_s();
            if (evaluate(t, &res->val_loss, &res->val_acc, err) != 0) return -1;
            res->has_val = true;
            if (t->rank0) print_eval(t, epoch + 1, st->step, res);
            fprintf(t->log, "[traind] epoch %d: val_loss %.4f, val_acc %.4f (eval %.2fs)\n",
                    epoch + 1, res->val_loss, res->val_acc, now_s() - t0);
            t_interval += now_s() - t0; /* evaluation time is not training throughput */
        }
        if (job->checkpoint_every_epochs > 0 && (epoch + 1) % job->checkpoint_every_epochs == 0 &&
            save_checkpoint(t, err) != 0)
            return -1;
    }
    td_model_print_profile(&t->model, steps_here, t->log);
    res->steps = st->step;
    if (st->step < total) { /* stopped early on request: save and leave, no final line */
        res->stopped = true;
        return save_checkpoint(t, err);
    }
    if (save_checkpoint(t, err) != 0) return -1;
    if (job->val.present && !res->has_val) {
        if (evaluate(t, &res->val_loss, &res->val_acc, err) != 0) return -1;
        res->has_val = true;
    }
    double elapsed = now_s() - t_start;
    if (!t->rank0) return 0;
    fprintf(t->metrics, "{\"event\":\"done\",\"step\":%ld,\"epoch\":%d,\"loss\":%.9g", st->step,
            res->epochs_done, res->last_loss);
    if (res->has_val)
        fprintf(t->metrics, ",\"val_loss\":%.9g,\"val_acc\":%.6f", res->val_loss, res->val_acc);
    fprintf(t->metrics, ",\"samples_per_s\":%.1f,\"elapsed_s\":%.3f}\n", total_samples / elapsed,
            elapsed);
    fflush(t->metrics);
    return 0;
}

/* Loads data, builds the model and restores init_from / resume_from: what training and
 * evaluation share. */
static int prepare(trainer *t, td_err *err) {
    openblas_set_num_threads(t->job->threads);
    if (setup_data(t, err) != 0 || resolve_device(t, err) != 0 || setup_model(t, err) != 0)
        return -1;
    if (restore(t, err) != 0 || setup_gpu(t, err) != 0) return -1;
    if (t->rank0) log_banner(t);
    if (setup_dist(t, err) != 0) return -1;
    if (t->job->val.present) t->val_loader = td_loader_create(&t->val, &t->norm, NULL, &t->val_cfg);
    return 0;
}

static void release(trainer *t) {
    if (t->gpu)
        t->gpu_api->close(t->gpu); /* NCCL first: the store it may still talk to closes below */
    td_reducer_stop(t->reducer, &t->model);
    td_comm_close(t->comm);
    if (t->own_store) td_store_close(t->store);
    td_loader_destroy(t->train_loader);
    td_loader_destroy(t->val_loader);
    free(t->dlogits);
    td_optim_free(&t->optim);
    td_model_free(&t->model);
    td_dataset_free(&t->train);
    td_dataset_free(&t->val);
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
    int rc = prepare(&t, err);
    if (rc == 0) {
        t.train_loader = td_loader_create(&t.train, &t.norm, &job->augment, &t.train_cfg);
        rc = train_loop(&t, result, err);
    }
    release(&t);
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
    if (!job->val.present)
        td_fail(err, "--eval: the spec has no data.val to evaluate on");
    else if (!job->resume_from[0] && !job->init_from[0])
        td_fail(err, "--eval: give resume_from or model.init_from, or there is nothing trained "
                     "to evaluate");
    else
        rc = prepare(&t, err);
    if (rc == 0) {
        rc = evaluate(&t, &result->val_loss, &result->val_acc, err);
        result->has_val = true;
        result->steps = t.state.step;
        result->epochs_done = t.state.epoch;
        if (rc == 0) print_eval(&t, t.state.epoch, t.state.step, result);
    }
    release(&t);
    return rc;
}
