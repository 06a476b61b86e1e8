/* The op registry: every op of this folder by name, as td_ops.def lists them. The op interface
 * (td_op) is core's (core/td_model.h); which ops exist is this layer's, so core never depends on
 * ops. Specs find ops here by name; presets and the trainer name them directly (&td_op_relu). */
#ifndef TD_OPS_H
#define TD_OPS_H

#include "core/td_model.h"

/* One per op, each defined in its own file of ops/. */
#define TD_OP(name) extern const td_op td_op_##name;
#include "ops/td_ops.def"

/* The op a spec names ("conv2d"); NULL if there is none. */
const td_op *td_op_find(const char *name);
/* "linear, conv2d, ..." for error messages. */
const char *td_op_names(void);

#endif
