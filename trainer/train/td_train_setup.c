/* Before the loop: the data, the device, the model (restored from a checkpoint where the spec
 * says), the GPU, the loaders and the banner, then joining the job; after it, releasing all of
 * it. The order matters: the device is chosen before the model is built (a GPU model gets no
 * host arena), and the restored model is what moves onto the GPU and what rank 0 broadcasts. */
#define _GNU_SOURCE /* sched_getaffinity, CPU_COUNT */
#include "train/td_train_private.h"

#include "ops/td_ops.h"

#include "core/td_blas.h"
#include "core/td_isa.h"
#include "base/td_clock.h"
#include "core/td_parallel.h"

#include <cblas.h>
#include <sched.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static int setup_data(trainer *t, td_err *err) {
    const td_job *job = t->job;
    /* synthetic splits: distinct streams of the run's seed (1: train, 2: val) */
    uint64_t seed = job->train.seed * 0x9E3779B97F4A7C15ull;
    if (td_data_load_split(&job->data, &job->data.train, job->model.num_classes, seed + 1,
                           &t->train, err) != 0)
        return td_fail_prefix(err, "data.train");
    if (job->data.val.present) {
        if (td_data_load_split(&job->data, &job->data.val, job->model.num_classes, seed + 2,
                               &t->val, err) != 0)
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
    if (job->data.norm_given) {
        if (job->data.norm.channels != channels && job->data.norm.channels != 1)
            return td_fail(err,
                           "data.normalize: gives %d values per list but the images have %d "
                           "channel%s",
                           job->data.norm.channels, channels, channels > 1 ? "s" : "");
        t->norm = job->data.norm;
    } else {
        t->norm.channels = channels;
        for (int c = 0; c < channels; c++) t->norm.mean[c] = 0.0f, t->norm.std[c] = 1.0f;
    }
    return 0;
}

/* The spec's nodes, with the gpt preset's vocabulary from the text data when it gave none. */
static int build_model(trainer *t, int max_n, int threads, unsigned flags, td_err *err) {
    const td_job *job = t->job;
    td_node_spec *nodes = job->model.nodes;
    if (job->model.vocab_from_data) {
        if (!t->train.tokens)
            return td_fail(err, "model.vocab_size: needed unless data.format is \"text\" (whose "
                                "tokenizer gives the vocabulary)");
        nodes = td_malloc((size_t)job->model.n_nodes * sizeof *nodes);
        memcpy(nodes, job->model.nodes, (size_t)job->model.n_nodes * sizeof *nodes);
        td_preset_gpt_vocab(nodes, job->model.n_nodes, t->train.num_classes);
    }
    int rc = td_model_build(&t->model, nodes, job->model.n_nodes, t->train.shape, max_n, threads,
                            job->train.seed, flags, err);
    if (nodes != job->model.nodes) free(nodes);
    return rc;
}

static int setup_model(trainer *t, td_err *err) {
    const td_job *job = t->job;
    int max_n = job->train.batch_size > job->train.eval_batch_size ? job->train.batch_size
                                                                   : job->train.eval_batch_size;
    unsigned flags = t->device.device == TD_DEVICE_CUDA ? TD_MODEL_NO_ARENA : 0;
    /* TRAIND_FUSE_RELU=0: every ReLU as a node of its own on the CPU (for comparing; the result
     * is the same to the bit, tests/unit/test_fusion.c) */
    const char *fuse = getenv("TRAIND_FUSE_RELU");
    if (fuse && strcmp(fuse, "0") == 0) flags |= TD_MODEL_UNFUSED;
    /* on a GPU the host threads only feed it: the model's own work is the device's */
    int threads = t->device.device == TD_DEVICE_CUDA ? 1 : job->train.threads;
    if (build_model(t, max_n, threads, flags, err) != 0) return -1;
    td_shape out = td_model_output_shape(&t->model);
    if (out.spatial)
        return td_fail(err,
                       "model: the last node outputs an image [%d, %d, %d]; expected logits "
                       "[classes] (end with a linear node)",
                       out.c, out.h, out.w);
    /* logits at every position [T, V] need a label at every position (text), and one label per
     * sample logits [classes]: never one read as the other */
    t->positions = td_dataset_positions(&t->train);
    if (out.h != t->positions && t->positions > 1)
        return td_fail(err,
                       "model: the last node outputs [%d, %d] per sample; text data has a label "
                       "at each of its %d positions, so the model must end in logits "
                       "[block_size, vocab] (a linear node after the last sequence node)",
                       out.h, out.c, t->positions);
    if (out.h != t->positions)
        return td_fail(err,
                       "model: the last node outputs a sequence [%d, %d]; the data's one label "
                       "per sample needs logits [classes]",
                       out.h, out.c);
    t->classes = out.c;
    /* token ids past an embedding's table would read NaN rows: the vocabulary must fit */
    for (int i = 0; t->train.tokens && i < t->model.n_nodes; i++) {
        const td_node *nd = &t->model.nodes[i];
        int rows = nd->op == &td_op_embedding ? (int)td_node_arg(nd, "num_embeddings") : 0;
        if (rows && nd->inputs[0] == TD_INPUT_NODE && rows < t->train.num_classes)
            return td_fail(err,
                           "model.nodes[%d] (\"%s\", embedding): num_embeddings is %d but the "
                           "text's vocabulary has %d tokens",
                           i, nd->name, rows, t->train.num_classes);
    }
    if (job->model.num_classes && job->model.num_classes != out.c)
        return td_fail(err, "model: the last node outputs %d values but num_classes is %d", out.c,
                       job->model.num_classes);
    const td_dataset *sets[2] = {&t->train, job->data.val.present ? &t->val : NULL};
    for (int i = 0; i < 2; i++) {
        if (!sets[i]) continue;
        int max_label = td_dataset_max_label(sets[i]);
        if (max_label >= t->classes)
            return td_fail(err,
                           "data.%s: holds label %d but the model has %d classes (labels "
                           "must be 0..%d)",
                           i ? "val" : "train", max_label, t->classes, t->classes - 1);
    }
    td_optim_init(&t->optim, &job->train.optim, t->model.param_floats);
    t->optim.threads = t->model.threads;
    if (job->train.optim.decay_matrices) {
        /* biases and norms' scales (fewer than 2 dimensions) take no decay; params are in
         * block order, so the ranges come sorted */
        size_t(*ranges)[2] = td_malloc((size_t)t->model.n_params * sizeof *ranges);
        int n = 0;
        for (int i = 0; i < t->model.n_params; i++) {
            const td_param *p = &t->model.params[i];
            if (p->ndim >= 2) continue;
            ranges[n][0] = p->offset;
            ranges[n][1] = p->offset + p->size;
            n++;
        }
        td_optim_set_no_decay(&t->optim, (const size_t(*)[2])ranges, n);
        free(ranges);
    }
    /* the CPU's loss gradient (GPT-2's is 3.3 GB at batch 16); a GPU keeps its own */
    if (t->device.device != TD_DEVICE_CUDA)
        t->dlogits = td_aligned_alloc((size_t)max_n * t->positions * t->classes * sizeof(float));
    t->state.seed = job->train.seed;
    td_rng_seed_for(&t->state.dropout_rng, job->train.seed, "dropout", 0);
    t->last_saved_step = -1;
    return 0;
}

/* Decides CPU or GPU, precision and collective backend before the model is built (a GPU model
 * gets no host arena). */
static int resolve_device(trainer *t, td_err *err) {
    const td_job *job = t->job;
    char why[256];
    int gpus = td_gpu_device_count(why, sizeof why);
    int local_rank = t->dist ? t->dist->local_rank : 0;
    if (td_device_resolve(job->train.device, job->train.precision, job->distributed.backend, gpus,
                          why, local_rank, getenv("CUDA_VISIBLE_DEVICES"), &t->device, err) != 0)
        return -1;
    t->graph_off = !job->train.cuda_graph;
    return 0;
}

/* Opens the device and moves the restored model and optimizer onto it. */
static int setup_gpu(trainer *t, td_err *err) {
    if (t->device.device != TD_DEVICE_CUDA) return 0;
    t->gpu_api = td_gpu_load(err);
    if (!t->gpu_api || t->gpu_api->open(&t->gpu, t->device.cuda_device, err) != 0)
        return td_fail_prefix(err, "train.device");
    t->gpu_api->set_deterministic(t->gpu, t->job->train.deterministic);
    if (t->gpu_api->attach(t->gpu, &t->model, t->device.precision, t->job->train.seed, err) != 0 ||
        t->gpu_api->optim_init(t->gpu, &t->model, &t->optim, err) != 0)
        return td_fail_prefix(err, "train.device");
    if (t->job->train.cudnn_benchmark) {
        double t0 = td_clock_now();
        int timed = 0;
        if (t->gpu_api->benchmark_convolutions(t->gpu, &t->model, &timed, err) != 0) return -1;
        if (!td_dist_active(t->dist) || t->dist->rank == 0)
            fprintf(t->log, "[traind] cuDNN benchmark: %d convolution%s timed in %.1f s\n", timed,
                    timed == 1 ? "" : "s", td_clock_now() - t0);
    }
    return 0;
}

/* data.num_workers, "auto" resolved. On the CPU: one loader thread when this process may run on
 * more cores than train.threads (it overlaps the step on a core the step leaves free), else
 * none, the training thread making each batch (a data-parallel rank pinned to its core: a loader
 * thread there preempts the step at random moments, and its peers then wait for it at the
 * all-reduce; making a LeNet batch takes ~0.04 ms of a 3 ms step). On a GPU this rank's share of
 * the cores it may run on, less one for the thread that drives the device, at most 8 (a
 * 3x224x224 batch of 256 takes one core ~20 ms, a ResNet-50 step on an H100 well under 100 ms).
 * A rank whose launcher pinned it to some of the cores has those to itself; an unpinned one
 * shares the machine's with the node's other ranks. */
int td_train_loader_workers(const trainer *t) {
    if (t->job->data.num_workers != TD_WORKERS_AUTO) return t->job->data.num_workers;
    cpu_set_t set;
    int cores = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    if (!t->gpu) return cores > t->job->train.threads ? 1 : 0;
    long online = sysconf(_SC_NPROCESSORS_ONLN);
    int local =
        t->dist && td_dist_active(t->dist) && t->dist->local_world > 0 ? t->dist->local_world : 1;
    if (online > 0 && cores < online) local = 1;
    int n = cores / local - 1;
    return n < 1 ? 1 : n > 8 ? 8 : n;
}

/* Both loaders read this rank's part of the data (the sampler splits it by rank and world). */
static void configure_loaders(trainer *t) {
    const td_job *job = t->job;
    int rank = td_dist_active(t->dist) ? t->dist->rank : 0, world = td_train_world(t);
    t->rank0 = rank == 0;
    int workers = td_train_loader_workers(t);
    t->train_cfg = (td_loader_config){job->train.batch_size,
                                      job->train.shuffle,
                                      job->train.drop_last,
                                      job->train.seed,
                                      rank,
                                      world,
                                      true,
                                      workers};
    t->val_cfg = (td_loader_config){
        job->train.eval_batch_size, false, false, job->train.seed, rank, world, false, workers};
}

/* The CPUs this process may run on, as "0-3,8": a launcher may have bound each rank to its
 * share (traind-run), and a rank given fewer CPUs than train.threads would show it here. */
static void cpu_list(char *out, size_t len) {
    cpu_set_t set;
    size_t used = 0;
    out[0] = 0;
    if (sched_getaffinity(0, sizeof set, &set) != 0) {
        snprintf(out, len, "unknown");
        return;
    }
    for (int c = 0; c < CPU_SETSIZE && used < len; c++) {
        if (!CPU_ISSET(c, &set)) continue;
        int last = c;
        while (last + 1 < CPU_SETSIZE && CPU_ISSET(last + 1, &set)) last++;
        used += (size_t)snprintf(out + used, len - used, last > c ? "%s%d-%d" : "%s%d",
                                 used ? "," : "", c, last);
        c = last;
    }
}

static void log_banner(const trainer *t) {
    const td_job *job = t->job;
    fprintf(t->log, "[traind] job \"%s\": %d parameters in %d tensors, %d nodes\n", job->name,
            (int)t->model.param_count, t->model.n_params, t->model.n_nodes);
    char shape[64];
    td_shape_format(t->train.shape, shape, sizeof shape);
    int workers = td_train_loader_workers(t);
    char loaders[48];
    snprintf(loaders, sizeof loaders, "%d loader thread%s", workers, workers == 1 ? "" : "s");
    fprintf(t->log, "[traind] data: %d training samples%s, shape %s, %d classes; %s\n", t->train.n,
            job->data.format == TD_DATA_SYNTHETIC ? " (synthetic)" : "", shape, t->classes,
            workers ? loaders : "batches made in the training thread");
    if (job->data.val.present) fprintf(t->log, "[traind] data: %d validation samples\n", t->val.n);
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
                job->train.deterministic ? "" : "; cuDNN may choose nondeterministic algorithms");
        return;
    }
    char why[256], cpus[128], fusion[64] = "";
    td_gpu_device_count(why, sizeof why);
    cpu_list(cpus, sizeof cpus);
    int fused = 0;
    for (int i = 0; i < m->n_nodes; i++) fused += m->nodes[i].out_fused;
    if (fused)
        snprintf(fusion, sizeof fusion, ", %d ReLU%s fused into max-pool%s", fused,
                 fused == 1 ? "" : "s", fused == 1 ? "" : "s");
    fprintf(t->log,
            "[traind] device: CPU, OpenBLAS %s kernels, traind %s kernels (%s), %d thread%s on "
            "CPUs %s%s (%s)\n",
            td_blas_describe(), td_isa_name(td_isa_active()), td_isa_why(), job->train.threads,
            job->train.threads > 1 ? "s" : "", cpus, fusion, why);
}

int td_train_setup(trainer *t, td_err *err) {
    /* train.threads is the model's own team (core/td_parallel.h); OpenBLAS runs inside it */
    td_par_blas_single();
    if (setup_data(t, err) != 0 || resolve_device(t, err) != 0 || setup_model(t, err) != 0 ||
        td_train_sample_setup(t, err) != 0)
        return -1;
    if (td_train_restore(t, err) != 0 || setup_gpu(t, err) != 0) return -1;
    if (t->rank0) log_banner(t);
    configure_loaders(t);
    if (td_train_join(t, err) != 0) return -1;
    if (t->job->data.val.present)
        t->val_loader = td_loader_create(&t->val, &t->norm, NULL, &t->val_cfg);
    if (t->job->data.val.present && t->positions > 1 && t->job->train.eval_iters > 0) {
        /* random training windows of a stream of their own: the training batches stay as they
         * would be without evaluations (nanoGPT's estimate_loss draws from the global RNG and
         * shifts them: traind differs there, and says so in docs/job-spec.md) */
        td_loader_config c = t->train_cfg;
        c.pad = c.drop_last = false;
        c.shuffle = true;
        c.seed ^= 0x65737469ull; /* "esti" */
        c.workers = 0;
        t->estimate_loader = td_loader_create(&t->train, &t->norm, NULL, &c);
    }
    return 0;
}

void td_train_release(trainer *t) {
    if (t->gpu)
        t->gpu_api->close(t->gpu); /* NCCL first: the store it may still talk to closes below */
    td_reducer_stop(t->reducer, &t->model);
    td_comm_close(t->comm);
    if (t->own_store) td_store_close(t->store);
    td_loader_destroy(t->train_loader);
    td_loader_destroy(t->val_loader);
    td_loader_destroy(t->estimate_loader);
    free(t->dlogits);
    td_optim_free(&t->optim);
    td_model_free(&t->model);
    td_dataset_free(&t->train);
    td_dataset_free(&t->val);
    td_train_sample_release(t);
}
