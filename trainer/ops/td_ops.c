/* The op table, generated from td_ops.def, and each op's table of variants by instruction set
 * (ops/td_ops_isa.h). */
#include "ops/td_ops.h"

#include "ops/td_op_sigs.h"
#include "ops/td_ops_isa.h"

#include <stdio.h>
#include <string.h>

static const td_op *const all_ops[] = {
#define TD_OP(name) &td_op_##name,
#include "ops/td_ops.def"
};
#define N_OPS (sizeof all_ops / sizeof all_ops[0])

/* Indexed by td_isa. Where the build has no variants (not x86-64) every entry is the op. */
#if defined(TD_ISA_X86)
#define TD_OP(name)                                                                                \
    extern const td_op td_op_##name##_avx2, td_op_##name##_avx512;                                 \
    const td_op *const td_op_variants_##name[TD_ISA_COUNT] = {&td_op_##name, &td_op_##name##_avx2, \
                                                              &td_op_##name##_avx512};
#else
#define TD_OP(name)                                                                                \
    const td_op *const td_op_variants_##name[TD_ISA_COUNT] = {&td_op_##name, &td_op_##name,        \
                                                              &td_op_##name};
#endif
#include "ops/td_ops.def"

const td_op *td_op_of(const td_op_sig *sig) {
    for (size_t i = 0; sig && i < N_OPS; i++)
        if (all_ops[i]->sig == sig) return all_ops[i];
    return NULL;
}

const td_op *td_op_find(const char *name) {
    return td_op_of(td_op_sig_find(name));
}
