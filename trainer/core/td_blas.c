#include "core/td_blas.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

char *openblas_get_corename(void);

void td_blas_fix_kernel(char **argv) {
    if (getenv("OPENBLAS_CORETYPE")) return; /* the user's choice stands */
    const char *core = openblas_get_corename();
    if (!core || strcasecmp(core, "prescott") != 0) return;
    __builtin_cpu_init();
    const char *better = NULL;
    if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512vl"))
        better = "SkylakeX";
    else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"))
        better = "Haswell";
    if (!better) return;
    if (setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
    execv("/proc/self/exe", argv);
    fprintf(stderr,
            "[traind] warning: OpenBLAS chose its generic kernels and re-executing with "
            "OPENBLAS_CORETYPE=%s failed; training will be slow. HINT: set "
            "OPENBLAS_CORETYPE=%s in the environment\n",
            better, better);
}

const char *td_blas_describe(void) {
    return openblas_get_corename();
}
