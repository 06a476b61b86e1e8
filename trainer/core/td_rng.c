#include "core/td_rng.h"

#include <math.h>

uint64_t td_mix64(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

void td_rng_seed(td_rng *rng, uint64_t seed) {
    uint64_t x = seed;
    for (int i = 0; i < 4; i++) {
        x = td_mix64(x);
        rng->s[i] = x;
    }
}

void td_rng_seed_for(td_rng *rng, uint64_t seed, const char *purpose, uint64_t index) {
    /* FNV-1a over the purpose keeps the streams apart without a registry of constants. */
    uint64_t h = 0xCBF29CE484222325ull;
    for (const char *p = purpose; *p; p++) h = (h ^ (uint8_t)*p) * 0x100000001B3ull;
    td_rng_seed(rng, td_mix64(seed ^ h) ^ td_mix64(index + 0x632BE59BD9B4E019ull));
}

static inline uint64_t rotl(uint64_t x, int k) {
    return (x << k) | (x >> (64 - k));
}

uint64_t td_rng_u64(td_rng *rng) {
    uint64_t *s = rng->s;
    uint64_t result = rotl(s[1] * 5, 7) * 9;
    uint64_t t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = rotl(s[3], 45);
    return result;
}

float td_rng_uniform(td_rng *rng) {
    return (float)(td_rng_u64(rng) >> 40) * 0x1.0p-24f;
}

uint64_t td_rng_below(td_rng *rng, uint64_t n) {
    /* Rejection keeps every residue equally likely. */
    uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t x;
    do x = td_rng_u64(rng);
    while (x >= limit);
    return x % n;
}

double td_rng_normal(td_rng *rng) {
    double u1 = ((double)(td_rng_u64(rng) >> 11) + 1.0) * 0x1.0p-53; /* (0, 1]: log is finite */
    double u2 = (double)(td_rng_u64(rng) >> 11) * 0x1.0p-53;
    return sqrt(-2.0 * log(u1)) * cos(2.0 * M_PI * u2);
}
