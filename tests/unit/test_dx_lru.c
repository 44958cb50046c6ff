/* Unit tests for src/base/dx_lru: the bounded, expiring map — get/put/
 * replace/remove, the TTL from the last use, eviction least recently used
 * first by entries and by bytes, an entry over the byte bound, and no
 * allocation left behind (the allocator's count). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "base/dx_lru.h"

static int has(dx_lru *l, const char *k, double now, const char *want)
{
    const void *v;
    size_t n;
    if (!dx_lru_get(l, k, strlen(k), now, 0, &v, &n)) return 0;
    if (want) {
        assert_int_equal(n, strlen(want));
        assert_memory_equal(v, want, n);
    }
    return 1;
}

static void test_put_get_replace_remove(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    dx_lru *l;
    dx_lru_config c = {.ttl_s = 10};
    assert_int_equal(dx_lru_create(&c, &l), 0);
    assert_int_equal(dx_lru_put(l, "a", 1, "one", 3, 0), 0);
    assert_int_equal(dx_lru_put(l, "b", 1, "two", 3, 0), 0);
    assert_true(has(l, "a", 1, "one"));
    assert_true(has(l, "b", 1, "two"));
    assert_false(has(l, "c", 1, NULL));
    assert_int_equal(dx_lru_put(l, "a", 1, "uno!", 4, 1), 0); /* replaced */
    assert_true(has(l, "a", 2, "uno!"));
    /* keys are bytes: a NUL inside, a prefix, the empty key */
    assert_int_equal(dx_lru_put(l, "a\0x", 3, "nul", 3, 1), 0);
    assert_int_equal(dx_lru_put(l, "", 0, "empty", 5, 1), 0);
    const void *v;
    size_t n;
    assert_int_equal(dx_lru_get(l, "a\0x", 3, 2, 0, &v, &n), 1);
    assert_memory_equal(v, "nul", 3);
    assert_int_equal(dx_lru_get(l, "", 0, 2, 0, &v, &n), 1);
    assert_int_equal(n, 5);
    assert_int_equal(dx_lru_remove(l, "a", 1), 1);
    assert_int_equal(dx_lru_remove(l, "a", 1), 0);
    assert_false(has(l, "a", 2, NULL));
    dx_lru_stats st;
    dx_lru_get_stats(l, &st);
    assert_int_equal(st.entries, 3);
    assert_int_equal(st.puts, 5);
    dx_lru_destroy(l);
    assert_int_equal(dx_alloc_live_bytes(), live);
    dx_lru_config bad = {.ttl_s = 0};
    assert_int_equal(dx_lru_create(&bad, &l), DX_EINVAL);
}

static void test_ttl_from_last_use(void **state)
{
    (void)state;
    dx_lru *l;
    dx_lru_config c = {.ttl_s = 10};
    assert_int_equal(dx_lru_create(&c, &l), 0);
    assert_int_equal(dx_lru_put(l, "a", 1, "1", 1, 0), 0);
    assert_int_equal(dx_lru_put(l, "b", 1, "2", 1, 5), 0);
    /* a get that refreshes restarts a's TTL; b keeps its own */
    const void *v;
    size_t n;
    assert_int_equal(dx_lru_get(l, "a", 1, 9, 1, &v, &n), 1);
    assert_true(has(l, "b", 14.9, NULL));
    assert_false(has(l, "b", 15, NULL)); /* expired: gone */
    assert_true(has(l, "a", 18.9, NULL));
    assert_int_equal(dx_lru_expire(l, 19), 1);
    assert_false(has(l, "a", 19, NULL));
    dx_lru_stats st;
    dx_lru_get_stats(l, &st);
    assert_int_equal(st.entries, 0);
    assert_int_equal(st.expired, 2);
    dx_lru_destroy(l);
}

static void test_bounds_evict_least_recent(void **state)
{
    (void)state;
    dx_lru *l;
    dx_lru_config c = {.ttl_s = 100, .max_entries = 3};
    assert_int_equal(dx_lru_create(&c, &l), 0);
    char k[16];
    for (int i = 0; i < 3; i++) {
        snprintf(k, sizeof k, "k%d", i);
        assert_int_equal(dx_lru_put(l, k, 2, "v", 1, i), 0);
    }
    const void *v;
    size_t n;
    assert_int_equal(dx_lru_get(l, "k0", 2, 3, 1, &v, &n), 1); /* k0 used: k1 is the oldest */
    assert_int_equal(dx_lru_put(l, "k3", 2, "v", 1, 4), 0);
    assert_false(has(l, "k1", 4, NULL));
    assert_true(has(l, "k0", 4, NULL));
    assert_true(has(l, "k2", 4, NULL));
    assert_true(has(l, "k3", 4, NULL));
    dx_lru_destroy(l);
    /* by bytes: each entry costs its key, its value and a fixed overhead */
    dx_lru_config cb = {.ttl_s = 100, .max_bytes = 4096};
    assert_int_equal(dx_lru_create(&cb, &l), 0);
    static char big[1500];
    memset(big, 'x', sizeof big);
    for (int i = 0; i < 4; i++) {
        snprintf(k, sizeof k, "b%d", i);
        assert_int_equal(dx_lru_put(l, k, 2, big, sizeof big, i), 0);
    }
    dx_lru_stats st;
    dx_lru_get_stats(l, &st);
    assert_true(st.bytes <= 4096);
    assert_int_equal(st.entries, 2);
    assert_int_equal(st.evicted, 2);
    assert_false(has(l, "b0", 5, NULL));
    assert_true(has(l, "b3", 5, NULL));
    /* one entry over the bound alone: refused, and the old value is gone */
    static char huge[5000];
    assert_int_equal(dx_lru_put(l, "b3", 2, huge, sizeof huge, 6), DX_ETOOBIG);
    assert_false(has(l, "b3", 6, NULL));
    dx_lru_destroy(l);
}

/* Many keys through a small map: the index and the list stay in step. */
static void test_churn(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    dx_lru *l;
    dx_lru_config c = {.ttl_s = 50, .max_entries = 64};
    assert_int_equal(dx_lru_create(&c, &l), 0);
    char k[16];
    for (int i = 0; i < 5000; i++) {
        snprintf(k, sizeof k, "key%d", i % 300);
        if (i % 7 == 0)
            dx_lru_remove(l, k, strlen(k));
        else
            assert_int_equal(dx_lru_put(l, k, strlen(k), k, strlen(k), i * 0.01), 0);
        snprintf(k, sizeof k, "key%d", (i * 13) % 300);
        const void *v;
        size_t n;
        if (dx_lru_get(l, k, strlen(k), i * 0.01, i & 1, &v, &n)) {
            assert_int_equal(n, strlen(k));
            assert_memory_equal(v, k, n);
        }
    }
    dx_lru_stats st;
    dx_lru_get_stats(l, &st);
    assert_true(st.entries <= 64);
    dx_lru_destroy(l);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_put_get_replace_remove),
        cmocka_unit_test(test_ttl_from_last_use),
        cmocka_unit_test(test_bounds_evict_least_recent),
        cmocka_unit_test(test_churn),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
