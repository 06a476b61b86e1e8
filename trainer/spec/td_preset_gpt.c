/* The GPT preset: GPT-2's decoder as nanoGPT's model.py writes it, node for node and name for
 * name (transformer.wte, transformer.wpe, transformer.h.N.{ln_1, attn.c_attn, attn.c_proj, ln_2,
 * mlp.c_fc, mlp.c_proj}, transformer.ln_f, lm_head tied to wte), so that its checkpoints load
 * into nanoGPT's GPT with strict=True. Pre-LayerNorm blocks, exact GELU (nn.GELU()), GPT-2's
 * initialisation: normal(0, 0.02) for every Linear and Embedding weight, zero biases, and the
 * residual projections (c_proj) at 0.02 / sqrt(2 · n_layer). With dropout p > 0, nanoGPT's four
 * dropouts: transformer.drop after the embeddings, attn_dropout inside the attention (on its
 * probabilities), attn.resid_dropout and mlp.dropout after the c_proj of each; with p = 0 there
 * are no dropout nodes at all (nn.Dropout(0) is the identity). */
#include "spec/td_spec.h"

#include "ops/td_op_sigs.h"

#include <math.h>
#include <stdio.h>
#include <string.h>

static td_node_spec *add(td_node_spec *nodes, int *n, const char *name, const td_op_sig *sig,
                         const char *input) {
    td_node_spec *s = &nodes[(*n)++];
    memset(s, 0, sizeof *s);
    snprintf(s->name, sizeof s->name, "%s", name);
    s->sig = sig;
    for (int i = 0; sig->args[i].name; i++) s->args[i] = sig->args[i].def;
    if (input) {
        s->n_inputs = 1;
        snprintf(s->inputs[0], sizeof s->inputs[0], "%s", input);
    }
    return s;
}

static td_node_spec *linear(td_node_spec *nodes, int *n, const char *name, int out, bool bias,
                            double std) {
    td_node_spec *s = add(nodes, n, name, &td_op_sig_linear, NULL);
    s->args[0] = out, s->args[1] = bias;
    s->init_std = std;
    return s;
}

/* After `name`, with p > 0, a dropout node: its name in name (what the next node reads). */
static void dropout_after(td_node_spec *nodes, int *n, const td_gpt_options *o, char *name,
                          size_t len, const char *dropout_name) {
    if (o->dropout <= 0) return;
    td_node_spec *d = add(nodes, n, dropout_name, &td_op_sig_dropout, name);
    d->args[0] = o->dropout;
    snprintf(name, len, "%s", dropout_name);
}

/* Block l reading `input`: x + attn(ln_1(x)), then + mlp(ln_2(x)); its output's name in out. */
static void block(td_node_spec *nodes, int *n, const td_gpt_options *o, int l, const char *input,
                  char *out, size_t out_len) {
    char p[48], name[TD_NAME_MAX], res_1[TD_NAME_MAX], drop[TD_NAME_MAX];
    snprintf(p, sizeof p, "transformer.h.%d.", l);
    double proj_std = 0.02 / sqrt(2.0 * o->n_layer);
    snprintf(name, sizeof name, "%sln_1", p);
    add(nodes, n, name, &td_op_sig_layernorm, input)->args[1] = o->bias;
    snprintf(name, sizeof name, "%sattn.c_attn", p);
    linear(nodes, n, name, 3 * o->n_embd, o->bias, 0.02);
    snprintf(name, sizeof name, "%sattn.attention", p);
    td_node_spec *a = add(nodes, n, name, &td_op_sig_causal_attention, NULL);
    a->args[0] = o->n_head, a->args[1] = o->dropout;
    snprintf(name, sizeof name, "%sattn.c_proj", p);
    linear(nodes, n, name, o->n_embd, o->bias, proj_std);
    snprintf(drop, sizeof drop, "%sattn.resid_dropout", p);
    dropout_after(nodes, n, o, name, sizeof name, drop);
    snprintf(res_1, sizeof res_1, "%sresidual_1", p);
    td_node_spec *r = add(nodes, n, res_1, &td_op_sig_add, NULL);
    r->n_inputs = 2;
    snprintf(r->inputs[0], sizeof r->inputs[0], "%s", name);
    snprintf(r->inputs[1], sizeof r->inputs[1], "%s", input);
    snprintf(name, sizeof name, "%sln_2", p);
    add(nodes, n, name, &td_op_sig_layernorm, NULL)->args[1] = o->bias;
    snprintf(name, sizeof name, "%smlp.c_fc", p);
    linear(nodes, n, name, 4 * o->n_embd, o->bias, 0.02);
    snprintf(name, sizeof name, "%smlp.gelu", p);
    add(nodes, n, name, &td_op_sig_gelu, NULL);
    snprintf(name, sizeof name, "%smlp.c_proj", p);
    linear(nodes, n, name, o->n_embd, o->bias, proj_std);
    snprintf(drop, sizeof drop, "%smlp.dropout", p);
    dropout_after(nodes, n, o, name, sizeof name, drop);
    snprintf(out, out_len, "%sresidual_2", p);
    r = add(nodes, n, out, &td_op_sig_add, NULL);
    r->n_inputs = 2;
    snprintf(r->inputs[0], sizeof r->inputs[0], "%s", name);
    snprintf(r->inputs[1], sizeof r->inputs[1], "%s", res_1);
}

int td_preset_gpt(const td_gpt_options *o, td_node_spec **out, int *n_out) {
    td_node_spec *nodes = td_calloc((size_t)o->n_layer * 12 + 5, sizeof *nodes);
    int n = 0;
    td_node_spec *s = add(nodes, &n, "transformer.wte", &td_op_sig_embedding, NULL);
    s->args[0] = o->vocab_size, s->args[1] = o->n_embd;
    s->init_std = 0.02;
    s = add(nodes, &n, "transformer.wpe", &td_op_sig_position_embedding, NULL);
    s->args[0] = o->block_size;
    s->init_std = 0.02;
    char input[TD_NAME_MAX] = "transformer.wpe";
    dropout_after(nodes, &n, o, input, sizeof input, "transformer.drop");
    for (int l = 0; l < o->n_layer; l++) block(nodes, &n, o, l, input, input, sizeof input);
    add(nodes, &n, "transformer.ln_f", &td_op_sig_layernorm, input)->args[1] = o->bias;
    s = linear(nodes, &n, "lm_head", o->vocab_size, false, 0.02);
    snprintf(s->weight_from, sizeof s->weight_from, "transformer.wte");
    *out = nodes;
    *n_out = n;
    return 0;
}

void td_preset_gpt_vocab(td_node_spec *nodes, int n, int vocab) {
    for (int i = 0; i < n; i++)
        if ((nodes[i].sig == &td_op_sig_embedding || nodes[i].sig == &td_op_sig_linear) &&
            nodes[i].args[0] == 0)
            nodes[i].args[0] = vocab;
}
