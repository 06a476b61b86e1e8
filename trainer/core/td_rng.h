/* Seeded random numbers: xoshiro256** seeded through splitmix64.
 *
 * Written by hand because the run must be bit-identical for a given seed on every machine and the
 * whole state must fit in a checkpoint: libc's rand() is neither portable nor serialisable, and
 * GSL would be a large dependency for forty lines. Every consumer (initialisation, shuffling,
 * dropout) owns its own td_rng, derived from the job seed, so adding a consumer never shifts the
 * stream another one sees.
 */
#ifndef TD_RNG_H
#define TD_RNG_H

#include <stdint.h>

typedef struct td_rng {
    uint64_t s[4];
} td_rng;

/* splitmix64 step: also a good 64-bit mixing function for hashing (seed, index) pairs. */
uint64_t td_mix64(uint64_t x);

void td_rng_seed(td_rng *rng, uint64_t seed);
/* Seeds an independent stream for a named purpose and index, e.g. (seed, "dropout", 0). */
void td_rng_seed_for(td_rng *rng, uint64_t seed, const char *purpose, uint64_t index);
uint64_t td_rng_u64(td_rng *rng);
/* Uniform in [0, 1), 24 random bits: every value is exactly representable as a float. */
float td_rng_uniform(td_rng *rng);
/* Uniform integer in [0, n), without modulo bias. */
uint64_t td_rng_below(td_rng *rng, uint64_t n);
/* Standard normal (Box-Muller, computed in double). */
double td_rng_normal(td_rng *rng);

#endif
