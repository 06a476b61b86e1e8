/* Identity (nn.Identity) and AdaptiveAvgPool2d(1): shape-preserving or shape-collapsing
 * pass-throughs that exist so a spec can mirror a PyTorch module tree name for name. */
#include "core/td_model.h"
#include "ops/td_ops_isa.h"

#include <string.h>

static int identity_build(td_model *model, td_node *node, td_err *err) {
    (void)model, (void)err;
    node->out_shape = node->in_shape[0];
    return 0;
}

static void identity_forward(td_node *node, const td_run *run) {
    memcpy(node->out, node->in[0], (size_t)run->n * td_shape_size(node->out_shape) * sizeof(float));
}

static void identity_backward(td_node *node, const td_run *run) {
    float *dx = node->in_grad[0];
    if (!dx) return;
    size_t n = (size_t)run->n * td_shape_size(node->out_shape);
    if (node->in_grad_add[0])
        for (size_t i = 0; i < n; i++) dx[i] += node->grad[i];
    else
        memcpy(dx, node->grad, n * sizeof(float));
}

const td_op TD_ISA_SYM(td_op_identity) = {&td_op_sig_identity,      identity_build,
                                          identity_forward,         identity_backward,
                                          TD_OP_VARIANTS(identity), 0};
