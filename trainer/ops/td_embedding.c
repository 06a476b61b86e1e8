/* Embeddings: token ids to vectors, and learned positions added to them (GPT-2's wte and wpe).
 *
 * embedding: y[t] = W[id_t], W [num_embeddings, embedding_dim], as torch.nn.Embedding. The ids
 * arrive as the batch's floats (integers are exact in float up to 2^24, past any vocabulary);
 * the input [T] becomes the sequence [T, embedding_dim].
 *
 * position_embedding: y[t] = x[t] + P[t], P [block_size, C]. nanoGPT writes this as a second
 * nn.Embedding looked up at arange(T) and added to the tokens' vectors; one op does both, and its
 * parameter keeps that Embedding's name and shape ("transformer.wpe.weight", [block_size, C]).
 *
 * Both initialise as nn.Embedding does, normal(0, 1); GPT-2's 0.02 is the GPT preset's choice. */
#include "core/td_model.h"
#include "core/td_parallel.h"
#include "ops/td_ops_isa.h"

#include <math.h>
#include <omp.h>
#include <string.h>

enum { ARG_NUM_EMBEDDINGS, ARG_EMBEDDING_DIM };
enum { ARG_BLOCK_SIZE };
static int embedding_build(td_model *model, td_node *node, td_err *err) {
    td_shape in = node->in_shape[0];
    if (in.spatial || in.h != 1) {
        char buf[64];
        td_shape_format(in, buf, sizeof buf);
        return td_fail(err, "expects token ids [T] but its input has shape %s", buf);
    }
    int vocab = (int)node->args[ARG_NUM_EMBEDDINGS], dim = (int)node->args[ARG_EMBEDDING_DIM];
    td_model_add_param(model, node, "weight", 2, (int[]){vocab, dim}, td_init_normal(1.0f));
    node->out_shape = td_shape_seq(in.c, dim);
    return 0;
}

/* An id that is not an integer in [0, num_embeddings) (the data's probes refuse such files; a
 * hand-made batch may still hold one) gives a row of NaN, which the trainer's check of the loss
 * reports, rather than a read outside the table or a silently wrong row. */
static void embedding_forward(td_node *node, const td_run *run) {
    int vocab = node->params[0]->dims[0], dim = node->out_shape.c;
    size_t rows = (size_t)run->n * node->in_shape[0].c;
    const float *ids = node->in[0], *w = node->params[0]->data;
    int threads = td_par_threads_for(node->threads, rows * (size_t)dim);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (size_t r = 0; r < rows; r++) {
        float id = ids[r];
        float *y = node->out + r * dim;
        if (id >= 0.0f && id < (float)vocab && id == floorf(id))
            memcpy(y, w + (size_t)id * dim, (size_t)dim * sizeof(float));
        else
            for (int k = 0; k < dim; k++) y[k] = NAN;
    }
}

/* dW[id] += dy[t] over every position: rows repeat ids, so the threads split the columns, and
 * each adds its columns in the positions' order (the same sums whatever the thread count). */
static void embedding_backward(td_node *node, const td_run *run) {
    int vocab = node->params[0]->dims[0], dim = node->out_shape.c;
    size_t rows = (size_t)run->n * node->in_shape[0].c;
    const float *ids = node->in[0], *dy = node->grad;
    float *dw = node->params[0]->grad;
    if (!run->accumulate_grads) memset(dw, 0, (size_t)vocab * dim * sizeof(float));
    int threads = td_par_threads_for(node->threads, rows * (size_t)dim);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t lo, hi;
        td_par_range((size_t)dim, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        for (size_t r = 0; r < rows; r++) {
            float id = ids[r];
            if (!(id >= 0.0f && id < (float)vocab)) continue;
            float *g = dw + (size_t)id * dim;
            const float *d = dy + r * dim;
            for (size_t k = lo; k < hi; k++) g[k] += d[k];
        }
    }
    /* ids have no gradient: a gradient check asking for one gets zeros */
    if (node->in_grad[0] && !node->in_grad_add[0])
        memset(node->in_grad[0], 0, rows * sizeof(float));
}

static int position_build(td_model *model, td_node *node, td_err *err) {
    td_shape in = node->in_shape[0];
    int block = (int)node->args[ARG_BLOCK_SIZE];
    if (in.spatial || in.h > block) {
        char buf[64];
        td_shape_format(in, buf, sizeof buf);
        return td_fail(err,
                       "expects a sequence [T, C] with T at most block_size %d but its input "
                       "has shape %s",
                       block, buf);
    }
    td_model_add_param(model, node, "weight", 2, (int[]){block, in.c}, td_init_normal(1.0f));
    node->out_shape = in;
    return 0;
}

static void position_forward(td_node *node, const td_run *run) {
    size_t per = td_shape_size(node->out_shape); /* T·C: the table's first T rows, flat */
    const float *p = node->params[0]->data;
    int threads = td_par_threads_for(node->threads, (size_t)run->n * per);
#pragma omp parallel for num_threads(threads) if (threads > 1) schedule(static)
    for (int i = 0; i < run->n; i++) {
        const float *x = node->in[0] + (size_t)i * per;
        float *y = node->out + (size_t)i * per;
        for (size_t k = 0; k < per; k++) y[k] = x[k] + p[k];
    }
}

static void position_backward(td_node *node, const td_run *run) {
    size_t per = td_shape_size(node->out_shape), all = (size_t)run->n * per;
    td_param *p = node->params[0];
    /* dP[t] = the sum over the batch of dy[t]; the rows past T get nothing */
    if (!run->accumulate_grads) memset(p->grad, 0, p->size * sizeof(float));
    int threads = td_par_threads_for(node->threads, all);
#pragma omp parallel num_threads(threads) if (threads > 1)
    {
        size_t lo, hi;
        td_par_range(per, omp_get_num_threads(), omp_get_thread_num(), 16, &lo, &hi);
        for (int i = 0; i < run->n; i++) {
            const float *d = node->grad + (size_t)i * per;
            for (size_t k = lo; k < hi; k++) p->grad[k] += d[k];
        }
    }
    float *dx = node->in_grad[0];
    if (!dx) return;
    if (node->in_grad_add[0])
        for (size_t k = 0; k < all; k++) dx[k] += node->grad[k];
    else
        memcpy(dx, node->grad, all * sizeof(float));
}

const td_op TD_ISA_SYM(td_op_embedding) = {&td_op_sig_embedding,      embedding_build,
                                           embedding_forward,         embedding_backward,
                                           TD_OP_VARIANTS(embedding), 0};

const td_op TD_ISA_SYM(td_op_position_embedding) = {&td_op_sig_position_embedding,
                                                    position_build,
                                                    position_forward,
                                                    position_backward,
                                                    TD_OP_VARIANTS(position_embedding),
                                                    0};
