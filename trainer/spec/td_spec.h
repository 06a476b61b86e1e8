/* The job spec: JSON in, a validated td_job out, or one error naming the JSON path, what was
 * found and what was expected. Unknown keys are errors too: a misspelt "momentun" silently
 * ignored would cost a user a training run. */
#ifndef TD_SPEC_H
#define TD_SPEC_H

#include "data/td_data.h"
#include "core/td_device.h"
#include "base/td_error.h"
#include "core/td_loss.h"
#include "core/td_model.h"
#include "core/td_optim.h"
#include "core/td_schedule.h"

#include <stdint.h>

/* The spec's sections, each read by its own parser (td_spec_*.c) and taken by what uses it. */
typedef struct td_model_spec {
    td_node_spec *nodes;
    int n_nodes;
    int num_classes;
    char init_from[TD_PATH_MAX]; /* a safetensors file of weights, or empty */
    bool init_strict;
    /* the gpt preset without vocab_size: the text data's vocabulary sets it (td_train_setup,
     * td_preset_gpt_vocab) */
    bool vocab_from_data;
} td_model_spec;

typedef struct td_train_spec {
    int epochs;
    long max_steps;        /* 0: no limit */
    long eval_every_steps; /* 0: validation after each epoch (and at the end) only */
    long eval_iters;       /* batches of data.val per rank in a pass; 0: the whole split */
    int batch_size, eval_batch_size;
    uint64_t seed;
    int threads;
    bool shuffle, drop_last;
    td_optim_config optim;
    td_schedule schedule;
    td_loss loss;
    float clip_grad_norm;  /* 0: off */
    bool sync_bn;          /* SyncBatchNorm across data-parallel ranks */
    int grad_accum;        /* batches per optimizer step; gradients sync on the last only */
    td_device_kind device; /* train.device */
    td_precision precision;
    bool cuda_graph; /* capture the training step in a CUDA graph where shapes allow */
    /* time cuDNN's algorithms per convolution before training (torch.backends.cudnn.benchmark) */
    bool cudnn_benchmark;
    /* cuDNN keeps to deterministic algorithms (torch.backends.cudnn.deterministic); the CPU
     * always is */
    bool deterministic;
    int n_segments; /* train.activation_checkpointing, marked on model.nodes[].segment */
} td_train_spec;

typedef struct td_distributed_spec {
    double bucket_cap_mb; /* DDP's gradient bucket size */
    td_backend backend;
} td_distributed_spec;

/* checkpoints: none unless dir is set */
typedef struct td_checkpoint_spec {
    char dir[TD_PATH_MAX];
    long every_steps;              /* 0: not by steps */
    int every_epochs;              /* 0: not by epochs */
    int keep;                      /* newest K kept; 0: all */
    char resume_from[TD_PATH_MAX]; /* (the spec's top-level resume_from) a checkpoint directory,
                                      "latest", or empty */
} td_checkpoint_spec;

#define TD_LOG_EVERY_STEPS_DEFAULT 100 /* log.every_steps when the spec gives none */

typedef struct td_log_spec {
    int every_steps;
} td_log_spec;

/* A language model's text at each evaluation, as nanoGPT's sample.py makes it: `tokens` tokens
 * after `prompt`, from the softmax of the logits / temperature over the top_k most likely. */
typedef struct td_sample_spec {
    bool present;
    char prompt[1024];
    int tokens, top_k; /* top_k 0: every token */
    double temperature;
    uint64_t seed;
} td_sample_spec;

typedef struct td_job {
    char name[128];
    td_model_spec model;
    td_data_spec data;
    td_train_spec train;
    td_distributed_spec distributed;
    td_checkpoint_spec checkpoint;
    td_log_spec log;
    td_sample_spec sample;
    char *json; /* the spec as parsed, compact JSON (kept with checkpoints; td_job_free) */
} td_job;

/* Parses and validates a spec from a file or a string. On error returns -1 with err set. */
/* The spec's top-level keys, NULL-terminated: the daemon's submit check adds its own to them. */
extern const char *const td_job_keys[];

/* Parsing checks the spec against the ops' signatures (ops/td_op_sigs.h) and sets each node's
 * sig: what the daemon does to a submission, without linking a kernel (td_spec.c). Loading
 * parses and then gives each node its op's code (td_spec_resolve_ops): what the worker and
 * anything that builds a model from the spec do (td_spec_ops.c). */
int td_job_parse_file(td_job *job, const char *path, td_err *err);
int td_job_parse_string(td_job *job, const char *text, td_err *err);
int td_job_load_file(td_job *job, const char *path, td_err *err);
int td_job_load_string(td_job *job, const char *text, td_err *err);
void td_job_free(td_job *job);
/* Each node's op (its code) from its sig, where not already set (td_spec_ops.c: the worker's;
 * the validator does not need it). */
void td_spec_resolve_ops(td_node_spec *nodes, int n);

/* Presets, expanded into nodes (td_preset.c). The caller frees *out. */
typedef struct td_mlp_options {
    int n_hidden;
    int hidden[16];
    const td_op_sig *activation; /* &td_op_sig_relu or &td_op_sig_gelu */
    float dropout;               /* after each hidden activation; 0: none */
} td_mlp_options;

/* conv1 1->6 5x5, relu, pool 2, conv2 6->16 5x5, relu, pool 2, flatten, fc1 256->120, relu,
 * fc2 120->84, relu, fc3 84->classes (for 28x28 input; parameter names conv1.*, conv2.*, fc1-3.*)
 */
int td_preset_lenet5(int num_classes, td_node_spec **out, int *n_out);
/* The classic PyTorch CIFAR-10 tutorial net: conv1 3->6 5x5, relu, pool 2, conv2 6->16 5x5, relu,
 * pool 2, flatten, fc1 400->120, relu, fc2 120->84, relu, fc3 84->classes (32x32 input). */
int td_preset_cifar_net(int num_classes, td_node_spec **out, int *n_out);

typedef enum td_resnet_stem { TD_STEM_IMAGENET, TD_STEM_CIFAR } td_resnet_stem;
/* torchvision's ResNet v1.5 (stride on the 3x3 conv of a bottleneck), node for node with its
 * module names (conv1, bn1, layer1.0.conv1, layer2.0.downsample.0, fc, ...), its init
 * (kaiming_normal fan_out for convs, BN weight 1 and bias 0) and optionally zero-initialised last
 * BN of each block. depth: 18, 34 or 50. The cifar stem is a 3x3 stride-1 conv without max-pool. */
int td_preset_resnet(int depth, int num_classes, td_resnet_stem stem, bool zero_init_residual,
                     td_node_spec **out, int *n_out);

/* flatten, then fc1..fcK (hidden sizes, each followed by the activation and optional dropout),
 * then fc{K+1} -> classes */
int td_preset_mlp(const td_mlp_options *opt, int num_classes, td_node_spec **out, int *n_out);

/* GPT-2's decoder as nanoGPT writes it (td_preset_gpt.c): vocab_size 0 leaves the token table and
 * the head to td_preset_gpt_vocab, once the data's vocabulary is known. */
typedef struct td_gpt_options {
    int n_layer, n_head, n_embd, block_size, vocab_size;
    bool bias;
    double dropout; /* nanoGPT's: after the embeddings, on attention, after each c_proj */
} td_gpt_options;
int td_preset_gpt(const td_gpt_options *opt, td_node_spec **out, int *n_out);
void td_preset_gpt_vocab(td_node_spec *nodes, int n, int vocab);

#endif
