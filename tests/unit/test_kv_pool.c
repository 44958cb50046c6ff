/* Unit tests for src/engine/kv_pool: arena layout and allocation hook,
 * refcounts, free/LRU/eviction order, exhaustion, prefix hashing, the hash
 * index, prefix matching, concurrency, config validation and leaks.  Every
 * test checks the pool's own invariant checker after each step. */
/* duplex-test: tsan */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <xxhash.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "engine/kv_pool.h"

/* 2 layers x (K,V) x 2 heads x 4 tokens x 8 dims x f16 = 512-byte blocks. */
static kv_pool_config small_cfg(uint32_t n_blocks)
{
    return (kv_pool_config){.n_layer = 2,
                            .n_kv_head = 2,
                            .head_dim = 8,
                            .block_size = 4,
                            .dtype = DX_F16,
                            .n_blocks = n_blocks,
                            .seed = {.lo = 0x1234, .hi = 0x5678}};
}

static kv_pool *make_pool(uint32_t n_blocks)
{
    kv_pool_config c = small_cfg(n_blocks);
    kv_pool *p = NULL;
    assert_int_equal(kv_pool_create(&c, &p), 0);
    assert_non_null(p);
    return p;
}

/* Stats add up, match the expected split, and every internal invariant
 * holds. */
static void expect_state(kv_pool *p, uint32_t n_free, uint32_t n_cached, uint32_t n_used)
{
    kv_pool_stats s;
    kv_pool_get_stats(p, &s);
    assert_int_equal(s.n_free + s.n_cached + s.n_used, s.n_blocks);
    assert_int_equal(s.n_free, n_free);
    assert_int_equal(s.n_cached, n_cached);
    assert_int_equal(s.n_used, n_used);
    int rc = kv_pool_check(p);
    if (rc) fail_msg("kv_pool_check: %s", dx_errmsg());
}

static kv_hash H(uint64_t lo, uint64_t hi)
{
    return (kv_hash){.lo = lo, .hi = hi};
}

static int32_t alloc1(kv_pool *p)
{
    int32_t id = -1;
    assert_int_equal(kv_pool_alloc(p, &id), 0);
    assert_true(kv_pool_valid_id(p, id));
    return id;
}

/* ---- refcounts and layout ---------------------------------------------- */

static void test_alloc_refcount(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    kv_pool *p = make_pool(8);
    expect_state(p, 8, 0, 0);
    int32_t a = alloc1(p), b = alloc1(p);
    assert_int_equal(a, 0); /* a fresh pool hands out ids in order */
    assert_int_equal(b, 1);
    assert_int_equal(kv_pool_refcount(p, a), 1);
    expect_state(p, 6, 0, 2);
    kv_pool_ref(p, a);
    assert_int_equal(kv_pool_refcount(p, a), 2);
    kv_pool_unref(p, a);
    assert_int_equal(kv_pool_refcount(p, a), 1);
    expect_state(p, 6, 0, 2);
    kv_pool_unref(p, a); /* unhashed: straight back to free */
    assert_int_equal(kv_pool_refcount(p, a), 0);
    expect_state(p, 7, 0, 1);
    assert_int_equal(alloc1(p), a); /* free list is LIFO */
    kv_pool_unref(p, a);
    kv_pool_unref(p, b);
    expect_state(p, 8, 0, 0);
    assert_false(kv_pool_valid_id(p, -1));
    assert_false(kv_pool_valid_id(p, 8));
    assert_true(kv_pool_valid_id(p, 7));
    kv_pool_destroy(p);
    kv_pool_destroy(NULL);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_layout(void **state)
{
    (void)state;
    kv_pool *p = make_pool(10);
    size_t page = (size_t)sysconf(_SC_PAGESIZE), bb = kv_pool_block_bytes(p);
    assert_int_equal(bb, 2 * 2 * 2 * 4 * 8 * 2);
    assert_int_equal(kv_pool_n_blocks(p), 10);
    assert_int_equal(kv_pool_block_size(p), 4);
    assert_int_equal(kv_pool_dtype(p), DX_F16);
    assert_int_equal(kv_pool_arena_bytes(p) % page, 0);
    assert_true(kv_pool_arena_bytes(p) >= 10 * bb);
    assert_true(kv_pool_arena_bytes(p) < 10 * bb + page);
    assert_int_equal((uintptr_t)kv_pool_base(p) % page, 0);
    for (int32_t i = 0; i < 10; i++)
        assert_ptr_equal(kv_pool_block_ptr(p, i), kv_pool_base(p) + (size_t)i * bb);
    assert_null(kv_pool_block_ptr(p, -1));
    assert_null(kv_pool_block_ptr(p, 10));
    /* per layer: K then V, each n_kv_head * block_size * head_dim elements */
    size_t kv = 2 * 4 * 8 * 2;
    assert_int_equal(kv_pool_k_offset(p, 0), 0);
    assert_int_equal(kv_pool_v_offset(p, 0), kv);
    assert_int_equal(kv_pool_k_offset(p, 1), 2 * kv);
    assert_int_equal(kv_pool_v_offset(p, 1), 3 * kv);
    assert_int_equal(kv_pool_v_offset(p, 1) + kv, bb); /* last region ends the block */
    int32_t a = alloc1(p), b = alloc1(p);
    assert_ptr_equal(kv_pool_block_ptr(p, b), kv_pool_block_ptr(p, a) + bb);
    kv_pool_destroy(p);

    /* element sizes and the default block size */
    kv_pool_config c = small_cfg(3);
    c.dtype = DX_F32;
    c.block_size = 0;
    assert_int_equal(kv_pool_create(&c, &p), 0);
    assert_int_equal(kv_pool_block_size(p), 16);
    assert_int_equal(kv_pool_block_bytes(p), 2 * 2 * 2 * 16 * 8 * 4);
    kv_pool_destroy(p);
    c.dtype = DX_BF16;
    c.n_blocks = 0;
    c.pool_bytes = 5 * (2 * 2 * 2 * 16 * 8 * 2) + 7; /* floor */
    assert_int_equal(kv_pool_create(&c, &p), 0);
    assert_int_equal(kv_pool_n_blocks(p), 5);
    /* the geometry reports what was built, defaults resolved */
    kv_pool_config g;
    kv_pool_geometry(p, &g);
    assert_int_equal(g.n_layer, 2);
    assert_int_equal(g.n_kv_head, 2);
    assert_int_equal(g.head_dim, 8);
    assert_int_equal(g.block_size, 16);
    assert_int_equal(g.dtype, DX_BF16);
    assert_int_equal(g.n_blocks, 5);
    assert_true(kv_hash_eq(g.seed, c.seed));
    assert_null(g.alloc);
    kv_pool_destroy(p);

    /* q8_0: an int8 per element and an f16 scale per 32 of a token's row,
     * 17/16 bytes an element: a block is 0.53 of an f16 one */
    c = small_cfg(4);
    c.dtype = DX_Q8_0;
    c.head_dim = 64;
    assert_int_equal(kv_pool_create(&c, &p), 0);
    size_t q8 = 4 * (64 + 2 * 2); /* per head: 4 tokens of 64 quants and 2 scales */
    assert_int_equal(kv_pool_block_bytes(p), 2 * 2 * 2 * q8);
    assert_int_equal(kv_pool_v_offset(p, 0), 2 * q8);
    assert_int_equal(kv_pool_dtype(p), DX_Q8_0);
    size_t f16;
    c.dtype = DX_F16;
    assert_int_equal(kv_pool_config_block_bytes(&c, &f16), 0);
    assert_int_equal(kv_pool_block_bytes(p) * 32, f16 * 17);
    kv_pool_destroy(p);
}

/* kv_pool_populate faults every page in without changing what is there, and
 * stops when asked. */
static void test_populate(void **state)
{
    (void)state;
    kv_pool *p = make_pool(100); /* 51200 bytes: 13 pages */
    size_t page = (size_t)sysconf(_SC_PAGESIZE);
    size_t n_pages = kv_pool_arena_bytes(p) / page;
    unsigned char vec[64];
    assert_true(n_pages <= sizeof vec);
    uint8_t *base = kv_pool_base(p);
    base[3 * page + 7] = 0x5a; /* a page in use before */
    int stop = 1;
    assert_int_equal(kv_pool_populate(p, &stop), DX_ECANCELED);
    int rc = kv_pool_populate(p, NULL);
    if (rc == DX_EUNSUPPORTED) {
        kv_pool_destroy(p);
        skip(); /* a kernel before 5.14: pages fault in on first use */
    }
    assert_int_equal(rc, 0);
    assert_int_equal(mincore(base, kv_pool_arena_bytes(p), vec), 0);
    for (size_t i = 0; i < n_pages; i++) assert_true(vec[i] & 1);
    /* contents untouched: anonymous memory still zero, the written byte kept */
    for (size_t i = 0; i < kv_pool_arena_bytes(p); i++)
        assert_int_equal(base[i], i == 3 * page + 7 ? 0x5a : 0);
    memset(base, 0xab, kv_pool_arena_bytes(p));
    assert_int_equal(base[kv_pool_arena_bytes(p) - 1], 0xab);
    kv_pool_destroy(p);
}

/* ---- allocation hook --------------------------------------------------- */

typedef struct {
    int allocs, releases;
    void *last_p;
    size_t alloc_bytes, release_bytes;
    int mode; /* 0: mmap, 1: fail, 2: misaligned */
    uint8_t *mapping;
} hook_state;

static void *test_hook_alloc(void *user, size_t bytes)
{
    hook_state *h = user;
    h->allocs++;
    h->alloc_bytes = bytes;
    if (h->mode == 1) return NULL;
    size_t extra = h->mode == 2 ? 4096 : 0;
    void *m = mmap(NULL, bytes + extra, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    assert_true(m != MAP_FAILED);
    h->mapping = m;
    h->last_p = h->mode == 2 ? (uint8_t *)m + 8 : m;
    return h->last_p;
}

static void test_hook_release(void *user, void *p, size_t bytes)
{
    hook_state *h = user;
    h->releases++;
    assert_ptr_equal(p, h->last_p);
    h->release_bytes = bytes;
    munmap(h->mapping, bytes + (h->mode == 2 ? 4096 : 0));
}

static void test_alloc_hook(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    hook_state hs = {0};
    kv_pool_config c = small_cfg(16);
    c.alloc = test_hook_alloc;
    c.release = test_hook_release;
    c.alloc_user = &hs;
    kv_pool *p = NULL;
    assert_int_equal(kv_pool_create(&c, &p), 0);
    assert_int_equal(hs.allocs, 1); /* the hook is the arena's only allocation */
    assert_ptr_equal(kv_pool_base(p), hs.last_p);
    assert_int_equal(hs.alloc_bytes, kv_pool_arena_bytes(p));
    int32_t ids[16];
    assert_int_equal(kv_pool_alloc_n(p, 16, ids), 0);
    kv_pool_destroy(p);
    assert_int_equal(hs.allocs, 1);
    assert_int_equal(hs.releases, 1);
    assert_int_equal(hs.release_bytes, hs.alloc_bytes);

    hs = (hook_state){.mode = 1};
    assert_int_equal(kv_pool_create(&c, &p), DX_ENOMEM);
    assert_null(p);
    assert_non_null(strstr(dx_errmsg(), "config.alloc"));
    assert_int_equal(hs.releases, 0);

    hs = (hook_state){.mode = 2};
    assert_int_equal(kv_pool_create(&c, &p), DX_EINVAL);
    assert_null(p);
    assert_non_null(strstr(dx_errmsg(), "page-aligned"));
    assert_int_equal(hs.releases, 1); /* refused memory is handed back */
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_create_out_of_memory(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    hook_state hs = {0};
    kv_pool_config c = small_cfg(16);
    c.alloc = test_hook_alloc;
    c.release = test_hook_release;
    c.alloc_user = &hs;
    for (long n = 1; n <= 3; n++) { /* the pool, its block table, its index */
        kv_pool *p = NULL;
        dx_alloc_fail_after(n, 0);
        assert_int_equal(kv_pool_create(&c, &p), DX_ENOMEM);
        dx_alloc_fail_after(0, 0);
        assert_null(p);
        assert_int_equal(hs.allocs, hs.releases);
        assert_int_equal(dx_alloc_live_bytes(), live);
    }
}

/* ---- LRU and exhaustion ------------------------------------------------ */

/* Allocate 4 blocks, hash a, b, c, release them in that order; d stays held. */
static kv_pool *lru_setup(int32_t *a, int32_t *b, int32_t *c, int32_t *d)
{
    kv_pool *p = make_pool(4);
    int32_t ids[4];
    assert_int_equal(kv_pool_alloc_n(p, 4, ids), 0);
    *a = ids[0], *b = ids[1], *c = ids[2], *d = ids[3];
    for (int i = 0; i < 3; i++) assert_int_equal(kv_pool_insert(p, ids[i], H(100 + i, 1), NULL), 0);
    for (int i = 0; i < 3; i++) kv_pool_unref(p, ids[i]);
    expect_state(p, 0, 3, 1);
    return p;
}

static void test_lru_order(void **state)
{
    (void)state;
    int32_t a, b, c, d;
    kv_pool *p = lru_setup(&a, &b, &c, &d);
    assert_int_equal(kv_pool_lookup(p, H(100, 1)), a);
    assert_int_equal(alloc1(p), a); /* least recently released first */
    assert_int_equal(kv_pool_lookup(p, H(100, 1)), -1);
    assert_int_equal(kv_pool_lookup(p, H(101, 1)), b);
    expect_state(p, 0, 2, 2);
    assert_int_equal(alloc1(p), b);
    assert_int_equal(alloc1(p), c);
    expect_state(p, 0, 0, 4);
    kv_pool_stats s;
    kv_pool_get_stats(p, &s);
    assert_int_equal(s.evictions, 3);
    assert_false(kv_pool_block_hash(p, a, &(kv_hash){0})); /* eviction drops the hash */
    kv_pool_destroy(p);

    /* touching b (match_prefix) and then a (ref) moves them to the MRU end */
    p = lru_setup(&a, &b, &c, &d);
    kv_hash hb = H(101, 1);
    int32_t got;
    assert_int_equal(kv_pool_match_prefix(p, &hb, 1, &got), 1);
    assert_int_equal(got, b);
    expect_state(p, 0, 2, 2); /* a matched block leaves the LRU */
    kv_pool_unref(p, b);
    kv_pool_ref(p, a);
    assert_int_equal(kv_pool_refcount(p, a), 1);
    expect_state(p, 0, 2, 2);
    kv_pool_unref(p, a);
    expect_state(p, 0, 3, 1);
    assert_int_equal(alloc1(p), c);
    assert_int_equal(alloc1(p), b);
    assert_int_equal(alloc1(p), a);
    kv_pool_destroy(p);
}

static void test_exhaustion(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    int32_t a, b, c, d;
    kv_pool *p = lru_setup(&a, &b, &c, &d);
    int32_t ids[4] = {-7, -7, -7, -7};
    /* alloc_n: 4 wanted, 3 evictable -> nothing taken, nothing evicted */
    assert_int_equal(kv_pool_alloc_n(p, 4, ids), DX_EFULL);
    assert_non_null(strstr(dx_errmsg(), "KV pool exhausted"));
    for (int i = 0; i < 4; i++) assert_int_equal(ids[i], -7);
    expect_state(p, 0, 3, 1);
    assert_int_equal(kv_pool_lookup(p, H(100, 1)), a);
    kv_pool_stats s;
    kv_pool_get_stats(p, &s);
    assert_int_equal(s.evictions, 0);
    assert_int_equal(kv_pool_alloc_n(p, 0, ids), 0);
    assert_int_equal(kv_pool_alloc_n(p, 3, ids), 0);
    assert_int_equal(ids[0], a);
    assert_int_equal(ids[2], c);
    expect_state(p, 0, 0, 4);
    int32_t id = -7;
    assert_int_equal(kv_pool_alloc(p, &id), DX_EFULL);
    assert_string_equal(dx_errmsg(), "KV pool exhausted: all 4 blocks in use");
    assert_int_equal(id, -7);
    expect_state(p, 0, 0, 4);
    for (int i = 0; i < 3; i++) assert_int_equal(kv_pool_refcount(p, ids[i]), 1);
    kv_pool_destroy(p);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* ---- hashing ----------------------------------------------------------- */

static void fill_tokens(int32_t *t, size_t n, uint32_t salt)
{
    for (size_t i = 0; i < n; i++) t[i] = (int32_t)((i * 2654435761u + salt) % 151936u);
}

static void test_hash_chain(void **state)
{
    (void)state;
    kv_pool *p = make_pool(4);
    int32_t t1[66], t2[66];
    fill_tokens(t1, 66, 0);
    memcpy(t2, t1, sizeof t1);
    kv_hash c1[17], c2[17];
    assert_int_equal(kv_pool_hash_chain(p, t1, 66, c1), 16); /* partial block ignored */
    assert_int_equal(kv_pool_hash_chain(p, t2, 66, c2), 16);
    for (int i = 0; i < 16; i++) assert_true(kv_hash_eq(c1[i], c2[i]));
    assert_int_equal(kv_pool_hash_chain(p, t1, 3, c2), 0);

    t2[21]++; /* block 5 */
    kv_pool_hash_chain(p, t2, 64, c2);
    for (int i = 0; i < 16; i++) assert_int_equal(kv_hash_eq(c1[i], c2[i]), i < 5);
    for (int i = 1; i < 16; i++) assert_false(kv_hash_eq(c1[i], c1[i - 1]));

    /* the chain is exactly h_i = XXH3-128(h_{i-1} LE || tokens LE) */
    uint8_t buf[16 + 16];
    kv_hash prev = kv_pool_seed(p);
    assert_int_equal(prev.lo, 0x1234);
    for (int i = 0; i < 2; i++) {
        for (int j = 0; j < 8; j++) buf[j] = (uint8_t)(prev.lo >> (8 * j));
        for (int j = 0; j < 8; j++) buf[8 + j] = (uint8_t)(prev.hi >> (8 * j));
        for (int j = 0; j < 16; j++)
            buf[16 + j] = (uint8_t)((uint32_t)t1[4 * i + j / 4] >> (8 * (j % 4)));
        XXH128_hash_t r = XXH3_128bits(buf, sizeof buf);
        assert_true(kv_hash_eq(c1[i], H(r.low64, r.high64)));
        prev = c1[i];
    }
    kv_pool_destroy(p);

    /* another model fingerprint: every hash differs */
    kv_pool_config c = small_cfg(4);
    c.seed.hi ^= 1;
    assert_int_equal(kv_pool_create(&c, &p), 0);
    kv_pool_hash_chain(p, t1, 64, c2);
    for (int i = 0; i < 16; i++) assert_false(kv_hash_eq(c1[i], c2[i]));
    kv_pool_destroy(p);
}

static void test_hash_long_runs(void **state)
{
    (void)state;
    /* runs longer than the stack buffer stream; same bytes, same hash */
    enum { N = 1000 };
    int32_t *t = dx_malloc(N * sizeof *t);
    uint8_t *buf = dx_malloc(16 + 4 * N);
    fill_tokens(t, N, 7);
    t[3] = -1; /* negative ids hash as their two's-complement bytes */
    kv_hash prev = H(0x0102030405060708ull, 0x1112131415161718ull);
    static const size_t lens[] = {0, 1, 255, 256, 257, 512, 513, N};
    for (size_t li = 0; li < DX_ARRAY_LEN(lens); li++) {
        size_t n = lens[li];
        for (int j = 0; j < 8; j++) buf[j] = (uint8_t)(prev.lo >> (8 * j));
        for (int j = 0; j < 8; j++) buf[8 + j] = (uint8_t)(prev.hi >> (8 * j));
        for (size_t j = 0; j < 4 * n; j++)
            buf[16 + j] = (uint8_t)((uint32_t)t[j / 4] >> (8 * (j % 4)));
        XXH128_hash_t r = XXH3_128bits(buf, 16 + 4 * n);
        assert_true(kv_hash_eq(kv_hash_next(prev, t, n), H(r.low64, r.high64)));
    }
    assert_false(kv_hash_eq(kv_hash_next(prev, t, 0), kv_hash_next(prev, t, 1)));
    dx_free(buf);
    dx_free(t);
}

/* ---- prefix cache ------------------------------------------------------ */

static void test_insert_lookup(void **state)
{
    (void)state;
    kv_pool *p = make_pool(8);
    int32_t x = alloc1(p), y = alloc1(p), other = -5;
    kv_hash h1 = H(1, 2), h2 = H(3, 4), got;
    assert_int_equal(kv_pool_lookup(p, h1), -1);
    assert_false(kv_pool_block_hash(p, x, &got));
    assert_int_equal(kv_pool_insert(p, x, h1, &other), 0);
    assert_int_equal(other, -5);
    assert_int_equal(kv_pool_insert(p, x, h1, NULL), 0); /* same block, same hash */
    assert_int_equal(kv_pool_insert(p, y, h1, &other), DX_EEXIST);
    assert_int_equal(other, x);
    assert_int_equal(kv_pool_insert(p, y, h1, NULL), DX_EEXIST);
    assert_false(kv_pool_block_hash(p, y, &got));
    assert_int_equal(kv_pool_insert(p, x, h2, NULL), DX_EINVAL);
    assert_non_null(strstr(dx_errmsg(), "different hash"));
    assert_int_equal(kv_pool_insert(p, 8, h2, NULL), DX_EINVAL);
    assert_int_equal(kv_pool_insert(p, -1, h2, NULL), DX_EINVAL);
    assert_int_equal(kv_pool_lookup(p, h1), x);
    assert_int_equal(kv_pool_lookup(p, h2), -1);
    assert_int_equal(kv_pool_lookup(p, H(1, 3)), -1); /* both halves matter */
    assert_true(kv_pool_block_hash(p, x, &got));
    assert_true(kv_hash_eq(got, h1));
    expect_state(p, 6, 0, 2);
    kv_pool_unref(p, x); /* hashed -> cached, still findable */
    expect_state(p, 6, 1, 1);
    assert_int_equal(kv_pool_lookup(p, h1), x);
    assert_int_equal(kv_pool_refcount(p, x), 0);         /* lookup takes no reference */
    assert_int_equal(kv_pool_insert(p, x, h1, NULL), 0); /* no-op on a cached block too */
    expect_state(p, 6, 1, 1);
    kv_pool_destroy(p);
}

/* publish: registers a fresh block, or swaps it for the cached or used
 * block that already holds the hash (ours goes back to the free list). */
static void test_publish(void **state)
{
    (void)state;
    kv_pool *p = make_pool(8);
    int32_t x = alloc1(p), y = alloc1(p), z = alloc1(p), got_id;
    kv_hash h1 = H(1, 2), h2 = H(3, 4), got;
    got_id = x;
    assert_int_equal(kv_pool_publish(p, &got_id, h1), 0);
    assert_int_equal(got_id, x);
    assert_int_equal(kv_pool_publish(p, &got_id, h1), 0); /* again: no-op */
    got_id = y;
    assert_int_equal(kv_pool_publish(p, &got_id, h1), 1); /* x holds h1 and is in use */
    assert_int_equal(got_id, x);
    assert_int_equal(kv_pool_refcount(p, x), 2);
    expect_state(p, 6, 0, 2); /* y went back to free */
    kv_pool_unref(p, x);
    kv_pool_unref(p, x); /* x cached now */
    expect_state(p, 6, 1, 1);
    got_id = z;
    assert_int_equal(kv_pool_publish(p, &got_id, h1), 1); /* a cached holder is revived */
    assert_int_equal(got_id, x);
    assert_int_equal(kv_pool_refcount(p, x), 1);
    expect_state(p, 7, 0, 1);
    int32_t w = alloc1(p);
    got_id = w;
    assert_int_equal(kv_pool_publish(p, &got_id, h2), 0);
    assert_true(kv_pool_block_hash(p, w, &got));
    assert_true(kv_hash_eq(got, h2));
    kv_pool_unref(p, x);
    kv_pool_unref(p, w);
    expect_state(p, 6, 2, 0);
    kv_pool_destroy(p);
}

/* Compute and register the blocks of tokens[0..n) in p, then release them. */
static size_t cache_tokens(kv_pool *p, const int32_t *t, size_t n, kv_hash *chain, int32_t *ids)
{
    size_t nb = kv_pool_hash_chain(p, t, n, chain);
    assert_int_equal(kv_pool_alloc_n(p, nb, ids), 0);
    for (size_t i = 0; i < nb; i++) assert_int_equal(kv_pool_insert(p, ids[i], chain[i], NULL), 0);
    for (size_t i = 0; i < nb; i++) kv_pool_unref(p, ids[i]);
    return nb;
}

static void test_match_prefix(void **state)
{
    (void)state;
    kv_pool *p = make_pool(16);
    int32_t t[24], q[26], ids[6], got[7];
    kv_hash chain[6], qchain[6];
    fill_tokens(t, 24, 1);
    assert_int_equal(cache_tokens(p, t, 24, chain, ids), 6);
    expect_state(p, 10, 6, 0);

    /* a request sharing 3 blocks and then diverging */
    memcpy(q, t, sizeof t);
    q[13] ^= 1;
    size_t nq = kv_pool_hash_chain(p, q, 26, qchain);
    assert_int_equal(nq, 6);
    assert_int_equal(kv_pool_match_prefix(p, qchain, nq, got), 3);
    for (int i = 0; i < 3; i++) {
        assert_int_equal(got[i], ids[i]);
        assert_int_equal(kv_pool_refcount(p, ids[i]), 1);
    }
    assert_int_equal(kv_pool_refcount(p, ids[3]), 0);
    expect_state(p, 10, 3, 3);
    kv_pool_stats s;
    kv_pool_get_stats(p, &s);
    assert_int_equal(s.hits, 3);
    assert_int_equal(s.misses, 3);

    /* the full prompt again: matches everything, shared blocks get ref 2 */
    assert_int_equal(kv_pool_match_prefix(p, chain, 6, got), 6);
    assert_int_equal(kv_pool_refcount(p, ids[0]), 2);
    assert_int_equal(kv_pool_refcount(p, ids[5]), 1);
    expect_state(p, 10, 0, 6);
    for (int i = 0; i < 3; i++) kv_pool_unref(p, got[i]);
    for (int i = 0; i < 6; i++) kv_pool_unref(p, got[i]);
    expect_state(p, 10, 6, 0);

    /* matching stops at the first hole even if later blocks are cached */
    kv_pool_forget(p, ids[1]);
    expect_state(p, 11, 5, 0);
    assert_int_equal(kv_pool_match_prefix(p, chain, 6, got), 1);
    assert_int_equal(got[0], ids[0]);
    assert_int_equal(kv_pool_match_prefix(p, chain, 0, got), 0);
    kv_pool_get_stats(p, &s);
    assert_int_equal(s.hits, 3 + 6 + 1);
    assert_int_equal(s.misses, 3 + 0 + 5);
    kv_pool_unref(p, got[0]);
    expect_state(p, 11, 5, 0);
    kv_pool_destroy(p);
}

static void test_forget(void **state)
{
    (void)state;
    kv_pool *p = make_pool(4);
    int32_t x = alloc1(p), y = alloc1(p);
    assert_int_equal(kv_pool_insert(p, x, H(9, 9), NULL), 0);
    assert_int_equal(kv_pool_insert(p, y, H(8, 8), NULL), 0);
    kv_pool_forget(p, x); /* in use: keeps its reference, loses its hash */
    assert_int_equal(kv_pool_refcount(p, x), 1);
    assert_int_equal(kv_pool_lookup(p, H(9, 9)), -1);
    expect_state(p, 2, 0, 2);
    kv_pool_unref(p, x); /* unhashed now: free, not cached */
    expect_state(p, 3, 0, 1);
    kv_pool_unref(p, y);
    expect_state(p, 3, 1, 0);
    kv_pool_forget(p, y); /* cached: straight to free */
    expect_state(p, 4, 0, 0);
    kv_pool_forget(p, y); /* nothing to forget */
    expect_state(p, 4, 0, 0);
    /* a forgotten block's hash can be registered again elsewhere */
    int32_t z = alloc1(p);
    assert_int_equal(kv_pool_insert(p, z, H(8, 8), NULL), 0);
    assert_int_equal(kv_pool_lookup(p, H(8, 8)), z);
    kv_pool_unref(p, z);
    kv_pool_destroy(p);
}

static void test_evict_n(void **state)
{
    (void)state;
    kv_pool *p = make_pool(8);
    int32_t t[20], ids[5];
    kv_hash chain[5];
    fill_tokens(t, 20, 3);
    cache_tokens(p, t, 20, chain, ids);
    expect_state(p, 3, 5, 0);
    assert_int_equal(kv_pool_evict(p, 2), 2);
    expect_state(p, 5, 3, 0);
    assert_int_equal(kv_pool_lookup(p, chain[0]), -1);
    assert_int_equal(kv_pool_lookup(p, chain[1]), -1);
    assert_int_equal(kv_pool_lookup(p, chain[2]), ids[2]);
    int32_t held;
    assert_int_equal(kv_pool_match_prefix(p, &chain[2], 1, &held), 1); /* not evictable */
    assert_int_equal(kv_pool_evict(p, 100), 2);
    expect_state(p, 7, 0, 1);
    assert_int_equal(kv_pool_lookup(p, chain[2]), ids[2]);
    assert_int_equal(kv_pool_evict(p, 1), 0);
    kv_pool_stats s;
    kv_pool_get_stats(p, &s);
    assert_int_equal(s.evictions, 4);
    kv_pool_unref(p, held);
    kv_pool_destroy(p);
}

typedef struct {
    int visits, stop_after;
    uint32_t ref_sum;
    int32_t ids[8];
} visit_state;

static int visit(void *user, int32_t id, kv_hash h, uint32_t ref)
{
    visit_state *v = user;
    assert_int_equal(h.lo, 50 + (uint64_t)id);
    v->ids[v->visits++] = id;
    v->ref_sum += ref;
    return v->visits == v->stop_after;
}

static void test_foreach_cached(void **state)
{
    (void)state;
    kv_pool *p = make_pool(8);
    int32_t ids[5];
    assert_int_equal(kv_pool_alloc_n(p, 5, ids), 0);
    for (int i = 0; i < 4; i++)
        assert_int_equal(kv_pool_insert(p, ids[i], H(50 + ids[i], 0), NULL), 0);
    kv_pool_unref(p, ids[1]);
    kv_pool_ref(p, ids[2]);
    visit_state v = {0};
    kv_pool_foreach_cached(p, visit, &v);
    assert_int_equal(v.visits, 4); /* cached and in-use hashed blocks, not unhashed ids[4] */
    assert_int_equal(v.ref_sum, 1 + 0 + 2 + 1);
    for (int i = 0; i < 4; i++) assert_int_equal(v.ids[i], ids[i]);
    v = (visit_state){.stop_after = 2};
    kv_pool_foreach_cached(p, visit, &v);
    assert_int_equal(v.visits, 2);
    kv_pool_destroy(p);
}

/* The index under heavy collisions: every hash lands in the last slots of the
 * table, so probe runs are long and wrap around, and deletions must shift
 * entries back correctly.  A shadow model checks lookups after each step. */
static void test_index_collisions(void **state)
{
    (void)state;
    kv_pool *p = make_pool(32); /* 64 index slots */
    int32_t owner[200];
    for (int k = 0; k < 200; k++) owner[k] = -1;
    int32_t held[32];
    int n_held = 0;
    srand(42);
    for (int step = 0; step < 4000; step++) {
        int op = rand() % 4, k = rand() % 200;
        kv_hash h = H(60 + (uint64_t)(k % 6), (uint64_t)k); /* home slots 60..65 -> wrap */
        if (op == 0 && n_held < 32) {
            int32_t id;
            if (kv_pool_alloc(p, &id) == 0) {
                held[n_held++] = id;
                if (owner[k] < 0 && kv_pool_insert(p, id, h, NULL) == 0) owner[k] = id;
            }
        } else if (op == 1 && n_held > 0) {
            int i = rand() % n_held;
            kv_pool_unref(p, held[i]);
            held[i] = held[--n_held];
        } else if (op == 2 && owner[k] >= 0) {
            kv_pool_forget(p, owner[k]);
        } else if (op == 3) {
            kv_pool_evict(p, 1);
        }
        /* refresh the model: a hash is gone once its block lost it */
        for (int j = 0; j < 200; j++) {
            kv_hash hj = H(60 + (uint64_t)(j % 6), (uint64_t)j), bh;
            if (owner[j] >= 0 && !(kv_pool_block_hash(p, owner[j], &bh) && kv_hash_eq(bh, hj)))
                owner[j] = -1;
            assert_int_equal(kv_pool_lookup(p, hj), owner[j]);
        }
        if (kv_pool_check(p)) fail_msg("step %d: %s", step, dx_errmsg());
    }
    while (n_held > 0) kv_pool_unref(p, held[--n_held]);
    kv_pool_stats s;
    kv_pool_get_stats(p, &s);
    assert_int_equal(s.n_used, 0);
    kv_pool_destroy(p);
}

/* ---- concurrency ------------------------------------------------------- */

typedef struct {
    kv_pool *p;
    uint32_t tid;
    int failures;
} worker_arg;

/* Holds up to 8 blocks of its own; allocates, shares (ref), registers and
 * re-finds (match_prefix) them, and releases them, with the other worker
 * doing the same on its own blocks. */
static void *worker(void *arg)
{
    worker_arg *w = arg;
    int32_t held[8];
    int n = 0;
    unsigned seed = w->tid;
    kv_hash last = H(0, 0);
    for (uint32_t it = 0; it < 20000; it++) {
        int op = rand_r(&seed) % 4;
        if (op == 0 && n < 8) {
            int32_t id;
            if (kv_pool_alloc(w->p, &id) != 0)
                w->failures++;
            else
                held[n++] = id;
        } else if (op == 1 && n > 0) {
            int32_t id = held[rand_r(&seed) % n];
            kv_pool_ref(w->p, id);
            if (kv_pool_refcount(w->p, id) < 2) w->failures++;
            kv_pool_unref(w->p, id);
        } else if (op == 2 && n > 0) {
            kv_hash h = H(it, ((uint64_t)w->tid << 32) | it);
            int32_t id = held[--n];
            if (kv_pool_insert(w->p, id, h, NULL) == 0) last = h;
            kv_pool_unref(w->p, id);
        } else if (op == 3 && n < 8) {
            int32_t id;
            if (kv_pool_match_prefix(w->p, &last, 1, &id) == 1) held[n++] = id;
        }
    }
    while (n > 0) kv_pool_unref(w->p, held[--n]);
    return NULL;
}

static void test_concurrent(void **state)
{
    (void)state;
    kv_pool *p = make_pool(24); /* > 2 x 8 held: alloc never fails */
    worker_arg w[2] = {{.p = p, .tid = 1}, {.p = p, .tid = 2}};
    pthread_t th[2];
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_create(&th[i], NULL, worker, &w[i]), 0);
    for (int i = 0; i < 2; i++) assert_int_equal(pthread_join(th[i], NULL), 0);
    assert_int_equal(w[0].failures + w[1].failures, 0);
    kv_pool_stats s;
    kv_pool_get_stats(p, &s);
    assert_int_equal(s.n_used, 0);
    assert_int_equal(s.n_free + s.n_cached, 24);
    assert_true(s.n_cached > 0);
    assert_true(s.hits > 0);
    assert_int_equal(kv_pool_check(p), 0);
    kv_pool_destroy(p);
}

/* ---- bad input and broken invariants ----------------------------------- */

typedef struct {
    const char *field; /* must appear in the message */
    void (*edit)(kv_pool_config *c);
} bad_cfg;

static void e_layer(kv_pool_config *c)
{
    c->n_layer = 0;
}
static void e_heads(kv_pool_config *c)
{
    c->n_kv_head = 0;
}
static void e_dim(kv_pool_config *c)
{
    c->head_dim = 0;
}
static void e_bs(kv_pool_config *c)
{
    c->block_size = 1025;
}
static void e_q8(kv_pool_config *c)
{
    c->dtype = DX_Q8_0; /* head_dim 8: q8_0 scales cover 32 */
}
static void e_dtype(kv_pool_config *c)
{
    c->dtype = 77;
}
static void e_nothing(kv_pool_config *c)
{
    c->n_blocks = 0, c->pool_bytes = 0;
}
static void e_small(kv_pool_config *c)
{
    c->n_blocks = 0, c->pool_bytes = 511;
}
static void e_many(kv_pool_config *c)
{
    c->n_blocks = (1u << 30) + 1;
}
static void e_hook(kv_pool_config *c)
{
    c->alloc = test_hook_alloc;
}
static void e_block_ovf(kv_pool_config *c)
{
    c->n_layer = c->n_kv_head = c->head_dim = UINT32_MAX;
    c->block_size = 1024;
}
static void e_arena_ovf(kv_pool_config *c)
{
    c->n_layer = c->n_kv_head = 1u << 10;
    c->head_dim = 1u << 20;
    c->block_size = 1024;
    c->dtype = DX_F32;
    c->n_blocks = 1u << 30;
}

static void test_invalid_configs(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    static const bad_cfg cases[] = {
        {"n_layer", e_layer},
        {"n_kv_head", e_heads},
        {"head_dim", e_dim},
        {"block_size", e_bs},
        {"head_dim 8: a q8_0 KV cache needs a multiple of 32", e_q8},
        {"dtype", e_dtype},
        {"pool_bytes", e_nothing},
        {"pool_bytes", e_small},
        {"n_blocks", e_many},
        {"release", e_hook},
        {"overflows", e_block_ovf},
        {"n_blocks", e_arena_ovf},
    };
    for (size_t i = 0; i < DX_ARRAY_LEN(cases); i++) {
        kv_pool_config c = small_cfg(8);
        cases[i].edit(&c);
        kv_pool *p = (kv_pool *)(uintptr_t)16; /* must be reset to NULL */
        dx_err_clear();
        assert_int_equal(kv_pool_create(&c, &p), DX_EINVAL);
        assert_null(p);
        if (!strstr(dx_errmsg(), cases[i].field))
            fail_msg("case %zu: message \"%s\" lacks \"%s\"", i, dx_errmsg(), cases[i].field);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
}

/* Runs fn in a child; it must die by abort (DX_ASSERT). */
static void expect_abort(void (*fn)(kv_pool *p))
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        if (!freopen("/dev/null", "w", stderr)) _exit(1);
        kv_pool *p = make_pool(4);
        fn(p);
        _exit(0);
    }
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFSIGNALED(st));
    assert_int_equal(WTERMSIG(st), SIGABRT);
}

static void double_unref(kv_pool *p)
{
    int32_t id = alloc1(p);
    kv_pool_unref(p, id);
    kv_pool_unref(p, id);
}

static void ref_free_block(kv_pool *p)
{
    kv_pool_ref(p, 2);
}
static void unref_bad_id(kv_pool *p)
{
    kv_pool_unref(p, 4);
}
static void insert_free_block(kv_pool *p)
{
    kv_pool_insert(p, 1, H(1, 1), NULL);
}

static void test_broken_invariants_abort(void **state)
{
    (void)state;
    expect_abort(double_unref);
    expect_abort(ref_free_block);
    expect_abort(unref_bad_id);
    expect_abort(insert_free_block);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_alloc_refcount),
        cmocka_unit_test(test_layout),
        cmocka_unit_test(test_populate),
        cmocka_unit_test(test_alloc_hook),
        cmocka_unit_test(test_create_out_of_memory),
        cmocka_unit_test(test_lru_order),
        cmocka_unit_test(test_exhaustion),
        cmocka_unit_test(test_hash_chain),
        cmocka_unit_test(test_hash_long_runs),
        cmocka_unit_test(test_insert_lookup),
        cmocka_unit_test(test_publish),
        cmocka_unit_test(test_match_prefix),
        cmocka_unit_test(test_forget),
        cmocka_unit_test(test_evict_n),
        cmocka_unit_test(test_foreach_cached),
        cmocka_unit_test(test_index_collisions),
        cmocka_unit_test(test_concurrent),
        cmocka_unit_test(test_invalid_configs),
        cmocka_unit_test(test_broken_invariants_abort),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
