/* step_cost: an engine step's cost model, learnt online (see .h). */
#include "engine/step_cost.h"

#include <string.h>

/* How much the prior weighs in the fit: a thousandth of a step (dx_rfit's
 * strength) — enough to pin coefficients the node's steps never exercise
 * (a prefill node's decode terms), too little to bend what they measure. */
#define PRIOR_STRENGTH 0.001
#define ITL_ALPHA      0.1 /* the inter-token latency's mean follows ~10 steps */

/* The feature vector of a step: its overhead, prefill tokens and keys,
 * decode tokens and keys. */
static void features(const step_cost_sample *s, double *x)
{
    x[0] = 1;
    x[1] = s->n_pre;
    x[2] = s->pre_keys;
    x[3] = s->n_dec;
    x[4] = s->dec_keys;
}

/* What a step usually holds, the unit each coefficient's prior weight is
 * counted in (a 256-token prefill chunk at depth 1024, eight decodes). */
static const double k_scale[STEP_COST_K] = {1, 256, 256.0 * 1024, 8, 8.0 * 1024};

void step_cost_prior(const model_hparams *hp, int n_threads, step_cost_model *out)
{
    memset(out, 0, sizeof *out);
    double e = hp->n_embd, hd = hp->head_dim, q = (double)hp->n_head * hd,
           kv = (double)hp->n_kv_head * hd, L = hp->n_layer;
    /* per token: the projections and the FFN, 2 FLOPs a weight */
    double params = L * (e * (q + 2 * kv) + q * e + 3 * e * hp->n_ff);
    double flops_tok = 2 * params, flops_key = 4 * L * q; /* QKᵀ and PV */
    double rate = (double)STEP_COST_PRIOR_GFLOPS * 1e9 * (n_threads > 0 ? n_threads : 1);
    out->pre_tok_s = flops_tok / rate;
    out->pre_key_s = flops_key / rate;
    /* a decode token also pays its row of the output head */
    out->dec_tok_s = (flops_tok + 2.0 * hp->n_vocab * e) / rate;
    out->dec_key_s = flops_key / rate;
    /* every step reads the weights once (2 bytes each, BF16's) */
    out->step_s = (params + (double)hp->n_vocab * e) * 2 / ((double)STEP_COST_PRIOR_GBPS * 1e9);
}

static void coef_of(const step_cost_model *m, double *th)
{
    th[0] = m->step_s;
    th[1] = m->pre_tok_s;
    th[2] = m->pre_key_s;
    th[3] = m->dec_tok_s;
    th[4] = m->dec_key_s;
}

void step_cost_init(step_cost *c, const step_cost_model *prior)
{
    memset(c, 0, sizeof *c);
    double th[STEP_COST_K];
    coef_of(prior, th);
    for (int i = 0; i < 2; i++) {
        int rc = dx_rfit_init(&c->fit[i], STEP_COST_K, STEP_COST_RING, c->ring[i], th, k_scale,
                              PRIOR_STRENGTH);
        (void)rc; /* constant sizes: cannot fail */
    }
    for (int i = 0; i < 2; i++) dx_rewma_init(&c->itl[i], prior->step_s, prior->step_s);
}

void step_cost_copy(step_cost *dst, const step_cost *src)
{
    memcpy(dst, src, sizeof *dst);
    for (int i = 0; i < 2; i++) dst->fit[i].ring = dst->ring[i];
}

void step_cost_add(step_cost *c, const step_cost_sample *s)
{
    if (!s->n_pre && !s->n_dec) return;
    double x[STEP_COST_K];
    features(s, x);
    dx_rfit_add(&c->fit[s->n_pre > 0], x, s->seconds);
    if (!s->n_dec) return;
    int w = s->n_pre > 0;
    dx_rewma_add(&c->itl[w], s->seconds, ITL_ALPHA);
    static const double bounds[STEP_COST_ITL_N] = STEP_COST_ITL_BOUNDS;
    size_t b = 0;
    while (b < STEP_COST_ITL_N && s->seconds > bounds[b]) b++;
    c->itl_hist[w][b]++;
    c->itl_sum[w] += s->seconds;
}

void step_cost_get(const step_cost *c, step_cost_model *out)
{
    memset(out, 0, sizeof *out);
    /* one fit over both kinds of step, in a ring of their union */
    double ring[2 * STEP_COST_RING * (STEP_COST_K + 1)], th[STEP_COST_K];
    dx_rfit all;
    int rc = dx_rfit_init(&all, STEP_COST_K, 2 * STEP_COST_RING, ring, c->fit[0].prior, k_scale,
                          PRIOR_STRENGTH);
    (void)rc;
    for (int i = 0; i < 2; i++)
        for (size_t j = 0; j < c->fit[i].n; j++) {
            const double *sm = c->fit[i].ring + j * (STEP_COST_K + 1);
            dx_rfit_add(&all, sm, sm[STEP_COST_K]);
        }
    dx_rfit_solve(&all, th);
    out->step_s = th[0];
    out->pre_tok_s = th[1];
    out->pre_key_s = th[2];
    out->dec_tok_s = th[3];
    out->dec_key_s = th[4];
    out->samples = c->fit[0].total + c->fit[1].total;
    for (int i = 0; i < 2; i++) {
        out->itl_s[i] = c->itl[i].mean;
        out->itl_n[i] = c->itl[i].n;
        memcpy(out->itl_hist[i], c->itl_hist[i], sizeof out->itl_hist[i]);
        out->itl_sum[i] = c->itl_sum[i];
    }
}

double step_cost_keys(uint64_t n, uint64_t pos)
{
    /* Σ_{p=pos}^{pos+n-1} (p + 1) */
    return (double)n * (double)pos + (double)n * (double)(n + 1) / 2;
}

static uint64_t steps_for(uint64_t n, uint32_t batch)
{
    return batch ? (n + batch - 1) / batch : (n > 0);
}

double step_cost_prefill(const step_cost_model *m, uint64_t n, uint64_t pos, uint32_t batch)
{
    if (!n) return 0;
    return m->step_s * (double)steps_for(n, batch) + m->pre_tok_s * (double)n +
           m->pre_key_s * step_cost_keys(n, pos);
}

double step_cost_prefill_extra(const step_cost_model *m, uint64_t n, uint64_t pos, uint64_t rest,
                               uint32_t batch)
{
    if (!n) return 0;
    uint64_t steps = steps_for(n + rest, batch) - steps_for(rest, batch);
    return m->step_s * (double)steps + m->pre_tok_s * (double)n +
           m->pre_key_s * step_cost_keys(n, pos);
}

double step_cost_decode(const step_cost_model *m, uint32_t n, double keys)
{
    return n ? m->step_s + m->dec_tok_s * n + m->dec_key_s * keys : 0;
}
