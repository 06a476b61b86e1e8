/* traind-bench-lockstep: the most a synchronous data-parallel trainer can get from this
 * machine's cores. Every rank does the same fixed work per step (arithmetic over a buffer that
 * stays in L2, no memory traffic to share), then all-reduces one float through the same shared
 * memory the trainer's gradients use: the barrier every DDP step has. With one rank this is the
 * work's own time; with two, each step lasts as long as the slower rank's work that step, so
 * any core that runs slower for a while (another tenant on its hyperthread sibling, the
 * hypervisor) holds up both. Two ranks' steps per second over twice one rank's is the ceiling of
 * bench/ddp.sh's scaling on this machine at that step time. Run it under traind-run; rank 0
 * prints one JSON line.
 *   usage: traind-bench-lockstep MFLOP_PER_STEP STEPS */
#include "bench_rank.h"
#include "base/td_clock.h"

#include <stdio.h>
#include <stdlib.h>

#define WORK_FLOATS (32 * 1024) /* 128 KB: in L2 on every x86-64 server CPU */

/* 2 flops an element and pass, in independent chains so the loop is bound by arithmetic rather
 * than by the latency of one chain; the result is returned so no pass can be dropped. */
static float work(const float *buf, long passes) {
    float acc[8] = {0};
    for (long p = 0; p < passes; p++)
        for (int i = 0; i < WORK_FLOATS; i += 8)
            for (int j = 0; j < 8; j++) acc[j] = acc[j] * 0.999f + buf[i + j];
    float s = 0;
    for (int j = 0; j < 8; j++) s += acc[j];
    return s;
}

#if defined(__x86_64__)
#include <immintrin.h>
/* The same arithmetic as the trainer's AVX2 kernels do it, with FMAs in 8 chains of 8 lanes:
 * a core that shares its FMA units with a busy hyperthread sibling slows down as they do. */
__attribute__((target("avx2,fma"))) static float work_fma(const float *buf, long passes) {
    __m256 acc[8], keep = _mm256_set1_ps(0.999f);
    for (int j = 0; j < 8; j++) acc[j] = _mm256_setzero_ps();
    for (long p = 0; p < passes; p++)
        for (int i = 0; i < WORK_FLOATS; i += 64)
            for (int j = 0; j < 8; j++)
                acc[j] = _mm256_fmadd_ps(acc[j], keep, _mm256_loadu_ps(buf + i + 8 * j));
    float lanes[8], s = 0;
    for (int j = 0; j < 8; j++) {
        _mm256_storeu_ps(lanes, acc[j]);
        for (int l = 0; l < 8; l++) s += lanes[l];
    }
    return s;
}
#endif

static int fail(const char *msg) {
    fprintf(stderr, "traind-bench-lockstep: %s\n", msg);
    return 1;
}

int main(int argc, char **argv) {
    double mflop = argc > 1 ? atof(argv[1]) : 0;
    long steps = argc > 2 ? atol(argv[2]) : 0;
    if (argc != 3 || mflop <= 0 || steps <= 0) {
        fprintf(stderr, "usage: traind-bench-lockstep MFLOP_PER_STEP STEPS (both above 0)\n");
        return 2;
    }
    long passes = (long)(mflop * 1e6 / (2.0 * WORK_FLOATS) + 0.5);
    if (passes < 1) passes = 1;
    td_err err = {{0}};
    bench_rank me;
    if (bench_rank_join(&me, &err) != 0) return fail(err.msg);
    float *buf = malloc(WORK_FLOATS * sizeof(float));
    float *flag = td_comm_alloc(me.comm, 16, &err); /* registered: shared memory, as gradients */
    if (!buf || !flag) return fail(buf ? err.msg : "out of memory");
    for (int i = 0; i < WORK_FLOATS; i++) buf[i] = (float)(i % 13) * 1e-3f;
    float (*step_work)(const float *, long) = work;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) step_work = work_fma;
#endif
    float sink = 0;
    double worked = 0, start = 0;
    for (long s = -steps / 10 - 1; s < steps; s++) { /* a tenth of the steps to warm up */
        if (s == 0) {
            if (td_comm_barrier(me.comm, &err) != 0) return fail(err.msg);
            start = td_clock_now();
        }
        double t0 = td_clock_now();
        flag[0] = step_work(buf, passes);
        if (s >= 0) worked += td_clock_now() - t0;
        if (td_comm_allreduce(me.comm, flag, 1, true, &err) != 0) return fail(err.msg);
        sink += flag[0];
    }
    double elapsed = td_clock_now() - start;
    if (me.dist.rank == 0)
        printf("{\"world\":%d,\"steps\":%ld,\"mflop_per_step\":%.2f,\"steps_per_s\":%.1f,"
               "\"step_ms\":%.3f,\"work_ms\":%.3f,\"fma\":%s,\"check\":%g}\n",
               me.dist.world, steps, 2.0 * WORK_FLOATS * (double)passes / 1e6,
               (double)steps / elapsed, elapsed / (double)steps * 1e3, worked / (double)steps * 1e3,
               step_work == work ? "false" : "true", (double)sink);
    td_comm_free(me.comm, flag);
    free(buf);
    bench_rank_leave(&me);
    return 0;
}
