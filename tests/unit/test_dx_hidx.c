/* test_dx_hidx: the open-addressing hash index against a plain model —
 * random insert/remove churn with good hashes, with hashes that share their
 * low bits (one long run) and with identical hashes, growth from the
 * smallest table, iteration, and out-of-memory on growth. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_hidx.h"

static uint64_t rng_next(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Value v's hash under each scheme: uniform, equal low 20 bits (so every
 * home slot is 0 until the table passes 2^20 slots), or all identical. */
enum { H_GOOD, H_LOWCOLLIDE, H_SAME };

static uint64_t hash_of(int scheme, uint64_t v)
{
    uint64_t s = v;
    uint64_t h = rng_next(&s);
    if (scheme == H_LOWCOLLIDE) return h << 20;
    if (scheme == H_SAME) return 42;
    return h;
}

/* How many times v turns up among h's candidates; every candidate must have
 * been stored under h (scheme < 0: not checked). */
static int found_s(const dx_hidx *ix, int scheme, uint64_t h, uint64_t v)
{
    dx_hidx_iter it;
    uint64_t got;
    int k = 0;
    for (dx_hidx_find(ix, h, &it); dx_hidx_next(ix, &it, &got);) {
        if (scheme >= 0) assert_true(hash_of(scheme, got) == h);
        k += got == v;
    }
    return k;
}

static int found(const dx_hidx *ix, uint64_t h, uint64_t v)
{
    return found_s(ix, -1, h, v);
}

static void churn(int scheme, size_t n_vals, size_t n_ops)
{
    dx_hidx *ix;
    assert_int_equal(dx_hidx_create(0, &ix), 0);
    uint8_t *in = dx_calloc(n_vals, 1);
    size_t live = 0;
    uint64_t s = 7;
    for (size_t op = 0; op < n_ops; op++) {
        uint64_t v = rng_next(&s) % n_vals, h = hash_of(scheme, v);
        /* bias towards inserting for the first half so the table grows */
        int want_in = op < n_ops / 2 ? (rng_next(&s) % 4 != 0) : (rng_next(&s) % 2);
        if (want_in && !in[v]) {
            assert_int_equal(dx_hidx_insert(ix, h, v), 0);
            in[v] = 1;
            live++;
        } else if (!want_in) {
            assert_int_equal(dx_hidx_remove(ix, h, v), in[v] ? 0 : DX_ENOENT);
            live -= in[v];
            in[v] = 0;
        }
        assert_int_equal(found_s(ix, scheme, h, v), in[v]);
        assert_int_equal(dx_hidx_count(ix), live);
    }
    assert_int_equal(dx_hidx_check(ix), 0);
    for (uint64_t v = 0; v < n_vals; v++)
        assert_int_equal(found_s(ix, scheme, hash_of(scheme, v), v), in[v]);
    /* iteration yields each live value once */
    uint8_t *seen = dx_calloc(n_vals, 1);
    size_t cur = 0, k = 0;
    uint64_t v;
    while (dx_hidx_each(ix, &cur, &v)) {
        assert_true(v < n_vals && in[v] && !seen[v]);
        seen[v] = 1;
        k++;
    }
    assert_int_equal(k, live);
    /* drain in random order */
    for (uint64_t i = 0; i < n_vals; i++) {
        uint64_t w = (i * 7919 + 13) % n_vals; /* 7919 is prime, coprime to n_vals */
        if (in[w]) assert_int_equal(dx_hidx_remove(ix, hash_of(scheme, w), w), 0);
        in[w] = 0;
    }
    assert_int_equal(dx_hidx_count(ix), 0);
    assert_int_equal(dx_hidx_check(ix), 0);
    dx_free(seen);
    dx_free(in);
    dx_hidx_destroy(ix);
}

static void test_churn_good_hash(void **state)
{
    (void)state;
    churn(H_GOOD, 20000, 100000);
}

static void test_churn_low_bits_collide(void **state)
{
    (void)state;
    churn(H_LOWCOLLIDE, 1500, 6000);
}

static void test_churn_same_hash(void **state)
{
    (void)state;
    churn(H_SAME, 700, 3000);
}

static void test_same_hash_distinct_values(void **state)
{
    (void)state;
    dx_hidx *ix;
    assert_int_equal(dx_hidx_create(4, &ix), 0);
    for (uint64_t v = 0; v < 10; v++) assert_int_equal(dx_hidx_insert(ix, 5, v), 0);
    assert_int_equal(dx_hidx_insert(ix, 6, 100), 0);
    /* h=5 yields exactly its ten values; h=6 its one; h=7 nothing */
    dx_hidx_iter it;
    uint64_t v, mask = 0;
    int k = 0;
    for (dx_hidx_find(ix, 5, &it); dx_hidx_next(ix, &it, &v); k++) mask |= 1ull << v;
    assert_int_equal(k, 10);
    assert_int_equal(mask, 0x3ff);
    assert_int_equal(found(ix, 6, 100), 1);
    dx_hidx_find(ix, 7, &it);
    assert_int_equal(dx_hidx_next(ix, &it, &v), 0);
    /* the wrong hash does not remove a value */
    assert_int_equal(dx_hidx_remove(ix, 6, 3), DX_ENOENT);
    assert_int_equal(dx_hidx_remove(ix, 5, 3), 0);
    assert_int_equal(found(ix, 5, 3), 0);
    assert_int_equal(found(ix, 6, 100), 1);
    assert_int_equal(dx_hidx_check(ix), 0);
    dx_hidx_destroy(ix);
    dx_hidx_destroy(NULL);
}

static void test_grow_out_of_memory(void **state)
{
    (void)state;
    dx_hidx *ix;
    assert_int_equal(dx_hidx_create(0, &ix), 0);
    uint64_t v = 0;
    for (; v < 8; v++) assert_int_equal(dx_hidx_insert(ix, hash_of(H_GOOD, v), v), 0);
    /* the 9th needs 32 slots: make that allocation fail */
    dx_alloc_fail_after(1, 0);
    assert_int_equal(dx_hidx_insert(ix, hash_of(H_GOOD, v), v), DX_ENOMEM);
    dx_alloc_fail_after(0, 0);
    assert_int_equal(dx_hidx_count(ix), 8);
    assert_int_equal(found(ix, hash_of(H_GOOD, v), v), 0);
    for (uint64_t w = 0; w < 8; w++) assert_int_equal(found(ix, hash_of(H_GOOD, w), w), 1);
    assert_int_equal(dx_hidx_insert(ix, hash_of(H_GOOD, v), v), 0);
    assert_int_equal(dx_hidx_check(ix), 0);
    dx_hidx_destroy(ix);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_churn_good_hash),    cmocka_unit_test(test_churn_low_bits_collide),
        cmocka_unit_test(test_churn_same_hash),    cmocka_unit_test(test_same_hash_distinct_values),
        cmocka_unit_test(test_grow_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
