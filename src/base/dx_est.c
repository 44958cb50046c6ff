/* dx_est: robust online estimators (see .h). */
#include "base/dx_est.h"

#include <math.h>
#include <string.h>

#include "base/dx_err.h"

/* ---- dx_rewma ------------------------------------------------------------------ */

/* A residual moves the mean by at most this many mean deviations: one
 * sample ten times the rest is then a nudge, while a real change of level
 * still gets through in a few samples (the deviation grows with it). */
#define REWMA_CLIP 3.0

void dx_rewma_init(dx_rewma *e, double prior, double dev)
{
    e->mean = prior;
    e->dev = dev > 0 ? dev : fabs(prior) / 2;
    e->n = 0;
}

void dx_rewma_add(dx_rewma *e, double x, double alpha)
{
    if (!isfinite(x)) return;
    double a = 1.0 / (double)(e->n + 1);
    if (a < alpha) a = alpha;
    double r = x - e->mean, lim = REWMA_CLIP * e->dev;
    /* the first sample is taken whole: the prior is a guess, not a sample */
    if (e->n > 0 && lim > 0 && fabs(r) > lim) r = r > 0 ? lim : -lim;
    e->mean += a * r;
    e->dev += a * (fabs(r) - e->dev);
    e->n++;
}

/* ---- dx_rfit ------------------------------------------------------------------- */

/* Huber's and Tukey's constants, in units of the residuals' robust scale
 * (95% efficiency on clean Gaussian data): Huber's weights first, which
 * converge from a least-squares start however bad, then Tukey's bisquare,
 * which gives a sample far out no weight at all (a step that another
 * process stretched tenfold must not bend the fit). */
#define HUBER_C     1.345
#define TUKEY_C     4.685
#define HUBER_ITERS 8
#define TUKEY_ITERS 2
#define MAX_CAP     256 /* samples a fit may hold: its scratch is on the stack */

int dx_rfit_init(dx_rfit *f, size_t k, size_t cap, double *ring, const double *prior,
                 const double *scale, double strength)
{
    if (k < 1 || k > DX_RFIT_MAX_K || cap < 1 || cap > MAX_CAP || !ring)
        return dx_errf(DX_EINVAL, "dx_rfit: %zu features (1..%d) over %zu samples (1..%d)", k,
                       DX_RFIT_MAX_K, cap, MAX_CAP);
    memset(f, 0, sizeof *f);
    f->k = k;
    f->cap = cap;
    f->ring = ring;
    memcpy(f->prior, prior, k * sizeof *prior);
    memcpy(f->scale, scale, k * sizeof *scale);
    f->strength = strength > 0 ? strength : 0;
    return 0;
}

void dx_rfit_add(dx_rfit *f, const double *x, double y)
{
    if (!isfinite(y)) return;
    double *s = f->ring + f->next * (f->k + 1);
    memcpy(s, x, f->k * sizeof *x);
    s[f->k] = y;
    f->next = (f->next + 1) % f->cap;
    if (f->n < f->cap) f->n++;
    f->total++;
}

double dx_rfit_eval(size_t k, const double *theta, const double *x)
{
    double y = 0;
    for (size_t j = 0; j < k; j++) y += theta[j] * x[j];
    return y;
}

/* The unit feature j is measured in: its scale (1 when it has none), so
 * the normal equations are solved on features of comparable size. */
static double unit_of(const dx_rfit *f, size_t j)
{
    return f->scale[j] > 0 ? f->scale[j] : 1.0;
}

/* Solves A z = b (n×n, symmetric positive definite, row-major) by
 * Cholesky in place; 0, or DX_ERANGE when A is not positive definite. */
static int chol_solve(double *A, double *b, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        for (size_t j = 0; j <= i; j++) {
            double s = A[i * n + j];
            for (size_t p = 0; p < j; p++) s -= A[i * n + p] * A[j * n + p];
            if (i == j) {
                if (!(s > 0)) return dx_errf(DX_ERANGE, "dx_rfit: singular normal equations");
                A[i * n + i] = sqrt(s);
            } else {
                A[i * n + j] = s / A[j * n + j];
            }
        }
    }
    for (size_t i = 0; i < n; i++) { /* L y = b */
        double s = b[i];
        for (size_t p = 0; p < i; p++) s -= A[i * n + p] * b[p];
        b[i] = s / A[i * n + i];
    }
    for (size_t i = n; i-- > 0;) { /* Lᵀ z = y */
        double s = b[i];
        for (size_t p = i + 1; p < n; p++) s -= A[p * n + i] * b[p];
        b[i] = s / A[i * n + i];
    }
    return 0;
}

/* The size of a prediction at the features' scales, by the prior: the
 * unit the pull toward a zero prior is measured in. */
static double prior_size(const dx_rfit *f)
{
    double y = 0;
    for (size_t j = 0; j < f->k; j++)
        if (f->scale[j] > 0) y += fabs(f->prior[j]) * f->scale[j];
    return y > 0 ? y : 1.0;
}

/* The prior's weight on coefficient j, in the solver's units (θ·unit):
 * the coefficient's distance from its prior relative to the prior, so a
 * prior that is too high (a slow machine assumed) weighs little against
 * the data and one too low (a fast one) weighs more; a zero prior is
 * measured against the prediction's size instead. */
static double prior_weight(const dx_rfit *f, size_t j)
{
    if (!(f->scale[j] > 0)) return 0;
    double u = unit_of(f, j), p = fabs(f->prior[j]) * u;
    if (p > 0) return f->strength / (p * p);
    double y = prior_size(f);
    return f->strength / (y * y);
}

/* One weighted ridge fit over the features not pinned (pinned ones are 0):
 * minimises Σ w_i ((y_i − x_i·θ) / y_i)² + strength Σ_j ((θ_j − prior_j) /
 * prior_j)² in the features' units (prior_weight).  Errors are
 * relative because timing noise is: a step ten times longer varies ten
 * times more, and the short steps are the ones that tell a fixed cost.
 * theta is left alone where the system is singular (no samples and no
 * prior weight). */
static void fit_once(const dx_rfit *f, const double *w, const int *pinned, double *theta)
{
    size_t k = f->k, idx[DX_RFIT_MAX_K], m = 0;
    for (size_t j = 0; j < k; j++)
        if (!pinned[j]) idx[m++] = j;
    double A[DX_RFIT_MAX_K * DX_RFIT_MAX_K] = {0}, b[DX_RFIT_MAX_K] = {0};
    for (size_t i = 0; i < f->n; i++) {
        const double *s = f->ring + i * (k + 1);
        if (!(s[k] > 0)) continue;
        double wi = w[i] / (s[k] * s[k]);
        for (size_t a = 0; a < m; a++) {
            double xa = s[idx[a]] / unit_of(f, idx[a]);
            b[a] += wi * xa * s[k];
            for (size_t c = 0; c <= a; c++)
                A[a * m + c] += wi * xa * s[idx[c]] / unit_of(f, idx[c]);
        }
    }
    for (size_t a = 0; a < m; a++) {
        size_t j = idx[a];
        double lam = prior_weight(f, j);
        A[a * m + a] += lam + 1e-12 * (A[a * m + a] + 1e-12);
        b[a] += lam * f->prior[j] * unit_of(f, j);
        for (size_t c = 0; c < a; c++) A[c * m + a] = A[a * m + c];
    }
    if (m && chol_solve(A, b, m) == 0)
        for (size_t a = 0; a < m; a++) theta[idx[a]] = b[a] / unit_of(f, idx[a]);
    for (size_t j = 0; j < k; j++)
        if (pinned[j]) theta[j] = 0;
}

/* The fit with every coefficient ≥ 0: a negative one is pinned at 0 and
 * the others fitted again (at most k rounds). */
static void fit_nonneg(const dx_rfit *f, const double *w, double *theta)
{
    int pinned[DX_RFIT_MAX_K] = {0};
    for (size_t round = 0; round <= f->k; round++) {
        fit_once(f, w, pinned, theta);
        int again = 0;
        for (size_t j = 0; j < f->k; j++)
            if (!pinned[j] && theta[j] < 0) pinned[j] = again = 1;
        if (!again) return;
    }
}

/* The median of v[0..n) (reordered), by quickselect (Lomuto, middle pivot). */
static double median(double *v, size_t n)
{
    size_t lo = 0, hi = n - 1, want = n / 2;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2, st = lo;
        double t = v[mid], p = t;
        v[mid] = v[hi];
        v[hi] = t;
        for (size_t i = lo; i < hi; i++)
            if (v[i] < p) {
                t = v[i];
                v[i] = v[st];
                v[st++] = t;
            }
        v[hi] = v[st];
        v[st] = p;
        if (st == want) return p;
        if (want < st)
            hi = st - 1;
        else
            lo = st + 1;
    }
    return v[want];
}

void dx_rfit_solve(const dx_rfit *f, double *theta)
{
    size_t k = f->k, n = f->n;
    memcpy(theta, f->prior, k * sizeof *theta);
    double w[MAX_CAP] = {0}, r[MAX_CAP], res[MAX_CAP], sigma = 0;
    for (size_t i = 0; i < n; i++) w[i] = 1;
    fit_nonneg(f, w, theta);
    for (int it = 0; it < HUBER_ITERS + TUKEY_ITERS && n >= 3; it++) {
        double sum_w = 0;
        for (size_t i = 0; i < n; i++) { /* relative residuals, as the fit counts them */
            const double *s = f->ring + i * (k + 1);
            r[i] = s[k] > 0 ? fabs(s[k] - dx_rfit_eval(k, theta, s)) / s[k] : 0;
        }
        if (it < HUBER_ITERS) { /* the bisquare keeps the last Huber scale */
            memcpy(res, r, n * sizeof *r);
            /* a floor of 1%: timings are never more exact than that, and
             * samples the fit meets exactly must not make every other one
             * an outlier */
            sigma = 1.4826 * median(res, n);
            if (sigma < 0.01) sigma = 0.01;
        }
        for (size_t i = 0; i < n; i++) {
            double u = r[i] / (TUKEY_C * sigma);
            if (it < HUBER_ITERS)
                w[i] = r[i] <= HUBER_C * sigma ? 1.0 : HUBER_C * sigma / r[i];
            else
                w[i] = u < 1 ? (1 - u * u) * (1 - u * u) : 0;
            sum_w += w[i];
        }
        /* a bisquare that would drop half the samples has lost the data,
         * not found its outliers: keep the Huber fit */
        if (it >= HUBER_ITERS && sum_w < (double)n / 2) break;
        fit_nonneg(f, w, theta);
    }
}
