/* The ops' signatures (td_op_sigs.c): what a spec may say of each op, without its code. The
 * spec's validator uses these; the model, the ops themselves (td_ops.h). */
#ifndef TD_OP_SIGS_H
#define TD_OP_SIGS_H

#include "core/td_model.h"

#define TD_OP(name) extern const td_op_sig td_op_sig_##name;
#include "ops/td_ops.def"

/* The signature of the op a spec names ("conv2d"); NULL if there is none. */
const td_op_sig *td_op_sig_find(const char *name);
/* "linear, conv2d, ..." for error messages. */
const char *td_op_sig_names(void);

#endif
