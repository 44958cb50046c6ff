/* step_cost: what one engine step costs on this machine, learnt from the
 * engine's own recent steps — the figures a node decides with and
 * publishes (docs/pd.md, "Measured costs").
 *
 * A step computes n_pre prompt tokens (chunks of prefills) and one token of
 * each of n_dec decoding sequences.  Its time is modelled as
 *
 *   t = step_s + pre_tok_s·n_pre + pre_key_s·Σ keys(pre) + dec_tok_s·n_dec + dec_key_s·Σ keys(dec)
 *
 * where a token at position p attends to p + 1 keys: the per-token terms
 * are the matrix multiplies, the per-key terms attention (which is why a
 * token deep in a long history costs more than one near its start, while
 * moving its KV costs the same), step_s what every step pays (reading the
 * weights, the thread pool's wake-ups).  The coefficients are a robust fit
 * (dx_rfit: ridge toward a prior, outliers down-weighted, none negative)
 * of the last STEP_COST_RING steps that prefilled and the last
 * STEP_COST_RING that only decoded, so the model follows the machine as its
 * load changes and forgets what is older — and a decode node's rare
 * prefills are not pushed out by its thousands of decode steps.
 *
 * Until steps are seen the prior decides: FLOPs counted from the model's
 * shape at STEP_COST_PRIOR_GFLOPS per thread, and the weights read at
 * STEP_COST_PRIOR_GBPS per step — deliberately slower than any machine
 * duplex runs on, so a fresh node overestimates recomputing and pulls KV
 * rather than computes it (and measures itself within a few steps).
 *
 * The inter-token latency of running streams is measured directly, not
 * modelled: the time of every step that carries decode tokens, apart for
 * steps that also prefill (a local prefill stalls the streams: what
 * P/D disaggregation is for), as a robust mean and a histogram.
 *
 * The learner is a plain struct with its ring inside (no allocation); its
 * owner locks around it when two threads share it (the engine does). */
#ifndef STEP_COST_H
#define STEP_COST_H

#include <stddef.h>
#include <stdint.h>

#include "base/dx_est.h"
#include "model/model.h"

#define STEP_COST_K    5  /* the model's coefficients */
#define STEP_COST_RING 32 /* steps the fit keeps of each kind (prefilling, decoding only) */
/* The prior's speeds: FLOP/s per engine thread, and bytes/s of weights
 * read per step (plain literals, for docs and help). */
#define STEP_COST_PRIOR_GFLOPS 25
#define STEP_COST_PRIOR_GBPS   20

/* Upper bounds (seconds) of the decode-step time histogram's buckets. */
#define STEP_COST_ITL_BOUNDS                                                                       \
    {                                                                                              \
        0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5                          \
    }
#define STEP_COST_ITL_N 11

/* One step's work and time. */
typedef struct {
    uint32_t n_pre;  /* prompt tokens computed */
    double pre_keys; /* Σ over them of the keys each attends to */
    uint32_t n_dec;  /* sequences that decoded a token */
    double dec_keys; /* Σ over them of the keys each attends to */
    double seconds;
} step_cost_sample;

/* The model, in seconds: the fitted coefficients and the measured
 * inter-token latencies. */
typedef struct {
    double step_s, pre_tok_s, pre_key_s, dec_tok_s, dec_key_s;
    uint64_t samples; /* steps the fit has seen (0: the prior alone) */
    /* Decode-step time, robust mean: steps without prefill work [0], steps
     * with some [1]; and how many of each were seen. */
    double itl_s[2];
    uint64_t itl_n[2];
    /* histogram of the same, per bucket (STEP_COST_ITL_BOUNDS, then +Inf) */
    uint64_t itl_hist[2][STEP_COST_ITL_N + 1];
    double itl_sum[2];
} step_cost_model;

typedef struct {
    dx_rfit fit[2]; /* [0] steps that only decoded, [1] steps that prefilled */
    double ring[2][STEP_COST_RING * (STEP_COST_K + 1)];
    dx_rewma itl[2];
    uint64_t itl_hist[2][STEP_COST_ITL_N + 1];
    double itl_sum[2];
} step_cost;

/* The prior of a model's shape on n_threads engine threads. */
void step_cost_prior(const model_hparams *hp, int n_threads, step_cost_model *out);
/* Starts the learner at the prior (its coefficients; the rest ignored).
 * The learner holds pointers into itself: never copy an initialised one
 * but through step_cost_copy. */
void step_cost_init(step_cost *c, const step_cost_model *prior);
void step_cost_copy(step_cost *dst, const step_cost *src);
/* A step that ran (one with no work is ignored). */
void step_cost_add(step_cost *c, const step_cost_sample *s);
/* The fit of the steps seen (O(ring · k²): a few µs). */
void step_cost_get(const step_cost *c, step_cost_model *out);

/* Seconds to compute n prompt tokens at positions [pos, pos + n) of one
 * sequence, in steps of at most batch tokens (their share of the step
 * overhead counted; batch 0: one step). */
double step_cost_prefill(const step_cost_model *m, uint64_t n, uint64_t pos, uint32_t batch);
/* The extra seconds n tokens at [pos, pos + n) add to a prefill that
 * computes `rest` more tokens after them anyway (the steps those need
 * paid already). */
double step_cost_prefill_extra(const step_cost_model *m, uint64_t n, uint64_t pos, uint64_t rest,
                               uint32_t batch);
/* Seconds of one decode step of n sequences attending to `keys` keys in all. */
double step_cost_decode(const step_cost_model *m, uint32_t n, double keys);
/* Σ (p + 1) for p in [pos, pos + n): the keys n tokens from pos attend to. */
double step_cost_keys(uint64_t n, uint64_t pos);

#endif
