/* The OpenBLAS kernel correction (core/td_blas.h): which CPUs get which core type. */
#include "core/td_blas.h"

#include <criterion/criterion.h>
#include <string.h>

static const td_blas_cpu xeon_avx512 = {
    .amd = false, .family = 6, .avx512 = true, .avx2_fma = true};
static const td_blas_cpu xeon_avx2 = {.amd = false, .family = 6, .avx512 = false, .avx2_fma = true};
static const td_blas_cpu old_x86 = {.amd = false, .family = 6, .avx512 = false, .avx2_fma = false};
static const td_blas_cpu zen3 = {.amd = true, .family = 0x19, .avx512 = false, .avx2_fma = true};
static const td_blas_cpu zen4 = {.amd = true, .family = 0x19, .avx512 = true, .avx2_fma = true};
static const td_blas_cpu zen5 = {.amd = true, .family = 0x1A, .avx512 = true, .avx2_fma = true};

static void expect(const char *chosen, const td_blas_cpu *cpu, const char *want) {
    const char *got = td_blas_better_core(chosen, cpu);
    if (!want)
        cr_expect_null(got, "%s: expected OpenBLAS's choice kept, got %s", chosen, got);
    else
        cr_expect(got && strcmp(got, want) == 0, "%s: expected %s, got %s", chosen, want,
                  got ? got : "(kept)");
}

Test(blas, generic_fallback_takes_the_best_set_the_cpu_runs) {
    expect("Prescott", &xeon_avx512, "SkylakeX");
    expect("prescott", &xeon_avx2, "Haswell");
    expect("PRESCOTT", &zen4, "SkylakeX"); /* a Zen 4 OpenBLAS did not know: then the rule below */
    expect("Prescott", &old_x86, NULL);
}

Test(blas, zen4_runs_the_avx2_kernels_instead_of_avx512) {
    expect("Cooperlake", &zen4, "Haswell");
    expect("SkylakeX", &zen4, "Haswell");
    expect("SapphireRapids", &zen4, "Haswell");
}

Test(blas, other_cpus_keep_openblas_choice) {
    expect("Cooperlake", &xeon_avx512, NULL);
    expect("SkylakeX", &xeon_avx512, NULL);
    expect("SkylakeX", &zen5, NULL); /* full-width 512-bit units */
    expect("Zen", &zen3, NULL);
    expect("Haswell", &zen4, NULL);
    expect(NULL, &zen4, NULL);
}

Test(blas, cpu_read_agrees_with_the_compilers_view) {
    td_blas_cpu cpu = td_blas_cpu_read();
    __builtin_cpu_init();
    cr_expect_eq(cpu.amd, __builtin_cpu_is("amd") != 0);
    cr_expect_eq(cpu.avx2_fma, __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma"));
    cr_expect_geq(cpu.family, 6, "CPUID family %d: every x86-64 CPU reports at least 6",
                  cpu.family);
}
