/* Unit tests for src/base/dx_est: the robust mean (the prior replaced by
 * the first sample, one wild sample only nudging it, a real change of level
 * followed) and the robust fit (the prior with no samples, exact data
 * recovered, outliers ignored, collinear features held at their priors, no
 * negative coefficient, the ring keeping only the last samples). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "base/dx_err.h"
#include "base/dx_est.h"

static void assert_near(double got, double want, double rel)
{
    if (fabs(got - want) > rel * fabs(want) + 1e-12)
        fail_msg("%.6g is not within %.0f%% of %.6g", got, rel * 100, want);
}

static void test_rewma(void **state)
{
    (void)state;
    dx_rewma e;
    dx_rewma_init(&e, 1.0, 0.5);
    assert_near(e.mean, 1.0, 0);
    dx_rewma_add(&e, 10.0, 0.2); /* the first sample replaces the prior */
    assert_near(e.mean, 10.0, 1e-9);
    for (int i = 0; i < 20; i++) dx_rewma_add(&e, 10.0 + (i % 2 ? 0.5 : -0.5), 0.2);
    assert_near(e.mean, 10.0, 0.05);
    dx_rewma_add(&e, 1000.0, 0.2); /* one wild sample: a nudge */
    assert_true(e.mean < 12.0);
    for (int i = 0; i < 60; i++) dx_rewma_add(&e, 20.0, 0.2); /* a new level: followed */
    assert_near(e.mean, 20.0, 0.02);
    dx_rewma_add(&e, NAN, 0.2); /* not a number: ignored */
    assert_near(e.mean, 20.0, 0.02);
}

/* y = 2 + 3 x1 + 0.5 x2, exactly. */
static void test_fit_exact_and_prior(void **state)
{
    (void)state;
    double ring[32 * 4], th[3];
    const double prior[] = {1, 1, 1}, scale[] = {1, 3, 25};
    dx_rfit f;
    assert_int_equal(dx_rfit_init(&f, 3, 32, ring, prior, scale, 0.001), 0);
    dx_rfit_solve(&f, th); /* nothing yet: the prior */
    for (int j = 0; j < 3; j++) assert_near(th[j], 1, 0);
    for (int i = 0; i < 40; i++) {
        double x[] = {1, (double)(i % 7), (double)((i * 13) % 50)};
        dx_rfit_add(&f, x, 2 + 3 * x[1] + 0.5 * x[2]);
    }
    assert_int_equal(f.n, 32);
    assert_int_equal(f.total, 40);
    dx_rfit_solve(&f, th);
    assert_near(th[0], 2, 0.05);
    assert_near(th[1], 3, 0.02);
    assert_near(th[2], 0.5, 0.02);
    double x[] = {1, 4, 20};
    assert_near(dx_rfit_eval(3, th, x), 2 + 12 + 10, 0.01);
    assert_int_equal(dx_rfit_init(&f, 0, 32, ring, prior, scale, 1), DX_EINVAL);
}

/* A fifth of the samples ten times too slow (another process had the
 * cores): the fit follows the rest. */
static void test_fit_outliers(void **state)
{
    (void)state;
    double ring[64 * 3], th[2];
    const double prior[] = {0, 0}, scale[] = {1, 100};
    dx_rfit f;
    dx_rfit_init(&f, 2, 64, ring, prior, scale, 0.001);
    for (int i = 0; i < 64; i++) {
        double x[] = {1, (double)(10 + (i * 37) % 200)};
        double y = 1.0 + 0.2 * x[1];
        dx_rfit_add(&f, x, i % 5 == 0 ? 10 * y : y);
    }
    dx_rfit_solve(&f, th);
    assert_near(th[0], 1.0, 0.2);
    assert_near(th[1], 0.2, 0.05);
}

/* Every sample has the same feature values for x2 = 0 (a prefill node
 * that never decodes): that coefficient keeps its prior; and a
 * coefficient the data would make negative is 0. */
static void test_fit_unexcited_and_nonneg(void **state)
{
    (void)state;
    double ring[16 * 4], th[3];
    const double prior[] = {0.5, 1, 7}, scale[] = {1, 10, 10};
    dx_rfit f;
    dx_rfit_init(&f, 3, 16, ring, prior, scale, 0.001);
    for (int i = 0; i < 16; i++) {
        double x[] = {1, (double)(1 + i), 0};
        dx_rfit_add(&f, x, 3.0 * x[1]); /* intercept 0, below its prior */
    }
    dx_rfit_solve(&f, th);
    assert_near(th[2], 7, 1e-6);
    assert_near(th[1], 3, 0.05);
    assert_true(th[0] >= 0 && th[0] < 0.5);
    /* data that wants a negative intercept gets 0 */
    dx_rfit_init(&f, 3, 16, ring, prior, scale, 0.001);
    for (int i = 0; i < 16; i++) {
        double x[] = {1, (double)(1 + i), 0};
        dx_rfit_add(&f, x, 3.0 * x[1] - 2);
    }
    dx_rfit_solve(&f, th);
    assert_true(th[0] == 0);
    assert_true(th[1] > 2.5 && th[1] < 3.0);
}

/* The ring keeps the last cap samples: a change of cost is learnt within
 * cap samples and nothing older counts. */
static void test_fit_ring_forgets(void **state)
{
    (void)state;
    double ring[8 * 3], th[2];
    const double prior[] = {0, 1}, scale[] = {1, 1};
    dx_rfit f;
    dx_rfit_init(&f, 2, 8, ring, prior, scale, 0.001);
    for (int i = 0; i < 20; i++) {
        double x[] = {1, (double)(i % 4 + 1)};
        dx_rfit_add(&f, x, (i < 12 ? 1.0 : 5.0) * x[1]);
    }
    dx_rfit_solve(&f, th);
    assert_near(th[1], 5.0, 0.05);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_rewma),
        cmocka_unit_test(test_fit_exact_and_prior),
        cmocka_unit_test(test_fit_outliers),
        cmocka_unit_test(test_fit_unexcited_and_nonneg),
        cmocka_unit_test(test_fit_ring_forgets),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
