/* test_xfer_lease: leases and pins against a real pool — token security,
 * expiry and sweep, pin renewal, hash-chain matching, single-use and renew policies,
 * that pool pressure (eviction) cannot take a pinned block, and the token
 * and pin-id indexes against a plain model (many leases, forced hash
 * collisions, unknown tokens). */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

#include "base/dx_alloc.h"
#include "base/dx_clock.h"
#include "base/dx_err.h"
#include "xfer/xfer_lease.h"
#include "xfer/xfer_lease_priv.h"
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

/* The registry's clock in the tests that are about time: it moves only
 * when the test moves it, so expiry never depends on the machine's speed. */
static uint64_t g_now = 1000000000ull;

static uint64_t fake_now(void)
{
    return g_now;
}

static void advance_ms(uint64_t ms)
{
    g_now += ms * 1000000ull;
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
    xfer_leases_set_clock(f->L, fake_now);
    assert_int_equal(xfer_lease_create(f->L, f->ids, 8, 0.05, XFER_LEASE_MULTI, &t), 0);
    drop_own_refs(f);
    xfer_lease_info info;
    advance_ms(49);
    assert_int_equal(xfer_lease_lookup(f->L, &t, &info), 0);
    assert_int_equal(info.n_blocks, 8);
    assert_true(info.expires_ns == g_now + 1000000);
    assert_int_equal(kv_pool_refcount(f->pool, f->ids[0]), 1);
    assert_int_equal(xfer_leases_sweep(f->L, g_now), 0);
    advance_ms(1); /* the deadline itself: gone */
    uint64_t pin;
    uint32_t k;
    assert_int_equal(xfer_pin(f->L, &t, f->ids, f->chain, 8, &pin, &k), DX_EGONE);
    assert_int_equal(xfer_lease_renew(f->L, &t, 10), DX_EGONE);
    assert_int_equal(xfer_leases_sweep(f->L, g_now), 1);
    /* the lease's references went back: blocks are cached (evictable) */
    kv_pool_stats st;
    kv_pool_get_stats(f->pool, &st);
    assert_int_equal(st.n_used, 0);
    assert_int_equal(st.n_cached, 8);
}

/* RENEW pushes a pin's deadline to now + the pin TTL.  The sweep runs at an
 * instant between the two deadlines (the test's clock). */
static void test_pin_renew(void **state)
{
    fx *f = *state;
    xfer_token t;
    xfer_leases_set_clock(f->L, fake_now);
    assert_int_equal(xfer_lease_create(f->L, f->ids, 8, 600, XFER_LEASE_MULTI, &t), 0);
    drop_own_refs(f);
    assert_true(xfer_leases_pin_ttl(f->L) == 30);
    uint64_t kept, lapsed;
    uint32_t k;
    assert_int_equal(xfer_pin(f->L, &t, f->ids, f->chain, 4, &kept, &k), 0);
    assert_int_equal(xfer_pin(f->L, &t, f->ids, f->chain, 2, &lapsed, &k), 0);
    uint64_t pinned_at = g_now; /* both deadlines: pinned_at + 30 s */
    advance_ms(20);
    /* the lease going away does not stop its pin being renewed */
    assert_int_equal(xfer_lease_revoke(f->L, &t), 0);
    double ttl = 0;
    assert_int_equal(xfer_pin_renew(f->L, kept, &ttl), 0); /* kept's: g_now + 30 s */
    assert_true(ttl == 30);
    uint64_t between = pinned_at + 30010000000ull;
    assert_int_equal(xfer_leases_sweep(f->L, between - 20000000), 0);
    assert_int_equal(xfer_leases_sweep(f->L, between), 1);
    assert_int_equal(xfer_pin_live(f->L, lapsed), 0);
    assert_int_equal(xfer_pin_live(f->L, kept), 1);
    for (int i = 0; i < 4; i++) assert_int_equal(kv_pool_refcount(f->pool, f->ids[i]), 1);
    assert_int_equal(kv_pool_refcount(f->pool, f->ids[4]), 0);
    /* gone: timed out, released, or never made */
    assert_int_equal(xfer_pin_renew(f->L, lapsed, &ttl), DX_EGONE);
    assert_non_null(strstr(dx_errmsg(), "RENEW"));
    assert_int_equal(xfer_unpin(f->L, kept, 0), 0);
    assert_int_equal(xfer_pin_renew(f->L, kept, &ttl), DX_EGONE);
    assert_int_equal(xfer_pin_renew(f->L, kept + 1000, &ttl), DX_EGONE);
    assert_int_equal(xfer_leases_check(f->L), 0);
}

/* A pin past its deadline is gone for RENEW before the sweep frees it. */
static void test_pin_renew_after_deadline(void **state)
{
    fx *f = *state;
    xfer_leases *L;
    assert_int_equal(xfer_leases_create(f->pool, 0.01, &L), 0);
    xfer_leases_set_clock(L, fake_now);
    xfer_token t;
    assert_int_equal(xfer_lease_create(L, f->ids, 8, 600, XFER_LEASE_MULTI, &t), 0);
    uint64_t pin;
    uint32_t k;
    double ttl;
    assert_int_equal(xfer_pin(L, &t, f->ids, f->chain, 8, &pin, &k), 0);
    advance_ms(9);
    assert_int_equal(xfer_pin_renew(L, pin, &ttl), 0); /* 1 ms left: renewed to 10 again */
    advance_ms(10);
    assert_int_equal(xfer_pin_renew(L, pin, &ttl), DX_EGONE);
    assert_true(ttl == 0.01);
    assert_int_equal(xfer_pin_live(L, pin), 1); /* not swept yet: still holds its blocks */
    assert_int_equal(xfer_leases_sweep(L, g_now), 1);
    xfer_leases_destroy(L);
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
    xfer_leases_set_clock(f->L, fake_now);
    assert_int_equal(xfer_lease_create(f->L, f->ids, 2, 0.2, XFER_LEASE_RENEW_ON_READ, &r), 0);
    for (int i = 0; i < 4; i++) { /* 0.6 s in all: alive only because each PIN renews */
        advance_ms(150);
        assert_int_equal(xfer_pin(f->L, &r, f->ids, f->chain, 2, &pin, &k), 0);
        assert_int_equal(xfer_unpin(f->L, pin, 0), 0);
    }
    advance_ms(200); /* no PIN for a whole TTL: gone */
    assert_int_equal(xfer_pin(f->L, &r, f->ids, f->chain, 2, &pin, &k), DX_EGONE);
    int32_t fr;
    assert_int_equal(kv_pool_alloc(f->pool, &fr), 0);
    kv_pool_unref(f->pool, fr); /* free and unhashed: holds no KV */
    assert_int_equal(xfer_lease_create(f->L, &fr, 1, 60, 0, &s), DX_EINVAL);
    assert_int_equal(xfer_lease_create(f->L, f->ids, 1, 0, 0, &s), DX_EINVAL);
}

/* ---- the indexes against a model ---------------------------------------- */

static uint64_t rng(uint64_t *s)
{
    uint64_t z = (*s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

typedef struct {
    xfer_token t;
    uint8_t alive;
    uint32_t off, n; /* holds f->ids[off .. off+n) */
} model_lease;

/* Lease i holds a window of the 8 hashed blocks and has ttl 1000+i s, so a
 * lookup that finds the wrong lease shows in n_blocks or ttl. */
static void model_shape(uint64_t *s, model_lease *m)
{
    m->n = 1 + (uint32_t)(rng(s) % 8);
    m->off = (uint32_t)(rng(s) % (9 - m->n));
}

static void expect_lookup(fx *f, const model_lease *m, uint32_t i)
{
    xfer_lease_info info;
    int rc = xfer_lease_lookup(f->L, &m->t, &info);
    if (!m->alive) {
        assert_int_equal(rc, DX_EGONE);
        return;
    }
    assert_int_equal(rc, 0);
    assert_int_equal(info.n_blocks, m->n);
    assert_true(info.ttl_s == 1000.0 + i);
}

/* The pool's refcount of each hashed block is the test's own reference plus
 * one per live lease holding it (no pins live). */
static void expect_refs(fx *f, const model_lease *m, uint32_t n_leases)
{
    uint32_t want[8] = {1, 1, 1, 1, 1, 1, 1, 1};
    for (uint32_t i = 0; i < n_leases; i++)
        if (m[i].alive)
            for (uint32_t j = 0; j < m[i].n; j++) want[m[i].off + j]++;
    for (int j = 0; j < 8; j++) assert_int_equal(kv_pool_refcount(f->pool, f->ids[j]), want[j]);
}

static void shuffle(uint64_t *s, uint32_t *perm, uint32_t n)
{
    for (uint32_t i = 0; i < n; i++) perm[i] = i;
    for (uint32_t i = n; i-- > 1;) {
        uint32_t j = (uint32_t)(rng(s) % (i + 1)), x = perm[i];
        perm[i] = perm[j];
        perm[j] = x;
    }
}

static void test_many_leases_model(void **state)
{
    fx *f = *state;
    enum { N = 20000 };
    model_lease *m = dx_calloc(N, sizeof *m);
    uint32_t *perm = dx_calloc(N, sizeof *perm);
    uint64_t s = 11;
    for (uint32_t i = 0; i < N; i++) {
        model_shape(&s, &m[i]);
        assert_int_equal(xfer_lease_create(f->L, f->ids + m[i].off, m[i].n, 1000.0 + i,
                                           XFER_LEASE_MULTI, &m[i].t),
                         0);
        m[i].alive = 1;
    }
    assert_int_equal(xfer_leases_check(f->L), 0);
    expect_refs(f, m, N);
    for (uint32_t i = 0; i < N; i++) expect_lookup(f, &m[i], i);
    /* revoke in random order; between revocations look up a random lease,
     * renew one and now and then pin through one */
    shuffle(&s, perm, N);
    for (uint32_t k = 0; k < N; k++) {
        uint32_t i = perm[k];
        if (k % 101 == 0) {
            uint64_t pin;
            uint32_t got;
            assert_int_equal(
                xfer_pin(f->L, &m[i].t, f->ids + m[i].off, f->chain + m[i].off, m[i].n, &pin, &got),
                0);
            assert_int_equal(got, m[i].n);
            xfer_lease_info info;
            assert_int_equal(xfer_lease_lookup(f->L, &m[i].t, &info), 0);
            assert_int_equal(info.n_pins, 1);
            assert_int_equal(xfer_unpin(f->L, pin, 0), 0);
        }
        assert_int_equal(xfer_lease_revoke(f->L, &m[i].t), 0);
        m[i].alive = 0;
        assert_int_equal(xfer_lease_revoke(f->L, &m[i].t), DX_EGONE);
        uint32_t j = (uint32_t)(rng(&s) % N);
        expect_lookup(f, &m[j], j);
        assert_int_equal(xfer_lease_renew(f->L, &m[j].t, 1000.0 + j), m[j].alive ? 0 : DX_EGONE);
        if (k % 4000 == 0) {
            assert_int_equal(xfer_leases_check(f->L), 0);
            expect_refs(f, m, N);
        }
    }
    xfer_leases_stats st;
    xfer_leases_get_stats(f->L, &st);
    assert_int_equal(st.leases, 0);
    assert_int_equal(st.pins, 0);
    assert_int_equal(st.created, N);
    assert_int_equal(st.revoked, N);
    expect_refs(f, m, N);
    assert_int_equal(xfer_leases_check(f->L), 0);
    dx_free(perm);
    dx_free(m);
}

/* Tokens that share their low 64 bits (b[0..8)) and differ only above. */
static xfer_token collide_tok(uint64_t low, uint64_t high)
{
    xfer_token t;
    memcpy(t.b, &low, 8);
    memcpy(t.b + 8, &high, 8);
    return t;
}

/* Creates n leases with tokens sharing their low 64 bits, revokes them in
 * random order and checks every lease (and unknown look-alikes) throughout. */
static void collide_run(fx *f, uint32_t n)
{
    model_lease *m = dx_calloc(n, sizeof *m);
    uint32_t *perm = dx_calloc(n, sizeof *perm);
    uint64_t s = 5;
    for (uint32_t i = 0; i < n; i++) {
        model_shape(&s, &m[i]);
        m[i].t = collide_tok(0x0123456789abcdefull, 1 + (uint64_t)i);
        assert_int_equal(xfer_lease_create_as(f->L, &m[i].t, f->ids + m[i].off, m[i].n, 1000.0 + i,
                                              XFER_LEASE_MULTI),
                         0);
        m[i].alive = 1;
    }
    /* the same token again is refused, and changes nothing */
    assert_int_equal(xfer_lease_create_as(f->L, &m[0].t, f->ids, 1, 5, XFER_LEASE_MULTI),
                     DX_EEXIST);
    assert_int_equal(xfer_leases_check(f->L), 0);
    shuffle(&s, perm, n);
    for (uint32_t k = 0; k < n; k++) {
        assert_int_equal(xfer_lease_revoke(f->L, &m[perm[k]].t), 0);
        m[perm[k]].alive = 0;
        if (k % 64 == 0 || k + 1 == n) {
            for (uint32_t i = 0; i < n; i++) expect_lookup(f, &m[i], i);
            assert_int_equal(xfer_leases_check(f->L), 0);
        }
        /* same low bits, never created: GONE */
        xfer_token u = collide_tok(0x0123456789abcdefull, 1000000 + k);
        xfer_lease_info info;
        assert_int_equal(xfer_lease_lookup(f->L, &u, &info), DX_EGONE);
    }
    expect_refs(f, m, n);
    dx_free(perm);
    dx_free(m);
}

static void test_colliding_tokens_weak_hash(void **state)
{
    fx *f = *state;
    /* every token hashes to 0: all of them share one probe run */
    xfer_leases_weak_hash(f->L, 0);
    collide_run(f, 600);
}

static void test_colliding_tokens_seeded_hash(void **state)
{
    fx *f = *state;
    /* the real (seeded) hash: equal low bits do not make equal slots */
    collide_run(f, 3000);
}

static void test_colliding_pin_ids(void **state)
{
    fx *f = *state;
    /* pin ids hash to id & 0x100: two homes for all pins */
    xfer_leases_weak_hash(f->L, 0x100);
    enum { NL = 40, NP = 1200 };
    xfer_token t[NL];
    uint64_t pins[NP];
    uint32_t owner[NP], perm[NP], k;
    uint8_t live[NP];
    uint64_t s = 9;
    for (int i = 0; i < NL; i++)
        assert_int_equal(xfer_lease_create(f->L, f->ids, 8, 60, XFER_LEASE_MULTI, &t[i]), 0);
    for (uint32_t p = 0; p < NP; p++) {
        owner[p] = (uint32_t)(rng(&s) % NL);
        assert_int_equal(xfer_pin(f->L, &t[owner[p]], f->ids, f->chain, 2, &pins[p], &k), 0);
        live[p] = 1;
    }
    assert_int_equal(xfer_leases_check(f->L), 0);
    /* revoking half the leases leaves their pins live and ownerless */
    for (int i = 0; i < NL; i += 2) assert_int_equal(xfer_lease_revoke(f->L, &t[i]), 0);
    assert_int_equal(xfer_leases_check(f->L), 0);
    shuffle(&s, perm, NP);
    for (uint32_t q = 0; q < NP; q++) {
        uint32_t p = perm[q];
        assert_int_equal(xfer_pin_live(f->L, pins[p]), 1);
        assert_int_equal(xfer_unpin(f->L, pins[p], 0), 0);
        live[p] = 0;
        assert_int_equal(xfer_pin_live(f->L, pins[p]), 0);
        assert_int_equal(xfer_unpin(f->L, pins[p], 0), DX_ENOENT);
        if (q % 100 == 0) {
            assert_int_equal(xfer_leases_check(f->L), 0);
            uint32_t r = perm[(q * 7 + 3) % NP];
            assert_int_equal(xfer_pin_live(f->L, pins[r]), live[r]);
        }
    }
    /* a surviving lease's pin count went back to 0 */
    xfer_lease_info info;
    assert_int_equal(xfer_lease_lookup(f->L, &t[1], &info), 0);
    assert_int_equal(info.n_pins, 0);
    for (int j = 0; j < 8; j++) assert_int_equal(kv_pool_refcount(f->pool, f->ids[j]), 1 + NL / 2);
    assert_int_equal(xfer_leases_check(f->L), 0);
}

static void test_unknown_tokens_gone(void **state)
{
    fx *f = *state;
    xfer_token t, u, zero;
    memset(&zero, 0, sizeof zero);
    for (int i = 0; i < 100; i++)
        assert_int_equal(xfer_lease_create(f->L, f->ids, 8, 60, XFER_LEASE_MULTI, &t), 0);
    uint64_t pin;
    uint32_t k;
    xfer_lease_info info;
    for (int i = 0; i < 200; i++) {
        assert_int_equal(xfer_token_random(&u), 0);
        if (i == 0) u = zero;
        assert_int_equal(xfer_lease_lookup(f->L, &u, &info), DX_EGONE);
        assert_int_equal(xfer_lease_renew(f->L, &u, 10), DX_EGONE);
        assert_int_equal(xfer_lease_revoke(f->L, &u), DX_EGONE);
        assert_int_equal(xfer_pin(f->L, &u, f->ids, f->chain, 8, &pin, &k), DX_EGONE);
    }
    /* a known token with one bit flipped in each half is unknown too */
    for (int b = 0; b < 16; b += 15) {
        u = t;
        u.b[b] ^= 0x80;
        assert_int_equal(xfer_lease_lookup(f->L, &u, &info), DX_EGONE);
    }
    assert_int_equal(xfer_lease_lookup(f->L, &t, &info), 0);
    xfer_leases_stats st;
    xfer_leases_get_stats(f->L, &st);
    assert_int_equal(st.gone, 200);
    assert_int_equal(st.leases, 100);
    assert_int_equal(xfer_unpin(f->L, 12345, 0), DX_ENOENT);
}

/* Memory pressure gives up the least recently used lease first; creating,
 * renewing and pinning count as use; pins keep their blocks. */
static void test_revoke_lru(void **state)
{
    fx *f = *state;
    xfer_token a, b, c;
    assert_int_equal(xfer_lease_create(f->L, f->ids, 2, 60, XFER_LEASE_MULTI, &a), 0);
    assert_int_equal(xfer_lease_create(f->L, f->ids + 2, 3, 60, XFER_LEASE_MULTI, &b), 0);
    assert_int_equal(xfer_lease_create(f->L, f->ids + 5, 1, 60, XFER_LEASE_MULTI, &c), 0);
    assert_int_equal(xfer_lease_renew(f->L, &a, 60), 0); /* order now b, c, a */
    uint64_t pin;
    uint32_t k, nb = 0;
    assert_int_equal(xfer_pin(f->L, &b, f->ids + 2, f->chain + 2, 3, &pin, &k), 0); /* c, a, b */
    assert_int_equal(xfer_leases_revoke_lru(f->L, &nb), 1);
    assert_int_equal(nb, 1);
    assert_int_equal(xfer_lease_renew(f->L, &c, 60), DX_EGONE);
    assert_int_equal(xfer_leases_revoke_lru(f->L, &nb), 1);
    assert_int_equal(nb, 2);
    assert_int_equal(xfer_lease_renew(f->L, &a, 60), DX_EGONE);
    assert_int_equal(xfer_leases_revoke_lru(f->L, NULL), 1);
    assert_int_equal(xfer_leases_revoke_lru(f->L, NULL), 0);
    /* b's pin still holds its blocks: ours + the pin's */
    for (int i = 2; i < 5; i++) assert_int_equal(kv_pool_refcount(f->pool, f->ids[i]), 2);
    assert_int_equal(xfer_unpin(f->L, pin, 1), 0);
    xfer_leases_stats st;
    xfer_leases_get_stats(f->L, &st);
    assert_int_equal(st.revoked_lru, 3);
    assert_int_equal(st.leases, 0);
    assert_int_equal(xfer_leases_check(f->L), 0);
    drop_own_refs(f);
    kv_pool_stats ps;
    kv_pool_get_stats(f->pool, &ps);
    assert_int_equal(ps.n_used, 0);
}

/* A newer lease supersedes the leases tagged with any of its blocks' tags. */
static void test_supersede_by_tag(void **state)
{
    fx *f = *state;
    xfer_token t1, t2, t3, other;
    uint64_t tags[8];
    for (int i = 0; i < 8; i++) tags[i] = f->chain[i].lo | 1;
    /* turn 1 held blocks 0..2 (tag: block 2), turn 2 blocks 0..4 (tag: 4) */
    assert_int_equal(
        xfer_lease_create_tagged(f->L, f->ids, 3, 60, XFER_LEASE_RENEW_ON_READ, tags[2], &t1), 0);
    assert_int_equal(xfer_lease_create(f->L, f->ids + 6, 2, 60, XFER_LEASE_MULTI, &other), 0);
    assert_int_equal(xfer_leases_supersede(f->L, tags, 5), 1); /* turn 2 finished */
    assert_int_equal(
        xfer_lease_create_tagged(f->L, f->ids, 5, 60, XFER_LEASE_RENEW_ON_READ, tags[4], &t2), 0);
    assert_int_equal(xfer_lease_renew(f->L, &t1, 60), DX_EGONE);
    assert_int_equal(xfer_lease_renew(f->L, &other, 60), 0); /* untagged: untouched */
    xfer_leases_stats st;
    xfer_leases_get_stats(f->L, &st); /* retention: turn 2's lease, not the MULTI one */
    assert_int_equal(st.retained, 1);
    assert_int_equal(st.retained_blocks, 5);
    assert_int_equal(st.blocks, 7);
    /* two leases with one tag (a conversation forked) both go */
    assert_int_equal(
        xfer_lease_create_tagged(f->L, f->ids, 5, 60, XFER_LEASE_RENEW_ON_READ, tags[4], &t3), 0);
    uint64_t zero_and_4[2] = {0, tags[4]};
    assert_int_equal(xfer_leases_supersede(f->L, zero_and_4, 2), 2);
    assert_int_equal(xfer_lease_renew(f->L, &t2, 60), DX_EGONE);
    assert_int_equal(xfer_lease_renew(f->L, &t3, 60), DX_EGONE);
    xfer_leases_get_stats(f->L, &st);
    assert_int_equal(st.superseded, 3);
    assert_int_equal(st.leases, 1);
    assert_int_equal(st.retained, 0);
    assert_int_equal(st.retained_blocks, 0);
    assert_int_equal(xfer_leases_check(f->L), 0);
    assert_int_equal(xfer_lease_revoke(f->L, &other), 0);
    drop_own_refs(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_token_security, setup, teardown),
        cmocka_unit_test_setup_teardown(test_chain_divergence, setup, teardown),
        cmocka_unit_test_setup_teardown(test_expiry_and_sweep, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_renew, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_renew_after_deadline, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pin_survives_pressure, setup, teardown),
        cmocka_unit_test_setup_teardown(test_policies, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_leases_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_colliding_tokens_weak_hash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_colliding_tokens_seeded_hash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_colliding_pin_ids, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_tokens_gone, setup, teardown),
        cmocka_unit_test_setup_teardown(test_revoke_lru, setup, teardown),
        cmocka_unit_test_setup_teardown(test_supersede_by_tag, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
