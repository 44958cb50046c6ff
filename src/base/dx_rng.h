/* dx_rng: the project's one deterministic generator — splitmix64 (seeding,
 * hashing a counter) and xoshiro256** (streams).  Portable and exactly
 * reproducible: synthetic weights, seeded sampling and test data depend on
 * the same seed giving the same numbers on every machine.  Not for secrets
 * (lease tokens use getrandom). */
#ifndef DX_RNG_H
#define DX_RNG_H

#include <stdint.h>

/* Advances *x and returns the next splitmix64 output. */
static inline uint64_t dx_splitmix64(uint64_t *x)
{
    uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct {
    uint64_t s[4];
} dx_rng;

static inline void dx_rng_seed(dx_rng *r, uint64_t seed)
{
    for (int i = 0; i < 4; i++) r->s[i] = dx_splitmix64(&seed);
}

static inline uint64_t dx_rng_next(dx_rng *r)
{
    uint64_t *s = r->s, x = s[1] * 5, res = ((x << 7) | (x >> 57)) * 9, t = s[1] << 17;
    s[2] ^= s[0];
    s[3] ^= s[1];
    s[1] ^= s[2];
    s[0] ^= s[3];
    s[2] ^= t;
    s[3] = (s[3] << 45) | (s[3] >> 19);
    return res;
}

/* Uniform in [0, 1) with 53 bits. */
static inline double dx_rng_uniform(dx_rng *r)
{
    return (double)(dx_rng_next(r) >> 11) * (1.0 / 9007199254740992.0);
}

#endif
