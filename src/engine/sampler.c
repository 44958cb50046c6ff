/* sampler: greedy and temperature/top-k/top-p/min-p sampling. */
#include "engine/sampler.h"

#include <math.h>
#include <stdlib.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"

typedef struct {
    float logit;
    float p;
    int32_t id;
} cand;

struct sampler {
    uint32_t n_vocab;
    cand *c;
};

int sampler_create(uint32_t n_vocab, sampler **out)
{
    sampler *s = dx_calloc(1, sizeof *s);
    if (s) s->c = dx_calloc(n_vocab ? n_vocab : 1, sizeof *s->c);
    if (!s || !s->c) {
        if (s) dx_free(s);
        return dx_errf(DX_ENOMEM, "out of memory for the sampler");
    }
    s->n_vocab = n_vocab;
    *out = s;
    return 0;
}

void sampler_destroy(sampler *s)
{
    if (!s) return;
    dx_free(s->c);
    dx_free(s);
}

int32_t sampler_argmax(const float *logits, uint32_t n)
{
    int32_t best = 0;
    for (uint32_t i = 1; i < n; i++)
        if (logits[i] > logits[best]) best = (int32_t)i;
    return best;
}

/* Descending by logit, ascending id on ties: a total order, so results do not
 * depend on qsort's algorithm. */
static int cand_cmp(const void *a, const void *b)
{
    const cand *x = a, *y = b;
    if (x->logit != y->logit) return x->logit > y->logit ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

int32_t sampler_sample(sampler *s, const float *logits, const sampler_params *p, dx_rng *r)
{
    uint32_t n = s->n_vocab;
    if (!(p->temperature > 0.0f)) return sampler_argmax(logits, n);
    cand *c = s->c;
    /* Tokens more than 40 temperature units below the best have probability
     * under e^-40 relative to it: dropping them before the sort changes no
     * sum that top-p or the draw can see, and keeps a 150k vocabulary cheap. */
    float best = -INFINITY;
    for (uint32_t i = 0; i < n; i++)
        if (isfinite(logits[i]) && logits[i] > best) best = logits[i];
    if (!isfinite(best)) return sampler_argmax(logits, n);
    float floor = best - 40.0f * p->temperature;
    size_t m = 0;
    for (uint32_t i = 0; i < n; i++)
        if (isfinite(logits[i]) && logits[i] >= floor) c[m++] = (cand){logits[i], 0, (int32_t)i};
    qsort(c, m, sizeof *c, cand_cmp);
    if (p->top_k > 0 && (size_t)p->top_k < m) m = (size_t)p->top_k;
    double sum = 0.0;
    for (size_t i = 0; i < m; i++) {
        c[i].p = expf((c[i].logit - c[0].logit) / p->temperature);
        sum += c[i].p;
    }
    if (p->top_p > 0.0f && p->top_p < 1.0f) {
        double acc = 0.0;
        for (size_t i = 0; i < m; i++) {
            acc += c[i].p / sum;
            if (acc >= p->top_p) {
                m = i + 1;
                break;
            }
        }
    }
    if (p->min_p > 0.0f) { /* c[0] has the largest probability */
        size_t k = 1;
        while (k < m && c[k].p >= p->min_p * c[0].p) k++;
        m = k;
    }
    sum = 0.0;
    for (size_t i = 0; i < m; i++) sum += c[i].p;
    double u = dx_rng_uniform(r) * sum, acc = 0.0;
    for (size_t i = 0; i < m; i++) {
        acc += c[i].p;
        if (u < acc) return c[i].id;
    }
    return c[m - 1].id;
}
