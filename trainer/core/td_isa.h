/* Which instruction set the CPU kernels use: one portable binary, the fastest code the CPU
 * can run.
 *
 * The op kernels (trainer/ops/) are compiled once per instruction set: baseline x86-64 (SSE2),
 * AVX2 with FMA (x86-64-v3: every x86 server since 2013-2015, AMD EPYC included) and AVX-512
 * (x86-64-v4: Intel Xeon since Skylake-SP, AMD since Zen 4). A model binds each node to the
 * kernels of the active instruction set when it is built (td_op.variants, td_node.impl). The
 * choice is the process's, made once: TRAIND_ISA=baseline|avx2|avx512 when set, else the best
 * the CPU supports, as OpenBLAS picks its kernels. Other architectures have only "baseline". */
#ifndef TD_ISA_H
#define TD_ISA_H

#include "base/td_error.h"

#include <stdbool.h>

typedef enum td_isa { TD_ISA_BASELINE, TD_ISA_AVX2, TD_ISA_AVX512, TD_ISA_COUNT } td_isa;

/* "baseline", "avx2", "avx512" */
const char *td_isa_name(td_isa isa);
/* Whether this build has kernels for isa and this CPU can run them. */
bool td_isa_supported(td_isa isa);
/* The best supported. */
td_isa td_isa_best(void);

/* Chooses the process's instruction set: name ("avx2"), or NULL / "" for TRAIND_ISA when set,
 * else the best supported. Fails, saying what the CPU lacks, for a name this CPU or build
 * cannot run or does not know (with err NULL, an unusable TRAIND_ISA falls back to the best
 * instead). Models built afterwards use it. */
int td_isa_select(const char *name, td_err *err);
/* The process's instruction set; selected with NULL on first use when nothing chose one (then
 * an unusable TRAIND_ISA falls back to the best, and td_isa_why says so). */
td_isa td_isa_active(void);
/* Why that one: "TRAIND_ISA", "the best this CPU supports", ... */
const char *td_isa_why(void);

#endif
