/* A node's GPUs: what the driver found, or what the operator declared (`--gpus 0,1,2,3`, or the
 * config file's "gpus" with names and memory). Declaring restricts a GPU machine to some of its
 * devices, and on a machine without any lets the daemon place jobs on GPUs exactly as it would on
 * real ones (each process's CUDA_VISIBLE_DEVICES), which is how GPU placement is tested here.
 * The same list travels in an agent's registration and is shown by GET /v1/nodes. */
#ifndef TD_GPUS_H
#define TD_GPUS_H

#include "base/td_error.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TD_GPUS_MAX 64 /* on one node */

typedef struct td_node_gpu {
    int index;             /* the CUDA device ordinal: what CUDA_VISIBLE_DEVICES lists */
    char name[64];         /* "": unknown */
    uint64_t memory_bytes; /* 0: unknown */
} td_node_gpu;

/* --gpus: device ordinals separated by commas ("0,1,2,3"), each once. */
int td_gpus_parse_list(const char *text, td_node_gpu *out, int *n, td_err *err);
/* The config file's "gpus" (at path): an array of ordinals, or of objects {"index", "name",
 * "memory_gib"}. */
int td_gpus_parse_json(const json_t *a, const char *path, td_node_gpu *out, int *n, td_err *err);
/* The node's GPUs: the declared ones when any (n_declared > 0), each checked against and
 * completed from what the driver found when it found any; else the found ones. An ordinal
 * beyond what the driver found is an error. */
int td_gpus_resolve(const td_node_gpu *declared, int n_declared, const td_node_gpu *found,
                    int n_found, td_node_gpu *out, int *n, td_err *err);

/* [{"index", "name", "memory_bytes"}], with null for what is unknown. */
json_t *td_gpus_json(const td_node_gpu *g, int n);
/* Reads td_gpus_json's form back (an agent's registration; path names it in errors). */
int td_gpus_from_json(const json_t *a, const char *path, td_node_gpu *out, int *n, td_err *err);

/* "GPUs 0,1,2,3 (NVIDIA A100-SXM4-80GB, 80.0 GiB each)", or "GPUs 0,2" when they differ or
 * nothing is known of them: for start-up and join lines. */
void td_gpus_describe(const td_node_gpu *g, int n, char *buf, size_t len);

#endif
