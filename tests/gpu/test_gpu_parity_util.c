/* traind-gpu-parity's helpers (test_gpu_parity.c has the cases and runs them): the error
 * measure, the inputs and labels, bf16 rounding, the node strings of the cases parsed into node
 * specs, and the rows of the table it prints. */
#include "test_gpu_parity.h"
#include "ops/td_ops.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ------------------------------------------------------------------------------- */

double parity_rel_err(const float *want, const float *got, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        if (!isfinite(got[i]) || !isfinite(want[i])) return INFINITY;
        double d = fabs((double)want[i] - (double)got[i]);
        if (d > num) num = d;
        if (fabs(want[i]) > den) den = fabs(want[i]);
    }
    return num / (den > 1e-6 ? den : 1e-6);
}

/* Keeps the worst error of a kind with where it came from. */
void parity_note(result *r, double *slot, double e, const char *what, const char *name) {
    if (*slot < 0 || e > *slot) *slot = e;
    /* a failing row is diagnosed from afar (the GPU machine is lent for minutes): it lists
     * every tensor, not only the worst, so a single error stands apart from a general drift */
    size_t used = strlen(r->detail);
    if (used + 1 < sizeof r->detail)
        snprintf(r->detail + used, sizeof r->detail - used, "%s%s %s %.2g", used ? "; " : "", what,
                 name, e);
    double worst = fmax(fmax(r->out, r->loss), fmax(r->grad, r->buf));
    if (e >= worst) snprintf(r->where, sizeof r->where, "%s %s", what, name);
}

/* Round to nearest even bf16, kept in a float. */
float parity_to_bf16(float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    u += 0x7FFFu + ((u >> 16) & 1u);
    u &= 0xFFFF0000u;
    memcpy(&x, &u, sizeof x);
    return x;
}

/* Distinct odd multiples of 1/512 in [-255/512, 255/512] (the range of normalised pixels, so
 * logits stay near 1 and a bf16 logit's rounding moves the softmax little): a shuffled run of 256
 * repeats, so any two values less than 256 elements apart differ (no ties inside a pooling
 * window), and every value is exact in bf16 and non-zero. */
void parity_fill_input(float *x, size_t n, td_rng *rng) {
    int perm[256];
    for (int i = 0; i < 256; i++) perm[i] = i;
    for (int i = 255; i > 0; i--) {
        int j = (int)td_rng_below(rng, (uint64_t)i + 1);
        int t = perm[i];
        perm[i] = perm[j];
        perm[j] = t;
    }
    for (size_t i = 0; i < n; i++) x[i] = (float)(2 * perm[i % 256] - 255) / 512.0f;
}

void parity_fill_ids(float *x, size_t n, int vocab, td_rng *rng) {
    for (size_t i = 0; i < n; i++) x[i] = (float)td_rng_below(rng, (uint64_t)vocab);
}

void parity_fill_labels(int32_t *y, int n, int classes, td_rng *rng) {
    for (int i = 0; i < n; i++) y[i] = (int32_t)td_rng_below(rng, (uint64_t)classes);
}

static int find_arg(const td_op *op, const char *key) {
    for (int i = 0; op->sig->args[i].name; i++)
        if (strcmp(op->sig->args[i].name, key) == 0) return i;
    return -1;
}

/* The value of a choice argument by name ("tanh" in "none|tanh"), or -1. */
static int choice_index(const char *choices, const char *value) {
    size_t len = strlen(value);
    int index = 0;
    for (const char *p = choices; p && *p; index++) {
        const char *bar = strchr(p, '|');
        size_t n = bar ? (size_t)(bar - p) : strlen(p);
        if (n == len && strncmp(p, value, n) == 0) return index;
        p = bar ? bar + 1 : NULL;
    }
    return -1;
}

static int parse_node(char *text, int index, td_node_spec *s, td_err *err) {
    memset(s, 0, sizeof *s);
    char *save = NULL;
    char *word = strtok_r(text, " \t", &save);
    if (!word) return td_fail(err, "node %d: empty", index);
    s->op = td_op_find(word);
    if (!s->op) return td_fail(err, "node %d: unknown op %s", index, word);
    snprintf(s->name, sizeof s->name, "n%d", index);
    for (int i = 0; s->op->sig->args[i].name; i++) s->args[i] = s->op->sig->args[i].def;
    while ((word = strtok_r(NULL, " \t", &save))) {
        char *eq = strchr(word, '=');
        if (!eq) return td_fail(err, "node %d: %s is not key=value", index, word);
        *eq = 0;
        const char *value = eq + 1;
        if (strcmp(word, "name") == 0) {
            snprintf(s->name, sizeof s->name, "%s", value);
        } else if (strcmp(word, "weight_from") == 0) {
            snprintf(s->weight_from, sizeof s->weight_from, "%s", value);
        } else if (strcmp(word, "seg") == 0) {
            s->segment = atoi(value);
        } else if (strcmp(word, "inputs") == 0) {
            char list[256], *save2 = NULL;
            snprintf(list, sizeof list, "%s", value);
            for (char *in = strtok_r(list, ",", &save2); in && s->n_inputs < TD_MAX_INPUTS;
                 in = strtok_r(NULL, ",", &save2))
                snprintf(s->inputs[s->n_inputs++], TD_NAME_MAX, "%s", in);
        } else {
            int a = find_arg(s->op, word);
            if (a < 0)
                return td_fail(err, "node %d: %s has no argument %s", index, s->op->sig->name,
                               word);
            const td_op_arg *arg = &s->op->sig->args[a];
            char *end;
            double v = strtod(value, &end);
            if (*end && arg->type == TD_ARG_CHOICE) v = choice_index(arg->choices, value);
            if ((*end && arg->type != TD_ARG_CHOICE) || v < 0)
                return td_fail(err, "node %d: bad value %s for %s", index, value, word);
            s->args[a] = v;
        }
    }
    return 0;
}

int parity_parse_nodes(const char *text, td_node_spec *specs, int *n, td_err *err) {
    char buf[1024], *save = NULL;
    snprintf(buf, sizeof buf, "%s", text);
    *n = 0;
    for (char *part = strtok_r(buf, ";", &save); part; part = strtok_r(NULL, ";", &save)) {
        if (*n == MAX_NODES) return td_fail(err, "more than %d nodes", MAX_NODES);
        if (parse_node(part, *n, &specs[*n], err) != 0) return -1;
        (*n)++;
    }
    return 0;
}

/* ---- the table ----------------------------------------------------------------------------- */

static void cell(char *buf, size_t len, double v) {
    if (v < 0)
        snprintf(buf, len, "%9s", "-");
    else
        snprintf(buf, len, "%9.2e", v);
}

/* Prints the row; returns whether the case passed. */
bool parity_row(const char *name, td_precision prec, const result *r, int rc, double tol) {
    char out[16], loss[16], grad[16], buf[16];
    cell(out, sizeof out, r->out);
    cell(loss, sizeof loss, r->loss);
    cell(grad, sizeof grad, r->grad);
    cell(buf, sizeof buf, r->buf);
    double worst = fmax(fmax(r->out, r->loss), fmax(r->grad, r->buf));
    bool pass = rc == 0 && worst <= tol;
    printf("| %-26s | %-4s | %s | %s | %s | %s | %s", name, td_precision_name(prec), out, loss,
           grad, buf, pass ? "PASS" : "FAIL");
    if (rc != 0)
        printf(" (%s)", r->error);
    else if (!pass)
        printf(" (%s: %.3g > %.0e)", r->where, worst, tol);
    printf(" |\n");
    if (rc == 0 && !pass) printf("    every tensor: %s\n", r->detail);
    fflush(stdout);
    return pass;
}
