#include "core/td_isa.h"

#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char *const NAMES[TD_ISA_COUNT] = {"baseline", "avx2", "avx512"};
#if defined(TD_ISA_X86)
/* What each needs, as the compiler flags of its kernels (trainer/CMakeLists.txt) assume (only
 * x86-64 builds name them: elsewhere, and in the fuzz build, there is only the baseline). */
static const char *const NEEDS[TD_ISA_COUNT] = {
    "nothing", "x86-64-v3 (AVX2, FMA, BMI2, F16C, MOVBE)",
    "x86-64-v4 (AVX-512 F, BW, CD, DQ, VL, and x86-64-v3)"};
#endif

const char *td_isa_name(td_isa isa) {
    return isa >= 0 && isa < TD_ISA_COUNT ? NAMES[isa] : "unknown";
}

#if defined(TD_ISA_X86) && defined(__clang__)
/* GCC names the x86-64 levels; clang (14, the fuzz build's compiler) knows only single features,
 * so the levels are spelt out: v3 by AVX2, FMA, BMI1 and BMI2 (every CPU with these also has
 * v3's F16C, MOVBE and LZCNT), v4 by the AVX-512 subsets it adds. */
static bool cpu_v3(void) {
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") &&
           __builtin_cpu_supports("bmi") && __builtin_cpu_supports("bmi2");
}
static bool cpu_v4(void) {
    return cpu_v3() && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512cd") && __builtin_cpu_supports("avx512dq") &&
           __builtin_cpu_supports("avx512vl");
}
#elif defined(TD_ISA_X86)
static bool cpu_v3(void) {
    return __builtin_cpu_supports("x86-64-v3");
}
static bool cpu_v4(void) {
    return __builtin_cpu_supports("x86-64-v4");
}
#endif

bool td_isa_supported(td_isa isa) {
    switch (isa) {
    case TD_ISA_BASELINE:
        return true;
#if defined(TD_ISA_X86)
    case TD_ISA_AVX2:
        return cpu_v3();
    case TD_ISA_AVX512:
        return cpu_v4();
#endif
    default:
        return false;
    }
}

td_isa td_isa_best(void) {
    for (int i = TD_ISA_COUNT - 1; i > 0; i--)
        if (td_isa_supported((td_isa)i)) return (td_isa)i;
    return TD_ISA_BASELINE;
}

/* The process's choice: a CPU property like OpenBLAS's core type, set once before models are
 * built (td_isa_select) or on first use. */
static _Atomic int active = -1;
static char why[256];
static pthread_mutex_t choosing = PTHREAD_MUTEX_INITIALIZER;

static int parse(const char *name, td_isa *out, td_err *err) {
    for (int i = 0; i < TD_ISA_COUNT; i++)
        if (strcmp(name, NAMES[i]) == 0) {
            *out = (td_isa)i;
            if (td_isa_supported(*out)) return 0;
#if defined(TD_ISA_X86)
            return td_fail(err,
                           "this CPU cannot run the %s kernels: they need %s (the best it "
                           "runs is %s)",
                           name, NEEDS[i], NAMES[td_isa_best()]);
#else
            return td_fail(err, "this build has no %s kernels (not an x86-64 build)", name);
#endif
        }
    return td_fail(err, "unknown instruction set \"%s\" (expected baseline, avx2 or avx512)", name);
}

int td_isa_select(const char *name, td_err *err) {
    const char *env = getenv("TRAIND_ISA");
    td_isa isa = td_isa_best();
    int rc = 0;
    pthread_mutex_lock(&choosing);
    if (name && *name) {
        rc = parse(name, &isa, err);
        snprintf(why, sizeof why, "chosen by the program");
    } else if (env && *env) {
        td_err bad = {{0}};
        if (parse(env, &isa, err ? err : &bad) == 0)
            snprintf(why, sizeof why, "TRAIND_ISA");
        else if (err)
            rc = td_fail_prefix(err, "TRAIND_ISA=%s", env);
        else
            snprintf(why, sizeof why, "the best this CPU supports; TRAIND_ISA=%.32s ignored: %.80s",
                     env, bad.msg);
    } else {
        snprintf(why, sizeof why, "the best this CPU supports");
    }
    if (rc == 0) atomic_store(&active, (int)isa);
    pthread_mutex_unlock(&choosing);
    return rc;
}

td_isa td_isa_active(void) {
    int isa = atomic_load(&active);
    if (isa < 0) {
        (void)td_isa_select(NULL, NULL);
        isa = atomic_load(&active);
    }
    return (td_isa)isa;
}

const char *td_isa_why(void) {
    (void)td_isa_active();
    return why;
}
