/* Data parallel (DDP): joining the job (the rendezvous store, then the TCP ring or NCCL, then
 * rank 0's parameters everywhere), the collectives the loop calls, and what a rank reports when
 * one fails. */
#include "train/td_train_private.h"

#include <stdlib.h>
#include <string.h>

int td_train_world(const trainer *t) {
    return td_dist_active(t->dist) ? t->dist->world : 1;
}

/* TRAIND_FORCE_DDP=1: a world of one still goes through DDP (NCCL, buckets): what its overhead
 * costs is then measurable, and its steps comparable with the plain run's. GPU only. */
static bool force_ddp(const trainer *t) {
    const char *v = getenv("TRAIND_FORCE_DDP");
    return t->gpu && td_train_world(t) == 1 && v && strcmp(v, "1") == 0;
}

/* After a collective failed: the first rank to fail records its message in the store; the
 * others, whose failure is often the cascade (a neighbour that gave up), add it to theirs, so
 * every rank's error leads to the rank that really died. Best effort, with a short deadline:
 * the store itself may be gone (rank 0 hosts it). */
int td_train_collective_failed(trainer *t, td_err *err) {
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
    if (order == td_train_world(t) - 1)
        td_store_set(t->store, "failure/reported", "1", 1, &ignored);
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

int td_train_allreduce(trainer *t, float *v, size_t n, bool average, td_err *err) {
    if (t->gpu_ddp) {
        if (t->gpu_api->ddp_allreduce_host(t->gpu, v, n, average, err) != 0)
            return td_train_collective_failed(t, err);
        return 0;
    }
    if (!t->comm) return 0;
    if (td_comm_allreduce(t->comm, v, n, average, err) != 0)
        return td_train_collective_failed(t, err);
    return 0;
}

/* Every rank arrives before any leaves (around rank 0's checkpoint writes). */
int td_train_barrier(trainer *t, td_err *err) {
    if (t->gpu_ddp) {
        float one = 1.0f;
        return td_train_allreduce(t, &one, 1, false, err);
    }
    return t->comm && td_comm_barrier(t->comm, err) != 0 ? td_train_collective_failed(t, err) : 0;
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
static int join_gpu(trainer *t, int rank, int world, td_err *err) {
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
    if (t->gpu_api->ddp_start(t->gpu, &t->model, t->store, rank, world,
                              job->distributed.bucket_cap_mb, timeout, job->train.sync_bn,
                              err) != 0)
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
                job->distributed.bucket_cap_mb,
                job->train.sync_bn ? "; SyncBatchNorm statistics over every rank's batch" : "");
    return 0;
}

/* Joins the job: the rendezvous store, the ring, then the replicas start from rank 0's
 * parameters and buffers (as DDP's constructor broadcasts them). */
int td_train_join(trainer *t, td_err *err) {
    const td_job *job = t->job;
    int rank = td_dist_active(t->dist) ? t->dist->rank : 0, world = td_train_world(t);
    if (world == 1 && !force_ddp(t)) return 0;
    const td_dist *d = t->dist;
    if (t->gpu) return join_gpu(t, rank, world, err);
    t->store = t->opt->store;
    if (!t->store) {
        if (td_store_open_rank(&t->store, d->master_addr, d->master_port, t->rank0, d->namespace_,
                               rank, world, d->timeout_s, err) != 0)
            return -1;
        t->own_store = true;
    }
    /* several nodes: each rank says where its peers dial it, since that is what goes wrong
     * between hosts (a hostname that resolves to loopback, the wrong interface) */
    if (d->local_world < d->world)
        fprintf(t->log, "[traind] rank %d advertises %s for its ring connections (%s)\n", rank,
                d->host, d->host_why);
    if (td_comm_init(&t->comm, t->store, rank, world, d->host, NULL, d->timeout_s, err) != 0)
        return join_failed(t, err);
    if (td_store_ready(t->store, rank, world, err) != 0) return -1;
    if (td_comm_broadcast(t->comm, t->model.param_block, t->model.param_floats, 0, err) != 0 ||
        td_comm_broadcast(t->comm, t->model.buffer_block, t->model.buffer_floats, 0, err) != 0)
        return td_fail_prefix(err, "broadcasting rank 0's parameters");
    if (td_reducer_start(&t->reducer, t->comm, &t->model, job->distributed.bucket_cap_mb, err) != 0)
        return -1;
    if (job->train.sync_bn) t->sync = (td_sync){.sum = sync_sum, .ctx = t};
    if (t->rank0)
        fprintf(t->log,
                "[traind] data parallel: %d ranks, %d per node; gradients in %d bucket%s "
                "(bucket_cap_mb %g), all-reduced through %s\n",
                world, d->local_world, td_reducer_buckets(t->reducer),
                td_reducer_buckets(t->reducer) == 1 ? "" : "s", job->distributed.bucket_cap_mb,
                td_reducer_transport(t->reducer));
    return 0;
}
