/* dx_est: small online estimators of costs measured as a program runs —
 * what a node learns of its own speed and of its links (docs/pd.md, "How a
 * node decides: measured costs").
 *
 *   dx_rewma  a robust exponentially weighted mean: one figure that moves
 *             with its samples but not with one wild one (a page-fault
 *             storm, a descheduled thread), in the manner of TCP's RTT
 *             estimator: a residual is clipped to a few mean deviations
 *             before it moves the mean.
 *   dx_rfit   a robust linear fit y ≈ x·θ of k ≤ DX_RFIT_MAX_K features over
 *             the last `cap` samples (a ring the caller owns), pulled toward
 *             prior coefficients (ridge), errors counted relative to y
 *             (timing noise is proportional: the short samples are the ones
 *             that tell a fixed cost), Huber- then bisquare-weighted (a
 *             sample far from the rest counts less, then not at all), every
 *             coefficient ≥ 0 (costs are not negative).  y > 0.  Keep
 *             the prior weak (strength ≤ 1e-3): a prior that bends the fit
 *             makes residuals that the robust weights then discount, which
 *             lets the prior bend it more.  With no samples the fit is the
 * prior; each sample moves it toward the data, and after a few dozen the prior is noise.
 *
 * Both are plain structs with no allocation: adding a sample is O(k) and a
 * fit O(cap·k² + k³), so they may sit on hot paths (an engine step, a
 * pull's end).  Not thread-safe: their owner locks if several threads touch
 * one. */
#ifndef DX_EST_H
#define DX_EST_H

#include <stddef.h>
#include <stdint.h>

/* ---- dx_rewma ---- */

typedef struct {
    double mean, dev; /* the estimate and its mean absolute deviation */
    uint64_t n;       /* samples taken */
} dx_rewma;

/* Starts at prior; dev is its assumed spread (> 0: how far the first
 * samples may move it at once). */
void dx_rewma_init(dx_rewma *e, double prior, double dev);
/* alpha in (0, 1]: the weight of a new sample once a few are in (the
 * first ones weigh 1/(n+1), so the prior fades at once). */
void dx_rewma_add(dx_rewma *e, double x, double alpha);

/* ---- dx_rfit ---- */

#define DX_RFIT_MAX_K 6

typedef struct {
    size_t k;                    /* features, 1..DX_RFIT_MAX_K */
    size_t cap;                  /* samples kept, ≥ 1 */
    double *ring;                /* [cap][k + 1]: x then y; the caller's */
    double prior[DX_RFIT_MAX_K]; /* θ with no samples */
    /* How much the prior weighs: as much as `strength` samples whose
     * relative error is the coefficient's relative distance from its prior
     * (a zero prior: its distance times scale[j] against the prior's
     * prediction at the scales).  scale[j] is also the size feature j
     * usually has (the solver's unit); 0: no pull toward its prior. */
    double scale[DX_RFIT_MAX_K];
    double strength;
    size_t next, n; /* ring position, samples held (≤ cap) */
    uint64_t total; /* samples ever added */
} dx_rfit;

/* ring: cap × (k + 1) doubles, owned by the caller for the fit's life.
 * DX_EINVAL for k or cap out of range. */
int dx_rfit_init(dx_rfit *f, size_t k, size_t cap, double *ring, const double *prior,
                 const double *scale, double strength);
void dx_rfit_add(dx_rfit *f, const double *x, double y);
/* θ[0..k): the robust fit of the samples held (the prior with none).
 * Up to eight Huber iterations, then two bisquare ones, with the scale from the residuals' median
 * absolute deviation; a coefficient that comes out negative is pinned to 0 and the rest fitted
 * again. */
void dx_rfit_solve(const dx_rfit *f, double *theta);
/* x·θ */
double dx_rfit_eval(size_t k, const double *theta, const double *x);

#endif
