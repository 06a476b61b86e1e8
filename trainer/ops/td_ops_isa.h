/* How the files of ops/ are compiled once per instruction set (core/td_isa.h).
 *
 * Every file of this folder but td_ops.c is compiled as itself (the baseline: plain x86-64, or
 * whatever the target is) and, on x86-64, twice more with -march=x86-64-v3 and -march=x86-64-v4
 * and TD_ISA_VARIANT defined to avx2 or avx512 (trainer/CMakeLists.txt). The kernels' #if
 * __AVX2__ / __AVX512F__ paths and the compiler's own vectorisation then follow the variant.
 * Each variant's external names carry its suffix (td_op_conv2d_avx2), so the three coexist in
 * one binary: the ops' tables name theirs with TD_ISA_SYM, and the headers of this folder's
 * shared kernels rename theirs. Only the baseline td_op_<name> is what the rest of traind sees;
 * its `variants` table (td_ops.c) points a model at the variant to run. */
#ifndef TD_OPS_ISA_H
#define TD_OPS_ISA_H

#include "core/td_isa.h"
#include "ops/td_op_sigs.h"
#include "ops/td_ops.h"

#define TD_ISA_PASTE2(a, b) a##_##b
#define TD_ISA_PASTE(a, b)  TD_ISA_PASTE2(a, b)

#if defined(TD_ISA_VARIANT)
#define TD_ISA_SYM(name) TD_ISA_PASTE(name, TD_ISA_VARIANT)
/* a variant is reached through the baseline op's table, never on its own */
#define TD_OP_VARIANTS(name) NULL
#else
#define TD_ISA_SYM(name)     name
#define TD_OP_VARIANTS(name) td_op_variants_##name
#define TD_OP(name)          extern const td_op *const td_op_variants_##name[TD_ISA_COUNT];
#include "ops/td_ops.def"
#endif

#endif
