/* Unit tests for src/base: errors, allocator, buffers, dtype conversions,
 * UTF-8, the list. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <math.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_buf.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "base/dx_list.h"
#include "base/dx_rng.h"
#include "base/dx_utf8.h"

static void test_err_messages(void **state)
{
    (void)state;
    assert_string_equal(dx_strerror(DX_ENOMEM), "out of memory");
    assert_string_equal(dx_strerror(12345), "unknown error");
    int rc = dx_errf(DX_EFORMAT, "%s: offset %d: bad", "f.gguf", 7);
    assert_int_equal(rc, DX_EFORMAT);
    assert_string_equal(dx_errmsg(), "f.gguf: offset 7: bad");
    dx_err_wrap(rc, "loading %s", "model");
    assert_string_equal(dx_errmsg(), "loading model: f.gguf: offset 7: bad");
    assert_int_equal(dx_errcode(), DX_EFORMAT);
    /* one call for "where: what" */
    assert_int_equal(dx_errp(DX_EINVAL, "jinja: line 3, column 4", "unknown filter '%s'", "zz"),
                     DX_EINVAL);
    assert_string_equal(dx_errmsg(), "jinja: line 3, column 4: unknown filter 'zz'");
    assert_int_equal(dx_errcode(), DX_EINVAL);
    dx_errp(DX_EIO, NULL, "plain %d", 1);
    assert_string_equal(dx_errmsg(), "plain 1");
    dx_errp(DX_EIO, "", "plain %d", 2);
    assert_string_equal(dx_errmsg(), "plain 2");
    /* no DX code reads as -1, the value a stray `return -1` would give */
    assert_false(dx_err_known(-1));
    assert_true(dx_err_known(DX_EAGAIN));
}

/* Encoding every code point and decoding it again gives it back; past
 * U+10FFFF there is nothing to encode. */
static void test_utf8_encode(void **state)
{
    (void)state;
    uint8_t u[4];
    for (uint32_t cp = 0; cp <= 0x10FFFF; cp++) {
        size_t n = dx_utf8_encode(cp, u);
        assert_int_equal(n, cp < 0x80 ? 1 : cp < 0x800 ? 2 : cp < 0x10000 ? 3 : 4);
        uint32_t back = 0;
        if (cp >= 0xD800 && cp <= 0xDFFF) {
            assert_int_equal(dx_utf8_decode(u, n, &back), 0); /* encoded, but not strict */
            continue;
        }
        assert_int_equal(dx_utf8_decode(u, n, &back), n);
        assert_int_equal(back, cp);
    }
    assert_int_equal(dx_utf8_encode(0x110000, u), 0);
    dx_buf b;
    dx_buf_init(&b, 0);
    assert_int_equal(dx_utf8_put(&b, 0x20AC), 0);
    assert_int_equal(dx_utf8_put(&b, 'x'), 0);
    assert_int_equal(dx_utf8_put(&b, 0x110000), DX_EINVAL);
    assert_int_equal(b.len, 4);
    assert_memory_equal(b.data, "\xe2\x82\xacx", 4);
    dx_buf_free(&b);
}

typedef struct {
    int v;
    dx_list link;
} item;

static int list_values(const dx_list *h, int *out, int cap)
{
    int n = 0;
    DX_LIST_FOR_EACH(it, h)
    {
        if (n < cap) out[n] = DX_LIST_ENTRY(it, item, link)->v;
        n++;
    }
    return n;
}

static void test_list(void **state)
{
    (void)state;
    dx_list h;
    dx_list_init(&h);
    assert_true(dx_list_empty(&h));
    assert_null(dx_list_first(&h));
    assert_null(dx_list_last(&h));
    item it[4] = {{.v = 0}, {.v = 1}, {.v = 2}, {.v = 3}};
    assert_false(dx_list_linked(&it[0].link)); /* zeroed: not linked */
    dx_list_remove(&it[0].link);               /* a no-op */
    dx_list_push_back(&h, &it[1].link);
    dx_list_push_back(&h, &it[2].link);
    dx_list_push_front(&h, &it[0].link);
    dx_list_push_back(&h, &it[3].link);
    int v[8];
    assert_int_equal(list_values(&h, v, 8), 4);
    for (int i = 0; i < 4; i++) assert_int_equal(v[i], i);
    assert_true(dx_list_linked(&it[2].link));
    dx_list_move_front(&h, &it[2].link); /* 2 0 1 3 */
    dx_list_move_back(&h, &it[0].link);  /* 2 1 3 0 */
    assert_int_equal(list_values(&h, v, 8), 4);
    assert_int_equal(v[0], 2);
    assert_int_equal(v[1], 1);
    assert_int_equal(v[2], 3);
    assert_int_equal(v[3], 0);
    assert_ptr_equal(DX_LIST_ENTRY(dx_list_first(&h), item, link), &it[2]);
    assert_ptr_equal(DX_LIST_ENTRY(dx_list_last(&h), item, link), &it[0]);
    /* removing while iterating */
    DX_LIST_FOR_EACH_SAFE(x, tmp, &h)
    {
        if (DX_LIST_ENTRY(x, item, link)->v % 2) dx_list_remove(x);
    }
    assert_int_equal(list_values(&h, v, 8), 2);
    assert_int_equal(v[0], 2);
    assert_int_equal(v[1], 0);
    assert_false(dx_list_linked(&it[1].link));
    dx_list_remove(&it[1].link); /* removed twice: still a no-op */
    dx_list_remove(&it[2].link);
    dx_list_remove(&it[0].link);
    assert_true(dx_list_empty(&h));
}

static void test_alloc_counts_and_faults(void **state)
{
    (void)state;
    size_t before = dx_alloc_live_bytes();
    void *p = dx_malloc(100);
    assert_non_null(p);
    assert_int_equal(dx_alloc_live_bytes(), before + 100);
    p = dx_realloc(p, 300);
    assert_int_equal(dx_alloc_live_bytes(), before + 300);
    dx_free(p);
    assert_int_equal(dx_alloc_live_bytes(), before);
    assert_null(dx_calloc(SIZE_MAX / 2, 4));
    dx_alloc_fail_after(2, 0);
    void *a = dx_malloc(8), *b = dx_malloc(8), *c = dx_malloc(8);
    assert_non_null(a);
    assert_null(b);
    assert_non_null(c);
    dx_free(a);
    dx_free(c);
    void *al = dx_aligned_alloc(64, 1000);
    assert_non_null(al);
    assert_int_equal((uintptr_t)al % 64, 0);
    dx_aligned_free(al);
    assert_int_equal(dx_alloc_live_bytes(), before);
}

/* A meter counts a thread's allocations as they are made, refuses the one
 * that would pass its room (a failed allocation like any other), gives
 * back what is freed, and keep/put hand what is left to another owner. */
static void test_alloc_meter(void **state)
{
    (void)state;
    dx_alloc_meter m;
    atomic_init(&m.used, 0);
    atomic_init(&m.room, 1000);
    size_t failed = dx_alloc_failed_count();
    dx_alloc_meter_begin(&m);
    void *a = dx_malloc(600);
    assert_non_null(a);
    assert_int_equal(atomic_load(&m.used), 600);
    assert_null(dx_malloc(500)); /* 1100 > 1000 */
    assert_int_equal(dx_alloc_meter_refused(), 1);
    assert_int_equal(dx_alloc_failed_count(), failed + 1);
    assert_int_equal(atomic_load(&m.used), 600); /* nothing counted for it */
    void *b = dx_realloc(a, 900);                /* grows by 300: fits */
    assert_non_null(b);
    assert_int_equal(atomic_load(&m.used), 900);
    assert_null(dx_realloc(b, 1200));
    dx_free(b);
    assert_int_equal(atomic_load(&m.used), 0);
    void *c = dx_calloc(10, 40);
    assert_non_null(c);
    long long kept = dx_alloc_meter_keep(); /* stays counted after the thread stops */
    assert_int_equal(kept, 400);
    assert_int_equal(atomic_load(&m.used), 400);
    void *d = dx_malloc(5000); /* no longer metered */
    assert_non_null(d);
    dx_free(d);
    dx_free(c);
    dx_alloc_meter_put(&m, kept);
    assert_int_equal(atomic_load(&m.used), 0);
    dx_alloc_meter_begin(&m); /* a thread that ends counts nothing */
    void *e = dx_malloc(100);
    dx_alloc_meter_end();
    assert_int_equal(atomic_load(&m.used), 0);
    dx_free(e);
}

static void test_buf_limits(void **state)
{
    (void)state;
    dx_buf b;
    dx_buf_init(&b, 10);
    assert_int_equal(dx_buf_puts(&b, "hello"), 0);
    assert_int_equal(dx_buf_printf(&b, "%d", 1234), 0);
    assert_string_equal(b.data, "hello1234");
    assert_int_equal(dx_buf_puts(&b, "xx"), DX_ETOOBIG);
    assert_int_equal(b.len, 9);
    dx_buf_consume(&b, 5);
    assert_string_equal(b.data, "1234");
    dx_buf_free(&b);
}

static void test_f16_bf16_roundtrip(void **state)
{
    (void)state;
    /* every f16 bit pattern converts to f32 and back unchanged (NaNs stay NaN) */
    for (uint32_t h = 0; h < 65536; h++) {
        float f = dx_f16_to_f32((uint16_t)h);
        uint16_t back = dx_f32_to_f16(f);
        if (isnan(f))
            assert_true(isnan(dx_f16_to_f32(back)));
        else
            assert_int_equal(back, h);
    }
    assert_int_equal(dx_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(dx_f32_to_f16(65519.0f), 0x7bff);
    assert_true(dx_f16_to_f32(0x0001) == ldexpf(1.0f, -24));
    /* ties to even: 1 + 2^-11 is halfway between 1 and 1+2^-10 */
    assert_int_equal(dx_f32_to_f16(1.0f + ldexpf(1.0f, -11)), 0x3c00);
    assert_int_equal(dx_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(dx_f32_to_bf16(dx_u32_as_f32(0x3f808000u)), 0x3f80); /* tie, even */
    assert_int_equal(dx_f32_to_bf16(dx_u32_as_f32(0x3f818000u)), 0x3f82); /* tie, odd up */
}

static void test_q8_0(void **state)
{
    (void)state;
    float x[64], y[64];
    for (int i = 0; i < 64; i++) x[i] = sinf((float)i) * 3.0f;
    dx_block_q8_0 q[2];
    dx_f32_to_q8_0_row(x, q, 64);
    dx_q8_0_to_f32_row(q, y, 64);
    for (int i = 0; i < 64; i++) assert_true(fabsf(x[i] - y[i]) < 3.0f / 127.0f);
    assert_int_equal(dx_dtype_row_bytes(DX_Q8_0, 64), 68);
    assert_int_equal(dx_dtype_row_bytes(DX_Q8_0, 33), 0);
    enum dx_dtype t;
    assert_int_equal(dx_dtype_parse("bf16", &t), 0);
    assert_int_equal(t, DX_BF16);
    assert_int_equal(dx_dtype_parse("q4_0", &t), 0);
    assert_int_equal(t, DX_Q4_0);
    assert_int_equal(dx_dtype_parse("q8_K", &t), DX_EINVAL); /* known to GGUF, not run here */
}

static void test_utf8(void **state)
{
    (void)state;
    static const struct {
        const char *s;
        size_t len;
    } valid[] = {{"a", 1},
                 {"\xc2\x80", 2},
                 {"\xdf\xbf", 2},
                 {"\xe0\xa0\x80", 3},
                 {"\xed\x9f\xbf", 3},
                 {"\xee\x80\x80", 3},
                 {"\xf0\x90\x80\x80", 4},
                 {"\xf4\x8f\xbf\xbf", 4}};
    for (size_t i = 0; i < DX_ARRAY_LEN(valid); i++)
        assert_int_equal(dx_utf8_seq_len((const uint8_t *)valid[i].s, valid[i].len), valid[i].len);
    static const char *const invalid[] = {
        "\x80",         "\xc0\x80",         "\xc1\xbf",         "\xe0\x9f\xbf",
        "\xed\xa0\x80", "\xf0\x8f\xbf\xbf", "\xf4\x90\x80\x80", "\xf5\x80\x80\x80",
        "\xff"};
    for (size_t i = 0; i < DX_ARRAY_LEN(invalid); i++)
        assert_int_equal(dx_utf8_seq_len((const uint8_t *)invalid[i], strlen(invalid[i])), 0);
    /* decoding: the code point of each valid sequence, nothing for the rest */
    static const uint32_t cps[] = {'a', 0x80, 0x7ff, 0x800, 0xd7ff, 0xe000, 0x10000, 0x10ffff};
    for (size_t i = 0; i < DX_ARRAY_LEN(valid); i++) {
        uint32_t cp = 0;
        assert_int_equal(dx_utf8_decode((const uint8_t *)valid[i].s, valid[i].len, &cp),
                         valid[i].len);
        assert_int_equal(cp, cps[i]);
    }
    for (size_t i = 0; i < DX_ARRAY_LEN(invalid); i++) {
        uint32_t cp = 7;
        assert_int_equal(dx_utf8_decode((const uint8_t *)invalid[i], strlen(invalid[i]), &cp), 0);
        assert_int_equal(cp, 7);
    }
    uint32_t cp0 = 7;
    assert_int_equal(dx_utf8_decode((const uint8_t *)"", 0, &cp0), 0);
    /* truncated sequences: invalid as they stand, held back as a tail */
    const uint8_t euro[] = {'x', 0xe2, 0x82, 0xac};
    assert_int_equal(dx_utf8_seq_len(euro + 1, 2), 0);
    assert_int_equal(dx_utf8_incomplete_tail(euro, 3), 2);
    assert_int_equal(dx_utf8_incomplete_tail(euro, 2), 1);
    assert_int_equal(dx_utf8_incomplete_tail(euro, 4), 0);
    const uint8_t sur[] = {'x', 0xed, 0xa0}; /* a surrogate can never complete */
    assert_int_equal(dx_utf8_incomplete_tail(sur, 3), 0);
    const uint8_t lone[] = {'x', 0x80};
    assert_int_equal(dx_utf8_incomplete_tail(lone, 2), 0);
    dx_buf b;
    dx_buf_init(&b, 0);
    const uint8_t mixed[] = {'a', 0xff, 0xc3, 0xa9, 0xe2, 0x82, 'b'};
    assert_int_equal(dx_utf8_sanitize(mixed, sizeof mixed, &b), 0);
    assert_string_equal(b.data, "a\xef\xbf\xbd\xc3\xa9\xef\xbf\xbd\xef\xbf\xbd"
                                "b");
    dx_buf_free(&b);
}

/* The generator's output is part of every synthetic model: pin it. */
static void test_rng_pinned(void **state)
{
    (void)state;
    dx_rng r;
    dx_rng_seed(&r, 42);
    uint64_t a = dx_rng_next(&r), c = dx_rng_next(&r);
    dx_rng_seed(&r, 42);
    assert_true(dx_rng_next(&r) == a && dx_rng_next(&r) == c);
    uint64_t x = 0;
    assert_true(dx_splitmix64(&x) == 0xe220a8397b1dcdafull); /* splitmix64's first output from 0 */
    double u = dx_rng_uniform(&r);
    assert_true(u >= 0.0 && u < 1.0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_err_messages), cmocka_unit_test(test_alloc_counts_and_faults),
        cmocka_unit_test(test_buf_limits),   cmocka_unit_test(test_f16_bf16_roundtrip),
        cmocka_unit_test(test_q8_0),         cmocka_unit_test(test_utf8),
        cmocka_unit_test(test_utf8_encode),  cmocka_unit_test(test_list),
        cmocka_unit_test(test_rng_pinned),   cmocka_unit_test(test_alloc_meter),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
