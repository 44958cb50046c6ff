/* itest_gguf_interop: files written by `duplex model synth` read by an
 * independent GGUF parser — Hugging Face's @huggingface/gguf (npm, pinned) —
 * must show exactly what duplex's own reader shows: the same keys with the
 * same values, the same tensors with the same shapes, types and offsets, and
 * every metadata key llama.cpp reads for the architecture (the mixtures of
 * experts' with their 3-D expert tensors too). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "../test_client.h"
#include "base/dx_buf.h"
#include "base/dx_dtype.h"
#include "model/gguf.h"
#include "model/synth.h"

static char g_dir[64];

static int setup(void **state)
{
    (void)state;
    strcpy(g_dir, "/tmp/dx_itest_interop_XXXXXX");
    return mkdtemp(g_dir) ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    return system(cmd) ? -1 : 0;
}

static json_t *hf_read(const char *path)
{
    char cmd[512];
    snprintf(cmd, sizeof cmd, "node tests/integration/node/gguf_check.mjs %s", path);
    dx_buf out;
    dx_buf_init(&out, 0);
    int st = tc_run_cmd(cmd, &out);
    if (st != 0) fail_msg("@huggingface/gguf could not read %s:\n%s", path, out.data ? out.data : "");
    json_error_t e;
    json_t *j = json_loads(out.data, 0, &e);
    if (!j) fail_msg("bad JSON from gguf_check.mjs: %s", e.text);
    dx_buf_free(&out);
    return j;
}

static void compare_kv(const gguf_ctx *g, uint64_t i, json_t *hv)
{
    gguf_str k = gguf_kv_key(g, i);
    char key[256];
    snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
    if (!hv) fail_msg("key %s missing in the HF reading", key);
    enum gguf_vtype t = gguf_kv_type(g, i);
    if (t == GGUF_T_ARRAY) {
        enum gguf_vtype et;
        uint64_t n;
        assert_int_equal(gguf_kv_array_info(g, i, &et, &n), 0);
        assert_int_equal(json_integer_value(json_object_get(hv, "len")), (json_int_t)n);
    } else if (t == GGUF_T_STRING) {
        gguf_str v;
        assert_int_equal(gguf_get_str(g, key, &v), 0);
        assert_true(json_is_string(hv));
        assert_int_equal(json_string_length(hv), v.len);
        assert_memory_equal(json_string_value(hv), v.ptr, v.len);
    } else if (t == GGUF_T_FLOAT32 || t == GGUF_T_FLOAT64) {
        float f;
        assert_int_equal(gguf_get_f32(g, key, &f), 0);
        assert_true((float)json_number_value(hv) == f);
    } else if (t == GGUF_T_BOOL) {
        int b;
        assert_int_equal(gguf_get_bool(g, key, &b), 0);
        assert_int_equal(json_is_true(hv), b);
    } else {
        int64_t v;
        assert_int_equal(gguf_get_i64(g, key, &v), 0);
        assert_int_equal(json_integer_value(hv), v);
    }
}

static void check_file(enum model_arch arch, const char *preset, int dtype, const char *arch_name)
{
    char path[128];
    snprintf(path, sizeof path, "%s/%s-%s-%s.gguf", g_dir, arch_name, preset, dx_dtype_name(dtype));
    synth_config c = {.arch = arch, .preset = preset, .dtype = dtype, .seed = 5};
    assert_int_equal(synth_write(&c, path), 0);
    json_t *hf = hf_read(path);
    gguf_ctx *g;
    assert_int_equal(gguf_open(path, &g), 0);
    assert_int_equal(json_integer_value(json_object_get(hf, "version")), gguf_version(g));
    json_t *meta = json_object_get(hf, "meta");
    assert_int_equal(json_object_size(meta), gguf_n_kv(g));
    for (uint64_t i = 0; i < gguf_n_kv(g); i++) {
        gguf_str k = gguf_kv_key(g, i);
        char key[256];
        snprintf(key, sizeof key, "%.*s", (int)k.len, k.ptr);
        compare_kv(g, i, json_object_get(meta, key));
    }
    /* the keys llama.cpp's loader reads for these architectures */
    static const char *const need[] = {
        "context_length", "embedding_length", "block_count", "feed_forward_length",
        "attention.head_count", "attention.head_count_kv", "attention.key_length",
        "attention.value_length", "attention.layer_norm_rms_epsilon", "rope.freq_base"};
    for (size_t i = 0; i < sizeof need / sizeof need[0]; i++) {
        char key[128];
        snprintf(key, sizeof key, "%s.%s", arch_name, need[i]);
        if (!json_object_get(meta, key)) fail_msg("%s lacks %s", path, key);
    }
    /* a mixture of experts: the counts, and qwen3moe's expert width */
    static const char *const moe_need[] = {"expert_count", "expert_used_count",
                                           "expert_feed_forward_length"};
    for (size_t i = 0; strstr(preset, "moe") && i < 2 + (arch == MODEL_QWEN3MOE); i++) {
        char key[128];
        snprintf(key, sizeof key, "%s.%s", arch_name, moe_need[i]);
        if (!json_object_get(meta, key)) fail_msg("%s lacks %s", path, key);
    }
    static const char *const tok_keys[] = {
        "general.architecture", "tokenizer.ggml.model", "tokenizer.ggml.pre",
        "tokenizer.ggml.tokens", "tokenizer.ggml.token_type", "tokenizer.ggml.merges",
        "tokenizer.ggml.bos_token_id", "tokenizer.ggml.eos_token_id", "tokenizer.chat_template"};
    for (size_t i = 0; i < sizeof tok_keys / sizeof tok_keys[0]; i++)
        if (!json_object_get(meta, tok_keys[i])) fail_msg("%s lacks %s", path, tok_keys[i]);
    json_t *ts = json_object_get(hf, "tensors");
    assert_int_equal(json_array_size(ts), gguf_n_tensors(g));
    for (uint64_t i = 0; i < gguf_n_tensors(g); i++) {
        gguf_tensor_info ti;
        assert_int_equal(gguf_tensor(g, i, &ti), 0);
        json_t *t = json_array_get(ts, i);
        const char *name = json_string_value(json_object_get(t, "name"));
        assert_non_null(name);
        assert_int_equal(strlen(name), ti.name.len);
        assert_memory_equal(name, ti.name.ptr, ti.name.len);
        assert_int_equal(json_integer_value(json_object_get(t, "dtype")), ti.type);
        assert_int_equal(json_integer_value(json_object_get(t, "offset")), ti.offset);
        json_t *shape = json_object_get(t, "shape");
        assert_int_equal(json_array_size(shape), ti.n_dims);
        for (uint32_t d = 0; d < ti.n_dims; d++)
            assert_int_equal(json_integer_value(json_array_get(shape, d)), ti.ne[d]);
    }
    gguf_close(g);
    json_decref(hf);
}

static void test_hf_reads_what_synth_writes(void **state)
{
    (void)state;
    if (access("tests/integration/node/node_modules/@huggingface/gguf", F_OK) != 0)
        fail_msg("@huggingface/gguf is not installed (scripts/test.sh runs npm ci)");
    check_file(MODEL_QWEN3, "tiny", DX_BF16, "qwen3");
    check_file(MODEL_QWEN3, "tiny", DX_Q8_0, "qwen3");
    check_file(MODEL_QWEN3, "tiny", DX_Q4_0, "qwen3");
    check_file(MODEL_QWEN3, "tiny", DX_IQ4_NL, "qwen3");
    check_file(MODEL_LLAMA, "tiny", DX_Q5_1, "llama");
    check_file(MODEL_QWEN2, "tiny", DX_F16, "qwen2");
    check_file(MODEL_LLAMA, "tiny", DX_F32, "llama");
    check_file(MODEL_QWEN3MOE, "tiny-moe", DX_BF16, "qwen3moe"); /* 3-D expert tensors */
    check_file(MODEL_LLAMA, "tiny-moe", DX_Q8_0, "llama");
    check_file(MODEL_QWEN3MOE, "tiny-moe", DX_Q4_1, "qwen3moe");
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_hf_reads_what_synth_writes),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
