/* test_router_state: the router's conversation map — stores and replaces,
 * TTL (an expired entry is never returned), LRU eviction by the entry bound
 * and by the params-bytes bound, the expiry sweep, and random churn against
 * a plain model with the structural check after every step; out of memory
 * leaves the map consistent.  Time is injected: no clock, no sleeps. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_rng.h"
#include "router/router_state.h"

static router_key key(uint64_t i)
{
    uint64_t s = i;
    router_key k = {dx_splitmix64(&s), dx_splitmix64(&s)};
    return k;
}

static router_state *make(size_t max_entries, size_t max_bytes)
{
    router_state_config c = {.max_entries = max_entries, .max_bytes = max_bytes};
    router_state *st;
    assert_int_equal(router_state_create(&c, &st), 0);
    return st;
}

static void put(router_state *st, uint64_t i, int node, const char *params, double expiry,
                double now)
{
    router_key k = key(i);
    assert_int_equal(router_state_put(st, &k, node, params, params ? strlen(params) : 0,
                                      7 * (uint32_t)i, expiry, now),
                     0);
    assert_int_equal(router_state_check(st), 0);
}

static int has(router_state *st, uint64_t i, double now, router_entry *e)
{
    router_key k = key(i);
    router_entry tmp;
    int r = router_state_get(st, &k, now, e ? e : &tmp);
    assert_int_equal(router_state_check(st), 0);
    return r;
}

static void test_put_get_replace(void **state)
{
    (void)state;
    router_state *st = make(10, 1000);
    router_entry e;
    assert_int_equal(has(st, 1, 0, &e), 0);
    put(st, 1, 3, "{\"a\":1}", 100, 0);
    assert_int_equal(has(st, 1, 1, &e), 1);
    assert_int_equal(e.node, 3);
    assert_string_equal(e.params, "{\"a\":1}");
    assert_int_equal(e.params_len, 7);
    assert_int_equal(e.num_tokens, 7);
    assert_true(e.last_use == 1);
    /* replace: new node, no params (num_tokens goes with the params) */
    put(st, 1, 4, NULL, 100, 2);
    assert_int_equal(has(st, 1, 3, &e), 1);
    assert_int_equal(e.node, 4);
    assert_null(e.params);
    assert_int_equal(e.num_tokens, 0);
    assert_int_equal(router_state_count(st), 1);
    assert_int_equal(router_state_bytes(st), 0);
    /* a colliding low half is a different key */
    router_key k1 = key(1), k2 = {k1.lo, k1.hi ^ 1};
    assert_int_equal(router_state_get(st, &k2, 3, &e), 0);
    assert_int_equal(router_state_put(st, &k2, 9, "x", 1, 0, 100, 3), 0);
    assert_int_equal(router_state_get(st, &k1, 3, &e), 1);
    assert_int_equal(e.node, 4);
    assert_int_equal(router_state_get(st, &k2, 3, &e), 1);
    assert_int_equal(e.node, 9);
    assert_int_equal(router_state_del(st, &k2), 0);
    assert_int_equal(router_state_del(st, &k2), DX_ENOENT);
    assert_int_equal(router_state_check(st), 0);
    router_state_destroy(st);
    router_state_destroy(NULL);
}

static void test_ttl(void **state)
{
    (void)state;
    router_state *st = make(10, 1000);
    put(st, 1, 0, "p", 10, 0);
    assert_int_equal(has(st, 1, 9.999, NULL), 1);
    /* expired at exactly its expiry: never returned, and removed */
    assert_int_equal(has(st, 1, 10, NULL), 0);
    assert_int_equal(router_state_count(st), 0);
    assert_int_equal(router_state_bytes(st), 0);
    router_state_destroy(st);
}

static void test_lru_entries(void **state)
{
    (void)state;
    router_state *st = make(3, 1000);
    put(st, 1, 0, NULL, 100, 0);
    put(st, 2, 0, NULL, 100, 1);
    put(st, 3, 0, NULL, 100, 2);
    assert_int_equal(has(st, 1, 3, NULL), 1); /* 1 becomes the most recent: 2 is oldest */
    put(st, 4, 0, NULL, 100, 4);
    assert_int_equal(router_state_count(st), 3);
    assert_int_equal(router_state_evictions(st), 1);
    assert_int_equal(has(st, 2, 5, NULL), 0);
    assert_int_equal(has(st, 1, 5, NULL), 1);
    assert_int_equal(has(st, 3, 5, NULL), 1);
    assert_int_equal(has(st, 4, 5, NULL), 1);
    /* replacing an entry does not evict */
    put(st, 3, 1, NULL, 100, 6);
    assert_int_equal(router_state_evictions(st), 1);
    router_state_destroy(st);
}

static void test_lru_bytes(void **state)
{
    (void)state;
    router_state *st = make(100, 25);
    put(st, 1, 0, "0123456789", 100, 0); /* 10 */
    put(st, 2, 0, "0123456789", 100, 1); /* 20 */
    put(st, 3, 0, "0123456789", 100, 2); /* 30 > 25: 1 goes */
    assert_int_equal(router_state_bytes(st), 20);
    assert_int_equal(has(st, 1, 3, NULL), 0);
    /* growing an entry's params evicts others, never the entry itself */
    put(st, 3, 0, "01234567890123456789", 100, 4); /* 3 alone: 20 + 2's 10 > 25 */
    assert_int_equal(has(st, 3, 5, NULL), 1);
    assert_int_equal(has(st, 2, 5, NULL), 0);
    /* params alone over the bound: kept for affinity, without params */
    router_entry e;
    put(st, 4, 5, "0123456789012345678901234567890", 100, 6);
    assert_int_equal(has(st, 4, 7, &e), 1);
    assert_null(e.params);
    assert_int_equal(e.node, 5);
    assert_true(router_state_bytes(st) <= 25);
    router_state_destroy(st);
}

static void test_expire_sweep(void **state)
{
    (void)state;
    router_state *st = make(100, 1000);
    put(st, 1, 0, "a", 5, 0); /* LRU tail */
    put(st, 2, 0, "b", 6, 1);
    put(st, 3, 0, "c", 100, 2);
    put(st, 4, 0, "d", 3, 3); /* short-lived, but most recent: outlives the sweep */
    assert_int_equal(router_state_expire(st, 10, 1), 1);   /* visit bound */
    assert_int_equal(router_state_expire(st, 10, 100), 1); /* stops at 3, which is live */
    assert_int_equal(router_state_count(st), 2);
    assert_int_equal(router_state_check(st), 0);
    assert_int_equal(has(st, 4, 10, NULL), 0); /* ... yet is never returned */
    assert_int_equal(has(st, 3, 10, NULL), 1);
    assert_int_equal(router_state_count(st), 1);
    router_state_destroy(st);
}

/* Random puts, gets, deletes and sweeps against a plain array. */
static void test_churn_model(void **state)
{
    (void)state;
    enum { N = 64, MAXE = 40 };
    router_state *st = make(MAXE, 1u << 20);
    struct {
        int live, node;
        double expiry;
    } m[N] = {{0}};
    dx_rng rng;
    dx_rng_seed(&rng, 7);
    double now = 0;
    for (int step = 0; step < 20000; step++) {
        uint64_t i = dx_rng_next(&rng) % N;
        int op = (int)(dx_rng_next(&rng) % 10);
        now += 0.01;
        router_key k = key(i);
        router_entry e;
        if (op < 4) {
            double exp = now + (double)(dx_rng_next(&rng) % 100) * 0.01;
            char p[32];
            snprintf(p, sizeof p, "{\"i\":%d}", (int)i);
            assert_int_equal(router_state_put(st, &k, (int)i % 5, p, strlen(p), 1, exp, now), 0);
            m[i].live = 1;
            m[i].node = (int)i % 5;
            m[i].expiry = exp;
        } else if (op < 8) {
            int got = router_state_get(st, &k, now, &e);
            if (got) {
                assert_true(m[i].live && m[i].expiry > now); /* never a stale or unknown one */
                assert_int_equal(e.node, m[i].node);
            } else if (m[i].live && m[i].expiry > now) {
                m[i].live = 0; /* evicted by the bound: allowed */
            }
            if (!got) m[i].live = 0;
        } else if (op < 9) {
            router_state_del(st, &k);
            m[i].live = 0;
        } else {
            router_state_expire(st, now, 8);
        }
        assert_true(router_state_count(st) <= MAXE);
        if (step % 64 == 0) assert_int_equal(router_state_check(st), 0);
    }
    assert_int_equal(router_state_check(st), 0);
    router_state_destroy(st);
}

static void test_oom(void **state)
{
    (void)state;
    router_state *st = make(1000, 1u << 20);
    int failures = 0;
    for (uint64_t i = 0; i < 300; i++) {
        router_key k = key(i);
        dx_alloc_fail_after(1 + (long)(i % 3), 0);
        int rc = router_state_put(st, &k, 0, "{}", 2, 0, 100, 0);
        dx_alloc_fail_after(0, 0);
        if (rc) {
            assert_int_equal(rc, DX_ENOMEM);
            failures++;
        }
        assert_int_equal(router_state_check(st), 0);
    }
    assert_true(failures > 0);
    router_state_destroy(st);
    dx_alloc_fail_after(1, 0);
    router_state_config c = {0};
    router_state *none;
    assert_int_equal(router_state_create(&c, &none), DX_ENOMEM);
    dx_alloc_fail_after(0, 0);
}

int main(void)
{
    size_t live = dx_alloc_live_bytes();
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_replace),
        cmocka_unit_test(test_ttl),
        cmocka_unit_test(test_lru_entries),
        cmocka_unit_test(test_lru_bytes),
        cmocka_unit_test(test_expire_sweep),
        cmocka_unit_test(test_churn_model),
        cmocka_unit_test(test_oom),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    if (dx_alloc_live_bytes() != live) {
        fprintf(stderr, "leak: %zu bytes\n", dx_alloc_live_bytes() - live);
        return 1;
    }
    return rc;
}
