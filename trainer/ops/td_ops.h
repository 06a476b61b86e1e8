/* The op registry: every op of this folder, as td_ops.def lists them. The op interface (td_op) is
 * core's (core/td_model.h); which ops exist is this layer's, so core never depends on ops. A
 * spec's nodes name their ops' signatures (td_op_sigs.h); td_op_of gives each its code when a
 * model is to be built (spec/td_spec_ops.c); the trainer names ops directly (&td_op_relu). */
#ifndef TD_OPS_H
#define TD_OPS_H

#include "core/td_model.h"

/* One per op, each defined in its own file of ops/. */
#define TD_OP(name) extern const td_op td_op_##name;
#include "ops/td_ops.def"

/* The op a spec names ("conv2d"); NULL if there is none. */
const td_op *td_op_find(const char *name);
/* The op of a signature (ops/td_op_sigs.h); NULL for NULL. */
const td_op *td_op_of(const td_op_sig *sig);

#endif
