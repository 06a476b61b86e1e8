/* OpenBLAS set-up for a worker process.
 *
 * OpenBLAS 0.3.21 (Debian 12) picks its kernels from the CPU model at load time and does not
 * know recent Xeons (Sapphire/Emerald Rapids, especially under KVM): it falls back to its
 * generic "Prescott" SSE3 kernels, measured at about a third of the AVX-512 kernels' speed on
 * our machines. The choice is made in a library constructor before main, so the only remedy is
 * OPENBLAS_CORETYPE in the environment of a fresh image: td_blas_fix_kernel() re-executes the
 * process once with it set, chosen from what the CPU reports it supports.
 */
#ifndef TD_BLAS_H
#define TD_BLAS_H

/* Re-executes argv with OPENBLAS_CORETYPE set when OpenBLAS fell back to its generic kernels on
 * a CPU with AVX2 or AVX-512 and the user did not choose a core type. Returns only when no
 * re-exec is needed or it failed (then training proceeds on the slow kernels, with a warning). */
void td_blas_fix_kernel(char **argv);
/* "SkylakeX (OpenBLAS 0.3.21 ...)" for logs. */
const char *td_blas_describe(void);

#endif
