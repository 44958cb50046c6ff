/* Fuzz target for the GGUF reader: open the input as a file image, then
 * walk everything the accessors expose (every key and value, every array
 * element, every tensor's bytes) so that a validation gap shows up as an
 * out-of-bounds read under ASan.  Cross-checks that would only fail on a bug
 * (lookups by name find the same index) trap.  Seeds: tests/fuzz/corpus/gguf,
 * written by test_gguf's test_corpus_seeds with GGUF_CORPUS_DIR set. */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "base/dx_alloc.h"
#include "base/dx_err.h"
#include "model/gguf.h"

static volatile uint64_t g_sink;

static uint64_t touch(const void *p, uint64_t n)
{
    uint64_t sum = 0;
    for (uint64_t i = 0; i < n; i++) sum += ((const uint8_t *)p)[i];
    return sum;
}

/* A NUL-terminated copy of s, or NULL if s holds a NUL (not findable by a
 * C-string lookup) or memory is short. */
static char *cstr(gguf_str s)
{
    if (memchr(s.ptr, 0, s.len)) return NULL;
    return dx_strndup(s.ptr, s.len);
}

static void walk_array(const gguf_ctx *ctx, const char *key)
{
    enum gguf_vtype elem;
    uint64_t n;
    const void *data;
    if (gguf_get_arr(ctx, key, &elem, &n, &data) != 0) __builtin_trap();
    if (elem != GGUF_T_STRING) {
        g_sink += touch(data, n * gguf_vtype_size(elem));
        return;
    }
    for (uint64_t i = 0; i < n; i++) {
        gguf_str s;
        if (gguf_get_arr_str(ctx, key, i, &s) != 0) __builtin_trap();
        g_sink += touch(s.ptr, s.len);
    }
    gguf_str s;
    if (gguf_get_arr_str(ctx, key, n, &s) != DX_ERANGE) __builtin_trap();
}

static void walk_kv(const gguf_ctx *ctx, uint64_t i)
{
    gguf_str k = gguf_kv_key(ctx, i);
    char *key = cstr(k);
    if (!key) return;
    if (gguf_find_key(ctx, key) != (int64_t)i) __builtin_trap();
    uint32_t u32;
    uint64_t u64;
    int64_t i64;
    float f;
    int b;
    gguf_str s;
    enum gguf_vtype t = gguf_kv_type(ctx, i);
    g_sink += (uint64_t)gguf_get_u32(ctx, key, &u32) + (uint64_t)gguf_get_u64(ctx, key, &u64) +
              (uint64_t)gguf_get_i64(ctx, key, &i64) + (uint64_t)gguf_get_f32(ctx, key, &f) +
              (uint64_t)gguf_get_bool(ctx, key, &b);
    if (t == GGUF_T_STRING) {
        if (gguf_get_str(ctx, key, &s) != 0) __builtin_trap();
        g_sink += touch(s.ptr, s.len);
    }
    if (t == GGUF_T_ARRAY) walk_array(ctx, key);
    dx_free(key);
}

static void walk_tensor(const gguf_ctx *ctx, uint64_t i)
{
    gguf_tensor_info t, t2;
    if (gguf_tensor(ctx, i, &t) != 0) __builtin_trap();
    if (t.nbytes && !t.data) __builtin_trap();
    if (t.data) g_sink += touch(t.data, t.nbytes);
    char *name = cstr(t.name);
    if (!name) return;
    if (gguf_find_tensor(ctx, name, &t2) != 0 || t2.offset != t.offset) __builtin_trap();
    dx_free(name);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    gguf_ctx *ctx = NULL;
    if (gguf_open_mem(data, size, "fuzz", &ctx) != 0) {
        if (ctx) __builtin_trap();
        return 0;
    }
    if (gguf_data_offset(ctx) % gguf_alignment(ctx)) __builtin_trap();
    for (uint64_t i = 0; i < gguf_n_kv(ctx); i++) walk_kv(ctx, i);
    for (uint64_t i = 0; i < gguf_n_tensors(ctx); i++) walk_tensor(ctx, i);
    gguf_close(ctx);
    return 0;
}
