// What Conv2d's two sources share: td_gpu_conv.cu (the kernels and the op) and
// td_gpu_conv_algo.cu (choosing cuDNN's algorithms, and cudnn.benchmark): the node's plan with
// its descriptors and the algorithms chosen per batch size, and the layout of the shared
// workspace. C++ (nvcc) only.
#ifndef TD_GPU_CONV_H
#define TD_GPU_CONV_H

#include "gpu/cuda/td_gpu_internal.h"

#define CONV_WS_LIMIT ((size_t)256 << 20)
// The shared workspace is only 64-byte aligned (the arena's rule); cuDNN's is rounded to 256.
#define CONV_ALIGN    256
#define CONV_MAX_CAND 16

enum { PASS_FWD, PASS_BWD_DATA, PASS_BWD_FILTER, PASS_COUNT };

// What a choice of algorithms depends on: every shape parameter and the precision.
typedef struct conv_key {
    int n, c, h, w, o, k, s, p;
    td_precision prec;
} conv_key;

typedef struct conv_choice {
    int algo; // cudnnConvolution{Fwd,BwdData,BwdFilter}Algo_t of the pass
    cudnnMathType_t math;
    size_t ws;
} conv_choice;

typedef struct conv_slot {
    bool valid;
    conv_key key;
    cudnnTensorDescriptor_t x, y;
    conv_choice pass[PASS_COUNT];
} conv_slot;

typedef struct conv_plan {
    td_gpu *g;
    conv_key full; // the shape at max_n
    int oh, ow;
    bool bias;
    bool direct_w;   // 1x1: OIHW already is KRSC, no copy
    bool stage_dw;   // the filter gradient goes through a KRSC buffer in the workspace
    size_t w_elems;  // O·KH·KW·C
    size_t dw_bytes; // the staging buffer, rounded to CONV_ALIGN (0 without staging)
    cudnnDataType_t dtype;
    cudnnFilterDescriptor_t w;
    cudnnConvolutionDescriptor_t conv;
    int n_cand[PASS_COUNT];
    conv_choice cand[PASS_COUNT][CONV_MAX_CAND]; // heuristics' ranking at max_n (ws unused)
    conv_slot slot[2];                           // [0]: max_n, [1]: the latest other batch size
} conv_plan;

// Builds the plan's descriptors and chooses, at the full batch, every pass's algorithm from
// cuDNN's ranking; *ws_max: the largest workspace of them. -1 after recording a failure.
int td_gpu_conv_build_plan(conv_plan *p, size_t *ws_max);

// The shared workspace rounded up to CONV_ALIGN: the filter-gradient staging buffer (dw_bytes),
// then cuDNN's workspace, whose size goes to *bytes.
char *td_gpu_conv_workspace(const conv_plan *p, size_t *bytes);

// The slot for this batch size, its algorithms fitting the workspace there is. NULL after
// recording a failure.
conv_slot *td_gpu_conv_slot_for(conv_plan *p, int n);

#endif
