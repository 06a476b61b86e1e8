/* The GPU backend of an engine built without CUDA (-DTRAIND_CUDA=OFF, or no nvcc): no device is
 * ever found, so the trainer never gets past td_gpu_device_count; the rest exists so that callers
 * link unchanged, and fails loudly if reached. */
#include "gpu/td_gpu.h"

#include <stdio.h>

static const char *const no_cuda = "this traind was built without CUDA (-DTRAIND_CUDA=OFF or no "
                                   "nvcc at build time); rebuild with CUDA to train on a GPU";

int td_gpu_device_count(char *why, size_t len) {
    snprintf(why, len, "built without CUDA (-DTRAIND_CUDA=OFF)");
    return 0;
}

int td_gpu_open(td_gpu **out, int device, td_err *err) {
    (void)device;
    *out = NULL;
    return td_fail(err, "%s", no_cuda);
}

void td_gpu_close(td_gpu *g) {
    (void)g;
}

void td_gpu_describe(const td_gpu *g, char *buf, size_t len) {
    (void)g;
    snprintf(buf, len, "no GPU (built without CUDA)");
}

void td_gpu_memory(const td_gpu *g, size_t *in_use, size_t *peak) {
    (void)g;
    *in_use = *peak = 0;
}

#define UNREACHABLE() td_die(__FILE__, __LINE__, __func__, no_cuda)

int td_gpu_check(td_gpu *g, td_err *err) {
    (void)g, (void)err;
    UNREACHABLE();
}
int td_gpu_attach(td_gpu *g, td_model *m, td_precision prec, uint64_t seed, td_err *err) {
    (void)g, (void)m, (void)prec, (void)seed;
    return td_fail(err, "%s", no_cuda);
}
void td_gpu_detach(td_gpu *g, td_model *m) {
    (void)g, (void)m;
}
int td_gpu_download(td_gpu *g, td_model *m, td_optim *opt, td_err *err) {
    (void)g, (void)m, (void)opt, (void)err;
    UNREACHABLE();
}
int td_gpu_upload(td_gpu *g, td_model *m, const td_optim *opt, td_err *err) {
    (void)g, (void)m, (void)opt, (void)err;
    UNREACHABLE();
}
int td_gpu_benchmark_convolutions(td_gpu *g, td_model *m, int *timed, td_err *err) {
    (void)g, (void)m, (void)timed, (void)err;
    UNREACHABLE();
}
void td_gpu_set_deterministic(td_gpu *g, bool on) {
    (void)g, (void)on;
    UNREACHABLE();
}
int td_gpu_set_batch(td_gpu *g, td_model *m, const float *x, const int32_t *labels, int n,
                     td_err *err) {
    (void)g, (void)m, (void)x, (void)labels, (void)n, (void)err;
    UNREACHABLE();
}
void td_gpu_forward(td_gpu *g, td_model *m, const td_run *run) {
    (void)g, (void)m, (void)run;
    UNREACHABLE();
}
void td_gpu_loss(td_gpu *g, td_model *m, const td_loss *loss, int n, float grad_scale,
                 bool backward, float total_weight) {
    (void)g, (void)m, (void)loss, (void)n, (void)grad_scale, (void)backward, (void)total_weight;
    UNREACHABLE();
}
void td_gpu_backward(td_gpu *g, td_model *m, const td_run *run) {
    (void)g, (void)m, (void)run;
    UNREACHABLE();
}
int td_gpu_read(td_gpu *g, const void *dev, size_t elems, float *host, td_err *err) {
    (void)g, (void)dev, (void)elems, (void)host, (void)err;
    UNREACHABLE();
}
int td_gpu_read_grads(td_gpu *g, const td_model *m, float *host, td_err *err) {
    (void)g, (void)m, (void)host, (void)err;
    UNREACHABLE();
}
int td_gpu_seek_dropout(td_gpu *g, unsigned long long draws, td_err *err) {
    (void)g, (void)draws, (void)err;
    UNREACHABLE();
}
int td_gpu_take_totals(td_gpu *g, double *loss_sum, double *hits, td_err *err) {
    (void)g, (void)loss_sum, (void)hits, (void)err;
    UNREACHABLE();
}
int td_gpu_optim_init(td_gpu *g, td_model *m, const td_optim *opt, td_err *err) {
    (void)g, (void)m, (void)opt, (void)err;
    UNREACHABLE();
}
void td_gpu_optim_step(td_gpu *g, td_model *m, float lr, float max_norm) {
    (void)g, (void)m, (void)lr, (void)max_norm;
    UNREACHABLE();
}
void td_gpu_scaler_state(td_gpu *g, float *scale, long *skipped) {
    (void)g;
    *scale = 1.0f;
    *skipped = 0;
}
int td_gpu_ddp_start(td_gpu *g, td_model *m, td_store *store, int rank, int world,
                     double bucket_cap_mb, double timeout_s, bool sync_bn, td_err *err) {
    (void)g, (void)m, (void)store, (void)rank, (void)world, (void)bucket_cap_mb, (void)timeout_s,
        (void)sync_bn;
    return td_fail(err, "%s", no_cuda);
}
void td_gpu_ddp_begin(td_gpu *g, td_run *run) {
    (void)g, (void)run;
    UNREACHABLE();
}
int td_gpu_ddp_finish(td_gpu *g, td_err *err) {
    (void)g, (void)err;
    UNREACHABLE();
}
int td_gpu_ddp_allreduce_host(td_gpu *g, float *values, size_t n, bool average, td_err *err) {
    (void)g, (void)values, (void)n, (void)average, (void)err;
    UNREACHABLE();
}
int td_gpu_ddp_broadcast_params(td_gpu *g, td_model *m, bool buffers_only, td_err *err) {
    (void)g, (void)m, (void)buffers_only, (void)err;
    UNREACHABLE();
}
int td_gpu_ddp_buckets(const td_gpu *g) {
    (void)g;
    return 0;
}
int td_gpu_graph_step(td_gpu *g, td_model *m, const td_gpu_step_args *args, td_err *err) {
    (void)g, (void)m, (void)args;
    return td_fail(err, "%s", no_cuda);
}
