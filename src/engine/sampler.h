/* sampler: picks the next token from a logits row.
 *
 * Greedy (temperature 0: argmax, lowest id on ties) or random sampling with
 * temperature, top-k, top-p (nucleus) and min-p, applied in that order, from a
 * per-request generator seeded by the request's seed — the same seed and
 * logits always give the same token.  Scratch is allocated once per sampler
 * (n_vocab candidates), not per token. */
#ifndef SAMPLER_H
#define SAMPLER_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_rng.h"

typedef struct {
    float temperature; /* 0 = greedy */
    int top_k;         /* 0 = off */
    float top_p;       /* >= 1 = off */
    float min_p;       /* 0 = off */
} sampler_params;


typedef struct sampler sampler;

int sampler_create(uint32_t n_vocab, sampler **out);
void sampler_destroy(sampler *s);
/* Not thread-safe (scratch); one sampler per engine thread. */
int32_t sampler_sample(sampler *s, const float *logits, const sampler_params *p, dx_rng *r);
int32_t sampler_argmax(const float *logits, uint32_t n);

#endif
