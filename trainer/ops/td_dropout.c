/* Dropout (inverted, as torch.nn.Dropout): in training each element is zeroed with probability p
 * and the survivors scaled by 1/(1-p); in evaluation it is the identity. The mask comes from the
 * run's seeded generator, so a run is reproducible bit for bit. */
#include "core/td_model.h"
#include "ops/td_ops_isa.h"

#include <stdint.h>
#include <string.h>

static int dropout_build(td_model *model, td_node *node, td_err *err) {
    (void)err;
    node->out_shape = node->in_shape[0];
    node->saved_bytes = (size_t)model->max_n * td_shape_size(node->out_shape);
    return 0;
}

static void dropout_forward(td_node *node, const td_run *run) {
    size_t n = (size_t)run->n * td_shape_size(node->out_shape);
    float p = (float)node->args[0];
    if (!run->training || p == 0.0f) {
        memcpy(node->out, node->in[0], n * 4);
        return;
    }
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    uint8_t *mask = node->saved;
    const float *x = node->in[0];
    for (size_t i = 0; i < n; i++) {
        mask[i] = td_rng_uniform(run->rng) >= p;
        node->out[i] = mask[i] ? x[i] * scale : 0.0f;
    }
}

static void dropout_backward(td_node *node, const td_run *run) {
    float *dx = node->in_grad[0];
    if (!dx) return;
    size_t n = (size_t)run->n * td_shape_size(node->out_shape);
    float p = (float)node->args[0];
    bool add = node->in_grad_add[0];
    const float *dy = node->grad;
    if (!run->training || p == 0.0f) {
        for (size_t i = 0; i < n; i++) dx[i] = (add ? dx[i] : 0.0f) + dy[i];
        return;
    }
    float scale = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
    const uint8_t *mask = node->saved;
    for (size_t i = 0; i < n; i++) dx[i] = (add ? dx[i] : 0.0f) + (mask[i] ? dy[i] * scale : 0.0f);
}

const td_op TD_ISA_SYM(td_op_dropout) = {&td_op_sig_dropout,      dropout_build,
                                         dropout_forward,         dropout_backward,
                                         TD_OP_VARIANTS(dropout), 0};
