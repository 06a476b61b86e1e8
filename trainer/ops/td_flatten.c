/* Flatten: [H, W, C] channels-last -> [C*H*W] in PyTorch's (c, h, w) order, so that the Linear
 * after it has exactly the weight layout a torch.nn.Flatten + Linear would have. */
#include "core/td_model.h"
#include "ops/td_ops_isa.h"

#include <string.h>

static int flatten_build(td_model *model, td_node *node, td_err *err) {
    (void)model;
    (void)err;
    node->out_shape = td_shape_flat((int)td_shape_size(node->in_shape[0]));
    return 0;
}

static void flatten_forward(td_node *node, const td_run *run) {
    td_shape s = node->in_shape[0];
    size_t size = td_shape_size(s), hw = (size_t)s.h * s.w;
    if (!s.spatial || s.c == 1) {
        memcpy(node->out, node->in[0], (size_t)run->n * size * 4);
        return;
    }
    for (int b = 0; b < run->n; b++) {
        const float *x = node->in[0] + b * size;
        float *y = node->out + b * size;
        for (size_t p = 0; p < hw; p++)
            for (int c = 0; c < s.c; c++) y[c * hw + p] = x[p * s.c + c];
    }
}

static void flatten_backward(td_node *node, const td_run *run) {
    float *dx = node->in_grad[0];
    if (!dx) return;
    td_shape s = node->in_shape[0];
    size_t size = td_shape_size(s), hw = (size_t)s.h * s.w;
    bool add = node->in_grad_add[0];
    bool same_order = !s.spatial || s.c == 1;
    for (int b = 0; b < run->n; b++) {
        float *d = dx + b * size;
        const float *dy = node->grad + b * size;
        for (size_t p = 0; p < hw; p++)
            for (int c = 0; c < s.c; c++) {
                size_t from = same_order ? p * s.c + c : c * hw + p;
                d[p * s.c + c] = (add ? d[p * s.c + c] : 0.0f) + dy[from];
            }
    }
}

const td_op TD_ISA_SYM(td_op_flatten) = {&td_op_sig_flatten,      flatten_build,
                                         flatten_forward,         flatten_backward,
                                         TD_OP_VARIANTS(flatten), 0};
