#include "core/td_blas.h"

#include <cpuid.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <unistd.h>

char *openblas_get_corename(void);

td_blas_cpu td_blas_cpu_read(void) {
    td_blas_cpu cpu = {0};
    unsigned a, b, c, d;
    if (__get_cpuid(0, &a, &b, &c, &d)) /* vendor: "AuthenticAMD" in EBX, EDX, ECX */
        cpu.amd = b == 0x68747541u && d == 0x69746e65u && c == 0x444d4163u;
    if (__get_cpuid(1, &a, &b, &c, &d)) {
        int base = (int)((a >> 8) & 0xF), ext = (int)((a >> 20) & 0xFF);
        cpu.family = base == 0xF ? base + ext : base;
    }
    __builtin_cpu_init();
    cpu.avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                 __builtin_cpu_supports("avx512vl");
    cpu.avx2_fma = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    return cpu;
}

static bool core_is_avx512(const char *core) {
    static const char *const sets[] = {"SkylakeX", "Cooperlake", "SapphireRapids"};
    for (size_t i = 0; i < sizeof sets / sizeof *sets; i++)
        if (strcasecmp(core, sets[i]) == 0) return true;
    return false;
}

const char *td_blas_better_core(const char *chosen, const td_blas_cpu *cpu) {
    if (!chosen) return NULL;
    if (strcasecmp(chosen, "prescott") == 0) {
        if (cpu->avx512) return "SkylakeX";
        if (cpu->avx2_fma) return "Haswell";
        return NULL;
    }
    if (cpu->amd && cpu->family == 0x19 && cpu->avx2_fma && core_is_avx512(chosen))
        return "Haswell";
    return NULL;
}

void td_blas_fix_kernel(char **argv) {
    if (getenv("OPENBLAS_CORETYPE")) return; /* the user's choice stands */
    td_blas_cpu cpu = td_blas_cpu_read();
    const char *better = td_blas_better_core(openblas_get_corename(), &cpu);
    if (!better) return;
    if (setenv("OPENBLAS_CORETYPE", better, 1) != 0) return;
    execv("/proc/self/exe", argv);
    fprintf(stderr,
            "[traind] warning: re-executing with OPENBLAS_CORETYPE=%s (OpenBLAS chose %s) failed; "
            "training will be slower. HINT: set OPENBLAS_CORETYPE=%s in the environment\n",
            better, openblas_get_corename(), better);
}

const char *td_blas_describe(void) {
    return openblas_get_corename();
}
