/* Unit tests for src/model/gguf: writer/reader round trips, every hostile
 * input path the reader guards against (each named), leaks and OOM.
 *
 * Hostile files are built byte by byte with a small raw builder, since the
 * writer refuses to produce them.  Every failed open is checked through
 * expect_fail(), which also asserts that nothing leaked.
 *
 * With GGUF_CORPUS_DIR set, test_corpus_seeds also writes the fuzz seed corpus
 * (tests/fuzz/corpus/gguf/) there. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/dx_alloc.h"
#include "base/dx_dtype.h"
#include "base/dx_err.h"
#include "model/gguf.h"

/* ------------------------------------------------------------------ */
/* Raw builder                                                         */

typedef struct {
    uint8_t b[8192];
    size_t n;
} raw;

static void r_bytes(raw *r, const void *p, size_t n)
{
    assert_true(r->n + n <= sizeof r->b);
    memcpy(r->b + r->n, p, n);
    r->n += n;
}
static void r_u8(raw *r, uint8_t v)
{
    r_bytes(r, &v, 1);
}
static void r_u32(raw *r, uint32_t v)
{
    r_bytes(r, &v, 4);
}
static void r_u64(raw *r, uint64_t v)
{
    r_bytes(r, &v, 8);
}
static void r_str(raw *r, const char *s)
{
    r_u64(r, strlen(s));
    r_bytes(r, s, strlen(s));
}
static void r_header(raw *r, uint32_t version, uint64_t n_tensors, uint64_t n_kv)
{
    r->n = 0;
    r_u32(r, GGUF_MAGIC);
    r_u32(r, version);
    r_u64(r, n_tensors);
    r_u64(r, n_kv);
}
static void r_kv_u32(raw *r, const char *key, uint32_t v)
{
    r_str(r, key);
    r_u32(r, GGUF_T_UINT32);
    r_u32(r, v);
}
static void r_tensor(raw *r, const char *name, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                     uint64_t offset)
{
    r_str(r, name);
    r_u32(r, n_dims);
    for (uint32_t d = 0; d < n_dims; d++) r_u64(r, ne[d]);
    r_u32(r, type);
    r_u64(r, offset);
}
static void r_pad(raw *r, size_t align)
{
    while (r->n % align) r_u8(r, 0);
}
static void r_zeros(raw *r, size_t n)
{
    for (size_t i = 0; i < n; i++) r_u8(r, 0);
}

/* A file with one tensor of the given shape and `data` bytes of data. */
static void r_one_tensor(raw *r, uint32_t n_dims, const uint64_t *ne, uint32_t type,
                         uint64_t offset, size_t data)
{
    r_header(r, 3, 1, 0);
    r_tensor(r, "w", n_dims, ne, type, offset);
    r_pad(r, 32);
    r_zeros(r, data);
}

/* ------------------------------------------------------------------ */
/* Assertions                                                          */

static void assert_contains(const char *hay, const char *needle)
{
    if (!strstr(hay, needle)) fail_msg("message \"%s\" lacks \"%s\"", hay, needle);
}

/* Opens a private exact-size copy (so ASan sees any read past the end),
 * expects `code` and every phrase in the message, and no leak. */
static void expect_fail_n(const void *buf, size_t n, int code, const char *const *phrases)
{
    size_t live = dx_alloc_live_bytes();
    void *copy = malloc(n ? n : 1);
    memcpy(copy, buf, n);
    gguf_ctx *ctx = (gguf_ctx *)1;
    int rc = gguf_open_mem(copy, n, "bad.gguf", &ctx);
    if (rc != code) fail_msg("want %d got %d: %s", code, rc, dx_errmsg());
    assert_null(ctx);
    assert_contains(dx_errmsg(), "bad.gguf: ");
    for (; *phrases; phrases++) assert_contains(dx_errmsg(), *phrases);
    free(copy);
    assert_int_equal(dx_alloc_live_bytes(), live);
}
#define expect_fail(r, code, ...)                                                                  \
    expect_fail_n((r)->b, (r)->n, code, (const char *const[]){__VA_ARGS__, NULL})

static gguf_ctx *open_ok(const void *buf, size_t n)
{
    gguf_ctx *ctx = NULL;
    int rc = gguf_open_mem(buf, n, "good.gguf", &ctx);
    if (rc) fail_msg("open failed: %s", dx_errmsg());
    return ctx;
}

/* ------------------------------------------------------------------ */
/* A small model-like file                                             */

static const char *const k_tokens[] = {"<s>", "", "hello", "w\xc3\xb6rld", "a b"};
static const float k_scores[] = {0.5f, -1.0f, 2.25f};
static const int32_t k_types[] = {1, 2, 3, -4};
static const uint8_t k_u8s[] = {1, 2, 255};
static const uint8_t k_bools[] = {0, 1, 1};
static const uint64_t k_u64s[] = {0, UINT64_MAX};
static const double k_f64s[] = {1.5, -2.0e300};

typedef struct {
    const char *name;
    int type;
    uint32_t n_dims;
    uint64_t ne[4];
    uint64_t nbytes;
} tensor_spec;

static const tensor_spec k_tensors[] = {
    {"token_embd.weight", DX_F32, 1, {8}, 32},
    {"blk.0.attn_q.weight", DX_F16, 2, {4, 3}, 24},
    {"blk.0.ffn_up.weight", DX_BF16, 3, {2, 3, 5}, 60},
    {"output.weight", DX_Q8_0, 4, {64, 2, 1, 2}, 272},
};

static uint8_t pattern(size_t tensor, size_t j)
{
    return (uint8_t)(tensor * 31 + j * 7 + 1);
}

static int fill_pattern(void *user, void *dst, uint64_t n)
{
    size_t t = (size_t)(uintptr_t)user;
    for (uint64_t j = 0; j < n; j++) ((uint8_t *)dst)[j] = pattern(t, j);
    return 0;
}

/* Returns the first error, so that OOM tests can use it too. */
static int build_model(gguf_writer *w, int use_fill)
{
    int rc = 0;
    uint8_t data[300];
    rc = rc ? rc : gguf_w_set_str(w, "general.architecture", "llama");
    rc = rc ? rc : gguf_w_set_str(w, "general.name", "tiny");
    rc = rc ? rc : gguf_w_set_u32(w, "llama.block_count", 2);
    rc = rc ? rc : gguf_w_set_u64(w, "llama.context_length", 1ull << 40);
    rc = rc ? rc : gguf_w_set_i32(w, "test.i32", -7);
    rc = rc ? rc : gguf_w_set_f32(w, "llama.rope.freq_base", 10000.5f);
    rc = rc ? rc : gguf_w_set_bool(w, "test.flag", 1);
    rc = rc ? rc : gguf_w_set_arr_str(w, "tokenizer.ggml.tokens", k_tokens, 5);
    rc = rc ? rc : gguf_w_set_arr(w, "tokenizer.ggml.scores", GGUF_T_FLOAT32, k_scores, 3);
    rc = rc ? rc : gguf_w_set_arr(w, "tokenizer.ggml.token_type", GGUF_T_INT32, k_types, 4);
    rc = rc ? rc : gguf_w_set_arr(w, "test.u8s", GGUF_T_UINT8, k_u8s, 3);
    rc = rc ? rc : gguf_w_set_arr(w, "test.bools", GGUF_T_BOOL, k_bools, 3);
    rc = rc ? rc : gguf_w_set_arr(w, "test.u64s", GGUF_T_UINT64, k_u64s, 2);
    rc = rc ? rc : gguf_w_set_arr(w, "test.f64s", GGUF_T_FLOAT64, k_f64s, 2);
    rc = rc ? rc : gguf_w_set_arr(w, "test.empty", GGUF_T_INT16, NULL, 0);
    for (size_t i = 0; i < DX_ARRAY_LEN(k_tensors) && !rc; i++) {
        const tensor_spec *t = &k_tensors[i];
        if (use_fill) {
            rc = gguf_w_add_tensor_fill(w, t->name, t->type, t->n_dims, t->ne, fill_pattern,
                                        (void *)(uintptr_t)i);
        } else {
            fill_pattern((void *)(uintptr_t)i, data, t->nbytes);
            rc = gguf_w_add_tensor(w, t->name, t->type, t->n_dims, t->ne, data);
        }
    }
    return rc;
}

static void *write_model(uint32_t version, uint32_t alignment, int use_fill, size_t *size)
{
    gguf_writer *w = gguf_writer_create();
    assert_non_null(w);
    gguf_w_set_version(w, version);
    gguf_w_set_alignment(w, alignment);
    assert_int_equal(build_model(w, use_fill), 0);
    void *buf;
    assert_int_equal(gguf_w_write_mem(w, &buf, size), 0);
    gguf_writer_destroy(w);
    return buf;
}

static void check_str(gguf_str s, const char *want)
{
    assert_int_equal(s.len, strlen(want));
    if (s.len) assert_memory_equal(s.ptr, want, s.len);
}

static void verify_metadata(const gguf_ctx *ctx)
{
    gguf_str s;
    uint32_t u32;
    uint64_t u64, n;
    int64_t i64;
    float f;
    int b;
    assert_int_equal(gguf_get_str(ctx, "general.architecture", &s), 0);
    check_str(s, "llama");
    assert_int_equal(gguf_get_str(ctx, "general.name", &s), 0);
    check_str(s, "tiny");
    assert_int_equal(gguf_get_u32(ctx, "llama.block_count", &u32), 0);
    assert_int_equal(u32, 2);
    assert_int_equal(gguf_get_u64(ctx, "llama.context_length", &u64), 0);
    assert_true(u64 == 1ull << 40);
    assert_int_equal(gguf_get_i64(ctx, "test.i32", &i64), 0);
    assert_int_equal(i64, -7);
    assert_int_equal(gguf_get_f32(ctx, "llama.rope.freq_base", &f), 0);
    assert_true(f == 10000.5f);
    assert_int_equal(gguf_get_bool(ctx, "test.flag", &b), 0);
    assert_int_equal(b, 1);

    enum gguf_vtype elem;
    const void *data;
    assert_int_equal(gguf_get_arr(ctx, "tokenizer.ggml.tokens", &elem, &n, &data), 0);
    assert_int_equal(elem, GGUF_T_STRING);
    assert_int_equal(n, 5);
    for (uint64_t i = 0; i < n; i++) {
        assert_int_equal(gguf_get_arr_str(ctx, "tokenizer.ggml.tokens", i, &s), 0);
        check_str(s, k_tokens[i]);
    }
    assert_int_equal(gguf_get_arr(ctx, "tokenizer.ggml.scores", &elem, &n, &data), 0);
    assert_int_equal(elem, GGUF_T_FLOAT32);
    assert_int_equal(n, 3);
    assert_memory_equal(data, k_scores, sizeof k_scores);
    assert_int_equal(gguf_get_arr(ctx, "tokenizer.ggml.token_type", &elem, &n, &data), 0);
    assert_int_equal(elem, GGUF_T_INT32);
    assert_memory_equal(data, k_types, sizeof k_types);
    assert_int_equal(gguf_get_arr(ctx, "test.u8s", &elem, &n, &data), 0);
    assert_memory_equal(data, k_u8s, sizeof k_u8s);
    assert_int_equal(gguf_get_arr(ctx, "test.bools", &elem, &n, &data), 0);
    assert_int_equal(elem, GGUF_T_BOOL);
    assert_memory_equal(data, k_bools, sizeof k_bools);
    assert_int_equal(gguf_get_arr(ctx, "test.u64s", &elem, &n, &data), 0);
    assert_memory_equal(data, k_u64s, sizeof k_u64s);
    assert_int_equal(gguf_get_arr(ctx, "test.f64s", &elem, &n, &data), 0);
    assert_memory_equal(data, k_f64s, sizeof k_f64s);
    assert_int_equal(gguf_get_arr(ctx, "test.empty", &elem, &n, NULL), 0);
    assert_int_equal(elem, GGUF_T_INT16);
    assert_int_equal(n, 0);
}

static void verify_tensors(const gguf_ctx *ctx)
{
    uint64_t align = gguf_alignment(ctx);
    assert_int_equal(gguf_data_offset(ctx) % align, 0);
    assert_int_equal(gguf_n_tensors(ctx), DX_ARRAY_LEN(k_tensors));
    for (size_t i = 0; i < DX_ARRAY_LEN(k_tensors); i++) {
        const tensor_spec *want = &k_tensors[i];
        gguf_tensor_info t, t2;
        assert_int_equal(gguf_tensor(ctx, i, &t), 0);
        assert_int_equal(gguf_find_tensor(ctx, want->name, &t2), 0);
        assert_memory_equal(&t, &t2, sizeof t);
        check_str(t.name, want->name);
        assert_int_equal(t.type, want->type);
        assert_int_equal(t.n_dims, want->n_dims);
        for (uint32_t d = 0; d < 4; d++)
            assert_int_equal(t.ne[d], d < want->n_dims ? want->ne[d] : 1);
        assert_int_equal(t.nbytes, want->nbytes);
        assert_int_equal(t.offset % align, 0);
        for (uint64_t j = 0; j < t.nbytes; j++)
            assert_int_equal(((const uint8_t *)t.data)[j], pattern(i, j));
    }
}

static void verify_model(const void *buf, size_t size, uint32_t version, uint32_t alignment)
{
    gguf_ctx *ctx = open_ok(buf, size);
    assert_int_equal(gguf_version(ctx), version);
    assert_int_equal(gguf_alignment(ctx), alignment);
    assert_int_equal(gguf_file_size(ctx), size);
    assert_string_equal(gguf_name(ctx), "good.gguf");
    assert_int_equal(gguf_n_kv(ctx), 15 + (alignment != 32));
    assert_int_equal(gguf_find_key(ctx, "general.alignment") >= 0, alignment != 32);
    verify_metadata(ctx);
    verify_tensors(ctx);
    for (size_t i = 0; i < DX_ARRAY_LEN(k_tensors); i++) {
        gguf_tensor_info t;
        gguf_tensor(ctx, i, &t);
        assert_int_equal(((const uint8_t *)t.data - (const uint8_t *)buf) % alignment, 0);
    }
    gguf_close(ctx);
}

/* ------------------------------------------------------------------ */
/* Round trips                                                         */

static void test_roundtrip_mem(void **state)
{
    (void)state;
    static const uint32_t aligns[] = {32, 64, 1, 4096};
    for (size_t a = 0; a < DX_ARRAY_LEN(aligns); a++)
        for (int use_fill = 0; use_fill < 2; use_fill++) {
            size_t size;
            void *buf = write_model(3, aligns[a], use_fill, &size);
            verify_model(buf, size, 3, aligns[a]);
            dx_free(buf);
        }
}

static void test_roundtrip_file(void **state)
{
    (void)state;
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
    gguf_writer *w = gguf_writer_create();
    gguf_w_set_alignment(w, 64);
    assert_int_equal(build_model(w, 1), 0);
    assert_int_equal(gguf_w_write_file(w, path), 0);
    void *mem;
    size_t size;
    assert_int_equal(gguf_w_write_mem(w, &mem, &size), 0);
    gguf_writer_destroy(w);

    char tmp[sizeof path + 4];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_equal(access(tmp, F_OK), -1); /* renamed away */
    gguf_ctx *ctx = NULL;
    assert_int_equal(gguf_open(path, &ctx), 0);
    assert_string_equal(gguf_name(ctx), path);
    assert_int_equal(gguf_file_size(ctx), size);
    verify_metadata(ctx);
    verify_tensors(ctx);
    gguf_close(ctx);

    FILE *f = fopen(path, "rb");
    uint8_t *disk = malloc(size + 1);
    assert_int_equal(fread(disk, 1, size + 1, f), size); /* same length */
    fclose(f);
    assert_memory_equal(disk, mem, size);
    free(disk);
    dx_free(mem);
    unlink(path);
}

static void test_read_v2(void **state)
{
    (void)state;
    size_t size;
    void *buf = write_model(2, 32, 0, &size);
    verify_model(buf, size, 2, 32);
    dx_free(buf);
}

static void test_open_missing_and_empty_file(void **state)
{
    (void)state;
    gguf_ctx *ctx = (gguf_ctx *)1;
    assert_int_equal(gguf_open("/nonexistent/x.gguf", &ctx), DX_ENOENT);
    assert_null(ctx);
    assert_contains(dx_errmsg(), "/nonexistent/x.gguf");
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    assert_int_equal(gguf_open(path, &ctx), DX_EFORMAT);
    assert_contains(dx_errmsg(), "offset 0");
    assert_contains(dx_errmsg(), "magic");
    unlink(path);
    assert_int_equal(gguf_open("/tmp", &ctx), DX_EIO);
}

/* ------------------------------------------------------------------ */
/* Getters                                                             */

static void test_getters_types_and_ranges(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_create();
    gguf_w_set_u32(w, "u8", 0);
    gguf_w_set_i32(w, "neg", -5);
    gguf_w_set_i32(w, "pos", 5);
    gguf_w_set_u64(w, "big", 1ull << 33);
    gguf_w_set_u64(w, "huge", UINT64_MAX);
    gguf_w_set_f32(w, "f", 1.5f);
    gguf_w_set_str(w, "s", "x");
    uint8_t u8 = 200;
    double d = 0.25, dbig = 1e300;
    gguf_w_set_arr(w, "arr", GGUF_T_UINT8, &u8, 1);
    void *buf;
    size_t size;
    assert_int_equal(gguf_w_write_mem(w, &buf, &size), 0);
    gguf_writer_destroy(w);
    gguf_ctx *ctx = open_ok(buf, size);
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    int b;
    gguf_str s;

    assert_int_equal(gguf_get_u32(ctx, "pos", &u32), 0);
    assert_int_equal(u32, 5);
    assert_int_equal(gguf_get_u64(ctx, "pos", &u64), 0);
    assert_int_equal(gguf_get_i64(ctx, "big", &i64), 0);
    assert_true(i64 == 1ll << 33);
    assert_int_equal(gguf_get_u32(ctx, "neg", &u32), DX_EFORMAT);
    assert_contains(dx_errmsg(), "'neg' value -5 does not fit uint32");
    assert_int_equal(gguf_get_u64(ctx, "neg", &u64), DX_EFORMAT);
    assert_int_equal(gguf_get_u32(ctx, "big", &u32), DX_EFORMAT);
    assert_contains(dx_errmsg(), "8589934592");
    assert_int_equal(gguf_get_i64(ctx, "huge", &i64), DX_EFORMAT);
    assert_int_equal(gguf_get_u64(ctx, "huge", &u64), 0);
    assert_true(u64 == UINT64_MAX);
    assert_int_equal(gguf_get_u32(ctx, "f", &u32), DX_EFORMAT);
    assert_contains(dx_errmsg(), "key 'f' has type float32");
    assert_int_equal(gguf_get_f32(ctx, "s", &f), DX_EFORMAT);
    assert_contains(dx_errmsg(), "key 's' has type string");
    assert_int_equal(gguf_get_str(ctx, "pos", &s), DX_EFORMAT);
    assert_contains(dx_errmsg(), "int32");
    assert_int_equal(gguf_get_bool(ctx, "pos", &b), DX_EFORMAT);
    assert_int_equal(gguf_get_u32(ctx, "arr", &u32), DX_EFORMAT);
    assert_contains(dx_errmsg(), "array");
    assert_int_equal(gguf_get_arr_str(ctx, "arr", 0, &s), DX_EFORMAT);
    assert_int_equal(gguf_get_arr(ctx, "pos", NULL, NULL, NULL), DX_EFORMAT);
    assert_int_equal(gguf_get_u32(ctx, "missing.key", &u32), DX_ENOENT);
    assert_contains(dx_errmsg(), "'missing.key' not found");
    assert_int_equal(gguf_get_str(ctx, "missing.key", &s), DX_ENOENT);
    assert_int_equal(gguf_find_key(ctx, "missing.key"), -1);
    assert_int_equal(gguf_find_tensor(ctx, "nope", NULL), DX_ENOENT);
    assert_contains(dx_errmsg(), "'nope'");
    gguf_tensor_info t;
    assert_int_equal(gguf_tensor(ctx, 0, &t), DX_ERANGE);
    enum gguf_vtype elem;
    assert_int_equal(gguf_kv_array_info(ctx, 0, &elem, &u64), DX_EINVAL);
    assert_int_equal(gguf_kv_array_info(ctx, 99, &elem, &u64), DX_ERANGE);
    int64_t ai = gguf_find_key(ctx, "arr");
    assert_int_equal(gguf_kv_array_info(ctx, (uint64_t)ai, &elem, &u64), 0);
    assert_int_equal(elem, GGUF_T_UINT8);
    assert_int_equal(u64, 1);
    assert_true(gguf_str_eq(gguf_kv_key(ctx, (uint64_t)ai), "arr"));
    assert_int_equal(gguf_kv_type(ctx, (uint64_t)ai), GGUF_T_ARRAY);
    gguf_close(ctx);
    dx_free(buf);

    /* float64 through gguf_get_f32, and one that does not fit. */
    raw r;
    r_header(&r, 3, 0, 2);
    r_str(&r, "d");
    r_u32(&r, GGUF_T_FLOAT64);
    r_bytes(&r, &d, 8);
    r_str(&r, "dbig");
    r_u32(&r, GGUF_T_FLOAT64);
    r_bytes(&r, &dbig, 8);
    ctx = open_ok(r.b, r.n);
    assert_int_equal(gguf_get_f32(ctx, "d", &f), 0);
    assert_true(f == 0.25f);
    assert_int_equal(gguf_get_f32(ctx, "dbig", &f), DX_EFORMAT);
    assert_contains(dx_errmsg(), "does not fit float32");
    gguf_close(ctx);
}

static void test_vtype_names_sizes(void **state)
{
    (void)state;
    assert_string_equal(gguf_vtype_name(GGUF_T_UINT32), "uint32");
    assert_string_equal(gguf_vtype_name(GGUF_T_FLOAT64), "float64");
    assert_string_equal(gguf_vtype_name((enum gguf_vtype)99), "unknown");
    assert_int_equal(gguf_vtype_size(GGUF_T_BOOL), 1);
    assert_int_equal(gguf_vtype_size(GGUF_T_INT16), 2);
    assert_int_equal(gguf_vtype_size(GGUF_T_FLOAT32), 4);
    assert_int_equal(gguf_vtype_size(GGUF_T_INT64), 8);
    assert_int_equal(gguf_vtype_size(GGUF_T_STRING), 0);
    assert_int_equal(gguf_vtype_size(GGUF_T_ARRAY), 0);
    gguf_str s = {"abc", 3};
    assert_true(gguf_str_eq(s, "abc"));
    assert_false(gguf_str_eq(s, "ab"));
    assert_false(gguf_str_eq(s, "abd"));
}

/* Many keys and tensors (index collisions) and a long string array. */
static void test_many_keys_tensors_and_vocab(void **state)
{
    (void)state;
    enum { NK = 1500, NV = 20000 };
    gguf_writer *w = gguf_writer_create();
    char name[64];
    for (uint32_t i = 0; i < NK; i++) {
        snprintf(name, sizeof name, "k.%u", i);
        assert_int_equal(gguf_w_set_u32(w, name, i * 3), 0);
        snprintf(name, sizeof name, "t.%u", i);
        uint64_t ne = 1;
        float v = (float)i;
        assert_int_equal(gguf_w_add_tensor(w, name, DX_F32, 1, &ne, &v), 0);
    }
    char **vocab = malloc(NV * sizeof *vocab);
    for (uint32_t i = 0; i < NV; i++) {
        vocab[i] = malloc(16);
        snprintf(vocab[i], 16, "tok%u", i);
    }
    assert_int_equal(gguf_w_set_arr_str(w, "vocab", (const char *const *)vocab, NV), 0);
    void *buf;
    size_t size;
    assert_int_equal(gguf_w_write_mem(w, &buf, &size), 0);
    gguf_writer_destroy(w);
    gguf_ctx *ctx = open_ok(buf, size);
    for (uint32_t i = 0; i < NK; i++) {
        uint32_t v;
        snprintf(name, sizeof name, "k.%u", i);
        assert_int_equal(gguf_find_key(ctx, name), i);
        assert_int_equal(gguf_get_u32(ctx, name, &v), 0);
        assert_int_equal(v, i * 3);
        snprintf(name, sizeof name, "t.%u", i);
        gguf_tensor_info t;
        assert_int_equal(gguf_find_tensor(ctx, name, &t), 0);
        float f;
        memcpy(&f, t.data, 4);
        assert_true(f == (float)i);
    }
    for (uint32_t i = NV; i-- > 0;) {
        gguf_str s;
        assert_int_equal(gguf_get_arr_str(ctx, "vocab", i, &s), 0);
        check_str(s, vocab[i]);
        free(vocab[i]);
    }
    gguf_str s;
    assert_int_equal(gguf_get_arr_str(ctx, "vocab", NV, &s), DX_ERANGE);
    free(vocab);
    gguf_close(ctx);
    dx_free(buf);
}

static void test_zero_size_tensor(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_create();
    uint64_t ne[2] = {0, 4}, ne1 = 4;
    float v[4] = {1, 2, 3, 4};
    assert_int_equal(gguf_w_add_tensor(w, "empty", DX_F32, 2, ne, v), 0);
    assert_int_equal(gguf_w_add_tensor(w, "after", DX_F32, 1, &ne1, v), 0);
    void *buf;
    size_t size;
    assert_int_equal(gguf_w_write_mem(w, &buf, &size), 0);
    gguf_writer_destroy(w);
    gguf_ctx *ctx = open_ok(buf, size);
    gguf_tensor_info t;
    assert_int_equal(gguf_find_tensor(ctx, "empty", &t), 0);
    assert_int_equal(t.nbytes, 0);
    assert_null(t.data);
    assert_int_equal(gguf_find_tensor(ctx, "after", &t), 0);
    assert_memory_equal(t.data, v, 16);
    gguf_close(ctx);
    dx_free(buf);
}

/* ------------------------------------------------------------------ */
/* Writer behaviour                                                    */

static void test_writer_replace_and_reject(void **state)
{
    (void)state;
    gguf_writer *w = gguf_writer_create();
    assert_int_equal(gguf_w_set_u32(w, "a", 1), 0);
    assert_int_equal(gguf_w_set_str(w, "b", "x"), 0);
    assert_int_equal(gguf_w_set_str(w, "a", "now a string"), 0);
    gguf_w_set_alignment(w, 128);
    gguf_w_set_alignment(w, 32); /* removes general.alignment again */
    assert_int_equal(gguf_w_set_u32(w, "", 1), DX_EINVAL);
    uint8_t bad_bool = 2;
    assert_int_equal(gguf_w_set_arr(w, "bb", GGUF_T_BOOL, &bad_bool, 1), DX_EINVAL);
    assert_int_equal(gguf_w_set_arr(w, "s", GGUF_T_STRING, &bad_bool, 1), DX_EINVAL);
    uint64_t ne[5] = {48, 1, 1, 1, 1};
    uint8_t data[64] = {0};
    assert_int_equal(gguf_w_add_tensor(w, "q", DX_Q8_0, 1, ne, data), DX_EINVAL);
    assert_int_equal(gguf_w_add_tensor(w, "q", 12, 1, ne, data), DX_EINVAL);
    assert_int_equal(gguf_w_add_tensor(w, "q", DX_F32, 5, ne, data), DX_EINVAL);
    assert_int_equal(gguf_w_add_tensor(w, "q", DX_F32, 0, ne, data), DX_EINVAL);
    uint64_t over[2] = {1ull << 62, 4};
    assert_int_equal(gguf_w_add_tensor_fill(w, "q", DX_F32, 2, over, fill_pattern, NULL),
                     DX_EINVAL);
    ne[0] = 4;
    assert_int_equal(gguf_w_add_tensor(w, "q", DX_F32, 1, ne, data), 0);
    assert_int_equal(gguf_w_add_tensor(w, "q", DX_F32, 1, ne, data), DX_EEXIST);
    assert_contains(dx_errmsg(), "'q'");
    void *buf;
    size_t size;
    assert_int_equal(gguf_w_write_mem(w, &buf, &size), 0);
    gguf_writer_destroy(w);
    gguf_ctx *ctx = open_ok(buf, size);
    assert_int_equal(gguf_n_kv(ctx), 2);
    assert_true(gguf_str_eq(gguf_kv_key(ctx, 0), "a"));
    gguf_str s;
    assert_int_equal(gguf_get_str(ctx, "a", &s), 0);
    check_str(s, "now a string");
    assert_int_equal(gguf_alignment(ctx), 32);
    gguf_close(ctx);
    dx_free(buf);
}

static int fill_fail(void *user, void *dst, uint64_t n)
{
    (void)user;
    (void)dst;
    (void)n;
    return dx_errf(DX_EIO, "synthetic failure");
}

static void test_writer_fill_error_removes_tmp(void **state)
{
    (void)state;
    char path[] = "/tmp/test_gguf_XXXXXX";
    int fd = mkstemp(path);
    close(fd);
    unlink(path);
    gguf_writer *w = gguf_writer_create();
    uint64_t ne = 8;
    assert_int_equal(gguf_w_add_tensor_fill(w, "bad", DX_F32, 1, &ne, fill_fail, NULL), 0);
    assert_int_equal(gguf_w_write_file(w, path), DX_EIO);
    assert_contains(dx_errmsg(), "tensor 'bad'");
    assert_contains(dx_errmsg(), "synthetic failure");
    void *buf = (void *)1;
    size_t size;
    assert_int_equal(gguf_w_write_mem(w, &buf, &size), DX_EIO);
    assert_null(buf);
    gguf_writer_destroy(w);
    char tmp[sizeof path + 4];
    snprintf(tmp, sizeof tmp, "%s.tmp", path);
    assert_int_equal(access(tmp, F_OK), -1);
    assert_int_equal(access(path, F_OK), -1);
    w = gguf_writer_create();
    assert_int_equal(gguf_w_write_file(w, "/nonexistent/dir/x.gguf"), DX_EIO);
    assert_contains(dx_errmsg(), "/nonexistent/dir/x.gguf.tmp");
    gguf_writer_destroy(w);
}

/* ------------------------------------------------------------------ */
/* Hostile files                                                       */

/* A valid file cut at every byte short of its last tensor's end fails
 * cleanly (the final padding is optional). */
static void test_truncated_at_every_byte(void **state)
{
    (void)state;
    size_t size;
    uint8_t *buf = write_model(3, 32, 0, &size);
    gguf_ctx *ctx = open_ok(buf, size);
    uint64_t data_off = gguf_data_offset(ctx), end = 0;
    for (uint64_t i = 0; i < gguf_n_tensors(ctx); i++) {
        gguf_tensor_info t;
        gguf_tensor(ctx, i, &t);
        if (data_off + t.offset + t.nbytes > end) end = data_off + t.offset + t.nbytes;
    }
    gguf_close(ctx);
    assert_true(end <= size && end + 32 > size); /* only the last padding may go */
    size_t live = dx_alloc_live_bytes();
    for (size_t n = 0; n < end; n++) {
        uint8_t *copy = malloc(n ? n : 1);
        memcpy(copy, buf, n);
        ctx = (gguf_ctx *)1;
        int rc = gguf_open_mem(copy, n, "cut.gguf", &ctx);
        if (rc != DX_EFORMAT) fail_msg("cut at %zu: rc %d (%s)", n, rc, dx_errmsg());
        assert_null(ctx);
        assert_contains(dx_errmsg(), "cut.gguf: offset ");
        /* Inside the metadata the message says what it was reading or
         * which count cannot fit; inside the data, which tensor ends past
         * the end. */
        const char *m = dx_errmsg();
        if (n >= data_off)
            assert_contains(m, "past the end");
        else if (n + 32 <= data_off && !strstr(m, "end of file") && !strstr(m, "exceed"))
            fail_msg("cut at %zu: %s", n, m);
        free(copy);
    }
    assert_int_equal(dx_alloc_live_bytes(), live);
    dx_free(buf);
}

static void test_bad_magic(void **state)
{
    (void)state;
    raw r;
    r_header(&r, 3, 0, 0);
    r.b[0] = 'X';
    expect_fail(&r, DX_EFORMAT, "offset 0", "bad magic");
    r.n = 3;
    expect_fail(&r, DX_EFORMAT, "offset 0", "end of file reading magic");
}

static void test_bad_versions(void **state)
{
    (void)state;
    raw r;
    r_header(&r, 1, 0, 0);
    expect_fail(&r, DX_EUNSUPPORTED, "offset 4", "version 1");
    r_header(&r, 4, 0, 0);
    expect_fail(&r, DX_EUNSUPPORTED, "offset 4", "version 4");
    r_header(&r, 0xffffffffu, 0, 0);
    expect_fail(&r, DX_EUNSUPPORTED, "offset 4", "version 4294967295");
    r_header(&r, 0, 0, 0);
    expect_fail(&r, DX_EFORMAT, "offset 4", "version 0");
    r_header(&r, 0x03000000u, 0, 0);
    expect_fail(&r, DX_EUNSUPPORTED, "offset 4", "big-endian");
    /* The writer writes the version verbatim; v2 and v3 read back. */
    gguf_writer *w = gguf_writer_create();
    gguf_w_set_version(w, 4);
    void *buf;
    size_t size;
    assert_int_equal(gguf_w_write_mem(w, &buf, &size), 0);
    expect_fail_n(buf, size, DX_EUNSUPPORTED, (const char *const[]){"version 4", NULL});
    dx_free(buf);
    gguf_writer_destroy(w);
}

static void test_huge_counts(void **state)
{
    (void)state;
    raw r;
    r_header(&r, 3, 0, UINT64_MAX);
    expect_fail(&r, DX_EFORMAT, "offset 16",
                "kv count 18446744073709551615 exceeds what the file can hold");
    r_header(&r, 3, UINT64_MAX, 0);
    expect_fail(&r, DX_EFORMAT, "offset 8", "tensor count 18446744073709551615 exceeds");
    r_header(&r, 3, 1ull << 40, 0);
    expect_fail(&r, DX_EFORMAT, "offset 8", "tensor count");
    /* Fits individually, not together. */
    r_header(&r, 3, 1, 1);
    r_zeros(&r, 40);
    expect_fail(&r, DX_EFORMAT, "offset 8", "together exceed");
    /* Over the reader's limit although the file would hold them. */
    size_t n = 24 + (size_t)(GGUF_MAX_KV + 1) * 13;
    uint8_t *big = calloc(1, n);
    memcpy(big, r.b, 8);
    uint64_t count = GGUF_MAX_KV + 1;
    memcpy(big + 16, &count, 8);
    expect_fail_n(
        big, n, DX_EUNSUPPORTED,
        (const char *const[]){"offset 16", "kv count 1048577 exceeds this reader's limit", NULL});
    free(big);
}

static void test_huge_string_lengths(void **state)
{
    (void)state;
    raw r;
    r_header(&r, 3, 0, 1);
    r_u64(&r, UINT64_MAX); /* key length */
    r_zeros(&r, 16);
    expect_fail(&r, DX_EFORMAT, "offset 24", "key length 18446744073709551615 exceeds");
    r_header(&r, 3, 0, 1);
    r_str(&r, "general.name");
    r_u32(&r, GGUF_T_STRING);
    r_u64(&r, 1000); /* value length, 4 bytes left */
    r_zeros(&r, 4);
    expect_fail(&r, DX_EFORMAT, "offset 48", "key 'general.name'", "string value length 1000");
    r_header(&r, 3, 1, 0);
    r_u64(&r, 1ull << 63); /* tensor name length */
    r_zeros(&r, 40);
    expect_fail(&r, DX_EFORMAT, "offset 24", "tensor 0", "tensor name length");
}

static void test_huge_array_lengths(void **state)
{
    (void)state;
    raw r;
    r_header(&r, 3, 0, 1);
    r_str(&r, "arr");
    r_u32(&r, GGUF_T_ARRAY);
    r_u32(&r, GGUF_T_UINT32);
    r_u64(&r, UINT64_MAX / 2); /* at offset 43; n * 4 would overflow */
    r_zeros(&r, 8);
    expect_fail(&r, DX_EFORMAT, "offset 43", "key 'arr'", "array length 9223372036854775807");
    r_header(&r, 3, 0, 1);
    r_str(&r, "tokens");
    r_u32(&r, GGUF_T_ARRAY);
    r_u32(&r, GGUF_T_STRING);
    r_u64(&r, 3);
    r_str(&r, "a");
    r_str(&r, "bbbbbbbbbbbbbbbbbb"); /* third element missing */
    expect_fail(&r, DX_EFORMAT, "offset 89", "key 'tokens'", "end of file reading string element");
    r_header(&r, 3, 0, 1);
    r_str(&r, "tokens");
    r_u32(&r, GGUF_T_ARRAY);
    r_u32(&r, GGUF_T_STRING);
    r_u64(&r, 1);
    r_u64(&r, 5000);
    expect_fail(&r, DX_EFORMAT, "offset 54", "string element length 5000 exceeds");
}

static void test_bad_value_types(void **state)
{
    (void)state;
    raw r;
    r_header(&r, 3, 0, 1);
    r_str(&r, "k");
    r_u32(&r, 13);
    r_u32(&r, 0);
    expect_fail(&r, DX_EFORMAT, "offset 33", "key 'k'", "unknown value type 13");
    r_header(&r, 3, 0, 1);
    r_str(&r, "k");
    r_u32(&r, GGUF_T_ARRAY);
    r_u32(&r, 0x80000000u);
    r_u64(&r, 0);
    expect_fail(&r, DX_EFORMAT, "offset 37", "unknown array element type 2147483648");
    r_header(&r, 3, 0, 1);
    r_str(&r, "nested");
    r_u32(&r, GGUF_T_ARRAY);
    r_u32(&r, GGUF_T_ARRAY);
    r_u64(&r, 1);
    r_u32(&r, GGUF_T_UINT8);
    r_u64(&r, 0);
    expect_fail(&r, DX_EUNSUPPORTED, "offset 42", "key 'nested'", "nested arrays");
    r_header(&r, 3, 0, 1);
    r_str(&r, "b");
    r_u32(&r, GGUF_T_BOOL);
    r_u8(&r, 2);
    r_zeros(&r, 8);
    expect_fail(&r, DX_EFORMAT, "offset 37", "key 'b'", "bool value 2");
    r_header(&r, 3, 0, 1);
    r_str(&r, "bs");
    r_u32(&r, GGUF_T_ARRAY);
    r_u32(&r, GGUF_T_BOOL);
    r_u64(&r, 3);
    r_u8(&r, 0);
    r_u8(&r, 1);
    r_u8(&r, 7);
    expect_fail(&r, DX_EFORMAT, "offset 52", "bool value 7");
    r_header(&r, 3, 0, 1);
    r_str(&r, "");
    r_u32(&r, GGUF_T_UINT8);
    r_zeros(&r, 8);
    expect_fail(&r, DX_EFORMAT, "offset 24", "empty key");
}

static void test_bad_keys_with_odd_bytes(void **state)
{
    (void)state;
    /* A key with control bytes and a long one are quoted safely. */
    raw r;
    r_header(&r, 3, 0, 1);
    r_u64(&r, 3);
    r_bytes(&r, "a\nb", 3);
    r_u32(&r, 99);
    r_zeros(&r, 4);
    expect_fail(&r, DX_EFORMAT, "key 'a?b'", "unknown value type 99");
    char long_key[200];
    memset(long_key, 'x', sizeof long_key - 1);
    long_key[sizeof long_key - 1] = 0;
    r_header(&r, 3, 0, 1);
    r_str(&r, long_key);
    r_u32(&r, 99);
    r_zeros(&r, 4);
    expect_fail(&r, DX_EFORMAT, "xxx...'", "unknown value type 99");
}

static void test_duplicate_keys(void **state)
{
    (void)state;
    raw r;
    r_header(&r, 3, 0, 3);
    r_kv_u32(&r, "llama.block_count", 1);
    r_kv_u32(&r, "other", 2);
    r_kv_u32(&r, "llama.block_count", 3);
    expect_fail(&r, DX_EFORMAT, "offset 78", "key 'llama.block_count'", "duplicate key", "kv 0");
}

static void test_bad_n_dims(void **state)
{
    (void)state;
    raw r;
    uint64_t ne[5] = {4, 1, 1, 1, 1};
    r_one_tensor(&r, 0, ne, DX_F32, 0, 32);
    expect_fail(&r, DX_EFORMAT, "offset 33", "tensor 'w'", "n_dims 0");
    r_one_tensor(&r, 5, ne, DX_F32, 0, 32);
    expect_fail(&r, DX_EFORMAT, "offset 33", "n_dims 5");
}

static void test_bad_shapes(void **state)
{
    (void)state;
    raw r;
    uint64_t ne[4] = {1ull << 32, 1ull << 32, 1, 1};
    r_one_tensor(&r, 2, ne, DX_F32, 0, 32);
    expect_fail(&r, DX_EFORMAT, "tensor 'w'", "overflows");
    uint64_t ne2[4] = {1ull << 30, 1ull << 30, 2, 1}; /* elements fit int64, bytes do not */
    r_one_tensor(&r, 3, ne2, DX_F32, 0, 32);
    expect_fail(&r, DX_EFORMAT, "overflows");
    uint64_t ne3[2] = {1ull << 63, 1};
    r_one_tensor(&r, 2, ne3, DX_F32, 0, 32);
    expect_fail(&r, DX_EFORMAT, "offset 37", "ne[0] = 9223372036854775808 is out of range");
    uint64_t ne4[1] = {48};
    r_one_tensor(&r, 1, ne4, DX_Q8_0, 0, 64);
    expect_fail(&r, DX_EFORMAT, "offset 45",
                "ne[0] = 48 is not a multiple of the q8_0 block size 32");
}

static void test_bad_tensor_types(void **state)
{
    (void)state;
    raw r;
    uint64_t ne[1] = {32};
    r_one_tensor(&r, 1, ne, 99, 0, 128);
    expect_fail(&r, DX_EFORMAT, "offset 45", "tensor 'w'", "unknown tensor type 99");
    /* a type GGML defines is sized whether or not duplex runs it (the
     * loader's question): q4_K has blocks of 256 */
    r_one_tensor(&r, 1, ne, 12, 0, 128);
    expect_fail(&r, DX_EFORMAT, "tensor 'w'",
                "ne[0] = 32 is not a multiple of the q4_K block size 256");
    r_one_tensor(&r, 1, ne, 4, 0, 128);
    expect_fail(&r, DX_EFORMAT, "tensor 'w'", "unknown tensor type 4"); /* retired */
    uint64_t ne_k[1] = {512};
    r_one_tensor(&r, 1, ne_k, 12, 0, 288);
    gguf_ctx *ctx;
    assert_int_equal(gguf_open_mem(r.b, r.n, "k.gguf", &ctx), 0);
    gguf_tensor_info ti;
    assert_int_equal(gguf_tensor(ctx, 0, &ti), 0);
    assert_int_equal(ti.type, 12);
    assert_int_equal(ti.nbytes, 288); /* two 144-byte blocks */
    gguf_close(ctx);
    r_one_tensor(&r, 1, ne, 0xffffffffu, 0, 128);
    expect_fail(&r, DX_EFORMAT, "unknown tensor type 4294967295");
}

static void test_bad_tensor_placement(void **state)
{
    (void)state;
    raw r;
    uint64_t ne[1] = {8}; /* 32 bytes of f32 */
    r_one_tensor(&r, 1, ne, DX_F32, 16, 64);
    expect_fail(&r, DX_EFORMAT, "offset 49",
                "data offset 16 is not a multiple of the alignment 32");
    r_one_tensor(&r, 1, ne, DX_F32, 0, 31);
    expect_fail(&r, DX_EFORMAT, "offset 64", "tensor 'w'", "past the end of the file");
    r_one_tensor(&r, 1, ne, DX_F32, 1ull << 63, 32);
    expect_fail(&r, DX_EFORMAT, "past the end of the file");
    /* Overlap: b starts inside a. */
    uint64_t ne_a[1] = {16}, ne_b[1] = {8};
    r_header(&r, 3, 2, 0);
    r_tensor(&r, "a", 1, ne_a, DX_F32, 0);
    r_tensor(&r, "b", 1, ne_b, DX_F32, 32);
    r_pad(&r, 32);
    size_t data_off = r.n;
    r_zeros(&r, 96);
    char off[32];
    snprintf(off, sizeof off, "offset %zu", data_off + 32);
    expect_fail(&r, DX_EFORMAT, off, "tensor 'b'", "overlaps tensor 'a'");
    /* Same, listed in the other order (found after sorting). */
    r_header(&r, 3, 2, 0);
    r_tensor(&r, "b", 1, ne_b, DX_F32, 32);
    r_tensor(&r, "a", 1, ne_a, DX_F32, 0);
    r_pad(&r, 32);
    r_zeros(&r, 96);
    expect_fail(&r, DX_EFORMAT, "overlaps tensor 'a'");
    /* Adjacent is fine; identical offsets are not. */
    r_header(&r, 3, 2, 0);
    r_tensor(&r, "a", 1, ne_b, DX_F32, 0);
    r_tensor(&r, "b", 1, ne_b, DX_F32, 32);
    r_pad(&r, 32);
    r_zeros(&r, 64);
    gguf_close(open_ok(r.b, r.n));
    r_header(&r, 3, 2, 0);
    r_tensor(&r, "a", 1, ne_b, DX_F32, 0);
    r_tensor(&r, "b", 1, ne_b, DX_F32, 0);
    r_pad(&r, 32);
    r_zeros(&r, 64);
    expect_fail(&r, DX_EFORMAT, "overlaps");
}

static void test_duplicate_tensor_names(void **state)
{
    (void)state;
    raw r;
    uint64_t ne[1] = {8};
    r_header(&r, 3, 2, 0);
    r_tensor(&r, "blk.0.w", 1, ne, DX_F32, 0);
    r_tensor(&r, "blk.0.w", 1, ne, DX_F32, 32);
    r_pad(&r, 32);
    r_zeros(&r, 64);
    expect_fail(&r, DX_EFORMAT, "offset 63", "tensor 'blk.0.w'", "duplicate tensor name");
    r_header(&r, 3, 1, 0);
    r_tensor(&r, "", 1, ne, DX_F32, 0);
    r_pad(&r, 32);
    r_zeros(&r, 32);
    expect_fail(&r, DX_EFORMAT, "offset 24", "empty tensor name");
}

static void test_bad_alignment_key(void **state)
{
    (void)state;
    raw r;
    r_header(&r, 3, 0, 1);
    r_kv_u32(&r, "general.alignment", 48);
    expect_fail(&r, DX_EFORMAT, "offset 53", "general.alignment 48 is not a power of two");
    r_header(&r, 3, 0, 1);
    r_kv_u32(&r, "general.alignment", 0);
    expect_fail(&r, DX_EFORMAT, "general.alignment 0 is not a power of two");
    r_header(&r, 3, 0, 1);
    r_str(&r, "general.alignment");
    r_u32(&r, GGUF_T_UINT64);
    r_u64(&r, 64);
    expect_fail(&r, DX_EFORMAT, "general.alignment has type uint64, expected uint32");
    /* Through the writer: the key written verbatim with a 32 layout. */
    gguf_writer *w = gguf_writer_create();
    gguf_w_set_u32(w, "general.alignment", 3);
    void *buf;
    size_t size;
    assert_int_equal(gguf_w_write_mem(w, &buf, &size), 0);
    expect_fail_n(buf, size, DX_EFORMAT, (const char *const[]){"not a power of two", NULL});
    dx_free(buf);
    gguf_writer_destroy(w);
    /* A valid 16-byte alignment with a tensor at offset 16. */
    uint64_t ne[1] = {4};
    r_header(&r, 3, 2, 1);
    r_kv_u32(&r, "general.alignment", 16);
    r_tensor(&r, "a", 1, ne, DX_F32, 0);
    r_tensor(&r, "b", 1, ne, DX_F32, 16);
    r_pad(&r, 16);
    r_zeros(&r, 32);
    gguf_ctx *ctx = open_ok(r.b, r.n);
    assert_int_equal(gguf_alignment(ctx), 16);
    gguf_close(ctx);
}

/* ------------------------------------------------------------------ */
/* Leaks and out-of-memory                                             */

static void test_no_leaks(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    size_t size;
    void *buf = write_model(3, 64, 1, &size);
    for (int i = 0; i < 3; i++) gguf_close(open_ok(buf, size));
    dx_free(buf);
    gguf_close(NULL);
    gguf_writer_destroy(NULL);
    assert_int_equal(dx_alloc_live_bytes(), live);
}

static void test_oom_open(void **state)
{
    (void)state;
    size_t size;
    void *buf = write_model(3, 32, 0, &size);
    size_t live = dx_alloc_live_bytes();
    int ok = 0;
    for (long k = 1; k < 100 && !ok; k++) {
        gguf_ctx *ctx = NULL;
        dx_alloc_fail_after(k, 0);
        int rc = gguf_open_mem(buf, size, "oom.gguf", &ctx);
        dx_alloc_fail_after(0, 0);
        if (rc == 0) {
            ok = 1;
            gguf_close(ctx);
        } else {
            assert_int_equal(rc, DX_ENOMEM);
            assert_null(ctx);
            assert_contains(dx_errmsg(), "out of memory");
        }
        assert_int_equal(dx_alloc_live_bytes(), live);
    }
    assert_true(ok);
    dx_free(buf);
}

static void test_oom_writer(void **state)
{
    (void)state;
    size_t live = dx_alloc_live_bytes();
    int ok = 0;
    for (long k = 1; k < 400 && !ok; k++) {
        dx_alloc_fail_after(k, 0);
        gguf_writer *w = gguf_writer_create();
        int rc = w ? build_model(w, k & 1) : DX_ENOMEM;
        if (w) gguf_w_set_alignment(w, 64);
        void *buf = NULL;
        size_t size;
        if (!rc) rc = gguf_w_write_mem(w, &buf, &size);
        dx_alloc_fail_after(0, 0);
        if (rc == 0) {
            ok = 1;
            verify_model(buf, size, 3, 64);
            dx_free(buf);
        } else {
            /* set_alignment swallowing OOM surfaces as DX_EINVAL at write */
            assert_true(rc == DX_ENOMEM || rc == DX_EINVAL);
        }
        gguf_writer_destroy(w);
        assert_int_equal(dx_alloc_live_bytes(), live);
    }
    assert_true(ok);
}

/* ------------------------------------------------------------------ */
/* Fuzz seeds: checked here, written out when GGUF_CORPUS_DIR is set    */

static void seed(const char *name, const void *buf, size_t n, int valid)
{
    assert_true(n <= 4096);
    gguf_ctx *ctx = NULL;
    int rc = gguf_open_mem(buf, n, name, &ctx);
    assert_int_equal(rc == 0, valid);
    gguf_close(ctx);
    const char *dir = getenv("GGUF_CORPUS_DIR");
    if (!dir) return;
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(buf, 1, n, f), n);
    fclose(f);
}

static void test_corpus_seeds(void **state)
{
    (void)state;
    size_t size;
    void *buf = write_model(3, 32, 0, &size);
    seed("model_v3", buf, size, 1);
    seed("model_cut", buf, size / 2, 0);
    dx_free(buf);
    buf = write_model(2, 64, 0, &size);
    seed("model_v2_align64", buf, size, 1);
    dx_free(buf);
    raw r;
    r_header(&r, 3, 0, 0);
    seed("empty_v3", r.b, r.n, 1);
    r_header(&r, 3, 0, 3);
    r_kv_u32(&r, "a", 1);
    r_kv_u32(&r, "b", 2);
    r_kv_u32(&r, "a", 3);
    seed("dup_key", r.b, r.n, 0);
    uint64_t ne[2] = {64, 2};
    r_one_tensor(&r, 2, ne, DX_Q8_0, 0, 136);
    seed("q8_0_one", r.b, r.n, 1);
    r_header(&r, 3, 0, 1);
    r_str(&r, "nested");
    r_u32(&r, GGUF_T_ARRAY);
    r_u32(&r, GGUF_T_ARRAY);
    r_u64(&r, 0);
    seed("nested_array", r.b, r.n, 0);
    uint64_t ne1[1] = {8};
    r_header(&r, 3, 2, 0);
    r_tensor(&r, "a", 1, ne1, DX_F32, 0);
    r_tensor(&r, "b", 1, ne1, DX_F32, 0);
    r_pad(&r, 32);
    r_zeros(&r, 64);
    seed("overlap", r.b, r.n, 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_roundtrip_mem),
        cmocka_unit_test(test_roundtrip_file),
        cmocka_unit_test(test_read_v2),
        cmocka_unit_test(test_open_missing_and_empty_file),
        cmocka_unit_test(test_getters_types_and_ranges),
        cmocka_unit_test(test_vtype_names_sizes),
        cmocka_unit_test(test_many_keys_tensors_and_vocab),
        cmocka_unit_test(test_zero_size_tensor),
        cmocka_unit_test(test_writer_replace_and_reject),
        cmocka_unit_test(test_writer_fill_error_removes_tmp),
        cmocka_unit_test(test_truncated_at_every_byte),
        cmocka_unit_test(test_bad_magic),
        cmocka_unit_test(test_bad_versions),
        cmocka_unit_test(test_huge_counts),
        cmocka_unit_test(test_huge_string_lengths),
        cmocka_unit_test(test_huge_array_lengths),
        cmocka_unit_test(test_bad_value_types),
        cmocka_unit_test(test_bad_keys_with_odd_bytes),
        cmocka_unit_test(test_duplicate_keys),
        cmocka_unit_test(test_bad_n_dims),
        cmocka_unit_test(test_bad_shapes),
        cmocka_unit_test(test_bad_tensor_types),
        cmocka_unit_test(test_bad_tensor_placement),
        cmocka_unit_test(test_duplicate_tensor_names),
        cmocka_unit_test(test_bad_alignment_key),
        cmocka_unit_test(test_no_leaks),
        cmocka_unit_test(test_oom_open),
        cmocka_unit_test(test_oom_writer),
        cmocka_unit_test(test_corpus_seeds),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
