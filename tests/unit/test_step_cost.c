/* Unit tests for src/engine/step_cost: the prior from a model's shape
 * (slower than real machines, every term positive), the fit recovering a
 * step-time law from synthetic steps (the depth term included), the
 * inter-token latency apart for steps that prefill, and the arithmetic of a
 * prefill's cost and of the extra a reused prefix would cost to recompute. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>

#include "engine/step_cost.h"

static void assert_near(double got, double want, double rel)
{
    if (fabs(got - want) > rel * fabs(want) + 1e-15)
        fail_msg("%.6g is not within %.0f%% of %.6g", got, rel * 100, want);
}

static const model_hparams k_hp06 = {.n_vocab = 8192,
                                     .n_embd = 1024,
                                     .n_layer = 28,
                                     .n_head = 16,
                                     .n_kv_head = 8,
                                     .head_dim = 128,
                                     .n_ff = 3072};

static void test_prior(void **state)
{
    (void)state;
    step_cost_model p;
    step_cost_prior(&k_hp06, 2, &p);
    /* the 0.6b shape: ~0.44 GFLOP a token; 2 threads at 25 GFLOP/s each */
    assert_near(p.pre_tok_s,
                2.0 * 28 * (1024.0 * (2048 + 2048) + 2048.0 * 1024 + 3 * 1024.0 * 3072) / 50e9,
                1e-9);
    assert_true(p.pre_key_s > 0 && p.step_s > 0 && p.dec_tok_s > p.pre_tok_s);
    assert_int_equal(p.samples, 0);
}

/* Steps of a machine where t = 2 ms + 0.5 ms/token + 0.2 µs/key (prefill)
 * and 0.1 ms/decode: the fit finds them, and a prefill deep in a history
 * costs more than the same one near its start. */
static void test_fit(void **state)
{
    (void)state;
    step_cost_model p, m;
    step_cost_prior(&k_hp06, 2, &p);
    step_cost c;
    step_cost_init(&c, &p);
    for (int i = 0; i < 100; i++) {
        step_cost_sample s = {0};
        uint32_t chunk = (uint32_t)(16 + (i * 37) % 400), pos = (uint32_t)((i * 911) % 4000);
        if (i % 3) {
            s.n_pre = chunk;
            s.pre_keys = step_cost_keys(chunk, pos);
        }
        s.n_dec = (uint32_t)(i % 5);
        s.dec_keys = s.n_dec * 1000.0;
        s.seconds = 2e-3 + 0.5e-3 * s.n_pre + 0.2e-6 * s.pre_keys + 0.1e-3 * s.n_dec;
        if (i == 50) s.seconds *= 20; /* the machine was taken away once */
        step_cost_add(&c, &s);
    }
    step_cost_get(&c, &m);
    assert_int_equal(m.samples, 100 - 7); /* steps with no work (i % 15 == 0) are not steps */
    assert_near(m.step_s, 2e-3, 0.1);
    assert_near(m.pre_tok_s, 0.5e-3, 0.02);
    assert_near(m.pre_key_s, 0.2e-6, 0.05);
    double near = step_cost_prefill(&m, 100, 0, 512), deep = step_cost_prefill(&m, 100, 4000, 512);
    assert_true(deep > near);
    assert_near(deep - near, 0.2e-6 * 100 * 4000, 0.05);
    /* decode steps with and without prefill work are told apart */
    assert_true(m.itl_n[0] > 0 && m.itl_n[1] > 0);
    assert_true(m.itl_s[1] > m.itl_s[0]);
    uint64_t hist = 0;
    for (int b = 0; b <= STEP_COST_ITL_N; b++) hist += m.itl_hist[0][b] + m.itl_hist[1][b];
    assert_int_equal(hist, m.itl_n[0] + m.itl_n[1]);
    /* a copy is a learner of its own */
    step_cost d;
    step_cost_copy(&d, &c);
    assert_ptr_equal(d.fit[0].ring, d.ring[0]);
    assert_ptr_equal(d.fit[1].ring, d.ring[1]);
}

static void test_arithmetic(void **state)
{
    (void)state;
    step_cost_model m = {.step_s = 1, .pre_tok_s = 0.1, .pre_key_s = 0.001};
    assert_near(step_cost_keys(3, 10), 11 + 12 + 13, 0);
    assert_near(step_cost_prefill(&m, 0, 0, 512), 0, 0);
    /* 600 tokens in steps of 512: two steps */
    assert_near(step_cost_prefill(&m, 600, 0, 512), 2 + 60 + 0.001 * step_cost_keys(600, 0), 1e-12);
    /* 48 reused tokens before 100 new ones: no extra step */
    assert_near(step_cost_prefill_extra(&m, 48, 1000, 100, 512),
                4.8 + 0.001 * step_cost_keys(48, 1000), 1e-12);
    /* ... but 480 before 100 need a second step */
    assert_near(step_cost_prefill_extra(&m, 480, 0, 100, 512),
                1 + 48 + 0.001 * step_cost_keys(480, 0), 1e-12);
    assert_near(step_cost_decode(&m, 0, 0), 0, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_prior),
        cmocka_unit_test(test_fit),
        cmocka_unit_test(test_arithmetic),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
