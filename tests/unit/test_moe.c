/* Expert routing (moe_route) against a plain reference — softmax over all
 * logits, a full sort by (probability descending, index ascending), the
 * first k, normalised — on random logits, on logits with many ties (a few
 * distinct values; all equal; -inf), with k from 1 to n_expert, with and
 * without normalisation; and inputs with NaN still giving k distinct ids in
 * range.  The forward pass's MoE (grouping, invariance) is test_fwd's. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_err.h"
#include "engine/moe.h"

/* ---- the reference ---- */

static const float *g_p;

static int by_prob(const void *a, const void *b)
{
    int32_t i = *(const int32_t *)a, j = *(const int32_t *)b;
    if (g_p[i] != g_p[j]) return g_p[i] > g_p[j] ? -1 : 1;
    return i < j ? -1 : i > j;
}

static void ref_route(const float *l, uint32_t n, uint32_t k, int norm, int32_t *ids, float *w)
{
    float p[MODEL_MAX_EXPERTS], mx = -INFINITY;
    int32_t order[MODEL_MAX_EXPERTS];
    for (uint32_t i = 0; i < n; i++) mx = l[i] > mx ? l[i] : mx;
    double sum = 0;
    for (uint32_t i = 0; i < n; i++) sum += p[i] = expf(l[i] - mx);
    for (uint32_t i = 0; i < n; i++) p[i] *= (float)(1.0 / sum);
    for (uint32_t i = 0; i < n; i++) order[i] = (int32_t)i;
    g_p = p;
    qsort(order, n, sizeof *order, by_prob);
    double s = 0;
    for (uint32_t j = 0; j < k; j++) {
        ids[j] = order[j];
        s += w[j] = p[order[j]];
    }
    float fs = (float)s < 6.103515625e-5f ? 6.103515625e-5f : (float)s;
    if (norm)
        for (uint32_t j = 0; j < k; j++) w[j] /= fs;
}

static uint64_t g_rng = 88172645463325252ull;

static double unit(void)
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}

/* Compares moe_route with the reference on l for every k in ks. */
static void check(const float *l, uint32_t n, const char *what)
{
    const uint32_t ks[] = {1, 2, 8, n / 2, n};
    for (size_t ki = 0; ki < DX_ARRAY_LEN(ks); ki++) {
        uint32_t k = ks[ki];
        if (k < 1 || k > n || k > MODEL_MAX_EXPERTS_USED) continue;
        for (int norm = 0; norm < 2; norm++) {
            int32_t ids[MODEL_MAX_EXPERTS_USED], rids[MODEL_MAX_EXPERTS_USED];
            float w[MODEL_MAX_EXPERTS_USED], rw[MODEL_MAX_EXPERTS_USED];
            moe_route(l, n, k, norm, ids, w);
            ref_route(l, n, k, norm, rids, rw);
            for (uint32_t j = 0; j < k; j++) {
                if (ids[j] != rids[j])
                    fail_msg("%s, n %u, k %u: slot %u is expert %d, want %d", what, n, k, j, ids[j],
                             rids[j]);
                if (memcmp(&w[j], &rw[j], sizeof w[j]))
                    fail_msg("%s, n %u, k %u: weight %u is %.9g, want %.9g", what, n, k, j, w[j],
                             rw[j]);
            }
            if (norm) {
                double s = 0;
                for (uint32_t j = 0; j < k; j++) s += w[j];
                if (fabs(s - 1) > 1e-5)
                    fail_msg("%s, n %u, k %u: weights sum to %g", what, n, k, s);
            }
        }
    }
}

static void test_random_logits(void **state)
{
    (void)state;
    const uint32_t ns[] = {8, 60, 128, 512};
    float l[MODEL_MAX_EXPERTS];
    for (size_t ni = 0; ni < DX_ARRAY_LEN(ns); ni++)
        for (int rep = 0; rep < 200; rep++) {
            double scale = rep % 3 == 0 ? 0.1 : rep % 3 == 1 ? 3 : 40;
            for (uint32_t i = 0; i < ns[ni]; i++) l[i] = (float)((unit() * 2 - 1) * scale);
            check(l, ns[ni], "random");
        }
}

/* Ties: the lower index first, in the selection and in the slot order. */
static void test_ties(void **state)
{
    (void)state;
    float l[MODEL_MAX_EXPERTS];
    const uint32_t ns[] = {8, 128};
    for (size_t ni = 0; ni < DX_ARRAY_LEN(ns); ni++) {
        uint32_t n = ns[ni];
        for (int rep = 0; rep < 300; rep++) { /* two to four distinct values */
            int levels = 2 + rep % 3;
            for (uint32_t i = 0; i < n; i++) l[i] = (float)((int)(unit() * levels)) * 0.5f;
            check(l, n, "few values");
        }
        for (uint32_t i = 0; i < n; i++) l[i] = 1.25f;
        check(l, n, "all equal");
        int32_t ids[8];
        float w[8];
        moe_route(l, n, 8, 1, ids, w);
        for (int j = 0; j < 8; j++) {
            assert_int_equal(ids[j], j); /* all equal: experts 0..7, in order */
            assert_true(w[j] == 0.125f);
        }
        for (uint32_t i = 0; i < n; i++) l[i] = i % 3 ? -INFINITY : (float)(i % 5);
        check(l, n, "with -inf");
    }
    /* probabilities that round to the same float tie too */
    float near[8] = {1.0f, 1.0f + 1e-8f, 0, 0, 0, 0, 0, 1.0f};
    check(near, 8, "equal after rounding");
}

/* NaN (a broken router): still k distinct experts in range, never a crash. */
static void test_nan_inputs(void **state)
{
    (void)state;
    float l[16];
    for (int c = 0; c < 3; c++) {
        for (int i = 0; i < 16; i++) l[i] = (float)i;
        if (c == 0) l[3] = NAN;
        if (c == 1)
            for (int i = 0; i < 16; i++) l[i] = NAN;
        if (c == 2) l[0] = INFINITY;
        int32_t ids[8];
        float w[8];
        moe_route(l, 16, 8, 1, ids, w);
        for (int j = 0; j < 8; j++) {
            assert_true(ids[j] >= 0 && ids[j] < 16);
            for (int i = 0; i < j; i++) assert_int_not_equal(ids[i], ids[j]);
        }
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_random_logits),
        cmocka_unit_test(test_ties),
        cmocka_unit_test(test_nan_inputs),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
