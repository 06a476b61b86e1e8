// Data-parallel gradients through NCCL, as torch.nn.parallel.DistributedDataParallel does them on
// GPUs: the same buckets as the CPU reducer (one plan, dist/td_buckets.h), each all-reduced
// (ncclAvg, in place) on a communication stream as soon as backward has produced it, so
// communication overlaps the rest of backward; the compute stream then waits for the last bucket on
// the device, never on the host.
//
// Failure handling. The communicator is non-blocking (config.blocking = 0): no NCCL call can
// trap this thread while a peer is gone, and another thread may abort it. A watchdog thread
// polls ncclCommGetAsyncError and, while a host wait is armed, its deadline; on an error or a
// deadline passed it aborts the communicator (NCCL's kernels then return) and records the
// failure. Host waits poll an event instead of blocking in cudaStreamSynchronize, so a dead peer
// becomes an error return on every rank, never a hang.
//
// SyncBatchNorm's per-channel sums go through the same communicator on the same communication
// stream, between the compute stream's fork and join events, as PyTorch's process group puts them
// on its one NCCL stream beside DDP's buckets: every rank then issues one sequence of
// collectives (the host's order of BatchNorm passes and bucket launches, the same everywhere),
// which is what NCCL needs to never deadlock.
//
// Nothing is created or allocated after td_gpu_ddp_start: begin/finish only record events, wait
// on them and enqueue collectives, so a captured CUDA graph of a step holds its all-reduces.
#include "gpu/cuda/td_gpu_internal.h"

extern "C" {
#include "core/td_error.h"
#include "dist/td_buckets.h"
#include "dist/td_store.h"
}

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// td_gpu_ddp_allreduce_host's staging, in floats; longer inputs go through in chunks.
#define HOST_FLOATS 4096
// How often the watchdog looks at the communicator.
#define WATCHDOG_PERIOD_S 0.05
#define UNIQUE_ID_KEY     "nccl/unique-id"

struct td_gpu_ddp {
    td_gpu *g;
    int rank, world;
    double timeout_s;
    cudaStream_t stream; // communication

    td_buckets plan;    // dist/td_buckets.h: each bucket's floats, and each parameter's bucket
    int *pending;       // per bucket: its parameters still without their gradient in this backward
    cudaEvent_t *ready; // per bucket: recorded on the compute stream when its gradients are final
    cudaEvent_t fork;   // compute -> communication, outside backward
    cudaEvent_t join;   // communication -> compute
    cudaEvent_t host_done, wait_done;
    bool sync_bn;                     // SyncBatchNorm: BatchNorm's sums span every rank
    cudaEvent_t sync_fork, sync_join; // around each of its all-reduces
    int next; // the next bucket to launch in this backward: buckets go out in order
    bool in_backward;
    bool launch_failed;

    float *host_dev;    // [HOST_FLOATS], allreduce_host's device side
    float *host_pinned; // [HOST_FLOATS], its host side

    // The communicator and what the watchdog shares with this thread. NCCL calls happen under
    // mu, so the watchdog never aborts (frees) the communicator while this thread is inside one;
    // the calls are non-blocking, so mu is never held for long except by an abort.
    pthread_mutex_t mu;
    pthread_cond_t wake;
    ncclComm_t comm; // NULL once aborted or destroyed
    bool aborted;
    bool stop;
    double deadline;      // CLOCK_MONOTONIC seconds by which the armed wait must end; 0: none
    const char *what;     // what the armed wait waits for, for the message
    char why[TD_ERR_MAX]; // the abort's reason
    pthread_t watchdog;
    bool watchdog_running;
    bool sync_ready, mu_ready;
};

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void sleep_us(unsigned us) {
    struct timespec ts = {(time_t)(us / 1000000u), (long)(us % 1000000u) * 1000L};
    nanosleep(&ts, NULL);
}

// Poll intervals grow from a few microseconds (a step's wait is usually short) to a millisecond
// (a long one should not burn a core).
static unsigned next_backoff(unsigned us) {
    return us < 1000u ? us * 2u : 1000u;
}

// The device context's first failure as the caller's error.
static int gpu_error(td_gpu *g, td_err *err) {
    return td_fail(err, "%s", g->failed ? g->msg : "a GPU operation failed");
}

// The abort's reason when the communicator was aborted (written under mu, so read it there: the
// watchdog may be writing the device context's message at the same moment), else the device
// context's first failure.
static int ddp_error(td_gpu_ddp *d, td_err *err) {
    pthread_mutex_lock(&d->mu);
    bool aborted = d->aborted;
    if (aborted) td_fail(err, "%s", d->why);
    pthread_mutex_unlock(&d->mu);
    return aborted ? -1 : gpu_error(d->g, err);
}

static bool is_aborted(td_gpu_ddp *d) {
    pthread_mutex_lock(&d->mu);
    bool aborted = d->aborted;
    pthread_mutex_unlock(&d->mu);
    return aborted;
}

// With mu held: aborts the communicator (its kernels return, the peers' collectives fail rather
// than wait for us) and records why, once. mu is released around ncclCommAbort: after raising
// its abort flag it waits until no CUDA graph holds the communicator, and the graph is destroyed
// by the main thread (td_gpu_detach) once it has seen `aborted` — which it reads under mu.
static void abort_locked(td_gpu_ddp *d, int line, const char *what, const char *why,
                         const char *hint) {
    if (d->aborted) return;
    d->aborted = true;
    snprintf(d->why, sizeof d->why, "%s: %s (%s)", what, why, hint);
    ncclComm_t comm = d->comm;
    d->comm = NULL;
    td_gpu_fail(d->g, __FILE__, line, what, why, hint);
    if (comm) {
        pthread_mutex_unlock(&d->mu);
        ncclResult_t r = ncclCommAbort(comm);
        if (r != ncclSuccess)
            fprintf(stderr, "[traind] rank %d: ncclCommAbort: %s\n", d->rank,
                    ncclGetErrorString(r));
        pthread_mutex_lock(&d->mu);
    }
}

static void abort_comm(td_gpu_ddp *d, int line, const char *what, const char *why,
                       const char *hint) {
    pthread_mutex_lock(&d->mu);
    abort_locked(d, line, what, why, hint);
    pthread_mutex_unlock(&d->mu);
}

static const char *const PEER_HINT =
    "a peer rank probably died or stopped calling collectives; its own log has the first error";

// Waits until the communicator has finished the call just made: in non-blocking mode any call
// may return ncclInProgress before its work is enqueued. Returns 0 once the state is
// ncclSuccess; -1 (communicator aborted, failure recorded) on an error or after timeout_s.
static int settle(td_gpu_ddp *d, const char *what) {
    double deadline = now_s() + d->timeout_s;
    char why[512];
    for (unsigned us = 2;; us = next_backoff(us)) {
        pthread_mutex_lock(&d->mu);
        if (d->aborted) {
            pthread_mutex_unlock(&d->mu);
            return -1;
        }
        ncclResult_t state = ncclInvalidUsage; // no communicator: nothing can complete
        if (d->comm) {
            ncclResult_t r = ncclCommGetAsyncError(d->comm, &state);
            if (r != ncclSuccess) state = r;
        }
        if (state != ncclSuccess && state != ncclInProgress) {
            snprintf(why, sizeof why, "rank %d: %s failed: %s (%s)", d->rank, what,
                     ncclGetErrorString(state), d->comm ? ncclGetLastError(d->comm) : "");
            abort_locked(d, __LINE__, "NCCL", why, td_gpu_hint_nccl(state));
            pthread_mutex_unlock(&d->mu);
            return -1;
        }
        pthread_mutex_unlock(&d->mu);
        if (state == ncclSuccess) return 0;
        if (now_s() > deadline) {
            snprintf(why, sizeof why,
                     "rank %d: %s did not complete within the %.0f s timeout (TRAIND_TIMEOUT_S); "
                     "the NCCL communicator was aborted",
                     d->rank, what, d->timeout_s);
            abort_comm(d, __LINE__, "NCCL timeout", why, PEER_HINT);
            return -1;
        }
        sleep_us(us);
    }
}

enum { OP_ALLREDUCE, OP_BROADCAST };

// One collective on the communication stream, in place on device values of `type`: launched
// under mu, then settled. -1 with the failure recorded.
static int collective(td_gpu_ddp *d, int kind, void *buf, size_t n, ncclDataType_t type,
                      ncclRedOp_t op, const char *what) {
    pthread_mutex_lock(&d->mu);
    if (d->aborted) {
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    ncclResult_t r = kind == OP_ALLREDUCE ? ncclAllReduce(buf, buf, n, type, op, d->comm, d->stream)
                                          : ncclBroadcast(buf, buf, n, type, 0, d->comm, d->stream);
    if (r != ncclSuccess && r != ncclInProgress) {
        // the peers would wait for this rank's part forever: abort, so they fail too
        char why[512];
        snprintf(why, sizeof why, "rank %d: %s: %s (%s)", d->rank, what, ncclGetErrorString(r),
                 ncclGetLastError(d->comm));
        abort_locked(d, __LINE__, kind == OP_ALLREDUCE ? "ncclAllReduce" : "ncclBroadcast", why,
                     td_gpu_hint_nccl(r));
        pthread_mutex_unlock(&d->mu);
        return -1;
    }
    pthread_mutex_unlock(&d->mu);
    return r == ncclInProgress ? settle(d, what) : 0;
}

// Arms the watchdog's deadline for a host wait on `what`.
static void arm(td_gpu_ddp *d, const char *what) {
    pthread_mutex_lock(&d->mu);
    d->deadline = now_s() + d->timeout_s;
    d->what = what;
    pthread_mutex_unlock(&d->mu);
}

static void disarm(td_gpu_ddp *d) {
    pthread_mutex_lock(&d->mu);
    d->deadline = 0;
    d->what = NULL;
    pthread_mutex_unlock(&d->mu);
}

// Waits on the host for ev by polling, so that the watchdog's abort (which lets NCCL's kernels
// return, or leaves them stuck: either way `aborted` is set) ends the wait with an error.
static int wait_event(td_gpu_ddp *d, cudaEvent_t ev, const char *what, td_err *err) {
    td_gpu *g = d->g;
    arm(d, what);
    for (unsigned us = 2;; us = next_backoff(us)) {
        cudaError_t q = cudaEventQuery(ev);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
            disarm(d);
            td_gpu_fail(g, __FILE__, __LINE__, "cudaEventQuery", cudaGetErrorString(q),
                        td_gpu_hint_cuda(q));
            return ddp_error(d, err);
        }
        if (is_aborted(d)) {
            disarm(d);
            return ddp_error(d, err);
        }
        sleep_us(us);
    }
    disarm(d);
    // a collective cut short by an abort completes its event too, over garbage
    if (is_aborted(d)) return ddp_error(d, err);
    return 0;
}

static void *watchdog_main(void *arg) {
    td_gpu_ddp *d = (td_gpu_ddp *)arg;
    // ncclCommAbort releases device resources: it runs with the communicator's device current
    TD_CUDA_RET(d->g, cudaSetDevice(d->g->device), NULL);
    char why[512];
    pthread_mutex_lock(&d->mu);
    while (!d->stop) {
        struct timespec until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_nsec += (long)(WATCHDOG_PERIOD_S * 1e9);
        if (until.tv_nsec >= 1000000000L) {
            until.tv_sec++;
            until.tv_nsec -= 1000000000L;
        }
        pthread_cond_timedwait(&d->wake, &d->mu, &until);
        if (d->stop || d->aborted || !d->comm) continue;
        ncclResult_t state = ncclSuccess;
        ncclResult_t r = ncclCommGetAsyncError(d->comm, &state);
        if (r != ncclSuccess) state = r;
        if (state != ncclSuccess && state != ncclInProgress) {
            snprintf(why, sizeof why,
                     "rank %d: the NCCL communicator reported %s (%s); it was aborted", d->rank,
                     ncclGetErrorString(state), ncclGetLastError(d->comm));
            abort_locked(d, __LINE__, "NCCL asynchronous error", why, PEER_HINT);
        } else if (d->deadline > 0 && now_s() > d->deadline) {
            snprintf(why, sizeof why,
                     "rank %d: waited more than the %.0f s timeout (TRAIND_TIMEOUT_S) for %s; "
                     "the NCCL communicator was aborted",
                     d->rank, d->timeout_s, d->what ? d->what : "the GPU");
            abort_locked(d, __LINE__, "NCCL timeout", why, PEER_HINT);
        }
    }
    pthread_mutex_unlock(&d->mu);
    return NULL;
}

// The plan (dist/td_buckets.h, shared with the CPU reducer). A model without parameters has no
// buckets: finish then launches nothing, and the loss is averaged apart (allreduce_host).
static int plan_buckets(td_gpu_ddp *d, const td_model *m, double cap_mb, td_err *err) {
    if (td_buckets_plan(&d->plan, m->params, m->n_params, cap_mb, err) != 0) return -1;
    d->pending = (int *)td_calloc((size_t)d->plan.n + 1, sizeof(int));
    return 0;
}

// Rank 0 makes the unique id and publishes it in the store; the others wait for it there.
static int rendezvous(td_gpu *g, td_store *store, int rank, int world, ncclUniqueId *id,
                      td_err *err) {
    if (rank == 0) {
        TD_NCCL_RET(g, ncclGetUniqueId(id), gpu_error(g, err));
        if (world > 1 && td_store_set(store, UNIQUE_ID_KEY, id, sizeof *id, err) != 0)
            return td_fail_prefix(err, "DDP: publishing the NCCL unique id");
        return 0;
    }
    void *value = NULL;
    size_t len = 0;
    if (td_store_get(store, UNIQUE_ID_KEY, &value, &len, err) != 0)
        return td_fail_prefix(err, "DDP: rank %d waiting for rank 0's NCCL unique id", rank);
    if (len != sizeof *id) {
        free(value);
        return td_fail(err, "DDP: the store's %s holds %zu bytes; expected %zu", UNIQUE_ID_KEY, len,
                       sizeof *id);
    }
    memcpy(id, value, sizeof *id);
    free(value);
    return 0;
}

// Creates the communicator without blocking in NCCL, so a peer that never comes is a timeout
// with a message rather than a hang.
static int init_comm(td_gpu_ddp *d, const ncclUniqueId *id, td_err *err) {
    td_gpu *g = d->g;
    ncclConfig_t config = NCCL_CONFIG_INITIALIZER;
    config.blocking = 0;
    ncclComm_t comm = NULL;
    ncclResult_t r = ncclCommInitRankConfig(&comm, d->world, *id, d->rank, &config);
    if (r != ncclSuccess && r != ncclInProgress) {
        td_gpu_fail(g, __FILE__, __LINE__, "ncclCommInitRankConfig", ncclGetErrorString(r),
                    td_gpu_hint_nccl(r));
        if (comm) ncclCommAbort(comm);
        return gpu_error(g, err);
    }
    pthread_mutex_lock(&d->mu);
    d->comm = comm;
    pthread_mutex_unlock(&d->mu);
    char what[96];
    snprintf(what, sizeof what, "NCCL communicator setup (rank %d of %d)", d->rank, d->world);
    if (settle(d, what) != 0) return ddp_error(d, err);
    return 0;
}

static void destroy_event(td_gpu *g, cudaEvent_t e) {
    if (e) TD_CUDA(g, cudaEventDestroy(e));
}

static void destroy_stream(td_gpu *g, cudaStream_t s) {
    if (s) TD_CUDA(g, cudaStreamDestroy(s));
}

static void free_pinned(td_gpu *g, void *p) {
    if (p) TD_CUDA(g, cudaFreeHost(p));
}

// Ends the communicator: on a healthy one after its work is done (finalize, then destroy), with
// abort as the way out when that does not finish in time or something already failed.
static void end_comm(td_gpu_ddp *d) {
    td_gpu *g = d->g;
    if (!d->comm) return;
    bool clean = !g->failed;
    if (clean && d->stream && d->watchdog_running) { // the watchdog bounds this wait
        td_err ignored;
        clean = cudaEventRecord(d->join, d->stream) == cudaSuccess &&
                wait_event(d, d->join, "the last collectives before shutdown", &ignored) == 0;
    }
    if (clean) {
        pthread_mutex_lock(&d->mu);
        ncclResult_t r = d->comm ? ncclCommFinalize(d->comm) : ncclInvalidUsage;
        pthread_mutex_unlock(&d->mu);
        clean = (r == ncclSuccess || r == ncclInProgress) &&
                settle(d, "finalizing the NCCL communicator") == 0;
    }
    pthread_mutex_lock(&d->mu);
    if (d->comm) {
        ncclResult_t r = clean ? ncclCommDestroy(d->comm) : ncclCommAbort(d->comm);
        if (r != ncclSuccess)
            fprintf(stderr, "[traind] rank %d: %s: %s\n", d->rank,
                    clean ? "ncclCommDestroy" : "ncclCommAbort", ncclGetErrorString(r));
        d->comm = NULL;
    }
    pthread_mutex_unlock(&d->mu);
}

void td_gpu_ddp_stop(td_gpu *g) {
    td_gpu_ddp *d = g->ddp;
    if (!d) return;
    // the watchdog stays up while the communicator ends: it bounds the drain's wait (both take
    // mu around the communicator, and it leaves a destroyed one alone)
    if (d->mu_ready) end_comm(d);
    if (d->watchdog_running) {
        pthread_mutex_lock(&d->mu);
        d->stop = true;
        pthread_cond_signal(&d->wake);
        pthread_mutex_unlock(&d->mu);
        pthread_join(d->watchdog, NULL);
    }
    for (int i = 0; d->ready && i < d->plan.n; i++) destroy_event(g, d->ready[i]);
    destroy_event(g, d->fork);
    destroy_event(g, d->join);
    destroy_event(g, d->host_done);
    destroy_event(g, d->wait_done);
    destroy_event(g, d->sync_fork);
    destroy_event(g, d->sync_join);
    destroy_stream(g, d->stream);
    if (d->host_dev) td_gpu_free(g, d->host_dev, HOST_FLOATS * sizeof(float));
    free_pinned(g, d->host_pinned);
    if (d->sync_ready) pthread_cond_destroy(&d->wake);
    if (d->mu_ready) pthread_mutex_destroy(&d->mu);
    free(d->ready);
    td_buckets_free(&d->plan);
    free(d->pending);
    free(d);
    g->ddp = NULL;
}

// Streams, events and buffers: everything begin/finish use, made once here.
static int create_resources(td_gpu_ddp *d, td_err *err) {
    td_gpu *g = d->g;
    // NCCL's kernels use few SMs and gate the next layer's all-reduce: give them the highest
    // priority, so they start as soon as their bucket is ready instead of queueing behind
    // backward's kernels
    int least = 0, greatest = 0;
    TD_CUDA_RET(g, cudaDeviceGetStreamPriorityRange(&least, &greatest), gpu_error(g, err));
    TD_CUDA_RET(g, cudaStreamCreateWithPriority(&d->stream, cudaStreamNonBlocking, greatest),
                gpu_error(g, err));
    d->ready = (cudaEvent_t *)td_calloc((size_t)d->plan.n + 1, sizeof(cudaEvent_t));
    for (int i = 0; i < d->plan.n; i++)
        TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->ready[i], cudaEventDisableTiming),
                    gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->fork, cudaEventDisableTiming), gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->join, cudaEventDisableTiming), gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->host_done, cudaEventDisableTiming),
                gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->wait_done, cudaEventDisableTiming),
                gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->sync_fork, cudaEventDisableTiming),
                gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->sync_join, cudaEventDisableTiming),
                gpu_error(g, err));
    d->host_dev = (float *)td_gpu_malloc(g, HOST_FLOATS * sizeof(float), "DDP host all-reduce");
    if (!d->host_dev) return gpu_error(g, err);
    TD_CUDA_RET(g, cudaMallocHost((void **)&d->host_pinned, HOST_FLOATS * sizeof(float)),
                gpu_error(g, err));
    return 0;
}

static int init_sync(td_gpu_ddp *d, td_err *err) {
    int rc = pthread_mutex_init(&d->mu, NULL);
    if (rc != 0) return td_fail(err, "DDP: pthread_mutex_init: %s", strerror(rc));
    d->mu_ready = true;
    pthread_condattr_t attr;
    rc = pthread_condattr_init(&attr);
    if (rc == 0) rc = pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    if (rc == 0) rc = pthread_cond_init(&d->wake, &attr);
    pthread_condattr_destroy(&attr);
    if (rc != 0) return td_fail(err, "DDP: pthread_cond_init: %s", strerror(rc));
    d->sync_ready = true;
    return 0;
}

int td_gpu_ddp_start(td_gpu *g, td_model *m, td_store *store, int rank, int world,
                     double bucket_cap_mb, double timeout_s, bool sync_bn, td_err *err) {
    if (g->ddp) return td_fail(err, "DDP: already started on this device");
    if (g->model != m || !g->grads)
        return td_fail(err, "DDP: attach the model to the device (td_gpu_attach) before starting "
                            "data parallelism");
    if (world < 1 || rank < 0 || rank >= world)
        return td_fail(err, "DDP: rank %d of %d ranks is out of range", rank, world);
    if (world > 1 && !store)
        return td_fail(err, "DDP: %d ranks need the rendezvous store for NCCL's unique id", world);
    TD_CUDA_RET(g, cudaSetDevice(g->device), gpu_error(g, err));
    ncclUniqueId id;
    if (rendezvous(g, store, rank, world, &id, err) != 0) return -1;

    td_gpu_ddp *d = (td_gpu_ddp *)td_calloc(1, sizeof *d);
    d->g = g;
    d->rank = rank;
    d->world = world;
    d->timeout_s = timeout_s > 0 ? timeout_s : 300.0;
    d->sync_bn = sync_bn;
    g->ddp = d; // from here on td_gpu_ddp_stop releases whatever was made
    if (init_sync(d, err) != 0 || plan_buckets(d, m, bucket_cap_mb, err) != 0 ||
        create_resources(d, err) != 0 || init_comm(d, &id, err) != 0) {
        td_gpu_ddp_stop(g);
        return -1;
    }
    int rc = pthread_create(&d->watchdog, NULL, watchdog_main, d);
    if (rc != 0) {
        td_fail(err, "DDP: starting the NCCL watchdog thread: %s", strerror(rc));
        td_gpu_ddp_stop(g);
        return -1;
    }
    d->watchdog_running = true;
    return 0;
}

// Sends out bucket b: the communication stream waits (on the device) for the compute stream's
// work so far, which includes the backward of every parameter in the bucket.
static bool launch_bucket(td_gpu_ddp *d, int b) {
    td_gpu *g = d->g;
    const td_bucket *k = &d->plan.bucket[b];
    TD_CUDA_RET(g, cudaEventRecord(d->ready[b], g->stream), false);
    TD_CUDA_RET(g, cudaStreamWaitEvent(d->stream, d->ready[b], 0), false);
    return collective(d, OP_ALLREDUCE, g->grads + k->lo, k->hi - k->lo, ncclFloat, ncclAvg,
                      "a gradient bucket's all-reduce") == 0;
}

static void launch(td_gpu_ddp *d, int b) {
    if (!launch_bucket(d, b)) d->launch_failed = true; // finish reports it
}

// Launches every complete bucket from `next` on, in bucket order: NCCL needs the same order of
// collectives on every rank, and a bucket that completes early (its other parameters' nodes
// came first) waits for the ones before it.
static void launch_ready(td_gpu_ddp *d) {
    while (d->next < d->plan.n && d->pending[d->next] <= 0) launch(d, d->next++);
}

// Backward's hook after each node with parameters, whose gradients are then queued.
static void node_done(void *ctx, const td_node *node) {
    td_gpu_ddp *d = (td_gpu_ddp *)ctx;
    for (int j = 0; j < node->n_params; j++) d->pending[d->plan.bucket_of[node->param_ids[j]]]--;
    launch_ready(d);
}

static void reset_buckets(td_gpu_ddp *d) {
    for (int i = 0; i < d->plan.n; i++) d->pending[i] = d->plan.bucket[i].params;
    d->next = 0;
    d->launch_failed = false;
}

void td_gpu_ddp_begin(td_gpu *g, td_run *run) {
    td_gpu_ddp *d = g->ddp;
    if (!d) return;
    reset_buckets(d);
    d->in_backward = true;
    run->node_done = node_done;
    run->node_done_ctx = d;
}

int td_gpu_ddp_finish(td_gpu *g, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) return td_fail(err, "DDP: td_gpu_ddp_finish without td_gpu_ddp_start");
    if (!d->in_backward) reset_buckets(d); // no hook ran: every bucket goes out now
    d->in_backward = false;
    // parameters whose node had no backward in this pass still take part, as on every rank
    while (d->next < d->plan.n) launch(d, d->next++);
    TD_CUDA_RET(g, cudaEventRecord(d->join, d->stream), ddp_error(d, err));
    TD_CUDA_RET(g, cudaStreamWaitEvent(g->stream, d->join, 0), ddp_error(d, err));
    if (d->launch_failed || is_aborted(d)) return ddp_error(d, err);
    return 0;
}

int td_gpu_ddp_allreduce_host(td_gpu *g, float *values, size_t n, bool average, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) return td_fail(err, "DDP: all-reduce without td_gpu_ddp_start");
    for (size_t off = 0; off < n; off += HOST_FLOATS) {
        size_t k = n - off < HOST_FLOATS ? n - off : HOST_FLOATS;
        memcpy(d->host_pinned, values + off, k * sizeof(float));
        // after the compute stream's work so far, as the CPU reducer orders td_reducer_sum
        // behind the buckets
        TD_CUDA_RET(g, cudaEventRecord(d->fork, g->stream), ddp_error(d, err));
        TD_CUDA_RET(g, cudaStreamWaitEvent(d->stream, d->fork, 0), ddp_error(d, err));
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(d->host_dev, d->host_pinned, k * sizeof(float),
                                    cudaMemcpyHostToDevice, d->stream),
                    ddp_error(d, err));
        if (collective(d, OP_ALLREDUCE, d->host_dev, k, ncclFloat, average ? ncclAvg : ncclSum,
                       "an all-reduce of host values") != 0)
            return ddp_error(d, err);
        TD_CUDA_RET(g,
                    cudaMemcpyAsync(d->host_pinned, d->host_dev, k * sizeof(float),
                                    cudaMemcpyDeviceToHost, d->stream),
                    ddp_error(d, err));
        TD_CUDA_RET(g, cudaEventRecord(d->host_done, d->stream), ddp_error(d, err));
        if (wait_event(d, d->host_done, "an all-reduce of host values", err) != 0) return -1;
        memcpy(values + off, d->host_pinned, k * sizeof(float));
    }
    return 0;
}

int td_gpu_ddp_broadcast_params(td_gpu *g, td_model *m, bool buffers_only, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) return td_fail(err, "DDP: broadcast without td_gpu_ddp_start");
    TD_CUDA_RET(g, cudaEventRecord(d->fork, g->stream), ddp_error(d, err));
    TD_CUDA_RET(g, cudaStreamWaitEvent(d->stream, d->fork, 0), ddp_error(d, err));
    if (!buffers_only && m->param_floats &&
        collective(d, OP_BROADCAST, g->params, m->param_floats, ncclFloat, ncclSum,
                   "the broadcast of rank 0's parameters") != 0)
        return ddp_error(d, err);
    if (m->buffer_floats && collective(d, OP_BROADCAST, g->buffers, m->buffer_floats, ncclFloat,
                                       ncclSum, "the broadcast of rank 0's buffers") != 0)
        return ddp_error(d, err);
    TD_CUDA_RET(g, cudaEventRecord(d->join, d->stream), ddp_error(d, err));
    TD_CUDA_RET(g, cudaStreamWaitEvent(g->stream, d->join, 0), ddp_error(d, err));
    // the 16-bit compute copy follows the new fp32 masters
    if (!buffers_only && g->prec != TD_PREC_FP32)
        td_gpu_refresh_half(g, m->param_floats, g->stream);
    if (g->failed) return ddp_error(d, err);
    return 0;
}

bool td_gpu_ddp_syncs_batchnorm(const td_gpu *g) {
    return g->ddp && g->ddp->sync_bn;
}

void td_gpu_ddp_sum(td_gpu *g, double *values, size_t n, cudaStream_t compute) {
    td_gpu_ddp *d = g->ddp;
    if (!d) {
        td_gpu_fail(g, __FILE__, __LINE__, "SyncBatchNorm", "no data-parallel communicator",
                    "td_gpu_ddp_start(..., sync_bn = true) comes first");
        return;
    }
    // after the compute stream's work so far (the sums), before its next (what reads them)
    TD_CUDA(g, cudaEventRecord(d->sync_fork, compute));
    TD_CUDA(g, cudaStreamWaitEvent(d->stream, d->sync_fork, 0));
    if (collective(d, OP_ALLREDUCE, values, n, ncclDouble, ncclSum, "a SyncBatchNorm all-reduce") !=
        0)
        return; // failure recorded: the passes stop at the next node
    TD_CUDA(g, cudaEventRecord(d->sync_join, d->stream));
    TD_CUDA(g, cudaStreamWaitEvent(compute, d->sync_join, 0));
}

int td_gpu_ddp_buckets(const td_gpu *g) {
    return g->ddp ? g->ddp->plan.n : 0;
}

// The trainer's synchronisations: waits on the host for ev (already recorded) by polling under
// the watchdog's deadline, so a collective that never completes ends as an error return.
// Without DDP it is a plain synchronisation.
int td_gpu_ddp_wait_event(td_gpu *g, cudaEvent_t ev, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) {
        TD_CUDA_RET(g, cudaEventSynchronize(ev), gpu_error(g, err));
        return g->failed ? gpu_error(g, err) : 0;
    }
    if (wait_event(d, ev,
                   "the GPU work queued before a synchronisation (gradient all-reduces among it)",
                   err) != 0)
        return -1;
    return g->failed ? ddp_error(d, err) : 0;
}

// The same for everything queued on s so far.
int td_gpu_ddp_wait(td_gpu *g, cudaStream_t s, td_err *err) {
    td_gpu_ddp *d = g->ddp;
    if (!d) {
        TD_CUDA_RET(g, cudaStreamSynchronize(s), gpu_error(g, err));
        return g->failed ? gpu_error(g, err) : 0;
    }
    TD_CUDA_RET(g, cudaEventRecord(d->wait_done, s), ddp_error(d, err));
    return td_gpu_ddp_wait_event(g, d->wait_done, err);
}
