/* test_xfer_lease: leases and pins against a real pool — token security,
 * expiry and sweep, hash-chain matching, single-use and renew policies, and
 * that pool pressure (eviction) cannot take a pinned block. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

#include <cmocka.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "xfer/xfer_lease.h"
#include "xfer/xfer_synth.h"

#define NB 16

typedef struct {
    kv_pool *pool;
    xfer_leases *L;
    int32_t ids[NB];
    kv_hash chain[NB];
} fx;

static int setup(void **state)
{
    fx *f = dx_calloc(1, sizeof *f);
    kv_pool_config cfg;
    uint8_t fp[16];
    assert_int_equal(xfer_synth_layout(256, NB, 1, &cfg, fp), 0);
    assert_int_equal(kv_pool_create(&cfg, &f->pool), 0);
    assert_int_equal(xfer_leases_create(f->pool, 30, &f->L), 0);
    /* 8 blocks computed and hashed (held by the test), 8 free */
    assert_int_equal(kv_pool_alloc_n(f->pool, 8, f->ids), 0);
    xfer_synth_chain(f->pool, 3, 8, f->chain);
    for (int i = 0; i < 8; i++) {
        xfer_synth_fill(f->pool, f->ids[i], 3);
        assert_int_equal(kv_pool_insert(f->pool, f->ids[i], f->chain[i], NULL), 0);
    }
    *state = f;
    return 0;
}

static int teardown(void **state)
{
    fx *f = *state;
    xfer_leases_destroy(f->L);
    kv_pool_destroy(f->pool);
    dx_free(f);
    return 0;
}

static void drop_own_refs(fx *f)
{
    for (int i = 0; i < 8; i++) kv_pool_unref(f->pool, f->ids[i]);
}

static void test_token_security(void **state)
{
    fx *f = *state;
    xfer_token a, b, wrong;
    assert_int_equal(xfer_lease_create(f->L, f->ids, 4, 60, XFER_LEASE_MULTI, &a), 0);
    assert_int_equal(xfer_lease_create(f->L, f->ids + 4, 4, 60, XFER_LEASE_MULTI, &b), 0);
    assert_memory_not_equal(a.b, b.b, 16);
    uint64_t pin;
    uint32_t k;
    /* the right token pins its blocks */
    assert_int_equal(xfer_pin(f->L, &a, f->ids, f->chain, 4, &pin, &k), 0);
    assert_int_equal(k, 4);
    assert_int_equal(xfer_unpin(f->L, pin, 0), 0);
    assert_int_equal(xfer_unpin(f->L, pin, 0), DX_ENOENT);
    /* a token for other blocks, a wrong token: GONE */
    assert_int_equal(xfer_pin(f->L, &b, f->ids, f->chain, 4, &pin, &k), DX_EGONE);
    assert_int_equal(xfer_pin(f->L, &a, f->ids + 3, f->chain + 3, 2, &pin, &k), DX_EGONE);
    wrong = a;
    wrong.b[15] ^= 1;
    assert_int_equal(xfer_pin(f->L, &wrong, f->ids, f->chain, 4, &pin, &k), DX_EGONE);
    /* hex round trip */
    char hex[33];
    xfer_token back;
    xfer_token_hex(&a, hex);
    assert_int_equal(xfer_token_parse(hex, &back), 0);
    assert_memory_equal(back.b, a.b, 16);
    assert_int_equal(xfer_token_parse("xyz", &back), DX_EINVAL);
    /* revoke */
    assert_int_equal(xfer_lease_revoke(f->L, &a), 0);
    assert_int_equal(xfer_pin(f->L, &a, f->ids, f->chain, 4, &pin, &k), DX_EGONE);
    assert_int_equal(xfer_lease_revoke(f->L, &a), DX_EGONE);
}

static void test_chain_divergence(void **state)
{
    fx *f = *state;
    xfer_token t;
    assert_int_equal(xfer_lease_create(f->L, f->ids, 8, 60, XFER_LEASE_MULTI, &t), 0);
    for (uint32_t div = 0; div < 8; div++) {
        kv_hash c[8];
        memcpy(c, f->chain, sizeof c);
        c[div].hi ^= 1;
        uint64_t pin;
        uint32_t k = 99;
        int rc = xfer_pin(f->L, &t, f->ids, c, 8, &pin, &k);
        if (div == 0) {
            assert_int_equal(rc, DX_EMISMATCH);
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(k, div); /* diverging at block k pins exactly k */
            for (uint32_t i = 0; i < 8; i++)
                assert_int_equal(kv_pool_refcount(f->pool, f->ids[i]), 2 + (i < div));
            assert_int_equal(xfer_unpin(f->L, pin, 0), 0);
        }
    }
}

static void test_expiry_and_sweep(void **state)
{
    fx *f = *state;
    xfer_token t;
    assert_int_equal(xfer_lease_create(f->L, f->ids, 8, 0.05, XFER_LEASE_MULTI, &t), 0);
    drop_own_refs(f);
    xfer_lease_info info;
    assert_int_equal(xfer_lease_lookup(f->L, &t, &info), 0);
    assert_int_equal(info.n_blocks, 8);
    assert_int_equal(kv_pool_refcount(f->pool, f->ids[0]), 1);
    usleep(100000);
    uint64_t pin;
    uint32_t k;
    assert_int_equal(xfer_pin(f->L, &t, f->ids, f->chain, 8, &pin, &k), DX_EGONE);
    assert_int_equal(xfer_lease_renew(f->L, &t, 10), DX_EGONE);
    assert_int_equal(xfer_leases_sweep(f->L, dx_now_ns()), 1);
    /* the lease's references went back: blocks are cached (evictable) */
    kv_pool_stats st;
    kv_pool_get_stats(f->pool, &st);
    assert_int_equal(st.n_used, 0);
    assert_int_equal(st.n_cached, 8);
}

static void test_pin_survives_pressure(void **state)
{
    fx *f = *state;
    xfer_token t;
    assert_int_equal(xfer_lease_create(f->L, f->ids, 8, 60, XFER_LEASE_MULTI, &t), 0);
    drop_own_refs(f);
    uint64_t pin;
    uint32_t k;
    assert_int_equal(xfer_pin(f->L, &t, f->ids, f->chain, 3, &pin, &k), 0);
    /* the lease goes (e.g. revoked under memory pressure); the pin stays */
    assert_int_equal(xfer_lease_revoke(f->L, &t), 0);
    /* take every block the pool will give: it must evict only unpinned ones */
    int32_t got[NB];
    int n = 0;
    while (n < NB && kv_pool_alloc(f->pool, &got[n]) == 0) n++;
    assert_int_equal(n, NB - 3);
    for (int i = 0; i < n; i++)
        for (int j = 0; j < 3; j++) assert_int_not_equal(got[i], f->ids[j]);
    for (int j = 0; j < 3; j++) {
        kv_hash h;
        assert_int_equal(kv_pool_block_hash(f->pool, f->ids[j], &h), 1);
        assert_true(kv_hash_eq(h, f->chain[j]));
        assert_true(xfer_synth_check(f->pool, f->ids[j], 3, f->ids[j]));
    }
    /* a pin timeout releases them; then pressure can take them */
    assert_int_equal(xfer_leases_sweep(f->L, dx_now_ns() + 31000000000ull), 1);
    int32_t more;
    assert_int_equal(kv_pool_alloc(f->pool, &more), 0);
    for (int i = 0; i < n; i++) kv_pool_unref(f->pool, got[i]);
    kv_pool_unref(f->pool, more);
    assert_int_equal(kv_pool_check(f->pool), 0);
}

static void test_policies(void **state)
{
    fx *f = *state;
    xfer_token s, r;
    uint64_t pin;
    uint32_t k;
    assert_int_equal(xfer_lease_create(f->L, f->ids, 2, 60, XFER_LEASE_SINGLE_USE, &s), 0);
    assert_int_equal(xfer_pin(f->L, &s, f->ids, f->chain, 2, &pin, &k), 0);
    assert_int_equal(xfer_unpin(f->L, pin, 1), 0); /* consumed: the lease is done */
    assert_int_equal(xfer_pin(f->L, &s, f->ids, f->chain, 2, &pin, &k), DX_EGONE);
    assert_int_equal(xfer_lease_create(f->L, f->ids, 2, 0.2, XFER_LEASE_RENEW_ON_READ, &r), 0);
    for (int i = 0; i < 4; i++) { /* 0.4 s in all: alive only because each PIN renews */
        usleep(100000);
        assert_int_equal(xfer_pin(f->L, &r, f->ids, f->chain, 2, &pin, &k), 0);
        assert_int_equal(xfer_unpin(f->L, pin, 0), 0);
    }
    int32_t fr;
    assert_int_equal(kv_pool_alloc(f->pool, &fr), 0);
    kv_pool_unref(f->pool, fr); /* free and unhashed: holds no KV */
    assert_int_equal(xfer_lease_create(f->L, &fr, 1, 60, 0, &s), DX_EINVAL);
    assert_int_equal(xfer_lease_create(f->L, f->ids, 1, 0, 0, &s), DX_EINVAL);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_token_security, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chain_divergence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expiry_and_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_survives_pressure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policies, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
