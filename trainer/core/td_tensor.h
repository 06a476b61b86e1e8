/* Shapes, parameter tensors and the workspace arena.
 *
 * Activations are stored per batch as [N, H, W, C] (channels last) for images and [N, F] for flat
 * features. Channels-last turns every convolution into one tall GEMM with the pixels as rows
 * (what OpenBLAS's kernels like), and a 1x1 convolution into a plain GEMM with no im2col at all.
 * Parameters keep PyTorch's layouts (Linear [out, in], Conv2d OIHW) so that a state_dict maps
 * onto them name for name; only Flatten translates between the two orders.
 */
#ifndef TD_TENSOR_H
#define TD_TENSOR_H

#include <stdbool.h>
#include <stddef.h>

/* The shape of one sample. spatial: an image stored [H, W, C]; otherwise c features per position
 * of h positions (w = 1): h = 1 is a flat vector, h > 1 a sequence [T, C] (a transformer's
 * tokens), stored row by row as PyTorch stores [N, T, C]. */
typedef struct td_shape {
    int c, h, w;
    bool spatial;
} td_shape;

static inline size_t td_shape_size(td_shape s) {
    return (size_t)s.c * s.h * s.w;
}
td_shape td_shape_image(int c, int h, int w);
td_shape td_shape_flat(int features);
td_shape td_shape_seq(int positions, int features);
/* A sequence of positions (h > 1, not an image). */
static inline bool td_shape_is_seq(td_shape s) {
    return !s.spatial && s.h > 1;
}
/* "[1, 28, 28]" (C, H, W as PyTorch users write it), "[64, 128]" (T, C) or "[784]". */
void td_shape_format(td_shape s, char *buf, size_t len);

#define TD_MAX_DIMS 4
#define TD_NAME_MAX 96

/* How a tensor starts: PyTorch's default layer init is uniform(-a, a) with a = 1/sqrt(fan_in);
 * torchvision's ResNet convs use normal(0, a) with a = sqrt(2/fan_out); BatchNorm fills. */
typedef enum td_init_kind { TD_INIT_FILL, TD_INIT_UNIFORM, TD_INIT_NORMAL } td_init_kind;
typedef struct td_init {
    td_init_kind kind;
    float a; /* the fill value, the uniform bound or the normal standard deviation */
} td_init;

static inline td_init td_init_fill(float v) {
    return (td_init){TD_INIT_FILL, v};
}
static inline td_init td_init_uniform(float bound) {
    return (td_init){TD_INIT_UNIFORM, bound};
}
static inline td_init td_init_normal(float std) {
    return (td_init){TD_INIT_NORMAL, std};
}

/* Element types as safetensors names them. Every tensor is float in memory; an I64 buffer (a
 * counter such as num_batches_tracked) holds integral values and is written as int64. */
typedef enum td_dtype { TD_F32, TD_I64 } td_dtype;

/* A named parameter of the model (a view into its flat parameter block, with a gradient in the
 * gradient block) or a buffer (a view into the buffer block, no gradient). */
typedef struct td_param {
    char name[TD_NAME_MAX + 32]; /* PyTorch state_dict name, e.g. "conv1.weight" */
    int ndim;
    int dims[TD_MAX_DIMS]; /* PyTorch's shape: Linear [out, in], Conv2d [O, I, KH, KW] */
    size_t offset;         /* in floats, into the flat block */
    size_t size;
    float *data, *grad; /* grad is NULL for buffers */
    /* On a model attached to a GPU (td_gpu.h): the device copies, fp32; NULL otherwise. */
    float *dev_data, *dev_grad;
    td_init init;
    td_dtype dtype;
    int final_node; /* the node whose backward finishes its gradient (td_node_finishes) */
} td_param;

/* A bump allocator over one 64-byte aligned block. With base == NULL it only counts, so a
 * layout can be planned in one pass and carved out of a single allocation in the next. */
typedef struct td_arena {
    char *base;
    size_t used, cap;
} td_arena;

/* Copies one row of width floats into all n_rows rows of dst, by doubling memcpy: a handful of
 * large copies instead of one small copy per row (bias initialisation). */
void td_fill_rows(float *dst, const float *row, size_t n_rows, size_t width);

void *td_arena_push(td_arena *arena, size_t bytes);
static inline float *td_arena_floats(td_arena *arena, size_t n) {
    return (float *)td_arena_push(arena, n * sizeof(float));
}

#endif
