/* What a spec may say of each op: its name, how many inputs it takes, and its arguments with
 * their types, defaults and ranges, one entry per op of td_ops.def, and no code. The spec's
 * validator reads these alone, so the daemon checks a job's model without linking a kernel; each
 * op's td_op (its code, in its own file of ops/) points to its entry here. */
#include "ops/td_op_sigs.h"

#include <stdio.h>
#include <string.h>

static const td_op_arg linear_args[] = {
    {"out_features", TD_ARG_INT, true, 0, 1, 1 << 24, NULL},
    {"bias", TD_ARG_BOOL, false, 1, 0, 1, NULL},
    {0},
};

const td_op_sig td_op_sig_linear = {"linear", 1, 1, linear_args};

static const td_op_arg conv_args[] = {
    {"out_channels", TD_ARG_INT, true, 0, 1, 1 << 16, NULL},
    {"kernel_size", TD_ARG_INT, true, 0, 1, 64, NULL},
    {"stride", TD_ARG_INT, false, 1, 1, 64, NULL},
    {"padding", TD_ARG_INT, false, 0, 0, 64, NULL},
    {"bias", TD_ARG_BOOL, false, 1, 0, 1, NULL},
    {"init", TD_ARG_CHOICE, false, 0, 0, 0, "default|kaiming_normal_fan_out"},
    /* auto: Winograd (td_winograd.h) where it fits, else im2col + GEMM */
    {"algorithm", TD_ARG_CHOICE, false, 0, 0, 0, "auto|im2col|winograd"},
    {0},
};

const td_op_sig td_op_sig_conv2d = {"conv2d", 1, 1, conv_args};

static const td_op_arg maxpool_args[] = {
    {"kernel_size", TD_ARG_INT, true, 0, 1, 64, NULL},
    {"stride", TD_ARG_INT, false, 0, 1, 64, NULL},
    {"padding", TD_ARG_INT, false, 0, 0, 32, NULL},
    {0},
};

const td_op_sig td_op_sig_maxpool2d = {"maxpool2d", 1, 1, maxpool_args};

static const td_op_arg avgpool_args[] = {
    {"kernel_size", TD_ARG_INT, true, 0, 1, 64, NULL},
    {"stride", TD_ARG_INT, false, 0, 1, 64, NULL},
    {"padding", TD_ARG_INT, false, 0, 0, 32, NULL},
    {"count_include_pad", TD_ARG_BOOL, false, 1, 0, 1, NULL},
    {0},
};

const td_op_sig td_op_sig_avgpool2d = {"avgpool2d", 1, 1, avgpool_args};

static const td_op_arg no_args[] = {{0}};

const td_op_sig td_op_sig_global_avgpool = {"global_avgpool", 1, 1, no_args};

static const td_op_arg relu_args[] = {{0}};

const td_op_sig td_op_sig_relu = {"relu", 1, 1, relu_args};

static const td_op_arg gelu_args[] = {
    {"approximate", TD_ARG_CHOICE, false, 0, 0, 0, "none|tanh"},
    {0},
};

const td_op_sig td_op_sig_gelu = {"gelu", 1, 1, gelu_args};

static const td_op_arg flatten_args[] = {{0}};

const td_op_sig td_op_sig_flatten = {"flatten", 1, 1, flatten_args};

static const td_op_arg dropout_args[] = {
    {"p", TD_ARG_FLOAT, false, 0.5, 0, 1, NULL},
    {0},
};

const td_op_sig td_op_sig_dropout = {"dropout", 1, 1, dropout_args};

static const td_op_arg add_args[] = {{0}};

const td_op_sig td_op_sig_add = {"add", 2, TD_MAX_INPUTS, add_args};

static const td_op_arg bn_args[] = {
    {"eps", TD_ARG_FLOAT, false, 1e-5, 0, 1, NULL},
    {"momentum", TD_ARG_FLOAT, false, 0.1, 0, 1, NULL},
    {"affine", TD_ARG_BOOL, false, 1, 0, 1, NULL},
    {"track_running_stats", TD_ARG_BOOL, false, 1, 0, 1, NULL},
    /* weight starts at 0 instead of 1 (torchvision's zero_init_residual) */
    {"zero_init", TD_ARG_BOOL, false, 0, 0, 1, NULL},
    {0},
};

const td_op_sig td_op_sig_batchnorm2d = {"batchnorm2d", 1, 1, bn_args};

const td_op_sig td_op_sig_batchnorm1d = {"batchnorm1d", 1, 1, bn_args};

static const td_op_arg adaptive_args[] = {
    {"output_size", TD_ARG_INT, false, 1, 1, 1, NULL},
    {0},
};

const td_op_sig td_op_sig_adaptive_avgpool2d = {"adaptive_avgpool2d", 1, 1, adaptive_args};

const td_op_sig td_op_sig_identity = {"identity", 1, 1, no_args};

static const td_op_arg embedding_args[] = {
    {"num_embeddings", TD_ARG_INT, true, 0, 1, 1 << 24, NULL},
    {"embedding_dim", TD_ARG_INT, true, 0, 1, 1 << 20, NULL},
    {0},
};

const td_op_sig td_op_sig_embedding = {"embedding", 1, 1, embedding_args};

static const td_op_arg position_args[] = {
    {"block_size", TD_ARG_INT, true, 0, 1, 1 << 20, NULL},
    {0},
};

const td_op_sig td_op_sig_position_embedding = {"position_embedding", 1, 1, position_args};

static const td_op_arg layernorm_args[] = {
    {"eps", TD_ARG_FLOAT, false, 1e-5, 1e-12, 1.0, NULL},
    {"bias", TD_ARG_BOOL, false, 1, 0, 1, NULL},
    {0},
};

const td_op_sig td_op_sig_layernorm = {"layernorm", 1, 1, layernorm_args};

static const td_op_arg attention_args[] = {
    {"n_head", TD_ARG_INT, true, 0, 1, 1 << 12, NULL},
    {"dropout", TD_ARG_FLOAT, false, 0, 0, 0.999, NULL},
    {0},
};

const td_op_sig td_op_sig_causal_attention = {"causal_attention", 1, 1, attention_args};

static const td_op_sig *const all[] = {
#define TD_OP(name) &td_op_sig_##name,
#include "ops/td_ops.def"
};
#define N_OPS (sizeof all / sizeof all[0])

const td_op_sig *td_op_sig_find(const char *name) {
    for (size_t i = 0; i < N_OPS; i++)
        if (strcmp(all[i]->name, name) == 0) return all[i];
    return NULL;
}

const char *td_op_sig_names(void) {
    /* Built from the table so the message can never drift from what is accepted. The buffer is
     * constant after first use; every caller would write the same bytes. */
    static char names[256];
    if (!names[0]) {
        size_t used = 0;
        for (size_t i = 0; i < N_OPS; i++)
            used += (size_t)snprintf(names + used, sizeof names - used, "%s%s", i ? ", " : "",
                                     all[i]->name);
    }
    return names;
}
