/* OpenBLAS set-up for a worker process.
 *
 * OpenBLAS 0.3.21 (Debian 12) picks its kernels from the CPU model at load time, and two of its
 * choices cost us speed:
 * - it does not know recent Xeons (Sapphire/Emerald Rapids, especially under KVM) and falls back
 *   to its generic "Prescott" SSE3 kernels, measured at about a third of the AVX-512 kernels'
 *   speed on our machines;
 * - on an AMD Zen 4 it picks its AVX-512 kernels (Cooperlake), but Zen 4 executes a 512-bit FMA
 *   as two 256-bit halves, and the AVX2 (Haswell) kernels ran our GEMMs 2-11% faster there
 *   (MLP and ResNet-18 shapes; the MLP step 4.55 -> 4.38 ms, ResNet-18 1134 -> 1119 ms).
 * The choice is made in a library constructor before main, so the only remedy is
 * OPENBLAS_CORETYPE in the environment of a fresh image: td_blas_fix_kernel() re-executes the
 * process once with it set, chosen by td_blas_better_core() from what the CPU reports.
 */
#ifndef TD_BLAS_H
#define TD_BLAS_H

#include <stdbool.h>

/* What the kernel choice depends on. */
typedef struct td_blas_cpu {
    bool amd;      /* AuthenticAMD */
    int family;    /* CPUID display family (base + extended): 0x19 is Zen 3 and Zen 4 */
    bool avx512;   /* AVX-512 F, BW and VL: what OpenBLAS's SkylakeX kernels need */
    bool avx2_fma; /* AVX2 and FMA: Haswell's */
} td_blas_cpu;

/* This CPU's facts, from CPUID. */
td_blas_cpu td_blas_cpu_read(void);

/* The OpenBLAS core type to run instead of `chosen` (OpenBLAS's own pick, any case) on `cpu`, or
 * NULL to keep it: Prescott becomes SkylakeX or Haswell by the CPU's features, and an AVX-512 set
 * on an AMD family 0x19 CPU (Zen 4) becomes Haswell. Later AMD families (Zen 5 has full-width
 * 512-bit units) and every Intel CPU keep OpenBLAS's choice. */
const char *td_blas_better_core(const char *chosen, const td_blas_cpu *cpu);

/* Re-executes argv with OPENBLAS_CORETYPE set when td_blas_better_core() names a better kernel
 * set and the user did not choose a core type. Returns only when no re-exec is needed or it
 * failed (then training proceeds on OpenBLAS's own choice, with a warning). */
void td_blas_fix_kernel(char **argv);
/* "SkylakeX (OpenBLAS 0.3.21 ...)" for logs. */
const char *td_blas_describe(void);

#endif
