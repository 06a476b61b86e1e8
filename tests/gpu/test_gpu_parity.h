/* What traind-gpu-parity's two sources share: test_gpu_parity.c (the cases and how each runs)
 * and test_gpu_parity_util.c (the cases' node strings parsed into node specs, the inputs, bf16
 * rounding, the error measure and the table's rows). */
#ifndef TEST_GPU_PARITY_H
#define TEST_GPU_PARITY_H

#include "core/td_device.h"
#include "core/td_model.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define BATCH     4
#define CLASSES   5
#define SEED      20240611u
#define MAX_NODES 16

typedef struct result {
    double out, loss, grad, buf; /* worst relative errors; -1: not compared */
    char where[160];             /* which tensor gave the worst of them */
    char error[TD_ERR_MAX];      /* a failure before anything could be compared */
    char detail[2048];           /* every tensor's error, printed under a failing row */
} result;

/* The helpers (test_gpu_parity_util.c, where each is described). */
double parity_rel_err(const float *want, const float *got, size_t n);
void parity_note(result *r, double *slot, double e, const char *what, const char *name);
float parity_to_bf16(float x);
void parity_fill_input(float *x, size_t n, td_rng *rng);
/* Token ids: integers in [0, vocab), as a text batch carries them (floats). */
void parity_fill_ids(float *x, size_t n, int vocab, td_rng *rng);
/* Labels in [0, classes). */
void parity_fill_labels(int32_t *y, int n, int classes, td_rng *rng);
int parity_parse_nodes(const char *text, td_node_spec *specs, int *n, td_err *err);
bool parity_row(const char *name, td_precision prec, const result *r, int rc, double tol);

#endif
