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
//
// This file holds the communicator: its set-up, the watchdog, aborts and teardown.
// td_gpu_nccl_collectives.cu holds the collectives and the host waits; td_gpu_nccl.h what the
// two share.
#include "gpu/cuda/td_gpu_nccl.h"

extern "C" {
#include "base/td_error.h"
#include "dist/td_store.h"
}

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

// How often the watchdog looks at the communicator.
#define WATCHDOG_PERIOD_S 0.05
#define UNIQUE_ID_KEY     "nccl/unique-id"

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

int td_gpu_error(td_gpu *g, td_err *err) {
    return td_fail(err, "%s", g->failed ? g->msg : "a GPU operation failed");
}

int td_gpu_ddp_error(td_gpu_ddp *d, td_err *err) {
    pthread_mutex_lock(&d->mu);
    bool aborted = d->aborted;
    if (aborted) td_fail(err, "%s", d->why);
    pthread_mutex_unlock(&d->mu);
    return aborted ? -1 : td_gpu_error(d->g, err);
}

bool td_gpu_ddp_aborted(td_gpu_ddp *d) {
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

int td_gpu_ddp_collective(td_gpu_ddp *d, int kind, void *buf, size_t n, ncclDataType_t type,
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

int td_gpu_ddp_poll_event(td_gpu_ddp *d, cudaEvent_t ev, const char *what, td_err *err) {
    td_gpu *g = d->g;
    arm(d, what);
    for (unsigned us = 2;; us = next_backoff(us)) {
        cudaError_t q = cudaEventQuery(ev);
        if (q == cudaSuccess) break;
        if (q != cudaErrorNotReady) {
            disarm(d);
            td_gpu_fail(g, __FILE__, __LINE__, "cudaEventQuery", cudaGetErrorString(q),
                        td_gpu_hint_cuda(q));
            return td_gpu_ddp_error(d, err);
        }
        if (td_gpu_ddp_aborted(d)) {
            disarm(d);
            return td_gpu_ddp_error(d, err);
        }
        sleep_us(us);
    }
    disarm(d);
    // a collective cut short by an abort completes its event too, over garbage
    if (td_gpu_ddp_aborted(d)) return td_gpu_ddp_error(d, err);
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
        TD_NCCL_RET(g, ncclGetUniqueId(id), td_gpu_error(g, err));
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
        return td_gpu_error(g, err);
    }
    pthread_mutex_lock(&d->mu);
    d->comm = comm;
    pthread_mutex_unlock(&d->mu);
    char what[96];
    snprintf(what, sizeof what, "NCCL communicator setup (rank %d of %d)", d->rank, d->world);
    if (settle(d, what) != 0) return td_gpu_ddp_error(d, err);
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
                td_gpu_ddp_poll_event(d, d->join, "the last collectives before shutdown",
                                      &ignored) == 0;
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
    TD_CUDA_RET(g, cudaDeviceGetStreamPriorityRange(&least, &greatest), td_gpu_error(g, err));
    TD_CUDA_RET(g, cudaStreamCreateWithPriority(&d->stream, cudaStreamNonBlocking, greatest),
                td_gpu_error(g, err));
    d->ready = (cudaEvent_t *)td_calloc((size_t)d->plan.n + 1, sizeof(cudaEvent_t));
    for (int i = 0; i < d->plan.n; i++)
        TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->ready[i], cudaEventDisableTiming),
                    td_gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->fork, cudaEventDisableTiming),
                td_gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->join, cudaEventDisableTiming),
                td_gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->host_done, cudaEventDisableTiming),
                td_gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->wait_done, cudaEventDisableTiming),
                td_gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->sync_fork, cudaEventDisableTiming),
                td_gpu_error(g, err));
    TD_CUDA_RET(g, cudaEventCreateWithFlags(&d->sync_join, cudaEventDisableTiming),
                td_gpu_error(g, err));
    d->host_dev = (float *)td_gpu_malloc(g, HOST_FLOATS * sizeof(float), "DDP host all-reduce");
    if (!d->host_dev) return td_gpu_error(g, err);
    TD_CUDA_RET(g, cudaMallocHost((void **)&d->host_pinned, HOST_FLOATS * sizeof(float)),
                td_gpu_error(g, err));
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
    TD_CUDA_RET(g, cudaSetDevice(g->device), td_gpu_error(g, err));
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
