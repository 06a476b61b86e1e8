// Embeddings on the GPU, as the CPU's ops/td_embedding.c: token ids to rows of a table
// (embedding, GPT-2's wte) and learned positions added to a sequence (position_embedding, wpe).
//
// Token ids come with the batch as floats, which bf16 and fp16 cannot hold past 256 and 2048: the
// batch's trip to the device (td_gpu_set_batch) turns the fp32 copy into int32 ids (g->ids)
// before any conversion, and embedding reads those. It must therefore read the batch itself (be
// a first node); plan refuses it elsewhere. An id that is not an integer in [0, vocabulary)
// becomes -1, whose row is NaN, as on the CPU.
//
// Gradients are sums in a fixed order, so reruns give the same bits: the table's, a thread per
// column adding the positions' rows in order (rows repeat ids, so threads must not split rows);
// the positions', a thread per (position, feature) adding the samples in order.
#include "gpu/cuda/td_gpu_internal.h"

#include <math.h>

enum { EMB_THREADS = 256 };

static unsigned blocks_for(size_t n) {
    return (unsigned)((n + EMB_THREADS - 1) / EMB_THREADS);
}

static __global__ void ids_kernel(const float *__restrict__ x, int32_t *__restrict__ ids, size_t n,
                                  int vocab) {
    size_t i = (size_t)blockIdx.x * EMB_THREADS + threadIdx.x;
    if (i >= n) return;
    float v = x[i];
    ids[i] = v >= 0.0f && v < (float)vocab && v == floorf(v) ? (int32_t)v : -1;
}

void td_gpu_take_ids(td_gpu *g, const float *x, size_t n, cudaStream_t stream) {
    if (!g->ids || n == 0) return;
    ids_kernel<<<blocks_for(n), EMB_THREADS, 0, stream>>>(x, g->ids, n, g->ids_vocab);
    TD_LAUNCHED(g);
}

// ---- embedding --------------------------------------------------------------------------------

static int embedding_plan(td_gpu *g, td_model *m, td_node *node, td_err *err) {
    (void)g, (void)m;
    node->gpu = NULL;
    node->saved_bytes = 0;
    node->scratch_floats = 0;
    if (node->inputs[0] != TD_INPUT_NODE)
        return td_fail(err, "reads token ids, which on the GPU come from the batch alone: make it "
                            "a first node (inputs: the model's input)");
    return 0;
}

// (ids were checked against the first embedding's table; `vocab` is this table's, which a
// second embedding of the batch may have smaller)
template <typename T>
static __global__ void embedding_forward_kernel(const int32_t *__restrict__ ids,
                                                const float *__restrict__ w, T *__restrict__ y,
                                                size_t rows, int dim, int vocab) {
    size_t i = (size_t)blockIdx.x * EMB_THREADS + threadIdx.x;
    if (i >= rows * dim) return;
    size_t r = i / dim;
    int k = (int)(i % dim), id = ids[r];
    y[i] = td_from_float<T>(id >= 0 && id < vocab ? w[(size_t)id * dim + k] : NAN);
}

template <typename T>
static __global__ void embedding_backward_kernel(const int32_t *__restrict__ ids,
                                                 const T *__restrict__ dy, float *__restrict__ dw,
                                                 size_t rows, int dim, int vocab) {
    int k = blockIdx.x * EMB_THREADS + threadIdx.x;
    if (k >= dim) return;
    for (size_t r = 0; r < rows; r++) {
        int id = ids[r];
        if (id >= 0 && id < vocab) dw[(size_t)id * dim + k] += td_to_float(dy[r * dim + k]);
    }
}

static size_t embedding_rows(const td_node *node, int n) {
    return (size_t)n * node->in_shape[0].c; // the input is [T] ids
}

template <typename T> static void emb_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t rows = embedding_rows(node, run->n);
    int dim = node->out_shape.c;
    if (rows == 0) return;
    embedding_forward_kernel<T><<<blocks_for(rows * dim), EMB_THREADS, 0, run->stream>>>(
        g->ids, node->params[0]->dev_data, (T *)node->out, rows, dim, node->params[0]->dims[0]);
    TD_LAUNCHED(g);
}

template <typename T> static void emb_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t rows = embedding_rows(node, run->n);
    int dim = node->out_shape.c;
    const td_param *p = node->params[0];
    if (!run->accumulate_grads)
        TD_CUDA(g, cudaMemsetAsync(p->dev_grad, 0, (size_t)p->dims[0] * dim * sizeof(float),
                                   run->stream));
    if (rows == 0) return;
    embedding_backward_kernel<T><<<blocks_for((size_t)dim), EMB_THREADS, 0, run->stream>>>(
        g->ids, (const T *)node->grad, p->dev_grad, rows, dim, p->dims[0]);
    TD_LAUNCHED(g);
    // the ids have no gradient (the batch's input needs none: nothing to write)
}

TD_GPU_TYPED_ENTRY(embedding_forward, emb_fwd)

TD_GPU_TYPED_ENTRY(embedding_backward, emb_bwd)

// ---- position_embedding -----------------------------------------------------------------------

// y = x + P over each sample's T·C values (the table's first T rows, flat)
template <typename T>
static __global__ void position_forward_kernel(const T *__restrict__ x, const float *__restrict__ p,
                                               T *__restrict__ y, size_t total, size_t per) {
    size_t i = (size_t)blockIdx.x * EMB_THREADS + threadIdx.x;
    if (i >= total) return;
    y[i] = td_from_float<T>(td_to_float(x[i]) + p[i % per]);
}

// dP[k] (+)= the samples' dy[k] in order; dx (+)= dy
template <typename T>
static __global__ void position_backward_kernel(const T *__restrict__ dy, float *__restrict__ dp,
                                                T *__restrict__ dx, int n, size_t per,
                                                bool accumulate, bool dx_add) {
    size_t k = (size_t)blockIdx.x * EMB_THREADS + threadIdx.x;
    if (k >= per) return;
    float sum = 0;
    for (int i = 0; i < n; i++) {
        float d = td_to_float(dy[(size_t)i * per + k]);
        sum += d;
        if (dx) {
            size_t at = (size_t)i * per + k;
            dx[at] = td_from_float<T>(dx_add ? td_to_float(dx[at]) + d : d);
        }
    }
    dp[k] = accumulate ? dp[k] + sum : sum;
}

template <typename T> static void pos_fwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t per = td_shape_size(node->out_shape), total = (size_t)run->n * per;
    if (total == 0) return;
    position_forward_kernel<T><<<blocks_for(total), EMB_THREADS, 0, run->stream>>>(
        (const T *)node->in[0], node->params[0]->dev_data, (T *)node->out, total, per);
    TD_LAUNCHED(g);
}

template <typename T> static void pos_bwd(td_gpu *g, td_node *node, const td_gpu_run *run) {
    size_t per = td_shape_size(node->out_shape);
    const td_param *p = node->params[0];
    // the table's rows past T have no gradient: zero, as the CPU writes them (the kernel below
    // writes the first T rows)
    if (!run->accumulate_grads && p->size > per)
        TD_CUDA(
            g, cudaMemsetAsync(p->dev_grad + per, 0, (p->size - per) * sizeof(float), run->stream));
    if (run->n == 0) return;
    position_backward_kernel<T><<<blocks_for(per), EMB_THREADS, 0, run->stream>>>(
        (const T *)node->grad, node->params[0]->dev_grad, (T *)node->in_grad[0], run->n, per,
        run->accumulate_grads, node->in_grad_add[0]);
    TD_LAUNCHED(g);
}

TD_GPU_TYPED_ENTRY(position_forward, pos_fwd)

TD_GPU_TYPED_ENTRY(position_backward, pos_bwd)

const td_gpu_op td_gpu_op_embedding = {&td_op_embedding, embedding_plan, embedding_forward,
                                       embedding_backward, NULL};
const td_gpu_op td_gpu_op_position_embedding = {&td_op_position_embedding, td_gpu_plain_plan,
                                                position_forward, position_backward, NULL};
