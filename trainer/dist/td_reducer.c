#include "dist/td_reducer.h"
#include "dist/td_buckets.h"

#include <pthread.h>
#include <stdlib.h>
#include <string.h>

typedef struct reduce_op {
    float *buf;
    size_t n;
    bool average;
    bool done;
} reduce_op;

typedef struct bucket {
    td_bucket span; /* the plan's, the first extended by the loss slot */
    int pending;    /* of its parameters, those still without their gradient in this backward */
    reduce_op op;
} bucket;

struct td_reducer {
    td_comm *comm;
    float *block;     /* the gradients (communication memory), the loss slot after them */
    float *own_block; /* the model's block before, given back at stop */
    size_t loss_slot;
    td_buckets plan; /* dist/td_buckets.h; its bucket_of maps parameters to buckets */
    int n_buckets;
    bucket *buckets;

    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t work, done;
    reduce_op **queue; /* FIFO of n_buckets + 1 entries (a td_reducer_sum waits for its own) */
    int head, count, capacity;
    bool stop, failed;
    td_err err; /* the first failure */
};

static void *comm_thread(void *arg) {
    td_reducer *r = arg;
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->count && !r->stop) pthread_cond_wait(&r->work, &r->mu);
        if (!r->count) break; /* stopping, nothing left */
        reduce_op *op = r->queue[r->head];
        r->head = (r->head + 1) % r->capacity;
        r->count--;
        bool skip = r->failed;
        pthread_mutex_unlock(&r->mu);
        td_err err = {{0}};
        /* after a failure the ring is unusable: later operations fail without touching it */
        int rc = skip ? -1 : td_comm_allreduce(r->comm, op->buf, op->n, op->average, &err);
        pthread_mutex_lock(&r->mu);
        if (rc != 0 && !r->failed) {
            r->failed = true;
            r->err = err;
        }
        op->done = true;
        pthread_cond_broadcast(&r->done);
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void submit(td_reducer *r, reduce_op *op) {
    pthread_mutex_lock(&r->mu);
    op->done = false;
    r->queue[(r->head + r->count) % r->capacity] = op;
    r->count++;
    pthread_cond_signal(&r->work);
    pthread_mutex_unlock(&r->mu);
}

/* Waits for op; -1 with the first failure if any operation so far failed. */
static int wait_for(td_reducer *r, reduce_op *op, td_err *err) {
    pthread_mutex_lock(&r->mu);
    while (!op->done) pthread_cond_wait(&r->done, &r->mu);
    bool failed = r->failed;
    if (failed) *err = r->err;
    pthread_mutex_unlock(&r->mu);
    return failed ? -1 : 0;
}

/* The plan's buckets (dist/td_buckets.h), the first also carrying the loss slot after the last
 * parameter; a model without parameters gets one bucket of the loss alone, which still needs its
 * average. */
static int plan_buckets(td_reducer *r, const td_model *m, double cap_mb, td_err *err) {
    if (td_buckets_plan(&r->plan, m->params, m->n_params, cap_mb, err) != 0) return -1;
    r->n_buckets = r->plan.n > 0 ? r->plan.n : 1;
    r->buckets = td_calloc((size_t)r->n_buckets, sizeof(bucket));
    for (int i = 0; i < r->plan.n; i++) r->buckets[i].span = r->plan.bucket[i];
    r->buckets[0].span.hi = r->loss_slot + 1;
    return 0;
}

int td_reducer_start(td_reducer **out, td_comm *comm, td_model *model, double bucket_cap_mb,
                     td_err *err) {
    td_reducer *r = td_calloc(1, sizeof *r);
    r->comm = comm;
    r->loss_slot = model->param_floats;
    if (plan_buckets(r, model, bucket_cap_mb, err) != 0) {
        free(r);
        return -1;
    }
    r->block = td_comm_alloc(comm, model->param_floats + 1, err);
    if (!r->block) {
        td_buckets_free(&r->plan);
        free(r->buckets);
        free(r);
        return -1;
    }
    r->own_block = td_model_swap_grad_block(model, r->block);
    r->capacity = r->n_buckets + 1;
    r->queue = td_calloc((size_t)r->capacity, sizeof *r->queue);
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->work, NULL);
    pthread_cond_init(&r->done, NULL);
    int rc = pthread_create(&r->thread, NULL, comm_thread, r);
    if (rc != 0) {
        td_model_swap_grad_block(model, r->own_block);
        td_comm_free(comm, r->block);
        free(r->queue);
        free(r->buckets);
        td_buckets_free(&r->plan);
        free(r);
        return td_fail(err, "starting the gradient communication thread: %s", strerror(rc));
    }
    *out = r;
    return 0;
}

void td_reducer_stop(td_reducer *r, td_model *model) {
    if (!r) return;
    pthread_mutex_lock(&r->mu);
    r->stop = true;
    pthread_cond_signal(&r->work);
    pthread_mutex_unlock(&r->mu);
    pthread_join(r->thread, NULL);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->work);
    pthread_cond_destroy(&r->done);
    td_model_swap_grad_block(model, r->own_block);
    td_comm_free(r->comm, r->block);
    free(r->queue);
    free(r->buckets);
    td_buckets_free(&r->plan);
    free(r);
}

/* The last bucket is not handed to the thread: it fills when backward ends, so nothing is left
 * to overlap, and td_reducer_finish all-reduces it on the calling thread instead, saving two
 * thread wake-ups per step (on a VM, each can cost more than the all-reduce itself). */
static void node_done(void *ctx, const td_node *node) {
    td_reducer *r = ctx;
    for (int j = 0; j < node->n_params; j++) {
        if (!td_node_finishes(node, node->params[j])) continue; /* a tied weight: not yet */
        int i = r->plan.bucket_of[node->param_ids[j]];
        bucket *b = &r->buckets[i];
        if (--b->pending == 0 && i + 1 < r->n_buckets) submit(r, &b->op);
    }
}

void td_reducer_begin(td_reducer *r, float loss, td_run *run) {
    r->block[r->loss_slot] = loss;
    for (int i = 0; i < r->n_buckets; i++) {
        bucket *b = &r->buckets[i];
        b->pending = b->span.params;
        b->op = (reduce_op){r->block + b->span.lo, b->span.hi - b->span.lo, true, false};
        if (b->span.params == 0) submit(r, &b->op); /* only the loss */
    }
    run->node_done = node_done;
    run->node_done_ctx = r;
}

int td_reducer_finish(td_reducer *r, float *loss, td_err *err) {
    int last = r->n_buckets - 1;
    for (int i = 0; i < last; i++) {
        bucket *b = &r->buckets[i];
        if (b->pending > 0) /* a parameter backward never reached: every bucket must go out */
            submit(r, &b->op), b->pending = 0;
        if (wait_for(r, &b->op, err) != 0) return -1;
    }
    /* every earlier operation is done (the queue is FIFO), so the ranks still call collectives
     * in one order; a bucket of only the loss was already submitted by begin */
    bucket *b = &r->buckets[last];
    pthread_mutex_lock(&r->mu);
    bool failed = r->failed; /* e.g. a SyncBatchNorm sum in this backward */
    if (failed) *err = r->err;
    pthread_mutex_unlock(&r->mu);
    if (failed) return -1;
    if (b->span.params == 0) {
        if (wait_for(r, &b->op, err) != 0) return -1;
    } else if (td_comm_allreduce(r->comm, b->op.buf, b->op.n, b->op.average, err) != 0) {
        pthread_mutex_lock(&r->mu);
        r->failed = true; /* the ring is unusable now: later operations fail at once */
        r->err = *err;
        pthread_mutex_unlock(&r->mu);
        return -1;
    }
    *loss = r->block[r->loss_slot];
    return 0;
}

int td_reducer_sum(td_reducer *r, float *values, size_t n, td_err *err) {
    reduce_op op = {values, n, false, false};
    submit(r, &op);
    return wait_for(r, &op, err);
}

int td_reducer_buckets(const td_reducer *r) {
    return r->n_buckets;
}

const char *td_reducer_transport(const td_reducer *r) {
    return td_comm_transport(r->comm, r->block);
}
